"""The image-quality protocol's scores (issue 47): how well a full-reference metric's values follow mean opinion
scores (KADID-10k, TID2013, PIPAL, CSIQ, LIVE, PieAPP).

  srcc(q, mos)        Spearman's rank correlation (average ranks for ties)
  krcc(q, mos)        Kendall's tau-b (scipy.stats.kendalltau, ties corrected)
  plcc(q, mos)        Pearson's correlation of the MOS with f(q), f the five-parameter logistic
                        f(q) = b1 (1/2 - 1 / (1 + exp(b2 (q - b3)))) + b4 q + b5
                      fitted by least squares (scipy.optimize.curve_fit): the mapping of Sheikh, Sabir & Bovik
                      (2006, "A statistical evaluation of recent full reference image quality assessment
                      algorithms", the LIVE study, after the VQEG Phase I report), which full-reference IQA papers
                      commonly report PLCC after. Why: PLCC asks for linearity, and a metric's scale is nonlinear
                      in MOS; the logistic removes that monotone nonlinearity (as SRCC does by ranks) so PLCC
                      measures the scatter around it, comparable with those papers' tables. (pyiqa's benchmark
                      table reports the linear PLCC, no mapping: benchmark_results.py calls calculate_plcc
                      without fit_scale, docs/benchmark.rst "PLCC without any correction"; so its PLCC
                      values are not stored beside ours, its SRCC / KRCC are.)
                      Start: b = (max MOS - min MOS, 1 / std(q), mean(q), 0, mean(MOS)); if the fit does not
                      converge, the linear PLCC (no mapping) is reported and the cell says so.
  quality = -distance for the zoo's distances (smaller = more similar) and MOS oriented so higher = better: a good
  metric scores > 0 whatever its own direction.
  intervals(q, mos)   {srcc, krcc, plcc}: {score, ci_low, ci_high, n}; a percentile bootstrap over the distorted
                      images (n_resamples draws of the items with replacement; the logistic fitted once on all items
                      and kept for the resamples, so the PLCC interval is that of the fitted mapping's scatter)
  srcc_batched / plcc_batched   the jittable statistics the paired tests of the leaderboard resample
                      (metrics/paired.py, item kind 'corr')
"""
from __future__ import annotations

import warnings

import jax.numpy as jnp
import numpy as np

STATS = ('srcc', 'krcc', 'plcc')


def logistic5(q, b1, b2, b3, b4, b5):
  return b1 * (0.5 - 1.0 / (1.0 + np.exp(np.clip(b2 * (q - b3), -60, 60)))) + b4 * q + b5


def fit_logistic(q, mos) -> tuple[np.ndarray, bool]:
  """(f(q), converged): the five-parameter logistic fitted to (q, mos) (module docstring)."""
  from scipy import optimize  # pylint: disable=g-import-not-at-top
  q, mos = np.asarray(q, np.float64), np.asarray(mos, np.float64)
  b0 = [np.ptp(mos) or 1.0, 1.0 / (np.std(q) or 1.0), np.mean(q), 0.0, np.mean(mos)]
  try:
    with warnings.catch_warnings():
      warnings.simplefilter('ignore')
      b, _ = optimize.curve_fit(logistic5, q, mos, p0=b0, maxfev=20000)
    f = logistic5(q, *b)
    return (f, True) if np.all(np.isfinite(f)) else (q, False)
  except (RuntimeError, ValueError, optimize.OptimizeWarning):
    return q, False


def _rank(x):
  s = jnp.sort(x)
  return (jnp.searchsorted(s, x, side='left') + jnp.searchsorted(s, x, side='right') + 1) / 2.0


def _pearson(a, b):
  a, b = a - jnp.mean(a), b - jnp.mean(b)
  return jnp.sum(a * b) / jnp.sqrt(jnp.sum(a * a) * jnp.sum(b * b))


def srcc_batched(q, mos):
  """Spearman's rho with average ranks (jittable, vmappable)."""
  return _pearson(_rank(q), _rank(mos))


def plcc_batched(f, mos):
  return _pearson(f, mos)


def srcc(q, mos) -> float:
  from scipy import stats  # pylint: disable=g-import-not-at-top
  return float(stats.spearmanr(q, mos)[0])


def krcc(q, mos) -> float:
  from scipy import stats  # pylint: disable=g-import-not-at-top
  return float(stats.kendalltau(q, mos)[0])


def plcc(q, mos) -> float:
  f, _ = fit_logistic(q, mos)
  return float(np.corrcoef(f, np.asarray(mos, np.float64))[0, 1])


def intervals(q, mos, n_resamples: int = 1000, alpha: float = 0.05, seed: int = 0) -> dict:
  """{'srcc' | 'krcc' | 'plcc': {score, ci_low, ci_high, n[, note]}} (module docstring)."""
  from scipy import stats  # pylint: disable=g-import-not-at-top
  q, mos = np.asarray(q, np.float64), np.asarray(mos, np.float64)
  n = len(q)
  f, ok = fit_logistic(q, mos)
  fns = {'srcc': lambda i: stats.spearmanr(q[i], mos[i])[0], 'krcc': lambda i: stats.kendalltau(q[i], mos[i])[0],
         'plcc': lambda i: np.corrcoef(f[i], mos[i])[1, 0]}
  full = np.arange(n)
  rng = np.random.default_rng(seed)
  draws = [rng.integers(0, n, n) for _ in range(n_resamples)]
  out = {}
  for name, fn in fns.items():
    with np.errstate(invalid='ignore', divide='ignore'), warnings.catch_warnings():
      warnings.simplefilter('ignore')
      score = float(fn(full))
      boot = np.asarray([fn(i) for i in draws], np.float64)
    boot = boot[np.isfinite(boot)]
    lo, hi = np.quantile(boot, [alpha / 2, 1 - alpha / 2]) if boot.size else (np.nan, np.nan)
    out[name] = {'score': score, 'ci_low': float(lo), 'ci_high': float(hi), 'n': n}
  if not ok:
    out['plcc']['note'] = 'the logistic fit did not converge: linear PLCC'
  out['plcc']['fitted'] = f.tolist()
  return out
