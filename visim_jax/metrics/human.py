"""Scores against human similarity judgements (NIGHTS, BAPPS 2AFC / JND, THINGS odd-one-out), pure and vmappable.

Inputs are DISTANCES (a model's dissimilarity: smaller = more alike), as in the reference code; pass
`-similarity` for a similarity.

  twoafc_scores(d0, d1, judge)   per-triplet (d0 < d1)(1 - j) + (d1 < d0) j + 0.5 (d0 == d1), with d0 = d(ref,
                                 p0), d1 = d(ref, p1), j = fraction of humans preferring p1. Its mean is LPIPS's
                                 `score_2afc_dataset` (BAPPS, one number per set) and DreamSim's
                                 `score_nights_dataset` (NIGHTS, j = right_vote in {0, 1}; a tie scores 1/2).
                                 (DreamSim's training log counts `(j >= 0.5) == (d1 < d0)`, where a tie reads
                                 as 'p0 chosen'; its reported numbers use score_nights_dataset, as we do.)
  jnd_ap(d, same)                LPIPS's `score_jnd_dataset`: pairs sorted by increasing distance (a stable sort:
                                 ties keep input order, where upstream's np.argsort quicksort order is
                                 unspecified), TP = cumsum(same), FP = cumsum(1 - same), precision TP/(TP+FP),
                                 recall TP/sum(same), area under the PR curve by `voc_ap` (the VOC 2010+
                                 all-points rule: precision made monotone from the right, summed over recall
                                 steps). NaN when no pair has same > 0 (upstream divides by zero too).
  odd_one_out_correct(d, odd)    THINGS: d (T, 3) = distances of the pairs (0,1), (0,2), (1,2); the model's odd
                                 one is the image outside the closest pair; 1 when it is the human's odd column.
                                 ties='le' (default) is DreamSim's score_things_dataset: the human pair counts
                                 as closest when its distance is <= both others (a tie is right); 'lt' needs it
                                 strictly smaller; 'split' gives 1/k when k pairs tie at the minimum.
  bootstrap(stat, arrays, key)   stat over n_resamples resamples (with replacement) of the items, vmapped;
  interval(...)                  -> {score, ci_low, ci_high, n}: the percentile (1 - alpha) interval, refused
                                 below metrics/degenerate.py's min_boot (0: none) and widened to contain the
                                 estimate. twoafc_ / jnd_ / odd_one_out_interval first pass the inputs through
                                 the degenerate guard (metrics/degenerate.py): non-finite or all-tied distances,
                                 or labels that make every model score the same, give {score: NaN, ...,
                                 degenerate: <reason>} instead of a number.
"""
from __future__ import annotations

import functools
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from visim_jax.core import cpu_kernels
from visim_jax.metrics import degenerate

TIES = ('le', 'lt', 'split')


@cpu_kernels.jit
def twoafc_scores(d0, d1, judge) -> jax.Array:
  """Per-triplet 2AFC agreement with humans in [0, 1] (LPIPS / DreamSim rule; distances, j = P(human picks p1))."""
  d0, d1, j = (jnp.asarray(x, jnp.float32) for x in (d0, d1, judge))
  return (d0 < d1) * (1.0 - j) + (d1 < d0) * j + (d1 == d0) * 0.5


@cpu_kernels.jit
def twoafc_score(d0, d1, judge) -> jax.Array:
  """Mean 2AFC score: BAPPS per set (score_2afc_dataset), NIGHTS per split (score_nights_dataset)."""
  return twoafc_scores(d0, d1, judge).mean()


@cpu_kernels.jit
def voc_ap(rec, prec) -> jax.Array:
  """VOC all-points average precision of a PR curve (recall non-decreasing), as LPIPS's voc_ap(use_07=False)."""
  rec, prec = jnp.asarray(rec, jnp.float32), jnp.asarray(prec, jnp.float32)
  mrec = jnp.concatenate([jnp.zeros(1), rec, jnp.ones(1)])
  mpre = jnp.concatenate([jnp.zeros(1), prec, jnp.zeros(1)])
  mpre = jax.lax.cummax(mpre, reverse=True)                  # precision envelope from the right
  step = mrec[1:] - mrec[:-1]                                # zero where recall does not change
  return jnp.sum(jnp.where(step != 0, step * mpre[1:], 0.0))


@cpu_kernels.jit
def jnd_ap(d, same) -> jax.Array:
  """BAPPS JND score: average precision of 'same' ranked by increasing distance (score_jnd_dataset)."""
  d, same = jnp.asarray(d, jnp.float32), jnp.asarray(same, jnp.float32)
  s = same[jnp.argsort(d, stable=True)]
  tp = jnp.cumsum(s)
  fp = jnp.cumsum(1.0 - s)
  fn = jnp.sum(s) - tp
  return voc_ap(tp / (tp + fn), tp / (tp + fp))


