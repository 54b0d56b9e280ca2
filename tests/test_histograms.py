"""Histogram metrics (paper 003, Eqs. 1-4): known answers, the NumPy per-class reference, bad input, sharding."""
import math
import os
import subprocess
import sys
import textwrap

import jax.numpy as jnp
import numpy as np
import pytest

from visim_jax.metrics import histograms as H


def clustered(c=6, n=9, d=12, noise=1.0, seed=0):
  rng = np.random.default_rng(seed)
  lab = np.repeat(np.arange(c), n)
  x = rng.normal(size=(c, d))[lab] + noise * rng.normal(size=(c * n, d))
  return x.astype(np.float32), lab


def numpy_reference(x, labels, num_classes, bins=100):
  """What a user would write: a Python loop over classes, every pair, np.histogram."""
  x = x / np.linalg.norm(x, axis=1, keepdims=True)
  h_in, h_out = np.zeros((num_classes, bins)), np.zeros((num_classes, bins))
  for c in range(num_classes):
    xc, xo = x[labels == c], x[(labels != c) & (labels >= 0)]
    s = xc @ xc.T
    h_in[c] = np.histogram(s[np.triu_indices(len(xc), 1)], bins, (-1, 1))[0]
    h_out[c] = np.histogram((xc @ xo.T).ravel(), bins, (-1, 1))[0]
  return h_in, h_out


def test_identical_distributions_overlap_one():
  rng = np.random.default_rng(0)
  h = rng.integers(0, 50, size=(4, 100))
  m = H.histogram_metrics(h, 3 * h, np.ones(4, bool))  # same probabilities, different pair counts
  np.testing.assert_allclose(m['overlap'], 1.0, atol=1e-6)
  np.testing.assert_allclose(m['max_overlap'], 1.0, atol=1e-6)
  # end to end: every sample the same vector -> every similarity 1 for both kinds
  x = jnp.ones((12, 5))
  out = H.evaluate(H.prepare(x, 'none'), np.repeat(np.arange(3), 4), 3, H.Options(knn_k=0))
  assert out['overlap'] == pytest.approx(1.0)


def test_disjoint_distributions_overlap_zero():
  c, n = 5, 6
  lab = np.repeat(np.arange(c), n)
  x = np.eye(8, dtype=np.float32)[lab] + 0.01 * np.random.default_rng(1).normal(size=(c * n, 8))
  out = H.evaluate(H.prepare(jnp.asarray(x), 'none'), lab, c, H.Options(knn_k=3, knn_queries=0))
  assert out['overlap'] == 0.0 and out['max_overlap'] == 0.0
  assert out['knn_accuracy'] == 1.0
  assert out['intra_mode'] == 'exhaustive' and out['intra_pairs'] == c * n * (n - 1) // 2
  assert out['inter_pairs'] == c * n * (c - 1) * n


def test_two_gaussians_match_analytic_overlap_coefficient():
  rng = np.random.default_rng(0)
  m1, m2, sd, n = 0.2, 0.5, 0.1, 400_000
  s = np.concatenate([rng.normal(m1, sd, n), rng.normal(m2, sd, n)]).astype(np.float32)
  cls = np.repeat([0, 1], n).astype(np.int32)
  h = np.asarray(H.similarity_histograms(jnp.asarray(s), jnp.asarray(cls), num_classes=2))
  ov = float(H.class_overlap(H.to_probabilities(h[0]), H.to_probabilities(h[1])))
  analytic = 2 * 0.5 * math.erfc(abs(m2 - m1) / (2 * sd) / math.sqrt(2))  # 2 Phi(-|d| / (2 sd))
  assert ov == pytest.approx(analytic, abs=0.01)


def test_astd_zero_when_classes_share_a_distribution_and_known_value():
  rng = np.random.default_rng(0)
  row = rng.integers(0, 100, size=100)
  same = np.tile(row, (7, 1))
  m = H.histogram_metrics(same, same[::-1] + 1, np.ones(7, bool))
  assert float(m['astd_inter']) == pytest.approx(0.0, abs=1e-6)
  assert float(m['astd_intra']) == pytest.approx(0.0, abs=1e-6)
  assert float(m['pooled_std_intra']) > 0.1  # the literal Eq. 4 reading is not zero here
  # two classes whose intra similarities sit at bin centres 0.11 and 0.31: class means differ by 0.2
  h = np.zeros((2, 100))
  h[0, 55], h[1, 65] = 10, 10
  m = H.histogram_metrics(h, h, np.ones(2, bool))
  assert float(m['astd_intra']) == pytest.approx(0.1, abs=1e-6)
  np.testing.assert_allclose(m['class_mean_intra'], [0.11, 0.31], atol=1e-6)
  # an invalid class does not count
  m = H.histogram_metrics(np.vstack([h, h[:1] * 0 + 1]), np.vstack([h, h[:1]]), np.array([1, 1, 0], bool))
  assert float(m['astd_intra']) == pytest.approx(0.1, abs=1e-6)


