"""The tune experiment on a tiny random ViT over teacher triplets of a few demo photos: it learns and writes a small
LoRA file, `tuned:` loads it as the run embedded, a size that does not fit is refused before anything is written,
every field is checked, the human-judgement sources (BAPPS 2AFC, THINGS) train, `:demo` runs at a CI size, the
leaderboard before / after ranks both towers, 8 devices with fsdp train what 1 does, and AligNet's release over mocked
TFDS ImageNet resumes after kill -9 as the uninterrupted run (the resume test of every source: one grain path)."""
import json
import os
import sys

import numpy as np
import pytest

from visim_jax.core import memory
from visim_jax.core.errors import UserError
from visim_jax.experiments import tune
from visim_jax.training import tuned_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, 'configs'))
import tune as cfg  # noqa: E402


def tiny(tmp, **kw):
  c = cfg.get_config('local')
  c.demo.update({'root': str(tmp / 'demo'), 'n_pairs': 16})
  c.cache_dir, c.plots = str(tmp / 'cache'), False
  c.triplets.update({'n_train': 200, 'n_val': 60, 'clusters': 4})
  c.steps, c.eval_every, c.checkpoint_every, c.batch_size, c.lr = 6, 3, 3, 4, 3e-2
  c.update_from_flattened_dict(kw)
  return c


@pytest.fixture(scope='module')
def reference(tmp_path_factory):
  tmp = tmp_path_factory.mktemp('tune')
  return tune.run(tiny(tmp, leaderboard=True), str(tmp / 'full'), progress=False), tmp


def test_learns_and_keeps_a_small_lora_file(reference):
  m, tmp = reference
  wd = tmp / 'full'
  r = m['results']
  assert m['hparams']['tune'] == 'lora' and m['devices'] == 1
  assert r['tuned']['loss'] < r['frozen']['loss']
  for f in ('tuned.npz', 'curves.npz', 'metrics.json', 'triplets_train.npz', 'triplets_val.npz'):
    assert os.path.isfile(wd / f)
  meta, trainable = tuned_file.load(str(wd / 'tuned.npz'))
  assert set(trainable) == {'lora'} and meta['tune'] == 'lora' and meta['backbone'] == 'vit'
  assert all(set(v) == {'a', 'b'} and v['a'].shape[1] == 8 for v in trainable['lora'].values())
  n = sum(v.size for e in trainable['lora'].values() for v in e.values())
  assert n == m['trainable_parameters']
  ckpt = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(wd / 'checkpoints') for f in fs)
  assert ckpt < 400_000   # LoRA factors + Adam moments only, never the tower


def test_tuned_spec_embeds_as_the_run(reference):
  """vj.load('tuned:<workdir>') = the LoRA-merged tower's embedding, as tower_step embeds it in training."""
  import jax
  import visim_jax as vj
  from visim_jax.backbones import get_backbone
  from visim_jax.models import lora
  from visim_jax.training import tower_step
  m, tmp = reference
  model = vj.load(f'tuned:{tmp / "full"}')
  x = np.random.RandomState(0).randint(0, 256, (3, 32, 32, 3)).astype(np.uint8)
  meta, trainable = tuned_file.load(str(tmp / 'full' / 'tuned.npz'))
  base = get_backbone('vit', tiny=True)
  hp = tower_step.Hparams(tune='lora', lora=lora.Config(**{**meta['lora'], 'targets': tuple(meta['lora']['targets'])}))
  want = np.asarray(tower_step.embed(hp, tower_step.tower(base), jax.tree.map(np.asarray, trainable),
                                     base.variables, x))
  want = want / np.linalg.norm(want, axis=1, keepdims=True)
  np.testing.assert_allclose(model.embed(x), want, atol=2e-5)
  assert model.kind == 'tuned' and float(model.distance(x[0], x[0])) < 1e-5
  # export: the merged weights, W + alpha / r a b at every adapted kernel, the others as they were
  from visim_jax.zoo import tuned
  z = np.load(tuned.export(str(tmp / 'full'), str(tmp / 'merged.npz')))
  scale = meta['lora']['alpha'] / meta['lora']['r']
  for module, e in trainable['lora'].items():
    w0 = np.asarray(base.variables['params'][module.split('/')[0]]['attn']['qkv']['kernel'])
    np.testing.assert_allclose(z[f'variables/params/{module}/kernel'], w0 + scale * e['a'] @ e['b'], atol=1e-6)
  np.testing.assert_array_equal(z['variables/params/norm/scale'], np.asarray(base.variables['params']['norm']['scale']))


