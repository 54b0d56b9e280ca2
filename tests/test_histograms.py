"""Histogram metrics (paper 003): the paper's equations as plain NumPy loops, both estimators, kNN, class trees."""
import json
import math
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from visim_jax.core.errors import UserError
from visim_jax.metrics import blocked_histograms as B
from visim_jax.metrics import histograms as H
from visim_jax.metrics import knn
from visim_jax.metrics import pair_sampling as S
from visim_jax.metrics import tree as T

EXACT = H.Options(mode='exhaustive', min_class_size=2, se_replicates=0)


def clustered(c=6, n=9, d=12, noise=1.0, seed=0):
  rng = np.random.default_rng(seed)
  lab = np.repeat(np.arange(c), n)
  x = rng.normal(size=(c, d))[lab] + noise * rng.normal(size=(c * n, d))
  return x.astype(np.float32), lab


def paper_reference(x, labels, num_classes, bins=100):
  """Paper 003 written out with loops: target standardisation (Sec. 9.1), cosine, every pair (Eq. 1), 100 bins on
  [-1, 1] (Sec. 3.1), Eq. 3, Eq. 4 as printed, maximal overlap over pairs of classes (Sec. 9.2)."""
  x = np.asarray(x, np.float64)
  z = (x - x.mean(0)) / x.std(0)
  z = z / np.linalg.norm(z, axis=1, keepdims=True)
  n = len(z)
  edges = np.linspace(-1, 1, bins + 1)
  centre = [(edges[b] + edges[b + 1]) / 2 for b in range(bins)]  # MEAN(b)

  def hist(values):
    h = np.histogram(values, edges)[0].astype(float)
    return h / h.sum()

  intra, inter, between = {}, {}, {}
  for y in range(num_classes):
    s_in, s_out = [], []
    for i in range(n):
      for j in range(n):
        if labels[i] == y and labels[j] == y and i < j:
          s_in.append(z[i] @ z[j])
        if labels[i] == y and labels[j] != y:
          s_out.append(z[i] @ z[j])
    intra[y], inter[y] = hist(s_in), hist(s_out)
    for y2 in range(num_classes):
      if y2 != y:
        between[y, y2] = hist([z[i] @ z[j] for i in range(n) for j in range(n) if labels[i] == y and labels[j] == y2])
  N = num_classes
  overlap = sum(sum(min(intra[y][b], inter[y][b]) for b in range(bins)) for y in range(N)) / N

  def eq4(p_given_y):
    p = [sum(p_given_y[y][b] for y in range(N)) / N for b in range(bins)]  # p(s) = 1/N sum_y p(s|y)
    mu = sum(p[b] * centre[b] for b in range(bins))
    return math.sqrt(sum(p[b] * (centre[b] - mu) ** 2 for b in range(bins)))

  max_pair = max(sum(min(intra[y][b], between[y, y2][b]) for b in range(bins)) for (y, y2) in between)
  max_class = max(sum(min(intra[y][b], inter[y][b]) for b in range(bins)) for y in range(N))
  return {'overlap': overlap, 'astd_inter': eq4(inter), 'astd_intra': eq4(intra), 'max_overlap': max_pair,
          'max_class_overlap': max_class}


def pair_list_histograms(x, labels, num_classes, weights=None, bins=100):
  """The pre-issue-12 exact path: host lists of every index pair, then gathers, dots and np.histogram (float32)."""
  weights = np.ones(len(labels)) if weights is None else weights
  h_in, h_out = np.zeros((num_classes, bins)), np.zeros((num_classes, bins))
  for c in range(num_classes):
    m, o = np.flatnonzero(labels == c), np.flatnonzero((labels != c) & (labels >= 0))
    i, j = np.triu_indices(len(m), 1)
    a, b = m[i], m[j]
    h_in[c] = np.histogram((x[a] * x[b]).sum(1), bins, (-1, 1), weights=weights[a] * weights[b])[0]
    a, b = np.repeat(m, len(o)), np.tile(o, len(m))
    h_out[c] = np.histogram((x[a] * x[b]).sum(1), bins, (-1, 1), weights=weights[a] * weights[b])[0]
  return h_in, h_out


