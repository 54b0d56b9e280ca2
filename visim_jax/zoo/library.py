"""The library's maps, masks, resizing, input range and resolution (issue 46), beside visim_jax/api.py's Model:
the host-side steps (checking masks, resizing pairs, bringing masks through an embedding model's geometry) around
the pure functions of zoo/spatial.py and models/spatial.py. docs/library.md "Maps", "Masks", "Any resolution",
"Input ranges".
"""
from __future__ import annotations

import numpy as np

from visim_jax.zoo.inputs import WHERE, _as_items, _is_path, _to_pil, arrays_of
from visim_jax.core.errors import UserError


def from_minus_one(images):
  """input_range='-1,1': every float array (alone or in a list) checked to lie in [-1, 1] and mapped to (x + 1) / 2;
  uint8 arrays, paths and PIL images as they are."""
  if isinstance(images, (list, tuple)):
    return [from_minus_one(im) for im in images]
  if _is_path(images) or not (isinstance(images, np.ndarray) or hasattr(images, '__array__')):
    return images
  a = np.asarray(images)
  if not np.issubdtype(a.dtype, np.floating):
    return images
  if a.size and not (np.all(np.isfinite(a)) and a.min() >= -1.0 - 1e-3 and a.max() <= 1.0 + 1e-3):
    raise UserError(f"{WHERE}: input_range='-1,1' but a float array spans [{float(np.nanmin(a)):.3g}, "
                    f'{float(np.nanmax(a)):.3g}]: give floats in [-1, 1] (or drop input_range for [0, 1])')
  return np.clip((a.astype(np.float32) + 1.0) / 2.0, 0.0, 1.0)


RESIZE_HELP = "resize: 'none' (refuse different sizes), 'shorter' or 'HxW' (e.g. '256x256')"


def parse_resize(resize) -> tuple[int, int] | str:
  """'none' | 'shorter' | 'HxW' -> the same, 'HxW' as (H, W); anything else one line."""
  r = str(resize).strip().lower()
  if r in ('none', 'shorter'):
    return r
  h, x, w = r.partition('x')
  if x and h.isdigit() and w.isdigit() and 8 <= int(h) <= 8192 and 8 <= int(w) <= 8192:
    return int(h), int(w)
  raise UserError(f'{WHERE}: resize={resize!r}; {RESIZE_HELP}, sides in 8..8192')


