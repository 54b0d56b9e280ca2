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
  it = triplet_batches(triplets, target, images, batch_size, seed, steps, lo, hi, worker_count)
  pixels, target = next(it)          # (b, 3, S, S, 3), (b, ...): rows lo:hi of the step's global batch

  grain.MapDataset.range(N).shuffle(seed).repeat()  the triplet rows; epoch e a permutation seeded by seed + e;
                                                    step s's global batch = its items s B .. (s + 1) B - 1 (batches
                                                    run across an epoch's end, as AligNet's kauldron pipeline: no
                                                    triplet is ever dropped)
  rows lo:hi of each step's batch -> their 3 (hi - lo) images, decoded one by one on grain's threads (worker_count
  = 0; PIL releases the GIL) or a whole batch per worker process (worker_count > 0, grain's mp_prefetch) -> batched

Step s's global batch depends on (seed, s) only, and each process reads rows lo:hi of it, so 2 processes read the
batches 1 process reads, split. The iterator's state (`it.get_state()`) is saved in the Orbax checkpoint beside the
train state (training/runtime.Run.track_data, grain's Orbax handler): a killed and resumed run reads the batches
an uninterrupted one reads.

Image batches (evaluation, feature extraction): `image_batches(ids, images, batch_size)` -> (n, batch) in order,
padded with zeros to batch_size, through the same two modes.
"""
from __future__ import annotations

import dataclasses
import functools
import os
from typing import Callable, Sequence

import numpy as np

from visim_jax.core.errors import UserError
from visim_jax.data import images as images_lib


def default_workers() -> int:
  """The host cores this process may use."""
  try:
    return max(1, len(os.sched_getaffinity(0)))
  except AttributeError:  # not Linux
    return max(1, os.cpu_count() or 1)


# ------------------------------------------------------------------------------------------------ sources

@dataclasses.dataclass(frozen=True)
class PathImages:
  paths: Sequence[str]
  pre: object                       # data.preprocess.Preprocess
  load: Callable | None = None      # load(path, pre) in place of images.load_image (tests count decodes)

  def __len__(self) -> int:
    return len(self.paths)

  def __getitem__(self, i: int) -> np.ndarray:
    return (self.load or images_lib.load_image)(self.paths[int(i)], self.pre)

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

  def loader(self, items: Sequence[int], pre) -> np.ndarray:
    """features.extract's `loader`: (B, S, S, 3) of the records `items`, resized by `pre`."""
    return np.stack([images_lib.resize(images_lib.from_array(self.source[int(i)]['image']), pre) for i in items])


def rows_digest(rows: np.ndarray) -> str:
  """A short hash of a source's row list (a feature cache key)."""
  import hashlib
  return hashlib.sha256(np.asarray(rows, np.int64).tobytes()).hexdigest()[:16]


# ------------------------------------------------------------------------------------------------ datasets

@dataclasses.dataclass(frozen=True)
class _TripletImage:
  """Image k of the flat stream of this process's triplet images: step k // (3 b), triplet row order[step B + lo +
  j // 3] (j = k % (3 b)), column j % 3 -> (pixels, row). A grain map; picklable."""
  order: object                 # MapDataset: the shuffled, repeated triplet rows
  triplets: np.ndarray
  images: object
  batch_size: int
  lo: int
  b: int

  def __call__(self, k: int):
    step, j = divmod(int(k), 3 * self.b)
    row = int(self.order[step * self.batch_size + self.lo + j // 3])
    return self.images[self.triplets[row, j % 3]], np.int64(row)


@dataclasses.dataclass(frozen=True)
class _Assemble:
  """(3 b images, 3 b rows) -> (pixels (b, 3, S, S, 3), target (b, ...))."""
  target: np.ndarray

  def __call__(self, batch):
    x, rows = batch
    return x.reshape((-1, 3) + x.shape[1:]), self.target[rows[::3]]


def triplet_batches(triplets: np.ndarray, target: np.ndarray, images, batch_size: int, seed: int, steps: int,
                    lo: int = 0, hi: int | None = None, worker_count: int = 0, threads: int | None = None,
                    prefetch: int = 2):
  """A grain iterator of `steps` batches (module docstring): element s = (pixels, target) of rows lo:hi of step s's
  global batch; `get_state` / `set_state` resume it."""
  import grain
  hi = batch_size if hi is None else hi
  order = grain.MapDataset.range(len(triplets)).shuffle(seed=int(seed) % 2**32).repeat()
  flat = grain.MapDataset.range(steps * 3 * (hi - lo)).map(
      _TripletImage(order, np.asarray(triplets), images, batch_size, lo, hi - lo))
  return _flow(flat, 3 * (hi - lo), _Assemble(np.asarray(target)), worker_count, threads, prefetch)


def _flow(items, unit: int, assemble, worker_count: int, threads: int | None, prefetch: int):
  """An iterator of batches of `unit` consecutive items in order, `assemble`d: with worker_count = 0 the items are
  made one by one on `threads` threads (default one per host core) `prefetch` batches ahead, then batched; else
  each of worker_count processes makes whole batches (grain's mp_prefetch hands out elements round robin: a batch
  must be one element)."""
  import grain
  if not worker_count:
    threads = default_workers() if threads is None else threads
    ds = items.to_iter_dataset(grain.ReadOptions(num_threads=threads, prefetch_buffer_size=prefetch * unit))
    return iter(ds.batch(unit, drop_remainder=False).map(assemble))
  from absl import flags
  if not flags.FLAGS.is_parsed():   # a library call (notebook, test): grain's workers read its absl flags
    flags.FLAGS.mark_as_parsed()
  ds = items.batch(unit, drop_remainder=False).map(assemble).to_iter_dataset(
      grain.ReadOptions(num_threads=0, prefetch_buffer_size=0))
  return iter(ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=worker_count, per_worker_buffer_size=prefetch)))


@dataclasses.dataclass(frozen=True)
class _Item:
  ids: np.ndarray
  images: object

  def __call__(self, k: int) -> np.ndarray:
    return self.images[self.ids[k]]


@dataclasses.dataclass(frozen=True)
class _Pad:
  batch_size: int

  def __call__(self, x):
    n = len(x)
    if n < self.batch_size:
      x = np.concatenate([x, np.zeros((self.batch_size - n,) + x.shape[1:], x.dtype)])
    return n, x


def image_batches(ids: Sequence[int], images, batch_size: int, worker_count: int = 0, threads: int | None = None,
                  prefetch: int = 4):
  """An iterator of (n, (batch_size, S, S, 3)) over images[ids] in order, the last batch zero-padded."""
  import grain
  ids = np.asarray(ids, np.int64)
  items = grain.MapDataset.range(len(ids)).map(_Item(ids, images))
  return _flow(items, batch_size, _Pad(batch_size), worker_count, threads, prefetch)
