"""2AFC accuracy of any similarity (paper 004, Sec. 3 '2AFC' and Sec. 4.2 'CC testing').

For a triple (R, A, B) and a similarity s, the model answers 'A is closer' when s(R, A) > s(R, B). A triple
scores 1 when that answer matches the annotation, 0 when it does not, and 1/2 on an exact tie (neither
answer given; a constant similarity scores 50 %, never 100 %).

  accuracy          mean score over the T triples
  per reference     mean score over the triples sharing a reference image (the paper's per-reference
                    accuracy, the input of the credibility maps / MLP weights), with the triple counts
  degenerate        every triple tied (a constant similarity) or a NaN score: {accuracy: NaN, ...,
                    degenerate: <reason>} (metrics/degenerate.py), never a number
  bootstrap CI      percentile interval of the accuracy over `n_boot` resamples (0: none; refused below
                    degenerate.min_boot), widened to contain the accuracy. By default the
                    *references* are resampled (a cluster bootstrap: the triples of one reference are not
                    independent); unit='triplet' resamples triples.

Similarities come from a feature table (N, D) indexed by the triples' (ref, a, b) rows: cosine on backbone
features, cosine after any transform (e.g. the adaptation `lambda x: adapt(params, pca(x))`: a callable
applied once per image, not per triple), or a pair scorer `score_fn(ref_feats, cand_feats) -> scores`
(e.g. SimNet), called on batches of (ref, candidate) rows.
"""
from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from visim_jax.core import cpu_kernels
from visim_jax.metrics import degenerate
from visim_jax.core.ops import l2_normalize


def score(s_ra: jax.Array, s_rb: jax.Array, a_closer: jax.Array) -> jax.Array:
  """Per-triple 2AFC score in {0, 0.5, 1}: 1 if the similarity agrees with the annotation, 0.5 on a tie."""
  pred = jnp.sign(s_ra - s_rb)                      # +1: A closer, -1: B closer, 0: tie
  truth = jnp.where(a_closer, 1.0, -1.0)
  return 0.5 * (1.0 + pred * truth)


def default_chunk() -> int:
  """Triples per gather step: small on CPU (the gathered rows stay in cache), large on accelerators."""
  return 1024 if jax.default_backend() == 'cpu' else 65536


@functools.partial(cpu_kernels.jit, static_argnames='chunk')
def _cosine_pair_scores(feats: jax.Array, ref: jax.Array, a: jax.Array, b: jax.Array, chunk: int):
  """(cos(R, A), cos(R, B)) for rows of a feature table: normalised once per image, then gathered `chunk`
  triples at a time (bounded memory for millions of triples)."""
  f = l2_normalize(feats.astype(jnp.float32))

  def one(t):
    r = f[t[0]]
    return jnp.sum(r * f[t[1]], -1), jnp.sum(r * f[t[2]], -1)
  return jax.lax.map(one, (ref, a, b), batch_size=chunk)


def cosine_scores(feats: jax.Array, ref: jax.Array, a: jax.Array, b: jax.Array, a_closer: jax.Array,
                  chunk: int | None = None):
  """Per-triple 2AFC scores of cosine similarity on a feature table: the jitted evaluation path."""
  return _cosine_scores(feats, ref, a, b, a_closer, chunk or default_chunk())


@functools.partial(cpu_kernels.jit, static_argnames='chunk')
def _cosine_scores(feats, ref, a, b, a_closer, chunk: int):
  s_ra, s_rb = _cosine_pair_scores(feats, ref, a, b, chunk)
  return score(s_ra, s_rb, a_closer)


def transformed_scores(transform: Callable[[jax.Array], jax.Array], feats, ref, a, b, a_closer):
  """2AFC scores of cosine after `transform` (any pure function of a (N, D) batch, e.g. adapt(params, .))."""
  return cosine_scores(cpu_kernels.jit(transform)(jnp.asarray(feats)), ref, a, b, a_closer)


