"""Paired comparisons of models scored on the same items, and the rank groups the leaderboard shows (issue 35).

Two models on one leaderboard column were scored on the same items (triplets, pairs, queries): their difference is
judged on those items, not by whether two separate bootstrap intervals overlap.

  items of a cell (what a protocol stores beside its score; experiments/benchmark_tasks.py):
    {'kind': 'mean', 'values': per-item contributions whose mean is the score[, 'clusters': resampling units]}
    {'kind': '2afc', 'd0', 'd1', 'judge'}    per triplet; contribution = human.twoafc_scores (LPIPS / DreamSim rule)
    {'kind': 'jnd', 'd', 'same'}             per pair; the score (average precision) is not a mean: bootstrap only
    {'kind': 'corr', 'stat', 'q', 'mos'}     per distorted image (quality protocol, metrics/quality.py): SRCC / PLCC
                                             (q: the logistic's f(-d)) / KRCC of q against the MOS; not a mean:
                                             bootstrap only
  paired_bootstrap(stat, a, b, ...)      the difference stat(a) - stat(b) on the SAME resampled items (or clusters),
                                         its percentile interval and a two-sided p-value (2 x the smaller tail of the
                                         resampled differences around 0, at most 1)
  sign_test(va, vb)                      exact two-sided sign test on the per-item differences (ties dropped): exact
                                         McNemar when the per-item values are 0 / 1 (NIGHTS, THINGS)
  compare(cells, test, ...)              better[i, j]: model i is significantly better than model j (p < alpha)
  rank_groups(better)                    rank_i = 1 + the number of models significantly better than i: models that
                                         cannot be separated at the chosen level share a rank; a column's best is
                                         "significant" when one model is better than every other one
  twoafc_loglik(d0, d1, judge)           Hepburn, Santos-Rodriguez & Portilla (arXiv 2403.10390)'s idea for 2AFC:
                                         judge how well a model's distances PREDICT the human fraction, by the
                                         binomial log-likelihood of the judgements under p(d0, d1) estimated from
                                         the data; ours (our reading, flagged in docs/metrics.md): both distances
                                         mapped through their pooled empirical CDF, p = the leave-one-triplet-out
                                         Gaussian-kernel (Nadaraya-Watson) average of the judgements, the data
                                         symmetrised (each triplet also as (d1, d0, 1 - j)), per triplet
                                         j log p + (1 - j) log(1 - p) (mean log-likelihood per judgement, <= 0,
                                         higher is better).
Everything is NumPy / jitted JAX on host arrays; tests check each against a plain loop.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from visim_jax.core import cpu_kernels

TESTS = ('bootstrap', 'sign', 'none')
LOGLIK_CLIP = 1e-4


# --------------------------------------------------------------------------------------- per-item values

def _twoafc_values(d0, d1, judge) -> np.ndarray:
  d0, d1, j = (np.asarray(v, np.float64) for v in (d0, d1, judge))
  return (d0 < d1) * (1.0 - j) + (d1 < d0) * j + (d1 == d0) * 0.5


def item_values(items: dict) -> np.ndarray | None:
  """Per-item contributions whose mean is the cell's score (None for JND: AP is not a mean)."""
  kind = items.get('kind')
  if kind == 'mean':
    return np.asarray(items['values'], np.float64)
  if kind == '2afc':
    return _twoafc_values(items['d0'], items['d1'], items['judge'])
  if kind == 'loglik':
    return np.asarray(items['values'], np.float64)
  return None


def _jnd_ap(d, same):
  from visim_jax.metrics import human  # pylint: disable=g-import-not-at-top
  return human.jnd_ap(d, same)


def _mean(v):
  return jnp.mean(v)


# ------------------------------------------------------------------------------------------ paired tests

@functools.partial(cpu_kernels.jit, static_argnums=(0, 4))
def _boot_diffs(stat, arrays_a, arrays_b, idx, n_args):
  del n_args
  return jax.vmap(lambda i: stat(*(a[i] for a in arrays_a)) - stat(*(b[i] for b in arrays_b)))(idx)


