"""Histogram metrics of a representation: overlap and aSTD (paper 003: Wu et al., "Beyond Accuracy").

Definitions (paper Sec. 3, Eqs. 1-4; Sec. 9.1 normalisation; Sec. 9.2 maximal overlap):

* Features are standardised first (Sec. 9.1): 'none', 'target' (mean/std per dimension of the evaluated set
  itself: the paper's default) or 'source' (a given mean/std). The similarity is the cosine in [-1, 1], so
  rows are L2-normalised after standardisation and a similarity is a dot product.
* Per class y, intra pairs (Eq. 1) are two distinct samples of y; inter pairs (Eq. 2) are a sample of y with a
  sample of another class. Their similarities are histogrammed over NUM_BINS=100 equal bins on [-1, 1] and
  normalised to probabilities p+(b|y), p-(b|y). Bin b holds s with floor((s + 1) / 2 * 100) == b; s = 1 goes
  to the last bin (as np.histogram does).
* overlap (Eq. 3): O = 1/N sum_y sum_b min(p+(b|y), p-(b|y)); 1 for identical distributions, 0 for disjoint ones.
* maximal overlap (Sec. 9.2): the worst class, max_y O_y (see "readings" below).
* aSTD (Eq. 4), once for the inter and once for the intra distributions (the paper reports inter by default).
* kNN accuracy (k=10, Sec. 3.4) beside them: leave-one-out majority vote among the k most similar other
  samples (cosine on the same standardised features); ties go to the class with the larger summed similarity.

Readings of the ambiguities (chosen here, tested in tests/test_histograms.py):

1. aSTD. Eq. 4 as printed is the standard deviation of the class-averaged distribution p(s) = 1/N sum_y p(s|y)
   around its mean, but the text calls aSTD "the average deviation of distributions across different classes",
   "an indicator of the disparity among similarity distributions", which must vanish when every class has the
   same distribution (and the issue asks exactly that). We read Eq. 4 as: mu_y = sum_b p(b|y) MEAN(b) is each
   class's mean similarity (Eq. 4's mu applied to p(s|y)), mu = sum_b p(b) MEAN(b) = 1/N sum_y mu_y (Eq. 4's mu
   on the class average), and aSTD = sqrt(1/N sum_y (mu_y - mu)^2): the spread of the class distributions
   across classes. The literal Eq. 4 value (std of the pooled distribution) is reported too as `pooled_std`.
2. Maximal overlap. Sec. 9.2 contrasts "the average overlap of one cluster to other clusters" with the worst
   case; we report max over classes of the per-class overlap O_y (with the same pairs as the average).
3. Pairs. Intra pairs are unordered pairs of distinct samples; inter pairs of class y are (sample of y, sample
   of any other kept class). Random mode draws, for every class, `n_pairs` pairs uniformly with replacement
   (ordered intra pairs i != j: the same law on unordered pairs); exhaustive mode takes every pair once.
   Classes with fewer than two samples are dropped entirely (not evaluated, not used as inter partners nor
   as kNN neighbours); the caller reports how many.
4. Hierarchies (Sec. 4): for a node of a class tree, its clusters are its children, each holding the samples of
   every class in the child's subtree (the child included). Samples labelled with the node itself, and in a
   DAG samples reachable from two children of the node, are left out of that node. A node's level is its
   shortest distance (edges) from a root of the tree (a root is level 0).

Implementation: the similarity of a pair is computed on the fly from a gather of its two rows; histograms are
accumulated per class with a segment sum (vmapped over classes, no Python loop per class) inside a lax.scan
over rounds of pairs, so memory is bounded by one round (chunk_elems floats) whatever the number of samples.
Features may be sharded along the sample axis (jax.sharding.NamedSharding over a Mesh): the jitted functions
take them as they come, and `shard_samples` lays them out. Everything here is pure (arrays in, arrays out);
host-side helpers build index arrays with NumPy.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Iterable, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

NUM_BINS = 100
NORMALIZATIONS = ('none', 'target', 'source')
PAIR_MODES = ('auto', 'random', 'exhaustive')


# ------------------------------------------------------------------------------------------ features

def standardize(x: jax.Array, mode: str = 'target', mean=None, std=None, eps: float = 1e-6) -> jax.Array:
  """Sec. 9.1: 'none' | 'target' (this set's per-dimension mean/std) | 'source' (the given mean/std)."""
  x = jnp.asarray(x, jnp.float32)
  if mode == 'none':
    return x
  if mode == 'target':
    mean, std = x.mean(0), x.std(0)
  elif mode == 'source':
    if mean is None or std is None:
      raise ValueError("normalization='source' needs the source mean and std")
    mean, std = jnp.asarray(mean, jnp.float32), jnp.asarray(std, jnp.float32)
    if mean.shape != x.shape[1:] or std.shape != x.shape[1:]:
      raise ValueError(f'source mean/std shapes {mean.shape}/{std.shape} do not match feature dim {x.shape[1:]}')
  else:
    raise ValueError(f'normalization: {mode!r} is not one of {NORMALIZATIONS}')
  return (x - mean) / jnp.maximum(std, eps)


def l2_normalize(x: jax.Array, eps: float = 1e-12) -> jax.Array:
  x = jnp.asarray(x, jnp.float32)
  return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), eps)