def test_exhaustive_equals_the_papers_equations_written_as_loops():
  x, lab = clustered(c=4, n=7, d=6, noise=1.2, seed=5)
  lab[2] = 3  # uneven classes
  m = H.evaluate(H.prepare(jnp.asarray(x), 'target'), lab, 4, EXACT)
  ref = paper_reference(x, lab, 4)
  for k, v in ref.items():
    assert float(m[k]) == pytest.approx(v, abs=2e-3), k  # a similarity on a bin edge may round the other way
  assert m['estimator'] == 'exhaustive' and m['pairwise']
  # Eq. 4 is not the spread of the class means (the old headline), which is much smaller here
  assert float(m['class_mean_spread_inter']) < 0.5 * float(m['astd_inter'])


def test_identical_and_disjoint_distributions():
  rng = np.random.default_rng(0)
  h = rng.integers(0, 50, size=(4, 100))
  m = H.histogram_metrics(h, 3 * h, np.ones(4, bool), np.broadcast_to(h[:, None], (4, 4, 100)))
  assert float(m['overlap']) == pytest.approx(1.0, abs=1e-6) and float(m['max_overlap']) == pytest.approx(1.0, abs=1e-6)
  assert float(m['max_class_overlap']) == pytest.approx(1.0, abs=1e-6)
  c, n = 5, 6
  lab = np.repeat(np.arange(c), n)
  x = np.eye(8, dtype=np.float32)[lab] + 0.01 * np.random.default_rng(1).normal(size=(c * n, 8))
  out = H.evaluate(H.prepare(jnp.asarray(x), 'none'), lab, c, EXACT)
  assert out['overlap'] == 0.0 and out['max_overlap'] == 0.0 and out['max_class_overlap'] == 0.0
  assert out['intra_pairs'] == c * n * (n - 1) // 2 and out['inter_pairs'] == c * n * (c - 1) * n


def test_two_gaussians_match_analytic_overlap_coefficient():
  rng = np.random.default_rng(0)
  m1, m2, sd, n = 0.2, 0.5, 0.1, 400_000
  h1 = np.histogram(rng.normal(m1, sd, n), 100, (-1, 1))[0]
  h2 = np.histogram(rng.normal(m2, sd, n), 100, (-1, 1))[0]
  ov = float(H.class_overlap(H.to_probabilities(h1), H.to_probabilities(h2)))
  assert ov == pytest.approx(2 * 0.5 * math.erfc(abs(m2 - m1) / (2 * sd) / math.sqrt(2)), abs=0.01)


def test_astd_eq4_and_class_mean_spread_known_values():
  h = np.zeros((2, 100))
  h[0, 55], h[1, 65] = 10, 10  # intra similarities at bin centres 0.11 and 0.31
  m = H.histogram_metrics(h, h, np.ones(2, bool))
  assert float(m['astd_intra']) == pytest.approx(0.1, abs=1e-6)  # p(s): half at 0.11, half at 0.31
  assert float(m['class_mean_spread_intra']) == pytest.approx(0.1, abs=1e-6)
  h[0, 45] = h[1, 75] = 10  # p(s) = 1/4 at each of -0.09, 0.11, 0.31, 0.51: mu 0.21; class means 0.01, 0.41
  m = H.histogram_metrics(h, h, np.ones(2, bool))
  assert float(m['astd_intra']) == pytest.approx(math.sqrt((0.3 ** 2 + 0.1 ** 2) / 2), abs=1e-5)
  assert float(m['class_mean_spread_intra']) == pytest.approx(0.2, abs=1e-5)
  same = np.tile(np.random.default_rng(0).integers(0, 100, size=100), (7, 1))
  m = H.histogram_metrics(same, same, np.ones(7, bool))
  assert float(m['class_mean_spread_inter']) == pytest.approx(0.0, abs=1e-6) and float(m['astd_inter']) > 0.1
  m = H.histogram_metrics(np.vstack([h, h[:1] + 1]), np.vstack([h, h[:1]]), np.array([1, 1, 0], bool))
  assert float(m['class_mean_spread_intra']) == pytest.approx(0.2, abs=1e-5)  # an invalid class does not count


