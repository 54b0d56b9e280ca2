"""The degenerate-result guard (metrics/degenerate.py, issue 28 item 4): every protocol's scorer on tied,
non-finite and constant-label inputs reports `degenerate: <reason>` (no number); the leaderboard never bolds
or ranks such a cell; bootstrap intervals contain their estimate (checked against a plain NumPy loop over the
same resamples) and are refused below the minimum resample count; LPIPS(x, x) is exactly 0."""
import csv

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from visim_jax.metrics import leaderboard
from visim_jax.core.errors import UserError
from visim_jax.metrics import degenerate, human, map as map_lib, retrieval, twoafc

CI = dict(n_resamples=50, seed=0)


def kind(cell):
  assert np.isnan(cell['score']) and np.isnan(cell['ci_low']) and np.isnan(cell['ci_high']), cell
  return degenerate.kind(cell['degenerate'])


def test_twoafc_nights_bapps():
  rng = np.random.RandomState(0)
  d = rng.rand(40).astype(np.float32)
  j = (rng.rand(40) > 0.5).astype(np.float32)
  assert kind(human.twoafc_interval(d, d.copy(), j, **CI)) == 'all tied'            # identical images, W = 0
  assert kind(human.twoafc_interval(np.zeros(40), np.zeros(40), j, **CI)) == 'all tied'
  bad = d.copy()
  bad[3] = np.inf                                                                      # W = 1e38
  assert kind(human.twoafc_interval(bad, rng.rand(40), j, **CI)) == 'non-finite'
  assert kind(human.twoafc_interval(d, rng.rand(40), np.full(40, 0.5), **CI)) == 'labels'
  ok = human.twoafc_interval(d, rng.rand(40), j, **CI)
  assert 'degenerate' not in ok and 0 <= ok['score'] <= 1


def test_jnd():
  rng = np.random.RandomState(1)
  same = rng.choice([0, 0.5, 1.0], 30)
  assert kind(human.jnd_interval(np.full(30, 0.2), same, **CI)) == 'all tied'
  assert kind(human.jnd_interval(rng.rand(30), np.ones(30), **CI)) == 'labels'        # all 'same': AP 1 for any
  assert kind(human.jnd_interval(rng.rand(30), np.zeros(30), **CI)) == 'labels'
  d = rng.rand(30)
  d[0] = np.nan
  assert kind(human.jnd_interval(d, same, **CI)) == 'non-finite'
  assert 'degenerate' not in human.jnd_interval(rng.rand(30), same, **CI)


def test_things():
  rng = np.random.RandomState(2)
  odd = rng.randint(0, 3, 25)
  assert kind(human.odd_one_out_interval(np.ones((25, 3)), odd, **CI)) == 'all tied'   # 1.000 under 'le' before
  two = rng.rand(25, 3)
  two[:, 1] = two[:, 0] = two.min(1) - 0.1                                            # the minimum always tied
  assert kind(human.odd_one_out_interval(two, odd, ties='lt', **CI)) == 'all tied'
  d = rng.rand(25, 3)
  d[4, 2] = -np.inf
  assert kind(human.odd_one_out_interval(d, odd, **CI)) == 'non-finite'
  assert 'degenerate' not in human.odd_one_out_interval(rng.rand(25, 3), odd, **CI)


def test_tll_retrieval_and_classes_map():
  rng = np.random.RandomState(3)
  out = retrieval.asymmetric_recall_intervals(np.zeros((12, 12)), (1, 5), **CI)
  assert list(out) == ['aR@1', 'aR@5'] and {kind(c) for c in out.values()} == {'all tied'}
  s = rng.rand(12, 12)
  s[2, 3] = np.nan
  assert kind(retrieval.asymmetric_recall_intervals(s, (1,), **CI)['aR@1']) == 'non-finite'
  s = rng.rand(12, 12) + 3 * np.eye(12)                                                  # partners on the diagonal
  good = retrieval.asymmetric_recall_intervals(s, (1,), **CI)['aR@1']
  assert good['score'] == 1.0 and 'degenerate' not in good
  labels = np.repeat(np.arange(3), 4)
  assert kind(map_lib.leave_one_out_interval(rng.rand(12, 12), np.zeros(12, int), **CI)) == 'labels'  # one class
  assert kind(map_lib.leave_one_out_interval(np.ones((12, 12)), labels, **CI)) == 'all tied'
  assert 'degenerate' not in map_lib.leave_one_out_interval(rng.rand(12, 12), labels, **CI)


