"""IW-SSIM, information content weighted SSIM (Wang & Li 2011): MS-SSIM on a Laplacian pyramid whose contrast-
structure maps are pooled with weights from a Gaussian scale mixture's mutual information (3x3 blocks plus the
parent band); HIGHER = more similar (1: identical). As piq 0.8.0 `information_weighted_ssim`: 0..255 values, Y of
YIQ, 5 scales weighted (0.0448, 0.2856, 0.3001, 0.2363, 0.1333) (normalised), Gaussian window 11 / 1.5 ('valid'),
K1 = 0.01, K2 = 0.03 on a range of 255, the pyramid by the 5-tap binomial filter times sqrt 2 with reflect padding,
sigma_nsq = 0.4, the parent band upsampled by bilinear interpolation to 4x - 3 plus linear extrapolation of the
border (the authors' iwssim.m's imenlarge2), the information map cropped by 4 px to the SSIM map. x is the
distorted image, y the reference (the weights come from y, as piq and the authors' code).
"""
from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from visim_jax.core import cpu_kernels
from visim_jax.models.iqa import ops

WEIGHTS = (0.0448, 0.2856, 0.3001, 0.2363, 0.1333)
_BIN = np.array([1.0, 4.0, 6.0, 4.0, 1.0]) / 16.0 * math.sqrt(2.0)


@dataclasses.dataclass(frozen=True)
class IWSSIMOptions:
  kernel_size: int = 11
  kernel_sigma: float = 1.5
  k1: float = 0.01
  k2: float = 0.03
  parent: bool = True
  blk_size: int = 3
  sigma_nsq: float = 0.4
  weights: tuple = WEIGHTS


@functools.lru_cache(maxsize=None)
def _pyr_matrices(n: int) -> tuple[np.ndarray, np.ndarray]:
  """Along one axis of n samples: (down (ceil(n / 2), n), up (n, ceil(n / 2))): piq's _pyr_step as linear maps
  (reflect padding by 2, the 5-tap filter, every other sample; zero insertion, reflect padding, the filter, the
  first n samples), built by applying those steps to the identity."""
  def correlate(v):   # (len, cols) -> 'valid' filtering of each column after reflect padding
    p = np.pad(v, ((2, 2), (0, 0)), mode='reflect')
    return sum(_BIN[t] * p[t:t + len(v)] for t in range(5))
  down = correlate(np.eye(n))[::2]
  m = down.shape[0]
  z = np.zeros((2 * m, m))
  z[::2] = np.eye(m)
  up = correlate(z)[:n]
  return down, up


def _pyr_step(x):
  """(N, H, W) -> (lowpass (N, ceil(H/2), ceil(W/2)), band-pass (N, H, W)) (piq's _pyr_step)."""
  (dh, uh), (dw, uw) = _pyr_matrices(x.shape[1]), _pyr_matrices(x.shape[2])
  lo = ops.resample(x, dh, dw)
  return lo, x - ops.resample(lo, uh, uw)


@functools.lru_cache(maxsize=None)
def _enlarge_matrix(n: int) -> np.ndarray:
  """(2n, n): piq's _image_enlarge along one axis (bilinear to 4n - 3, linear extrapolation of the ends, every
  other sample)."""
  b = ops.bilinear_matrix(n, 4 * n - 3, False)
  m = np.zeros((4 * n - 1, n))
  m[1:-1] = b
  m[0] = 2 * m[1] - m[2]
  m[-1] = 2 * m[-2] - m[-3]
  return m[::2]


