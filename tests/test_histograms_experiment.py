"""End to end: configs/histograms.py through visim_jax.main.run on tiny data (features file, image folder, TFDS mock)."""
import csv
import json
import os

import numpy as np
import pytest

from visim_jax import main
from visim_jax.metrics import histograms as H
from visim_jax.core.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def local_config(**overrides):
  import importlib.util
  spec = importlib.util.spec_from_file_location('hist_config', os.path.join(ROOT, 'configs', 'histograms.py'))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  c = mod.get_config('local')
  c.update_from_flattened_dict(overrides)   # 'a.b' keys, as --config.a.b= sets them
  return c


def feature_file(path, c=9, n=10, d=16, seed=0, single=True):
  rng = np.random.default_rng(seed)
  lab = np.repeat(np.arange(c), n)
  x = rng.normal(size=(c, d))[lab] + rng.normal(size=(c * n, d))
  names = [f'leaf{i}' for i in range(c)] + ['lonely']
  if single:  # a class with a single sample: skipped and counted
    lab = np.concatenate([lab, [c]])
    x = np.concatenate([x, rng.normal(size=(1, d))])
  np.savez(path, features=x.astype(np.float32), labels=lab, class_names=np.array(names[:c + int(single)]))
  return path


def test_features_file_with_tree_end_to_end(tmp_path):
  feats = feature_file(str(tmp_path / 'f.npz'))
  tree = tmp_path / 'tree.txt'
  tree.write_text('top mid1 mid2 mid3\nmid1 leaf0 leaf1 leaf2\nmid2 leaf3 leaf4 leaf5 lonely\n'
                  'mid3 leaf6 leaf7 leaf8\nleaf8 leaf8a leaf8b\n')
  wd = str(tmp_path / 'wd')
  out = main.run(local_config(dataset='features', features=feats, class_tree=str(tree),
                              plot_classes='leaf0,leaf5'), wd)
  for f in ('config.json', 'metrics.json', 'classes.csv', 'histograms.npz', 'nodes.csv', 'levels.csv',
            'plots/class_histograms.png', 'plots/overlap_distribution.png', 'plots/levels.png'):
    assert os.path.exists(os.path.join(wd, f)), f
  m = json.load(open(os.path.join(wd, 'metrics.json')))
  assert m == json.loads(json.dumps(out))
  r = m['metrics']
  assert 0.0 <= r['overlap'] <= r['max_class_overlap'] <= 1.0 and 0.0 <= r['max_overlap'] <= 1.0
  assert r['astd_inter'] > r['class_mean_spread_inter'] > 0  # Eq. 4 and the renamed old quantity
  assert m['max_overlap_pair'][0].startswith('leaf') and m['pairwise_min_pairs'] == 100
  # one estimator, its noise
  assert m['estimator']['name'] == 'exhaustive' and m['estimator']['intra_pairs'] == 9 * 45
  assert m['estimator']['se_method'].startswith('bootstrap')
  # every reported metric has a standard error (none is left NaN in the console table)
  assert set(m['standard_errors']) == set(m['metrics']) == set(H.SCALARS) | {'knn_accuracy'}
  assert all(v is not None and 0 <= v < 0.2 for v in m['standard_errors'].values())
  # Sec. 4.1 rules: classes with < 10 samples omitted, nodes with > 2 children
  assert m['data']['evaluated_classes'] == 9 and m['data']['omitted_classes'] == 1
  assert m['data']['omitted_class_names'] == ['lonely']
  assert 0.0 <= r['knn_accuracy'] <= 1.0 and m['knn_k'] == 10
  assert [lv['level'] for lv in m['hierarchy']['levels']] == [0, 1]
  assert m['hierarchy']['nodes'] == 4  # leaf8 has 2 children: not a node
  nodes = list(csv.DictReader(open(os.path.join(wd, 'nodes.csv'))))
  assert [n['node'] for n in nodes] == ['top', 'mid1', 'mid2', 'mid3']
  assert nodes[2]['clusters'] == '3' and float(nodes[0]['astd_inter']) > 0 and nodes[0]['max_overlap']
  rows = list(csv.DictReader(open(os.path.join(wd, 'classes.csv'))))
  assert [r['class'] for r in rows] == [f'leaf{i}' for i in range(9)] + ['lonely']
  assert rows[-1]['evaluated'] == '0' and rows[-1]['overlap'] == ''
  ov = np.mean([float(r['overlap']) for r in rows[:9]])
  assert ov == pytest.approx(m['metrics']['overlap'], abs=1e-5)
  with np.load(os.path.join(wd, 'histograms.npz')) as z:
    assert z['hist_intra'].shape == (10, 100) and z['hist_intra'][:9].sum(1).tolist() == [45] * 9


def test_auto_uses_one_estimator_and_exhaustive_refuses_when_too_big(tmp_path):
  feats = feature_file(str(tmp_path / 'f.npz'), c=4)
  out = main.run(local_config(features=feats, plots=False,  # features alone select the source; no demo tree
                              **{'pairs.exhaustive_max': 100, 'pairs.n_intra': 300, 'pairs.n_inter': 200}),
                 str(tmp_path / 'wd'))
  e = out['estimator']
  assert e['name'] == 'random' and e['intra_pairs'] == 4 * 300 and e['inter_pairs'] == 4 * 200
  assert e['se_method'].startswith('independent') and out['standard_errors']['overlap'] > 0
  assert out['data']['dataset'] == 'features' and 'hierarchy' not in out and "class_tree='demo'" in out['notes'][0]
  half = main.run(local_config(features=feats, plots=False, class_tree='', sample_fraction=0.5, min_class_size=2),
                  str(tmp_path / 'half'))
  assert half['data']['samples'] == 20 and half['data']['samples_loaded'] == 41
  assert 'backbone' not in json.load(open(tmp_path / 'wd' / 'config.json'))  # not used by a features run
  wd = str(tmp_path / 'wd2')
  with pytest.raises(UserError, match=r'config.pairs.mode: the exact pass needs .*pairs.max_seconds'):
    main.run(local_config(dataset='features', features=feats, class_tree='',
                          **{'pairs.mode': 'exhaustive', 'pairs.max_seconds': 1e-9}), wd)
  assert not os.path.exists(wd)