def test_a_size_that_does_not_fit_is_refused_before_anything_is_written(reference, monkeypatch):
  _, tmp = reference
  monkeypatch.setattr(memory, 'limit_bytes', lambda: 2**20)
  with pytest.raises(UserError, match=r'^config\.(batch_size|remat|fsdp): tuning needs at least') as e:
    tune.run(tiny(tmp), str(tmp / 'refused'), progress=False)
  assert '\n' not in str(e.value)
  assert not os.path.exists(tmp / 'refused')


def test_memory_names_the_field():
  parts = memory.tower_parts(1000, 10, 1e6, 64)
  assert parts['activations'] == 64e6 and parts['optimiser state'] == 80
  mp = pytest.MonkeyPatch()
  mp.setattr(memory, 'limit_bytes', lambda: 10**7)
  try:
    with pytest.raises(UserError, match=r'^config\.remat: .*set config.remat=True'):
      memory.check_tower(parts, '', False, memory.tower_parts(1000, 10, 1e4, 64))
    with pytest.raises(UserError, match=r'^config\.batch_size: '):
      memory.check_tower(parts, '', True)
    with pytest.raises(UserError, match=r"^config\.fsdp: .*config.tune='lora'"):
      memory.check_tower(memory.tower_parts(10**8, 10**7, 1, 1), '', False)
  finally:
    mp.undo()


@pytest.mark.parametrize('field, value, match', [
    ('tune', 'adapter', 'config.tune: one of'),
    ('head', 'mlp', 'config.head: one of'),
    ('lora.r', 0, 'config.lora.r'),
    ('lora.dropout', 1.0, 'config.lora.dropout'),
    ('lora.targets', ' , ', 'config.lora.targets: name the kernels'),
    ('tau', 100.0, 'config.tau: a softmax of cosines'),
    ('accum_steps', 3, 'config.accum_steps: must divide config.batch_size'),
    ('epochs', 0, 'config.epochs'),
    ('source', 'imagenet', 'config.source'),
    ('transform', 'uncertainty_distillation', 'config.transform'),
    ('augment', 'flip', 'config.augment'),
    ('compute_dtype', 'float16', 'config.compute_dtype'),
    ('checkpoint_every', 4, 'config.checkpoint_every: must be a multiple of config.eval_every'),
    ('pooling', 'rmac', 'config.pooling'),
])
def test_config_refusals(tmp_path, field, value, match):
  with pytest.raises(UserError, match=match) as e:
    tune.validate_config(tiny(tmp_path, **{field: value}))
  assert '\n' not in str(e.value)


def test_hinge_needs_cosine(tmp_path):
  with pytest.raises(UserError, match="^config.similarity: the hinge trains on DreamSim's distance"):
    tune.validate_config(tiny(tmp_path, loss='hinge', similarity='dot'))


def test_human_sources_bapps_and_things(tmp_path, human_demo_sets):
  """BAPPS 2AFC train sets (hinge on the judges' fraction; held out: val sets) and THINGS choices (hard targets)."""
  h = human_demo_sets
  for source, extra in (('bapps', dict(bapps_dir=h.bapps, loss='hinge')),
                        ('things', dict(things_dir=h.things, things_file=h.things_dreamsim, loss='hard'))):
    m = tune.run(tiny(tmp_path, source=source, steps=2, eval_every=2, checkpoint_every=2, checkpoint=False,
                      **extra), str(tmp_path / source), progress=False)
    assert m['target'] == {'bapps': 'judge', 'things': 'odd'}[source]
    assert all(0.0 <= m['results'][k]['accuracy'] <= 1.0 for k in ('frozen', 'tuned'))
  with pytest.raises(UserError, match=r"config.loss: the triplets hold judge targets: use one of \('hinge',\)"):
    tune.run(tiny(tmp_path, source='bapps', bapps_dir=h.bapps, loss='jsd'), str(tmp_path / 'x'), progress=False)


