"""HF Flax families: every returned stage matches the transformers PyTorch model with the same weights (1e-4).

A tiny PyTorch model of each family is saved with `save_pretrained` (safetensors) and loaded through our offline
loader (`weights=folder`, which uses transformers' PyTorch->Flax conversion without torch); the reference checkpoints'
classes are used where the hub models are of that class (CLIPModel, ViTForImageClassification, ...).
"""
import os

import jax
import numpy as np
import pytest

from torch_init import randomise
from visim_jax.backbones import get_backbone, hf, list_backbones, registry

ATOL = 1e-4


def _torch_model(family):
  import torch  # noqa: F401
  import transformers as T
  cfg = hf.TINY[family]
  if family == 'clip':
    text = dict(vocab_size=99, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                max_position_embeddings=16)
    m = T.CLIPModel(T.CLIPConfig(text_config=text, vision_config=cfg, projection_dim=16))
    return m, m.vision_model
  if family == 'vit':
    m = T.ViTForImageClassification(T.ViTConfig(**cfg, num_labels=5))
    return m, m.vit
  if family == 'dinov2':
    m = T.Dinov2Model(T.Dinov2Config(**cfg))
    return m, m
  if family == 'resnet':
    m = T.ResNetForImageClassification(T.ResNetConfig(**cfg, num_labels=5))
    return m, m.resnet
  if family == 'regnet':
    m = T.RegNetForImageClassification(T.RegNetConfig(**cfg, num_labels=5))
    return m, m.regnet
  raise ValueError(family)


@pytest.mark.parametrize('name', ['clip_vit_b32', 'vit_b16', 'dinov2_s14', 'hf_resnet50', 'regnet_y_040'])
def test_parity_with_pytorch(name, tmp_path):
  torch = pytest.importorskip('torch')
  family = hf.SPECS[name].family
  full, ref = _torch_model(family)
  randomise(full, 0)
  full.save_pretrained(tmp_path, safe_serialization=True)
  assert not os.path.exists(tmp_path / 'pytorch_model.bin')

  backbone = get_backbone(name, weights=str(tmp_path), tiny=True)
  size = backbone.preprocess.size
  images = np.random.default_rng(1).integers(0, 256, (2, size, size, 3), dtype=np.uint8)
  final, stages = jax.jit(backbone.__call__)(images)
  x = np.asarray(backbone.preprocess.normalise(images))
  with torch.no_grad():
    out = ref(pixel_values=torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2))).float(), output_hidden_states=True)
  hs = [h.numpy() for h in out.hidden_states]
  if family in hf.VIT_LIKE:
    want = {'embeddings': hs[0], **{f'block{i}': h for i, h in enumerate(hs[1:], 1)}}
    want['pooled'] = (out.last_hidden_state[:, 0] if family == 'vit' else out.pooler_output).numpy()
  else:
    want = {'stem': hs[0], **{f'stage{i}': h for i, h in enumerate(hs[1:], 1)}}
    want = {k: v.transpose(0, 2, 3, 1) for k, v in want.items()}
    want['pooled'] = out.pooler_output.numpy().reshape(2, -1)
  assert sorted(stages) == sorted(want)
  for k, v in want.items():
    np.testing.assert_allclose(np.asarray(stages[k]), v, atol=ATOL, rtol=ATOL, err_msg=f'{name} stage {k}')
  np.testing.assert_allclose(np.asarray(final), want['pooled'], atol=ATOL, rtol=ATOL)
  assert len(backbone.weights_id) == 64  # sha256 of model.safetensors


