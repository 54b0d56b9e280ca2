"""config.matmul_precision: applied around the run (jax.default_matmul_precision), recorded in metrics.json,
bad values refused naming the field."""
import json
import os

import jax
import pytest

from visim_jax import main
from visim_jax.core import precision
from visim_jax.training import runtime
from visim_jax.core.errors import UserError

from test_histograms_experiment import feature_file, local_config


def test_main_run_applies_it_around_the_experiment(tmp_path, monkeypatch):
  from visim_jax.experiments import histograms
  monkeypatch.setattr(histograms, 'run', lambda config, workdir: jax.config.jax_default_matmul_precision)
  feats = feature_file(str(tmp_path / 'f.npz'))
  c = local_config(dataset='features', features=feats, class_tree='', matmul_precision='highest')
  assert main.run(c, str(tmp_path / 'wd')) == 'highest'
  assert jax.config.jax_default_matmul_precision is None  # only around the run
  assert main.run(local_config(dataset='features', features=feats, class_tree=''), str(tmp_path / 'wd2')) is None


def test_recorded_in_metrics_json(tmp_path):
  wd = str(tmp_path / 'wd')
  rec = {'matmul_precision': 'highest'}
  with precision.context(rec['matmul_precision']), runtime.Run(wd, rec, runtime.fingerprint(rec), checkpoint=False) as rt:
    rt.write_metrics({'x': 1})
  assert json.load(open(os.path.join(wd, 'metrics.json')))['matmul_precision'] == 'highest'
  with precision.context('default'):
    assert precision.in_effect() == 'default'


def test_bad_value_names_the_field(tmp_path):
  feats = feature_file(str(tmp_path / 'f.npz'))
  with pytest.raises(UserError, match='config.matmul_precision'):
    main.run(local_config(dataset='features', features=feats, class_tree='', matmul_precision='fast'),
             str(tmp_path / 'wd'))
