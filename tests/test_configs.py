"""Every `:arg` mode a config's docstring documents builds, and either runs (modes that need no images: tiny
step budgets) or passes every check made before feature extraction (modes on the offline demo images: sizes
from the file list + the backbone's layer sizes), or fails with the one-line UserError naming the field it
needs (modes on data that is not here: config.data_dir, config.features...). Unknown args are refused."""
import importlib.util
import os
import re

import numpy as np
import pytest

from visim_jax.backbones import features as features_lib
from visim_jax import main
from visim_jax.core.errors import UserError
from visim_jax.experiments import config_fields

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(ROOT, 'configs')


def load(name):
  spec = importlib.util.spec_from_file_location(f'config_{name}', os.path.join(CONFIGS, f'{name}.py'))
  module = importlib.util.module_from_spec(spec)
  import sys
  sys.path.insert(0, CONFIGS)
  spec.loader.exec_module(module)
  return module


def documented_modes():
  out = []
  for f in sorted(os.listdir(CONFIGS)):
    if not f.endswith('.py'):
      continue
    name = f[:-3]
    doc = load(name).__doc__ or ''
    args = set(re.findall(rf'configs/{name}\.py:(\w+)', doc)) | set(re.findall(r'`:(\w+)`', doc))
    out += [(name, None)] + [(name, a) for a in sorted(args)]
  return out


MODES = documented_modes()


@pytest.fixture(scope='module', autouse=True)
def one_backbone_load():
  """Each backbone's weights are loaded once for the whole module (the modes only need its shapes)."""
  import functools
  from visim_jax.backbones import registry
  mp = pytest.MonkeyPatch()
  mp.setattr(registry, 'get_backbone', functools.lru_cache(maxsize=None)(registry.get_backbone))
  yield
  mp.undo()


def test_every_config_documents_its_run_command():
  for f in sorted(os.listdir(CONFIGS)):
    if f.endswith('.py'):
      assert f'--config=configs/{f}' in (load(f[:-3]).__doc__ or ''), f


@pytest.mark.parametrize('name', sorted({n for n, _ in MODES}))
def test_unknown_arg_is_refused_naming_the_file(name):
  with pytest.raises(ValueError, match=rf'configs/{name}.py: unknown argument'):
    load(name).get_config('no_such_mode')


@pytest.fixture(scope='module')
def pair_features(tmp_path_factory):
  d = tmp_path_factory.mktemp('feats')
  rng = np.random.RandomState(0)
  left = rng.randn(60, 12).astype(np.float32)
  np.savez(d / 'pairs.npz', left=left, right=left + 0.4 * rng.randn(60, 12).astype(np.float32),
           names=np.array([f'{i:03d}.jpg' for i in range(60)]))
  return str(d / 'pairs.npz')


def small(c):
  """Tiny budgets: the mode's wiring runs, not its full training."""
  for field, cap in (('runs', 2), ('epochs', 3), ('warmup_steps', 6), ('steps', 6), ('refine_steps', 4),
                     ('warmup_eval_pairs', 50), ('hard_set_size', 10)):
    if field in c and isinstance(c[field], int) and c[field] > cap:
      c[field] = cap
  if 'warmup_steps' in c and c.mode == 'warmup':
    c.warmup_steps = max(c.warmup_steps, 1)
  if 'log_every' in c:
    c.log_every = c.checkpoint_every = 8   # one chunk per phase: one compilation each
  if 'plots' in c:
    c.plots = False
  return c


def check_before_extraction(c, demo_root, cache):
  """What a run checks before any image is read: config fields, the file list, sizes vs the backbone."""
  c = config_fields.select_source(c)
  exp = c.experiment
  if exp == 'adapt':
    from visim_jax.data import pairs as pairs_lib
    from visim_jax.experiments import adapt
    adapt.validate_config(c)
    pairs, _ = config_fields.pairs(c)
    backbone, layers = features_lib.build(config_fields.options(c))
    adapt.check_sizes(adapt.hparams_from_config(c), len(pairs), sum(backbone.layer_dims(layers).values()),
                      [int(k) for k in c.ks])
  elif exp == 'simnet':
    from visim_jax.experiments import simnet
    simnet.validate_config(c)
    if c.mode != 'warmup' and c.dataset != 'features':
      features_lib.build(config_fields.options(c))
  else:  # histograms, twoafc, ...: their own validation where they have one
    module = __import__(f'visim_jax.experiments.{exp}', fromlist=['run'])
    if hasattr(module, 'validate_config'):
      module.validate_config(c)


@pytest.mark.parametrize('name, arg', MODES, ids=[f'{n}:{a}' if a else n for n, a in MODES])
def test_documented_mode(name, arg, tmp_path, demo_root, pair_features):
  c = load(name).get_config(arg)
  if 'cache_dir' in c:
    c.cache_dir = str(tmp_path / 'cache')
  if 'demo' in c and 'root' in c.demo:
    c.demo.root = os.path.dirname(demo_root)  # the session's demo set (192 pairs); other sizes built beside it
  needs_images = c.get('dataset') in ('demo', 'tll', 'folder', 'images') or bool(c.get('image_dir'))
  runs_here = arg == 'local' or (name == 'simnet_warmup' and arg is None)  # the rest: checked, not trained
  if c.get('experiment') == 'simnet' and (c.mode == 'warmup' or c.dataset == 'features') and runs_here:
    if c.dataset == 'features':
      c.features = pair_features if c.mode == 'pairs' else c.features
    if not c.get('features') and c.mode != 'warmup':
      with pytest.raises(UserError, match='config.features'):
        main.run(small(c), str(tmp_path / 'w'))
      return
    m = main.run(small(c), str(tmp_path / 'w'))
    assert m['experiment'] == 'simnet' and os.path.exists(tmp_path / 'w' / 'metrics.json')
    return
  try:
    check_before_extraction(small(c), demo_root, str(tmp_path / 'cache'))
  except (UserError, FileNotFoundError) as e:  # data that is not in this checkout: the field is named
    msg = str(e)
    assert msg.startswith('config.') or msg.startswith('/'), msg
    assert needs_images or c.get('features') == '' or 'config.' in msg, msg
    field = msg.split(':')[0]
    assert field.startswith('config.') and field.split('.')[1].split(' ')[0] in c, msg