def test_every_family_builds_offline_with_tiny_and_random_init(monkeypatch):
  monkeypatch.setenv('HF_HUB_OFFLINE', '1')
  names = [n for n in list_backbones() if n in hf.SPECS]
  assert {'clip_vit_b32', 'clip_vit_b16', 'clip_vit_l14', 'vit_b16', 'dinov2_s14', 'dinov2_b14', 'dinov2_l14',
          'hf_resnet50', 'hf_resnet101', 'hf_resnet152', 'regnet_y_040'} <= set(names)
  families = {}
  for name in names:  # every name resolves to a factory; one build per family (they share the tiny config)
    families.setdefault(hf.SPECS[name].family, name)
    assert callable(registry.resolve(name))
  for name in families.values():
    b = get_backbone(name, tiny=True, random_init=3)
    assert b.weights_id == 'random:3:tiny'
    assert set(b.layers) <= set(b.stage_names()), name
  b = get_backbone('clip_vit_b32', tiny=True, layers='block1,pooled')
  assert b.layers == ('block1', 'pooled')
  with pytest.raises(ValueError, match='block9'):
    get_backbone('clip_vit_b32', tiny=True, layers=['block9'])


def test_real_architecture_with_random_weights_has_paper_dims():
  from visim_jax.backbones import features
  b = get_backbone('hf_resnet50', random_init=0)
  assert sum(features.layer_dims(b, b.layers).values()) == 3840  # paper 001 Table 1
  assert b.preprocess.size == 224 and b.preprocess.resize_to == 256


def test_missing_weights_fail_offline_naming_the_folder(monkeypatch, tmp_path):
  monkeypatch.setenv('HF_HUB_OFFLINE', '1')
  monkeypatch.setenv('VISIM_JAX_WEIGHTS', str(tmp_path / 'w'))
  with pytest.raises(FileNotFoundError, match=str(tmp_path / 'w' / 'clip_vit_b32')):
    get_backbone('clip_vit_b32', weights='nobody-here/no-such-model')
  with pytest.raises(FileNotFoundError, match='no such folder'):
    get_backbone('clip_vit_b32', weights=str(tmp_path / 'nope'))
  (tmp_path / 'pt').mkdir()
  (tmp_path / 'pt' / 'config.json').write_text('{}')
  (tmp_path / 'pt' / 'pytorch_model.bin').write_bytes(b'not read')
  # a folder with only pytorch_model.bin is taken (issue 33: repositories published that way) and its bad bytes
  # are refused in one line naming the file (read through core.safe_pickle, never torch.load)
  with pytest.raises(ValueError, match='pytorch_model.bin'):
    get_backbone('hf_resnet50', weights=str(tmp_path / 'pt'))


@pytest.mark.parametrize('name,flax_class', [('clip_vit_b32', 'FlaxCLIPModel'),
                                             ('hf_resnet50', 'FlaxResNetForImageClassification')])
def test_flax_msgpack_checkpoints_load_like_safetensors(name, flax_class, tmp_path):
  """The hub's openai/clip-* and microsoft/resnet-* repos hold flax_model.msgpack (of the model with its head or
  both towers), which the loader prefers: the same weights must come out as from model.safetensors."""
  pytest.importorskip('torch')
  import transformers as T
  family = hf.SPECS[name].family
  full, _ = _torch_model(family)
  randomise(full, 1)
  full.save_pretrained(tmp_path / 'pt', safe_serialization=True)
  # what `FlaxModel.from_pretrained(pt, from_pt=True).save_pretrained(flax)` writes, without its slow eager init
  import shutil
  import types
  from flax import serialization
  from safetensors.numpy import load_file
  from transformers.modeling_flax_pytorch_utils import convert_pytorch_state_dict_to_flax
  cls = getattr(T, flax_class)
  model = cls(cls.config_class.from_pretrained(tmp_path / 'pt'), _do_init=False)
  shim = types.SimpleNamespace(base_model_prefix=cls.base_model_prefix, params=model.params_shape_tree)
  state = convert_pytorch_state_dict_to_flax(load_file(tmp_path / 'pt' / 'model.safetensors'), shim)
  (tmp_path / 'flax').mkdir()
  shutil.copy(tmp_path / 'pt' / 'config.json', tmp_path / 'flax' / 'config.json')
  (tmp_path / 'flax' / 'flax_model.msgpack').write_bytes(serialization.to_bytes(state))
  assert os.path.exists(tmp_path / 'flax' / 'flax_model.msgpack')
  a = get_backbone(name, weights=str(tmp_path / 'pt'), tiny=True).variables
  b = get_backbone(name, weights=str(tmp_path / 'flax'), tiny=True).variables
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(x, y, atol=1e-6)
