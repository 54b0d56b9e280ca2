"""DSS, the DCT Subbands Similarity (Balanov, Schwartz, Moshe & Huleihel 2015): blockwise 8x8 DCT of the luminance,
per subband a local variance similarity (times a covariance term on the DC subband) pooled by the mean of its lowest
5 %, the subbands weighted by a Gaussian of their frequency; HIGHER = more similar (1: identical). As piq 0.8.0
`dss`: 0..255 values, Y of YIQ, the image cropped to a multiple of 8, Gaussian weights exp(-((m - .5)^2 + (n - .5)^2)
/ (2 1.55^2)) over m, n = 1..8 with those below 0.01 dropped, local statistics by a 3x3 Gaussian (sigma 1.5, zero
padding), C = 1000 (DC) / 300 (AC), the lowest round(0.05 HW) values averaged.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import jax.numpy as jnp
import numpy as np

from visim_jax.core import cpu_kernels
from visim_jax.models.iqa import ops


@dataclasses.dataclass(frozen=True)
class DSSOptions:
  dct_size: int = 8
  sigma_weight: float = 1.55
  kernel_size: int = 3
  sigma_similarity: float = 1.5
  percentile: float = 0.05


def dct_matrix(n: int) -> np.ndarray:
  """The orthonormal DCT-II matrix (piq's _dct_matrix)."""
  p, q = np.arange(1, n)[:, None], np.arange(1, 2 * n, 2)[None, :]
  return np.concatenate([np.full((1, n), math.sqrt(1 / n)), math.sqrt(2 / n) * np.cos(math.pi / (2 * n) * p * q)])


def subband_weights(opts: DSSOptions) -> np.ndarray:
  c = (np.arange(1, opts.dct_size + 1) - 0.5) ** 2
  w = np.exp(-(c[None, :] + c[:, None]) / (2 * opts.sigma_weight ** 2)).astype(np.float32)
  w[w < 0.01] = 0
  return w


def _lowest_mean(m, k: int):
  """(N, h, w) -> (N,) mean of the k smallest values per image."""
  return jnp.mean(jnp.sort(m.reshape(m.shape[0], -1), axis=-1)[:, :k], axis=-1)


def _subband(x, y, dc: bool, opts: DSSOptions):
  c = 1000.0 if dc else 300.0
  g = ops.gaussian_1d(opts.kernel_size, opts.sigma_similarity)
  p = opts.kernel_size // 2
  f = lambda t: ops.sep(ops.pad(t, p, p, p, p), g, g)  # noqa: E731
  mu_x, mu_y = f(x), f(y)
  s_xx = jnp.maximum(f(x * x) - mu_x ** 2, 0.0)
  s_yy = jnp.maximum(f(y * y) - mu_y ** 2, 0.0)
  root = jnp.sqrt(s_xx * s_yy)
  k = round(opts.percentile * (x.shape[1] * x.shape[2]))
  sim = _lowest_mean((2 * root + c) / (s_xx + s_yy + c), k)
  if dc:
    s_xy = f(x * y) - mu_x * mu_y
    sim = sim * _lowest_mean((s_xy + c) / (root + c), k)
  return sim


@functools.partial(cpu_kernels.jit, static_argnums=2)
def dss(x, y, opts: DSSOptions = DSSOptions()):
  """(N,) DSS of float [0, 1] NHWC RGB batches (HIGHER = more similar)."""
  lum = lambda v: (ops.unit(v) * 255.0) @ jnp.asarray(ops.YIQ[0], jnp.float32)  # noqa: E731
  a, b = lum(x), lum(y)
  n, h, w = a.shape
  d = opts.dct_size
  ops.need('dss', h, w, max(d, opts.kernel_size))
  rows, cols = d * (h // d), d * (w // d)
  mat = jnp.asarray(dct_matrix(d), jnp.float32)

  def blocks(t):   # (N, rows/d, cols/d, m, n): the DCT coefficients of each block, by subband
    t = t[:, :rows, :cols].reshape(n, rows // d, d, cols // d, d).transpose(0, 1, 3, 2, 4)
    return jnp.einsum('mi,nabij,kj->nabmk', mat, t, mat, precision='highest')
  da, db = blocks(a), blocks(b)
  wts = subband_weights(opts)
  total = wts / wts.sum() + ops.EPS32
  ac = [(m, k) for m in range(d) for k in range(d) if wts[m, k] > 0 and (m, k) != (0, 0)]
  score = float(total[0, 0]) * _subband(da[..., 0, 0], db[..., 0, 0], True, opts)
  if ac:   # the AC subbands as one batch of maps (one program, whatever their count)
    sub = lambda t: jnp.stack([t[..., m, k] for m, k in ac], 1).reshape((-1,) + t.shape[1:3])  # noqa: E731
    sims = _subband(sub(da), sub(db), False, opts).reshape(n, len(ac))
    score = score + sims @ jnp.asarray([total[m, k] for m, k in ac], jnp.float32)
  return score