@pytest.mark.parametrize('tile', [8, 24, 256])
def test_blocked_exact_equals_the_pair_list_path(tile):
  x, lab = clustered(c=5, n=11, d=7, seed=3)
  lab[[4, 20]] = -1  # left out
  lab[30:33] = 4     # uneven
  xp = np.asarray(H.prepare(jnp.asarray(x), 'target'))
  rng = np.random.default_rng(0)
  w = np.stack([np.ones(len(lab), np.int32), rng.integers(0, 4, len(lab)).astype(np.int32)])
  h_in, h_out, pair = B.exact_histograms(jnp.asarray(xp), lab, 5, tile=tile, weights=w, pairwise=True)
  for r in range(2):
    ref_in, ref_out = pair_list_histograms(xp, lab, 5, w[r])
    assert np.abs(h_in[r] - ref_in).sum() <= 2 and np.abs(h_out[r] - ref_out).sum() <= 2
    assert h_in[r].sum() == ref_in.sum() and h_out[r].sum() == ref_out.sum()
  # pairwise counts: pair[y, y'] holds every pair between y and y'; summed over y' they are the inter counts
  np.testing.assert_array_equal(pair[0].sum(1), h_out[0])
  np.testing.assert_array_equal(pair[0], pair[0].transpose(1, 0, 2))


def test_exhaustive_refuses_with_an_estimate_and_auto_picks_one_estimator():
  opts = H.Options(mode='exhaustive', max_seconds=1e-9)
  with pytest.raises(UserError, match=r'config.pairs.mode: the exact pass needs .* pairs .* GiB .*pairs.mode=random'):
    H.choose_estimator(10_000, 64, 10, opts)
  assert H.choose_estimator(1_000, 64, 10, H.Options(mode='auto')) == 'exhaustive'
  assert H.choose_estimator(1_000, 64, 10, H.Options(mode='auto', exhaustive_max=1000)) == 'random'
  plan = B.make_plan(1_000_000, 768, 1000, devices=8)
  assert plan.pairs == 1_000_000 * 999_999 // 2 and plan.bytes_per_device > 1_000_000 * 768 * 4


def test_estimator_and_standard_errors_are_reported():
  x, lab = clustered(c=4, n=12, d=8, noise=0.8)
  xp = H.prepare(jnp.asarray(x))
  ex = H.evaluate(xp, lab, 4, H.Options(mode='auto', se_replicates=4))
  rnd = H.evaluate(xp, lab, 4, H.Options(mode='random', n_intra=3000, n_inter=3000, se_replicates=4))
  assert ex['estimator'] == 'exhaustive' and rnd['estimator'] == 'random'
  assert ex['se_method'].startswith('bootstrap') and rnd['se_method'].startswith('independent')
  for m in (ex, rnd):
    assert set(m['se']) == set(H.SE_KEYS) and all(v is not None and 0 < v < 0.2 for v in m['se'].values())
  for k in ('overlap', 'astd_inter', 'astd_intra', 'max_overlap'):  # random agrees with exact within a few SEs
    assert abs(float(rnd[k]) - float(ex[k])) < 4 * rnd['se'][k] + 0.01, k
  assert rnd['max_overlap_pair'] == ex['max_overlap_pair'] and rnd['pairwise_min_pairs'] > 1000
  assert H.evaluate(xp, lab, 4, H.Options(se_replicates=0))['se']['overlap'] is None
  flat = H.evaluate(xp, lab, 4, H.Options(pairwise_max_classes=3, se_replicates=2))  # no (C, C, B) counts
  assert np.isnan(flat['max_overlap']) and flat['se']['max_overlap'] is None and not flat['pairwise']
  assert float(flat['overlap']) == pytest.approx(float(ex['overlap']), abs=1e-6)


def test_min_class_size_omits_small_classes():
  x, lab = clustered(c=4, n=12, d=8)
  lab = lab.copy()
  lab[lab == 3] = np.where(np.arange(12) < 9, 3, 2)  # class 3: 9 samples, class 2: 15
  out = H.evaluate(H.prepare(jnp.asarray(x)), lab, 4, H.Options(se_replicates=0))  # default 10 (Sec. 4.1)
  assert out['omitted_classes'] == 1 and out['valid'].tolist() == [True, True, True, False]
  assert out['class_counts'].tolist() == [12, 12, 15, 9]
  out = H.evaluate(H.prepare(jnp.asarray(x)), lab, 4, H.Options(min_class_size=9, se_replicates=0))
  assert out['omitted_classes'] == 0
  with pytest.raises(H.TooFewClasses, match='only 1 class'):
    H.evaluate(H.prepare(jnp.asarray(x)), np.minimum(lab, 1) * (np.arange(48) < 12), 2, H.Options())


