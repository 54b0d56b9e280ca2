"""The learn_triplets experiment on tiny synthetic features: learning happens, a killed run resumes identically, 8 fake
devices give the numbers of 1, every config field is checked, index files of another run train the same head, and
one end-to-end `:local` through main."""
import json
import os
import sys

import numpy as np
import pytest

import subprocs
from visim_jax import runtime
from visim_jax.errors import UserError
from visim_jax.experiments import learn_triplets as lt

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, 'configs'))
import learn_triplets as cfg  # noqa: E402


def tiny(**kw):
  c = cfg.get_config('local')
  c.synthetic.update({'n_images': 60, 'dim': 8, 'teacher_dim': 8})
  c.triplets.update({'n_train': 400, 'n_val': 100, 'clusters': 4})
  c.steps, c.eval_every, c.checkpoint_every, c.batch_size, c.size, c.plots = 12, 4, 4, 16, 8, False
  c.lr, c.warmup = 0.1, 4
  for k, v in kw.items():
    node = c
    *path, leaf = k.split('.')
    for p in path:
      node = node[p]
    node[leaf] = v
  return c


def test_learns_and_resumes_identically(tmp_path, monkeypatch):
  full = lt.run(tiny(steps=24, eval_every=8, checkpoint_every=8), str(tmp_path / 'full'), progress=False)
  r = full['results']
  assert r['trained']['accuracy'] > max(r['frozen']['accuracy'], r['untrained']['accuracy']) + 0.1
  assert r['trained']['loss'] < r['untrained']['loss']
  for f in ('head.npz', 'curves.npz', 'metrics.json', 'fingerprint.json'):
    assert os.path.isfile(tmp_path / 'full' / f)
  params, meta = lt.load_head(str(tmp_path / 'full' / 'head.npz'))
  assert meta['head'] == 'affine' and params['w'].shape == (8, 8)

  def kill(phase, step, directory):
    if phase == 'after_save' and step == 16:
      raise KeyboardInterrupt('simulated kill')
  monkeypatch.setattr(runtime, 'FAULT_HOOK', kill)
  with pytest.raises(KeyboardInterrupt):
    lt.run(tiny(steps=24, eval_every=8, checkpoint_every=8), str(tmp_path / 'killed'), progress=False)
  monkeypatch.setattr(runtime, 'FAULT_HOOK', None)
  assert not os.path.exists(tmp_path / 'killed' / 'metrics.json')
  resumed = lt.run(tiny(steps=24, eval_every=8, checkpoint_every=8), str(tmp_path / 'killed'),
                   progress=False)
  assert resumed['results'] == full['results'] and resumed['fingerprint'] == full['fingerprint']
  a, b = np.load(tmp_path / 'full' / 'curves.npz'), np.load(tmp_path / 'killed' / 'curves.npz')
  for k in a.files:
    np.testing.assert_array_equal(a[k], b[k])
  # a changed field refuses the checkpoints, naming it
  with pytest.raises(UserError, match=r'different config .*config.lr'):
    lt.run(tiny(steps=24, eval_every=8, checkpoint_every=8, lr=0.05), str(tmp_path / 'killed'), progress=False)


