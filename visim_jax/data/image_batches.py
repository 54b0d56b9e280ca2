"""Triplets of images for training a tower: the pixels of an index set's images, and every step's batch.

  table = pixel_table(paths, pre, image_cache=FOLDER)   # (M, S, S, 3) as images.load_batch gives them (uint8, or
                                                         # float32 on 0..255 for 'torch_bilinear'), row i = paths[i]
  batches = TripletBatches(train, table, batch_size, seed)
  images, target = batches.take(step)                    # (B, 3, S, S, 3) and (B,) | (B, 3): the rows of step `step`

Pixels come through data/pipeline.py: each image decoded and resized once, on the host's thread pool, by the
backbone's own preprocessing (`Preprocess`: resize, crop, interpolation; the device normalises). With a cache folder
the table is pipeline's memory-mapped decoded-image cache (one .npy per file list x preprocessing, published
atomically, shared with feature extraction: a second run or a second model with the same preprocessing reads it and
decodes nothing); without one it is an array in memory.

Batches: step s reads rows perm_e[p B : (p + 1) B] of the triplet table (data/triplet_index.Stream: e = s // K,
p = s % K, K = N // B; the permutation of epoch e seeded by (seed, e)), so a resumed run reads exactly the batches
an uninterrupted one reads, on any number of devices. The last partial batch of an epoch is dropped (one shape per
step; DreamSim's DataLoader keeps it: docs/tuning.md). No image augmentation: neither DreamSim (Resize + ToTensor)
nor AligNet (a cubic resize to 224 x 224) augments.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from visim_jax.data import pipeline
from visim_jax.data.triplet_index import Stream, TripletSet

AUGMENT = ('none',)


def pixel_table(paths: Sequence[str], pre, image_cache: str | None = None, batch_size: int = 64,
                workers: int | None = None, progress: bool = True, desc: str = 'images') -> np.ndarray:
  """(M, S, S, 3) pixels of `paths` in order (see the module docstring); a bad image is one UserError naming it."""
  from tqdm.auto import tqdm
  paths = list(paths)
  if image_cache:
    try:
      manifest = pipeline.image_cache_manifest(paths, pre)
    except OSError:
      manifest = None   # a missing file: the decoding below names it
    if manifest is not None:
      path = pipeline.image_cache_path(image_cache, manifest)
      hit = pipeline.read_image_cache(path, manifest)
      if hit is not None:
        return hit
      with tqdm(total=len(paths), desc=desc, unit='img', disable=not progress) as bar:
        for _, n, _ in pipeline.host_batches(paths, pre, batch_size, workers=workers, image_cache=image_cache):
          bar.update(n)
      hit = pipeline.read_image_cache(path, manifest)
      if hit is not None:
        return hit    # else the cache could not be written (logged): decoded again into memory below
  s = pre.size
  out = np.empty((len(paths), s, s, 3), pipeline.pixel_dtype(pre))
  with tqdm(total=len(paths), desc=desc, unit='img', disable=not progress) as bar:
    for start, n, x in pipeline.host_batches(paths, pre, batch_size, workers=workers):
      out[start:start + n] = x[:n]
      bar.update(n)
  return out


@dataclasses.dataclass
class TripletBatches:
  """Seeded batches of image triplets (module docstring); `table` rows are the index set's image rows."""
  triplets: np.ndarray        # (N, 3) int32 rows of the table
  target: np.ndarray          # (N,) | (N, 3)
  table: np.ndarray           # (M, S, S, 3)
  batch_size: int
  seed: int

  def __post_init__(self):
    self.stream = Stream(len(self.triplets), self.batch_size, self.seed)

  @classmethod
  def of(cls, s: TripletSet, table: np.ndarray, batch_size: int, seed: int) -> 'TripletBatches':
    return cls(np.asarray(s.triplets, np.int32), np.asarray(s.target), table, batch_size, seed)

  @property
  def steps_per_epoch(self) -> int:
    return self.stream.steps_per_epoch

  def rows(self, step: int) -> np.ndarray:
    """(B,) the triplet rows of step `step` (0-based)."""
    return self.stream.rows(step, 1)[0]

  def take(self, step: int, lo: int = 0, hi: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(images (b, 3, S, S, 3), target (b, ...)) of rows lo:hi of step `step`'s batch (a process's share)."""
    r = self.rows(step)[lo:hi]
    return gather(self.table, self.triplets[r]), self.target[r]


def gather(table: np.ndarray, triplets: np.ndarray) -> np.ndarray:
  """(b, 3, S, S, 3) pixels of (b, 3) table rows (a memory-mapped table reads only those rows)."""
  t = np.asarray(triplets)
  flat = table[t.reshape(-1)]
  return flat.reshape(t.shape + table.shape[1:])


def image_rows(triplets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(the distinct table rows a triplet set uses, sorted; the triplets as positions into that list): every held-out
  image is embedded once."""
  rows, inv = np.unique(np.asarray(triplets).reshape(-1), return_inverse=True)
  return rows, inv.reshape(np.shape(triplets)).astype(np.int32)
