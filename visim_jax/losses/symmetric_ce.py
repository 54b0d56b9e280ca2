"""Paper 001's loss (Sec. 3, Eq. 1): the symmetric cross-entropy of the sigma-scaled cosine matrix.

S = cosine(a_left, a_right) * sigma        (N x N, row i = left i against every right; models/adaptation.py)
L = (CE(softmax(S), I) + CE(softmax(S^T), I)) / 2   (mean over the N rows; the partner is the diagonal)
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from visim_jax.models.adaptation import adapt, cosine_logits


@jax.custom_vjp
def symmetric_ce(logits: jax.Array) -> jax.Array:
  """(CE(S, I) + CE(S^T, I)) / 2, each the mean over the N rows.

  CE(S, I) = mean_i [logsumexp_j S_ij - S_ii]; CE(S^T, I) the same with the columns. The gradient is written
  out (custom_vjp): dL/dS = (softmax_rows(S) + softmax_cols(S) - 2 I) / (2N), one elementwise pass over S in
  its own layout (autodiff of the S^T direction transposes an N x N matrix twice: on a CPU that costs more
  than the softmaxes)."""
  return _symmetric_ce_fwd(logits)[0]


def _symmetric_ce_fwd(logits):
  diag = jnp.diagonal(logits)
  lse_rows = jax.nn.logsumexp(logits, axis=1)
  lse_cols = jax.nn.logsumexp(logits, axis=0)
  return (jnp.mean(lse_rows - diag) + jnp.mean(lse_cols - diag)) / 2, (logits, lse_rows, lse_cols)


def _symmetric_ce_bwd(res, g):
  logits, lse_rows, lse_cols = res
  n = logits.shape[0]
  eye = jnp.eye(n, dtype=bool)
  p = jnp.exp(logits - lse_rows[:, None]) + jnp.exp(logits - lse_cols[None, :])
  return (jnp.where(eye, p - 2, p) * (g / (2 * n)),)


symmetric_ce.defvjp(_symmetric_ce_fwd, _symmetric_ce_bwd)


def loss_fn(params: dict, d_left: jax.Array, d_right: jax.Array, sigma: float, dtype=jnp.float32) -> jax.Array:
  return symmetric_ce(cosine_logits(adapt(params, d_left, dtype), adapt(params, d_right, dtype), sigma,
                                    dtype=dtype))