def test_vmapped_equals_per_class_numpy_loop():
  x, lab = clustered(c=7, n=8, d=10)
  lab[3] = 6  # uneven class sizes
  out = H.evaluate(H.prepare(jnp.asarray(x), 'none'), lab, 7, H.Options(knn_k=0))
  ref_in, ref_out = numpy_reference(x, lab, 7)
  assert np.abs(out['hist_intra'] - ref_in).sum() <= 2  # a similarity on a bin edge may round the other way
  assert np.abs(out['hist_inter'] - ref_out).sum() <= 2
  p_in = ref_in / ref_in.sum(1, keepdims=True)
  p_out = ref_out / ref_out.sum(1, keepdims=True)
  np.testing.assert_allclose(out['class_overlap'], np.minimum(p_in, p_out).sum(1), atol=2e-3)
  np.testing.assert_allclose(out['overlap'], np.minimum(p_in, p_out).sum(1).mean(), atol=1e-3)


def test_random_pairs_equal_numpy_on_the_same_pairs():
  import jax
  x, lab = clustered(c=5, n=7, d=6, seed=2)
  xp = H.prepare(jnp.asarray(x), 'target')
  index = H.group_by_class(lab, 5)
  key = jax.random.key(3)
  n, rs = 40, 16  # 3 rounds, the last one partly masked
  for kind in ('intra', 'inter'):
    got = np.asarray(H.random_pair_histograms(xp, index, key, n_pairs=n, kind=kind, round_size=rs))[:5]
    xs = np.asarray(xp)
    want = np.zeros((5, 100))
    for r in range(3):
      a, b = (np.asarray(v) for v in H.draw_pairs(key, index, rs, kind, r))
      for c in range(5):
        take = min(rs, n - r * rs)
        ia, ib = index.order[a[c, :take]], index.order[b[c, :take]]
        assert np.all(lab[ia] == c)
        assert np.all(ia != ib) if kind == 'intra' else np.all(lab[ib] != c)
        if kind == 'intra':
          assert np.all(lab[ib] == c)
        want[c] += np.histogram((xs[ia] * xs[ib]).sum(1), 100, (-1, 1))[0]
    assert np.abs(got - want).sum() <= 2
    assert got.sum() == 5 * n


def test_random_mode_agrees_with_exhaustive():
  x, lab = clustered(c=4, n=20, d=8, noise=0.8)
  xp = H.prepare(jnp.asarray(x))
  ex = H.evaluate(xp, lab, 4, H.Options(mode='exhaustive', knn_k=0))
  rnd = H.evaluate(xp, lab, 4, H.Options(mode='random', n_intra=20_000, n_inter=20_000, knn_k=0))
  assert rnd['intra_mode'] == 'random' and ex['inter_mode'] == 'exhaustive'
  assert float(rnd['overlap']) == pytest.approx(float(ex['overlap']), abs=0.03)
  assert float(rnd['astd_intra']) == pytest.approx(float(ex['astd_intra']), abs=0.01)


def test_knn_matches_brute_force():
  x, lab = clustered(c=5, n=10, d=6, noise=1.5, seed=4)
  xp = H.prepare(jnp.asarray(x), 'none')
  acc, per = H.knn_accuracy(xp, lab, 5, k=5, db_chunk=16, query_chunk=8)  # several chunks of both kinds
  xs = np.asarray(xp)
  s = xs @ xs.T
  np.fill_diagonal(s, -np.inf)
  nn = np.argsort(-s, axis=1, kind='stable')[:, :5]
  votes = np.stack([np.bincount(lab[r], minlength=5) for r in nn])
  ties = np.stack([np.bincount(lab[r], weights=s[i, r], minlength=5) for i, r in enumerate(nn)])
  pred = np.argmax(votes + (ties + 5) / 11, 1)
  assert acc == pytest.approx((pred == lab).mean())
  assert np.nanmean(per) == pytest.approx((pred == lab).mean())


def test_standardize_modes():
  x = np.random.default_rng(0).normal(3, 2, size=(50, 4)).astype(np.float32)
  t = np.asarray(H.standardize(jnp.asarray(x), 'target'))
  np.testing.assert_allclose(t.mean(0), 0, atol=1e-5)
  np.testing.assert_allclose(t.std(0), 1, atol=1e-4)
  s = np.asarray(H.standardize(jnp.asarray(x), 'source', np.full(4, 3.0), np.full(4, 2.0)))
  np.testing.assert_allclose(s, (x - 3) / 2, atol=1e-6)
  with pytest.raises(ValueError, match='source mean and std'):
    H.standardize(jnp.asarray(x), 'source')
  with pytest.raises(ValueError, match='do not match'):
    H.standardize(jnp.asarray(x), 'source', np.zeros(3), np.ones(3))


