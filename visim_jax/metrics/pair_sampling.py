"""The random-pair estimator of the per-class similarity histograms (paper 003, Sec. 3.1: "we apply random sampling
to get sample pairs and utilize a histogram from -1 to 1 with 100 bins").

For every class y, `n_pairs` intra pairs (two distinct samples of y, uniform, with replacement) and `n_pairs`
inter pairs (a sample of y with a sample of any other kept class, uniform) are drawn on the device; the cosine
of a pair is a dot product of two gathered rows of the prepared features; counts are accumulated per class by a
segment sum (vmapped over classes, no Python loop per class) inside a lax.scan over rounds of pairs, so memory is
one round (about chunk_elems floats per side) whatever the number of samples. The inter draws also give the
counts per ordered pair of classes (y, partner class), from which the pairwise maximal overlap is estimated.

Pure: arrays in, arrays out; `group_by_class` builds the host-side index. The exact alternative (every pair) is
visim_jax/metrics/blocked_histograms.py.
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from visim_jax.core import cpu_kernels
from visim_jax.metrics.bins import NUM_BINS, bin_index


class ClassIndex(NamedTuple):
  """Samples grouped by class. order[starts[c]:starts[c] + counts[c]] are the rows of class c (indices into the
  feature matrix) and cls[p] is the class of position p; `total` = counts.sum(). order is padded (with row 0,
  never drawn) and classes may be padded with count 0 so that shapes fall into few buckets (few compilations)."""
  order: np.ndarray   # (M,) int32
  starts: np.ndarray  # (C,) int32
  counts: np.ndarray  # (C,) int32
  cls: np.ndarray     # (M,) int32
  total: np.ndarray   # () int32


def bucket(n: int, minimum: int = 8) -> int:
  """The next power of two >= n (and >= minimum): padded sizes that keep the number of compilations small."""
  return max(minimum, 1 << max(0, math.ceil(math.log2(max(n, 1)))))


def group_by_class(labels: np.ndarray, num_classes: int, pad: bool = True) -> ClassIndex:
  """ClassIndex of integer labels in [0, num_classes); label -1 means 'leave this sample out'."""
  labels = np.asarray(labels)
  keep = np.flatnonzero(labels >= 0)
  order = keep[np.argsort(labels[keep], kind='stable')].astype(np.int32)
  counts = np.bincount(labels[keep], minlength=num_classes).astype(np.int32)[:num_classes]
  starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int32)
  cls = np.asarray(labels[order], np.int32)
  if pad:
    m, c = bucket(len(order)), bucket(num_classes, 2)
    order = np.concatenate([order, np.zeros(m - len(order), np.int32)])
    cls = np.concatenate([cls, np.zeros(m - len(cls), np.int32)])
    starts = np.concatenate([starts, np.full(c - num_classes, len(keep), np.int32)])
    counts = np.concatenate([counts, np.zeros(c - num_classes, np.int32)])
  return ClassIndex(order, starts, counts, cls, np.asarray(len(keep), np.int32))


def _draw_class_pairs(key, start, count, total, n: int, kind: str):
  """n random pairs of one class as positions into ClassIndex.order: (a, b), each (n,)."""
  ka, kb = jax.random.split(key)
  ia = jax.random.randint(ka, (n,), 0, jnp.maximum(count, 1))
  if kind == 'intra':  # b != a, uniform over the other count - 1 samples of the class
    ib = (ia + jax.random.randint(kb, (n,), 1, jnp.maximum(count, 2))) % jnp.maximum(count, 1)
    return start + ia, start + ib
  # inter: b uniform over the total - count samples outside the class's block
  r = jax.random.randint(kb, (n,), 0, jnp.maximum(total - count, 1))
  return start + ia, jnp.where(r < start, r, r + count)


def draw_pairs(key, index: ClassIndex, n: int, kind: str, round_: int = 0):
  """The pairs random_pair_histograms uses in round `round_` (n per class): positions (a, b), each (C, n).

  Exposed so that tests and references can recompute the same pairs elsewhere."""
  starts, counts = jnp.asarray(index.starts), jnp.asarray(index.counts)
  keys = jax.random.split(jax.random.fold_in(key, round_), starts.shape[0])
  return jax.vmap(_draw_class_pairs, in_axes=(0, 0, 0, None, None, None))(
      keys, starts, counts, jnp.asarray(index.total), n, kind)


def class_is_valid(index: ClassIndex, kind: str) -> jax.Array:
  counts = jnp.asarray(index.counts)
  return counts >= 2 if kind == 'intra' else (counts >= 1) & (jnp.asarray(index.total) - counts >= 1)


def _pair_similarity(x, order, a, b):
  """Cosine of rows order[a], order[b] (x is L2-normalised): float32, any leading shape."""
  get = lambda arr, i: arr.at[i].get(mode='promise_in_bounds')  # every index is in range by construction
  xa = get(x, get(order, a)).astype(jnp.float32)
  xb = get(x, get(order, b)).astype(jnp.float32)
  return jnp.sum(xa * xb, axis=-1)


def default_chunk_elems() -> int:
  """Floats gathered per side per round: small on CPU (the round stays in cache), large on accelerators."""
  return 1 << 19 if jax.default_backend() == 'cpu' else 1 << 26


def per_round(num_classes: int, dim: int, n_pairs: int, chunk_elems: int = 0) -> int:
  """Pairs per class per round so that one round gathers about chunk_elems (0: default) floats per side."""
  chunk_elems = chunk_elems or default_chunk_elems()
  return int(max(1, min(n_pairs, chunk_elems // max(1, num_classes * dim))))


@functools.partial(cpu_kernels.jit, static_argnames=('n_pairs', 'kind', 'bins', 'round_size', 'pairwise'))
def random_pair_histograms(x, index: ClassIndex, key, *, n_pairs: int, kind: str, bins: int = NUM_BINS,
                           round_size: int = 64, pairwise: bool = False):
  """(C, bins) int32 counts of `n_pairs` random `kind` ('intra' | 'inter') pairs per class.

  x: (N, D) L2-normalised features (any dtype; sums in float32), possibly sharded along N. A lax.scan over
  ceil(n_pairs / round_size) rounds; each round draws round_size pairs for every class (vmapped over classes),
  gathers both rows, and adds a per-class segment sum of the bin indices. Classes without a valid pair
  (intra: < 2 samples; inter: no other class) get zero counts. With pairwise=True (inter only) also returns the
  (C, C, bins) counts of the same pairs by (class, partner's class).
  """
  if kind not in ('intra', 'inter'):
    raise ValueError(f'kind: {kind!r}')
  if pairwise and kind != 'inter':
    raise ValueError('pairwise counts come from inter pairs')
  index = ClassIndex(*(jnp.asarray(a) for a in index))
  num_classes = index.starts.shape[0]
  rounds = -(-n_pairs // round_size)
  ok = class_is_valid(index, kind)

  def body(carry, r):
    hist, pair = carry
    a, b = draw_pairs(key, index, round_size, kind, r)
    s = _pair_similarity(x, index.order, a, b)
    valid = (((r * round_size + jnp.arange(round_size)) < n_pairs)[None, :] & ok[:, None]).astype(jnp.int32)
    bi = bin_index(s, bins)
    hist = hist + jax.vmap(lambda bb, vv: jax.ops.segment_sum(vv, bb, bins))(bi, valid)
    if pairwise:
      partner = index.cls.at[b].get(mode='promise_in_bounds')
      seg = (jnp.arange(num_classes)[:, None] * num_classes + partner) * bins + bi
      pair = pair + jax.ops.segment_sum(valid.ravel(), seg.ravel(), num_classes * num_classes * bins)
    return (hist, pair), None

  pair0 = jnp.zeros((num_classes * num_classes * bins if pairwise else 0,), jnp.int32)
  (hist, pair), _ = jax.lax.scan(body, (jnp.zeros((num_classes, bins), jnp.int32), pair0), jnp.arange(rounds))
  if pairwise:
    return hist, pair.reshape(num_classes, num_classes, bins)
  return hist