def test_bad_inputs_fail_before_writing(tmp_path):
  p = str(tmp_path / 'bad.npz')
  x = np.ones((6, 3), np.float32)
  x[4, 0] = np.nan
  np.savez(p, features=x, labels=np.array([0, 0, 0, 1, 1, 1]))
  wd = str(tmp_path / 'wd')
  with pytest.raises(ValueError, match=r'bad.npz: 1 feature rows hold NaN.*\[4\]'):
    main.run(local_config(dataset='features', features=p, class_tree=''), wd)
  np.savez(p, features=np.ones((6, 3)), labels=np.array([0, 1, 2, 3, 4, 4]))
  with pytest.raises(UserError, match=r'only 0 class.*5 omitted.*config.min_class_size'):
    main.run(local_config(dataset='features', features=p, class_tree=''), wd)
  with pytest.raises(ValueError, match='config.class_tree'):
    main.run(local_config(dataset='features', features=p, class_tree=str(tmp_path / 'no_tree.txt')), wd)
  with pytest.raises(ValueError, match='config.plot_classes'):
    main.run(local_config(features=feature_file(str(tmp_path / 'f.npz')), class_tree='', plot_classes='nope'), wd)
  with pytest.raises(ValueError, match='config.pairs.mode'):
    main.run(local_config(dataset='features', features=p, class_tree='', **{'pairs.mode': 'all'}), wd)
  with pytest.raises(ValueError, match='config.source_stats'):
    main.run(local_config(dataset='features', features=p, class_tree='', normalization='source'), wd)
  assert not os.path.exists(wd)


def tiny_backbone(random_init=0, **unused):
  """A two-stage random 'network' on 16 px images: compiles in a blink (the pipeline, not Lite0, is tested)."""
  import jax
  import jax.numpy as jnp
  from visim_jax.backbones.base import Backbone
  from visim_jax.data.preprocess import Preprocess
  w = jax.random.normal(jax.random.PRNGKey(random_init), (3, 8))

  def apply_fn(variables, x):
    s1 = x
    s2 = jnp.tanh(x @ variables['w'])
    return s2.mean((1, 2)), {'s1': s1, 's2': s2}

  return Backbone('tiny_hist_test', apply_fn, {'w': w}, Preprocess(size=16), ('s1', 's2'), f'random:{random_init}')


def test_folder_and_tfds_sources_with_a_random_backbone(tmp_path):
  tfds = pytest.importorskip('tensorflow_datasets')
  from tests.test_classes import write_folder
  from visim_jax.backbones import registry
  registry.register('tiny_hist_test', 'tests.test_histograms_experiment:tiny_backbone', 'test only')
  root = write_folder(str(tmp_path / 'imgs'), sizes=(3, 3, 1))
  common = {'backbone': 'tiny_hist_test', 'cache_dir': str(tmp_path / 'cache'), 'class_tree': '',
            'image_batch_size': 4, 'plots': False, 'min_class_size': 2}
  out = main.run(local_config(dataset='folder', data_dir=root, **common), str(tmp_path / 'wd1'))
  assert out['data']['samples'] == 7 and out['data']['omitted_classes'] == 1
  assert out['data']['evaluated_classes'] == 2 and out['knn_k'] == 5
  assert os.listdir(tmp_path / 'cache')  # features were cached
  with tfds.testing.mock_data(num_examples=9):  # labels 0 1 1 1 1 0 0 1 1
    cfg = local_config(dataset='tfds', **{'tfds.name': 'cats_vs_dogs', 'tfds.split': 'train',
                                          'tfds.data_dir': str(tmp_path / 'tfds')}, **common)
    out = main.run(cfg, str(tmp_path / 'wd2'))
  assert out['data']['samples'] == 9 and out['data']['classes'] == 2 and out['data']['evaluated_classes'] == 2
  assert out['estimator']['intra_pairs'] == 3 + 15 and out['estimator']['inter_pairs'] == 2 * 3 * 6
  with tfds.testing.mock_data(num_examples=9):  # a second run reads features and labels from the cache
    assert main.run(cfg, str(tmp_path / 'wd3'))['metrics'] == out['metrics']


def test_identical_features_are_degenerate_not_numbers(tmp_path, capsys):
  # every row the same vector: every cosine is 1, one bin; the overlap of 1 says nothing about a representation
  p = str(tmp_path / 'same.npz')
  lab = np.repeat(np.arange(3), 12)
  np.savez(p, features=np.ones((len(lab), 8), np.float32), labels=lab, class_names=np.array(['a', 'b', 'c']))
  out = main.run(local_config(dataset='features', features=p, class_tree='', plots=False,
                              **{'knn.k': 0}), str(tmp_path / 'wd'))
  assert out['degenerate'] and 'bin' in out['degenerate']
  assert all(v is None for v in out['metrics'].values())
  assert 'degenerate: ' in capsys.readouterr().out
