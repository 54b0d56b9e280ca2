"""PCA as a pure function (paper 001, Sec. 4: 'a PCA with 256 dimensions' before the adaptation).

fit(x, dim, mask) centres on the (masked) mean and takes the top `dim` right singular vectors of the
centred data, with a deterministic sign (largest-magnitude loading of each component positive), so that a
vmapped fit over runs equals per-run fits exactly. `whiten` divides by the singular values (scaled to unit
variance per component); the reference code does not whiten.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class PCA(NamedTuple):
  mean: jax.Array        # (D,)
  components: jax.Array  # (D, dim)
  scale: jax.Array       # (dim,): 1 (no whitening) or 1/std per component


def fit(x: jax.Array, dim: int, mask: jax.Array | None = None, whiten: bool = False) -> PCA:
  """PCA of the rows of x (N, D) where mask (N,) is true (all rows if None)."""
  n, d = x.shape
  if dim > min(n, d):
    raise ValueError(f'config.pca_dim={dim} exceeds min(samples, features) = min({n}, {d})')
  x = x.astype(jnp.float32)
  w = jnp.ones((n,), jnp.float32) if mask is None else mask.astype(jnp.float32)
  count = jnp.maximum(w.sum(), 1.0)
  mean = (w[:, None] * x).sum(0) / count
  xc = (x - mean) * w[:, None]  # masked rows become zero: they add nothing to the scatter
  if d <= n:
    cov = xc.T @ xc
    evals, evecs = jnp.linalg.eigh(cov)
    comps = evecs[:, ::-1][:, :dim]
    svals = jnp.sqrt(jnp.maximum(evals[::-1][:dim], 0.0))
  else:
    _, svals, vt = jnp.linalg.svd(xc, full_matrices=False)
    comps, svals = vt[:dim].T, svals[:dim]
  sign = jnp.sign(comps[jnp.argmax(jnp.abs(comps), axis=0), jnp.arange(dim)])
  comps = comps * jnp.where(sign == 0, 1.0, sign)
  std = svals / jnp.sqrt(jnp.maximum(count - 1.0, 1.0))
  scale = jnp.where(whiten, 1.0 / jnp.maximum(std, 1e-12), jnp.ones_like(std))
  return PCA(mean, comps, scale)


def transform(pca: PCA, x: jax.Array) -> jax.Array:
  return ((x - pca.mean) @ pca.components) * pca.scale


def explained_variance_ratio(pca: PCA, x: jax.Array, mask: jax.Array | None = None) -> jax.Array:
  """Share of the total variance of (masked) x kept by the components (the paper's 'PCA Variance Sum')."""
  w = jnp.ones(x.shape[:1]) if mask is None else mask.astype(jnp.float32)
  xc = (x - pca.mean) * w[:, None]
  total = jnp.sum(xc ** 2)
  kept = jnp.sum((xc @ pca.components) ** 2)
  return kept / jnp.maximum(total, 1e-12)
