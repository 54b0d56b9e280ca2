"""`~` and `$VAR` in path flags and config fields (issue 22: docs/search.md's `--folder=~/.cache/...` was refused;
a shell leaves `~` after '=' as it is)."""
import os

import ml_collections

from visim_jax.core import paths
from visim_jax.experiments import checks


def test_expand_path(monkeypatch):
  monkeypatch.setenv('HOME', '/home/u')
  monkeypatch.setenv('DATA', '/data')
  assert paths.expand_path('~/TLL') == '/home/u/TLL'
  assert paths.expand_path('$DATA/x') == paths.expand_path('${DATA}/x') == '/data/x'
  assert paths.expand_path('a,~/b, $DATA') == 'a,/home/u/b,/data'  # comma lists (retrieval.roots) item by item
  for same in ('tll', 'stage1,stage2', '', 'x~y', None, 3):
    assert paths.expand_path(same) == same


def test_expand_config_in_place_on_a_locked_config(monkeypatch):
  monkeypatch.setenv('HOME', '/home/u')
  c = ml_collections.ConfigDict({'data_dir': '~/TLL', 'dataset': 'tll', 'runs': 2, 'features': '',
                                 'retrieval': {'roots': '~/oxford5k,~/paris6k', 'gt': None}, 'models': ('~/a', 'b')})
  c.lock()
  checks.expand_config(c)
  assert c.data_dir == '/home/u/TLL' and c.dataset == 'tll' and c.runs == 2 and c.features == ''
  assert c.retrieval.roots == '/home/u/oxford5k,/home/u/paris6k' and c.retrieval.gt is None
  assert tuple(c.models) == ('/home/u/a', 'b')


def test_main_run_expands_config_paths(monkeypatch, tmp_path):
  """The one entry point (command line and notebooks): a `~` data_dir reaches the experiment expanded."""
  from visim_jax import main
  from visim_jax.experiments import adapt
  monkeypatch.setenv('HOME', str(tmp_path))
  seen = {}
  monkeypatch.setattr(adapt, 'run', lambda config, workdir: seen.update(data_dir=config.data_dir, workdir=workdir))
  monkeypatch.setattr(adapt, 'validate_config', lambda config: seen.update(validated=config.data_dir))
  c = ml_collections.ConfigDict({'experiment': 'adapt', 'data_dir': '~/TLL'})
  main.run(c, '~/wd')
  assert seen == {'data_dir': os.path.join(str(tmp_path), 'TLL'), 'workdir': os.path.join(str(tmp_path), 'wd'),
                  'validated': os.path.join(str(tmp_path), 'TLL')}  # checked after expansion, as it is used
