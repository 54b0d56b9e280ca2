"""visim_jax/metrics/leaderboard.py + metrics/paired.py: columns, paired tests (each against a plain NumPy loop),
rank groups, bold only a significant best, the likelihood view of 2AFC, published numbers beside ours."""
import csv
import math

import numpy as np
import pytest

from visim_jax.metrics import leaderboard, paired


def cell(s, n=10, items=None):
  c = {'score': s, 'ci_low': s - 0.1, 'ci_high': min(1.0, s + 0.1), 'n': n}
  if items is not None:
    c['items'] = items
  return c


def mean_items(values):
  return {'kind': 'mean', 'values': list(map(float, values))}


# ------------------------------------------------------------------------------- paired tests vs loops

def loop_bootstrap(va, vb, n_boot, seed, alpha=0.05):
  rng = np.random.default_rng(seed)
  idx = rng.integers(0, len(va), (n_boot, len(va)))
  diffs = []
  for b in range(n_boot):
    sa = sum(va[i] for i in idx[b]) / len(va)
    sb = sum(vb[i] for i in idx[b]) / len(vb)
    diffs.append(sa - sb)
  diffs = np.array(diffs)
  lo, hi = np.quantile(diffs, [alpha / 2, 1 - alpha / 2])
  p = min(1.0, 2 * min(np.mean(diffs <= 0), np.mean(diffs >= 0)))
  return np.mean(va) - np.mean(vb), lo, hi, p


def test_paired_bootstrap_equals_loop():
  rng = np.random.default_rng(3)
  va = (rng.random(40) < 0.8).astype(float)
  vb = (rng.random(40) < 0.6).astype(float)
  got = paired.paired_bootstrap(paired._mean, (va.astype(np.float32),), (vb.astype(np.float32),), 200, 0.05, 7)
  diff, lo, hi, p = loop_bootstrap(list(va), list(vb), 200, 7)
  np.testing.assert_allclose([got['diff'], got['ci_low'], got['ci_high'], got['p']], [diff, lo, hi, p], atol=1e-6)


def test_cluster_bootstrap_equals_loop():
  rng = np.random.default_rng(4)
  va, vb = rng.random(12), rng.random(12)
  clusters = np.repeat([5, 9, 2], 4)
  got = paired.paired_bootstrap(paired._mean, (va,), (vb,), 100, 0.05, 1, clusters=clusters)
  r = np.random.default_rng(1)
  keys = np.unique(clusters)
  diffs = []
  for _ in range(100):
    draw = r.integers(0, len(keys), len(keys))
    items = [i for k in draw for i in range(12) if clusters[i] == keys[k]]
    diffs.append(np.mean([va[i] - vb[i] for i in items]))
  np.testing.assert_allclose([got['ci_low'], got['ci_high']], np.quantile(diffs, [0.025, 0.975]), atol=1e-9)


def test_sign_test_equals_exact_binomial_loop():
  va = np.array([1, 1, 1, 0, 1, 1, 0.5, 1, 1, 1, 1, 0])
  vb = np.array([0, 0, 1, 0, 0, 0, 0.5, 0, 0, 0, 1, 1])
  got = paired.sign_test(va, vb)
  n_pos = sum(a > b for a, b in zip(va, vb))
  n_neg = sum(a < b for a, b in zip(va, vb))
  n = n_pos + n_neg
  tail = sum(math.comb(n, k) for k in range(min(n_pos, n_neg) + 1)) / 2 ** n
  assert (got['n_better'], got['n_worse']) == (n_pos, n_neg) == (7, 1)
  assert got['p'] == pytest.approx(min(1.0, 2 * tail), abs=1e-12)
  assert paired.sign_test(va, va)['p'] == 1.0


def test_rank_groups_and_significant_best():
  better = np.zeros((4, 4), bool)
  better[0, 2] = better[0, 3] = better[1, 3] = True      # 0 beats 2, 3; 1 beats 3; 0 vs 1 not separable
  np.testing.assert_array_equal(paired.rank_groups(better), [1, 1, 2, 3])
  assert not paired.significant_best(better, 0)
  better[0, 1] = True
  assert paired.significant_best(better, 0)
  assert not paired.significant_best(np.zeros((1, 1), bool), 0)   # a lone model is not "significantly best"


def test_twoafc_loglik_equals_loop():
  rng = np.random.default_rng(0)
  d0, d1 = rng.random(30), rng.random(30)
  j = np.clip(np.round((d0 > d1) * 0.8 + rng.random(30) * 0.2, 1), 0, 1)
  got = paired.twoafc_loglik(d0, d1, j, bandwidth=0.2)
  pooled = np.concatenate([d0, d1])
  cdf = lambda v: (np.sum(pooled < v) + np.sum(pooled <= v)) / (2 * len(pooled))
  u0, u1 = [cdf(v) for v in d0], [cdf(v) for v in d1]
  want = []
  for i in range(30):
    num = den = 0.0
    for k in range(30):
      if k == i:
        continue
      a = math.exp(-((u0[i] - u0[k]) ** 2 + (u1[i] - u1[k]) ** 2) / (2 * 0.2 ** 2))
      b = math.exp(-((u0[i] - u1[k]) ** 2 + (u1[i] - u0[k]) ** 2) / (2 * 0.2 ** 2))
      num += a * j[k] + b * (1 - j[k])
      den += a + b
    p = min(max(num / den, 1e-4), 1 - 1e-4)
    want.append(j[i] * math.log(p) + (1 - j[i]) * math.log(1 - p))
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------------------ the board