def paired_bootstrap(stat, arrays_a, arrays_b, n_boot: int = 1000, alpha: float = 0.05, seed: int = 0,
                     clusters=None) -> dict:
  """{diff, ci_low, ci_high, p}: stat(*arrays_a) - stat(*arrays_b) and its paired percentile bootstrap (the same
  item draws for both models; with `clusters`, whole clusters are drawn and a resample's statistic weights each item
  by how many times its cluster was drawn: stat must then be a mean, as for CoSIS)."""
  arrays_a = tuple(jnp.asarray(a) for a in arrays_a)
  arrays_b = tuple(jnp.asarray(b) for b in arrays_b)
  diff = float(stat(*arrays_a) - stat(*arrays_b))
  n = int(arrays_a[0].shape[0])
  rng = np.random.default_rng(seed)
  if clusters is None:
    idx = jnp.asarray(rng.integers(0, n, (n_boot, n)), jnp.int32)
    boot = np.asarray(_boot_diffs(stat, arrays_a, arrays_b, idx, len(arrays_a)), np.float64)
  else:  # cluster bootstrap of a mean: weights = draws of each item's cluster
    _, inv = np.unique(np.asarray(clusters), return_inverse=True)
    k = int(inv.max()) + 1
    counts = np.stack([np.bincount(rng.integers(0, k, k), minlength=k) for _ in range(n_boot)])[:, inv]  # (B, n)
    va, vb = np.asarray(arrays_a[0], np.float64), np.asarray(arrays_b[0], np.float64)
    boot = (counts @ (va - vb)) / np.maximum(counts.sum(1), 1)
  boot = boot[np.isfinite(boot)]
  if not boot.size:
    return {'diff': diff, 'ci_low': float('nan'), 'ci_high': float('nan'), 'p': 1.0}
  lo, hi = np.quantile(boot, [alpha / 2, 1 - alpha / 2])
  p = min(1.0, 2.0 * min(np.mean(boot <= 0), np.mean(boot >= 0)))
  return {'diff': diff, 'ci_low': float(lo), 'ci_high': float(hi), 'p': float(p)}


def sign_test(values_a, values_b) -> dict:
  """Exact two-sided sign test of per-item differences (ties dropped): {n_better, n_worse, p} (McNemar's exact test
  when the values are 0 / 1). p = min(1, 2 P(X <= min(n_better, n_worse))), X ~ Binomial(n_better + n_worse, 1/2)."""
  from scipy import stats  # pylint: disable=g-import-not-at-top
  d = np.asarray(values_a, np.float64) - np.asarray(values_b, np.float64)
  n_pos, n_neg = int(np.sum(d > 0)), int(np.sum(d < 0))
  n = n_pos + n_neg
  p = 1.0 if n == 0 else min(1.0, 2.0 * float(stats.binom.cdf(min(n_pos, n_neg), n, 0.5)))
  return {'n_better': n_pos, 'n_worse': n_neg, 'p': p}


def compare_pair(a: dict, b: dict, test: str = 'bootstrap', n_boot: int = 1000, alpha: float = 0.05,
                 seed: int = 0) -> dict | None:
  """The paired test of two cells' items (None when they were not scored on the same items)."""
  if test not in TESTS:
    raise ValueError(f'test: one of {TESTS}, got {test!r}')
  if test == 'none' or a.get('kind') != b.get('kind'):
    return None
  if a['kind'] == 'jnd':
    if not np.array_equal(np.asarray(a['same']), np.asarray(b['same'])):
      return None
    same = np.asarray(a['same'], np.float32)
    return paired_bootstrap(_jnd_ap, (np.asarray(a['d'], np.float32), same), (np.asarray(b['d'], np.float32), same),
                            n_boot, alpha, seed)
  if a['kind'] == 'corr':
    return _compare_corr(a, b, n_boot, alpha, seed)
  va, vb = item_values(a), item_values(b)
  if va is None or vb is None or va.shape != vb.shape:
    return None
  if a['kind'] == '2afc' and not np.array_equal(np.asarray(a['judge']), np.asarray(b['judge'])):
    return None
  if test == 'sign':
    return sign_test(va, vb)
  return paired_bootstrap(_mean, (va.astype(np.float32),), (vb.astype(np.float32),), n_boot, alpha, seed,
                          clusters=a.get('clusters'))


def _compare_corr(a: dict, b: dict, n_boot: int, alpha: float, seed: int) -> dict | None:
  """The paired bootstrap of a correlation difference (the same resampled images for both metrics)."""
  from visim_jax.metrics import quality  # pylint: disable=g-import-not-at-top
  if a.get('stat') != b.get('stat') or not np.array_equal(np.asarray(a['mos']), np.asarray(b['mos'])):
    return None
  mos = np.asarray(a['mos'], np.float32)
  qa, qb = np.asarray(a['q'], np.float32), np.asarray(b['q'], np.float32)
  if a['stat'] == 'krcc':   # scipy's O(n log n) tau-b per resample (an O(n^2) vmapped one would not fit in memory)
    rng = np.random.default_rng(seed)
    diff = quality.krcc(qa, mos) - quality.krcc(qb, mos)
    boot = []
    for _ in range(n_boot):
      i = rng.integers(0, len(mos), len(mos))
      boot.append(quality.krcc(qa[i], mos[i]) - quality.krcc(qb[i], mos[i]))
    boot = np.asarray(boot)
    boot = boot[np.isfinite(boot)]
    if not boot.size:
      return {'diff': diff, 'ci_low': float('nan'), 'ci_high': float('nan'), 'p': 1.0}
    lo, hi = np.quantile(boot, [alpha / 2, 1 - alpha / 2])
    p = min(1.0, 2.0 * min(np.mean(boot <= 0), np.mean(boot >= 0)))
    return {'diff': float(diff), 'ci_low': float(lo), 'ci_high': float(hi), 'p': float(p)}
  stat = quality.srcc_batched if a['stat'] == 'srcc' else quality.plcc_batched
  return paired_bootstrap(stat, (qa, mos), (qb, mos), n_boot, alpha, seed)


