"""End to end: the twoafc experiment on the real CoSIS annotations with stand-in features (every reported
accuracy is at chance: issue 12 item 1), on the synthetic CoSIS-format set (something to learn; kill + resume
equals no kill), and bad input."""
import json
import os

import numpy as np
import pytest

from visim_jax import main as main_lib
from visim_jax.training import runtime
from visim_jax.data import cosis
from visim_jax.core.errors import UserError
from visim_jax.experiments import twoafc as exp

needs_data = pytest.mark.skipif(not os.path.isdir(exp.SHARED_COSIS),
                                reason=f'CoSIS annotations not found at {exp.SHARED_COSIS}')


def _config(**kw):
  import importlib.util
  spec = importlib.util.spec_from_file_location('cfg', os.path.join(os.path.dirname(__file__), '..', 'configs',
                                                                    'twoafc.py'))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  c = mod.get_config('local')
  c.model.embed_dim, c.model.hidden, c.model.steps, c.model.chunk_steps = 16, 16, 40, 20
  c.ensemble.mlp_epochs, c.ensemble.mlp_seeds, c.ensemble.mlp_dim = 10, 2, 8
  c.n_boot, c.plots = 200, False
  for k, v in kw.items():
    c[k] = v
  return c


def _accuracies(o, path=''):
  """Every {accuracy, ci_low, ci_high} dict in metrics.json, with its path."""
  if isinstance(o, dict):
    if 'ci_low' in o:
      yield path, o
    else:
      for k, v in o.items():
        yield from _accuracies(v, f'{path}/{k}')
  elif isinstance(o, list):
    for i, v in enumerate(o):
      yield from _accuracies(v, f'{path}[{i}]')


@needs_data
def test_stand_in_features_on_real_annotations_are_chance_everywhere(tmp_path):
  # ~70 intervals: each at 1 - 0.05/70 (Bonferroni) so the family holds 0.5 with >= 95% probability
  wd = str(tmp_path / 'wd')
  c = _config(ci_level=1 - 0.05 / 70, plots=True)
  c.ensemble.pca_fit = 'authors'                                  # the code's PCA fit set (the default: 'val')
  m = main_lib.run(c, wd)
  assert m['features']['kind'] == 'stand_in' and 'at chance' in m['features']['note']
  accs = list(_accuracies(m))
  out_of_sample = [(p, a) for p, a in accs if not a.get('in_sample')]
  for kind in ('embedding', 'ranking_block'):                     # each model, each answer, both sets
    assert sum(f'/cc_accuracy/' in p and f'/{kind}/' in p for p, _ in out_of_sample) == 2 * 9
  assert sum('/per_context/' in p for p, _ in out_of_sample) == 3 * 8
  assert {'/ensembles/majority_vote/test', '/ensembles/pca_credibility/test', '/ensembles/mlp/test',
          '/ensembles/best_single/test', '/ensembles_ranking_block/pca_credibility/test'} <= {p for p, _ in accs}
  outside = [(p, round(a['accuracy'], 4), round(a['ci_low'], 4), round(a['ci_high'], 4))
             for p, a in out_of_sample if not a['ci_low'] <= 0.5 <= a['ci_high']]
  assert not outside, outside
  # in-sample numbers (fitted on mulref_val, as the paper's Table 6 val column) are flagged as such
  assert {p for p, a in accs if a.get('in_sample')} >= {'/ensembles/pca_credibility/val', '/ensembles/mlp/val'}
  sweep = m['ensembles']['subset_sweep']
  assert len(sweep['size']) == 255 and np.asarray(sweep['mlp']).shape == (255, 2)
  assert all(abs(x - 0.5) < 0.05 for x in sweep['majority'] + sweep['pca'])
  assert len(m['ensembles_ranking_block']['subset_sweep']['pca']) == 255        # Fig. 10 (appendix)
  # the file-order split (authors'): the last third of each dist file held out
  pc = m['context_models']['per_context']['indoor']
  assert (pc['n_train'], pc['n_held_out']) == (670, 335)
  for p in ('accuracy_per_context', 'cross_context', 'credibility_maps', 'ensembles', 'ensemble_size'):
    assert os.path.getsize(os.path.join(wd, 'plots', f'{p}.png')) > 1000
  assert json.load(open(os.path.join(wd, 'metrics.json')))['fingerprint'] == m['fingerprint']


