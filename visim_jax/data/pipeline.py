"""The host side of feature extraction: decoded, resized batches in order, fast enough to keep a device busy.

  for start, n, x in host_batches(paths, pre, batch_size, flip=False, image_cache=DIR):
    ...  # x: (batch_size, size, size, 3) as images.load_batch gives it, zero-padded past n

Decoding (PIL, which releases the GIL while it decodes and resizes) runs image by image through grain
(data/grain_data.image_batches: a MapDataset of the files read on grain's threads, one per host core
(`default_workers`), up to `prefetch` batches ahead of the consumer, then batched); each batch equals
`images.load_batch` of its paths (same pixels, same order). Threads were chosen by measurement against a process
pool and tf.data (benchmarks/pipeline.py, benchmarks/RESULTS.md): the process pool pays a pickle of every
decoded image and the same cores; tf.data cannot decode through our PIL rules except by calling back into Python.
A `loader` (TFDS items) still reads whole batches on a thread pool.

`device_batches` puts batch k + 1 on the device (jax.device_put, asynchronous) while the caller's batch k
computes.

Decoded-image cache (optional, `image_cache=folder`): one memory-mapped .npy of every image's preprocessed
pixels per (file list, preprocessing, pixel dtype), written while the first pass decodes and published
atomically with a JSON manifest beside it; a second model with the same preprocessing over the same files reads
it instead of decoding a JPEG. The key is the file list's names, sizes and modification times (the feature
cache's rule) and `Preprocess.describe()`, so a changed image or a changed preprocessing misses. Flipping is
applied after the cache (one cache serves both views).
"""
from __future__ import annotations

import collections
import concurrent.futures
import hashlib
import json
import os
from typing import Callable, Iterator, Sequence

import numpy as np
from absl import logging

from visim_jax.core import ops
from visim_jax.data.grain_data import PathImages, default_workers, image_batches  # noqa: F401  (default_workers: API)

IMAGE_CACHE_VERSION = 1


def pixel_dtype(pre) -> np.dtype:
  """What images.resize returns for `pre`: float32 for interpolation='torch_bilinear', else uint8."""
  return np.dtype(np.float32 if pre.interpolation == 'torch_bilinear' else np.uint8)


# ------------------------------------------------------------------------------------- decoded-image cache

def file_list_hash(paths: Sequence[str]) -> str:
  """Hash of the file list: names, sizes and modification times (a changed image changes it)."""
  h = hashlib.sha256()
  for p in paths:
    st = os.stat(p)
    h.update(f'{os.path.abspath(p)}\0{st.st_size}\0{st.st_mtime_ns}\n'.encode())
  return h.hexdigest()


def image_cache_manifest(paths: Sequence[str], pre) -> dict:
  return json.loads(json.dumps({
      'version': IMAGE_CACHE_VERSION, 'file_list_sha256': file_list_hash(paths),
      'preprocessing': pre.describe(), 'image_size': pre.size, 'dtype': pixel_dtype(pre).name,
      'num_images': len(paths)}))


def image_cache_path(folder: str, manifest: dict) -> str:
  key = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()[:20]
  return os.path.join(folder, f'images-{manifest["image_size"]}px-{key}.npy')


def read_image_cache(path: str, manifest: dict) -> np.ndarray | None:
  """The memory-mapped (N, size, size, 3) pixels if `path` holds this manifest's images; None otherwise."""
  meta = path[:-len('.npy')] + '.json'
  if not (os.path.exists(path) and os.path.exists(meta)):
    return None
  try:
    with open(meta) as f:
      stored = json.load(f)
    if stored != manifest:
      return None
    arr = np.load(path, mmap_mode='r', allow_pickle=False)
    n, s = manifest['num_images'], manifest['image_size']
    if arr.shape != (n, s, s, 3) or arr.dtype.name != manifest['dtype']:
      raise ValueError(f'shape {arr.shape} {arr.dtype}')
  except Exception as e:  # truncated / corrupt: decoded again and rewritten
    logging.warning('decoded-image cache %s is unreadable (%s): decoding again', path, e)
    return None
  return arr


