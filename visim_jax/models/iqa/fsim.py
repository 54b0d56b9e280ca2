"""FSIM / FSIMc (Zhang, Zhang, Mou & Zhang 2011): phase congruency (Kovesi's log-Gabor bank, 4 scales x 4
orientations) and Scharr gradient magnitude similarity, pooled by the larger phase congruency; HIGHER = more
similar (1: identical). As piq 0.8.0 `fsim`: 0..255 values average-pooled by f = max(1, round(min(H, W) / 256))
(the authors' FeatureSIM.m does the same with a box filter and subsampling), Y of YIQ for the structure terms;
FSIMc (chromatic, the default as in piq) multiplies by |S_I S_Q|^0.03. The phase congruency follows piq's port of
Kovesi's phasecong2 (noise threshold from the median of the finest scale's energy, k = 2, divided by 1.7).
`matlab=True` (the `fsim:paper` variant): the authors' FeatureSIM.m where piq departs from it: its YIQ coefficients
(I = 0.596 R - 0.274 G - 0.322 B, Q = 0.211 R - 0.523 G + 0.312 B; piq: 0.5959 / -0.2746 / -0.3213, 0.2115 / -0.5227
/ 0.3112), MATLAB's round for f, and its downsampling (`conv2(., fspecial('average', F), 'same')` then every F-th
pixel from the first: windows centred as conv2 centres them, ceil(H / F) samples; piq's `avg_pool2d(F)` starts its
windows at 0 and drops a partial last one), and its colour factor `real((S_I .* S_Q) .^ 0.03)` where piq takes
|S_I S_Q|^0.03 (they differ where the chroma of the two images have opposite signs). On images under 384 px only the
YIQ coefficients and the colour factor differ.
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
class FSIMOptions:
  chromatic: bool = True        # FSIMc; False: FSIM (luminance only)
  scales: int = 4
  orientations: int = 4
  min_length: int = 6
  mult: int = 2
  sigma_f: float = 0.55
  delta_theta: float = 1.2
  k: float = 2.0
  matlab: bool = False          # True: FeatureSIM.m's YIQ, round, downsampling, colour factor (`fsim:paper`)


def meshgrid(h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
  """piq's get_meshgrid: centred frequency coordinates, 'ij' indexing (float32 as piq builds them)."""
  def axis(n):
    if n % 2:
      return np.arange(-(n - 1) / 2, n / 2, dtype=np.float32) / np.float32(n - 1)
    return np.arange(-n / 2, n / 2, dtype=np.float32) / np.float32(n)
  return np.meshgrid(axis(h), axis(w), indexing='ij')


@functools.lru_cache(maxsize=16)
def log_gabor_bank(h: int, w: int, opts: FSIMOptions) -> np.ndarray:
  """(orientations * scales, H, W) float32 frequency-domain filters, orientation-major (piq _construct_filters)."""
  gx, gy = meshgrid(h, w)
  radius = np.sqrt(gx ** 2 + gy ** 2)
  theta = np.arctan2(-gy, gx)
  lp = np.fft.ifftshift(1.0 / (1.0 + (radius / np.float32(0.45)) ** 30))
  radius, theta = np.fft.ifftshift(radius), np.fft.ifftshift(theta)
  radius[0, 0] = 1
  gabors = []
  for s in range(opts.scales):
    omega = 1.0 / (opts.min_length * opts.mult ** s)
    g = np.exp(-np.log(radius / omega) ** 2 / (2 * math.log(opts.sigma_f) ** 2)) * lp
    g[0, 0] = 0
    gabors.append(g)
  theta_sigma = math.pi / (opts.orientations * opts.delta_theta)
  out = []
  for o in range(opts.orientations):
    ang = o * math.pi / opts.orientations
    ds = np.sin(theta) * math.cos(ang) - np.cos(theta) * math.sin(ang)
    dc = np.cos(theta) * math.cos(ang) + np.sin(theta) * math.sin(ang)
    spread = np.exp(-np.abs(np.arctan2(ds, dc)) ** 2 / (2 * theta_sigma ** 2))
    out += [spread * g for g in gabors]
  return np.stack(out).astype(np.float32)


