"""Pooled multi-layer features (paper 001, Sec. 3) and the on-disk feature cache.

pool(): for each chosen layer, the spatial mean of its map (token mean for (N, T, C) sequences; a (N, C)
vector is taken as is), L2-normalised per layer, then concatenated in the order of `layers`.

extract(): batched extraction over a list of image files: decoding + resizing on the host (data/pipeline.py: one
PIL thread per core, batches prefetched, the next batch's transfer overlapping the device; an optional
memory-mapped decoded-image cache), one jitted program per batch shape, a progress bar, optional bfloat16 compute.

cached_features(): the same, behind a cache: one .npz per (image list x backbone x weights x layers x
preprocessing x dtype) holding `features`, `names` and a JSON `manifest`. Written atomically (temp file + rename);
reused when the manifest matches; recomputed when anything in it differs; a corrupt or truncated file is
detected (unreadable zip, wrong shapes, NaN, checksum mismatch) and rebuilt.

`FeatureOptions` are the backbone fields of a config, parsed once by experiments/config_fields.py (`options(config)`):
backbone (a registry name), backbone_kwargs.{weights, random_init, tiny}, layers (() = the backbone's default),
image_batch_size, dtype ('float32' | 'bfloat16': the backbone's compute dtype) and cache_dir; `build` makes
the backbone (unknown names and layers fail before any extraction), `features_of` reads through the cache,
`describe` is what metrics.json records. `pooling='rmac'` (with `rmac.*`, visim_jax/backbones/rmac.py) replaces the
multi-layer mean by R-MAC of one stage (VGG16 conv5_3: 512-d, images at their aspect ratio, max side 1024,
PCA-whitening learned on `rmac.whiten_on`), for every experiment that reads features through `features_of`.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from tqdm.auto import tqdm

from visim_jax.core import cpu_kernels
from visim_jax.core import device_rows, ops, report, sharding
from visim_jax.backbones.base import Backbone
from visim_jax.data import pipeline
from visim_jax.core.errors import UserError

CACHE_VERSION = 1


def pool_one(x: jax.Array) -> jax.Array:
  """Spatial (or token) mean of one stage's output, L2-normalised: (N, ..., C) -> (N, C)."""
  x = x.astype(jnp.float32)
  if x.ndim > 2:
    x = x.mean(axis=tuple(range(1, x.ndim - 1)))
  return ops.l2_normalize(x)


def pool(stages, layers: Sequence[str]) -> jax.Array:
  """Concatenation of pool_one over `layers` (in that order): the paper's image representation."""
  missing = [l for l in layers if l not in stages]
  if missing:
    raise ValueError(f'config.layers: {missing} not among the backbone stages {sorted(stages)}')
  return jnp.concatenate([pool_one(stages[l]) for l in layers], axis=-1)


def layer_dims(backbone: Backbone, layers: Sequence[str]) -> dict[str, int]:
  """{stage: channels} of `layers`: Backbone.layer_dims."""
  return backbone.layer_dims(layers)


def make_extract_fn(backbone: Backbone, layers: Sequence[str], dtype=jnp.float32):
  """A jitted uint8 NHWC batch -> (N, D) float32 pooled features; variables are an argument (not baked in).

  Cached on the backbone object, so repeated extractions (left, right, flipped...) compile once.
  """
  layers = tuple(layers)
  cache = backbone.__dict__.setdefault('_extract_fns', {})
  key = (layers, jnp.dtype(dtype).name)
  if key not in cache:
    @cpu_kernels.jit
    def fn(variables, images):
      b = Backbone(backbone.name, backbone.apply_fn, variables, backbone.preprocess, layers, backbone.weights_id)
      _, stages = b(images, dtype)
      return pool(stages, layers)
    cache[key] = fn
  return cache[key]


