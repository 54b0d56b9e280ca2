"""Mean average precision for image retrieval: the Oxford/Paris protocols (classic and revisited), mP@k, recall@k.

Average precision (the definition used by both protocols). Rank the database by decreasing score, *remove the
junk images* from the ranking (they neither help nor hurt), and let r_1 < r_2 < ... < r_n be the 0-based
positions of the n positives in what is left. AP is the area under the precision-recall curve accumulated as
trapezoids, one per positive (recall steps of 1/n):

    AP = (1/n) sum_j  ( p0_j + p1_j ) / 2,   p0_j = (j - 1) / r_j  (1 if r_j = 0),   p1_j = j / (r_j + 1)

(j 1-based): p0_j is the precision just before the j-th positive, p1_j the precision at it.
- The Oxford compute_ap.cpp (Philbin et al.) walks the ranked list skipping `junk` entries, keeping
  old_precision (1.0 at the start) and adding (recall - old_recall) * (old_precision + precision) / 2; recall
  only moves at a positive, so its sum is the formula above. Positives there are `good` + `ok`.
- The revisited code (Radenovic et al. 2018, revisitop python/evaluate.py `compute_ap` + `compute_map`) shifts
  each positive's rank down by the number of junk images ranked before it, then accumulates exactly these
  trapezoids with precision_0 = j / rank (1 at rank 0) and precision_1 = (j + 1) / (rank + 1) (j 0-based);
  the same formula. tests/test_map.py checks both transcriptions against this implementation.
A query without positives gets AP = NaN and is left out of the mean (as revisitop does: `nempty`).

An image listed as both positive and junk (never in the official Oxford/Paris files; possible in hand-made or
merged lists) is handled as compute_ap.cpp does: it is skipped like any junk image, yet still counted in n (the
positive set's size), so such a query cannot reach AP = 1. revisitop differs there: its junk shift uses a strict
`pos > junk` test, so the doubly listed image keeps its place as a positive *and* shifts every later positive up
one rank; the precisions then exceed 1 and so can AP (e.g. positives at ranks 0 and 1 with the first also junk:
revisitop AP = 1.25, ours / compute_ap.cpp 0.5). tests/test_map.py pins both behaviours.

mP@k (revisitop's definition): with R = the 1-based rank (junk removed) of the *last* positive,
k' = min(R, k) and P@k = #(positives ranked <= k') / k' (a query with fewer than k positives is not punished
for the slots it cannot fill). recall@k = #(positives ranked <= k) / n, junk removed, averaged over queries.

Revisited settings (Radenovic et al. 2018, example_evaluate.py), from a query's easy / hard / junk lists:
  easy:   positives = easy,        ignored (junk) = junk + hard
  medium: positives = easy + hard, ignored = junk
  hard:   positives = hard,        ignored = junk + easy
(easy, hard and junk are disjoint in the official gnd files, so the overlap rule above never fires there.)

Ties: the ranking sorts by decreasing score, ties broken by lower database index first (stable sort).
Everything here is a pure function of arrays; index lists are turned into dense (Q, D) masks with
`index_masks` (NumPy) and AP runs in JAX over all queries at once.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from visim_jax.core import cpu_kernels

REVISITED_SETTINGS = ('easy', 'medium', 'hard')


@cpu_kernels.jit
def ranked_positions(scores: jax.Array, positive: jax.Array, junk: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(is a counted positive (Q, D) in ranked order, 0-based rank with junk removed (Q, D)); junk entries get rank
  -1 and are never counted positives (compute_ap.cpp: a junk entry is skipped even when it is also positive)."""
  order = jnp.argsort(-scores.astype(jnp.float32), axis=1, stable=True)
  keep = ~jnp.take_along_axis(junk, order, axis=1)
  pos = jnp.take_along_axis(positive, order, axis=1) & keep
  rank = jnp.where(keep, jnp.cumsum(keep, axis=1) - 1, -1)
  return pos, rank