def pair_fn_scores(score_fn: Callable[[jax.Array, jax.Array], jax.Array], feats, ref, a, b, a_closer,
                   batch_size: int = 65536):
  """2AFC scores of a pair scorer score_fn(ref_feats (n, D), cand_feats (n, D)) -> (n,) (higher = closer).

  Evaluated in fixed-size batches (the last padded) so one compilation serves any T.
  """
  feats = jnp.asarray(feats)
  ref, a, b = (np.asarray(x) for x in (ref, a, b))
  fn = cpu_kernels.jit(lambda r, c: score_fn(feats[r], feats[c]))
  t = len(ref)
  bs = max(1, min(batch_size, t))
  s_ra, s_rb = np.empty(t, np.float32), np.empty(t, np.float32)
  for i in range(0, t, bs):
    sl = slice(i, min(i + bs, t))
    pad = bs - (sl.stop - sl.start)
    r = np.pad(ref[sl], (0, pad))
    s_ra[sl] = np.asarray(fn(r, np.pad(a[sl], (0, pad))))[:bs - pad]
    s_rb[sl] = np.asarray(fn(r, np.pad(b[sl], (0, pad))))[:bs - pad]
  return score(jnp.asarray(s_ra), jnp.asarray(s_rb), jnp.asarray(a_closer))


def group_ids(keys) -> tuple[np.ndarray, np.ndarray]:
  """(unique keys in first-appearance order, (T,) int32 group index of each triple)."""
  keys = np.asarray(keys)
  uniq, first, inv = np.unique(keys, return_index=True, return_inverse=True)
  order = np.argsort(first)
  rank = np.empty_like(order)
  rank[order] = np.arange(len(order))
  return uniq[order], rank[inv.reshape(-1)].astype(np.int32)


@functools.partial(cpu_kernels.jit, static_argnums=2)
def per_group_mean(scores: jax.Array, groups: jax.Array, n_groups: int):
  """(mean score per group (..., G), count per group (G,)); scores (..., T), groups (T,)."""
  scores = jnp.asarray(scores, jnp.float32)
  counts = jax.ops.segment_sum(jnp.ones(groups.shape, jnp.float32), groups, n_groups)
  sums = jax.vmap(lambda s: jax.ops.segment_sum(s, groups, n_groups))(scores.reshape(-1, scores.shape[-1]))
  sums = sums.reshape(scores.shape[:-1] + (n_groups,))
  return sums / jnp.maximum(counts, 1.0), counts


@functools.partial(cpu_kernels.jit, static_argnums=2)
def _boot_triplets(key, scores, n_boot: int):
  t = scores.shape[0]
  return jax.vmap(lambda k: scores[jax.random.randint(k, (t,), 0, t)].mean())(jax.random.split(key, n_boot))


@functools.partial(cpu_kernels.jit, static_argnums=(3, 4))
def _boot_groups(key, scores, groups, n_groups: int, n_boot: int):
  sums = jax.ops.segment_sum(scores, groups, n_groups)
  counts = jax.ops.segment_sum(jnp.ones_like(scores), groups, n_groups)

  def one(k):
    w = jnp.bincount(jax.random.randint(k, (n_groups,), 0, n_groups), length=n_groups).astype(jnp.float32)
    return (w * sums).sum() / jnp.maximum((w * counts).sum(), 1.0)   # w: each group's multiplicity
  return jax.vmap(one)(jax.random.split(key, n_boot))


def bootstrap_ci(scores, groups=None, n_boot: int = 1000, alpha: float = 0.05, seed: int = 0,
                 unit: str = 'reference') -> tuple[float, float]:
  """Percentile (1 - alpha) interval of the mean score (containing it). unit='reference' resamples groups
  (needs groups)."""
  _check_n_boot(n_boot, alpha)
  scores = jnp.asarray(scores, jnp.float32)
  key = jax.random.PRNGKey(seed)
  if unit == 'triplet' or groups is None:
    boot = _boot_triplets(key, scores, int(n_boot))
  elif unit == 'reference':
    groups = np.asarray(groups)
    boot = _boot_groups(key, scores, jnp.asarray(groups), int(groups.max()) + 1, int(n_boot))
  else:
    raise ValueError(f"bootstrap unit must be 'reference' or 'triplet', got {unit!r}")
  lo, hi = np.quantile(np.asarray(boot), [alpha / 2, 1 - alpha / 2])
  return degenerate.contain(float(scores.mean()), float(lo), float(hi))