def extract(backbone: Backbone, paths: Sequence[str], layers: Sequence[str] | None = None,
            batch_size: int = 32, dtype: str = 'float32', progress: bool = True,
            desc: str = 'features', num_threads: int | None = None, flip: bool = False, loader=None,
            image_cache: str | None = None, prefetch: int = 4) -> np.ndarray:
  """Pooled features of every image in `paths` (order kept), as float32 (N, D).

  The host side is data/pipeline.py: images decoded one by one on `num_threads` threads (default: one per
  host core), `prefetch` batches ahead, batch k + 1 transferred while batch k computes. image_cache: a folder
  for the decoded-image cache (pipeline.host_batches; None: decode every time).

  loader(items, preprocess) -> uint8 (B, size, size, 3) replaces images.load_batch for sources that are not
  image files (e.g. data.classes.TfdsImages.load_batch; `paths` are then its item names).

  flip=True mirrors every image horizontally first (the adaptation paper's augmentation view).
  """
  layers = tuple(layers or backbone.layers)
  if batch_size < 1:
    raise ValueError(f'config.batch_size: must be >= 1, got {batch_size}')
  if not paths:
    raise ValueError('extract: empty image list')
  fn = make_extract_fn(backbone, layers, jnp.dtype(dtype))
  dim = sum(backbone.layer_dims(layers).values())
  out = np.empty((len(paths), dim), np.float32)
  # the batch axis is split over this host's devices; the weights are replicated on each
  mesh = sharding.make_mesh('batch', jax.local_devices())
  batch_size = sharding.padded(batch_size, mesh)
  variables = jax.device_put(backbone.variables, sharding.replicated(mesh))
  host = pipeline.host_batches(paths, backbone.preprocess, batch_size, flip=flip, loader=loader,
                               workers=num_threads, prefetch=prefetch, image_cache=image_cache)
  bar = tqdm(total=len(paths), desc=desc, unit='img', disable=not progress)
  pending = None  # the previous batch's (start, n, result): read back after the next one is dispatched

  def collect(p):
    start, n, y = p
    out[start:start + n] = np.asarray(y)[:n]
    bar.update(n)

  for start, n, x in pipeline.device_batches(host, lambda a: jax.device_put(a, sharding.split(mesh))):
    y = fn(variables, x)  # asynchronous: the device computes while the host reads back and decodes
    if pending is not None:
      collect(pending)
    pending = (start, n, y)
  if pending is not None:
    collect(pending)
  bar.close()
  return out


# ----------------------------------------------------------------------------------------------- cache

file_list_hash = pipeline.file_list_hash  # names, sizes and modification times of the files


def manifest_for(backbone: Backbone, paths: Sequence[str], layers: Sequence[str], dtype: str,
                 flip: bool = False, source_id: dict | None = None) -> dict:
  """What the cached features depend on (JSON-normalised, so it compares equal to its stored copy)."""
  return json.loads(json.dumps({
      'version': CACHE_VERSION,
      'backbone': backbone.name,
      'weights_sha256': backbone.weights_id,
      'layers': list(layers),
      'preprocessing': backbone.preprocess.describe(),
      'image_size': backbone.preprocess.size,
      'dtype': str(dtype),
      'flip': bool(flip),
      'num_images': len(paths),
      **({'file_list_sha256': file_list_hash(paths)} if source_id is None else {'source': source_id}),
  }))


def cache_path(cache_dir: str, tag: str, manifest: dict) -> str:
  key = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()[:16]
  return os.path.join(cache_dir, f'{tag}-{manifest["backbone"]}-{key}.npz')


def _checksum(features: np.ndarray) -> str:
  """sha256 of the array's bytes, hashed in place (no bytes copy of a cache of millions of rows)."""
  return hashlib.sha256(memoryview(np.ascontiguousarray(features)).cast('B')).hexdigest()


def read_cache(path: str, manifest: dict | None = None) -> tuple[np.ndarray, np.ndarray] | None:
  """(features, names) if `path` is a valid cache with this manifest; None if absent, stale or corrupt."""
  if not os.path.exists(path):
    return None
  try:
    with np.load(path, allow_pickle=False) as z:
      stored = json.loads(str(z['manifest']))
      features, names = z['features'], z['names']
    if stored.get('features_sha256') != _checksum(features):
      raise ValueError('checksum mismatch')
    if features.ndim != 2 or len(names) != len(features) or not device_rows.all_finite(features):
      raise ValueError('bad shapes or non-finite values')
  except Exception as e:  # zip errors, truncation, missing keys, bad json...
    logging.warning('feature cache %s is corrupt (%s): rebuilding it', path, e)
    return None
  if manifest is not None:
    stored = {k: v for k, v in stored.items() if k != 'features_sha256'}
    if stored != manifest:
      return None
  return features, names


