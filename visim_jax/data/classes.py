"""Labelled image sets for class-based evaluations (histogram metrics, paper 003): where samples and labels come from.

Sources:
  image_folder(root)      one sub-folder per class (root/<class>/<image>); classes sorted by folder name.
  demo_labelled(...)      the embedded offline demo set (visim_jax.data.demo): both sides of each pair are
                          samples of its source photo (18 classes).
  tfds_source(name, ...)  a TFDS dataset read with tfds.data_source (random access, NumPy, no TensorFlow);
                          tfds_batches() decodes and resizes its images for a backbone; TfdsImages is the
                          same as item names + a batch loader for the feature cache (labels recorded as read).
  load_feature_file(path) precomputed features: an .npz with `features` (N, D), `labels` (N,) ints and,
                          optionally, `class_names` (C,) strings; load_source_stats(path) a `mean`/`std` .npz.
  read_class_tree(path)   a class hierarchy as a parent -> children text file (e.g. WordNet ids for ImageNet);
                          DEMO_TREE a small tree over the demo set's source photos.

Every error names the file or folder (and the line for text files).
"""
from __future__ import annotations

import os
import threading
from typing import Iterator, NamedTuple, Sequence

import numpy as np

from visim_jax.core import ops, readers
from visim_jax.data import images as images_lib
from visim_jax.data import npz
from visim_jax.core.errors import UserError


class LabelledImages(NamedTuple):
  paths: list[str]         # image files, grouped by class
  labels: np.ndarray       # (N,) int64 in [0, len(class_names))
  class_names: list[str]
  empty_classes: list[str]  # class folders without any image (kept as classes with 0 samples)


def image_folder(root: str, extensions: Sequence[str] = images_lib.IMAGE_EXTENSIONS) -> LabelledImages:
  """root/<class>/<image files>: one sub-folder per class (hidden folders and loose files ignored)."""
  if not os.path.isdir(root):
    raise UserError(f'{root}: image folder not found (expected one sub-folder per class)')
  classes = sorted(d for d in os.listdir(root) if not d.startswith('.') and os.path.isdir(os.path.join(root, d)))
  if not classes:
    raise UserError(f'{root}: no class sub-folders (expected root/<class>/<image files>)')
  exts = tuple(e.lower() for e in extensions)
  paths, labels, empty = [], [], []
  for i, c in enumerate(classes):
    folder = os.path.join(root, c)
    names = sorted(n for n in os.listdir(folder) if n.lower().endswith(exts) and not n.startswith('.')
                   and os.path.isfile(os.path.join(folder, n)))
    if not names:
      empty.append(c)
    paths += [os.path.join(folder, n) for n in names]
    labels += [i] * len(names)
  if not paths:
    raise UserError(f'{root}: no image files in any of the {len(classes)} class folders '
                     f'(looked for {", ".join(exts)})')
  return LabelledImages(paths, np.asarray(labels, np.int64), classes, empty)


def demo_labelled(root: str | None = None, n_pairs: int = 192, seed: int = 0,
                  cache_dir: str | None = None) -> LabelledImages:
  """The offline demo set as a labelled set: left and right image of each pair, labelled by its source photo."""
  from visim_jax.data import demo as demo_lib
  folder = demo_lib.demo_pairs(root, n_pairs, seed, cache_dir)
  by_name = demo_lib.demo_classes(folder)
  classes = sorted(set(by_name.values()))
  cid = {c: i for i, c in enumerate(classes)}
  paths, labels = [], []
  for side in ('left', 'right'):
    for name in sorted(by_name):
      paths.append(os.path.join(folder, side, name))
      labels.append(cid[by_name[name]])
  return LabelledImages(paths, np.asarray(labels, np.int64), classes, [])


# ------------------------------------------------------------------------------------------------ TFDS