def test_random_pairs_equal_numpy_on_the_same_pairs():
  x, lab = clustered(c=5, n=7, d=6, seed=2)
  xp = H.prepare(jnp.asarray(x), 'target')
  index = S.group_by_class(lab, 5)
  key = jax.random.key(3)
  n, rs = 40, 16  # 3 rounds, the last one partly masked
  xs = np.asarray(xp)
  for kind in ('intra', 'inter'):
    got = S.random_pair_histograms(xp, index, key, n_pairs=n, kind=kind, round_size=rs, pairwise=kind == 'inter')
    got, pair = (got if kind == 'inter' else (got, None))
    want, want_pair = np.zeros((5, 100)), np.zeros((5, 5, 100))
    for r in range(3):
      a, b = (np.asarray(v) for v in S.draw_pairs(key, index, rs, kind, r))
      for c in range(5):
        take = min(rs, n - r * rs)
        ia, ib = index.order[a[c, :take]], index.order[b[c, :take]]
        assert np.all(lab[ia] == c) and (np.all(lab[ib] == c) & np.all(ia != ib) if kind == 'intra'
                                         else np.all(lab[ib] != c))
        s = (xs[ia] * xs[ib]).sum(1)
        want[c] += np.histogram(s, 100, (-1, 1))[0]
        for c2 in range(5):
          want_pair[c, c2] += np.histogram(s[lab[ib] == c2], 100, (-1, 1))[0]
    assert np.abs(np.asarray(got)[:5] - want).sum() <= 2 and np.asarray(got).sum() == 5 * n
    if pair is not None:
      assert np.abs(np.asarray(pair)[:5, :5] - want_pair).sum() <= 2


def test_knn_matches_brute_force():
  x, lab = clustered(c=5, n=10, d=6, noise=1.5, seed=4)
  xp = H.prepare(jnp.asarray(x), 'none')
  acc, per = knn.knn_accuracy(xp, lab, 5, k=5, db_chunk=16, query_chunk=8)  # several chunks of both kinds
  xs = np.asarray(xp)
  s = xs @ xs.T
  np.fill_diagonal(s, -np.inf)
  nn = np.argsort(-s, axis=1, kind='stable')[:, :5]
  votes = np.stack([np.bincount(lab[r], minlength=5) for r in nn])
  ties = np.stack([np.bincount(lab[r], weights=s[i, r], minlength=5) for i, r in enumerate(nn)])
  pred = np.argmax(votes + (ties + 5) / 11, 1)
  assert acc == pytest.approx((pred == lab).mean()) and np.nanmean(per) == pytest.approx((pred == lab).mean())


def test_standardize_modes_and_bad_input():
  x = np.random.default_rng(0).normal(3, 2, size=(50, 4)).astype(np.float32)
  t = np.asarray(H.standardize(jnp.asarray(x), 'target'))
  np.testing.assert_allclose(t.mean(0), 0, atol=1e-5)
  np.testing.assert_allclose(t.std(0), 1, atol=1e-4)
  np.testing.assert_allclose(np.asarray(H.standardize(jnp.asarray(x), 'source', np.full(4, 3.), np.full(4, 2.))),
                             (x - 3) / 2, atol=1e-6)
  with pytest.raises(ValueError, match='do not match'):
    H.standardize(jnp.asarray(x), 'source', np.zeros(3), np.ones(3))
  x, lab = clustered(c=3, n=4, d=5)
  with pytest.raises(UserError, match='feats.npz: 12 feature rows but 11 labels'):
    H.check_inputs(x, lab[:-1], 'feats.npz')
  x[5, 2] = np.nan
  with pytest.raises(UserError, match=r'feats.npz: 1 feature rows hold NaN.*\[5\]'):
    H.check_inputs(x, lab, 'feats.npz')
  with pytest.raises(UserError, match='config.se_replicates'):
    H.Options(se_replicates=1).validate()