def _resize_one(a: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
  """One (H, W, C) uint8 or float [0, 1] array -> (h, w, C) by PIL's bicubic (antialiased when shrinking); floats
  are resized per channel in float32 ('F' mode), uint8 stays uint8."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  if tuple(a.shape[:2]) == tuple(hw):
    return a
  size = (hw[1], hw[0])
  if a.dtype == np.uint8:
    return np.asarray(Image.fromarray(a).resize(size, Image.BICUBIC))
  return np.stack([np.asarray(Image.fromarray(a[..., c].astype(np.float32), 'F').resize(size, Image.BICUBIC))
                   for c in range(a.shape[-1])], -1).clip(0.0, 1.0)


def _crop_centre(a: np.ndarray, hw) -> np.ndarray:
  top, left = (a.shape[0] - hw[0]) // 2, (a.shape[1] - hw[1]) // 2
  return a[top:top + hw[0], left:left + hw[1]]


def _geometry(shapes, resize):
  """The common (H, W) and each image's (resized size) under `resize` ('shorter': every image's shorter side
  scaled to the smallest shorter side of all, then centre-cropped to the smallest height and width)."""
  if isinstance(resize, tuple):
    return resize, [resize] * len(shapes)
  s = min(min(h, w) for h, w in shapes)
  scaled = [(max(s, round(h * s / min(h, w))), max(s, round(w * s / min(h, w)))) for h, w in shapes]
  return (min(h for h, _ in scaled), min(w for _, w in scaled)), scaled


def pair_inputs(model, img0, img1, resize):
  """(x0, x1, per-image resize plan) float32 [0, 1] NHWC: what the map and the masked distance feed the model
  (embedding models: model.preprocess; the others the images, resized as `resize` says, same size both)."""
  plan = parse_resize(resize)
  if model.is_embedding:
    x0, x1 = model.preprocess(img0), model.preprocess(img1)
    plan = 'none'
  else:
    a0 = [np.asarray(a) for a in arrays_of(model._input_range(img0), 'img0')]  # pylint: disable=protected-access
    a1 = [np.asarray(a) for a in arrays_of(model._input_range(img1), 'img1')]  # pylint: disable=protected-access
    if len(a0) != len(a1):
      raise UserError(f'{WHERE}: img0 has {len(a0)} images, img1 {len(a1)}: give pairs')
    if plan != 'none':
      common, sizes = _geometry([a.shape[:2] for a in a0 + a1], plan)
      fit = lambda a, hw: _crop_centre(_resize_one(a, hw), common)   # noqa: E731
      a0 = [fit(a, hw) for a, hw in zip(a0, sizes[:len(a0)])]
      a1 = [fit(a, hw) for a, hw in zip(a1, sizes[len(a0):])]
      plan = (common, sizes[:len(a0)])
    x0, x1 = _stack_unit(a0, 'img0'), _stack_unit(a1, 'img1')
    if x0.shape != x1.shape:
      raise UserError(f'{WHERE}: img0 {x0.shape} and img1 {x1.shape} differ: {model.kind} compares same-size images '
                      f"(pass resize='shorter' or resize='HxW', or resize them first)")
  if len(x0) != len(x1):
    raise UserError(f'{WHERE}: img0 has {len(x0)} images, img1 {len(x1)}: give pairs')
  return x0, x1, plan


def _stack_unit(arrays, what) -> np.ndarray:
  if not arrays:
    return np.zeros((0, 64, 64, 3), np.float32)
  shapes = {a.shape for a in arrays}
  if len(shapes) > 1:
    raise UserError(f'{WHERE}: {what}: images of different sizes {sorted(shapes)[:3]}: pass resize=\'shorter\' '
                    "or resize='HxW' (or resize them first)")
  return np.stack([a.astype(np.float32) / np.float32(255.0) if a.dtype == np.uint8 else a.astype(np.float32)
                   for a in arrays])


def cached_jit(sim, key: str, fn):
  """One jitted map / masked function per loaded model (kept on its Similarity: one compilation per shape)."""
  from visim_jax.core import cpu_kernels  # pylint: disable=g-import-not-at-top
  cache = sim.__dict__.setdefault('_api_jits', {})
  if key not in cache:
    cache[key] = cpu_kernels.jit(fn)
  return cache[key]


def _mask_array(mask, n: int, sizes) -> np.ndarray:
  """mask (H, W) or (N, H, W), boolean (or 0 / 1) at each img0's size -> (N, H, W) float32; an empty mask, a
  wrong shape or non-binary values are one line."""
  m = np.asarray(mask)
  if m.dtype != bool:
    if not (np.issubdtype(m.dtype, np.number) and m.size and np.isin(m, (0, 1)).all()):
      raise UserError(f'{WHERE}: mask: a boolean (or 0 / 1) array of shape (H, W) or (N, H, W), got {m.dtype} '
                      f'{m.shape}')
    m = m.astype(bool)
  if m.ndim == 2:
    m = np.broadcast_to(m, (n,) + m.shape)
  if m.ndim != 3 or len(m) != n:
    raise UserError(f'{WHERE}: mask: shape {m.shape}; (H, W) or (N, H, W) with N = {n} pairs')
  for i, hw in enumerate(sizes):
    if tuple(m[i].shape) != tuple(hw):
      raise UserError(f'{WHERE}: mask: {m.shape[1]}x{m.shape[2]} but img0[{i}] is {hw[0]}x{hw[1]}: a mask has '
                      "img0's size (height x width)")
    if not m[i].any():
      raise UserError(f'{WHERE}: mask: the mask of pair {i} is empty (no location to compare)')
  return m


def _mask_to_network(model, m: np.ndarray) -> np.ndarray:
  """Each (H, W) mask through the geometry the embedding model's images take (data/images.resize: resize and
  crop with the backbone's kernel) -> (N, S, S) coverage weights in [0, 1]."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  from visim_jax.data import images as images_lib  # pylint: disable=g-import-not-at-top
  pre = model.similarity.preprocess
  out = [np.asarray(images_lib.resize(Image.fromarray(np.repeat(mi[..., None], 3, -1).astype(np.uint8) * 255),
                                      pre), np.float32)[..., 0] / 255.0 for mi in m]
  return np.clip(np.stack(out), 0.0, 1.0).astype(np.float32)


def _image_sizes(images, what) -> list[tuple[int, int]]:
  items, _ = _as_items(images, what)
  sizes = []
  for it in items:
    if isinstance(it, np.ndarray):
      sizes.append(tuple(it.shape[:2]))
    else:
      w, h = _to_pil(it).size
      sizes.append((h, w))
  return sizes


