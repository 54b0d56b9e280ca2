"""The adaptation function (paper 001, Sec. 3); its loss, Eq. 1, is losses/symmetric_ce.py.

a = ReLU(W d), W: pca_dim -> adapt_dim (256 -> 1024), no bias.
S = cosine(a_left, a_right) * sigma        (N x N, row i = left i against every right)
L = (CE(softmax(S), I) + CE(softmax(S^T), I)) / 2   (mean over the N rows; the partner is the diagonal)

W is initialised as torch.nn.Linear does (the reference code): U(-1/sqrt(in), 1/sqrt(in)).
`dtype` is the matmul input dtype (bfloat16 on accelerators halves the traffic); products accumulate in
float32, and the parameters, norms and softmax stay float32.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from visim_jax.core import ops


def init(key: jax.Array, in_dim: int = 256, out_dim: int = 1024) -> dict:
  bound = 1.0 / jnp.sqrt(in_dim)
  return {'w': jax.random.uniform(key, (in_dim, out_dim), jnp.float32, -bound, bound)}


def _matmul(a: jax.Array, b: jax.Array, dtype) -> jax.Array:
  return jnp.matmul(a.astype(dtype), b.astype(dtype), preferred_element_type=jnp.float32)


def adapt(params: dict, d: jax.Array, dtype=jnp.float32) -> jax.Array:
  return jax.nn.relu(_matmul(d, params['w'], dtype))


def cosine_logits(a_left: jax.Array, a_right: jax.Array, sigma: float, eps: float = 1e-8,
                  dtype=jnp.float32) -> jax.Array:
  l, r = ops.l2_normalize(a_left, eps), ops.l2_normalize(a_right, eps)
  return _matmul(l, r.T, dtype) * sigma