def test_tree_nodes_need_more_than_two_children():
  tree = {'root': ['animal', 'thing'], 'animal': ['dog', 'cat', 'bird'], 'dog': ['pug', 'husky'],
          'thing': ['car', 'cup', 'pen']}
  names = ['pug', 'husky', 'cat', 'car', 'cup', 'dog', 'bird', 'pen']
  lab = np.array([0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7])
  assert T.levels(tree)['pug'] == 3 and T.levels(tree)['root'] == 0
  got = {node: cl.tolist() for node, _, _, cl in T.node_clusters(tree, names, lab)}
  assert sorted(got) == ['animal', 'thing']  # Sec. 4.1: > 2 children; root and dog have 2
  assert got['animal'] == [0, 0, 0, 0, 1, 1, -1, -1, -1, -1, 0, 0, 2, 2, -1, -1]  # 'dog' samples join child dog
  got2 = {node for node, _, _, _ in T.node_clusters(tree, names, lab, min_children=2)}
  assert got2 == {'root', 'animal', 'thing', 'dog'}
  no_bird = np.where(lab == 6, -1, lab)  # a child without samples does not count
  assert 'animal' not in {node for node, _, _, _ in T.node_clusters(tree, names, no_bird)}
  with pytest.raises(ValueError, match='cycle'):
    T.descendants({'a': ['b'], 'b': ['a']})
  rows = [{'level': 1, 'o': 0.2}, {'level': 0, 'o': 0.5}, {'level': 1, 'o': 0.4}, {'level': 1, 'o': None}]
  levels, overall = T.level_means(rows, ['o'])
  assert levels == [{'level': 0, 'nodes': 1, 'o': 0.5}, {'level': 1, 'nodes': 3, 'o': pytest.approx(0.3)}]
  assert overall == {'o': pytest.approx(1.1 / 3)}


def test_8_devices_equal_one_device():
  code = textwrap.dedent('''
    import json
    import numpy as np, jax, jax.numpy as jnp
    from jax.sharding import Mesh
    from visim_jax.metrics import blocked_histograms as B, histograms as H, pair_sampling as S
    assert len(jax.devices()) == 8, jax.devices()
    rng = np.random.default_rng(0)
    lab = np.repeat(np.arange(6), 30)
    lab[::17] = -1
    x = H.prepare(jnp.asarray(rng.normal(size=(6, 8))[np.maximum(lab, 0)] + rng.normal(size=(180, 8))))
    w = np.stack([np.ones(180, np.int32), rng.integers(0, 3, 180).astype(np.int32)])
    one = B.exact_histograms(x, lab, 6, tile=16, weights=w, pairwise=True, devices=jax.devices()[:1])
    many = B.exact_histograms(x, lab, 6, tile=16, weights=w, pairwise=True)
    xs = H.shard_samples(x, Mesh(np.array(jax.devices()), ('data',)))
    index, key = S.group_by_class(lab, 6), jax.random.key(0)
    r1 = S.random_pair_histograms(x, index, key, n_pairs=50, kind='inter', round_size=16)
    r8 = S.random_pair_histograms(xs, index, key, n_pairs=50, kind='inter', round_size=16)
    ev = {}
    for mode in ('exhaustive', 'random'):  # end to end on sharded features == unsharded
      o = H.Options(mode=mode, min_class_size=2, se_replicates=2, n_intra=64, n_inter=64)
      a, b = H.evaluate(x, lab, 6, o), H.evaluate(xs, lab, 6, o)
      ev[mode] = all(np.array_equal(a[k], b[k]) for k in ('hist_intra', 'hist_inter', 'overlap', 'max_overlap',
                                                           'astd_inter')) and a['se'] == b['se']
    print(json.dumps({'exact': all(bool((a == b).all()) for a, b in zip(one, many)),
                      'random': bool((np.asarray(r1) == np.asarray(r8)).all()), 'sharded': len(xs.sharding.device_set),
                      'pairs': int(one[0][0].sum() + one[1][0].sum() // 2), 'evaluate': ev}))
  ''')
  env = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=8', JAX_PLATFORMS='cpu')
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  r = subprocess.run([sys.executable, '-c', code], env=env, cwd=root, capture_output=True, text=True)
  assert r.returncode == 0, r.stderr[-3000:]
  n = 180 - len(range(0, 180, 17))
  assert json.loads(r.stdout.strip().splitlines()[-1]) == {'exact': True, 'random': True, 'sharded': 8,
                                                           'pairs': n * (n - 1) // 2,
                                                           'evaluate': {'exhaustive': True, 'random': True}}
