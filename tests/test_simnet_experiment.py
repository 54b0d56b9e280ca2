"""End-to-end SimNet experiment on tiny data: warm-up, class-labelled retrieval (+ revisited Oxford-style eval,
kill and resume), TLL-style pairs; bad input fails early naming the field."""
import json
import os
import pickle
import sys

import numpy as np
import pytest

from visim_jax import main
from visim_jax.training import runtime
from visim_jax.core.errors import UserError

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'configs'))
import simnet_classes  # noqa: E402
import simnet_tll  # noqa: E402
import simnet_warmup  # noqa: E402


def kill_after(step):
  """A runtime.FAULT_HOOK that kills the run (KeyboardInterrupt) right after the checkpoint of `step`."""
  def hook(phase, at, directory):
    if phase == 'after_save' and at == step:
      raise KeyboardInterrupt(f'simulated kill after step {at}')
  return hook


def clustered(rng, n_classes, per_class, dim, noise=0.6):
  centres = rng.randn(n_classes, dim)
  labels = np.repeat(np.arange(n_classes), per_class)
  return (centres[labels] + noise * rng.randn(len(labels), dim)).astype(np.float32), labels


def test_warmup_end_to_end(tmp_path):
  c = simnet_warmup.get_config('local')
  c.plots = True
  m = main.run(c, str(tmp_path))
  assert m['warmup']['rho'] > 0.9 and m['warmup']['train_pairs'] == 30000
  for f in ('metrics.json', 'config.json', 'curves.npz', 'plots/training_curve.png', 'plots/warmup_scatter.png'):
    assert os.path.exists(tmp_path / f), f
  assert os.listdir(tmp_path / 'checkpoints')


@pytest.fixture(scope='module')
def class_files(tmp_path_factory):
  d = tmp_path_factory.mktemp('classes')
  rng = np.random.RandomState(0)
  x, labels = clustered(rng, 6, 10, 12)
  np.savez(d / 'train.npz', features=x, labels=np.array([f'class{l}' for l in labels]))
  # an Oxford-like evaluation: 3 queries against a 20-image database, revisited ground truth
  db, db_lab = clustered(rng, 3, 6, 12)
  db = np.concatenate([db, rng.randn(2, 12).astype(np.float32)])
  q = db[[0, 6, 12]] + 0.1 * rng.randn(3, 12).astype(np.float32)
  gnd = [{'bbx': [0, 0, 1, 1], 'easy': [i for i in range(18) if db_lab[i] == c][:3],
          'hard': [i for i in range(18) if db_lab[i] == c][3:], 'junk': [18]} for c in range(3)]
  np.savez(d / 'oxford.npz', database=db, queries=q)
  with open(d / 'gnd_rtest.pkl', 'wb') as f:
    pickle.dump({'imlist': [f'im{i}' for i in range(20)], 'qimlist': ['q0', 'q1', 'q2'], 'gnd': gnd}, f)
  return d


def classes_config(d):
  c = simnet_classes.get_config('local')
  c.dataset = 'features'
  c.features = str(d / 'train.npz')
  c.retrieval.gt = str(d / 'gnd_rtest.pkl')
  c.retrieval.features = str(d / 'oxford.npz')
  c.plots = False
  return c


def test_classes_end_to_end_with_resume(tmp_path, class_files, monkeypatch):
  c = classes_config(class_files)
  full = main.run(c, str(tmp_path / 'full'))
  for name in ('cosine', 'simnet'):
    assert 0 < full['results'][name]['mAP'] <= 1
    assert set(full['oxford_paris'][name]) == {'easy', 'medium', 'hard'}
  assert full['simnet_star']['scored_pairs'] == 40 * 39
  assert full['steps'] == {'warmup': 20, 'stage1': 60, 'stage2_simnet_star': 40, 'batch_size': 100}
  assert os.path.exists(tmp_path / 'full' / 'hard_pairs.npz')
  # killed right after the stage-1 checkpoint (step 80), then resumed: identical results
  monkeypatch.setattr(runtime, 'FAULT_HOOK', kill_after(80))
  with pytest.raises(KeyboardInterrupt):
    main.run(c, str(tmp_path / 'resumed'))
  monkeypatch.setattr(runtime, 'FAULT_HOOK', None)
  assert not os.path.exists(tmp_path / 'resumed' / 'metrics.json')
  resumed = main.run(c, str(tmp_path / 'resumed'))
  assert resumed['results'] == full['results']
  assert resumed['simnet_star'] == full['simnet_star']
  on_disk = json.load(open(tmp_path / 'resumed' / 'metrics.json'))
  assert on_disk['results']['simnet']['mAP'] == pytest.approx(full['results']['simnet']['mAP'])
  # a different config must not resume from these checkpoints
  c.delta = 0.8
  with pytest.raises(ValueError, match='checkpoints of a different config'):
    main.run(c, str(tmp_path / 'resumed'))


def test_pairs_end_to_end(tmp_path):
  rng = np.random.RandomState(1)
  left = rng.randn(40, 10).astype(np.float32)
  right = left + 0.5 * rng.randn(40, 10).astype(np.float32)
  np.savez(tmp_path / 'pairs.npz', left=left, right=right, names=np.array([f'{i:05d}.jpg' for i in range(40)]))
  c = simnet_tll.get_config('local')
  c.features = str(tmp_path / 'pairs.npz')
  m = main.run(c, str(tmp_path / 'run'))
  assert m['n_test'] == 10 and set(m['results']['simnet']) == {'aR@1', 'aR@3', 'R@1', 'R@3'}
  assert m['results']['cosine']['aR@3'] >= m['results']['cosine']['aR@1']
  assert os.path.exists(tmp_path / 'run' / 'plots' / 'score_vs_cosine.png')


def test_bad_input_fails_early(tmp_path):
  c = simnet_classes.get_config('local')
  c.dataset = 'features'
  c.features = str(tmp_path / 'missing.npz')
  with pytest.raises(UserError, match='config.features: .*missing.npz not found'):
    main.run(c, str(tmp_path / 'w'))
  assert not os.path.exists(tmp_path / 'w')
  c = simnet_tll.get_config('local')
  c.dataset = 'nope'
  with pytest.raises(ValueError, match='config.dataset'):
    main.run(c, str(tmp_path / 'w'))
  c = simnet_classes.get_config('local')
  c.architecture = 'Z'
  with pytest.raises(ValueError, match='config.architecture'):
    main.run(c, str(tmp_path / 'w'))
  np.savez(tmp_path / 'bad.npz', features=np.random.RandomState(0).rand(4, 3), labels=np.zeros(4))
  c = simnet_classes.get_config('local')
  c.dataset, c.features = 'features', str(tmp_path / 'bad.npz')
  with pytest.raises(ValueError, match='at least 2 classes'):
    main.run(c, str(tmp_path / 'w'))
  # degenerate features (every row the same vector) are refused, naming the file
  np.savez(tmp_path / 'const.npz', features=np.ones((4, 3), np.float32), labels=np.arange(4) % 2)
  c.features = str(tmp_path / 'const.npz')
  with pytest.raises(ValueError, match='const.npz: every row of the features is the same vector'):
    main.run(c, str(tmp_path / 'w'))
  assert not os.path.exists(tmp_path / 'w')
