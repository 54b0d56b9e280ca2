"""VSI, the Visual Saliency-induced Index (Zhang, Shen & Li 2014): SDSP saliency similarity, Scharr gradient
similarity and LMN chrominance similarity, pooled by the larger saliency; HIGHER = more similar (1: identical).
As piq 0.8.0 `vsi`: SDSP (Zhang, Gong, Zhang & Zhang 2013) on the image resized to 256x256 (bilinear, as torch's
`interpolate`; the authors' SDSP.m uses MATLAB imresize), CIE Lab with the D50 white (piq's rgb2lab), a log-Gabor
band-pass (omega_0 = 0.021, sigma_F = 1.34), the central prior sigma_D = 145, the warm-colour prior sigma_C =
0.001, back to the image size (bilinear, align_corners) and min-max normalised per image; then LMN and the saliency
maps average-pooled by f = max(1, round(min(H, W) / 256)) after replicate padding (f // 2 before, (f - 1) // 2
after); C1 = 1.27, C2 = 386, C3 = 130, alpha = 0.4, beta = 0.02 (S_C^beta as the real part of a complex power).
`matlab=True` (the `vsi:paper` variant): the authors' VSI.m (with its own SDSP) where piq departs from it: MATLAB
`imresize(., 'bilinear')` both ways (antialiased when shrinking, half-pixel centres both ways: `ops.imresize_matrix`
with the triangle kernel), its RGB2Lab's rounded D50 white (0.9642, 1, 0.8251), MATLAB's round for f and its
downsampling (`conv2(., fspecial('average', F), 'same')`, every F-th pixel: `ops.box_same_down`, zeros outside,
where piq replicates the border). The constants, the log-Gabor grid, the central prior, the Scharr magnitude and
the pooling are VSI.m's already (docs/metrics.md's fidelity table).
"""
from __future__ import annotations

import dataclasses
import functools

import jax.numpy as jnp
import numpy as np

from visim_jax.core import cpu_kernels
from visim_jax.models.iqa import fsim as fsim_lib
from visim_jax.models.iqa import ops

SDSP_SIZE = 256


@dataclasses.dataclass(frozen=True)
class VSIOptions:
  c1: float = 1.27
  c2: float = 386.0
  c3: float = 130.0
  alpha: float = 0.4
  beta: float = 0.02
  omega_0: float = 0.021
  sigma_f: float = 1.34
  sigma_d: float = 145.0
  sigma_c: float = 0.001
  matlab: bool = False          # True: VSI.m's resize, Lab white, round and downsampling (`vsi:paper`)


@functools.lru_cache(maxsize=4)
def _sdsp_constants(opts: VSIOptions) -> tuple[np.ndarray, np.ndarray]:
  """The log-Gabor filter and the central prior on the 256x256 grid (piq's _log_gabor and s_d), float32."""
  xx, yy = fsim_lib.meshgrid(SDSP_SIZE, SDSP_SIZE)
  radius = np.sqrt(xx ** 2 + yy ** 2)
  r = np.fft.ifftshift(radius * (radius <= 0.5))
  r[0, 0] = 1
  with np.errstate(divide='ignore'):
    lg = np.exp(-np.log(r / np.float32(opts.omega_0)) ** 2 / (2 * opts.sigma_f ** 2))
  lg[0, 0] = 0
  cx, cy = xx * SDSP_SIZE + 1, yy * SDSP_SIZE + 1
  s_d = np.exp(-(cx ** 2 + cy ** 2) / opts.sigma_d ** 2)
  return lg.astype(np.float32), s_d.astype(np.float32)