@functools.partial(cpu_kernels.jit, static_argnames='ties')
def odd_one_out_correct(d, odd, ties: str = 'le') -> jax.Array:
  """Per-triplet agreement (T,) with the human odd one; d (T, 3) distances of pairs (0,1), (0,2), (1,2)."""
  if ties not in TIES:
    raise ValueError(f'ties: expected one of {TIES}, got {ties!r}')
  d = jnp.asarray(d, jnp.float32)
  pair = 2 - jnp.asarray(odd, jnp.int32)                     # the pair that leaves out the odd column
  dh = jnp.take_along_axis(d, pair[:, None], axis=1)[:, 0]
  others = jnp.where(jnp.arange(3)[None, :] == pair[:, None], jnp.inf, d)
  if ties == 'le':
    return jnp.all(dh[:, None] <= others, axis=1).astype(jnp.float32)
  if ties == 'lt':
    return jnp.all(dh[:, None] < others, axis=1).astype(jnp.float32)
  n_min = jnp.sum(d == d.min(axis=1, keepdims=True), axis=1)
  return jnp.where(dh == d.min(axis=1), 1.0 / n_min, 0.0)


@functools.partial(cpu_kernels.jit, static_argnames='ties')
def odd_one_out_accuracy(d, odd, ties: str = 'le') -> jax.Array:
  return odd_one_out_correct(d, odd, ties).mean()


def triplet_pair_distances(dist: Callable, x) -> jax.Array:
  """(T, 3) distances of the pairs (0,1), (0,2), (1,2) of x (T, 3, ...) under dist(a, b) -> (T,)."""
  return jnp.stack([dist(x[:, 0], x[:, 1]), dist(x[:, 0], x[:, 2]), dist(x[:, 1], x[:, 2])], axis=1)


@functools.partial(cpu_kernels.jit, static_argnums=(0, 3))
def bootstrap(stat: Callable, arrays: Sequence, key: jax.Array, n_resamples: int = 1000) -> jax.Array:
  """(n_resamples,) values of stat(*arrays[idx]) for idx = N draws with replacement, one draw per resample,
  vmapped. `arrays` share their leading axis (the items); `stat` must be a hashable pure function."""
  n = jnp.asarray(arrays[0]).shape[0]
  idx = jax.random.randint(key, (n_resamples, n), 0, n)
  return jax.vmap(lambda i: stat(*(jnp.asarray(a)[i] for a in arrays)))(idx)


def interval(stat: Callable, *arrays, n_resamples: int = 1000, alpha: float = 0.05, seed: int = 0) -> dict:
  """{score, ci_low, ci_high, n}: stat on all items and its percentile (1 - alpha) bootstrap interval
  (n_resamples=0: no interval, NaN bounds; 0 < n_resamples < degenerate.min_boot(alpha) is refused), widened
  to contain the score. NaN resamples (e.g. JND AP with no 'same' pair) are ignored; a score that is not
  finite is reported as degenerate."""
  n_resamples = int(n_resamples)
  if n_resamples and n_resamples < degenerate.min_boot(alpha):
    raise ValueError(f'n_resamples={n_resamples}: use 0 (no interval) or >= {degenerate.min_boot(alpha)}')
  score = float(stat(*(jnp.asarray(a) for a in arrays)))
  n = int(np.asarray(arrays[0]).shape[0])
  why = degenerate.estimate(score)
  if why:
    return degenerate.result(why, n)
  lo = hi = float('nan')
  if n_resamples > 0 and n > 0:
    boot = np.asarray(bootstrap(stat, tuple(arrays), jax.random.PRNGKey(seed), n_resamples))
    boot = boot[np.isfinite(boot)]
    if boot.size:
      lo, hi = degenerate.contain(score, *(float(v) for v in np.quantile(boot, [alpha / 2, 1 - alpha / 2])))
  return {'score': score, 'ci_low': lo, 'ci_high': hi, 'n': n}


def twoafc_interval(d0, d1, judge, **kw) -> dict:
  why = degenerate.twoafc(d0, d1, judge)
  return degenerate.result(why, np.size(d0)) if why else interval(twoafc_score, d0, d1, judge, **kw)


def jnd_interval(d, same, **kw) -> dict:
  why = degenerate.jnd(d, same)
  return degenerate.result(why, np.size(d)) if why else interval(jnd_ap, d, same, **kw)


def _ooo_le(d, odd):
  return odd_one_out_accuracy(d, odd, 'le')


def _ooo_lt(d, odd):
  return odd_one_out_accuracy(d, odd, 'lt')


def _ooo_split(d, odd):
  return odd_one_out_accuracy(d, odd, 'split')


_OOO = {'le': _ooo_le, 'lt': _ooo_lt, 'split': _ooo_split}


def odd_one_out_interval(d, odd, ties: str = 'le', **kw) -> dict:
  if ties not in TIES:
    raise ValueError(f'ties: expected one of {TIES}, got {ties!r}')
  why = degenerate.odd_one_out(d)
  return degenerate.result(why, len(np.asarray(d))) if why else interval(_OOO[ties], d, odd, **kw)


def _mean(x):
  return jnp.mean(x)


def recall_interval(ranks, k: int, **kw) -> dict:
  """aR@k (or R@k) from 1-based partner ranks (metrics/retrieval.py), a bootstrap over the pairs."""
  return interval(_mean, (np.asarray(ranks) <= k).astype(np.float32), **kw)


def mean_interval(values, **kw) -> dict:
  """The mean of per-item values (e.g. per-query AP), a bootstrap over the items."""
  return interval(_mean, np.asarray(values, np.float32), **kw)