def test_bad_input_messages():
  x, lab = clustered(c=3, n=4, d=5)
  with pytest.raises(ValueError, match='12 feature rows but 11 labels'):
    H.check_inputs(x, lab[:-1], 'feats.npz')
  bad = x.copy()
  bad[5, 2] = np.nan
  with pytest.raises(ValueError, match=r'feats.npz: 1 feature rows hold NaN.*\[5\]'):
    H.check_inputs(bad, lab, 'feats.npz')
  with pytest.raises(ValueError, match='integers'):
    H.check_inputs(x, lab.astype(float), 'feats.npz')
  # a class with one sample is skipped and counted; fewer than 2 classes left is an error
  lab2 = np.array([0, 0, 0, 1, 1, 1, 2, 3, 3, 3, 3, 3])
  out = H.evaluate(H.prepare(jnp.asarray(x)), lab2, 4, H.Options(knn_k=0))
  assert out['skipped_classes'] == 1 and list(out['valid']) == [True, True, False, True]
  with pytest.raises(ValueError, match='only 1 class'):
    H.evaluate(H.prepare(jnp.asarray(x)), np.array([0] * 11 + [1]), 2, H.Options(knn_k=0))


def test_hierarchy_clusters_and_levels():
  tree = {'root': ['animal', 'thing'], 'animal': ['dog', 'cat'], 'dog': ['pug', 'husky'], 'thing': ['car', 'cup']}
  names = ['pug', 'husky', 'cat', 'car', 'cup', 'dog']
  lab = np.array([0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5])
  assert H.levels(tree) == {'root': 0, 'animal': 1, 'thing': 1, 'dog': 2, 'cat': 2, 'pug': 3, 'husky': 3,
                            'car': 2, 'cup': 2}
  got = {node: (lvl, kids, cl.tolist()) for node, lvl, kids, cl in H.node_clusters(tree, names, lab)}
  assert got['root'][2] == [0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0]
  assert got['animal'][2] == [0, 0, 0, 0, 1, 1, -1, -1, -1, -1, 0, 0]
  assert got['dog'][2] == [0, 0, 1, 1] + [-1] * 8  # samples labelled 'dog' itself are left out of node dog
  # a DAG: 'cat' under two children of root -> its samples are left out of root
  tree2 = dict(tree, thing=['car', 'cup', 'cat'])
  got2 = {node: cl.tolist() for node, _, _, cl in H.node_clusters(tree2, names, lab)}
  assert got2['root'][4:6] == [-1, -1]
  with pytest.raises(ValueError, match='cycle'):
    H.descendants({'a': ['b'], 'b': ['a']})


def test_sharded_over_8_devices_equals_one_device(tmp_path):
  code = textwrap.dedent('''
    import json, sys
    import numpy as np, jax, jax.numpy as jnp
    from jax.sharding import Mesh
    from visim_jax.metrics import histograms as H
    assert len(jax.devices()) == 8, jax.devices()
    rng = np.random.default_rng(0)
    lab = np.repeat(np.arange(6), 10)
    x = H.prepare(jnp.asarray(rng.normal(size=(6, 8))[lab] + rng.normal(size=(60, 8))))
    index = H.group_by_class(lab, 6)
    key = jax.random.key(0)
    one = H.random_pair_histograms(x, index, key, n_pairs=50, kind='inter', round_size=16)
    mesh = Mesh(np.array(jax.devices()), ('data',))
    xs = H.shard_samples(x, mesh)
    assert len(xs.sharding.device_set) == 8
    many = H.random_pair_histograms(xs, index, key, n_pairs=50, kind='inter', round_size=16)
    ex1 = H.exhaustive_histograms(x, index, 'intra', 6)
    ex8 = H.exhaustive_histograms(xs, index, 'intra', 6)
    print(json.dumps({'random': bool((np.asarray(one) == np.asarray(many)).all()),
                      'exhaustive': bool((np.asarray(ex1) == np.asarray(ex8)).all()),
                      'total': int(np.asarray(many).sum())}))
  ''')
  env = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=8', JAX_PLATFORMS='cpu')
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  r = subprocess.run([sys.executable, '-c', code], env=env, cwd=root, capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-3000:]
  import json
  res = json.loads(r.stdout.strip().splitlines()[-1])
  assert res == {'random': True, 'exhaustive': True, 'total': 300}