@cpu_kernels.jit
def average_precision(scores: jax.Array, positive: jax.Array, junk: jax.Array | None = None) -> jax.Array:
  """AP of each query: scores (Q, D), positive / junk (Q, D) bool -> (Q,) (NaN where a query has no positive)."""
  if junk is None:
    junk = jnp.zeros_like(positive)
  pos, rank = ranked_positions(scores, positive, junk)
  posf = pos.astype(jnp.float32)
  before = jnp.cumsum(posf, axis=1) - posf                      # positives ranked before this one (j - 1)
  r = rank.astype(jnp.float32)
  p0 = jnp.where(r > 0, before / jnp.maximum(r, 1.0), 1.0)
  p1 = (before + 1.0) / (r + 1.0)
  n = positive.astype(jnp.float32).sum(axis=1)                  # junk positives still count (compute_ap.cpp)
  total = jnp.sum(jnp.where(pos, 0.5 * (p0 + p1), 0.0), axis=1)
  return jnp.where(n > 0, total / jnp.maximum(n, 1.0), jnp.nan)


@cpu_kernels.jit
def precision_recall_at(scores: jax.Array, positive: jax.Array, junk: jax.Array | None,
                        ks: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(P@k (Q, K) with revisitop's k' = min(last positive rank, k), recall@k (Q, K)); NaN rows without positives."""
  if junk is None:
    junk = jnp.zeros_like(positive)
  pos, rank = ranked_positions(scores, positive, junk)
  rank1 = jnp.where(pos, rank + 1, 0)                           # 1-based ranks of positives, 0 elsewhere
  last = rank1.max(axis=1)                                      # R
  n = positive.sum(axis=1)
  ks = jnp.asarray(ks)
  kq = jnp.minimum(last[:, None], ks[None, :])                  # (Q, K)
  within = lambda lim: jnp.sum(pos[:, None, :] & (rank1[:, None, :] <= lim[..., None]), axis=-1)
  prec = within(kq) / jnp.maximum(kq, 1)
  rec = within(jnp.broadcast_to(ks[None, :], kq.shape)) / jnp.maximum(n[:, None], 1)
  empty = (n == 0)[:, None]
  return jnp.where(empty, jnp.nan, prec), jnp.where(empty, jnp.nan, rec)


def summarise(scores, positive, junk=None, ks: Sequence[int] = (1, 5, 10)) -> dict:
  """{'mAP', 'mP@k'..., 'recall@k'..., 'ap' (per query), 'n_queries', 'n_empty'} averaged over queries with
  at least one positive."""
  scores = jnp.asarray(scores)
  positive = jnp.asarray(positive, bool)
  junk = jnp.zeros_like(positive) if junk is None else jnp.asarray(junk, bool)
  if scores.shape != positive.shape or junk.shape != positive.shape:
    raise ValueError(f'scores {scores.shape}, positive {positive.shape} and junk {junk.shape} must match')
  ks = [int(k) for k in ks]
  ap = np.asarray(average_precision(scores, positive, junk), np.float64)
  prec, rec = (np.asarray(a, np.float64) for a in precision_recall_at(scores, positive, junk, jnp.asarray(ks)))
  valid = ~np.isnan(ap)
  mean = lambda a: float(np.mean(a[valid])) if valid.any() else float('nan')
  out = {'mAP': mean(ap)}
  for j, k in enumerate(ks):
    out[f'mP@{k}'] = mean(prec[:, j])
  for j, k in enumerate(ks):
    out[f'recall@{k}'] = mean(rec[:, j])
  out.update({'n_queries': int(len(ap)), 'n_empty': int((~valid).sum()), 'ap': ap.tolist()})
  return out


# ------------------------------------------------------------------------------------ ground truth -> masks

def index_masks(lists: Sequence[Sequence[int]], n_db: int, source: str = 'ground truth') -> np.ndarray:
  """Dense (Q, n_db) bool mask from one list of database indices per query; out-of-range indices raise."""
  out = np.zeros((len(lists), n_db), bool)
  for q, idx in enumerate(lists):
    idx = np.asarray(idx, np.int64).reshape(-1)
    if idx.size and (idx.min() < 0 or idx.max() >= n_db):
      raise ValueError(f'{source}: query {q} lists database index {int(idx.max() if idx.max() >= n_db else idx.min())} '
                       f'outside [0, {n_db})')
    out[q, idx] = True
  return out


def revisited_lists(gnd: Sequence[Mapping[str, Sequence[int]]], setting: str) -> tuple[list, list]:
  """(positives, junk) index lists per query for a revisited setting (easy | medium | hard)."""
  if setting not in REVISITED_SETTINGS:
    raise ValueError(f'revisited setting must be one of {REVISITED_SETTINGS}, got {setting!r}')
  cat = lambda g, keys: np.concatenate([np.asarray(g.get(k, []), np.int64).reshape(-1) for k in keys])
  if setting == 'easy':
    return [cat(g, ['easy']) for g in gnd], [cat(g, ['junk', 'hard']) for g in gnd]
  if setting == 'medium':
    return [cat(g, ['easy', 'hard']) for g in gnd], [cat(g, ['junk']) for g in gnd]
  return [cat(g, ['hard']) for g in gnd], [cat(g, ['junk', 'easy']) for g in gnd]


def evaluate_revisited(scores, gnd: Sequence[Mapping[str, Sequence[int]]], ks: Sequence[int] = (1, 5, 10)) -> dict:
  """{'easy': summary, 'medium': ..., 'hard': ...} for scores (Q, D) and revisited gnd (one dict per query)."""
  scores = np.asarray(scores)
  if scores.shape[0] != len(gnd):
    raise ValueError(f'scores have {scores.shape[0]} queries, ground truth {len(gnd)}')
  out = {}
  for setting in REVISITED_SETTINGS:
    pos, junk = revisited_lists(gnd, setting)
    out[setting] = summarise(scores, index_masks(pos, scores.shape[1], f'gnd ({setting})'),
                             index_masks(junk, scores.shape[1], f'gnd ({setting})'), ks)
  return out


def evaluate_classic(scores, gt: Sequence[Mapping[str, Sequence[int]]], ks: Sequence[int] = (1, 5, 10)) -> dict:
  """Classic Oxford/Paris protocol: positives = good + ok (`gt[q]['ok']` holds both), junk ignored."""
  scores = np.asarray(scores)
  if scores.shape[0] != len(gt):
    raise ValueError(f'scores have {scores.shape[0]} queries, ground truth {len(gt)}')
  pos = index_masks([g['ok'] for g in gt], scores.shape[1], 'gt (ok)')
  junk = index_masks([g.get('junk', []) for g in gt], scores.shape[1], 'gt (junk)')
  return summarise(scores, pos, junk, ks)


def label_masks(query_labels, db_labels, query_ids=None) -> tuple[np.ndarray, np.ndarray]:
  """Class-labelled retrieval: positive = same label; with query_ids (the query's own database index, -1 for
  none), the query itself is junk (leave-one-out, as for LAND5K-style 'same class is relevant')."""
  q = np.asarray(query_labels)
  d = np.asarray(db_labels)
  pos = q[:, None] == d[None, :]
  junk = np.zeros_like(pos)
  if query_ids is not None:
    ids = np.asarray(query_ids)
    rows = np.nonzero(ids >= 0)[0]
    junk[rows, ids[rows]] = True
    pos[rows, ids[rows]] = False
  return pos, junk


def leave_one_out_interval(scores, labels, ks: Sequence[int] = (1, 5, 10), **ci) -> dict:
  """mAP of a labelled set searched against itself (same label = relevant, the query itself ignored), a
  bootstrap over the queries with another image of their class (human.interval's ci options); a one-class set
  or a degenerate score matrix gives a degenerate cell (metrics/degenerate.py)."""
  from visim_jax.metrics import degenerate, human
  labels = np.asarray(labels)
  why = degenerate.labels(labels) or degenerate.matrix(scores)
  if why:
    return degenerate.result(why, len(labels))
  pos, junk = label_masks(labels, labels, np.arange(len(labels)))
  ap = np.asarray(summarise(scores, pos, junk, ks)['ap'], np.float32)
  return human.mean_interval(ap[np.isfinite(ap)], **ci)    # queries alone in their class are left out