@functools.partial(jax.jit, static_argnames=('mode',))
def prepare(x, mode: str = 'target', mean=None, std=None):
  """Standardise then L2-normalise: rows whose dot products are the cosine similarities of the paper."""
  return l2_normalize(standardize(x, mode, mean, std))


def bin_index(s: jax.Array, bins: int = NUM_BINS) -> jax.Array:
  """Bin of a similarity among `bins` equal bins on [-1, 1] (values outside are clipped)."""
  return jnp.clip(jnp.floor((s + 1.0) * (bins / 2.0)), 0, bins - 1).astype(jnp.int32)


def bin_centers(bins: int = NUM_BINS) -> np.ndarray:
  """MEAN(b) of Eq. 4: the centre of each bin."""
  return (-1.0 + (np.arange(bins) + 0.5) * 2.0 / bins).astype(np.float32)


# --------------------------------------------------------------------------- grouping samples by class

class ClassIndex(NamedTuple):
  """Samples grouped by class. order[starts[c]:starts[c] + counts[c]] are the rows of class c (indices into the
  feature matrix); `total` = counts.sum(); order is padded (with row 0, never drawn) and classes may be padded
  with count 0 so that shapes fall into few buckets (few compilations)."""
  order: np.ndarray   # (M,) int32
  starts: np.ndarray  # (C,) int32
  counts: np.ndarray  # (C,) int32
  total: np.ndarray   # () int32


def _bucket(n: int, minimum: int = 8) -> int:
  return max(minimum, 1 << max(0, math.ceil(math.log2(max(n, 1)))))


def group_by_class(labels: np.ndarray, num_classes: int, pad: bool = True) -> ClassIndex:
  """ClassIndex of integer labels in [0, num_classes); label -1 means 'leave this sample out'."""
  labels = np.asarray(labels)
  keep = np.flatnonzero(labels >= 0)
  order = keep[np.argsort(labels[keep], kind='stable')].astype(np.int32)
  counts = np.bincount(labels[keep], minlength=num_classes).astype(np.int32)[:num_classes]
  starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int32)
  if pad:
    m, c = _bucket(len(order)), _bucket(num_classes, 2)
    order = np.concatenate([order, np.zeros(m - len(order), np.int32)])
    starts = np.concatenate([starts, np.full(c - num_classes, len(keep), np.int32)])
    counts = np.concatenate([counts, np.zeros(c - num_classes, np.int32)])
  return ClassIndex(order, starts, counts, np.asarray(len(keep), np.int32))