def phase_congruency(x, filters: np.ndarray, opts: FSIMOptions):
  """(N, H, W) -> (N, H, W) Kovesi's phase congruency as piq computes it."""
  n, h, w = x.shape
  o, s = opts.orientations, opts.scales
  eps = ops.EPS32
  f = jnp.asarray(filters)
  eo = jnp.fft.ifft2(jnp.fft.fft2(x)[:, None] * f[None]).reshape(n, o, s, h, w)
  even, odd = jnp.real(eo), jnp.imag(eo)
  an = jnp.sqrt(even * even + odd * odd)
  sum_e, sum_o = even.sum(2, keepdims=True), odd.sum(2, keepdims=True)
  energy_x = jnp.sqrt(sum_e * sum_e + sum_o * sum_o) + eps
  mean_e, mean_o = sum_e / energy_x, sum_o / energy_x
  energy = (even * mean_e + odd * mean_o - jnp.abs(even * mean_o - odd * mean_e)).sum(2)     # (n, o, h, w)
  # the noise threshold (constants of the filters, host NumPy in float64)
  fr = filters.reshape(o, s, h, w).astype(np.float64)
  em_n = (fr[:, 0] ** 2).sum(axis=(-2, -1))                                                  # (o,)
  fi = np.real(np.fft.ifft2(fr)) * math.sqrt(h * w)
  sum_an2 = (fi ** 2).sum(axis=(1, 2, 3))
  sum_ai_aj = sum((fi[:, j] * fi[:, j + 1:].sum(1)).sum(axis=(-2, -1)) for j in range(s - 1))
  e2 = jnp.square(an[:, :, 0]).reshape(n, o, h * w)
  median = jnp.sort(e2, axis=-1)[..., (h * w - 1) // 2]           # torch.median: the lower of the two middles
  noise_power = (-median / math.log(0.5)) / jnp.asarray(em_n, jnp.float32)
  ne2 = 2.0 * noise_power * jnp.asarray(sum_an2, jnp.float32) + 4.0 * noise_power * jnp.asarray(sum_ai_aj, jnp.float32)
  tau = jnp.sqrt(ne2 / 2.0)
  thr = (tau * math.sqrt(math.pi / 2) + opts.k * jnp.sqrt((2 - math.pi / 2) * tau * tau)) / 1.7   # (n, o)
  energy = jnp.maximum(energy - thr[..., None, None], 0.0)
  return (energy.sum(1) + eps) / (an.sum(axis=(1, 2)) + eps)


def chroma_term(p, matlab: bool = False, lam: float = 0.03):
  """FSIMc's colour factor of S_I S_Q = p: piq's |p|^lambda, or FeatureSIM.m's `real(p .^ lambda)` (a negative p,
  opposite chroma signs, gives |p|^lambda cos(pi lambda): MATLAB's principal power)."""
  r = jnp.abs(p) ** lam
  return jnp.where(p < 0, r * math.cos(math.pi * lam), r) if matlab else r


@functools.partial(cpu_kernels.jit, static_argnums=2)
def fsim(x, y, opts: FSIMOptions = FSIMOptions()):
  """(N,) FSIM(c) of float [0, 1] NHWC RGB batches (HIGHER = more similar)."""
  a, b = ops.unit(x) * 255.0, ops.unit(y) * 255.0
  if opts.matlab:
    f = ops.matlab_factor(a.shape[1], a.shape[2])
    a, b = (ops.mix(ops.box_same_down(t, f), ops.YIQ_MATLAB) for t in (a, b))
  else:
    f = ops.wang_factor(a.shape[1], a.shape[2])
    a, b = ops.mix(ops.avg_pool(a, f), ops.YIQ), ops.mix(ops.avg_pool(b, f), ops.YIQ)
  filters = log_gabor_bank(a.shape[1], a.shape[2], opts)
  pc_a, pc_b = phase_congruency(a[..., 0], filters, opts), phase_congruency(b[..., 0], filters, opts)
  pc = ops.similarity_map(pc_a, pc_b, 0.85)
  gm = ops.similarity_map(ops.gradient_map(a[..., 0], ops.SCHARR), ops.gradient_map(b[..., 0], ops.SCHARR), 160.0)
  pc_max = jnp.maximum(pc_a, pc_b)
  score = gm * pc * pc_max
  if opts.chromatic:
    s_i = ops.similarity_map(a[..., 1], b[..., 1], 200.0)
    s_q = ops.similarity_map(a[..., 2], b[..., 2], 200.0)
    score = score * chroma_term(s_i * s_q, opts.matlab)
  return score.sum(axis=(1, 2)) / pc_max.sum(axis=(1, 2))
