"""The learn_triplets experiment on tiny synthetic features: learning happens, a killed run resumes identically, 2
processes x 4 fake devices give the numbers of 1 device (all three against one shared in-process run), every config
field is checked, index files of another run train the same head and the leaderboard ranks it, and one end-to-end
`:local` through main."""
import json
import os
import sys

import numpy as np
import pytest

import subprocs
from test_runtime import kill_after
from visim_jax.training import runtime
from visim_jax.core.errors import UserError
from visim_jax.experiments import learn_triplets as lt
from visim_jax.training import head_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, 'configs'))
import learn_triplets as cfg  # noqa: E402


def tiny(**kw):
  c = cfg.get_config('local')
  c.synthetic.update({'n_images': 60, 'dim': 8, 'teacher_dim': 8})
  c.triplets.update({'n_train': 400, 'n_val': 100, 'clusters': 4})
  c.steps, c.eval_every, c.checkpoint_every, c.batch_size, c.size, c.plots = 12, 4, 4, 16, 8, False
  c.lr, c.warmup = 0.1, 4
  c.update_from_flattened_dict(kw)   # 'a.b' keys, as --config.a.b= sets them
  return c


# one run shared by the learning, the resume and the many-device tests (the same config everywhere)
SHARED = dict(steps=16, eval_every=8, checkpoint_every=8)


@pytest.fixture(scope='module')
def reference(tmp_path_factory):
  """(metrics, workdir) of one uninterrupted in-process run of tiny(**SHARED) on 1 device."""
  wd = tmp_path_factory.mktemp('lt') / 'full'
  return lt.run(tiny(**SHARED), str(wd), progress=False), wd


def test_learns(reference):
  full, wd = reference
  r = full['results']
  assert full['devices'] == 1
  assert r['trained']['accuracy'] > max(r['frozen']['accuracy'], r['untrained']['accuracy']) + 0.1
  assert r['trained']['loss'] < r['untrained']['loss']
  for f in ('head.npz', 'curves.npz', 'metrics.json', 'fingerprint.json'):
    assert os.path.isfile(wd / f)
  params, meta = head_file.load_head(str(wd / 'head.npz'))
  assert meta['head'] == 'affine' and params['w'].shape == (8, 8)


def test_killed_run_resumes_identically(reference, tmp_path, monkeypatch):
  full, wd = reference
  monkeypatch.setattr(runtime, 'FAULT_HOOK', kill_after(8))
  with pytest.raises(KeyboardInterrupt):
    lt.run(tiny(**SHARED), str(tmp_path / 'killed'), progress=False)
  monkeypatch.setattr(runtime, 'FAULT_HOOK', None)
  assert not os.path.exists(tmp_path / 'killed' / 'metrics.json')
  resumed = lt.run(tiny(**SHARED), str(tmp_path / 'killed'), progress=False)
  assert resumed['results'] == full['results'] and resumed['fingerprint'] == full['fingerprint']
  a, b = np.load(wd / 'curves.npz'), np.load(tmp_path / 'killed' / 'curves.npz')
  for k in a.files:
    np.testing.assert_array_equal(a[k], b[k])
  # a changed field refuses the checkpoints, naming it
  with pytest.raises(UserError, match=r'different config .*config.lr'):
    lt.run(tiny(**SHARED, lr=0.05), str(tmp_path / 'killed'), progress=False)


@pytest.mark.parametrize('field, value, match', [
    ('head', 'lora', 'config.head: one of'),
    ('loss', 'mse', 'config.loss: one of'),
    ('similarity', 'l2', 'config.similarity'),
    ('tau', 0.0, r'config.tau: must be a finite number in \[0.0001'),
    ('tau', float('nan'), 'config.tau'),
    ('steps', 0, 'config.steps'),
    ('batch_size', 0, 'config.batch_size'),
    ('steps', 10**10, 'config.steps'),
    ('checkpoint_every', 6, 'config.checkpoint_every: must be a multiple of config.eval_every'),
    ('triplets.sampling', 'random', 'config.triplets.sampling'),
    ('triplets.val_fraction', 1.0, 'config.triplets.val_fraction'),
    ('source', 'imagenet', 'config.source'),
    ('teacher.similarity', 'l1', 'config.teacher.similarity'),
    ('synthetic.n_images', 2, 'config.synthetic.n_images'),
    ('eval_every', 0, 'config.eval_every'),
    ('generate_only', True, 'config.generate_only: writes teacher triplets: only for source=demo or source=folder'),
])
def test_config_refusals(tmp_path, field, value, match):
  with pytest.raises(UserError, match=match) as e:
    lt.validate_config(tiny(**{field: value}))
  assert '\n' not in str(e.value)


