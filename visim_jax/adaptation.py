"""The adaptation function and its loss (paper 001, Sec. 3, Eq. 1).

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
import optax

from visim_jax import ops


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


def symmetric_ce(logits: jax.Array) -> jax.Array:
  """(CE(S, I) + CE(S^T, I)) / 2, each the mean over the N rows."""
  labels = jnp.arange(logits.shape[0])
  lr = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
  rl = optax.softmax_cross_entropy_with_integer_labels(logits.T, labels).mean()
  return (lr + rl) / 2


def loss_fn(params: dict, d_left: jax.Array, d_right: jax.Array, sigma: float, dtype=jnp.float32) -> jax.Array:
  return symmetric_ce(cosine_logits(adapt(params, d_left, dtype), adapt(params, d_right, dtype), sigma,
                                    dtype=dtype))
