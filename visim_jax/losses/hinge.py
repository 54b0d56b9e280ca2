"""DreamSim's 2AFC hinge loss (training/train.py, util/train_utils.py HingeLoss of ssundaram21/dreamsim).

For triplets (ref, p0, p1) with j = the fraction of humans preferring p1 (NIGHTS right_vote):
  logit = d0 - d1,   y = 2 round(j) - 1   (round half to even, as torch.round: a 0.5 judgement goes to -1)
  L     = mean_i max(0, margin - logit_i y_i)                    margin 0.05 (configs/*.yaml)
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def hinge_loss(d0, d1, judge, margin: float = 0.05, mask=None) -> jax.Array:
  """DreamSim's hinge loss, mean over the (masked) batch: max(0, margin - (d0 - d1)(2 round(j) - 1))."""
  y = 2.0 * jnp.round(jnp.asarray(judge, jnp.float32)) - 1.0
  per = jnp.maximum(0.0, margin - (d0 - d1) * y)
  if mask is None:
    return per.mean()
  w = mask.astype(jnp.float32)
  return jnp.sum(per * w) / jnp.maximum(w.sum(), 1.0)
