"""GMSD (Xue, Zhang, Mou & Bovik 2014) and MS-GMSD (Zhang, Sander & Bermak 2017): the deviation of the gradient
magnitude similarity map, LOWER = more similar (0: identical). As piq 0.8.0 `gmsd` / `multi_scale_gmsd`:

  GMSD     Y of YIQ on [0, 1] values, one 2x downsampling (zero-pad bottom / right to even, 2x2 mean; the paper's
           MATLAB filters by a 2x2 box with conv2 'same' and keeps every other pixel), Prewitt gradients (zero
           padding), GMS = (2 m_x m_y + T) / (m_x^2 + m_y^2 + T) with T = 170 / 255^2, GMSD = std(GMS) (population;
           `ddof=1`, the `gmsd:paper` variant: MATLAB's std2 with N - 1, as the authors' GMSD.m)
  MS-GMSD  0..255 values, YIQ, 4 scales (halving as above), GMS with the masking alpha = 0.5 and T = 170,
           sqrt(sum_j w_j GMSD_j^2), w = (0.096, 0.596, 0.289, 0.019); `chromatic` (MS-GMSDc) adds the RMSE of I, Q
           at the coarsest scale: gamma MS-GMSD + (1 - gamma) beta1 RMSE_IQ, gamma = 2 / (1 + beta2 e^(-beta3
           MS-GMSD)) - 1
"""
from __future__ import annotations

import dataclasses
import functools

import jax.numpy as jnp

from visim_jax.core import cpu_kernels
from visim_jax.models.iqa import ops


@dataclasses.dataclass(frozen=True)
class GMSDOptions:
  t: float = 170.0 / 255.0 ** 2      # on [0, 1] values (= the paper's 170 on 0..255)
  ddof: int = 0                      # 0: piq's population std; 1: the authors' GMSD.m (MATLAB std2, N - 1)


@dataclasses.dataclass(frozen=True)
class MSGMSDOptions:
  weights: tuple = (0.096, 0.596, 0.289, 0.019)
  chromatic: bool = False            # piq's default; True: MS-GMSDc of the paper
  alpha: float = 0.5
  beta1: float = 0.01
  beta2: float = 0.32
  beta3: float = 15.0
  t: float = 170.0


def _gmsd(x, y, t: float, alpha: float = 0.0, ddof: int = 0):
  """(N, H, W) luminance maps -> (N,) the standard deviation of the gradient magnitude similarity map."""
  gms = ops.similarity_map(ops.gradient_map(x), ops.gradient_map(y), t, alpha)
  n = gms.shape[1] * gms.shape[2]
  ss = jnp.sum(jnp.square(gms - jnp.mean(gms, axis=(1, 2), keepdims=True)), axis=(1, 2))
  return jnp.sqrt(ss / (n - ddof))


@functools.partial(cpu_kernels.jit, static_argnums=2)
def gmsd(x, y, opts: GMSDOptions = GMSDOptions()):
  """(N,) GMSD of float [0, 1] NHWC RGB batches (LOWER = more similar)."""
  a = ops.halve(ops.mix(ops.unit(x), ops.YIQ)[..., :1])[..., 0]
  b = ops.halve(ops.mix(ops.unit(y), ops.YIQ)[..., :1])[..., 0]
  return _gmsd(a, b, opts.t, 0.0, opts.ddof)


@functools.partial(cpu_kernels.jit, static_argnums=2)
def ms_gmsd(x, y, opts: MSGMSDOptions = MSGMSDOptions()):
  """(N,) MS-GMSD (MS-GMSDc with chromatic=True) of float [0, 1] NHWC RGB batches (LOWER = more similar)."""
  a, b = ops.mix(ops.unit(x) * 255.0, ops.YIQ), ops.mix(ops.unit(y) * 255.0, ops.YIQ)
  ops.need('ms_gmsd', a.shape[1], a.shape[2], 2 ** len(opts.weights) + 1)
  w = jnp.asarray(opts.weights, jnp.float32)
  w = w / jnp.sum(w) if tuple(opts.weights) != MSGMSDOptions().weights else w   # piq normalises given weights only
  per = []
  for j in range(len(opts.weights)):
    if j:
      a, b = ops.halve(a), ops.halve(b)
    per.append(_gmsd(a[..., 0], b[..., 0], opts.t, opts.alpha))
  score = jnp.sqrt(jnp.sum(w[None, :] * jnp.square(jnp.stack(per, axis=1)), axis=1))
  if opts.chromatic:
    rmse = jnp.sqrt(jnp.sum(jnp.mean(jnp.square(a[..., 1:] - b[..., 1:]), axis=(1, 2)), axis=-1))
    gamma = 2.0 / (1.0 + opts.beta2 * jnp.exp(-opts.beta3 * score)) - 1.0
    score = gamma * score + (1.0 - gamma) * opts.beta1 * rmse
  return score
