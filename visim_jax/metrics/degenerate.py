"""The guard against degenerate results: one rule for every protocol's score (issue 28, item 4).

A score is *degenerate* when it carries no information about the model, so that printing it as a number (and
ranking it) would mislead:

  non-finite     a distance is NaN or Inf (an adapter with W = 1e38, a broken checkpoint)
  all tied       the model makes none of the decisions the protocol asks of it: 2AFC (NIGHTS, BAPPS, CoSIS)
                 d0 == d1 on every triplet; JND every distance equal (the ranking is the input order);
                 THINGS no triplet has a unique closest pair; retrieval / mAP every entry of the distance
                 matrix equal; histograms every similarity in one bin (blank or identical images, W = 0)
  labels         the judgements make every model score the same: 2AFC every human fraction 1/2; JND every
                 pair's 'same' fraction equal (all 'same': AP = 1 for any model); a one-class labelled set

Each check returns the reason, '<kind>: <detail>' with kind one of KINDS, or None. A degenerate cell is reported as
`result(reason, n)` = {score, ci_low, ci_high: NaN, n, degenerate: reason}: not a number, so it is never
bold and never ranked (visim_jax/metrics/leaderboard.py), and tables show `degenerate: <reason>`.

Bootstrap intervals (metrics/human.py, metrics/twoafc.py): the percentile interval of `n_boot` resamples,
refused below `min_boot(alpha)` (0 = no interval), and made to contain the estimate (`contain`): with few
items or a skewed statistic (JND AP) the resampled quantiles can sit on one side of the full-sample estimate.
"""
from __future__ import annotations

import numpy as np

from visim_jax.core.errors import UserError

MIN_BOOT = 50
KINDS = ('non-finite', 'all tied', 'labels', 'empty')


def kind(reason: str) -> str:
  """The short kind of a reason ('all tied', ...): what a heatmap cell has room for."""
  return str(reason).split(':', 1)[0]


def min_boot(alpha: float = 0.05) -> int:
  """The fewest resamples of a percentile interval: MIN_BOOT at any level (below 2 / alpha resamples, as at
  very high levels, the bounds are the extreme resamples)."""
  del alpha
  return MIN_BOOT


def check_n_boot(n_boot: int, field: str = 'config.n_boot', alpha: float = 0.05) -> int:
  """n_boot itself, or a UserError naming `field` when it is neither 0 (no interval) nor >= min_boot(alpha)."""
  n = int(n_boot)
  if n != 0 and n < min_boot(alpha):
    raise UserError(f'{field}: {n} resamples are too few for a {100 * (1 - alpha):g}% percentile interval; '
                    f'use 0 (no interval) or at least {min_boot(alpha)}')
  return n


def contain(score: float, lo: float, hi: float) -> tuple[float, float]:
  """(lo, hi) widened to contain `score` (NaN bounds stay NaN)."""
  if not (np.isfinite(lo) and np.isfinite(hi) and np.isfinite(score)):
    return lo, hi
  return min(lo, score), max(hi, score)


def result(reason: str, n: int) -> dict:
  """The cell of a degenerate score: no number, the reason."""
  nan = float('nan')
  return {'score': nan, 'ci_low': nan, 'ci_high': nan, 'n': int(n), 'degenerate': reason}


def reason_of(cell) -> str | None:
  """The reason a result cell is degenerate, or None (also None for a missing cell)."""
  return cell.get('degenerate') if isinstance(cell, dict) else None


def _finite(*arrays) -> str | None:
  bad = sum(int(np.size(a) - np.isfinite(np.asarray(a, np.float64)).sum()) for a in arrays)
  total = sum(int(np.size(a)) for a in arrays)
  return f'non-finite: {bad} of {total} distances are NaN/Inf' if bad else None


def _as(x):
  return np.asarray(x, np.float64)


def twoafc(d0, d1, judge=None) -> str | None:
  """2AFC (NIGHTS, BAPPS 2AFC, CoSIS): d0 = d(ref, p0), d1 = d(ref, p1); judge = P(human picks p1)."""
  d0, d1 = _as(d0), _as(d1)
  if d0.size == 0:
    return 'empty: no triplets'
  why = _finite(d0, d1)
  if why:
    return why
  if np.all(d0 == d1):
    return f'all tied: d0 == d1 on all {d0.size} triplets, the model never chooses'
  if judge is not None and np.all(_as(judge) == 0.5):
    return 'labels: every human fraction is 1/2, any model scores 0.5'
  return None


def twoafc_scores(scores) -> str | None:
  """2AFC from per-triple scores in {0, 1/2, 1} (1/2 only on a tie; NaN from a NaN similarity)."""
  s = _as(scores)
  if s.size == 0:
    return 'empty: no triplets'
  if not np.isfinite(s).all():
    return f'non-finite: {int((~np.isfinite(s)).sum())} of {s.size} similarities are NaN/Inf'
  if np.all(s == 0.5):
    return f'all tied: every one of {s.size} triplets is a tie, the model never chooses'
  return None


def jnd(d, same) -> str | None:
  """BAPPS JND: d (N,) distances of the pairs, same (N,) fraction of humans who saw no difference."""
  d, same = _as(d), _as(same)
  if d.size == 0:
    return 'empty: no pairs'
  why = _finite(d)
  if why:
    return why
  if np.all(d == d[0]):
    return f'all tied: all {d.size} distances are equal, the ranking is the input order'
  if np.all(same == same[0]):
    return f"labels: every pair has the same 'same' fraction {same[0]:g}, AP = {same[0]:g} for any model"
  return None


def odd_one_out(d) -> str | None:
  """THINGS: d (T, 3) distances of the pairs (0,1), (0,2), (1,2)."""
  d = _as(d)
  if d.size == 0:
    return 'empty: no triplets'
  why = _finite(d)
  if why:
    return why
  n_min = np.sum(d == d.min(axis=1, keepdims=True), axis=1)
  if np.all(n_min > 1):
    return f'all tied: none of {len(d)} triplets has a unique closest pair, the model never picks an odd one'
  return None


def matrix(d) -> str | None:
  """Retrieval (aR@k) and mAP: a (N0, N1) distance (or similarity) matrix."""
  d = _as(d)
  if d.size == 0:
    return 'empty: no pairs'
  why = _finite(d)
  if why:
    return why
  if np.all(d == d.flat[0]):
    return f'all tied: all {d.size} distances are equal, every candidate ties'
  return None


def labels(y) -> str | None:
  """A labelled set (mAP, histograms): one class makes every image relevant to every query."""
  y = np.asarray(y)
  if y.size and np.all(y == y.flat[0]):
    return 'labels: one class, every image is relevant to every query and any model scores 1'
  return None


def histograms(h_intra, h_inter) -> str | None:
  """Histogram metrics: every pair's similarity in one bin (identical or blank features)."""
  total = np.asarray(h_intra).reshape(-1, np.shape(h_intra)[-1]).sum(0) + \
      np.asarray(h_inter).reshape(-1, np.shape(h_inter)[-1]).sum(0)
  if total.sum() and np.count_nonzero(total) == 1:
    return 'all tied: every similarity falls in one bin, the features separate no pair'
  return None


def estimate(score: float) -> str | None:
  """The last line of defence: a score that is not finite (e.g. JND AP with no 'same' pair)."""
  return None if np.isfinite(score) else 'non-finite: the score is not defined (NaN) on these inputs'