def sdsp(x255, opts: VSIOptions = VSIOptions()):
  """(N, H, W, 3) 0..255 RGB -> (N, H, W) SDSP saliency in [0, 1] (min-max normalised per image)."""
  n, h, w, _ = x255.shape
  lg, s_d = _sdsp_constants(opts)
  if opts.matlab:     # MATLAB imresize(., [256, 256], 'bilinear') there and imresize(., [H, W], 'bilinear') back
    mh, mw = (ops.imresize_matrix(n_, SDSP_SIZE, SDSP_SIZE / n_, 'triangle') for n_ in (h, w))
    bh, bw = (ops.imresize_matrix(SDSP_SIZE, n_, n_ / SDSP_SIZE, 'triangle') for n_ in (h, w))
  else:               # torch interpolate, bilinear: align_corners False there, True back
    mh, mw = ops.bilinear_matrix(h, SDSP_SIZE, False), ops.bilinear_matrix(w, SDSP_SIZE, False)
    bh, bw = ops.bilinear_matrix(SDSP_SIZE, h, True), ops.bilinear_matrix(SDSP_SIZE, w, True)
  small = jnp.stack([ops.resample(x255[..., c], mh, mw) for c in range(3)], -1)
  lab = ops.rgb_to_lab_d50(small, ops.D50_SDSP if opts.matlab else None)          # (n, 256, 256, 3)
  band = jnp.real(jnp.fft.ifft2(jnp.fft.fft2(jnp.moveaxis(lab, -1, 1)) * jnp.asarray(lg)))
  s_f = jnp.sqrt(jnp.sum(band * band, axis=1))
  eps = ops.EPS32
  lo, hi = lab.min(axis=(1, 2), keepdims=True), lab.max(axis=(1, 2), keepdims=True)
  norm = (lab - lo) / (hi - lo + eps)
  s_c = 1.0 - jnp.exp(-jnp.sum(norm[..., 1:] ** 2, -1) / opts.sigma_c ** 2)
  vs = ops.resample(s_f * jnp.asarray(s_d) * s_c, bh, bw)
  lo, hi = vs.min(axis=(1, 2), keepdims=True), vs.max(axis=(1, 2), keepdims=True)
  return (vs - lo) / (hi - lo + eps)


@functools.partial(cpu_kernels.jit, static_argnums=2)
def vsi(x, y, opts: VSIOptions = VSIOptions()):
  """(N,) VSI of float [0, 1] NHWC RGB batches (HIGHER = more similar)."""
  a, b = ops.unit(x) * 255.0, ops.unit(y) * 255.0
  va, vb = sdsp(a, opts)[..., None], sdsp(b, opts)[..., None]
  la, lb = ops.mix(a, ops.LMN), ops.mix(b, ops.LMN)
  if opts.matlab:
    f = ops.matlab_factor(a.shape[1], a.shape[2])
    va, vb, la, lb = (ops.box_same_down(t, f) for t in (va, vb, la, lb))
  else:
    f = ops.wang_factor(a.shape[1], a.shape[2])
    if f // 2:
      p = lambda t: ops.pad(t, f // 2, (f - 1) // 2, f // 2, (f - 1) // 2, 'edge')  # noqa: E731
      va, vb, la, lb = p(va), p(vb), p(la), p(lb)
    va, vb, la, lb = (ops.avg_pool(t, f) for t in (va, vb, la, lb))
  va, vb = va[..., 0], vb[..., 0]
  s_vs = ops.similarity_map(va, vb, opts.c1)
  s_gm = ops.similarity_map(ops.gradient_map(la[..., 0], ops.SCHARR), ops.gradient_map(lb[..., 0], ops.SCHARR),
                            opts.c2)
  s_c = ops.similarity_map(la[..., 1], lb[..., 1], opts.c3) * ops.similarity_map(la[..., 2], lb[..., 2], opts.c3)
  s_c_pow = jnp.abs(s_c) ** opts.beta * jnp.cos(jnp.arctan2(jnp.zeros_like(s_c), s_c) * opts.beta)
  vs_max = jnp.maximum(va, vb)
  eps = ops.EPS32
  s = s_vs * s_gm ** opts.alpha * s_c_pow
  return (jnp.sum(s * vs_max, axis=(1, 2)) + eps) / (jnp.sum(vs_max, axis=(1, 2)) + eps)