def masked_distance(model, img0, img1, mask, resize, single: bool):
  """Model.distance with mask= and / or resize= (docs/library.md "Masks", "Any resolution")."""
  from visim_jax.zoo import spatial as zoo_spatial  # pylint: disable=g-import-not-at-top
  if mask is None:
    if model.is_embedding:   # embedding models resize every image to their input size already
      parse_resize(resize)
      return model.distance(img0, img1)
    x0, x1, _ = pair_inputs(model, img0, img1, resize)
    d = (np.asarray(cached_jit(model.similarity, 'pair', model.apply_distance)(model.params, x0, x1)) if len(x0)
         else np.zeros(0))
    if model.kind == 'lpips':   # the zoo's identical-pair rule (lpips.pair_distance): exactly 0
      d = np.where(np.all(x0 == x1, axis=(1, 2, 3)), 0.0, d)
    return float(d[0]) if single else d.astype(np.float32)
  fn = zoo_spatial.masked_fn(model.similarity)
  sizes0 = _image_sizes(img0, 'img0')
  m = _mask_array(mask, len(sizes0), sizes0)
  if m.all():   # an all-true mask is the unmasked distance, computed as such
    return model.distance(img0, img1, resize=resize)
  x0, x1, plan = pair_inputs(model, img0, img1, resize)
  if model.is_embedding:
    w = _mask_to_network(model, m)
  elif plan == 'none':
    w = m.astype(np.float32)
  else:
    common, sizes = plan
    w = np.stack([_crop_centre(_resize_one(mi.astype(np.float32)[..., None], hw), common)[..., 0]
                  for mi, hw in zip(m, sizes)]).clip(0.0, 1.0)
  if not (w.reshape(len(w), -1).max(-1) > 0).all():
    raise UserError(f'{WHERE}: mask: a mask covers nothing once resized to the compared size')
  jf = cached_jit(model.similarity, 'masked', fn)
  b = model.batch_size
  d = np.concatenate([np.asarray(jf(model.params, x0[s:s + b], x1[s:s + b], w[s:s + b]))
                      for s in range(0, len(x0), b)])
  return float(d[0]) if single else d.astype(np.float32)


def at_image_size(spec, sim, image_size, opts, where: str = f'{WHERE}: image_size'):
  """The Similarity with its ViT tower at image_size (backbones/resolution.py); other kinds refuse in one line,
  naming `where` (the library's argument, or config.image_size for the benchmark)."""
  import dataclasses as dc  # pylint: disable=g-import-not-at-top
  import json  # pylint: disable=g-import-not-at-top
  from visim_jax.backbones import resolution  # pylint: disable=g-import-not-at-top
  from visim_jax.zoo import interface  # pylint: disable=g-import-not-at-top
  if sim.backbone is None:
    raise UserError(f"{where}={image_size!r}: {spec!r} compares the images at their own size; give "
                    "distance(..., resize='HxW') to change it")
  bb = resolution.at_image_size(sim.backbone, image_size, where)
  if bb is sim.backbone:
    return sim
  ident = {**sim.identity, 'image_size': image_size}
  return dc.replace(sim, backbone=bb, preprocess=bb.preprocess, identity=ident,
                    featurizer=interface.pooled_featurizer(bb, sim.layers, opts, sim.transform),
                    feature_key=('pooled', json.dumps(ident, sort_keys=True)))


def has_position_embeddings(sim) -> bool:
  """Whether `image_size` changes this model: an embedding model whose tower holds ViT position embeddings."""
  from visim_jax.backbones import resolution  # pylint: disable=g-import-not-at-top
  return sim.backbone is not None and resolution.has_position_embeddings(sim.backbone)


def at_image_size_all(models: dict, image_size: int, opts, where: str, say=print) -> dict:
  """{spec: Similarity} with every ViT tower at image_size (at_image_size; 0: all as they are), the others (CNNs,
  LPIPS, the pixel metrics) at their own size, `say` told which is which; no ViT among them: refused naming `where`."""
  if not image_size:
    return models
  vits = [s for s, sim in models.items() if has_position_embeddings(sim)]
  if not vits:
    raise UserError(f'{where}={image_size!r}: none of the models has a ViT tower whose position embeddings it could '
                    'interpolate (CNNs, LPIPS and the metrics run at their own size): set 0 (each model\'s own)')
  out = {s: at_image_size(s, sim, image_size, opts, where) if s in vits else sim for s, sim in models.items()}
  rest = [s for s in models if s not in vits]
  say(f'{where}={image_size}: {", ".join(vits)} at {image_size} px (position embeddings interpolated)'
      + (f'; {", ".join(rest)} at their own size' if rest else ''))
  return out