def test_refusals_after_the_data(tmp_path):
  with pytest.raises(UserError, match='config.batch_size: exceeds the 400 train triplets'):
    lt.run(tiny(batch_size=512), str(tmp_path / 'a'), progress=False)
  with pytest.raises(UserError, match=r"config.loss: the triplets hold similarities targets"):
    lt.run(tiny(loss='hinge'), str(tmp_path / 'b'), progress=False)
  with pytest.raises(UserError, match='config.source=folder|config.image_dir'):
    lt.validate_config(tiny(source='folder'))
  with pytest.raises(UserError, match='config.train_file'):
    lt.validate_config(tiny(source='files'))


def overrides(c, base, prefix='--config.'):
  """The --config.<field>=<value> flags that turn `base` into `c` (nested fields by their dotted path)."""
  out = []
  for k in c.keys():
    if hasattr(c[k], 'keys'):
      out += overrides(c[k], base[k], f'{prefix}{k}.')
    elif c[k] != base[k]:
      out.append(f'{prefix}{k}={c[k]}')
  return out


# python -m visim_jax.main with the CPU collectives of several processes (jax.distributed from JAX_* variables)
CLI = "import sys, jax\njax.config.update('jax_cpu_collectives_implementation', 'gloo')\n" \
      "sys.argv = ['visim'] + sys.argv[1:]\nfrom visim_jax import main\nmain.run_main()"


def test_cli_on_eight_devices_over_two_processes_equals_one(reference, tmp_path):
  """configs/learn_triplets.py:local through `python -m visim_jax.main` as 2 jax.distributed processes x 4 fake CPU
  devices (the batch axis over 8 devices of 2 hosts, Orbax saving on both), with the overrides of the in-process
  1-device reference run: equal per-step losses, held-out curves and results; the plot and the table written."""
  full, wd = reference
  flags = overrides(tiny(**SHARED, plots=True), cfg.get_config('local'))
  base = {k: v for k, v in os.environ.items() if not k.startswith(('SLURM_', 'TPU_', 'JAX_', 'VISIM_DIST'))}
  base.update(JAX_PLATFORMS='cpu', PYTHONPATH=ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''),
              XLA_FLAGS='--xla_force_host_platform_device_count=4', VISIM_COMPILE_CACHE='0', JAX_NUM_PROCESSES='2')

  def jobs(port):
    import shutil
    shutil.rmtree(tmp_path / 'two', ignore_errors=True)
    return [dict(args=[sys.executable, '-c', CLI, '--config=configs/learn_triplets.py:local',
                       f'--workdir={tmp_path / "two"}', *flags],
                 env={**base, 'JAX_COORDINATOR_ADDRESS': f'localhost:{port}', 'JAX_PROCESS_ID': str(i)}, cwd=ROOT)
            for i in range(2)]
  results = subprocs.free_port_run(jobs)
  for rc, log in results:
    assert rc == 0, log[-3000:]
  assert 'trained' in results[0][1]
  got = json.load(open(tmp_path / 'two' / 'metrics.json'))
  assert got['devices'] == 8 and got['hparams'] == full['hparams']
  assert os.path.isfile(tmp_path / 'two' / 'curves.png')
  a, b = np.load(wd / 'curves.npz'), np.load(tmp_path / 'two' / 'curves.npz')
  for k in a.files:
    np.testing.assert_allclose(b[k], a[k], rtol=2e-5, atol=1e-6, err_msg=k)
  for k in ('frozen', 'untrained', 'trained'):
    for m in ('accuracy', 'loss'):
      np.testing.assert_allclose(got['results'][k][m], full['results'][k][m], rtol=2e-5, atol=1e-6)