def test_end_to_end_synthetic_and_kill_resume(tmp_path, monkeypatch):
  c = _config(annotations='synthetic', n_boot=50)
  c.ensemble.sweep = False
  m = main_lib.run(c, str(tmp_path / 'clean'))
  assert m['annotations']['synthetic'] and m['annotations']['files']['mulref_val.txt']['header']
  assert [r['description'].split(' ')[0] for r in m['table6']] == ['not', 'globally', 'best', 'majority', 'PCA',
                                                                  'MLP']
  assert m['cosine_baseline']['val']['accuracy'] > 0.6   # the synthetic labels follow a metric of the features
  assert np.asarray(m['context_models']['cross_context_held_out']['embedding']).shape == (9, 8)
  # killed right after the first chunk's checkpoint (step 20 of 40), then rerun: the same numbers as no kill
  wd = str(tmp_path / 'killed')

  def kill(phase, step, directory):
    if phase == 'after_save' and step == 20:
      raise KeyboardInterrupt('simulated kill')
  monkeypatch.setattr(runtime, 'FAULT_HOOK', kill)
  with pytest.raises(KeyboardInterrupt):
    main_lib.run(c, wd)
  assert not os.path.exists(os.path.join(wd, 'metrics.json'))
  monkeypatch.setattr(runtime, 'FAULT_HOOK', None)
  again = main_lib.run(c, wd)
  assert again['table6'] == m['table6'] and again['context_models'] == m['context_models']
  assert again['ensembles'] == m['ensembles']
  c.model.lr = 0.5                                       # a changed config is refused, naming the field
  with pytest.raises(UserError, match=r'config.model'):
    main_lib.run(c, wd)


def test_features_npz_missing_id_names_the_line(tmp_path):
  c = _config(annotations='synthetic')
  folder = cosis.write_synthetic_cosis(str(tmp_path / 'cosis'), 0, 32)
  sets = cosis.load_cosis_sets(folder)
  keys = list(dict.fromkeys(k for t in exp.all_triplets(sets) for k in t.keys()))
  dropped = sets['mulref_test'].b[4]            # first used on mulref_test.txt line 2 (row 2, triple 2)
  keep = [k for k in keys if k != dropped]
  np.savez(tmp_path / 'f.npz', features=np.ones((len(keep), 4), np.float32), names=np.asarray(keep))
  c.annotations, c.features = folder, str(tmp_path / 'f.npz')
  wd = tmp_path / 'wd'
  with pytest.raises(UserError, match=rf"mulref_test.txt:line \d+: image '{dropped}' has no row in the features"):
    main_lib.run(c, str(wd))
  assert not wd.exists()  # nothing written before the inputs are checked


def test_bad_config_fails_early(tmp_path):
  with pytest.raises(UserError, match='config.image_dir: set config.features or config.image_dir'):
    main_lib.run(_config(features='a.npz', image_dir='b'), str(tmp_path))
  with pytest.raises(UserError, match='config.annotations: /nonexistent: folder not found'):
    main_lib.run(_config(annotations='/nonexistent'), str(tmp_path))
  with pytest.raises(UserError, match='config.image_dir: .*nope: folder not found'):
    main_lib.run(_config(annotations=cosis.write_synthetic_cosis(str(tmp_path / 'c'), 0, 32),
                         image_dir=str(tmp_path / 'nope')), str(tmp_path / 'wd'))
  c = _config()
  c.model.split = 'shuffled'
  with pytest.raises(UserError, match=r"config.model.split: one of \('file_order', 'random'\)"):
    main_lib.run(c, str(tmp_path))