def test_best_ranks_and_published(tmp_path):
  results = {'cosine:dreamsim_ensemble': {'nights': {'test': cell(0.95)}, 'bapps_2afc': {'cnn': cell(0.8)}},
             'lpips:alex': {'nights': {'test': cell(0.7)}, 'bapps_2afc': {'cnn': cell(0.8), 'color': cell(0.6)}}}
  models = list(results)
  b = leaderboard.build(results, models, ['nights', 'bapps_2afc'], leaderboard.RankOptions(test='none'))
  assert b.columns == [('nights', 'test'), ('bapps_2afc', 'cnn'), ('bapps_2afc', 'color')]
  np.testing.assert_array_equal(b.ranks, [[1, 1, np.nan], [2, 1, 1]])       # a tie: both rank 1
  md = leaderboard.write(str(tmp_path), b)
  full = open(tmp_path / 'leaderboard.md').read()
  assert '**0.950 [0.850, 1.000]** (1) (published 0.962)' in full          # the DreamSim README's test number
  assert '| `lpips:alex` | 0.700 [0.600, 0.800] (2) | 0.800 [0.700, 0.900] (1=)' in full   # a tie: not bold
  assert md.split('\n')[2].endswith('| - |')
  assert 'DreamSim dino_vitb16' in full and 'DreamSim dino_vitb16' not in md   # other published rows: file only
  rows = list(csv.reader(open(tmp_path / 'leaderboard.csv')))
  head = rows[0]
  assert rows[1][head.index('nights/test published')] == '0.962' and rows[1][head.index('bapps_2afc/color')] == ''
  assert rows[2][head.index('bapps_2afc/cnn rank')] == rows[1][head.index('bapps_2afc/cnn rank')] == '1'
  assert rows[1][head.index('bapps_2afc/cnn best')] == '0'


def test_paired_ranks_bold_only_a_significant_best():
  """Three models on the same 200 items: A clearly above B and C; B and C differ by one item (not separable)."""
  rng = np.random.default_rng(0)
  a = (rng.random(200) < 0.9).astype(float)
  b = (rng.random(200) < 0.6).astype(float)
  c = b.copy()
  c[np.nonzero(c == 1)[0][0]] = 0.0
  res = {m: {'things': {'odd-one-out': cell(float(v.mean()), 200, mean_items(v))}} for m, v in
         (('A', a), ('B', b), ('C', c))}
  for test in ('bootstrap', 'sign'):
    board = leaderboard.build(res, ['A', 'B', 'C'], ['things'], leaderboard.RankOptions(test=test, n_boot=200))
    np.testing.assert_array_equal(board.ranks[:, 0], [1, 2, 2])
    assert board.best == {('things', 'odd-one-out'): 'A'}
  # two models that cannot be separated: the higher one is not bold, both rank 1
  board = leaderboard.build({m: res[m] for m in 'BC'}, ['B', 'C'], ['things'], leaderboard.RankOptions(n_boot=200))
  np.testing.assert_array_equal(board.ranks[:, 0], [1, 1])
  assert board.best == {}
  # cells without items (older records) are never separated
  bare = {m: {'things': {'odd-one-out': cell(s)}} for m, s in (('A', 0.9), ('B', 0.5))}
  board = leaderboard.build(bare, ['A', 'B'], ['things'])
  np.testing.assert_array_equal(board.ranks[:, 0], [1, 1])


def test_jnd_and_loglik_columns():
  rng = np.random.default_rng(1)
  same = (rng.random(60) < 0.5).astype(float)
  good = (1 - same) * 0.1 + rng.random(60) * 0.05     # 'same' pairs closer: AP near 1
  bad = rng.random(60)
  from visim_jax.metrics import human
  res = {}
  for m, d in (('good', good), ('bad', bad)):
    res[m] = {'bapps_jnd': {'cnn': cell(float(human.jnd_ap(d, same)), 60, {'kind': 'jnd', 'd': d.tolist(),
                                                                             'same': same.tolist()})}}
  board = leaderboard.build(res, ['good', 'bad'], ['bapps_jnd'], leaderboard.RankOptions(test='sign', n_boot=200))
  np.testing.assert_array_equal(board.ranks[:, 0], [1, 2])        # JND: bootstrap even when 'sign' is asked
  j = (rng.random(80) < 0.5).astype(float)
  d0 = rng.random(80)
  res = {}
  for m, d1 in (('agrees', d0 + np.where(j > 0.5, -0.3, 0.3)), ('random', rng.random(80))):
    items = {'kind': '2afc', 'd0': d0.tolist(), 'd1': d1.tolist(), 'judge': j.tolist()}
    res[m] = {'bapps_2afc': {'cnn': cell(float(paired.item_values(items).mean()), 80, items)}}
  board = leaderboard.build(res, ['agrees', 'random'], ['bapps_2afc'],
                            leaderboard.RankOptions(n_boot=200, twoafc_loglik=True, bandwidth=0.1))
  assert board.columns == [('bapps_2afc', 'cnn'), ('bapps_2afc', 'cnn loglik')]
  ll = [board.cells[(m, ('bapps_2afc', 'cnn loglik'))]['score'] for m in ('agrees', 'random')]
  assert ll[0] > ll[1] and ll[1] < 0
  assert board.best == {('bapps_2afc', 'cnn'): 'agrees', ('bapps_2afc', 'cnn loglik'): 'agrees'}
  assert 'items' not in leaderboard.without_items(res)['agrees']['bapps_2afc']['cnn']
