"""R-MAC: regional maximum activations of convolutions (Tolias, Sicre & Jegou, ICLR 2016), as paper 002 uses it.

Given a post-ReLU convolutional map X (H, W, C) (VGG16 conv5_3 by default):
1. Regions (`region_grid`, Tolias et al. Sec. 3 and their `rmac_regionvec_act.m`, as copied into the SimNet
   authors' RMAC/ folder and cirtorch's `rmac`): square regions at levels l = 1..L (L = 3), side
   wl = floor(2 min(H, W) / (l + 1)); along the long side the number of regions is l + m, where the extra m in
   1..6 is the one making consecutive level-1 regions overlap closest to 40%:
   m = argmin_m | (w^2 - w b_m) / w^2 - 0.4 |, b_m = (max(H, W) - w) / m, w = min(H, W) (m = 0 for a square map);
   region starts are floor(wl2 + i b) - wl2 with b = (side - wl) / (count - 1), wl2 = floor(wl / 2 - 1).
2. Per region, the max over its cells (MAC), then L2 (`region_vectors`).
3. PCA-whitening learned on region vectors of a *separate* image set (`learn_whitening`: visim_jax.core.pca.fit with
   whiten=True; the paper: Paris for every dataset), applied to each region vector, then L2 again.
4. Sum of the region vectors, then L2 (`aggregate`): one C-d descriptor (512 for VGG16).
Without a whitening, step 3 is skipped (the "R-MAC without PCA" variant). `include_global=True` adds the
whole-map MAC as one more region (cirtorch's variant; not Tolias', not the SimNet authors').

Everything in the math section is pure and jitted; the region grid is computed from the *static* map shape at
trace time, so one batch = maps of one shape, and a batch of any shape compiles once. `region_vectors_padded`
returns a fixed R_max with a mask so images of different shapes can be stacked afterwards.

Host side (`extract_regions`, `descriptors`, `describe_images`): images keep their aspect ratio and are scaled down so that their
longer side is at most `max_side` (1024, the paper's "re-scaled up to 1024 pixels"; smaller images and query
crops are not enlarged, as cirtorch's `imresize` and the authors' test.m, which feeds the crops as they are);
images of the same resulting shape are batched together (shape buckets; a bucket's last batch padded to a power
of two), so every bucket runs one or a few jitted programs. Region vectors (before whitening) are what gets cached (`cached_regions`: one .npz per image list x
backbone x weights x options, with its manifest): the whitening can then be learned on one set and applied to
another without re-running the network. `Options.whiten_on` names that set: an image folder, an .npz of region
vectors (`regions`), or a learned whitening (`mean`, `components`, `scale`, as `save_whitening` writes).
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import json
import math
import os
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from visim_jax.core import cpu_kernels
from visim_jax.core import ops, pca
from visim_jax.core.errors import UserError

OVERLAP = 0.4
STEPS = (2, 3, 4, 5, 6, 7)     # candidate region counts along the long side at level 1


# ------------------------------------------------------------------------------------------ the math (pure)

def extra_regions(h: int, w: int, overlap: float = OVERLAP) -> tuple[int, int]:
  """(extra regions along H, along W): the m in 1..6 for the long side (0 for the short one / a square map)."""
  small, big = min(h, w), max(h, w)
  if h == w:
    return 0, 0
  costs = [abs((small ** 2 - small * ((big - small) / (s - 1))) / small ** 2 - overlap) for s in STEPS]
  m = int(np.argmin(costs)) + 1          # first minimum, as MATLAB's min / torch.min
  return (m, 0) if h > w else (0, m)


def region_grid(h: int, w: int, levels: int = 3, overlap: float = OVERLAP) -> tuple[tuple[int, int, int, int], ...]:
  """Regions of an h x w map as (level, top, left, side), level by level, row-major within a level."""
  hd, wd = extra_regions(h, w, overlap)
  small = min(h, w)
  out = []
  for l in range(1, levels + 1):
    wl = math.floor(2 * small / (l + 1))
    wl2 = math.floor(wl / 2 - 1)

    def starts(side, extra):
      n = l + extra
      b = 0.0 if n == 1 else (side - wl) / (n - 1)
      return [math.floor(wl2 + i * b) - wl2 for i in range(n)]

    if wl == 0:
      continue
    out += [(l, t, s, wl) for t in starts(h, hd) for s in starts(w, wd)]
  return tuple(out)


def region_counts(h: int, w: int, levels: int = 3, overlap: float = OVERLAP) -> list[int]:
  """Number of regions per level (1..levels) for an h x w map."""
  grid = region_grid(h, w, levels, overlap)
  return [sum(1 for g in grid if g[0] == l) for l in range(1, levels + 1)]


@functools.partial(cpu_kernels.jit, static_argnames=('levels', 'overlap', 'include_global'))
def region_vectors(fmap: jax.Array, levels: int = 3, overlap: float = OVERLAP,
                   include_global: bool = False) -> jax.Array:
  """(N, H, W, C) map -> (N, R, C) L2-normalised region MACs (float32), R = len(region_grid(H, W)) (+1)."""
  x = fmap.astype(jnp.float32)
  grid = region_grid(x.shape[1], x.shape[2], levels, overlap)
  vecs = [x[:, t:t + s, l:l + s, :].max(axis=(1, 2)) for _, t, l, s in grid]
  if include_global:
    vecs = [x.max(axis=(1, 2))] + vecs
  return ops.l2_normalize(jnp.stack(vecs, axis=1))


def num_regions(h: int, w: int, levels: int = 3, overlap: float = OVERLAP, include_global: bool = False) -> int:
  return len(region_grid(h, w, levels, overlap)) + int(include_global)


def apply_whitening(white: pca.PCA | None, regions: jax.Array) -> jax.Array:
  """PCA-whitening of L2-normalised region vectors (..., C) -> (..., dim), L2 again; identity if white is None."""
  if white is None:
    return regions
  return ops.l2_normalize(pca.transform(white, regions))


@cpu_kernels.jit
def aggregate(regions: jax.Array, white: pca.PCA | None = None, mask: jax.Array | None = None) -> jax.Array:
  """R-MAC descriptors from region vectors (N, R, C) (mask (N, R): valid regions): whiten + L2 per region (if
  `white`), sum over regions, L2 -> (N, dim)."""
  v = apply_whitening(white, ops.l2_normalize(regions.astype(jnp.float32)))
  if mask is not None:
    v = v * mask[..., None].astype(v.dtype)
  return ops.l2_normalize(v.sum(axis=1))


def rmac(fmap: jax.Array, white: pca.PCA | None = None, levels: int = 3, overlap: float = OVERLAP,
         include_global: bool = False) -> jax.Array:
  """R-MAC of a batch of same-shape maps (N, H, W, C) -> (N, dim): `region_vectors` then `aggregate`."""
  return aggregate(region_vectors(fmap, levels, overlap, include_global), white)


def learn_whitening(regions: jax.Array, dim: int | None = None) -> pca.PCA:
  """PCA-whitening (mean, top-`dim` eigenvectors, 1/std) of region vectors (M, C), L2-normalised first (as the
  vectors it is applied to). dim defaults to C (512 for VGG16: the paper's 512-d descriptor)."""
  x = ops.l2_normalize(jnp.asarray(regions, jnp.float32))
  return pca.fit(x, int(dim or x.shape[1]), whiten=True)


# ------------------------------------------------------------------------------------------------ host side

def scaled_size(width: int, height: int, max_side: int, upscale: bool = False) -> tuple[int, int]:
  """(width, height) with the longer side at most `max_side` (aspect kept); enlarged only if `upscale`."""
  scale = max_side / max(width, height)
  if scale >= 1.0 and not upscale:
    return width, height
  return max(1, round(width * scale)), max(1, round(height * scale))


def load_image(path: str, max_side: int = 1024, bbox: Sequence[float] | None = None,
               upscale: bool = False) -> np.ndarray:
  """uint8 (H, W, 3): the image (cropped to bbox = x1, y1, x2, y2 in its own pixels, as the Oxford/Paris
  queries), longer side scaled to at most max_side, aspect ratio kept (bilinear)."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  from visim_jax.data import images as images_lib  # pylint: disable=g-import-not-at-top
  im = images_lib.open_rgb(path)
  if bbox is not None and np.all(np.isfinite(bbox)):
    x1, y1, x2, y2 = (int(round(float(v))) for v in bbox)
    x1, y1 = max(0, x1), max(0, y1)
    x2, y2 = min(im.size[0], max(x2, x1 + 1)), min(im.size[1], max(y2, y1 + 1))
    im = im.crop((x1, y1, x2, y2))
  size = scaled_size(im.size[0], im.size[1], max_side, upscale)
  if size != im.size:
    im = im.resize(size, Image.Resampling.BILINEAR)
  return np.asarray(im, np.uint8)


_REGIONS_FNS: dict = {}


def make_regions_fn(backbone, layer: str = 'conv5_3', levels: int = 3, include_global: bool = False,
                    dtype: str = 'float32'):
  """A jitted (variables, uint8 (N, H, W, 3)) -> (N, R, C) region vectors of `layer`; recompiles per shape only.
  One per backbone (name, weights) and options: building the same backbone twice compiles once."""
  cache = _REGIONS_FNS
  key = (backbone.name, backbone.weights_id, layer, levels, include_global, dtype)
  if key not in cache:
    dt = jnp.dtype(dtype)

    @cpu_kernels.jit
    def fn(variables, images):
      x = backbone.preprocess.normalise(images, dt)
      if dt != jnp.float32:
        variables = jax.tree.map(lambda v: v.astype(dt) if jnp.issubdtype(v.dtype, jnp.floating) else v, variables)
      _, stages = backbone.apply_fn(variables, x)
      if layer not in stages:
        raise ValueError(f'config.rmac.layer: {layer!r} is not a {backbone.name} stage ({", ".join(stages)})')
      return region_vectors(stages[layer], levels, include_global=include_global)
    cache[key] = fn
  return cache[key]


def extract_regions(backbone, paths: Sequence[str], bboxes: Sequence | None = None, layer: str = 'conv5_3',
                    levels: int = 3, max_side: int = 1024, batch_size: int = 8, include_global: bool = False,
                    dtype: str = 'float32', upscale: bool = False, progress: bool = True,
                    desc: str = 'R-MAC', flip: bool = False) -> tuple[np.ndarray, np.ndarray]:
  """Region vectors of every image: (regions (M, C) float32, offsets (N + 1,) int64; image i owns rows
  offsets[i]:offsets[i+1]). Images are grouped by their scaled shape; each group runs in batches of one shape."""
  from tqdm.auto import tqdm  # pylint: disable=g-import-not-at-top
  if not len(paths):
    raise ValueError('R-MAC: empty image list')
  fn = make_regions_fn(backbone, layer, levels, include_global, dtype)
  images = [load_image(p, max_side, None if bboxes is None else bboxes[i], upscale) for i, p in
            enumerate(tqdm(paths, desc=f'{desc} (decode)', unit='img', disable=not progress))]
  if flip:   # the mirrored view (the adaptation experiment's augmentation)
    images = [np.ascontiguousarray(im[:, ::-1]) for im in images]
  buckets = collections.defaultdict(list)
  for i, im in enumerate(images):
    buckets[im.shape].append(i)
  per_image = [None] * len(paths)
  bar = tqdm(total=len(paths), desc=desc, unit='img', disable=not progress)
  for shape, idx in sorted(buckets.items()):
    for s in range(0, len(idx), batch_size):
      chunk = idx[s:s + batch_size]
      x = np.stack([images[i] for i in chunk])
      n = min(batch_size, 1 << (len(chunk) - 1).bit_length())   # pad to a power of two: few programs per shape
      if n > len(chunk):
        x = np.concatenate([x, np.zeros((n - len(chunk),) + x.shape[1:], x.dtype)])
      r = np.asarray(fn(backbone.variables, x))
      for j, i in enumerate(chunk):
        per_image[i] = r[j]
      bar.update(len(chunk))
  bar.close()
  counts = np.asarray([len(r) for r in per_image], np.int64)
  offsets = np.concatenate([[0], np.cumsum(counts)])
  return np.concatenate(per_image).astype(np.float32), offsets


def pad_regions(regions: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Ragged (M, C) + offsets -> padded (N, R_max, C) and mask (N, R_max)."""
  counts = np.diff(offsets)
  n, r_max = len(counts), int(counts.max()) if len(counts) else 0
  out = np.zeros((n, r_max, regions.shape[1]), np.float32)
  mask = np.zeros((n, r_max), bool)
  for i, (a, c) in enumerate(zip(offsets[:-1], counts)):
    out[i, :c] = regions[a:a + c]
    mask[i, :c] = True
  return out, mask


def descriptors(regions: np.ndarray, offsets: np.ndarray, white: pca.PCA | None = None,
                chunk: int = 1024) -> np.ndarray:
  """Final R-MAC descriptors (N, dim) from cached region vectors, whitened by `white` (or not)."""
  padded, mask = pad_regions(regions, offsets)
  out = [np.asarray(aggregate(jnp.asarray(padded[i:i + chunk]), white, jnp.asarray(mask[i:i + chunk])))
         for i in range(0, len(padded), chunk)]
  return np.concatenate(out).astype(np.float32)


# ------------------------------------------------------------------------------- options, cache, whitening

@dataclasses.dataclass(frozen=True)
class Options:
  """How R-MAC descriptors are made (config.rmac.*)."""
  layer: str = 'conv5_3'         # the backbone stage pooled (VGG16: conv5_3, Tolias; pool5: the SimNet authors')
  levels: int = 3                # L
  max_side: int = 1024           # images scaled so their longer side is at most this
  upscale: bool = False          # also enlarge smaller images to max_side
  include_global: bool = False   # add the whole-map MAC as a region (cirtorch)
  whiten_on: str = ''            # '' (none) | .npz (regions (M, C) or mean/components[/scale]) | an image folder
  whiten_dim: int = 0            # 0: as many as channels

  def __post_init__(self):
    if self.levels < 1:
      raise UserError(f'config.rmac.levels: must be >= 1, got {self.levels}')
    if self.max_side < 32:
      raise UserError(f'config.rmac.max_side: must be >= 32, got {self.max_side}')
    if self.whiten_dim < 0:
      raise UserError(f'config.rmac.whiten_dim: must be >= 0, got {self.whiten_dim}')

  def describe(self) -> dict:
    return dataclasses.asdict(self)


def regions_manifest(backbone, opts: Options, dtype: str, file_key: str, bboxes=None, flip: bool = False) -> dict:
  """What cached region vectors depend on (JSON-normalised)."""
  return json.loads(json.dumps({
      'version': 1, 'kind': 'rmac_regions', 'backbone': backbone.name, 'weights_sha256': backbone.weights_id,
      'layer': opts.layer, 'levels': opts.levels, 'max_side': opts.max_side, 'upscale': opts.upscale,
      'include_global': opts.include_global, 'mean': list(backbone.preprocess.mean),
      'std': list(backbone.preprocess.std), 'dtype': str(dtype), 'file_list_sha256': file_key, 'flip': bool(flip),
      'bboxes_sha256': None if bboxes is None else
      hashlib.sha256(np.ascontiguousarray(np.asarray(bboxes, np.float64)).tobytes()).hexdigest()}))


def cached_regions(backbone, paths: Sequence[str], opts: Options, cache_dir: str | None, file_key: str,
                   bboxes=None, tag: str = 'images', batch_size: int = 8, dtype: str = 'float32',
                   progress: bool = True, flip: bool = False) -> tuple[np.ndarray, np.ndarray]:
  """`extract_regions` behind a cache file `<cache_dir>/rmac-<tag>-<backbone>-<key>.npz` (regions, offsets,
  manifest); reused when the manifest matches, rebuilt when it differs or the file is unreadable."""
  manifest = regions_manifest(backbone, opts, dtype, file_key, bboxes, flip)
  tag += '-flip' if flip else ''
  path = None
  if cache_dir:
    key = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()[:16]
    path = os.path.join(cache_dir, f'rmac-{tag}-{backbone.name}-{key}.npz')
    try:
      with np.load(path, allow_pickle=False) as z:
        if json.loads(str(z['manifest'])) == manifest and len(z['offsets']) == len(paths) + 1:
          return z['regions'], z['offsets']
    except Exception:  # absent, truncated, stale: rebuild  # pylint: disable=broad-except
      pass
  regions, offsets = extract_regions(backbone, paths, bboxes, opts.layer, opts.levels, opts.max_side, batch_size,
                                     opts.include_global, dtype, opts.upscale, progress, desc=f'R-MAC {tag}',
                                     flip=flip)
  if path is not None and jax.process_index() == 0:
    ops.save_npz_atomic(path, regions=regions, offsets=offsets, manifest=np.asarray(json.dumps(manifest)))
  return regions, offsets


def images_in(folder: str) -> list[str]:
  """The image files of a folder (sorted), for whiten_on=<folder>; a dataset root in the Oxford/Paris layout
  (data/retrieval.py: jpg/, oxbuild_images/, ...) means its image folder."""
  from visim_jax.data import images as images_lib  # pylint: disable=g-import-not-at-top
  from visim_jax.data import retrieval as retrieval_data  # pylint: disable=g-import-not-at-top
  for sub in retrieval_data.IMAGE_DIRS:
    if os.path.isdir(os.path.join(folder, sub)):
      return images_lib.list_images(os.path.join(folder, sub))
  return images_lib.list_images(folder)


def load_whitening(backbone, opts: Options, cache_dir: str | None, file_key_fn, batch_size: int = 8,
                   dtype: str = 'float32', progress: bool = True) -> pca.PCA | None:
  """The PCA-whitening named by opts.whiten_on: None for ''; an .npz with `regions` (M, C) to learn it from or
  with `mean` (C,), `components` (C, d) [, `scale` (d,)] (a learned one); an image folder (its images' region
  vectors, extracted with the same backbone and options, learn it)."""
  src = os.path.expanduser(opts.whiten_on)
  if not src:
    return None
  dim = opts.whiten_dim or None
  paths = images_in(src) if os.path.isdir(src) else None
  source_key = file_key_fn(paths) if paths is not None else (
      f'{os.path.abspath(src)}:{os.stat(src).st_size}:{os.stat(src).st_mtime_ns}' if os.path.isfile(src) else src)
  key = (backbone.name, backbone.weights_id, opts, dtype, source_key)
  if key not in _WHITENINGS:   # learned once per process (every descriptor set of a run uses it)
    _WHITENINGS[key] = _load_whitening(backbone, opts, src, dim, paths, cache_dir, file_key_fn, batch_size, dtype,
                                       progress)
  return _WHITENINGS[key]


_WHITENINGS: dict = {}


def _load_whitening(backbone, opts, src, dim, paths, cache_dir, file_key_fn, batch_size, dtype, progress):
  if paths is not None:
    regions, _ = cached_regions(backbone, paths, opts, cache_dir, file_key_fn(paths), None, 'whiten', batch_size,
                                dtype, progress)
  elif os.path.isfile(src) and src.endswith('.npz'):
    from visim_jax.data import npz  # pylint: disable=g-import-not-at-top
    z = npz.read_arrays(src, (), ('regions', 'mean', 'components', 'scale'), field='config.rmac.whiten_on')
    if 'mean' in z and 'components' in z:
      mean, comps = z['mean'].astype(np.float32), z['components'].astype(np.float32)
      scale = z['scale'].astype(np.float32) if 'scale' in z else np.ones(comps.shape[1], np.float32)
      if mean.ndim != 1 or comps.shape[:1] != mean.shape or scale.shape != comps.shape[1:]:
        raise UserError(f'config.rmac.whiten_on: {src}: mean {mean.shape}, components {comps.shape}, scale '
                        f'{scale.shape} do not fit together')
      return pca.PCA(jnp.asarray(mean), jnp.asarray(comps[:, :dim]), jnp.asarray(scale[:dim]))
    if 'regions' not in z:
      raise UserError(f'config.rmac.whiten_on: {src}: needs `regions` (M, C) or `mean` + `components`')
    regions = z['regions'].astype(np.float32)
  else:
    raise UserError(f'config.rmac.whiten_on: {src} is neither an image folder nor an .npz file')
  if regions.ndim != 2 or len(regions) < regions.shape[1]:
    raise UserError(f'config.rmac.whiten_on: {opts.whiten_on}: {regions.shape} region vectors; learning a '
                    f'{regions.shape[-1]}-d whitening needs at least as many vectors as dimensions (add images)')
  return learn_whitening(regions, dim)


def save_whitening(path: str, white: pca.PCA) -> None:
  """A learned whitening as an .npz (mean, components, scale) that whiten_on accepts."""
  ops.save_npz_atomic(path, mean=np.asarray(white.mean), components=np.asarray(white.components),
                      scale=np.asarray(white.scale))


def describe_images(backbone, paths: Sequence[str], opts: Options, cache_dir: str | None, file_key_fn,
                    bboxes=None, tag: str = 'images', batch_size: int = 8, dtype: str = 'float32',
                    progress: bool = True, flip: bool = False) -> np.ndarray:
  """R-MAC descriptors (N, C or whiten_dim) of image files (cropped to `bboxes` if given), whitened as
  opts.whiten_on says; region vectors come from / go to the cache. file_key_fn(paths) -> a hash of the file list
  (visim_jax.backbones.features.file_list_hash)."""
  white = load_whitening(backbone, opts, cache_dir, file_key_fn, batch_size, dtype, progress)
  regions, offsets = cached_regions(backbone, paths, opts, cache_dir, file_key_fn(paths), bboxes, tag, batch_size,
                                    dtype, progress, flip)
  return descriptors(regions, offsets, white)
