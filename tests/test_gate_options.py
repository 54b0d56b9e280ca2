"""The gate's parse step over every config mode: a user path is never replaced by a mode's default nor ignored.

For each configs/*.py mode (get_config's `known:` list), every input-path field set to a missing path is refused by
the experiment's validate_config, naming that field (`config.<field>`), before anything runs."""
import importlib
import os
import re

import pytest

from visim_jax.core.errors import UserError

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'configs')
PATH_FIELDS = ('data_dir', 'subset', 'features', 'nights_dir', 'bapps_dir', 'things_dir', 'things_triplets',
               'things_names', 'tll_dir', 'tll_subset', 'cosis_dir', 'cosis_image_dir', 'classes_dir', 'image_dir',
               'annotations', 'source_stats', 'class_tree', 'init_from', 'retrieval.gt', 'retrieval.features',
               'retrieval.roots')


def _module(name):
  spec = importlib.util.spec_from_file_location(f'cfg_{name}', os.path.join(CONFIGS, f'{name}.py'))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def _modes(mod):
  try:
    mod.get_config('no-such-mode')
  except ValueError as e:
    known = re.search(r'known: ([^)]*)\)', str(e))
    return [None] + ([m.strip() for m in known.group(1).split(',')] if known else [])
  return [None]


CASES = [(n[:-3], m) for n in sorted(os.listdir(CONFIGS)) if n.endswith('.py')
         for m in _modes(_module(n[:-3]))]


def _get(c, field):
  node = c
  for k in field.split('.'):
    if k not in node:
      return None
    node = node[k]
  return node


def _set(c, field, value):
  *parents, last = field.split('.')
  node = c
  for k in parents:
    node = node[k]
  with node.unlocked():
    node[last] = value


@pytest.mark.parametrize('name,mode', CASES, ids=[f'{n}:{m}' for n, m in CASES])
def test_every_user_path_is_checked_in_every_mode(name, mode, tmp_path):
  base = _module(name).get_config(mode)
  experiment = importlib.import_module(f'visim_jax.experiments.{base.experiment}')
  fields = [f for f in PATH_FIELDS if isinstance(_get(base, f), str)]
  assert fields or name == 'simnet_warmup'
  missing = str(tmp_path / 'nonexistent.txt')
  try:   # a mode that needs data the test has not (e.g. data_dir) is refused for that first, with or without it
    experiment.validate_config(_module(name).get_config(mode))
    base_error = None
  except (UserError, FileNotFoundError) as e:
    base_error = str(e)
  for field in fields:
    c = _module(name).get_config(mode)
    _set(c, field, missing)
    with pytest.raises((UserError, FileNotFoundError)) as e:
      experiment.validate_config(c)
    msg = str(e.value)
    assert msg.startswith(f'config.{field}') or msg == base_error, (name, mode, field, msg)