def test_demo_mode_at_ci_size(tmp_path):
  """`:demo` as documented (EfficientNet-Lite0 with its real weights, LoRA on its last 1x1 convolution, an AlexNet
  teacher over the demo photos) at a CI size: 32 photos, 2 steps; the leaderboard step is the next test's."""
  c = cfg.get_config('demo')
  c.demo.update({'root': str(tmp_path / 'demo'), 'n_pairs': 16})
  c.cache_dir, c.plots, c.leaderboard, c.lora.targets = str(tmp_path / 'cache'), False, False, 'conv_head'
  c.triplets.update({'n_train': 100, 'n_val': 40, 'clusters': 4})
  c.steps, c.batch_size, c.eval_every, c.checkpoint_every, c.image_batch_size = 2, 2, 2, 2, 16
  m = tune.run(c, str(tmp_path / 'demo_run'), progress=False)
  assert m['backbone'] == 'efficientnet_lite0' and m['trainable_parameters'] == 8 * (320 + 1280)
  assert all(0 <= m['results'][k]['accuracy'] <= 1 for k in ('frozen', 'tuned'))


def test_leaderboard_before_and_after(reference):
  """config.leaderboard: the demo human sets rank the frozen tower (`cosine:`) and the tuned one (`tuned:`), and
  metrics.json (written last) holds the board."""
  m, tmp = reference
  board = m['leaderboard']
  assert board['models'] == ['cosine:vit:tiny', f'tuned:{tmp / "full"}']
  assert set(board['results'][board['models'][1]]) == {'nights', 'bapps_2afc', 'bapps_jnd', 'things'}
  assert json.load(open(tmp / 'full' / 'metrics.json'))['leaderboard'] == board
  assert os.path.isfile(tmp / 'full' / 'leaderboard' / 'leaderboard.md')


_EIGHT = r'''
import json, os, sys
import jax
sys.path.insert(0, sys.argv[1]); sys.path.insert(0, os.path.join(sys.argv[1], 'tests'))
import pathlib
from test_tune import tiny
from visim_jax.experiments import tune
tmp = pathlib.Path(sys.argv[2])
out = {}
for name, devs in (('one', jax.devices()[:1]), ('eight', jax.devices())):
  m = tune.run(tiny(tmp, batch_size=8, fsdp=2 if name == 'eight' else 1, checkpoint=False), str(tmp / name),
               progress=False, devices=devs)
  out[name] = {'devices': m['devices'], 'results': m['results']}
print('RESULT' + json.dumps(out))
'''


def test_eight_devices_with_fsdp_equal_one(tmp_path):
  """The experiment on 8 fake CPU devices (data 4 x fsdp 2) trains the parameters of 1 device (held-out numbers to
  1e-4): batches by (seed, step), the same LoRA init, the step's sums in another order only."""
  import subprocess
  env = {**os.environ, 'XLA_FLAGS': '--xla_force_host_platform_device_count=8', 'JAX_PLATFORMS': 'cpu',
         'PYTHONPATH': ROOT + os.pathsep + os.environ.get('PYTHONPATH', '')}
  r = subprocess.run([sys.executable, '-c', _EIGHT, ROOT, str(tmp_path)], capture_output=True, text=True, env=env,
                     cwd=ROOT)
  assert r.returncode == 0, r.stderr[-3000:]
  out = json.loads(r.stdout.split('RESULT', 1)[1])
  assert out['one']['devices'] == 1 and out['eight']['devices'] == 8
  for k in ('frozen', 'tuned'):
    for q in ('accuracy', 'loss'):
      assert out['eight']['results'][k][q] == pytest.approx(out['one']['results'][k][q], rel=1e-4, abs=1e-6)


# ------------------------------------------------------------------------- AligNet's release over mocked ImageNet

def write_alignet(root, n_images=40, n_train=48, n_val=12, transform='untransformed', sampling='cluster_border_500'):
  """npz files in AligNet's released layout (<root>/<transform>/<split>_<sampling>.npz: indices into
  tfds imagenet2012 train, similarities [s01, s02, s12] with the odd one last, filenames)."""
  rng = np.random.RandomState(0)
  os.makedirs(os.path.join(root, transform), exist_ok=True)
  for split, n in (('train', n_train), ('val', n_val)):
    idx = np.stack([rng.choice(n_images, 3, replace=False) for _ in range(n)]).astype(np.int64)
    s = np.sort(rng.rand(n, 3), axis=1)[:, ::-1].copy()   # s01 >= s02 >= s12: image 2 the odd one out
    np.savez(os.path.join(root, transform, f'{split}_{sampling}.npz'), indices=idx, similarities=s,
             filenames=np.array([[f'n0000_{i}.JPEG' for i in r] for r in idx]))
  return root