@pytest.mark.parametrize('field, value, match', [
    ('head', 'lora', 'config.head: one of'),
    ('loss', 'mse', 'config.loss: one of'),
    ('similarity', 'l2', 'config.similarity'),
    ('tau', 0.0, r'config.tau: must be a finite number in \(0'),
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


WORKER = r"""
import json, os, sys
sys.path.insert(0, os.path.join(sys.argv[1], 'tests'))
import jax
if len(sys.argv) > 3:   # process id, processes, port: one jax.distributed process of several
  jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  jax.distributed.initialize(f'localhost:{sys.argv[5]}', int(sys.argv[4]), int(sys.argv[3]))
from test_learn_triplets import tiny
from visim_jax.experiments import learn_triplets as lt
m = lt.run(tiny(steps=16), sys.argv[2], progress=False)
if jax.process_index() == 0:
  json.dump({'results': m['results'], 'devices': m['devices'], 'processes': jax.process_count()},
            open(os.path.join(sys.argv[2], 'out.json'), 'w'))
  import numpy as np
  np.save(os.path.join(sys.argv[2], 'loss.npy'), np.load(os.path.join(sys.argv[2], 'curves.npz'))['loss'])
"""


def test_eight_devices_and_two_processes_equal_one(tmp_path):
  """8 fake devices in one process, and 2 jax.distributed processes x 2 devices (Orbax saving on both), give the
  numbers of 1 device: per-step losses and held-out results."""
  base = {k: v for k, v in os.environ.items() if not k.startswith(('SLURM_', 'TPU_', 'JAX_COORD', 'VISIM_DIST'))}
  base.update(JAX_PLATFORMS='cpu', PYTHONPATH=ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''))
  flags = lambda n: {**base, 'XLA_FLAGS': f'--xla_force_host_platform_device_count={n}'}

  def jobs(port):
    import shutil
    shutil.rmtree(tmp_path / 'two', ignore_errors=True)
    return ([dict(args=[sys.executable, '-c', WORKER, ROOT, str(tmp_path / 'eight')], env=flags(8), cwd=ROOT)] +
            [dict(args=[sys.executable, '-c', WORKER, ROOT, str(tmp_path / 'two'), str(i), '2', str(port)],
                  env=flags(2), cwd=ROOT) for i in range(2)])
  for rc, log in subprocs.free_port_run(jobs):
    assert rc == 0, log[-3000:]
  one = lt.run(tiny(steps=16), str(tmp_path / 'one'), progress=False)
  assert one['devices'] == 1
  for name, devices, processes in (('eight', 8, 1), ('two', 4, 2)):
    got = json.load(open(tmp_path / name / 'out.json'))
    assert got['devices'] == devices and got['processes'] == processes
    np.testing.assert_allclose(np.load(tmp_path / name / 'loss.npy'),
                               np.load(tmp_path / 'one' / 'curves.npz')['loss'], rtol=2e-5, atol=1e-6)
    for k in ('frozen', 'untrained', 'trained'):
      for m in ('accuracy', 'loss'):
        np.testing.assert_allclose(got['results'][k][m], one['results'][k][m], rtol=2e-5, atol=1e-6)


def test_index_files_train_the_same_head(tmp_path):
  """source=folder: a teacher labels an image folder and writes index files; source=files trains on them (images
  checked on disk first); the trained head is a model spec."""
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
  from visim_jax import heads, similarity
  sim = similarity.build(f'triplets:{tmp_path / "w"}', similarity.Options(cache_dir=str(tmp_path / 'cache'),
                                                                         progress=False))
  f = sim.featurize(names[:4], 'spec')
  d = similarity.pair_distances(sim, f, np.array([0, 1]), f, np.array([2, 3]))
  params, meta = lt.load_head(str(tmp_path / 'w' / 'head.npz'))
  raw = similarity.build('cosine:alexnet:tiny', similarity.Options(cache_dir=None, progress=False)).featurize(
      names[:4], 'raw')
  e = np.asarray(heads.apply(meta['head'], params, raw))
  np.testing.assert_allclose(d, [-(e[0] * e[2]).sum(), -(e[1] * e[3]).sum()], rtol=1e-4, atol=1e-5)


def test_local_end_to_end(tmp_path):
  """configs/learn_triplets.py:local through the CLI (a small override keeps it fast)."""
  import subprocess
  r = subprocess.run([sys.executable, '-m', 'visim_jax.main', '--config=configs/learn_triplets.py:local',
                      f'--workdir={tmp_path / "w"}', '--config.steps=100', '--config.triplets.n_train=4000',
                      '--config.triplets.n_val=500'],
                     cwd=ROOT, capture_output=True, text=True,
                     env={**os.environ, 'JAX_PLATFORMS': 'cpu', 'VISIM_COMPILE_CACHE': '0'})
  assert r.returncode == 0, r.stderr[-3000:]
  m = json.load(open(tmp_path / 'w' / 'metrics.json'))
  assert m['results']['trained']['accuracy'] > m['results']['frozen']['accuracy']
  assert os.path.isfile(tmp_path / 'w' / 'curves.png')
  r = subprocess.run([sys.executable, '-m', 'visim_jax.main', '--config=configs/learn_triplets.py:local',
                      f'--workdir={tmp_path / "x"}', '--config.bogus=1'], cwd=ROOT, capture_output=True, text=True,
                     env={**os.environ, 'JAX_PLATFORMS': 'cpu'})
  assert r.returncode == 1 and 'bogus' in r.stderr and not os.path.exists(tmp_path / 'x')


def test_human_sources_things_and_nights(tmp_path):
  """THINGS choices (hard targets) and NIGHTS votes (DreamSim's hinge) from the offline mini sets of human_demo."""
  from visim_jax.data import human_demo
  h = human_demo.demo_sets(str(tmp_path / 'demo'))
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
