"""Decoding and resizing images on the host (PIL), with errors that name the file.

Every PIL mode becomes 8-bit RGB by one documented rule (`to_rgb`; `Image.convert('RGB')` alone clips 16-bit
and float images to white):

- RGB: as decoded. 16-bit RGB(A) PNGs are decoded by Pillow to 8 bits by keeping the high byte (v >> 8).
- 1, L: grey replicated to R = G = B (1-bit: 0 / 255).
- I;16, I;16B, I;16L, I;16N (16-bit grey PNG / TIFF): v >> 8, the same rule Pillow uses for 16-bit RGB, libpng's
  strip_16 and torchvision's uint16 -> uint8 conversion; it inverts the 8 -> 16-bit expansion v * 257 exactly.
- I (32-bit integer grey): read on the 16-bit scale (older Pillows decode 16-bit PNGs to I): clip to
  [0, 65535], then v >> 8.
- F (32-bit float grey): read on the [0, 1] scale of float images (scikit-image, torchvision): clip, x 255,
  round; NaN -> 0. `float_max=255` reads it on Pillow's own 0..255 scale instead.
- CMYK: Pillow's conversion R = (255 - C)(255 - K) / 255 (no ICC colour management); YCbCr, HSV, RGBX: Pillow's.
- Alpha (RGBA, LA, PA, RGBa, La, P or L or RGB with a transparency entry): composited on white by default
  (alpha='white'), as a browser or a contact sheet shows the image: pixels under full transparency often hold
  arbitrary colours (black, garbage) that nobody sees and that would change the features. alpha='drop' keeps
  the stored colours (what `convert('RGB')`, and so the reference's reader, does).
- EXIF orientation is applied first (ImageOps.exif_transpose; exif='all', the default), as the reference's
  reader does for JPEGs (scikit-image 0.18 -> imageio 2.9 JPEG-PIL, exifrotate=True); exif='jpeg' rotates JPEGs
  only (exactly the reference), exif='none' never (PIL's Image.open).
"""
from __future__ import annotations

import os
from typing import Iterable, Sequence

import numpy as np
from absl import logging
from PIL import Image, ImageOps, UnidentifiedImageError

from visim_jax.core.errors import UserError
from visim_jax.data.preprocess import Preprocess

IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.bmp', '.gif', '.webp', '.tif', '.tiff', '.ppm')
_RESAMPLE = {'bilinear': Image.Resampling.BILINEAR, 'bicubic': Image.Resampling.BICUBIC}
ALPHA = ('white', 'drop')
EXIF = ('all', 'jpeg', 'none')


class ImageError(UserError):
  """An image that cannot be used; the message names the file."""


def _grey_to_rgb(v: np.ndarray) -> Image.Image:
  return Image.fromarray(np.repeat(v.astype(np.uint8)[..., None], 3, axis=-1), 'RGB')