def alignet_tiny(tmp, **kw):
  """configs/tune.py:alignet with tiny overrides: a tiny random ViT, a few steps of a small batch."""
  c = cfg.get_config('alignet')
  c.alignet_dir, c.cache_dir, c.plots = str(tmp / 'alignet'), str(tmp / 'cache'), False
  c.backbone, c.backbone_kwargs.tiny, c.feature, c.head_size, c.image_batch_size = 'vit', True, '', 16, 32
  c.steps, c.batch_size, c.warmup, c.lr = 6, 4, 2, 1e-3
  c.eval_every, c.checkpoint_every = 3, 3
  c.update_from_flattened_dict(kw)
  return c


_KILLED = r'''
import os, signal, sys, pathlib
sys.path.insert(0, sys.argv[1]); sys.path.insert(0, os.path.join(sys.argv[1], 'tests'))
import tensorflow_datasets as tfds
from test_tune import alignet_tiny
from visim_jax.experiments import tune
from visim_jax.training import runtime
def kill9(phase, step, directory):
  if phase == 'after_save' and step == 3:
    os.kill(os.getpid(), signal.SIGKILL)
runtime.FAULT_HOOK = kill9
tmp = pathlib.Path(sys.argv[2])
with tfds.testing.mock_data(num_examples=40):
  tune.run(alignet_tiny(tmp, things_dir=sys.argv[3], things_file=sys.argv[4]), str(tmp / 'killed'), progress=False)
'''


def test_alignet_release_over_mocked_imagenet_resumes_after_kill_9(tmp_path, human_demo_sets):
  """`:alignet` trains on the released layout over mocked TFDS ImageNet through grain (AligNet's [0, 1] pixels, the
  affine head, full tuning, JSD on dot products); a run killed with SIGKILL after its step-3 checkpoint resumes
  from the grain iterator's saved state and ends as the uninterrupted run: the same per-step losses (the same
  batches), the same tuned tower; then THINGS odd-one-out of the frozen and the tuned tower (config.things_dir)."""
  import subprocess
  import tensorflow_datasets as tfds
  write_alignet(tmp_path / 'alignet')
  things = dict(things_dir=human_demo_sets.things, things_file=human_demo_sets.things_dreamsim)
  with tfds.testing.mock_data(num_examples=40):
    full = tune.run(alignet_tiny(tmp_path, **things), str(tmp_path / 'full'), progress=False)
  assert full['source'] == 'alignet' and full['n_triplets'] == {'train': 48, 'val': 12}
  assert full['hparams']['tune'] == 'full' and full['hparams']['similarity'] == 'dot'
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu', 'PYTHONPATH': ROOT + os.pathsep + os.environ.get('PYTHONPATH', '')}
  r = subprocess.run([sys.executable, '-c', _KILLED, ROOT, str(tmp_path), *things.values()], capture_output=True,
                     text=True, env=env, cwd=ROOT)
  assert r.returncode == -9, r.stderr[-3000:]
  assert not os.path.exists(tmp_path / 'killed' / 'metrics.json')
  state = json.load(open(tmp_path / 'killed' / 'checkpoints' / '3' / 'data' / 'process_0-of-1.json'))
  assert state == {'next_index': 3 * 3 * 4}   # 3 steps of 4 triplets: 36 images read
  with tfds.testing.mock_data(num_examples=40):
    resumed = tune.run(alignet_tiny(tmp_path, **things), str(tmp_path / 'killed'), progress=False)
  assert resumed['results'] == full['results'] and resumed['fingerprint'] == full['fingerprint']
  assert full['things']['models'] == ['cosine:vit:tiny', f'tuned:{tmp_path / "full"}']
  assert set(full['things']['results'][full['things']['models'][1]]) == {'things'}
  a, b = np.load(tmp_path / 'full' / 'curves.npz'), np.load(tmp_path / 'killed' / 'curves.npz')
  for k in a.files:
    np.testing.assert_array_equal(a[k], b[k])
  meta, ta = tuned_file.load(str(tmp_path / 'full' / 'tuned.npz'))
  _, tb = tuned_file.load(str(tmp_path / 'killed' / 'tuned.npz'))
  assert meta['preprocessing']['std'] == [255.0] * 3   # AligNet's [0, 1] pixels, kept for `tuned:`
  for x, y in zip(*(jax_leaves(t) for t in (ta, tb))):
    np.testing.assert_array_equal(x, y)
  with pytest.raises(UserError, match=r'different config .*lr'):   # the finished workdir, another config: refused
    with tfds.testing.mock_data(num_examples=40):
      tune.run(alignet_tiny(tmp_path, lr=0.05, **things), str(tmp_path / 'killed'), progress=False)