class _CacheWriter:
  """Fills a temporary memory-mapped .npy as images decode; `publish` renames it into place when all are in."""

  def __init__(self, path: str, manifest: dict):
    self.path, self.manifest = path, manifest
    os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
    self.tmp = f'{path}.tmp{os.getpid()}.npy'
    s = manifest['image_size']
    self.arr = np.lib.format.open_memmap(self.tmp, mode='w+', dtype=np.dtype(manifest['dtype']),
                                         shape=(manifest['num_images'], s, s, 3))

  def publish(self) -> None:
    self.arr.flush()
    del self.arr
    os.replace(self.tmp, self.path)
    ops.atomic_write_text(self.path[:-len('.npy')] + '.json', json.dumps(self.manifest, sort_keys=True))
    logging.info('decoded-image cache written: %s', self.path)

  def abandon(self) -> None:
    self.__dict__.pop('arr', None)
    try:
      os.remove(self.tmp)
    except OSError:
      pass


# ----------------------------------------------------------------------------------------------- batches

def host_batches(paths: Sequence, pre, batch_size: int, flip: bool = False, loader: Callable | None = None,
                 workers: int | None = None, prefetch: int = 4, image_cache: str | None = None,
                 load_image: Callable | None = None) -> Iterator[tuple[int, int, np.ndarray]]:
  """(start, n, batch) for consecutive slices of `paths`, batch padded with zeros to batch_size.

  loader(items, pre) -> (B, size, size, 3): a batch reader for items that are not image files (TFDS); its
  batches are read on the thread pool, `prefetch` ahead, and are not cached. load_image(path, pre) replaces
  images.load_image (tests count decodes through it).
  """
  workers = workers or default_workers()
  n_total = len(paths)
  starts = list(range(0, n_total, batch_size))
  dtype = pixel_dtype(pre)
  shape = (pre.size, pre.size, 3)

  def finish(x: np.ndarray, n: int) -> np.ndarray:
    if flip:
      x[:n] = x[:n, :, ::-1]
    return x

  if loader is not None:
    def read(start):
      items = list(paths[start:start + batch_size])
      x = np.asarray(loader(items, pre))
      out = np.zeros((batch_size,) + x.shape[1:], x.dtype)
      out[:len(items)] = x
      return finish(out, len(items))
    with concurrent.futures.ThreadPoolExecutor(workers) as ex:
      pending = collections.deque(ex.submit(read, s) for s in starts[:prefetch])
      for i, start in enumerate(starts):
        x = pending.popleft().result()
        if i + prefetch < len(starts):
          pending.append(ex.submit(read, starts[i + prefetch]))
        yield start, min(batch_size, n_total - start), x
    return

  cached = writer = None
  try:
    manifest = image_cache_manifest(paths, pre) if image_cache else None
  except OSError:  # a missing file: decoding below names it
    manifest = None
  if manifest is not None:
    path = image_cache_path(image_cache, manifest)
    cached = read_image_cache(path, manifest)
    if cached is not None:
      logging.info('decoded-image cache hit: %s', path)
    else:
      try:
        writer = _CacheWriter(path, manifest)
      except OSError as e:
        logging.warning('decoded-image cache %s cannot be written (%s): decoding without it', path, e)
  if cached is not None:
    for start in starts:
      n = min(batch_size, n_total - start)
      x = np.zeros((batch_size,) + shape, cached.dtype)
      x[:n] = cached[start:start + n]
      yield start, n, finish(x, n)
    return

  ok = False
  try:
    source = PathImages(list(paths), pre, load_image)
    for start, (n, x) in zip(starts, image_batches(range(n_total), source, batch_size, threads=workers,
                                                    prefetch=prefetch)):
      if writer is not None:
        writer.arr[start:start + n] = x[:n]
      yield start, n, finish(x, n)
    ok = True
  finally:
    if writer is not None:
      writer.publish() if ok else writer.abandon()


def device_batches(batches: Iterator[tuple[int, int, np.ndarray]], put: Callable) -> Iterator[tuple]:
  """(start, n, device array) with the next batch's transfer (`put`, e.g. a jax.device_put) issued before the
  current one is handed to the caller: the transfer of k + 1 overlaps the caller's compute of k."""
  it = iter(batches)
  nxt = next(it, None)
  nxt = None if nxt is None else (nxt[0], nxt[1], put(nxt[2]))
  while nxt is not None:
    cur = nxt
    after = next(it, None)
    nxt = None if after is None else (after[0], after[1], put(after[2]))
    yield cur
