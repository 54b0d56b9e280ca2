"""Asymmetric Recall aR@k (paper 001, Sec. 4) and plain recall@k, from a similarity matrix.

sim[i, j] is the similarity of left image i to right image j over the N test pairs (the candidates are the
other side's test images only); pair i's partner is j = i.

rank_lr[i] = rank of right i among all right images for the query left i, and rank_rl[i] the same from
right i towards the left images. Ties are counted *pessimistically*: rank = 1 + #{j != i : sim >= sim_ii},
so a tie never makes a pair 'found' (argsort-based code would break ties by index, which flatters whichever
order the data came in).

aR@k = mean_i [ min(rank_lr[i], rank_rl[i]) <= k ]  (found in one direction OR the other),
R@k (left->right) = mean_i [ rank_lr[i] <= k ].
"""
from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from visim_jax.core import ops
from visim_jax.metrics import degenerate


def cosine_matrix(a: jax.Array, b: jax.Array, eps: float = 1e-12) -> jax.Array:
  return ops.l2_normalize(a, eps) @ ops.l2_normalize(b, eps).T


def partner_ranks(sim: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(rank_lr, rank_rl), 1-based, pessimistic on ties; sim is (N, N) with partners on the diagonal."""
  diag = jnp.diagonal(sim)
  n = sim.shape[0]
  off = ~jnp.eye(n, dtype=bool)
  rank_lr = 1 + jnp.sum((sim >= diag[:, None]) & off, axis=1)
  rank_rl = 1 + jnp.sum((sim >= diag[None, :]) & off, axis=0)
  return rank_lr, rank_rl


def asymmetric_recall(sim: jax.Array, ks: Sequence[int]) -> jax.Array:
  """aR@k for each k in ks: shape (len(ks),)."""
  rank_lr, rank_rl = partner_ranks(sim)
  best = jnp.minimum(rank_lr, rank_rl)
  return jnp.stack([jnp.mean(best <= k) for k in ks])


def recall(sim: jax.Array, ks: Sequence[int]) -> jax.Array:
  """Left->right recall@k for each k: shape (len(ks),)."""
  rank_lr, _ = partner_ranks(sim)
  return jnp.stack([jnp.mean(rank_lr <= k) for k in ks])


def asymmetric_recall_features(left: jax.Array, right: jax.Array, ks: Sequence[int]) -> jax.Array:
  """aR@k of cosine similarity between two (N, D) feature sets whose rows are partners."""
  return asymmetric_recall(cosine_matrix(left, right), ks)


def asymmetric_recall_intervals(sim, ks: Sequence[int], **ci) -> dict:
  """{'aR@k': {score, ci_low, ci_high, n}} for each k, a bootstrap over the pairs (the candidate set fixed;
  ci = human.interval's n_resamples / alpha / seed); a degenerate matrix (NaN/Inf, every entry equal) gives
  degenerate cells (metrics/degenerate.py)."""
  from visim_jax.metrics import human
  sim = np.asarray(sim)
  why = degenerate.matrix(sim)
  if why:
    return {f'aR@{k}': degenerate.result(why, sim.shape[0]) for k in ks}
  r_lr, r_rl = (np.asarray(r) for r in partner_ranks(jnp.asarray(sim)))
  best = np.minimum(r_lr, r_rl)
  return {f'aR@{k}': human.recall_interval(best, k, **ci) for k in ks}
