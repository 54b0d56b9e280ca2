"""SR-SIM (Zhang & Li 2012): spectral-residual visual saliency similarity and Scharr gradient similarity, pooled
by the larger saliency; HIGHER = more similar (1: identical). As piq 0.8.0 `srsim`: 0..255 values average-pooled
by f = max(1, round(min(H, W) / 256)) after zero padding ((f - 1) // 2 before, f // 2 after), Y of YIQ; the
saliency on the image resized by 1/4 (MATLAB imresize bicubic with antialiasing, as piq's port), the spectral
residual log|F| - mean_3x3(log|F|) (replicate padding), |ifft|^2, a Gaussian of 10 px sigma 3.8 (zero padded to
11 as piq), min-max normalised, resized back (bicubic); C1 = 0.40, C2 = 225, alpha = 0.5; `chromatic` adds
|S_I S_Q|^0.03 (C = 200) as FSIMc. One departure from piq: piq min-max normalises the saliency over the whole
batch (`torch.min(saliency_map[:])`), so its value of a pair depends on the batch; here each image is normalised
alone (a pair scores what piq gives it in a batch of one; the authors' SRSIM.m handles one image).
"""
from __future__ import annotations

import dataclasses
import functools
import math

import jax.numpy as jnp
import numpy as np

from visim_jax.core import cpu_kernels
from visim_jax.models.iqa import mdsi as mdsi_lib
from visim_jax.models.iqa import ops


@dataclasses.dataclass(frozen=True)
class SRSIMOptions:
  chromatic: bool = False
  scale: float = 0.25
  kernel_size: int = 3
  sigma: float = 3.8
  gaussian_size: int = 10


def saliency(x, opts: SRSIMOptions):
  """(N, H, W) luminance -> (N, H, W) spectral-residual saliency in [0, 1] (per image)."""
  n, h, w = x.shape
  sh, sw = math.ceil(h * opts.scale), math.ceil(w * opts.scale)
  ops.need('srsim', h, w, math.ceil(max(opts.kernel_size, opts.gaussian_size) / opts.scale),
           ' (after its downsampling by max(1, round(min(H, W) / 256)))')
  small = ops.resample(x, ops.imresize_matrix(h, sh, opts.scale), ops.imresize_matrix(w, sw, opts.scale))
  eps = ops.EPS32
  f = jnp.fft.fft2(small)
  log_amp = jnp.log(jnp.abs(f) + eps)
  phase = jnp.angle(f)
  k = opts.kernel_size
  padded = ops.pad(log_amp, (k - 1) // 2, k // 2, (k - 1) // 2, k // 2, 'edge') if k // 2 else log_amp
  residual = log_amp - ops.avg_pool(padded, k, 1)
  sal = jnp.abs(jnp.fft.ifft2(jnp.exp(residual) * jnp.exp(1j * phase))) ** 2
  g = ops.gaussian_1d(opts.gaussian_size, opts.sigma)
  if opts.gaussian_size % 2 == 0:
    g = np.concatenate([[0.0], g])
  p = (len(g) - 1) // 2
  sal = ops.sep(ops.pad(sal, p, p, p, p), g, g)
  lo, hi = sal.min(axis=(1, 2), keepdims=True), sal.max(axis=(1, 2), keepdims=True)
  sal = (sal - lo) / (hi - lo + eps)
  return ops.resample(sal, ops.imresize_matrix(sh, h, h / sh), ops.imresize_matrix(sw, w, w / sw))


@functools.partial(cpu_kernels.jit, static_argnums=2)
def srsim(x, y, opts: SRSIMOptions = SRSIMOptions()):
  """(N,) SR-SIM of float [0, 1] NHWC RGB batches (HIGHER = more similar)."""
  a = ops.mix(mdsi_lib.pool_wang_zero(ops.unit(x) * 255.0), ops.YIQ)
  b = ops.mix(mdsi_lib.pool_wang_zero(ops.unit(y) * 255.0), ops.YIQ)
  sa, sb = saliency(a[..., 0], opts), saliency(b[..., 0], opts)
  gm = ops.similarity_map(ops.gradient_map(a[..., 0], ops.SCHARR), ops.gradient_map(b[..., 0], ops.SCHARR), 225.0)
  s_max = jnp.maximum(sa, sb)
  score = ops.similarity_map(sa, sb, 0.4) * gm ** 0.5 * s_max
  if opts.chromatic:
    score = score * jnp.abs(ops.similarity_map(a[..., 1], b[..., 1], 200.0)
                            * ops.similarity_map(a[..., 2], b[..., 2], 200.0)) ** 0.03
  return jnp.sum(score, axis=(1, 2)) / (jnp.sum(s_max, axis=(1, 2)) + ops.EPS32)