def cached_features(backbone: Backbone, paths: Sequence[str], cache_dir: str | None,
                    layers: Sequence[str] | None = None, names: Sequence[str] | None = None,
                    tag: str = 'images', batch_size: int = 32, dtype: str = 'float32',
                    progress: bool = True, flip: bool = False, loader=None,
                    source_id: dict | None = None, image_cache: str | None = None) -> np.ndarray:
  """Features of `paths`, from the cache when its manifest matches, else extracted and cached.

  With cache_dir=None nothing is written. `names` (default: the paths) are stored beside the features.
  loader / source_id: items that are not files (see `extract`); source_id (JSON) then keys the cache in place
  of the file list's hash. image_cache: the decoded-image cache folder (`extract`), None: off.
  """
  layers = tuple(layers or backbone.layers)
  names = np.asarray(list(names if names is not None else paths))
  tag = tag + ('-flip' if flip else '')
  if cache_dir is None:
    return extract_all_hosts(backbone, paths, layers, batch_size, dtype, progress, desc=tag, flip=flip,
                             loader=loader, image_cache=image_cache)
  manifest = manifest_for(backbone, paths, layers, dtype, flip, source_id)
  path = cache_path(cache_dir, tag, manifest)
  hit = read_cache(path, manifest)
  if hit is not None and np.array_equal(hit[1], names):
    logging.info('feature cache hit: %s', path)
    return hit[0]
  if report.is_writer() and os.path.isdir(cache_dir) and not os.access(cache_dir, os.W_OK):
    raise UserError(f'{cache_dir}: the feature cache folder is read-only and does not hold the {tag} features of '
                    f'{backbone.name}; make it writable or set --config.cache_dir to a writable folder')
  feats = extract_all_hosts(backbone, paths, layers, batch_size, dtype, progress, desc=tag, flip=flip,
                            loader=loader, image_cache=image_cache)
  if not device_rows.all_finite(feats):
    raise FloatingPointError(f'{backbone.name}: non-finite features for {tag}; nothing cached')
  if report.is_writer():
    stored = dict(manifest, features_sha256=_checksum(feats))
    try:
      ops.save_npz_atomic(path, features=feats, names=names, manifest=np.asarray(json.dumps(stored, sort_keys=True)))
    except OSError as e:
      raise UserError(f'{e.filename or path}: cannot write the feature cache ({e.strerror}); free space or '
                      'set --config.cache_dir to a writable folder') from e
    logging.info('feature cache written: %s', path)
  return feats


