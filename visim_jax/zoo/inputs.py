"""How the library face (visim_jax/api.py) reads images: paths, PIL images, (H, W, 3) / (N, H, W, 3) arrays or
lists of them, checked (uint8, or float in [0, 1]) and decoded as the command line decodes them."""
from __future__ import annotations

import os

import numpy as np

from visim_jax.core.errors import UserError

WHERE = 'visim_jax.load'


def _is_path(x) -> bool:
  return isinstance(x, (str, os.PathLike))


def _check_array(a: np.ndarray, what: str) -> np.ndarray:
  if a.dtype == np.uint8:
    return a
  if not np.issubdtype(a.dtype, np.floating):
    raise UserError(f'{WHERE}: {what} must be uint8 (0..255) or float in [0, 1], got {a.dtype}')
  from visim_jax.models import lpips  # pylint: disable=g-import-not-at-top
  lpips.as_unit_range(a[..., :3].reshape((-1,) + a.shape[-3:-1] + (3,)), what, WHERE)
  return a


def _as_items(images, what: str) -> tuple[list, bool]:
  """A flat list of single images (paths, PIL images or (H, W, 3) arrays) and whether `images` was one image."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  if _is_path(images) or isinstance(images, Image.Image):
    return [images], True
  if isinstance(images, np.ndarray) or hasattr(images, '__array__') and not isinstance(images, (list, tuple)):
    a = np.asarray(images)
    if a.ndim in (3, 4) and a.shape[-1] in (3, 4) and 0 in a.shape[-3:-1]:
      raise UserError(f'{WHERE}: {what}: an image of {a.shape[-3]} x {a.shape[-2]} pixels (shape {a.shape}); give '
                      'images with pixels')
    if a.ndim == 3 and a.shape[-1] in (3, 4):
      return [_check_array(a, what)], True
    if a.ndim == 4 and a.shape[-1] in (3, 4):
      a = _check_array(a, what)
      return list(a), False
    raise UserError(f'{WHERE}: {what}: expected (H, W, 3) or (N, H, W, 3) images, got shape {a.shape}'
                    + (' (NCHW? transpose to NHWC)' if a.ndim == 4 and a.shape[1] == 3 else ''))
  if isinstance(images, (list, tuple)):
    out = []
    for i, im in enumerate(images):
      items, single = _as_items(im, f'{what}[{i}]')
      if not single:
        raise UserError(f'{WHERE}: {what}[{i}]: a list holds single images (paths, PIL images, (H, W, 3) arrays)')
      out += items
    return out, False
  raise UserError(f'{WHERE}: {what}: expected a path, a PIL image, an array or a list of them, got '
                  f'{type(images).__name__}')


def _to_pil(item):
  from visim_jax.data import images as images_lib  # pylint: disable=g-import-not-at-top
  if _is_path(item):
    return images_lib.open_rgb(item)
  if isinstance(item, np.ndarray):
    return images_lib.from_array(item)
  return images_lib.to_rgb(item)


def _load_items(items, pre) -> np.ndarray:
  """features.extract's loader: the command line's decode + resize (images.load_batch) for any image item."""
  from visim_jax.data import images as images_lib  # pylint: disable=g-import-not-at-top
  return np.stack([images_lib.resize(_to_pil(it), pre) if not _is_path(it) else images_lib.load_image(it, pre)
                   for it in items])


def arrays_of(images, what: str) -> list[np.ndarray]:
  """Each image as an (H, W, 3) array at its own size: uint8 (paths, PIL, uint8 arrays) or float [0, 1] arrays."""
  items, _ = _as_items(images, what)
  return [it if isinstance(it, np.ndarray) and it.shape[-1] == 3 else np.asarray(_to_pil(it)) for it in items]


def _lpips_batch(images, what: str) -> np.ndarray:
  """LPIPS's input: the images at their own size, uint8 (paths, PIL, uint8 arrays) or float [0, 1] arrays."""
  arrays = arrays_of(images, what)
  shapes = {a.shape for a in arrays}
  if len(shapes) > 1:
    raise UserError(f'{WHERE}: {what}: images of different sizes {sorted(shapes)[:3]}: LPIPS batches same-size '
                    "images (pass resize='shorter' or resize='HxW', or resize them first)")
  if not arrays:
    return np.zeros((0, 64, 64, 3), np.uint8)
  return np.stack(arrays) if len({a.dtype for a in arrays}) == 1 else np.stack(
      [a.astype(np.float32) / 255.0 if a.dtype == np.uint8 else a for a in arrays])
