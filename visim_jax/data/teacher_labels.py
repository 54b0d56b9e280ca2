"""Teacher triplets (AligNet's recipe): cluster a teacher's features, draw triplets within / between / across
cluster borders, label them with the teacher's similarities.

  kmeans(x, k, iters, seed)         Lloyd's algorithm on unit vectors (spherical k-means: assign by the largest
                                    cosine, centroid = the normalised mean) from a k-means++ seeding, in JAX; an
                                    empty cluster keeps its centroid. AligNet: 500 k-means clusters of so400m-SigLIP features.
  sample(labels, n, how, rng)       (n, 3) rows: 'within' = three distinct images of one cluster, 'between' = one
                                    image from each of three distinct clusters, 'border' = two distinct images of one
                                    cluster and one of another (AligNet's class-border, their released default
                                    `cluster_border_500`), 'mixed' = a third of each. Clusters are drawn uniformly
                                    among those that can serve (>= 3 images for 'within', >= 2 for 'border').
  label(t, teacher, similarity)     [s_01, s_02, s_12] from the teacher's features ('cosine' or 'dot'), each triplet
                                    reordered so that its most similar pair is (0, 1): the odd one out is column 2,
                                    as in AligNet's files (README: 'filename2 is the image typically considered the
                                    odd one out').
  generate(...)                     the whole recipe over one image set: the images split into train and
                                    held-out (val) images first, so held-out triplets are made of unseen images;
                                    two triplet_index.TripletSet (rows of the full image list).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from visim_jax.core import cpu_kernels
from visim_jax.core import ops
from visim_jax.data.triplet_index import TripletSet

SAMPLING = ('border', 'within', 'between', 'mixed')


@functools.partial(cpu_kernels.jit, static_argnums=(2, 3))
def _lloyd(x, c0, k: int, iters: int):
  def assign(c):
    return jax.lax.map(lambda row: jnp.argmax(row @ c.T), x, batch_size=4096).astype(jnp.int32)

  def step(c, _):
    a = assign(c)
    s = jax.ops.segment_sum(x, a, k)
    n = jax.ops.segment_sum(jnp.ones(x.shape[0], jnp.float32), a, k)
    return jnp.where(n[:, None] > 0, ops.l2_normalize(s), c), None
  c, _ = jax.lax.scan(step, c0, None, length=iters)
  return c, assign(c)


@functools.partial(cpu_kernels.jit, static_argnums=1)
def _kmeans_pp(x, k: int, key):
  """k-means++ seeding on unit vectors (distance 1 - cos): each next centre drawn with probability ~ its squared
  distance to the nearest chosen centre."""
  m = x.shape[0]
  first = jax.random.randint(jax.random.fold_in(key, 0), (), 0, m)
  idx = jnp.zeros(k, jnp.int32).at[0].set(first)
  d2 = jnp.maximum(1.0 - x @ x[first], 0.0) ** 2

  def body(i, carry):
    idx, d2 = carry
    p = d2 / jnp.maximum(d2.sum(), 1e-30)
    nxt = jax.random.choice(jax.random.fold_in(key, i), m, p=jnp.where(d2.sum() > 0, p, 1.0 / m))
    return idx.at[i].set(nxt), jnp.minimum(d2, jnp.maximum(1.0 - x @ x[nxt], 0.0) ** 2)
  idx, _ = jax.lax.fori_loop(1, k, body, (idx, d2))
  return x[idx]


def kmeans(x: np.ndarray, k: int, iters: int = 10, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """(centroids (k, D), labels (M,)) of spherical k-means, k-means++ seeding (seeded), `iters` Lloyd steps."""
  x = ops.l2_normalize(jnp.asarray(x, jnp.float32))
  if not 1 <= k <= x.shape[0]:
    raise ValueError(f'k-means: k={k} must be in 1..{x.shape[0]} (the number of images)')
  c, a = _lloyd(x, _kmeans_pp(x, int(k), jax.random.PRNGKey(seed)), int(k), int(iters))
  return np.asarray(c), np.asarray(a)


def _members(labels: np.ndarray):
  order = np.argsort(labels, kind='stable').astype(np.int64)
  counts = np.bincount(labels, minlength=int(labels.max()) + 1)
  starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
  return order, counts, starts


def distinct(rng, count: np.ndarray, how_many: int) -> list[np.ndarray]:
  """how_many (2 or 3) distinct positions in 0..count-1 per row (count >= how_many), uniformly."""
  a = rng.integers(0, count)
  b = (a + 1 + rng.integers(0, count - 1)) % count
  if how_many == 2:
    return [a, b]
  lo, hi = np.minimum(a, b), np.maximum(a, b)
  c = rng.integers(0, count - 2)
  c = c + (c >= lo)
  c = c + (c >= hi)
  return [a, b, c]


def sample(labels: np.ndarray, n: int, how: str, rng: np.random.Generator) -> np.ndarray:
  """(n, 3) int64 positions into `labels` (see the module docstring)."""
  if how not in SAMPLING:
    raise ValueError(f'sampling: expected one of {SAMPLING}, got {how!r}')
  if how == 'mixed':
    parts = [n // 3 + (i < n % 3) for i in range(3)]
    out = np.concatenate([sample(labels, m, h, rng) for m, h in zip(parts, ('within', 'between', 'border'))])
    return out[rng.permutation(n)]
  order, counts, starts = _members(labels)
  pick = lambda c, pos: order[starts[c] + pos]
  if how == 'between':
    ok = np.flatnonzero(counts >= 1)
    if len(ok) < 3:
      raise ValueError(f'sampling=between needs 3 non-empty clusters, got {len(ok)}')
    cs = [ok[p] for p in distinct(rng, np.full(n, len(ok)), 3)]
    return np.stack([pick(c, rng.integers(0, counts[c])) for c in cs], 1)
  need = 3 if how == 'within' else 2
  ok = np.flatnonzero(counts >= need)
  if not len(ok) or (how == 'border' and np.count_nonzero(counts) < 2):
    raise ValueError(f'sampling={how} needs a cluster of >= {need} images' +
                     (' and another non-empty cluster' if how == 'border' else ''))
  c = ok[rng.integers(0, len(ok), n)]
  pos = distinct(rng, counts[c], need)
  rows = [pick(c, p) for p in pos]
  if how == 'border':
    nz = np.flatnonzero(counts >= 1)   # a uniform other cluster: one of the len(nz) - 1 non-empty ones that is not c
    j = rng.integers(0, len(nz) - 1, n)
    jc = np.searchsorted(nz, c)
    other = nz[j + (j >= jc)]
    rows.append(pick(other, rng.integers(0, counts[other])))
  return np.stack(rows, 1)


def pair_sims(feats: np.ndarray, t: np.ndarray, similarity: str = 'cosine', block: int = 1 << 18) -> np.ndarray:
  """(N, 3) float32 [s_01, s_02, s_12] of rows t of feats, in blocks (bounded memory for 10M triplets)."""
  f = np.asarray(feats, np.float32)
  if similarity == 'cosine':
    f = f / np.maximum(np.linalg.norm(f, axis=1, keepdims=True), ops.EPS)
  out = np.empty((len(t), 3), np.float32)
  for s in range(0, len(t), block):
    a, b, c = (f[t[s:s + block, i]] for i in range(3))
    out[s:s + block] = np.stack([np.einsum('nd,nd->n', a, b), np.einsum('nd,nd->n', a, c),
                                 np.einsum('nd,nd->n', b, c)], 1)
  return out


# Column orders that put the pair left out by the odd column o first: o = 2 -> (0, 1, 2), 1 -> (0, 2, 1), 0 -> (1, 2, 0)
_ORDER = np.array([[1, 2, 0], [0, 2, 1], [0, 1, 2]])
# how the three pair similarities move under those column orders ([s01, s02, s12] -> the new triplet's pairs)
_PAIRS = np.array([[2, 0, 1], [1, 0, 2], [0, 1, 2]])


def label(t: np.ndarray, teacher: np.ndarray, similarity: str = 'cosine') -> tuple[np.ndarray, np.ndarray]:
  """(triplets reordered so the teacher's odd one is column 2, their similarities [s_01, s_02, s_12])."""
  s = pair_sims(teacher, t, similarity)
  odd = 2 - np.argmax(s, axis=1)
  t = np.take_along_axis(t, _ORDER[odd], axis=1)
  s = np.take_along_axis(s, _PAIRS[odd], axis=1)
  return t.astype(np.int32), s


def generate(teacher: np.ndarray, images, n_train: int, n_val: int, clusters: int, sampling: str = 'border',
             val_fraction: float = 0.2, similarity: str = 'cosine', kmeans_iters: int = 10, seed: int = 0,
             meta: dict | None = None) -> tuple[TripletSet, TripletSet]:
  """(train, val) teacher triplets over one image set (rows of `images`); val triplets use held-out images only."""
  m = len(teacher)
  rng = np.random.default_rng([seed, 1])
  n_val_img = int(round(m * val_fraction))
  if n_val_img < 3 or m - n_val_img < 3:
    raise ValueError(f'val_fraction={val_fraction} leaves {m - n_val_img} train / {n_val_img} held-out images of '
                     f'{m}; each needs at least 3')
  perm = rng.permutation(m)
  val_img, train_img = np.sort(perm[:n_val_img]), np.sort(perm[n_val_img:])
  _, labels = kmeans(teacher, min(clusters, m), kmeans_iters, seed)
  info = {**(meta or {}), 'sampling': sampling, 'clusters': int(min(clusters, m)), 'kmeans_iters': kmeans_iters,
          'similarity': similarity, 'seed': seed, 'val_fraction': val_fraction,
          'cluster_sizes': np.bincount(labels, minlength=min(clusters, m)).tolist()}
  out = []
  for split, rows, n in (('train', train_img, n_train), ('val', val_img, n_val)):
    pos = sample(labels[rows], n, sampling, np.random.default_rng([seed, 2 if split == 'train' else 3]))
    t, s = label(rows[pos], teacher, similarity)
    out.append(TripletSet(t, 'similarities', s, list(images), {**info, 'split': split, 'n_images': len(rows)}))
  return out[0], out[1]