def exhaustive_pair_counts(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Per class: number of unordered intra pairs and of inter pairs (a sample of the class with any other)."""
  counts = np.asarray(counts, np.int64)
  return counts * (counts - 1) // 2, counts * (counts.sum() - counts)


# --------------------------------------------------------------------------------------- random pairs

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


@functools.partial(jax.jit, static_argnames=('n_pairs', 'kind', 'bins', 'round_size'))
def random_pair_histograms(x, index: ClassIndex, key, *, n_pairs: int, kind: str, bins: int = NUM_BINS,
                           round_size: int = 64):
  """(C, bins) int32 counts of `n_pairs` random `kind` ('intra' | 'inter') pairs per class.

  x: (N, D) L2-normalised features (any dtype; sums in float32), possibly sharded along N. A lax.scan over
  ceil(n_pairs / round_size) rounds; each round draws round_size pairs for every class (vmapped over classes),
  gathers both rows, and adds a per-class segment sum of the bin indices. Classes without a valid pair
  (intra: < 2 samples; inter: no other class) get zero counts.
  """
  if kind not in ('intra', 'inter'):
    raise ValueError(f'kind: {kind!r}')
  index = ClassIndex(*(jnp.asarray(a) for a in index))
  num_classes = index.starts.shape[0]
  rounds = -(-n_pairs // round_size)
  ok = class_is_valid(index, kind)

  def body(hist, r):
    a, b = draw_pairs(key, index, round_size, kind, r)
    s = _pair_similarity(x, index.order, a, b)
    valid = ((r * round_size + jnp.arange(round_size)) < n_pairs)[None, :] & ok[:, None]
    add = jax.vmap(lambda bb, vv: jax.ops.segment_sum(vv.astype(jnp.int32), bb, bins))(bin_index(s, bins), valid)
    return hist + add, None

  hist, _ = jax.lax.scan(body, jnp.zeros((num_classes, bins), jnp.int32), jnp.arange(rounds))
  return hist


# ----------------------------------------------------------------------------------- exhaustive pairs

def exhaustive_pairs(index: ClassIndex, kind: str, num_classes: int | None = None):
  """Every pair once, as positions into index.order: (a, b, class) int32 arrays (host NumPy)."""
  counts = np.asarray(index.counts)
  starts = np.asarray(index.starts)
  total = int(index.total)
  c_real = num_classes if num_classes is not None else len(counts)
  out_a, out_b, out_c = [], [], []
  for c in range(c_real):
    n, s = int(counts[c]), int(starts[c])
    if kind == 'intra':
      if n < 2:
        continue
      i, j = np.triu_indices(n, 1)
      out_a.append(s + i)
      out_b.append(s + j)
      out_c.append(np.full(len(i), c))
    else:
      if n < 1 or total - n < 1:
        continue
      others = np.concatenate([np.arange(0, s), np.arange(s + n, total)])
      out_a.append(np.repeat(np.arange(s, s + n), len(others)))
      out_b.append(np.tile(others, n))
      out_c.append(np.full(n * len(others), c))
  cat = lambda xs: np.concatenate(xs).astype(np.int32) if xs else np.zeros(0, np.int32)
  return cat(out_a), cat(out_b), cat(out_c)


@functools.partial(jax.jit, static_argnames=('num_classes', 'bins', 'chunk'))
def listed_pair_histograms(x, order, a, b, cls, n_valid, *, num_classes: int, bins: int = NUM_BINS,
                           chunk: int = 4096):
  """(num_classes, bins) int32 counts of the listed pairs (positions a, b into order; class cls).

  Only the first n_valid entries count (the arrays are padded to a multiple of chunk). A lax.scan over
  chunks keeps memory at one chunk; the segment sum runs over the flat (class, bin) index.
  """
  n = a.shape[0]
  if n % chunk:
    raise ValueError(f'pair arrays of length {n} are not a multiple of chunk={chunk}')
  resh = lambda v: v.reshape(n // chunk, chunk)
  idx = jnp.arange(n).reshape(n // chunk, chunk)

  def body(hist, xs):
    ca, cb, cc, ci = xs
    s = _pair_similarity(x, order, ca, cb)
    seg = cc * bins + bin_index(s, bins)
    return hist + jax.ops.segment_sum((ci < n_valid).astype(jnp.int32), seg, num_classes * bins), None

  hist, _ = jax.lax.scan(body, jnp.zeros((num_classes * bins,), jnp.int32), (resh(a), resh(b), resh(cls), idx))
  return hist.reshape(num_classes, bins)


def exhaustive_histograms(x, index: ClassIndex, kind: str, num_classes: int, bins: int = NUM_BINS,
                          chunk: int = 4096) -> jax.Array:
  a, b, c = exhaustive_pairs(index, kind, num_classes)
  n = len(a)
  padded = _bucket(-(-max(n, 1) // chunk), 1) * chunk  # power-of-two number of chunks: few compilations
  pad = lambda v: np.concatenate([v, np.zeros(padded - n, np.int32)])
  c_pad = len(index.counts)
  return listed_pair_histograms(x, jnp.asarray(index.order), pad(a), pad(b), pad(c), np.int32(n),
                                num_classes=c_pad, bins=bins, chunk=chunk)


@functools.partial(jax.jit, static_argnames=('num_classes', 'bins'))
def similarity_histograms(s, cls, *, num_classes: int, bins: int = NUM_BINS):
  """(num_classes, bins) counts of given similarities s with class ids cls (a segment sum)."""
  return jax.ops.segment_sum(jnp.ones_like(cls, jnp.int32), cls * bins + bin_index(s, bins),
                             num_classes * bins).reshape(num_classes, bins)


# -------------------------------------------------------------------------------------- the metrics

def to_probabilities(hist: jax.Array) -> jax.Array:
  hist = jnp.asarray(hist, jnp.float32)
  return hist / jnp.maximum(hist.sum(-1, keepdims=True), 1.0)


def class_overlap(p_intra: jax.Array, p_inter: jax.Array) -> jax.Array:
  """Eq. 3 inner sum per class: sum_b min(p+(b|y), p-(b|y)); (..., B) -> (...)."""
  return jnp.minimum(p_intra, p_inter).sum(-1)


def class_moments(p: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Eq. 4's mu and sigma of each distribution (bin centres as values): (..., B) -> (mean, std)."""
  c = jnp.asarray(bin_centers(p.shape[-1]))
  mu = (p * c).sum(-1)
  return mu, jnp.sqrt(jnp.maximum((p * (c - mu[..., None]) ** 2).sum(-1), 0.0))


def astd(p: jax.Array, valid: jax.Array) -> jax.Array:
  """aSTD over the valid classes (reading 1 in the module docstring): spread of the class means mu_y."""
  w = valid.astype(jnp.float32) / jnp.maximum(valid.sum(), 1)
  mu_y, _ = class_moments(p)
  mu = (w * mu_y).sum()
  return jnp.sqrt((w * (mu_y - mu) ** 2).sum())


def pooled_std(p: jax.Array, valid: jax.Array) -> jax.Array:
  """Eq. 4 as printed: sigma of the class-averaged distribution p(s) = 1/N sum_y p(s|y)."""
  w = valid.astype(jnp.float32) / jnp.maximum(valid.sum(), 1)
  return class_moments((w[:, None] * p).sum(0))[1]


@jax.jit
def histogram_metrics(hist_intra, hist_inter, valid):
  """Every metric from the (C, B) count histograms of the valid classes (a (C,) bool mask).

  Returns a dict of arrays: per class `overlap`, `mean_intra`, `std_intra`, `mean_inter`, `std_inter`;
  scalars `overlap` (Eq. 3: mean over valid classes), `max_overlap` (Sec. 9.2), `astd_inter`, `astd_intra`
  (Eq. 4, reading 1), `pooled_std_inter`, `pooled_std_intra` (Eq. 4 literal).
  """
  p_in, p_out = to_probabilities(hist_intra), to_probabilities(hist_inter)
  ov = class_overlap(p_in, p_out)
  n = jnp.maximum(valid.sum(), 1)
  mi, si = class_moments(p_in)
  mo, so = class_moments(p_out)
  return {
      'class_overlap': ov, 'class_mean_intra': mi, 'class_std_intra': si, 'class_mean_inter': mo,
      'class_std_inter': so,
      'overlap': jnp.where(valid, ov, 0.0).sum() / n,
      'max_overlap': jnp.where(valid, ov, -jnp.inf).max(),
      'astd_inter': astd(p_out, valid), 'astd_intra': astd(p_in, valid),
      'pooled_std_inter': pooled_std(p_out, valid), 'pooled_std_intra': pooled_std(p_in, valid),
  }


# ------------------------------------------------------------------------------------------------ kNN

@functools.partial(jax.jit, static_argnames=('k', 'num_classes', 'db_chunk', 'precision'))
def knn_predict(x, labels, queries, *, k: int = 10, num_classes: int, db_chunk: int = 8192,
                precision: str = 'highest'):
  """Leave-one-out kNN class of each query row (indices into x), among rows with label >= 0.

  x: (N, D) L2-normalised, N a multiple of db_chunk (pad with label -1). A scan over database chunks keeps a
  running top-k (values, labels) per query: memory (Q, db_chunk). Majority vote; ties go to the class with
  the larger summed similarity. Returns (Q,) int32 predictions.
  """
  n = x.shape[0]
  if n % db_chunk:
    raise ValueError(f'x has {n} rows, not a multiple of db_chunk={db_chunk}')
  xq = jnp.take(x, queries, axis=0).astype(jnp.float32)
  q = queries.shape[0]

  def body(carry, start):
    vals, labs = carry
    xd = jax.lax.dynamic_slice_in_dim(x, start, db_chunk).astype(jnp.float32)
    ld = jax.lax.dynamic_slice_in_dim(labels, start, db_chunk)
    s = jnp.matmul(xq, xd.T, precision=precision)
    rows = start + jnp.arange(db_chunk)
    s = jnp.where((ld[None, :] >= 0) & (rows[None, :] != queries[:, None]), s, -jnp.inf)
    kk = min(k, db_chunk)
    cv, ci = jax.lax.top_k(s, kk)
    allv = jnp.concatenate([vals, cv], 1)
    alll = jnp.concatenate([labs, jnp.take(ld, ci)], 1)
    tv, ti = jax.lax.top_k(allv, k)
    return (tv, jnp.take_along_axis(alll, ti, 1)), None

  init = (jnp.full((q, k), -jnp.inf, jnp.float32), jnp.full((q, k), -1, labels.dtype))
  (vals, labs), _ = jax.lax.scan(body, init, jnp.arange(0, n, db_chunk))
  found = jnp.isfinite(vals)
  onehot = jax.nn.one_hot(jnp.where(found, labs, -1), num_classes)  # -1 -> all zeros
  votes = onehot.sum(1)
  simsum = (onehot * jnp.where(found, vals, 0.0)[..., None]).sum(1)  # in [-k, k]
  return jnp.argmax(votes + (simsum + k) / (2 * k + 1), -1).astype(jnp.int32)  # tie-break term in [0, 1)


def knn_accuracy(x: jax.Array, labels: np.ndarray, num_classes: int, k: int = 10, queries: int = 0,
                 seed: int = 0, db_chunk: int = 8192, query_chunk: int = 1024):
  """Leave-one-out kNN accuracy over `queries` random samples (0: all) with label >= 0.

  Returns (accuracy, per-class accuracy (C,) with NaN for classes without a query)."""
  labels = np.asarray(labels, np.int32)
  n = x.shape[0]
  eligible = np.flatnonzero(labels >= 0)
  if queries and queries < len(eligible):
    eligible = np.sort(np.random.default_rng(seed).choice(eligible, queries, replace=False))
  db_chunk = int(min(db_chunk, _bucket(n)))
  n_pad = -(-n // db_chunk) * db_chunk
  if n_pad != n:
    x = jnp.concatenate([x, jnp.zeros((n_pad - n, x.shape[1]), x.dtype)])
  lab = jnp.asarray(np.concatenate([labels, np.full(n_pad - n, -1, np.int32)]))
  preds = []
  q_chunk = int(min(query_chunk, _bucket(len(eligible))))
  for s in range(0, len(eligible), q_chunk):
    qi = eligible[s:s + q_chunk]
    pad = np.concatenate([qi, np.full(q_chunk - len(qi), qi[0])]).astype(np.int32)
    preds.append(np.asarray(knn_predict(x, lab, jnp.asarray(pad), k=k, num_classes=num_classes,
                                        db_chunk=db_chunk))[:len(qi)])
  pred = np.concatenate(preds) if preds else np.zeros(0, np.int32)
  truth = labels[eligible]
  correct = pred == truth
  per_class = np.full(num_classes, np.nan)
  tot = np.bincount(truth, minlength=num_classes)
  hit = np.bincount(truth, weights=correct, minlength=num_classes)
  per_class[tot > 0] = hit[tot > 0] / tot[tot > 0]
  return float(correct.mean()) if len(correct) else float('nan'), per_class


# ----------------------------------------------------------------------------------- the evaluation

@dataclasses.dataclass(frozen=True)
class Options:
  """How pairs are drawn and what is computed. n_intra / n_inter: random pairs per class; mode 'auto' takes
  every pair of a kind when that kind has at most `exhaustive_max` pairs in all, else draws at random."""
  n_intra: int = 10_000
  n_inter: int = 10_000
  mode: str = 'auto'
  exhaustive_max: int = 2_000_000
  seed: int = 0
  bins: int = NUM_BINS
  chunk_elems: int = 0        # floats gathered per side per round (memory bound); 0: default_chunk_elems()
  knn_k: int = 10             # 0: no kNN
  knn_queries: int = 10_000   # 0: every sample is a query

  def validate(self):
    if self.mode not in PAIR_MODES:
      raise ValueError(f'pairs.mode: {self.mode!r} is not one of {PAIR_MODES}')
    if self.chunk_elems < 0:
      raise ValueError(f'chunk_elems: must be >= 0 (0: automatic), got {self.chunk_elems}')
    for f in ('n_intra', 'n_inter', 'bins'):
      if getattr(self, f) < 1:
        raise ValueError(f'{f}: must be >= 1, got {getattr(self, f)}')
    if self.knn_k < 0 or self.knn_queries < 0:
      raise ValueError('knn_k and knn_queries must be >= 0')


def check_inputs(features, labels, source: str = 'features') -> tuple[np.ndarray, np.ndarray]:
  """Shapes, NaN and label checks with messages that name the source."""
  labels = np.asarray(labels)
  if getattr(features, 'ndim', None) != 2:
    raise ValueError(f'{source}: features must be a 2-D (samples, dim) array, got shape {np.shape(features)}')
  if labels.ndim != 1:
    raise ValueError(f'{source}: labels must be 1-D, got shape {labels.shape}')
  if features.shape[0] != labels.shape[0]:
    raise ValueError(f'{source}: {features.shape[0]} feature rows but {labels.shape[0]} labels; they must match')
  if not np.issubdtype(labels.dtype, np.integer):
    raise ValueError(f'{source}: labels must be integers, got dtype {labels.dtype}')
  bad = np.flatnonzero(~np.isfinite(np.asarray(features, np.float32)).all(1))
  if len(bad):
    raise ValueError(f'{source}: {len(bad)} feature rows hold NaN/Inf (first rows: {bad[:5].tolist()})')
  return np.asarray(features), labels.astype(np.int64)


def keep_classes(labels: np.ndarray, num_classes: int, min_samples: int = 2):
  """Labels with classes of fewer than min_samples set to -1: (labels, kept mask (C,), skipped count)."""
  counts = np.bincount(labels[labels >= 0], minlength=num_classes)[:num_classes]
  kept = counts >= min_samples
  out = np.where((labels >= 0) & kept[np.clip(labels, 0, num_classes - 1)], labels, -1)
  return out, kept, int(((counts > 0) & ~kept).sum())


def shard_samples(x: jax.Array, mesh: jax.sharding.Mesh, axis: str = 'data') -> jax.Array:
  """x laid out along its sample axis over mesh axis `axis` (rows padded with zeros to a multiple of it)."""
  from jax.sharding import NamedSharding, PartitionSpec as P
  d = mesh.shape[axis]
  n = x.shape[0]
  if n % d:
    x = jnp.concatenate([jnp.asarray(x), jnp.zeros((d - n % d,) + x.shape[1:], x.dtype)])
  return jax.device_put(x, NamedSharding(mesh, P(axis, None)))


def class_histograms(x: jax.Array, labels: np.ndarray, num_classes: int, opts: Options = Options()):
  """Intra and inter (C, bins) count histograms of prepared features x (rows are unit vectors).

  labels: (N,) ints in [0, num_classes) or -1 (left out). Returns (hist_intra, hist_inter, info) where info
  tells the pair mode and pair counts of each kind."""
  opts.validate()
  index = group_by_class(labels, num_classes)
  counts = np.asarray(index.counts)[:num_classes]
  ex_intra, ex_inter = exhaustive_pair_counts(counts)
  key = jax.random.key(opts.seed)
  out, info = [], {}
  for kind, ex, n_rand, k in (('intra', ex_intra, opts.n_intra, 0), ('inter', ex_inter, opts.n_inter, 1)):
    exhaustive = opts.mode == 'exhaustive' or (opts.mode == 'auto' and ex.sum() <= opts.exhaustive_max)
    if exhaustive:
      h = exhaustive_histograms(x, index, kind, num_classes, opts.bins)
    else:
      rs = per_round(len(index.counts), x.shape[1], n_rand, opts.chunk_elems)
      h = random_pair_histograms(x, index, jax.random.fold_in(key, k), n_pairs=n_rand, kind=kind,
                                 bins=opts.bins, round_size=rs)
    h = np.asarray(h)[:num_classes]
    out.append(h)
    info[f'{kind}_mode'] = 'exhaustive' if exhaustive else 'random'
    info[f'{kind}_pairs'] = int(h.sum())
  return out[0], out[1], info


def evaluate(x: jax.Array, labels: np.ndarray, num_classes: int, opts: Options = Options()) -> dict:
  """All metrics of prepared features x (see `prepare`) for labels in [0, num_classes) (-1: left out).

  Classes with fewer than 2 samples are dropped (counted in `skipped_classes`). Raises ValueError when fewer
  than 2 classes remain. Returns NumPy values: the histogram_metrics dict, `hist_intra`, `hist_inter` (C, B),
  `valid` (C,), `class_counts` (samples per class, skipped ones included), `knn_accuracy` (+ `class_knn_accuracy`), pair info, `skipped_classes`.
  """
  labels = np.asarray(labels)
  class_counts = np.bincount(labels[labels >= 0], minlength=num_classes)[:num_classes]
  labels, kept, skipped = keep_classes(labels, num_classes)
  if kept.sum() < 2:
    raise ValueError(f'only {int(kept.sum())} class(es) with at least 2 samples ({skipped} skipped): '
                     'overlap needs at least 2 classes')
  h_in, h_out, info = class_histograms(x, labels, num_classes, opts)
  valid = kept & (h_in.sum(1) > 0) & (h_out.sum(1) > 0)
  m = {k: np.asarray(v) for k, v in histogram_metrics(h_in, h_out, valid).items()}
  m.update(hist_intra=h_in, hist_inter=h_out, valid=valid, skipped_classes=skipped,
           class_counts=class_counts, **info)
  if opts.knn_k:
    n_kept = int((labels >= 0).sum())
    k = min(opts.knn_k, n_kept - 1)
    acc, per = knn_accuracy(x[:len(labels)], labels, num_classes, k, opts.knn_queries, opts.seed)
    m.update(knn_accuracy=acc, class_knn_accuracy=per, knn_k=k)
  return m


# ----------------------------------------------------------------------------------------- hierarchies

def descendants(tree: Mapping[str, Sequence[str]]) -> dict[str, frozenset]:
  """{node: the node and every node below it} of a parent -> children tree (a DAG is fine)."""
  memo: dict[str, frozenset] = {}

  def visit(node, stack):
    if node in memo:
      return memo[node]
    if node in stack:
      raise ValueError(f'class tree: a cycle through {node!r}')
    stack.add(node)
    out = {node}
    for ch in tree.get(node, ()):
      out |= visit(ch, stack)
    stack.discard(node)
    memo[node] = frozenset(out)
    return memo[node]

  nodes = set(tree) | {c for cs in tree.values() for c in cs}
  for n in sorted(nodes):
    visit(n, set())
  return memo


def levels(tree: Mapping[str, Sequence[str]]) -> dict[str, int]:
  """Shortest distance of each node from a root (a node that is nobody's child), roots at 0."""
  children = {c for cs in tree.values() for c in cs}
  nodes = set(tree) | children
  level = {r: 0 for r in nodes - children}
  frontier = sorted(level)
  while frontier:
    nxt = []
    for n in frontier:
      for c in tree.get(n, ()):
        if c not in level:
          level[c] = level[n] + 1
          nxt.append(c)
    frontier = nxt
  return level


def node_clusters(tree: Mapping[str, Sequence[str]], class_names: Sequence[str], labels: np.ndarray,
                  min_children: int = 2) -> Iterable[tuple[str, int, list[str], np.ndarray]]:
  """For each node with >= min_children children holding samples: (node, level, children, cluster labels).

  cluster labels: (N,) index of the child whose subtree holds the sample's class, -1 for samples outside the
  node, labelled with the node itself, or under two children (reading 4)."""
  desc = descendants(tree)
  lvl = levels(tree)
  labels = np.asarray(labels)
  name_of = np.asarray(list(class_names), dtype=object)
  present = {n for n in name_of[np.unique(labels[labels >= 0])]} if len(labels) else set()
  for node in sorted(tree, key=lambda n: (lvl.get(n, 0), n)):
    kids = [c for c in tree[node] if desc.get(c, frozenset({c})) & present]
    if len(kids) < min_children:
      continue
    owner = np.full(len(class_names), -1, np.int64)
    for ci, name in enumerate(class_names):
      hits = [i for i, c in enumerate(kids) if name in desc.get(c, frozenset({c}))]
      if len(hits) == 1:
        owner[ci] = hits[0]
    cl = np.where(labels >= 0, owner[np.clip(labels, 0, None)], -1)
    yield node, lvl.get(node, 0), kids, cl