def tfds_source(name: str, split: str, data_dir: str | None = None, label_key: str = 'label'):
  """(random-access data source, class names) of a prepared TFDS dataset (tfds.data_source, NumPy)."""
  import tensorflow_datasets as tfds
  try:
    source = tfds.data_source(name, split=split, data_dir=data_dir or None)
    builder = tfds.builder(name, data_dir=data_dir or None)
  except Exception as e:  # not prepared, unknown name, bad split...
    raise UserError(f'config.tfds.name: cannot open TFDS dataset {name!r} split {split!r} '
                     f'(data_dir={data_dir or "default"}): {e}') from e
  feats = builder.info.features
  if label_key not in feats:
    raise UserError(f'config.tfds.label_key: {name!r} has no feature {label_key!r} (has {sorted(feats.keys())})')
  label = feats[label_key]
  names = list(getattr(label, 'names', None) or [str(i) for i in range(int(label.num_classes))])
  return source, names


def tfds_batches(source, pre, batch_size: int, indices: Sequence[int], image_key: str = 'image',
                 label_key: str = 'label') -> Iterator[tuple[np.ndarray, np.ndarray]]:
  """(uint8 (B, size, size, 3) images resized for `pre`, (B,) labels) over source[indices], in order."""
  for s in range(0, len(indices), batch_size):
    imgs, labs = [], []
    for i in indices[s:s + batch_size]:
      ex = source[int(i)]
      if image_key not in ex:
        raise UserError(f'config.tfds.image_key: example {i} has no {image_key!r} (has {sorted(ex)})')
      imgs.append(images_lib.resize(images_lib.from_array(ex[image_key]), pre))
      labs.append(int(ex[label_key]))
    yield np.stack(imgs), np.asarray(labs, np.int64)


class TfdsImages:
  """The first n examples of a TFDS split as items for the feature cache: `items` ('<index>' strings), `source_id`
  (what the cache key records instead of a file list), `load_batch(items, pre)` (uint8 images, as
  images.load_batch) which records each example's label as it decodes it, and `labels(cache_dir)`."""

  def __init__(self, name: str, split: str, data_dir: str | None = None, image_key: str = 'image',
               label_key: str = 'label', max_examples: int = 0):
    self.source, self.class_names = tfds_source(name, split, data_dir, label_key)
    self.n = len(self.source) if not max_examples else min(len(self.source), max_examples)
    if self.n < 2:
      raise UserError(f'config.tfds: {name}/{split} has {self.n} example(s); at least 2 are needed')
    self.image_key, self.label_key = image_key, label_key
    self.items = [str(i) for i in range(self.n)]
    self.source_id = {'tfds': name, 'split': split, 'num_examples': self.n, 'image_key': image_key,
                      'data_dir': os.path.abspath(data_dir) if data_dir else ''}
    self.tag = f'tfds-{name.replace("/", "_")}-{split}'
    self._labels = np.full(self.n, -1, np.int64)
    self._lock = threading.Lock()

  def load_batch(self, items: Sequence[str], pre) -> np.ndarray:
    idx = [int(i) for i in items]
    imgs, labs = next(tfds_batches(self.source, pre, len(idx), idx, self.image_key, self.label_key))
    with self._lock:
      self._labels[idx] = labs
    return imgs

  def labels(self, cache_dir: str | None) -> np.ndarray:
    """(n,) labels: from this run's decoding, else the split's label index in cache_dir, else a decoding pass."""
    path = os.path.join(cache_dir, f'{self.tag}-labels-{self.n}.npz') if cache_dir else None
    if (self._labels < 0).any() and path and os.path.exists(path):
      with np.load(path, allow_pickle=False) as z:
        if z['labels'].shape == (self.n,):
          self._labels = np.asarray(z['labels'], np.int64)
    stored = path is not None and os.path.exists(path) and not (self._labels < 0).any()
    for i in np.flatnonzero(self._labels < 0):  # examples this process did not decode (cache hit, other hosts)
      self._labels[i] = int(self.source[int(i)][self.label_key])
    if path and not stored:
      ops.save_npz_atomic(path, labels=self._labels)
    return self._labels.copy()


# ---------------------------------------------------------------------------------------- features file