def test_cosis_twoafc_and_histograms():
  refs = np.repeat(np.arange(10), 3)
  tied = np.asarray(twoafc.score(jnp.ones(30), jnp.ones(30), jnp.ones(30, bool)))       # a constant similarity
  s = twoafc.summary(tied, refs, n_boot=50)
  assert np.isnan(s['accuracy']) and degenerate.kind(s['degenerate']) == 'all tied'
  nan = np.asarray(twoafc.score(jnp.full(30, jnp.nan), jnp.ones(30), jnp.ones(30, bool)))
  assert degenerate.kind(twoafc.summary(nan, refs, n_boot=0)['degenerate']) == 'non-finite'
  many = twoafc.summaries(np.stack([tied, np.random.RandomState(0).randint(0, 2, 30)]), refs, n_boot=50)
  assert 'degenerate' in many[0] and 'degenerate' not in many[1]
  one_bin = np.zeros((3, 100), int)
  one_bin[:, 57] = 10
  assert degenerate.kind(degenerate.histograms(one_bin, one_bin)) == 'all tied'
  spread = one_bin.copy()
  spread[0, 10] = 1
  assert degenerate.histograms(one_bin, spread) is None


def test_leaderboard_never_bolds_or_ranks_a_degenerate_cell(tmp_path):
  good = lambda s: {'score': s, 'ci_low': s - 0.05, 'ci_high': s + 0.05, 'n': 20}
  # a degenerate cell that still carries a number (an old record): never the best, never ranked
  stale = {'score': 1.0, 'ci_low': 1.0, 'ci_high': 1.0, 'n': 20, 'degenerate': 'all tied: d0 == d1'}
  results = {'a': {'nights': {'test': stale}, 'things': {'odd-one-out': good(0.6)}},
             'b': {'nights': {'test': good(0.7)}, 'things': {'odd-one-out': degenerate.result('labels: x', 20)}},
             'c': {'nights': {'test': good(0.7)}, 'things': {'odd-one-out': good(0.5)}}}
  # the plain order (rank_test='none': these cells carry no per-item data for a paired test)
  b = leaderboard.build(results, list(results), ['nights', 'things'], leaderboard.RankOptions(test='none'))
  np.testing.assert_array_equal(b.ranks, [[np.nan, 1], [1, np.nan], [1, 2]])            # b and c tie at 0.7
  assert b.best == {('things', 'odd-one-out'): 'a'}      # b and c tie on nights: no unique best, none bold
  console = leaderboard.write(str(tmp_path), b)
  md = open(tmp_path / 'leaderboard.md').read()
  assert '| `a` | degenerate: all tied: d0 == d1 | **0.600' in md and '**degenerate' not in md
  assert '| `b` | 0.700 [0.650, 0.750] (1=) | degenerate: labels: x |' in md
  assert console.strip().splitlines()[-2:] == ['degenerate: a / nights test: all tied: d0 == d1',
                                               'degenerate: b / things odd-one-out: labels: x']
  rows = list(csv.reader(open(tmp_path / 'leaderboard.csv')))
  head = rows[0]
  at = lambda r, col: rows[r][head.index(col)]
  assert (at(1, 'nights/test'), at(1, 'nights/test best'), at(1, 'nights/test degenerate')) == (
      '', '0', 'all tied: d0 == d1')
  assert at(2, 'nights/test best') == at(3, 'nights/test best') == '0'
  from visim_jax.plots import benchmark as plots
  plots.rank_heatmap(b, str(tmp_path / 'lb.png'))
  assert (tmp_path / 'lb.png').stat().st_size > 1000


