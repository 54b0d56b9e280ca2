"""Losses and targets for learning similarity from triplets: odd-one-out softmax (hard or soft targets), 2AFC hinge.

A triplet is three rows (i, j, k) of a feature table; its three pair similarities, in AligNet's order, are

  s = [s_ij, s_ik, s_jk]            pair_similarities(e): e (B, 3, D) embeddings; 'dot' = <e_a, e_b> (AligNet's
                                    losses.py, normalize=False) or 'cosine' (the same on unit vectors)

The model's probability that pair p is the most similar one (so the item outside it is the odd one out) is
q = softmax(s / tau) (AligNet: `jax.nn.softmax(predicted_sims / self.tau)`, tau = 100 in configs/siglip.py).
The pair that leaves out the odd column o is p = 2 - o (o = 2 -> pair (i, j)).

  hard_ce(s, odd, tau)              -log q[2 - odd]: THINGS choices (AligNet's ContrastiveTripletLoss with the odd
                                    one last: -s_ij / tau + logsumexp(s / tau))
  soft_kl(s, t, tau, target_tau)    KL(p || q), p = softmax(t / target_tau): teacher similarities t (AligNet's
                                    KLDTripletLoss: sum p log p - sum p log q; target_tau = 1 is their code,
                                    which takes the stored similarities as logits)
  soft_jsd(s, t, tau, target_tau)   (KL(p || m) + KL(q || m)) / 2, m = (p + q) / 2 (AligNet's JSDTripletLoss,
                                    the loss of their SigLIP config)
  hinge(s, judge, margin)           DreamSim's 2AFC hinge on (ref, p0, p1) = (i, j, k): d0 = 1 - s_ij, d1 = 1 - s_ik,
                                    losses.hinge.hinge_loss's per-triplet max(0, margin - (d0 - d1)(2 round(j) - 1))
  correct(s, odd, ties)             1 when the pair leaving out `odd` is the most similar (metrics.human's
                                    odd_one_out_correct on -s; ties='lt' is AligNet's TripletAccuracy, where a
                                    tie is wrong; 'le' is DreamSim's score_things_dataset)
  teacher_odd(t)                    the teacher's odd one out: 2 - argmax(t)

Every loss here is per triplet (B,); `masked_mean` reduces a batch. Pure, jittable, vmappable.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from visim_jax.losses import hinge as hinge_lib
from visim_jax.core import ops
from visim_jax.metrics import human as human_metrics

LOSSES = ('hard', 'kl', 'jsd', 'hinge')
SIMILARITIES = ('dot', 'cosine')


def pair_similarities(e: jax.Array, kind: str = 'dot') -> jax.Array:
  """(B, 3) similarities [s_ij, s_ik, s_jk] of embeddings e (B, 3, D)."""
  if kind not in SIMILARITIES:
    raise ValueError(f'similarity: expected one of {SIMILARITIES}, got {kind!r}')
  e = e.astype(jnp.float32)
  if kind == 'cosine':
    e = ops.l2_normalize(e)
  dot = lambda a, b: jnp.sum(e[:, a] * e[:, b], -1)
  return jnp.stack([dot(0, 1), dot(0, 2), dot(1, 2)], axis=-1)


def _xlogy_sum(p: jax.Array, q: jax.Array) -> jax.Array:
  """sum p log q with 0 log 0 = 0 (AligNet's _neg_entropy / _cross_entropy)."""
  return jnp.sum(jnp.where(p == 0.0, 0.0, p * jnp.log(jnp.where(p == 0.0, 1.0, q))), -1)


def _kl(p: jax.Array, q: jax.Array) -> jax.Array:
  return _xlogy_sum(p, p) - _xlogy_sum(p, q)


def hard_ce(s: jax.Array, odd: jax.Array, tau: float = 1.0) -> jax.Array:
  """-log softmax(s / tau)[2 - odd] per triplet."""
  logq = jax.nn.log_softmax(s / tau, axis=-1)
  pair = 2 - jnp.asarray(odd, jnp.int32)
  return -jnp.take_along_axis(logq, pair[:, None], axis=-1)[:, 0]


def soft_targets(t: jax.Array, target_tau: float = 1.0) -> jax.Array:
  """The teacher's probabilities p = softmax(t / target_tau) over the three pairs."""
  return jax.nn.softmax(jnp.asarray(t, jnp.float32) / target_tau, axis=-1)


def soft_kl(s: jax.Array, t: jax.Array, tau: float = 1.0, target_tau: float = 1.0) -> jax.Array:
  """KL(p || q) per triplet, p = soft_targets(t), q = softmax(s / tau) (log q by log_softmax: finite where
  softmax underflows to 0)."""
  p = soft_targets(t, target_tau)
  return _xlogy_sum(p, p) - jnp.sum(jnp.where(p == 0.0, 0.0, p * jax.nn.log_softmax(s / tau, axis=-1)), -1)


def soft_jsd(s: jax.Array, t: jax.Array, tau: float = 1.0, target_tau: float = 1.0) -> jax.Array:
  """Jensen-Shannon divergence (natural log) per triplet between p = soft_targets(t) and q = softmax(s / tau)."""
  p, q = soft_targets(t, target_tau), jax.nn.softmax(s / tau, axis=-1)
  m = (p + q) / 2
  return (_kl(p, m) + _kl(q, m)) / 2


def hinge(s: jax.Array, judge: jax.Array, margin: float = 0.05) -> jax.Array:
  """DreamSim's hinge per triplet (ref, p0, p1) = columns (0, 1, 2), distances 1 - s (losses/hinge.py)."""
  d0, d1 = 1.0 - s[:, 0], 1.0 - s[:, 1]
  return jax.vmap(lambda a, b, j: hinge_lib.hinge_loss(a[None], b[None], j[None], margin))(d0, d1, judge)


def per_triplet(loss: str, s: jax.Array, target: jax.Array, tau: float, target_tau: float = 1.0,
                margin: float = 0.05) -> jax.Array:
  """The loss `loss` (LOSSES) per triplet; target: odd (B,) int for 'hard', similarities (B, 3) for 'kl' / 'jsd',
  the 2AFC judge (B,) for 'hinge'; 'hard' on similarities takes the teacher's odd one (teacher_odd)."""
  if loss == 'hard':   # soft targets given: the teacher's odd one out
    return hard_ce(s, teacher_odd(target) if jnp.ndim(target) == 2 else target, tau)
  if loss == 'kl':
    return soft_kl(s, target, tau, target_tau)
  if loss == 'jsd':
    return soft_jsd(s, target, tau, target_tau)
  if loss == 'hinge':
    return hinge(s, target, margin)
  raise ValueError(f'loss: expected one of {LOSSES}, got {loss!r}')


def masked_mean(x: jax.Array, mask: jax.Array | None = None) -> jax.Array:
  if mask is None:
    return x.mean()
  w = mask.astype(jnp.float32)
  return jnp.sum(x * w) / jnp.maximum(w.sum(), 1.0)


def teacher_odd(t: jax.Array) -> jax.Array:
  """The odd column of each triplet by its similarities: the item outside the most similar pair."""
  return (2 - jnp.argmax(jnp.asarray(t), axis=-1)).astype(jnp.int32)


def correct(s: jax.Array, odd: jax.Array, ties: str = 'lt') -> jax.Array:
  """(B,) 1.0 where the model's most similar pair is the one that leaves out `odd` (metrics.human rule)."""
  return human_metrics.odd_one_out_correct(-s, odd, ties)


def twoafc_correct(s: jax.Array, judge: jax.Array) -> jax.Array:
  """(B,) DreamSim's 2AFC agreement with d0 = 1 - s_ij, d1 = 1 - s_ik (metrics.human.twoafc_scores)."""
  return human_metrics.twoafc_scores(1.0 - s[:, 0], 1.0 - s[:, 1], judge)