def extract_all_hosts(backbone: Backbone, paths: Sequence[str], layers, batch_size: int, dtype: str,
                      progress: bool, desc: str, flip: bool, loader=None,
                      image_cache: str | None = None) -> np.ndarray:
  """`extract` with the file list split into one contiguous slice per host, gathered on every host."""
  n_proc = jax.process_count()
  if n_proc == 1:
    return extract(backbone, paths, layers, batch_size, dtype, progress, desc=desc, flip=flip, loader=loader,
                   image_cache=image_cache)
  from jax.experimental import multihost_utils
  per = -(-len(paths) // n_proc)
  lo = jax.process_index() * per
  mine = list(paths[lo:lo + per])
  dim = sum(backbone.layer_dims(layers).values())
  local = np.zeros((per, dim), np.float32)
  if mine:
    local[:len(mine)] = extract(backbone, mine, layers, batch_size, dtype, progress and report.is_writer(),
                                desc=desc, flip=flip, loader=loader, image_cache=image_cache)
  gathered = np.asarray(multihost_utils.process_allgather(local))  # (n_proc, per, dim)
  return gathered.reshape(-1, dim)[:len(paths)]


# ------------------------------------------------------------------------------------------ config glue
@dataclasses.dataclass(frozen=True)
class FeatureOptions:
  """The backbone fields of a config, parsed once (`options(config)`): what every function below takes."""
  backbone: str = 'efficientnet_lite0'
  backbone_kwargs: tuple = ()          # (name, value) of the options that are set
  layers: tuple = ()                   # () = the backbone's default pooled stages
  image_batch_size: int = 32
  dtype: str = 'float32'
  cache_dir: str = ''                  # resolved: never ''
  pooling: str = 'mean'
  rmac: object = None                  # rmac.Options when pooling == 'rmac'
  image_cache: bool = False            # decoded pixels kept under <cache_dir>/images (data/pipeline.py)


def cache_dir(path: str = '') -> str:
  """The feature cache folder: `path` (config.cache_dir) or ~/.cache/visim_jax/features."""
  return path or os.path.join(os.path.expanduser('~'), '.cache', 'visim_jax', 'features')


def check_cache_dir(path: str) -> str:
  """The feature cache folder, created now (before any extraction); a one-line UserError if it cannot be. A
  read-only folder is taken as it is: features it holds are read, a missing one is refused before extraction."""
  path = cache_dir(path)
  if os.path.isdir(path) and os.access(path, os.R_OK | os.X_OK) and not os.access(path, os.W_OK):
    return path
  ops.check_writable_dir(path, 'feature cache folder', label='config.cache_dir')
  return path


def build(opts: FeatureOptions) -> tuple[Backbone, tuple[str, ...]]:
  """(backbone, pooled layers); unknown names fail here, naming the field, before any extraction."""
  from visim_jax.backbones.registry import get_backbone  # deferred: transformers is heavy
  check_cache_dir(opts.cache_dir)
  backbone = get_backbone(opts.backbone, **dict(opts.backbone_kwargs))
  layers = opts.layers or tuple(backbone.layers)
  if opts.pooling == 'rmac':
    layers = (opts.rmac.layer,)
  backbone.layer_dims(layers)
  return backbone, layers


def describe(backbone: Backbone, layers: Sequence[str]) -> dict:
  return {'backbone': backbone.name, 'weights_sha256': backbone.weights_id, 'layers': list(layers),
          'image_size': backbone.preprocess.size, 'preprocessing': backbone.preprocess.describe()}


def features_of(opts: FeatureOptions, backbone: Backbone, layers: Sequence[str], paths: Sequence[str],
                names: Sequence[str] | None = None, tag: str = 'images', flip: bool = False,
                progress: bool = True, loader=None, source_id: dict | None = None) -> np.ndarray:
  """Pooled features of `paths` through the feature cache, with the options' batch size, dtype and cache."""
  if opts.pooling == 'rmac':
    if loader is not None:
      raise UserError('config.pooling: rmac reads image files only (not a TFDS loader)')
    return rmac_features(opts, backbone, paths, tag=tag, progress=progress, flip=flip)
  return cached_features(backbone, paths, opts.cache_dir, layers=layers, names=names, tag=tag,
                         batch_size=opts.image_batch_size, dtype=opts.dtype, progress=progress, flip=flip,
                         loader=loader, source_id=source_id,
                         image_cache=os.path.join(opts.cache_dir, 'images') if opts.image_cache else None)


def rmac_features(opts: FeatureOptions, backbone: Backbone, paths: Sequence[str], bboxes=None, tag: str = 'images',
                  progress: bool = True, flip: bool = False) -> np.ndarray:
  """R-MAC descriptors of image files (cropped to `bboxes`: x1, y1, x2, y2 per image, if given) through the
  region-vector cache, whitened on rmac.whiten_on."""
  from visim_jax.backbones import rmac  # pylint: disable=g-import-not-at-top
  return rmac.describe_images(backbone, paths, opts.rmac, opts.cache_dir, file_list_hash, bboxes,
                              tag, opts.image_batch_size, opts.dtype, progress, flip)
