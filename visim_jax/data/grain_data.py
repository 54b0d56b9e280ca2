"""The data engine: random-access image sources -> grain datasets -> host batches (DESIGN.md "The data engine").

Image sources (grain's RandomAccessDataSource protocol: `len`, `source[i]` -> (S, S, 3) pixels as
images.load_batch gives them, uint8 or float32 on 0..255 for 'torch_bilinear'):
  PathImages(paths, pre)                      a file decoded (PIL) and resized by the backbone's Preprocess
  TableImages(table)                          a row of a decoded-pixel table (data/pipeline.py's memory-mapped cache:
                                              where it was measured to win, images re-read every epoch)
  TfdsImages(name, split, data_dir, pre)      record['image'] of tfds.data_source(name, split) resized (AligNet's
                                              ImageNet); the source is opened lazily in each process and not pickled
                                              (as AligNet's AligNetTriplets)

Triplet batches (the tune experiment):
  ds = triplet_batches(triplets, target, images, batch_size, seed, steps, lo, hi)   # a grain MapDataset
  it = iterate(ds, worker_count)    # a grain DatasetIterator: next(it) = (pixels (b, 3, S, S, 3), target (b, ...))

  grain.MapDataset.range(N).shuffle(seed).repeat()  the triplet rows; epoch e a permutation seeded by seed + e
    .batch(B)[:steps]                               step s's global batch of rows (batches run across an epoch's end,
                                                    as AligNet's kauldron pipeline: no triplet is ever dropped)
    .map(rows lo:hi -> pixels, targets)             this jax process's disjoint share, decoded: in the process
                                                    (grain's threads) with worker_count = 0, else in worker_count
                                                    processes (grain's mp_prefetch)

Step s's global batch depends on (seed, s) only, and each process reads rows lo:hi of it, so 2 processes read the
batches 1 process reads, split. The iterator's state (`it.get_state()`) is saved in the Orbax checkpoint beside the
train state (training/runtime.Run.track_data, grain's Orbax handler): a killed and resumed run reads the batches
an uninterrupted one reads.

Image batches (evaluation, feature extraction): `image_batches(ids, images, batch_size)` -> a MapDataset of
(n, batch) in order, padded with zeros to batch_size.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import numpy as np

from visim_jax.core.errors import UserError
from visim_jax.data import images as images_lib


# ------------------------------------------------------------------------------------------------ sources

@dataclasses.dataclass(frozen=True)
class PathImages:
  paths: Sequence[str]
  pre: object                       # data.preprocess.Preprocess

  def __len__(self) -> int:
    return len(self.paths)

  def __getitem__(self, i: int) -> np.ndarray:
    return images_lib.load_image(self.paths[int(i)], self.pre)

  def describe(self) -> dict:
    return {'kind': 'paths', 'n': len(self.paths)}


@dataclasses.dataclass(frozen=True)
class TableImages:
  table: np.ndarray                 # (M, S, S, 3)

  def __len__(self) -> int:
    return len(self.table)

  def __getitem__(self, i: int) -> np.ndarray:
    return np.asarray(self.table[int(i)])

  def describe(self) -> dict:
    return {'kind': 'table', 'n': len(self.table)}


@dataclasses.dataclass(frozen=True)
class TfdsImages:
  name: str                         # e.g. 'imagenet2012'
  split: str                        # e.g. 'train'
  data_dir: str | None
  pre: object

  @functools.cached_property
  def source(self):
    import tensorflow_datasets as tfds
    try:
      return tfds.data_source(self.name, split=self.split, data_dir=self.data_dir or None)
    except Exception as e:  # not prepared, no array_record files, ...
      raise UserError(f'config.tfds_data_dir: tfds.data_source({self.name!r}, split={self.split!r}) cannot be opened '
                      f'under {self.data_dir or "the default TFDS data dir"}: {" ".join(str(e).split())[:200]}') from None

  def __getstate__(self):   # the opened source stays in its process (AligNetTriplets does the same)
    return {k: getattr(self, k) for k in ('name', 'split', 'data_dir', 'pre')}

  def __setstate__(self, state):
    for k, v in state.items():
      object.__setattr__(self, k, v)

  def __len__(self) -> int:
    return len(self.source)

  def __getitem__(self, i: int) -> np.ndarray:
    return images_lib.resize(images_lib.from_array(self.source[int(i)]['image']), self.pre)

  def describe(self) -> dict:
    return {'kind': 'tfds', 'name': self.name, 'split': self.split, 'n': len(self)}


# ------------------------------------------------------------------------------------------------ datasets

@dataclasses.dataclass(frozen=True)
class _Triplets:
  """Step rows -> (pixels (b, 3, S, S, 3), target (b, ...)) of rows lo:hi (a grain map; picklable)."""
  triplets: np.ndarray
  target: np.ndarray
  images: object
  lo: int
  hi: int | None

  def __call__(self, rows: np.ndarray):
    r = np.asarray(rows)[self.lo:self.hi]
    t = self.triplets[r]
    x = np.stack([self.images[i] for i in t.reshape(-1)])
    return x.reshape(t.shape + x.shape[1:]), self.target[r]


def triplet_batches(triplets: np.ndarray, target: np.ndarray, images, batch_size: int, seed: int, steps: int,
                    lo: int = 0, hi: int | None = None):
  """The grain MapDataset of `steps` batches (module docstring): element s = (pixels, target) of rows lo:hi of
  step s's global batch."""
  import grain
  rows = grain.MapDataset.range(len(triplets)).shuffle(seed=int(seed) % 2**32).repeat()
  return rows.batch(batch_size, drop_remainder=True)[:steps].map(
      _Triplets(np.asarray(triplets), np.asarray(target), images, lo, hi))


@dataclasses.dataclass(frozen=True)
class _Padded:
  ids: np.ndarray
  images: object
  batch_size: int

  def __call__(self, k: int):
    ids = self.ids[k * self.batch_size:(k + 1) * self.batch_size]
    x = np.stack([self.images[i] for i in ids])
    if len(ids) < self.batch_size:
      x = np.concatenate([x, np.zeros((self.batch_size - len(ids),) + x.shape[1:], x.dtype)])
    return len(ids), x


def image_batches(ids: Sequence[int], images, batch_size: int):
  """A grain MapDataset of (n, (batch_size, S, S, 3)) over images[ids] in order, the last batch zero-padded."""
  import grain
  ids = np.asarray(ids, np.int64)
  return grain.MapDataset.range(-(-len(ids) // batch_size)).map(_Padded(ids, images, batch_size))


def iterate(ds, worker_count: int = 0, threads: int | None = None, prefetch: int = 2):
  """A grain DatasetIterator over `ds` in order: elements made by `threads` threads of this process (default: one
  per host core) with worker_count = 0, else by worker_count processes (grain's mp_prefetch)."""
  import grain
  from visim_jax.data import pipeline
  threads = pipeline.default_workers() if threads is None else threads
  it = ds.to_iter_dataset(grain.ReadOptions(num_threads=0 if worker_count else threads,
                                            prefetch_buffer_size=0 if worker_count else prefetch * max(threads, 1)))
  if worker_count:
    from absl import flags
    if not flags.FLAGS.is_parsed():   # a library call (notebook, test): grain's workers read its absl flags
      flags.FLAGS.mark_as_parsed()
    it = it.mp_prefetch(grain.MultiprocessingOptions(num_workers=worker_count, per_worker_buffer_size=prefetch))
  return iter(it)