def loop_interval(scores_of_items, idx, score, alpha=0.05):
  """Percentile interval of the plain-loop resampled means (the resamples `idx`), widened to the estimate."""
  boot = []
  for row in idx:
    total = 0.0
    for i in row:
      total += scores_of_items[i]
    boot.append(total / len(row))
  lo, hi = np.quantile(np.array(boot), [alpha / 2, 1 - alpha / 2])
  return min(lo, score), max(hi, score)


def test_bootstrap_interval_contains_the_estimate_and_is_the_loops_percentile():
  rng = np.random.RandomState(4)
  for n in (5,):                                                  # one size: one compilation per statistic
    for seed in range(8):
      d0, d1 = rng.rand(2, n)
      j = rng.choice([0.0, 0.25, 1.0], n)
      r = human.twoafc_interval(d0, d1, j, n_resamples=50, seed=seed)
      if 'degenerate' in r:
        continue
      assert r['ci_low'] <= r['score'] <= r['ci_high'], (n, seed, r)
      per_item = [((a < b) * (1 - p) + (b < a) * p + 0.5 * (a == b)) for a, b, p in zip(d0, d1, j)]
      idx = np.asarray(jax.random.randint(jax.random.PRNGKey(seed), (50, n), 0, n))
      np.testing.assert_allclose((r['ci_low'], r['ci_high']), loop_interval(per_item, idx, r['score']), atol=1e-6)
      same = rng.choice([0.0, 1.0], n)
      same[0], same[1] = 0.0, 1.0
      r = human.jnd_interval(rng.rand(n), same, n_resamples=50, seed=seed)            # skewed: AP of resamples
      assert r['ci_low'] <= r['score'] <= r['ci_high'], (n, seed, r)
      r = human.odd_one_out_interval(rng.rand(n, 3), rng.randint(0, 3, n), n_resamples=50, seed=seed)
      assert r['ci_low'] <= r['score'] <= r['ci_high'], (n, seed, r)
      s = twoafc.summary(rng.randint(0, 3, 2 * n) / 2, np.arange(2 * n) % n, n_boot=50, seed=seed)
      assert 'degenerate' in s or s['ci_low'] <= s['accuracy'] <= s['ci_high']


def test_too_few_resamples_are_refused():
  d = np.random.RandomState(5).rand(2, 20)
  j = np.zeros(20)
  with pytest.raises(ValueError, match='n_resamples=1: use 0'):
    human.twoafc_interval(d[0], d[1], j, n_resamples=1)
  with pytest.raises(ValueError, match='n_boot=10'):
    twoafc.summary(np.ones(20), np.arange(20), n_boot=10)
  with pytest.raises(UserError, match=r'^config.n_boot: 1 resamples are too few .* at least 50$'):
    degenerate.check_n_boot(1)
  assert degenerate.check_n_boot(0) == 0 and degenerate.check_n_boot(50) == 50
  assert np.isnan(human.twoafc_interval(d[0], d[1], j, n_resamples=0)['ci_low'])


@pytest.mark.parametrize('net', ['alex', 'vgg'])
def test_lpips_of_identical_images_is_exactly_zero(net):
  """Issue 28: ~1e-16 when both embeddings and the distance were one jitted program (an FMA in the fused
  normalise-and-subtract), which reordered identical pairs in BAPPS JND."""
  from visim_jax.models import lpips
  model = lpips.load_lpips(net, tiny=True)
  x = np.random.RandomState(6).randint(0, 256, (4, 32, 32, 3)).astype(np.uint8)
  y = x.copy()
  y[2, 5, 5, 0] ^= 1                                                                     # one pixel, one bit
  d = np.asarray(jax.jit(lpips.pair_distance)(model.params, x, y))
  assert d[0] == d[1] == d[3] == 0.0 and d[2] > 0
  assert np.all(np.asarray(jax.jit(lpips.pair_distance)(model.params, x / 255.0, x / 255.0)) == 0.0)
  assert np.all(np.asarray(lpips.lpips_distance(model, x, x.copy())) == 0.0)