def compare(items: list, scores, test: str = 'bootstrap', n_boot: int = 1000, alpha: float = 0.05,
            seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """(better (K, K) bool, p (K, K)): better[i, j] when model i's score is higher and the paired test of i against j
  gives p < alpha. Models without items (or not on the same items) are never separated (p = 1)."""
  k = len(items)
  scores = np.asarray(scores, np.float64)
  p = np.ones((k, k))
  better = np.zeros((k, k), bool)
  for i in range(k):
    for j in range(i + 1, k):
      if items[i] is None or items[j] is None or not (np.isfinite(scores[i]) and np.isfinite(scores[j])):
        continue
      r = compare_pair(items[i], items[j], test, n_boot, alpha, seed)
      if r is None:
        continue
      p[i, j] = p[j, i] = r['p']
      if r['p'] < alpha and scores[i] != scores[j]:
        hi, lo = (i, j) if scores[i] > scores[j] else (j, i)
        better[hi, lo] = True
  return better, p


def rank_groups(better: np.ndarray, valid=None) -> np.ndarray:
  """rank_i = 1 + #{j: j significantly better than i} (float, NaN where not valid)."""
  better = np.asarray(better, bool)
  ranks = 1.0 + better.sum(axis=0)
  if valid is not None:
    ranks = np.where(np.asarray(valid, bool), ranks, np.nan)
  return ranks


def significant_best(better: np.ndarray, i: int, valid=None) -> bool:
  """Model i is significantly better than every other valid model of the column (and there is at least one)."""
  k = better.shape[0]
  others = [j for j in range(k) if j != i and (valid is None or valid[j])]
  return bool(others) and all(better[i, j] for j in others)


# ------------------------------------------------------------------------- Hepburn et al.'s likelihood

def _ecdf(values: np.ndarray, pooled: np.ndarray) -> np.ndarray:
  """Mid-rank empirical CDF of `values` within `pooled`, in (0, 1)."""
  s = np.sort(pooled)
  lo = np.searchsorted(s, values, 'left')
  hi = np.searchsorted(s, values, 'right')
  return (lo + hi) / (2.0 * len(s))


@functools.partial(cpu_kernels.jit, static_argnames='block')
def _loo_nw(u0, u1, j, bandwidth, block: int = 512):
  """Leave-one-triplet-out kernel average of the judgements at each (u0_i, u1_i), the data symmetrised."""
  n = u0.shape[0]
  pad = (-n) % block
  q0, q1 = jnp.pad(u0, (0, pad)), jnp.pad(u1, (0, pad))
  rows = jnp.arange(n + pad).reshape(-1, block)
  inv = -0.5 / (bandwidth * bandwidth)

  def one(r):
    a0, a1 = q0[r][:, None], q1[r][:, None]
    k = jnp.exp(inv * ((a0 - u0[None]) ** 2 + (a1 - u1[None]) ** 2))      # (block, n): the triplets
    ks = jnp.exp(inv * ((a0 - u1[None]) ** 2 + (a1 - u0[None]) ** 2))     # their swapped twins
    self_ = (r[:, None] == jnp.arange(n)[None])
    k, ks = jnp.where(self_, 0.0, k), jnp.where(self_, 0.0, ks)
    num = k @ j + ks @ (1.0 - j)
    den = k.sum(1) + ks.sum(1)
    return num / jnp.maximum(den, 1e-30)
  return jax.lax.map(one, rows).reshape(-1)[:n]


def twoafc_loglik(d0, d1, judge, bandwidth: float = 0.05) -> np.ndarray:
  """(T,) per-judgement binomial log-likelihood j log p + (1 - j) log(1 - p) of each triplet's human fraction j
  under p(d0, d1) estimated from the other triplets (module docstring); p clipped to [1e-4, 1 - 1e-4]."""
  d0, d1, j = (np.asarray(v, np.float64) for v in (d0, d1, judge))
  pooled = np.concatenate([d0, d1])
  u0, u1 = _ecdf(d0, pooled), _ecdf(d1, pooled)
  p = np.asarray(_loo_nw(jnp.asarray(u0, jnp.float32), jnp.asarray(u1, jnp.float32), jnp.asarray(j, jnp.float32),
                         jnp.float32(bandwidth)), np.float64)
  p = np.clip(p, LOGLIK_CLIP, 1 - LOGLIK_CLIP)
  return j * np.log(p) + (1 - j) * np.log(1 - p)