def _on_white(colour: np.ndarray, alpha: np.ndarray) -> np.ndarray:
  """round(c * a / 255 + 255 * (1 - a / 255)) in exact integer arithmetic (255 is odd: no ties)."""
  c = colour.astype(np.int32)
  a = alpha.astype(np.int32)[..., None] if colour.ndim == alpha.ndim + 1 else alpha.astype(np.int32)
  return ((c * a + 255 * (255 - a) + 127) // 255).astype(np.uint8)


def to_rgb(im: Image.Image, alpha: str = 'white', float_max: float = 1.0) -> Image.Image:
  """Any PIL image -> 8-bit RGB by the module's rules (alpha: 'white' | 'drop'; F read on [0, float_max])."""
  if alpha not in ALPHA:
    raise ValueError(f'alpha: expected one of {ALPHA}, got {alpha!r}')
  mode = im.mode
  if mode == 'RGB':
    return im
  if mode.startswith('I;16') or mode in ('I', 'I;32', 'I;32B', 'I;32L'):
    v = np.asarray(im).astype(np.int64)
    return _grey_to_rgb(np.clip(v, 0, 65535) >> 8)
  if mode == 'F':
    v = np.nan_to_num(np.asarray(im, np.float64), nan=0.0, posinf=float_max, neginf=0.0)
    return _grey_to_rgb(np.rint(np.clip(v / float_max, 0.0, 1.0) * 255.0))
  if mode == 'La':  # premultiplied grey + alpha: on white = Lp + (255 - a)
    v = np.asarray(im).astype(np.int32)
    lum, a = v[..., 0], v[..., 1]
    if alpha == 'white':
      return _grey_to_rgb(np.clip(lum + 255 - a, 0, 255))
    return _grey_to_rgb(np.where(a > 0, np.clip((lum * 255 + a // 2) // np.maximum(a, 1), 0, 255), 0))
  if mode == 'LAB':
    from PIL import ImageCms
    return ImageCms.applyTransform(im, ImageCms.buildTransform(ImageCms.createProfile('LAB'),
                                                               ImageCms.createProfile('sRGB'), 'LAB', 'RGB'))
  has_alpha = mode in ('RGBA', 'LA', 'PA', 'RGBa') or 'transparency' in im.info
  if not has_alpha or alpha == 'drop':
    return im.convert('RGB')
  if mode == 'LA':
    v = np.asarray(im)
    return _grey_to_rgb(_on_white(v[..., 0], v[..., 1]))
  v = np.asarray(im.convert('RGBA'))  # P / PA / L / RGB with transparency, RGBa (un-premultiplied by PIL)
  return Image.fromarray(_on_white(v[..., :3], v[..., 3]), 'RGB')


def from_array(arr, alpha: str = 'white', float_max: float = 1.0) -> Image.Image:
  """An image array (H, W), (H, W, 1), (H, W, 3) or (H, W, 4) (e.g. a TFDS example) -> 8-bit RGB by the same
  rules: uint8 as is, uint16 >> 8, other integers on the 16-bit scale, floats on [0, float_max], 4 channels
  = RGBA."""
  arr = np.asarray(arr)
  if arr.ndim == 3 and arr.shape[-1] == 1:
    arr = arr[..., 0]
  if arr.ndim not in (2, 3) or (arr.ndim == 3 and arr.shape[-1] not in (3, 4)):
    raise UserError(f'image array: expected (H, W), (H, W, 1), (H, W, 3) or (H, W, 4), got shape {arr.shape}')
  if arr.dtype == np.bool_:
    arr = arr.astype(np.uint8) * 255
  elif np.issubdtype(arr.dtype, np.floating):
    v = np.nan_to_num(arr.astype(np.float64), nan=0.0, posinf=float_max, neginf=0.0)
    arr = np.rint(np.clip(v / float_max, 0.0, 1.0) * 255.0).astype(np.uint8)
  elif arr.dtype != np.uint8:
    arr = (np.clip(arr.astype(np.int64), 0, 65535) >> 8).astype(np.uint8)
  mode = 'L' if arr.ndim == 2 else {3: 'RGB', 4: 'RGBA'}[arr.shape[-1]]
  return to_rgb(Image.fromarray(np.ascontiguousarray(arr), mode), alpha)


def open_rgb(path: str | os.PathLike, alpha: str = 'white', exif: str = 'all',
             float_max: float = 1.0) -> Image.Image:
  """Opens and fully decodes an image as 8-bit RGB (EXIF orientation applied, see the module's rules);
  raises ImageError naming the file on any problem."""
  if exif not in EXIF:
    raise ValueError(f'exif: expected one of {EXIF}, got {exif!r}')
  path = os.fspath(path)
  if not os.path.exists(path):
    raise ImageError(f'{path}: image file not found')
  if os.path.isdir(path):
    raise ImageError(f'{path}: is a folder, not an image file')
  try:
    with Image.open(path) as opened:
      opened.load()  # force full decode: truncated files fail here, not later
      im = opened
      if exif == 'all' or (exif == 'jpeg' and opened.format == 'JPEG'):
        try:
          im = ImageOps.exif_transpose(opened)
        except Exception as e:  # an unreadable EXIF block: the stored orientation, as viewers show it
          logging.warning('%s: unreadable EXIF orientation (%s); using the stored orientation', path, e)
      rgb = to_rgb(im, alpha, float_max)
      return rgb.copy() if rgb is opened else rgb  # closing `opened` frees its pixels
  except UnidentifiedImageError:
    raise ImageError(f'{path}: not an image file (PIL cannot identify it)') from None
  except Image.DecompressionBombError as e:
    raise ImageError(f'{path}: too large to decode safely, a decompression bomb guard ({e})') from None
  except (OSError, SyntaxError, ValueError, TypeError) as e:
    raise ImageError(f'{path}: corrupt, truncated or unsupported image ({type(e).__name__}: {e})') from None


def _geometry(w: int, h: int, pre: Preprocess) -> tuple[int, int, int, int]:
  """(resized width, height, crop left, top), torchvision's rules (Resize(int) truncates the longer side;
  CenterCrop rounds the offset)."""
  if pre.resize == 'squash':
    return pre.size, pre.size, 0, 0
  target = pre.resize_to or pre.size
  if w <= h:
    nw, nh = target, int(target * h / w)
  else:
    nw, nh = int(target * w / h), target
  nw, nh = max(nw, pre.size), max(nh, pre.size)
  return nw, nh, int(round((nw - pre.size) / 2.0)), int(round((nh - pre.size) / 2.0))


def _torch_bilinear_taps(n_in: int, n_out: int):
  """(i0, i1, lambda) of torch's CPU bilinear interpolation, align_corners=False, no antialiasing, in its float32
  arithmetic (ATen UpSample.h: area_pixel_compute_scale, area_pixel_compute_source_index, guard_index_and_lambda):
  scale = float32(n_in) / n_out; src = scale * (i + 0.5) - 0.5 as one fused multiply-add (the compiled kernel's
  rounding), clamped at 0; i0 = min(floor(src), n_in - 1); lambda = clip(src - i0, 0, 1). (Coordinates in float64
  differed from torch's by up to 0.0074 on the 0..255 scale.)"""
  f = np.float32
  scale = f(n_in) / f(n_out)
  half = np.arange(n_out).astype(f) + f(0.5)
  src = np.maximum((np.float64(scale) * half - 0.5).astype(f), f(0))  # float32 products are exact in float64: fma
  i0 = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
  i1 = np.minimum(i0 + 1, n_in - 1)
  lam = np.clip(src - i0.astype(f), f(0), f(1))
  return i0, i1, lam


def _torch_lerp(a: np.ndarray, b: np.ndarray, lam: np.ndarray) -> np.ndarray:
  """(1 - lam) a + lam b rounded as torch's kernel: fma(a, 1 - lam, float32(b * lam)), float32 in and out."""
  out = np.multiply(a, (np.float32(1) - lam).astype(np.float64), dtype=np.float64)  # exact: float32 x float32
  out += b * lam
  return out.astype(np.float32)


def _tf_bilinear_taps(n_in: int, n_out: int):
  """(lo, hi, lerp) of TF2's resize_bilinear with half-pixel centres, in float32 as TF computes them:
  src = (i + 0.5) * (n_in / n_out) - 0.5, lo = max(floor(src), 0), hi = min(ceil(src), n_in - 1),
  lerp = src - floor(src); output = x[lo] + (x[hi] - x[lo]) * lerp."""
  scale = np.float32(n_in) / np.float32(n_out)
  src = (np.arange(n_out, dtype=np.float32) + np.float32(0.5)) * scale - np.float32(0.5)
  floor = np.floor(src)
  lo = np.maximum(floor, 0).astype(np.int64)
  hi = np.minimum(np.ceil(src), n_in - 1).astype(np.int64)
  return lo, hi, (src - floor).astype(np.float32)


def _cv2_cubic_taps(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray]:
  """OpenCV's INTER_CUBIC taps on uint8 (imgproc/resize.cpp): source x = (d + 0.5) scale - 0.5 in float32, 4 taps
  floor(x) - 1 .. floor(x) + 2 clamped to the edge, Keys' cubic with A = -0.75 in float32, each weight rounded to
  11 fractional bits (saturate_cast<short>(w * 2048), half to even)."""
  scale = 1.0 / (float(n_out) / float(n_in))   # as resize.cpp: 1 / inv_scale_x
  fx = ((np.arange(n_out, dtype=np.float64) + 0.5) * scale - 0.5).astype(np.float32)
  sx = np.floor(fx)
  x = (fx - sx).astype(np.float32)
  a, one = np.float32(-0.75), np.float32(1)
  c0 = ((a * (x + one) - 5 * a) * (x + one) + 8 * a) * (x + one) - 4 * a
  c1 = ((a + 2) * x - (a + 3)) * x * x + one
  c2 = ((a + 2) * (one - x) - (a + 3)) * (one - x) * (one - x) + one
  c3 = one - c0 - c1 - c2
  w = np.rint(np.stack([c0, c1, c2, c3], 1).astype(np.float32) * np.float32(2048)).astype(np.int64)
  idx = np.clip(sx.astype(np.int64)[:, None] + np.arange(-1, 3)[None], 0, n_in - 1)
  return idx, w


def resize(im: Image.Image, pre: Preprocess) -> np.ndarray:
  """PIL RGB image -> (size, size, 3) following `pre`: uint8, or float32 on the 0..255 scale for
  interpolation='torch_bilinear'."""
  w, h = im.size
  nw, nh, left, top = _geometry(w, h, pre)
  if pre.interpolation == 'torch_bilinear':  # the crop window only: the taps of the kept outputs
    x = np.asarray(im)  # uint8: the taps convert what they read (uint8 values are exact in float32)
    i0, i1, lam = (t[left:left + pre.size] for t in _torch_bilinear_taps(w, nw))
    x = _torch_lerp(x[:, i0], x[:, i1], lam[None, :, None])  # along the width, then along the height, as torch
    i0, i1, lam = (t[top:top + pre.size] for t in _torch_bilinear_taps(h, nh))
    return _torch_lerp(x[i0], x[i1], lam[:, None, None])
  if pre.interpolation == 'tf_bilinear':  # big_vision: tf.image.resize, then clip + cast back to uint8 (truncates)
    x = np.asarray(im, np.float32)
    lo, hi, lam = (t[left:left + pre.size] for t in _tf_bilinear_taps(w, nw))
    x = x[:, lo] + (x[:, hi] - x[:, lo]) * lam[None, :, None]
    lo, hi, lam = (t[top:top + pre.size] for t in _tf_bilinear_taps(h, nh))
    x = x[lo] + (x[hi] - x[lo]) * lam[:, None, None]
    return np.clip(x, 0, 255).astype(np.uint8)
  if pre.interpolation == 'cv2_cubic':   # AligNet's cv2.resize(INTER_CUBIC): no antialiasing, fixed point
    x = np.asarray(im, np.int64)
    idx, w = _cv2_cubic_taps(x.shape[1], nw)
    x = np.einsum('hwkc,wk->hwc', x[:, idx], w)                  # along the width (x 2048)
    idx, w = _cv2_cubic_taps(x.shape[0], nh)
    # along the height as OpenCV's vectorised VResizeCubicVec_32s8u: float32 weights w / 2048^2, a chain of float32
    # fused multiply-adds from the last tap, rounded half to even, saturated
    b = (w.astype(np.float32) * np.float32(2.0**-22)).astype(np.float64)
    rows = x[idx].astype(np.float64)                              # (H, 4, W, C), exact in float32 too
    acc = (rows[:, 3] * b[:, 3, None, None]).astype(np.float32)
    for k in (2, 1, 0):
      acc = (rows[:, k] * b[:, k, None, None] + acc).astype(np.float32)
    x = np.clip(np.rint(acc), 0, 255).astype(np.uint8)
    return x[top:top + pre.size, left:left + pre.size]
  im = im.resize((nw, nh), _RESAMPLE[pre.interpolation])
  if (nw, nh) != (pre.size, pre.size):
    im = im.crop((left, top, left + pre.size, top + pre.size))
  return np.asarray(im, dtype=np.uint8)


def load_image(path: str | os.PathLike, pre: Preprocess) -> np.ndarray:
  return resize(open_rgb(path), pre)


def load_batch(paths: Sequence[str], pre: Preprocess) -> np.ndarray:
  if not paths:
    dtype = np.float32 if pre.interpolation == 'torch_bilinear' else np.uint8
    return np.zeros((0, pre.size, pre.size, 3), dtype)
  return np.stack([load_image(p, pre) for p in paths])


def check_images(paths: Sequence[str], num_threads: int = 4) -> list[tuple[str, str]]:
  """[(path, reason)] of the images in `paths` that fail to decode (full decode, a thread pool), in order."""
  import concurrent.futures

  def one(p):
    try:
      open_rgb(p)
      return None
    except ImageError as e:
      return p, str(e)

  with concurrent.futures.ThreadPoolExecutor(max(1, num_threads)) as ex:
    return [r for r in ex.map(one, paths) if r is not None]


def list_images(folder: str | os.PathLike, extensions: Iterable[str] = IMAGE_EXTENSIONS) -> list[str]:
  """Sorted image files (by extension) directly in `folder`; errors name the folder."""
  folder = os.fspath(folder)
  if not os.path.isdir(folder):
    raise UserError(f'{folder}: image folder not found')
  exts = tuple(e.lower() for e in extensions)
  names = sorted(n for n in os.listdir(folder)
                 if n.lower().endswith(exts) and not n.startswith('.'))
  if not names:
    raise UserError(f'{folder}: no image files (looked for {", ".join(exts)})')
  return [os.path.join(folder, n) for n in names]
