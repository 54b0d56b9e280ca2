"""VIF-p, the pixel-domain Visual Information Fidelity (Sheikh & Bovik 2006, vifp_mscale.m): HIGHER = more similar
(1: identical; above 1 for contrast enhancement). As piq 0.8.0 `vif_p`: luminance 0.299 R + 0.587 G + 0.114 B on
0..255 values, 4 scales with Gaussian windows of 17, 9, 5, 3 px (sigma = size / 5), each coarser scale filtered by
its own window then subsampled by 2 ('valid' positions), the noise variance sigma_n^2 = 2, the local-statistics
guards of the authors' code, score = (sum of the distorted information + 1e-8) / (sum of the reference's + 1e-8).
The first argument is the distorted image, the second the reference (piq's order: vif_p(x, y) with y the
reference); the zoo's distance 1 - VIF-p keeps that order (reference second).
"""
from __future__ import annotations

import dataclasses
import functools

import jax.numpy as jnp

from visim_jax.core import cpu_kernels
from visim_jax.models.iqa import ops

MIN_SIDE = 41


@dataclasses.dataclass(frozen=True)
class VIFOptions:
  sigma_n_sq: float = 2.0


@functools.partial(cpu_kernels.jit, static_argnums=2)
def vif_p(x, y, opts: VIFOptions = VIFOptions()):
  """(N,) VIF-p of float [0, 1] NHWC RGB batches, x distorted, y the reference (HIGHER = more similar)."""
  grey = lambda v: (ops.unit(v) * 255.0) @ jnp.asarray([0.299, 0.587, 0.114], jnp.float32)  # noqa: E731
  a, b = grey(x), grey(y)
  ops.need('vif_p', a.shape[1], a.shape[2], MIN_SIDE)
  eps = 1e-8
  num = den = 0.0
  for scale in range(4):
    size = 2 ** (4 - scale) + 1
    k = ops.gaussian_1d(size, size / 5.0)
    if scale:
      a, b = ops.sep(a, k, k)[:, ::2, ::2], ops.sep(b, k, k)[:, ::2, ::2]
    mu_a, mu_b = ops.sep(a, k, k), ops.sep(b, k, k)
    s_aa = jnp.maximum(ops.sep(a * a, k, k) - mu_a * mu_a, 0.0)   # a: the distorted image (piq's x)
    s_bb = jnp.maximum(ops.sep(b * b, k, k) - mu_b * mu_b, 0.0)
    s_ab = ops.sep(a * b, k, k) - mu_a * mu_b
    g = s_ab / (s_bb + eps)
    sv = s_aa - g * s_ab
    ok_b = s_bb >= eps
    g, sv, s_bb = jnp.where(ok_b, g, 0.0), jnp.where(ok_b, sv, s_aa), jnp.where(ok_b, s_bb, 0.0)
    ok_a = s_aa >= eps
    g, sv = jnp.where(ok_a, g, 0.0), jnp.where(ok_a, sv, 0.0)
    sv = jnp.where(g >= 0, sv, s_aa)
    g = jnp.maximum(g, 0.0)
    sv = jnp.where(sv > eps, sv, eps)
    num = num + jnp.sum(jnp.log10(1.0 + g * g * s_bb / (sv + opts.sigma_n_sq)), axis=(1, 2))
    den = den + jnp.sum(jnp.log10(1.0 + s_bb / opts.sigma_n_sq), axis=(1, 2))
  return (num + eps) / (den + eps)
