"""Issue 43 item 4: peft LoRA adapters in and out (models/lora.py from_peft / to_peft, training/peft_file.py,
`tuned:<peft folder>`, `python -m visim_jax.export --format=peft`), against the real `peft` package.

The torch side is test_tower_parity.py's statement of DreamSim's PerceptualModel (extractor_list.<i>.model.blocks.
<n>.attn.qkv, DreamSim's module names) on the tiny random `dreamsim_ensemble_pretrained` tower, wrapped by
`get_peft_model(LoraConfig(target_modules=['qkv']))` as DreamSim's training/train.py wraps it and saved with
`save_pretrained` as its `__save_lora_weights` does.
"""
import json
import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

torch = pytest.importorskip('torch')
peft = pytest.importorskip('peft')

from test_tower_parity import Perceptual, load_flax  # noqa: E402
from visim_jax.backbones import dreamsim, get_backbone  # noqa: E402
from visim_jax.core.errors import UserError  # noqa: E402
from visim_jax.models import lora  # noqa: E402
from visim_jax.training import peft_file, tuned_file  # noqa: E402
from visim_jax.zoo import tuned  # noqa: E402

NAME = 'dreamsim_ensemble_pretrained'
BRANCHES = ('dino', 'clip', 'open_clip')
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope='module')
def base():
  return get_backbone(NAME, tiny=True)


@pytest.fixture(scope='module')
def images():
  return np.random.default_rng(2).integers(0, 256, (3, dreamsim.TINY_SIZE, dreamsim.TINY_SIZE, 3), dtype=np.uint8)


def _torch_model(base, r=4, alpha=8.0, seed=0):
  """DreamSim's PerceptualModel with our tiny base weights, peft-wrapped; LoRA B made non-zero (a trained adapter)."""
  model = Perceptual(dreamsim.MODELS[NAME][1])
  load_flax(model, base.variables['params'])
  pm = peft.get_peft_model(model, peft.LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.3, bias='none',
                                                  target_modules=['qkv']))
  g = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for n, p in pm.named_parameters():
      if 'lora_B' in n:
        p.copy_(torch.randn(p.shape, generator=g) * 0.5)
  return pm.eval()


def _torch_embed(pm, images):
  x = torch.from_numpy(np.ascontiguousarray(images.transpose(0, 3, 1, 2))).float() / 255.0
  with torch.no_grad():
    return pm.embed(x).numpy()


def _ours(tuned_bb, images):
  return np.asarray(jax.jit(tuned_bb.__call__)(images)[1][tuned.STAGE])


def test_dreamsim_trained_adapter_loads_as_tuned(base, images, tmp_path):
  """save_pretrained's folder (DreamSim's epoch_<N>/) -> tuned: = peft's unmerged model = its merged model; the
  .bin form (safe_serialization=False, read through safe_pickle) holds the same tree."""
  pm = _torch_model(base)
  folder, old = str(tmp_path / 'epoch_5'), str(tmp_path / 'epoch_5_bin')
  pm.save_pretrained(folder)
  pm.save_pretrained(old, safe_serialization=False)
  assert os.path.isfile(os.path.join(folder, 'adapter_model.safetensors'))
  assert os.path.isfile(os.path.join(old, 'adapter_model.bin'))
  bb, meta = tuned.tuned_backbone(f'tuned:{folder}', folder, base=base)
  assert meta['backbone'] == NAME and meta['lora'] == {'r': 4, 'alpha': 8.0, 'dropout': 0.3, 'targets': ['qkv'],
                                                      'rslora': False}
  got = _ours(bb, images)
  want = _torch_embed(pm, images)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got, _torch_embed(pm.merge_and_unload(), images), rtol=1e-5, atol=1e-5)
  assert np.abs(want - np.asarray(jax.jit(base.__call__)(images)[1]['concat'])).max() > 1e-2   # the adapter matters
  (m1, t1, _), (m2, t2, w2) = peft_file.load(folder), peft_file.load(old)
  assert m1['lora'] == m2['lora'] and w2.endswith('adapter_model.bin') and sorted(t1['lora']) == sorted(t2['lora'])
  for k in t1['lora']:
    for ab in 'ab':
      np.testing.assert_array_equal(np.asarray(t1['lora'][k][ab]), np.asarray(t2['lora'][k][ab]))


