"""Decoding and resizing images on the host (PIL), with errors that name the file."""
from __future__ import annotations

import os
from typing import Iterable, Sequence

import numpy as np
from PIL import Image, UnidentifiedImageError

from visim_jax.preprocess import Preprocess

IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.bmp', '.gif', '.webp', '.tif', '.tiff', '.ppm')
_RESAMPLE = {'bilinear': Image.Resampling.BILINEAR, 'bicubic': Image.Resampling.BICUBIC}


class ImageError(ValueError):
  """An image that cannot be used; the message names the file."""


def open_rgb(path: str | os.PathLike) -> Image.Image:
  """Opens and fully decodes an image as RGB; raises ImageError naming the file on any problem."""
  path = os.fspath(path)
  if not os.path.exists(path):
    raise ImageError(f'{path}: image file not found')
  if os.path.isdir(path):
    raise ImageError(f'{path}: is a folder, not an image file')
  try:
    with Image.open(path) as im:
      im.load()  # force full decode: truncated files fail here, not later
      return im.convert('RGB')
  except UnidentifiedImageError:
    raise ImageError(f'{path}: not an image file (PIL cannot identify it)') from None
  except (OSError, SyntaxError, ValueError) as e:
    raise ImageError(f'{path}: corrupt or truncated image ({e})') from None


def resize(im: Image.Image, pre: Preprocess) -> np.ndarray:
  """PIL RGB image -> uint8 (size, size, 3) following `pre`."""
  resample = _RESAMPLE[pre.interpolation]
  if pre.resize == 'squash':
    im = im.resize((pre.size, pre.size), resample)
  else:
    target = pre.resize_to or pre.size
    w, h = im.size
    scale = target / min(w, h)
    nw, nh = max(pre.size, round(w * scale)), max(pre.size, round(h * scale))
    im = im.resize((nw, nh), resample)
    left, top = (nw - pre.size) // 2, (nh - pre.size) // 2
    im = im.crop((left, top, left + pre.size, top + pre.size))
  return np.asarray(im, dtype=np.uint8)


def load_image(path: str | os.PathLike, pre: Preprocess) -> np.ndarray:
  return resize(open_rgb(path), pre)


def load_batch(paths: Sequence[str], pre: Preprocess) -> np.ndarray:
  return np.stack([load_image(p, pre) for p in paths]) if paths else np.zeros((0, pre.size, pre.size, 3), np.uint8)


def list_images(folder: str | os.PathLike, extensions: Iterable[str] = IMAGE_EXTENSIONS) -> list[str]:
  """Sorted image files (by extension) directly in `folder`; errors name the folder."""
  folder = os.fspath(folder)
  if not os.path.isdir(folder):
    raise FileNotFoundError(f'{folder}: image folder not found')
  exts = tuple(e.lower() for e in extensions)
  names = sorted(n for n in os.listdir(folder)
                 if n.lower().endswith(exts) and not n.startswith('.'))
  if not names:
    raise ValueError(f'{folder}: no image files (looked for {", ".join(exts)})')
  return [os.path.join(folder, n) for n in names]