def test_index_files_train_the_same_head(tmp_path, human_demo_sets):
  """source=folder: a teacher labels an image folder and writes index files; source=files trains on them (images
  checked on disk first); the trained head is a model spec that the leaderboard ranks beside its frozen features
  (the two-command evaluation of docs/learn_triplets.md)."""
  from PIL import Image
  names = []
  for i in range(12):
    p = tmp_path / f'{i}.png'
    Image.new('RGB', (8, 8), (20 * i, 255 - 20 * i, (37 * i) % 256)).save(p)
    names.append(str(p))
  c = tiny(source='folder', image_dir=str(tmp_path), steps=4, batch_size=8)
  c.triplets.update({'n_train': 40, 'n_val': 10, 'clusters': 3, 'val_fraction': 0.34})
  c.backbone, c.backbone_kwargs.tiny, c.cache_dir = 'alexnet', True, str(tmp_path / 'cache')
  c.teacher.backbone, c.generate_only = 'alexnet', True
  assert lt.run(c, str(tmp_path / 'gen'), progress=False)['generate_only']
  assert sorted(os.listdir(tmp_path / 'gen')) == ['triplets_train.npz', 'triplets_val.npz']
  os.rename(tmp_path / 'gen' / 'triplets_train.npz', tmp_path / 't.npz')
  os.rename(tmp_path / 'gen' / 'triplets_val.npz', tmp_path / 'v.npz')
  c = tiny(source='files', train_file=str(tmp_path / 't.npz'), val_file=str(tmp_path / 'v.npz'), steps=4,
           batch_size=8, similarity='dot')
  c.triplets.update({'n_train': 40, 'n_val': 10})
  c.backbone, c.backbone_kwargs.tiny, c.cache_dir = 'alexnet', True, str(tmp_path / 'cache')
  os.rename(names[0], names[0] + '.x')
  with pytest.raises(UserError, match=f'{names[0]}: image not found'):
    lt.run(c, str(tmp_path / 'w'), progress=False)
  os.rename(names[0] + '.x', names[0])
  m = lt.run(c, str(tmp_path / 'w'), progress=False)
  assert m['n_triplets'] == {'train': 40, 'val': 10} and m['backbone'] == 'alexnet'
  # the trained head as a model spec: -<e0, e1> of the head's embeddings of the backbone features
  from visim_jax.models import heads
  from visim_jax.zoo import similarity
  from visim_jax.zoo import interface
  from visim_jax.zoo import scoring
  sim = similarity.build(f'triplets:{tmp_path / "w"}', interface.Options(cache_dir=str(tmp_path / 'cache'),
                                                                         progress=False))
  f = sim.featurize(names[:4], 'spec')
  d = scoring.pair_distances(sim, f, np.array([0, 1]), f, np.array([2, 3]))
  params, meta = head_file.load_head(str(tmp_path / 'w' / 'head.npz'))
  raw = similarity.build('cosine:alexnet:tiny', interface.Options(cache_dir=None, progress=False)).featurize(
      names[:4], 'raw')
  e = np.asarray(heads.apply(meta['head'], params, raw))
  np.testing.assert_allclose(d, [-(e[0] * e[2]).sum(), -(e[1] * e[3]).sum()], rtol=1e-4, atol=1e-5)
  # before / after through the leaderboard: configs/benchmark.py with --config.models=cosine:X,triplets:WORKDIR
  import importlib.util
  from visim_jax.experiments import benchmark
  spec = importlib.util.spec_from_file_location('benchmark_config', os.path.join(ROOT, 'configs', 'benchmark.py'))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  b = module.get_config()
  models = f'cosine:alexnet:tiny,triplets:{tmp_path / "w"}'
  b.models, b.things_dir, b.things_triplets = models, human_demo_sets.things, human_demo_sets.things_dreamsim
  b.cache_dir, b.n_boot, b.plots = str(tmp_path / 'cache'), 0, False
  board = benchmark.run(b, str(tmp_path / 'board'), progress=False)
  assert board['models'] == models.split(',') and board['protocols'] == ['things']
  for m in board['models']:
    assert board['results'][m]['things'], m
  assert f'triplets:{tmp_path / "w"}' in open(tmp_path / 'board' / 'leaderboard.md').read()