def test_round_trips_are_exact_and_peft_loads_ours(base, images):
  rng = np.random.default_rng(0)
  tree = {k: {'a': v['a'], 'b': rng.normal(0, 0.5, v['b'].shape).astype(np.float32)}
          for k, v in lora.init(jax.random.PRNGKey(1), base.variables['params'], lora.Config(r=4)).items()}
  sd = lora.to_peft(tree, BRANCHES)
  assert 'base_model.model.extractor_list.2.model.blocks.1.attn.qkv.lora_B.weight' in sd and len(sd) == 2 * 3 * 2
  back = lora.from_peft(sd, BRANCHES)
  assert sorted(back) == sorted(tree)
  for k in tree:
    for ab in 'ab':
      np.testing.assert_array_equal(np.asarray(back[k][ab]), np.asarray(tree[k][ab]))
  pm = _torch_model(base, seed=1)
  live = {k: v.numpy() for k, v in pm.state_dict().items() if 'lora_' in k}   # '...lora_A.default.weight'
  again = lora.to_peft(lora.from_peft(live, BRANCHES), BRANCHES)
  live = {k.replace('.default', ''): v for k, v in live.items()}
  assert sorted(again) == sorted(live) and all(np.array_equal(again[k], live[k]) for k in live)
  # ours -> peft's set_peft_model_state_dict -> the same embedding as our merged tower
  peft.set_peft_model_state_dict(pm, {k: torch.from_numpy(v) for k, v in sd.items()})
  merged = lora.merge_variables(base.variables, tree, lora.Config(r=4, alpha=8.0))
  ours = np.asarray(jax.jit(base.apply_fn)(merged, base.preprocess.normalise(images))[1]['concat'])
  np.testing.assert_allclose(ours, _torch_embed(pm, images), rtol=1e-5, atol=1e-5)
  with pytest.raises(UserError, match='does not fit a tower of 1 branches'):
    lora.from_peft(sd, ('dino',))
  with pytest.raises(UserError, match=r"unexpected entry 'base_model.model.mlp.lora_A.weight'"):
    lora.from_peft({'base_model.model.mlp.lora_A.weight': np.zeros((2, 2))})
  with pytest.raises(UserError, match='has no peft name'):
    lora.to_peft({'conv_head': tree[sorted(tree)[0]]}, BRANCHES)


def test_export_peft_then_peft_and_tuned_load_it(base, images, tmp_path):
  """tune workdir -> `python -m visim_jax.export --format=peft` -> PeftModel.from_pretrained and tuned:<folder>."""
  rng = np.random.default_rng(3)
  cfg = {'r': 2, 'alpha': 4.0, 'dropout': 0.0, 'targets': ('qkv',), 'rslora': False}
  tree = {k: {'a': np.asarray(v['a']), 'b': rng.normal(0, 0.5, v['b'].shape).astype(np.float32)}
          for k, v in lora.init(jax.random.PRNGKey(2), base.variables['params'], lora.Config(r=2)).items()}
  wd = tmp_path / 'tune'
  wd.mkdir()
  meta = {'backbone': NAME, 'weights_sha256': base.weights_id, 'feature': 'concat', 'head': 'identity',
          'head_size': 0, 'similarity': 'cosine', 'tune': 'lora', 'lora': cfg, 'workdir': str(wd)}
  tuned_file.save(str(wd / 'tuned.npz'), meta, {'lora': tree})
  r = subprocess.run([sys.executable, '-m', 'visim_jax.export', f'--workdir={wd}', '--format=peft'], cwd=ROOT,
                     capture_output=True, text=True, env={**os.environ, 'PYTHONPATH': ROOT, 'JAX_PLATFORMS': 'cpu'})
  assert r.returncode == 0, r.stderr[-2000:]
  folder = str(wd / 'peft_adapter')
  assert json.load(open(os.path.join(folder, 'adapter_config.json')))['target_modules'] == ['qkv']
  model = Perceptual(dreamsim.MODELS[NAME][1])
  load_flax(model, base.variables['params'])
  pm = peft.PeftModel.from_pretrained(model, folder).eval()
  want = _torch_embed(pm, images)
  from_npz, _ = tuned.tuned_backbone(f'tuned:{wd}', str(wd / 'tuned.npz'))
  from_peft, meta2 = tuned.tuned_backbone(f'tuned:{folder}', folder)   # the sidecar names the tiny random base
  assert meta2['weights_sha256'] == base.weights_id
  np.testing.assert_allclose(_ours(from_peft, images), want, rtol=1e-5, atol=1e-5)
  for a, b in zip(jax.tree.leaves(from_peft.variables), jax.tree.leaves(from_npz.variables)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))   # the same merged tower
  from visim_jax import api
  m = api.load(f'tuned:{folder}', fetch=False)   # the zoo's spec, as the leaderboard builds it
  assert m.kind == 'tuned' and m.similarity.backbone.weights_id.startswith('tuned:')
  # refusals, one line each
  os.remove(os.path.join(folder, 'visim_jax.json'))
  with pytest.raises(UserError, match=re.escape(f'tuned:{folder}@dino_vitb16') + '.*does not fit a tower of no'):
    tuned.tuned_backbone(f'tuned:{folder}@dino_vitb16', folder, 'dino_vitb16')
  os.remove(os.path.join(folder, 'adapter_model.safetensors'))
  with pytest.raises(UserError, match='no adapter_model.safetensors or adapter_model.bin'):
    peft_file.load(folder)
