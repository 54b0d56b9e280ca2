"""End to end: the twoafc experiment on the synthetic CoSIS-format set (no shared data needed), and bad input."""
import json
import os

import numpy as np
import pytest

from visim_jax import main as main_lib
from visim_jax.experiments import twoafc as exp


def _config(**kw):
  import importlib.util
  spec = importlib.util.spec_from_file_location('cfg', os.path.join(os.path.dirname(__file__), '..', 'configs',
                                                                    'twoafc.py'))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  c = mod.get_config('local')
  c.model.steps, c.ensemble.mlp_steps, c.n_boot = 40, 40, 20
  c.plots = True
  for k, v in kw.items():
    c[k] = v
  return c


def test_end_to_end_synthetic(tmp_path):
  wd = str(tmp_path / 'wd')
  out = main_lib.run(_config(annotations='synthetic'), wd)
  m = json.load(open(os.path.join(wd, 'metrics.json')))
  assert m['features']['kind'] == 'stand_in' and 'STAND-IN' in m['features']['note']
  assert m['annotations']['synthetic'] and m['annotations']['files']['mulref_val.txt']['header']
  assert [r['description'].split(' ')[0] for r in m['table6']] == ['not', 'best', 'majority', 'PCA', 'MLP']
  for r in m['table6']:
    assert 0.0 <= r['val'] <= 1.0 and 0.0 <= r['test'] <= 1.0
  assert m['cosine_baseline']['test']['ci_low'] <= m['cosine_baseline']['test']['accuracy'] <= \
      m['cosine_baseline']['test']['ci_high']
  assert m['cosine_baseline']['val']['accuracy'] > 0.6   # the synthetic labels follow a metric of the features
  assert len(m['context_models']['contexts']) == 8
  assert np.asarray(m['context_models']['cross_context_held_out']['embedding']).shape == (8, 8)
  for p in ('accuracy_per_context', 'cross_context', 'credibility_maps', 'ensembles'):
    assert os.path.getsize(os.path.join(wd, 'plots', f'{p}.png')) > 1000
  assert os.path.exists(os.path.join(wd, 'config.json')) and out['experiment'] == 'twoafc'


def test_features_npz_missing_id_names_the_line(tmp_path):
  c = _config(annotations='synthetic')
  folder = exp.write_synthetic_cosis(str(tmp_path / 'cosis'), 0, 32)
  sets = exp.load_sets(folder)
  keys = list(dict.fromkeys(k for t in exp.all_triplets(sets) for k in t.keys()))
  dropped = sets['mulref_test'].b[4]            # first used on mulref_test.txt line 2 (row 2, triple 2)
  keep = [k for k in keys if k != dropped]
  np.savez(tmp_path / 'f.npz', features=np.ones((len(keep), 4), np.float32), names=np.asarray(keep))
  c.annotations, c.features = folder, str(tmp_path / 'f.npz')
  wd = tmp_path / 'wd'
  with pytest.raises(KeyError, match=rf"mulref_test.txt:line \d+: image '{dropped}' has no row in the features"):
    main_lib.run(c, str(wd))
  assert not wd.exists()  # nothing written before the inputs are checked


def test_bad_config_fails_early(tmp_path):
  with pytest.raises(ValueError, match='config.image_dir: set config.features or config.image_dir'):
    main_lib.run(_config(features='a.npz', image_dir='b'), str(tmp_path))
  with pytest.raises(FileNotFoundError, match='config.annotations: folder /nonexistent not found'):
    main_lib.run(_config(annotations='/nonexistent'), str(tmp_path))
  with pytest.raises(FileNotFoundError, match='config.image_dir: folder'):
    main_lib.run(_config(annotations=exp.write_synthetic_cosis(str(tmp_path / 'c'), 0, 32),
                         image_dir=str(tmp_path / 'nope')), str(tmp_path / 'wd'))