def _check_n_boot(n_boot: int, alpha: float) -> None:
  if int(n_boot) and int(n_boot) < degenerate.min_boot(alpha):
    raise ValueError(f'n_boot={n_boot}: use 0 (no interval) or >= {degenerate.min_boot(alpha)}')


@functools.partial(cpu_kernels.jit, static_argnums=(3, 4))
def _boot_groups_many(key, scores, groups, n_groups: int, n_boot: int):
  return jax.vmap(lambda s: _boot_groups(key, s, groups, n_groups, n_boot))(scores)


def summaries(scores, refs, n_boot: int = 1000, alpha: float = 0.05, seed: int = 0, unit: str = 'references') -> list:
  """summary() of M score vectors over the same triples at once, (M, T) -> M dicts (one compiled program).

  Every vector is resampled with the same cluster draws (seed), like M separate summary() calls. A degenerate
  vector (every triple tied, NaN scores) gets accuracy NaN and `degenerate: <reason>`; intervals contain the
  accuracy.
  """
  _check_n_boot(n_boot, alpha)
  scores = np.asarray(scores, np.float32)
  uniq, groups = group_ids(refs)
  per_ref, _ = per_group_mean(scores, jnp.asarray(groups), len(uniq))
  if n_boot > 0:
    boot = np.asarray(_boot_groups_many(jax.random.PRNGKey(seed), jnp.asarray(scores), jnp.asarray(groups),
                                        len(uniq), int(n_boot)))
    lo, hi = np.quantile(boot, [alpha / 2, 1 - alpha / 2], axis=1)
  else:
    lo = hi = np.full(len(scores), np.nan)
  per_ref = np.asarray(per_ref).mean(-1)
  out = []
  for i, x in enumerate(scores):
    acc = float(x.mean())
    low, high = degenerate.contain(acc, float(lo[i]), float(hi[i]))
    d = {'accuracy': acc, 'n_triplets': int(x.size), 'n_references': int(len(uniq)),
         'per_reference_mean': float(per_ref[i]), 'ci_low': low, 'ci_high': high,
         'ci': f'{100 * (1 - alpha):g}% percentile bootstrap over {unit} ({n_boot} resamples)'}
    why = degenerate.twoafc_scores(x)
    if why:
      d.update(accuracy=float('nan'), per_reference_mean=float('nan'), ci_low=float('nan'), ci_high=float('nan'),
               degenerate=why)
    out.append(d)
  return out


def summary(scores, refs, n_boot: int = 1000, alpha: float = 0.05, seed: int = 0, unit: str = 'references') -> dict:
  """{accuracy, n_triplets, n_references, per_reference_mean, ci_low, ci_high, ci} of per-triple scores.

  `refs` are the cluster keys the bootstrap resamples: the reference images (mulref sets), or the annotation
  rows of a context set (one reference; a row's three triples share their candidates), named by `unit`.
  """
  return summaries(np.asarray(scores, np.float32)[None], refs, n_boot, alpha, seed, unit)[0]


class Summaries:
  """acc = Summaries(...); acc(scores, triplets, unit, **extra) -> a dict that acc.fill() completes with the
  summary() of the scores: every vector over the same triplets (a `Triplets`; unit 'references' resamples its
  references, 'rows' its annotation rows) is bootstrapped together, one compiled program per evaluation set."""

  def __init__(self, n_boot: int = 1000, level: float = 0.95, seed: int = 0):
    self.n_boot, self.level, self.seed, self.items = n_boot, level, seed, []

  def __call__(self, scores, t, unit: str = 'references', **extra) -> dict:
    d = dict(extra)
    self.items.append((d, np.asarray(scores, np.float32), t, unit))
    return d

  def fill(self) -> None:
    groups = {}
    for item in self.items:
      groups.setdefault((id(item[2]), item[3]), []).append(item)
    for (_, unit), items in groups.items():
      t = items[0][2]
      res = summaries(np.stack([x[1] for x in items]), t.ref if unit == 'references' else t.line, self.n_boot,
                      1 - self.level, self.seed, unit)
      for (d, *_), r in zip(items, res):
        d.update(r)
    self.items = []