def _information(x, y, parent, opts: IWSSIMOptions):
  """(N, H - 2, W - 2) information content map of 3x3 blocks (+ the parent) of y (piq's _information_content)."""
  n, h, w = y.shape
  eps = ops.EPS32
  k = opts.blk_size
  box = np.ones(k) / k
  f = lambda t: ops.sep(ops.pad(t, k // 2, k - k // 2, k // 2, k - k // 2), box, box)  # noqa: E731
  mu_x, mu_y = f(x), f(y)
  s_xx = jnp.maximum(f(x * x) - mu_x ** 2, 0.0)
  s_yy = jnp.maximum(f(y * y) - mu_y ** 2, 0.0)
  s_xy = f(x * y) - mu_x * mu_y
  g = s_xy / (s_yy + eps)
  vv = s_xx - g * s_xy
  g = jnp.where(s_yy < eps, 0.0, g)
  vv = jnp.where(s_yy < eps, s_xx, vv)
  g = jnp.where(s_xx < eps, 0.0, g)
  vv = jnp.where(s_xx < eps, 0.0, vv)
  r = (k - 1) // 2
  nv, nh = h - k + 1, w - k + 1
  cols = [y[:, r - dy:r - dy + nv, r - dx:r - dx + nh] for dy in range(-r, r + 1) for dx in range(-r, r + 1)]
  if parent is not None:
    ph, pw = parent.shape[1:]
    up = ops.resample(parent, _enlarge_matrix(ph), _enlarge_matrix(pw))[:, :h, :w]
    cols.append(up[:, r:r + nv, r:r + nh])
  big = jnp.stack(cols, -1).reshape(n, nv * nh, len(cols))                 # (N, blocks, dims)
  hp = jax.lax.Precision.HIGHEST
  cu = jnp.einsum('nbi,nbj->nij', big, big, precision=hp) / (nv * nh)
  lam, vec = jnp.linalg.eigh(cu)
  pos = lam * (lam > 0)
  s_pos = jnp.sum(pos, -1, keepdims=True)
  lam2 = pos * jnp.sum(lam, -1, keepdims=True) / (s_pos + (s_pos == 0))
  # inv(V diag(lam2) V^T) = V diag(1 / lam2) V^T (piq calls torch.inverse on the product; the same to float32
  # rounding, and a general inverse costs XLA seconds to compile); a zero eigenvalue contributes nothing (pinv)
  inv_lam = jnp.where(lam2 > 0, 1.0 / jnp.where(lam2 > 0, lam2, 1.0), 0.0)
  cinv = jnp.einsum('nij,nj,nkj->nik', vec, inv_lam, vec, precision=hp)
  ss = jnp.sum(jnp.einsum('nbi,nij->nbj', big, cinv, precision=hp) * big, -1).reshape(n, nv, nh) / len(cols)
  g, vv = g[:, r:r + nv, r:r + nh], vv[:, r:r + nv, r:r + nh]
  s = opts.sigma_nsq
  terms = ((vv + (1 + g * g) * s)[..., None] * ss[..., None] * lam2[:, None, None, :] + s * vv[..., None]) / (s * s)
  iw = jnp.sum(jnp.log2(1 + terms), -1)
  return jnp.where(iw < eps, 0.0, iw)


def _ssim_maps(x, y, opts: IWSSIMOptions):
  g = ops.gaussian_1d(opts.kernel_size, opts.kernel_sigma)
  c1, c2 = (opts.k1 * 255.0) ** 2, (opts.k2 * 255.0) ** 2
  mu_x, mu_y = ops.sep(x, g, g), ops.sep(y, g, g)
  s_xx = jnp.maximum(ops.sep(x * x, g, g) - mu_x ** 2, 0.0)
  s_yy = jnp.maximum(ops.sep(y * y, g, g) - mu_y ** 2, 0.0)
  s_xy = ops.sep(x * y, g, g) - mu_x * mu_y
  cs = (2.0 * s_xy + c2) / (s_xx + s_yy + c2)
  return (2.0 * mu_x * mu_y + c1) / (mu_x ** 2 + mu_y ** 2 + c1) * cs, cs


def min_side(opts: IWSSIMOptions) -> int:
  return (opts.kernel_size - 1) * 2 ** (len(opts.weights) - 1) + 1


@functools.partial(cpu_kernels.jit, static_argnums=2)
def iw_ssim(x, y, opts: IWSSIMOptions = IWSSIMOptions()):
  """(N,) IW-SSIM of float [0, 1] NHWC RGB batches, x distorted, y the reference (HIGHER = more similar)."""
  lum = lambda v: (ops.unit(v) * 255.0) @ jnp.asarray(ops.YIQ[0], jnp.float32)  # noqa: E731
  a, b = lum(x), lum(y)
  ops.need('iw_ssim', a.shape[1], a.shape[2], min_side(opts))
  levels = len(opts.weights)
  wts = np.asarray(opts.weights, np.float32)
  wts = wts / wts.sum()
  pad = math.ceil((opts.kernel_size - 1) / 2) - (opts.blk_size - 1) // 2
  a, da_old = _pyr_step(a)
  b, db_old = _pyr_step(b)
  out = 1.0
  for i in range(levels):
    if i < levels - 2:
      a, da = _pyr_step(a)
      b, db = _pyr_step(b)
    else:
      da, db = a, b
    ssim_map, cs = _ssim_maps(da_old, db_old, opts)
    if i == levels - 1:
      iw, cs = jnp.ones_like(cs), ssim_map
    else:
      parent = db if opts.parent and i < levels - 2 else None
      iw = _information(da_old, db_old, parent, opts)[:, pad:-pad, pad:-pad]
    v = jnp.abs(jnp.sum(cs * iw, axis=(1, 2)) / jnp.sum(iw, axis=(1, 2)))
    out = out * v ** float(wts[i])
    da_old, db_old = da, db
  return out
