"""MDSI, the Mean Deviation Similarity Index (Nafchi, Shahkolaei, Hedjam & Cheriet 2016): gradient similarity of
the reference, the distorted image and their average, chromaticity similarity in LHM, combined and pooled by a
deviation of their 1/4 powers; LOWER = more similar (0: identical). As piq 0.8.0 `mdsi`: 0..255 values average-
pooled by f = max(1, round(min(H, W) / 256)) after zero padding ((f - 1) // 2 before, f // 2 after; the authors'
MDSI.m filters with a box and subsamples), LHM (L = 0.2989 R + 0.587 G + 0.114 B, H, M), Prewitt gradients,
C1 = 140, C2 = 55, C3 = 550, 'sum' combination alpha = 0.6 (or 'mult': GS^0.2 CS^0.1 as complex powers, as piq),
q = 0.25, o = 0.25, rho = 1. x is the distorted image, y the reference (piq's order; the paper's GS_R,D +
GS_D,F - GS_R,F with F the average).
"""
from __future__ import annotations

import dataclasses
import functools

import jax.numpy as jnp

from visim_jax.core import cpu_kernels
from visim_jax.core.errors import UserError
from visim_jax.models.iqa import ops


@dataclasses.dataclass(frozen=True)
class MDSIOptions:
  c1: float = 140.0
  c2: float = 55.0
  c3: float = 550.0
  combination: str = 'sum'
  alpha: float = 0.6
  beta: float = 0.1
  gamma: float = 0.2
  rho: float = 1.0
  q: float = 0.25
  o: float = 0.25


def _cpow(re, im, e: float):
  """(re + i im)^e by modulus and argument (piq's pow_for_complex): (re', im')."""
  r, phi = jnp.sqrt(re * re + im * im) ** e, jnp.arctan2(im, re) * e
  return r * jnp.cos(phi), r * jnp.sin(phi)


def pool_wang_zero(x):
  """Zero-pad ((f - 1) // 2, f // 2) and average-pool by f = max(1, round(min(H, W) / 256)) (piq's MDSI, SR-SIM)."""
  return ops.box_same_down(x, ops.wang_factor(x.shape[1], x.shape[2]))


@functools.partial(cpu_kernels.jit, static_argnums=2)
def mdsi(x, y, opts: MDSIOptions = MDSIOptions()):
  """(N,) MDSI of float [0, 1] NHWC RGB batches, x distorted, y the reference (LOWER = more similar)."""
  if opts.combination not in ('sum', 'mult'):
    raise UserError(f"mdsi: combination={opts.combination!r}; one of sum, mult")
  a = ops.mix(pool_wang_zero(ops.unit(x) * 255.0), ops.LHM)
  b = ops.mix(pool_wang_zero(ops.unit(y) * 255.0), ops.LHM)
  gx, gy = ops.gradient_map(a[..., 0]), ops.gradient_map(b[..., 0])
  gavg = ops.gradient_map((a[..., 0] + b[..., 0]) / 2.0)
  gs = (ops.similarity_map(gx, gy, opts.c1) + ops.similarity_map(gx, gavg, opts.c2)
        - ops.similarity_map(gy, gavg, opts.c2))
  cs = ((2.0 * (a[..., 1] * b[..., 1] + a[..., 2] * b[..., 2]) + opts.c3)
        / (a[..., 1] ** 2 + b[..., 1] ** 2 + a[..., 2] ** 2 + b[..., 2] ** 2 + opts.c3))
  zero = jnp.zeros_like(gs)
  if opts.combination == 'sum':
    re, im = opts.alpha * gs + (1 - opts.alpha) * cs, zero
  else:
    g_re, g_im = _cpow(gs, zero, opts.gamma)
    c_re, c_im = _cpow(cs, zero, opts.beta)
    re, im = g_re * c_re, g_im + c_im          # piq's product (real parts multiplied, imaginary parts added)
  p_re, p_im = _cpow(re, im, opts.q)
  m_re, m_im = p_re.mean(axis=(1, 2), keepdims=True), p_im.mean(axis=(1, 2), keepdims=True)
  dev = jnp.sqrt((p_re - m_re) ** 2 + (p_im - m_im) ** 2)
  return jnp.mean(dev ** opts.rho, axis=(1, 2)) ** (opts.o / opts.rho)