def test_human_sources_things_and_nights(tmp_path, human_demo_sets):
  """THINGS choices (hard targets) and NIGHTS votes (DreamSim's hinge) from the offline mini sets of human_demo."""
  h = human_demo_sets
  base = dict(steps=4, eval_every=4, checkpoint_every=4, batch_size=8, similarity='cosine', checkpoint=False)
  for source, extra in (('things', dict(things_dir=h.things, things_file=h.things_dreamsim, loss='hard')),
                        ('nights', dict(nights_dir=h.nights, loss='hinge'))):
    c = tiny(source=source, **base, **extra)
    c.backbone, c.backbone_kwargs.tiny, c.cache_dir = 'alexnet', True, str(tmp_path / 'cache')
    m = lt.run(c, str(tmp_path / source), progress=False)
    assert m['target'] == {'things': 'odd', 'nights': 'judge'}[source]
    assert all(0.0 <= m['results'][k]['accuracy'] <= 1.0 for k in ('frozen', 'trained'))
  with pytest.raises(UserError, match=r"config.loss: the triplets hold judge targets: use one of \('hinge',\)"):
    c = tiny(source='nights', nights_dir=h.nights, **base)
    c.backbone, c.backbone_kwargs.tiny, c.cache_dir = 'alexnet', True, str(tmp_path / 'cache')
    lt.run(c, str(tmp_path / 'x'), progress=False)
  with pytest.raises(UserError, match='config.things_file: required for source=things'):
    lt.validate_config(tiny(source='things', things_dir=h.things))


def test_demo_mode_offline_with_real_weights(tmp_path):
  """`:demo` as documented (AlexNet teacher with its packaged weights labels the embedded demo photos, an
  EfficientNet-Lite0 student learns them) at a CI size: 16 photos, 40 steps."""
  c = cfg.get_config('demo')
  c.demo.n_pairs, c.cache_dir, c.plots = 8, str(tmp_path / 'cache'), False
  c.triplets.update({'n_train': 600, 'n_val': 120, 'clusters': 4})
  c.size, c.batch_size, c.steps, c.warmup, c.eval_every, c.checkpoint_every = 32, 32, 40, 5, 20, 40
  m = lt.run(c, str(tmp_path / 'demo'), progress=False)
  r = m['results']
  assert m['backbone'] == 'efficientnet_lite0' and m['n_triplets'] == {'train': 600, 'val': 120}
  assert all(0 <= r[k]['accuracy'] <= 1 for k in ('frozen', 'untrained', 'trained'))
  assert r['trained']['loss'] < r['untrained']['loss']
  assert os.path.isfile(tmp_path / 'demo' / 'head.npz')


def test_alignet_release_over_mocked_imagenet(tmp_path):
  """source='alignet': AligNet's released files (written in their layout by test_tune.write_alignet) over mocked
  TFDS ImageNet; the student's features of the images they use, a head trained on their similarities."""
  import tensorflow_datasets as tfds
  from test_tune import write_alignet
  write_alignet(tmp_path / 'alignet')
  c = tiny(source='alignet', alignet_dir=str(tmp_path / 'alignet'), steps=4, eval_every=4, checkpoint_every=4,
           batch_size=8, checkpoint=False, target_tau=1.0)
  c.backbone, c.backbone_kwargs.tiny, c.cache_dir = 'alexnet', True, str(tmp_path / 'cache')
  with tfds.testing.mock_data(num_examples=40):
    m = lt.run(c, str(tmp_path / 'run'), progress=False)
  assert m['source'] == 'alignet' and m['target'] == 'similarities'
  assert all(0.0 <= m['results'][k]['accuracy'] <= 1.0 for k in ('frozen', 'trained'))