def load_feature_file(path: str) -> tuple[np.ndarray, np.ndarray, list[str]]:
  """(features float32 (N, D), labels int64 (N,), class names) of an .npz with `features` and `labels`."""
  arrays = npz.read_arrays(path, ('features', 'labels'), ('class_names',))
  feats, labels = arrays['features'], arrays['labels']
  names = [str(n) for n in arrays['class_names']] if 'class_names' in arrays else None
  if feats.ndim != 2:
    raise UserError(f'{path}: `features` must be 2-D (samples, dim), got shape {feats.shape}')
  if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
    raise UserError(f'{path}: `labels` must be a 1-D integer array, got {labels.dtype} {labels.shape}')
  if len(feats) != len(labels):
    raise UserError(f'{path}: {len(feats)} feature rows but {len(labels)} labels; they must match')
  if len(labels) and labels.min() < 0:
    raise UserError(f'{path}: negative label {int(labels.min())} at row {int(np.argmin(labels))}')
  n_cls = int(labels.max()) + 1 if len(labels) else 0
  if names is None:
    names = [str(i) for i in range(n_cls)]
  elif len(names) < n_cls:
    raise UserError(f'{path}: {len(names)} class_names but labels go up to {n_cls - 1}')
  bad = np.flatnonzero(~np.isfinite(feats.astype(np.float32)).all(1))
  if len(bad):
    raise UserError(f'{path}: {len(bad)} feature rows hold NaN/Inf (first rows: {bad[:5].tolist()})')
  return feats.astype(np.float32), labels.astype(np.int64), names


def load_source_stats(path: str, dim: int) -> tuple[np.ndarray, np.ndarray]:
  """(mean, std) float32 (dim,) of an .npz with `mean` and `std` (the 'source' standardisation of paper 003)."""
  z = npz.read_arrays(path, ('mean', 'std'), field='config.source_stats')
  mean, std = np.asarray(z['mean'], np.float32), np.asarray(z['std'], np.float32)
  if mean.shape != (dim,) or std.shape != (dim,):
    raise UserError(f'config.source_stats: {path}: mean/std shapes {mean.shape}/{std.shape}, features have dim {dim}')
  return mean, std


# ------------------------------------------------------------------------------------------- class tree

# A small tree over the demo set's source photos (skimage / sklearn names), so the offline default shows the
# hierarchy outputs too. Nodes absent from a given demo build are ignored.
DEMO_TREE = {
    'photo': ['scene', 'texture', 'science'],
    'scene': ['astronaut', 'chelsea', 'coffee', 'rocket', 'camera', 'motorcycle_left', 'china', 'flower'],
    'texture': ['brick', 'grass', 'gravel', 'page', 'colorwheel'],
    'science': ['microscopy', 'sky', 'coins'],
    'microscopy': ['immunohistochemistry', 'retina', 'cell'],
    'sky': ['hubble_deep_field', 'moon'],
}


def read_class_tree(path: str) -> dict[str, list[str]]:
  """parent -> children from a text file: each line `parent child [child ...]` (whitespace separated, as
  ImageNet's wordnet.is_a.txt), `#` starts a comment, blank lines are skipped. Children keep file order."""
  if not os.path.exists(path):
    raise UserError(f'{path}: class tree file not found')
  tree: dict[str, list[str]] = {}
  for ln, line in readers.text_lines(path, 'class tree file'):
    parts = line.split('#', 1)[0].replace(',', ' ').replace(':', ' ').split()
    if not parts:
      continue
    if len(parts) < 2:
      raise UserError(f'{path}:{ln}: expected `parent child [child ...]`, got {line.strip()!r}')
    parent, kids = parts[0], parts[1:]
    if parent in kids:
      raise UserError(f'{path}:{ln}: {parent!r} is its own child')
    lst = tree.setdefault(parent, [])
    lst += [k for k in kids if k not in lst]
  if not tree:
    raise UserError(f'{path}: no parent -> child lines')
  return tree
