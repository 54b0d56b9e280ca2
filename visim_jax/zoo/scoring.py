"""The jitted boundary of the zoo: a Similarity's `distance` over rows of feature tables, in fixed-size batches (one
compilation for any count): `pair_distances` (pairs i, j) and `distance_matrix` (row blocks, for retrieval).
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from visim_jax.core import cpu_kernels
from visim_jax.data.preprocess import Preprocess
from visim_jax.zoo.interface import Similarity


@dataclasses.dataclass(frozen=True)
class ImageTable:
  """LPIPS's features: the images, decoded and resized (uint8) when a batch of rows is taken (a table of
  full-resolution images would not fit in memory on NIGHTS)."""
  paths: tuple
  preprocess: Preprocess

  def __len__(self) -> int:
    return len(self.paths)

  def take(self, idx) -> np.ndarray:
    from visim_jax.data import images
    x = images.load_batch([self.paths[i] for i in np.asarray(idx).tolist()], self.preprocess)
    return x if x.dtype == np.uint8 else np.clip(np.rint(x), 0, 255).astype(np.uint8)


def take_rows(feats, idx):
  """Rows `idx` of a feature table (an array, a pytree of arrays, or an ImageTable)."""
  if isinstance(feats, ImageTable):
    return feats.take(idx)
  return jax.tree.map(lambda a: a[idx], feats)


def _num_rows(feats) -> int:
  return len(feats) if isinstance(feats, ImageTable) else int(jax.tree.leaves(feats)[0].shape[0])


def pair_distances(sim: Similarity, feats0, i, feats1=None, j=None, batch_size: int = 256,
                   progress: bool = False, desc: str = 'pairs') -> np.ndarray:
  """d(feats0[i[t]], feats1[j[t]]) for every t, float32 (T,), in fixed-size batches gathered on the host (a
  progress bar with progress=True: the protocols show one where the network runs per pair, LPIPS)."""
  feats1 = feats0 if feats1 is None else feats1
  i, j = np.asarray(i, np.int64), np.asarray(j, np.int64)
  t = len(i)
  out = np.empty(t, np.float32)
  if t == 0:
    return out
  bs = max(1, min(batch_size, 1 << (t - 1).bit_length()))   # a power of two: few compilations across sets
  fn = _jitted(sim.distance)
  from tqdm.auto import tqdm
  with tqdm(total=t, desc=desc, unit='pair', disable=not progress, leave=False) as bar:
    for s in range(0, t, bs):
      n = min(bs, t - s)
      ii = np.pad(i[s:s + n], (0, bs - n))
      jj = np.pad(j[s:s + n], (0, bs - n))
      out[s:s + n] = np.asarray(fn(sim.params, take_rows(feats0, ii), take_rows(feats1, jj)))[:n]
      bar.update(n)
  return out


def distance_matrix(sim: Similarity, feats0, feats1, row_block: int = 8) -> np.ndarray:
  """(N0, N1) distances: rows of feats0 in blocks, each against every row of feats1 (vmapped)."""
  n0, n1 = _num_rows(feats0), _num_rows(feats1)
  out = np.empty((n0, n1), np.float32)
  fn = _jitted_rows(sim.distance)
  f1 = take_rows(feats1, np.arange(n1)) if isinstance(feats1, ImageTable) else feats1
  f1 = jax.tree.map(jnp.asarray, f1)
  for s in range(0, n0, row_block):
    n = min(row_block, n0 - s)
    idx = np.pad(np.arange(s, s + n), (0, row_block - n))
    out[s:s + n] = np.asarray(fn(sim.params, take_rows(feats0, idx), f1))[:n]
  return out


@functools.lru_cache(maxsize=64)


def _jitted(distance):
  return cpu_kernels.jit(distance)


@functools.lru_cache(maxsize=64)


def _jitted_rows(distance):
  def rows(params, a, b):
    n1 = _num_rows(b)
    return jax.vmap(lambda x: distance(params, jax.tree.map(lambda v: jnp.broadcast_to(v, (n1,) + v.shape), x),
                                       b))(a)
  return cpu_kernels.jit(rows)