def jax_leaves(tree):
  import jax
  return jax.tree.leaves(tree)


def votes(tmp, h, **kw):
  """tiny() on the demo's mini NIGHTS votes, read from the session's human demo sets (written once)."""
  c = tiny(tmp, **kw)
  c.demo.root = os.path.dirname(h.root)
  return c


def test_adversarial_demo_reports_clean_and_attacked_before_and_after(tmp_path, human_demo_sets):
  """`:demo --config.adversarial=...` at the tiniest size (the tiny ViT of :local, 2 steps, 1 APGD step): loss ''
  becomes the hinge on the demo's mini NIGHTS votes (no teacher), trained on attacked references, and the run
  reports held-out clean and attacked 2AFC accuracy of the frozen and the tuned tower (metrics.json and console)."""
  c = votes(tmp_path, human_demo_sets, loss='', adversarial='linf:8/255', adversarial_steps=1, adversarial_eval_steps=2, steps=2,
           eval_every=2, checkpoint_every=2, checkpoint=False)
  m = tune.run(c, str(tmp_path / 'adv'), progress=False)
  assert m['hparams']['loss'] == 'hinge' and m['hparams']['adv_eps'] == pytest.approx(8 / 255)
  assert m['target'] == 'judge' and m['n_triplets'] == {'train': 24, 'val': 24}   # demo NIGHTS: train | val + test
  a = m['attacked']
  assert a['budget'] == 'linf:8/255' and a['items'] == 24 and a['steps'] == 2
  assert all(0 <= a[k] <= 1 and 0 <= m['results'][k]['accuracy'] <= 1 for k in ('frozen', 'tuned'))
  assert json.load(open(tmp_path / 'adv' / 'metrics.json'))['attacked'] == a
  assert not os.path.exists(tmp_path / 'adv' / 'triplets_train.npz')   # votes, not teacher triplets


def test_memory_estimate_counts_the_attack(tmp_path, human_demo_sets, monkeypatch):
  """With `adversarial` the estimate adds what the attack holds beyond the step's activations (its input-gradient
  residuals, traced, and its loop's images); where that is the largest part, the refusal names config.adversarial
  and comes before anything is written. LoRA on the last fc2 only: the step keeps little, the attack a whole pass."""
  from visim_jax.experiments import tune_memory
  from visim_jax.experiments.tune_parse import parse
  est = {}
  for adv in ('', 'linf:8/255'):
    c = tiny(tmp_path, loss='hinge', adversarial=adv, **{'lora.targets': 'blocks_1/fc2'})
    b = tune.build(parse(c), 4)
    est[adv] = tune_memory.estimate(b.hp, b.tower, b.backbone, b.trainable, b.image_shape, 12, 1)[0]
  adv = est['linf:8/255']
  assert 'attack' not in est[''] and adv['attack'] > adv['activations'] == est['']['activations'] > 0
  assert adv['attack'] + adv['activations'] > 4 * tune_memory.ATTACK_STATE_IMAGES * 32 * 32 * 3 * 4   # 4 triplets
  monkeypatch.setattr(memory, 'limit_bytes', lambda: 2**20)
  with pytest.raises(UserError, match=r'^config.adversarial: tuning needs at least .* attack'):
    tune.run(votes(tmp_path, human_demo_sets, loss='', adversarial='linf:8/255', **{'lora.targets': 'blocks_1/fc2'}),
             str(tmp_path / 'refused'), progress=False)
  assert not os.path.exists(tmp_path / 'refused')
