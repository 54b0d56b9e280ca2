"""HaarPSI (Reisenhofer, Bosse, Kutyniok & Wiegand 2018): Haar wavelet magnitude similarities of 3 scales weighted
by the coarsest scale's magnitudes, through a logistic of slope alpha; HIGHER = more similar (1: identical). As piq
0.8.0 `haarpsi`: 0..255 values, YIQ, a 2x downsampling first (zero-pad bottom / right to even, 2x2 mean; the
authors' HaarPSI.m convolves with a 2x2 mean and keeps every other pixel: the same on even sides), Haar filters of
2, 4, 8 px with zero padding (k / 2 - 1 above and left, k / 2 below and right), C = 30, alpha = 4.2, the
chrominance term on |2x2 mean| of I and Q weighted by the mean of the two luminance weights,
HaarPSI = (logit(sum sigmoid(alpha S) W / sum W) / alpha)^2.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from visim_jax.core import cpu_kernels
from visim_jax.models.iqa import ops


@dataclasses.dataclass(frozen=True)
class HaarPSIOptions:
  subsample: bool = True
  c: float = 30.0
  alpha: float = 4.2


def _haar(x, k: int):
  """(N, H, W) -> (N, H, W, 2): the horizontal-edge and vertical-edge Haar responses of side k, zero padded."""
  xp = ops.pad(x, k // 2 - 1, k // 2, k // 2 - 1, k // 2)
  step = np.concatenate([np.ones(k // 2), -np.ones(k // 2)])
  box = np.ones(k) / k
  return jnp.stack([ops.sep(xp, step, box), ops.sep(xp, box, step)], axis=-1)


@functools.partial(cpu_kernels.jit, static_argnums=2)
def haarpsi(x, y, opts: HaarPSIOptions = HaarPSIOptions()):
  """(N,) HaarPSI of float [0, 1] NHWC RGB batches (HIGHER = more similar)."""
  a, b = ops.mix(ops.unit(x) * 255.0, ops.YIQ), ops.mix(ops.unit(y) * 255.0, ops.YIQ)
  ops.need('haarpsi', a.shape[1], a.shape[2], 16)
  if opts.subsample:
    a, b = ops.halve(a), ops.halve(b)
  ca = [_haar(a[..., 0], 2 ** (s + 1)) for s in range(3)]
  cb = [_haar(b[..., 0], 2 ** (s + 1)) for s in range(3)]
  weights = [jnp.maximum(jnp.abs(ca[-1][..., o]), jnp.abs(cb[-1][..., o])) for o in range(2)]
  sims = [(ops.similarity_map(jnp.abs(ca[0][..., o]), jnp.abs(cb[0][..., o]), opts.c)
           + ops.similarity_map(jnp.abs(ca[1][..., o]), jnp.abs(cb[1][..., o]), opts.c)) / 2 for o in range(2)]
  qa = jnp.abs(ops.avg_pool(ops.pad(a[..., 1:], 0, 1, 0, 1), 2, 1))
  qb = jnp.abs(ops.avg_pool(ops.pad(b[..., 1:], 0, 1, 0, 1), 2, 1))
  weights.append((weights[0] + weights[1]) / 2)
  sims.append(ops.similarity_map(qa, qb, opts.c).sum(-1) / 2)
  w, s = jnp.stack(weights, 1), jnp.stack(sims, 1)
  eps = ops.EPS32
  score = (jnp.sum(jax.nn.sigmoid(s * opts.alpha) * w, axis=(1, 2, 3)) + eps) / (jnp.sum(w, axis=(1, 2, 3)) + eps)
  return jnp.square(jnp.log(score / (1.0 - score)) / opts.alpha)
