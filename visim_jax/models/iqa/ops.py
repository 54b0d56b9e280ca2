"""The pieces the ten full-reference IQA metrics share (models/iqa/*.py), pure JAX on (N, H, W[, C]) float32 arrays.

Colour conversions of 0..255 RGB (piq.functional.colour_conversion, the matrices its metrics use), separable
'valid' filtering by shifted slices (as classical._filter: a pair's value never depends on its batch), zero /
replicate / reflect padding, the gradient magnitude and the SSIM-style similarity map, the downsampling rules piq
applies before each metric, and the linear resamplers (torch's bilinear `interpolate`, MATLAB's `imresize` bicubic
with antialiasing as piq's port of it, and bilinear by the same rule) as per-axis matrices built once in NumPy from the static shapes.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from visim_jax.core.errors import UserError

EPS32 = float(np.finfo(np.float32).eps)
YIQ = np.array([[0.299, 0.587, 0.114], [0.5959, -0.2746, -0.3213], [0.2115, -0.5227, 0.3112]])
YIQ_MATLAB = np.array([[0.299, 0.587, 0.114], [0.596, -0.274, -0.322], [0.211, -0.523, 0.312]])   # FeatureSIM.m
LHM = np.array([[0.2989, 0.587, 0.114], [0.3, 0.04, -0.35], [0.34, -0.6, 0.17]])     # MDSI (Nafchi et al. 2016)
LMN = np.array([[0.06, 0.63, 0.27], [0.30, 0.04, -0.35], [0.34, -0.6, 0.17]])       # VSI (Zhang et al. 2014)
_XYZ = np.array([[0.4124564, 0.3575761, 0.1804375], [0.2126729, 0.7151522, 0.0721750],
                 [0.0193339, 0.1191920, 0.9503041]])
_D50 = np.array([0.9642119944211994, 1.0, 0.8251882845188288])
D50_SDSP = (0.9642, 1.0, 0.8251)          # the D50 white as VSI.m's SDSP (its RGB2Lab) rounds it
PREWITT = (np.array([1.0, 1.0, 1.0]) / 3.0, np.array([-1.0, 0.0, 1.0]))       # (along H, along W) of the x kernel
SCHARR = (np.array([3.0, 10.0, 3.0]) / 16.0, np.array([-1.0, 0.0, 1.0]))


def unit(x) -> jax.Array:
  """uint8 -> float32 / 255; floats as float32 (the zoo's inputs; the range check is classical.prepare's)."""
  x = jnp.asarray(x)
  return x.astype(jnp.float32) / 255.0 if x.dtype == jnp.uint8 else x.astype(jnp.float32)


def mix(x: jax.Array, m: np.ndarray) -> jax.Array:
  """(..., 3) -> (..., 3): each pixel times m^T (a colour matrix)."""
  return jnp.tensordot(x, jnp.asarray(m.T, x.dtype), axes=([-1], [0]))


def rgb_to_lab_d50(x255: jax.Array, white=None) -> jax.Array:
  """piq's rgb2lab(x, 255): sRGB -> linear -> XYZ (sRGB primaries) -> Lab with the D50 white (VSI's SDSP);
  `white`: another (Xr, Yr, Zr) (D50_SDSP: VSI.m's rounded one)."""
  x = x255 / 255.0
  lin = jnp.where(x <= 0.04045, x / 12.92, jnp.power((jnp.maximum(x, 0.04045) + 0.055) / 1.055, 2.4))
  t = mix(lin, _XYZ) / jnp.asarray(_D50 if white is None else np.asarray(white), x.dtype)
  f = jnp.where(t <= 0.008856, (903.3 * t + 16.0) / 116.0, jnp.power(jnp.maximum(t, 0.008856), 1.0 / 3.0))
  return jnp.stack([116.0 * f[..., 1] - 16.0, 500.0 * (f[..., 0] - f[..., 1]), 200.0 * (f[..., 1] - f[..., 2])], -1)


# ------------------------------------------------------------------------------------------ filtering

def sep(x: jax.Array, kh, kw) -> jax.Array:
  """'valid' correlation of (N, H, W[, ...]) maps with the separable kernel outer(kh, kw) (torch conv2d): short
  kernels as sums of shifted slices, long ones (>= BAND_TAPS) as products with banded matrices (XLA compiles a
  matrix product in a fraction of the time of dozens of slices; both are per-image, never across the batch)."""
  kh, kw = np.asarray(kh, np.float64), np.asarray(kw, np.float64)
  h, w = x.shape[1], x.shape[2]
  if max(len(kh), len(kw)) >= BAND_TAPS and x.ndim == 3:
    return resample(x, band_matrix(h, tuple(kh)), band_matrix(w, tuple(kw)))
  out = sum(float(kh[t]) * x[:, t:t + h - len(kh) + 1] for t in range(len(kh)) if kh[t] != 0)
  return sum(float(kw[t]) * out[:, :, t:t + w - len(kw) + 1] for t in range(len(kw)) if kw[t] != 0)


BAND_TAPS = 5


@functools.lru_cache(maxsize=None)
def band_matrix(n: int, k: tuple) -> np.ndarray:
  """(n - len(k) + 1, n): row i holds k at columns i .. i + len(k) - 1 ('valid' correlation along one axis)."""
  m = np.zeros((n - len(k) + 1, n))
  for t, v in enumerate(k):
    m[np.arange(n - len(k) + 1), np.arange(n - len(k) + 1) + t] = v
  return m


def pad(x: jax.Array, top: int, bottom: int, left: int, right: int, mode: str = 'constant') -> jax.Array:
  """Pad the H and W axes of (N, H, W, ...) maps: 'constant' (zeros), 'edge' (torch replicate), 'reflect'."""
  widths = [(0, 0), (top, bottom), (left, right)] + [(0, 0)] * (x.ndim - 3)
  return jnp.pad(x, widths, mode=mode)


def avg_pool(x: jax.Array, k: int, stride: int | None = None) -> jax.Array:
  """torch avg_pool2d(k, stride) without padding on (N, H, W, ...) maps (floor of the window count)."""
  if k == 1 and (stride or 1) == 1:
    return x
  s = stride or k
  win = (1, k, k) + (1,) * (x.ndim - 3)
  strides = (1, s, s) + (1,) * (x.ndim - 3)
  return jax.lax.reduce_window(x, 0.0, jax.lax.add, win, strides, 'VALID') / (k * k)


def halve(x: jax.Array) -> jax.Array:
  """piq's 2x downsampling in GMSD / MS-GMSD / HaarPSI: zero-pad bottom and right by max(H % 2, W % 2), 2x2 mean."""
  p = max(x.shape[1] % 2, x.shape[2] % 2)
  return avg_pool(pad(x, 0, p, 0, p), 2)


def wang_factor(h: int, w: int) -> int:
  """max(1, round(min(H, W) / 256)): the downsampling factor of Wang's ssim.m that piq applies (Python's round)."""
  return max(1, round(min(h, w) / 256))


def matlab_factor(h: int, w: int) -> int:
  """The same factor with MATLAB's round (halves away from zero: 640 px -> 3, where Python's round gives 2)."""
  return max(1, int(math.floor(min(h, w) / 256 + 0.5)))


def box_same_down(x: jax.Array, f: int) -> jax.Array:
  """MATLAB's `conv2(x, fspecial('average', f), 'same')` then `x(1:f:end, 1:f:end)` on (N, H, W, ...) maps: the
  sample at p averages p - (f - 1) // 2 .. p + f // 2 with zeros outside, ceil(H / f) samples = zero-pad
  ((f - 1) // 2, f // 2) and average-pool by f (piq's MDSI / SR-SIM rule is this one)."""
  if f // 2:
    x = pad(x, (f - 1) // 2, f // 2, (f - 1) // 2, f // 2)
  return avg_pool(x, f)


def gradient_map(x: jax.Array, kernel=PREWITT) -> jax.Array:
  """(N, H, W) -> (N, H, W): sqrt(gx^2 + gy^2) of a 3x3 gradient kernel and its transpose, zero padding 1."""
  xp = pad(x, 1, 1, 1, 1)
  gx = sep(xp, kernel[0], kernel[1])
  gy = sep(xp, kernel[1], kernel[0])
  return jnp.sqrt(gx * gx + gy * gy)


def similarity_map(a, b, c: float, alpha: float = 0.0):
  """(2ab - alpha ab + c) / (a^2 + b^2 - alpha ab + c) (piq.functional.similarity_map)."""
  return (2.0 * a * b - alpha * a * b + c) / (a * a + b * b - alpha * a * b + c)


def gaussian_1d(size: int, sigma: float) -> np.ndarray:
  """piq's gaussian_filter as its separable factor: exp(-(i - (size - 1) / 2)^2 / (2 sigma^2)), normalised."""
  i = np.arange(size, dtype=np.float64) - (size - 1) / 2.0
  g = np.exp(-(i ** 2) / (2.0 * sigma ** 2))
  return g / g.sum()


def need(where: str, h: int, w: int, side: int, why: str = ''):
  if min(h, w) < side:
    raise UserError(f'{where}: images of {h}x{w} px; {where} needs sides of at least {side} px{why}')


# ------------------------------------------------------------------------------------------ resampling

def resample(x: jax.Array, mh: np.ndarray, mw: np.ndarray) -> jax.Array:
  """(N, H, W) -> (N, H', W'): mh @ x @ mw^T with per-axis matrices (HIGHEST precision: these are exact sums)."""
  hp = jax.lax.Precision.HIGHEST
  y = jnp.einsum('ih,nhw->niw', jnp.asarray(mh, x.dtype), x, precision=hp)
  return jnp.einsum('jw,niw->nij', jnp.asarray(mw, x.dtype), y, precision=hp)


@functools.lru_cache(maxsize=None)
def bilinear_matrix(n_in: int, n_out: int, align_corners: bool) -> np.ndarray:
  """(n_out, n_in): torch.nn.functional.interpolate(mode='bilinear') along one axis (no antialiasing)."""
  m = np.zeros((n_out, n_in))
  for i in range(n_out):
    if align_corners:
      src = i * (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
    else:
      src = max((i + 0.5) * n_in / n_out - 0.5, 0.0)
    i0 = min(int(math.floor(src)), n_in - 1)
    i1 = min(i0 + 1, n_in - 1)
    lam = src - i0
    m[i, i0] += 1.0 - lam
    m[i, i1] += lam
  return m


def _cubic(x: np.ndarray, a: float = -0.5) -> np.ndarray:
  ax = np.abs(x)
  return (((a + 2) * ax ** 3 - (a + 3) * ax ** 2 + 1) * (ax <= 1)
          + (a * ax ** 3 - 5 * a * ax ** 2 + 8 * a * ax - 4 * a) * ((ax > 1) & (ax <= 2)))


@functools.lru_cache(maxsize=None)
def imresize_matrix(n_in: int, n_out: int, scale: float, kernel: str = 'cubic') -> np.ndarray:
  """(n_out, n_in): MATLAB imresize(..., 'bicubic') along one axis as piq's port computes it (antialiasing when
  scale < 1, symmetric padding that repeats the border sample); kernel='triangle': imresize(..., 'bilinear') by the
  same rule (its kernel 1 - |x| on [-1, 1], widened by 1 / scale when shrinking)."""
  if scale == 1:
    return np.eye(n_in)
  size = {'cubic': 4, 'triangle': 2}[kernel]
  aa = scale if scale < 1 else 1.0
  if scale < 1:
    size = math.ceil(size / aa)
  size += 2
  pos = (np.linspace(0, n_out - 1, n_out) + 0.5) / scale - 0.5
  base = np.floor(pos) - size // 2 + 1
  dist = pos - base
  t = (dist[None, :] - np.arange(size)[:, None]) * aa
  w = _cubic(t) if kernel == 'cubic' else np.maximum(1.0 - np.abs(t), 0.0)
  w = w / w.sum(axis=0, keepdims=True)
  m = np.zeros((n_out, n_in))
  for i in range(n_out):
    for t in range(size):
      j = int(base[i]) + t
      j = -j - 1 if j < 0 else (2 * n_in - 1 - j if j >= n_in else j)
      m[i, j] += w[t, i]
  return m
