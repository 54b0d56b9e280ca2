"""Host-side checks of a training chunk's outputs: a collapsed or overflowing model stops the run at once.

A diverged or collapsed adaptation does not crash: it reports aR@k = 0 +- 0 (every score tied, pessimistic
ties) and exports a useless adapter. After each checkpoint chunk (the first one included) the runtime's chunk
function passes its outputs here, outside the jitted program: the loss (non-finite, or stuck at ln(n), the
loss of uniform scores), the test ranks (every pair at the worst rank: all scores tied) and the largest
parameter magnitude (overflowing weights). The first sign found raises a one-line UserError naming the
config field that most likely caused it: sigmas when a temperature is far outside its usual range, else lr.
"""
from __future__ import annotations

import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from visim_jax.core.errors import UserError

MAX_PARAM = 1e15          # |w| beyond: float32 products with features overflow
SIGMA_RANGE = (1e-3, 1e3)
MIN_TIED = 10             # test pairs needed before "all at the worst rank" cannot be chance (< 1e-10)  # Eq. 1's temperature (paper 001: 1 and 15); beyond, the softmax is flat or a hard max


def max_abs(params) -> float:
  """The largest |parameter| (a small device reduction; inf when any is non-finite)."""
  leaves = jax.tree.leaves(params)
  m = [float(jnp.max(jnp.where(jnp.isfinite(x), jnp.abs(x), jnp.inf))) for x in leaves if x.size]
  return max(m, default=0.0)


def sign(loss: np.ndarray, ranks: np.ndarray, n_fit: int, params_max: float, epoch0: int) -> str | None:
  """What is degenerate in a chunk, or None. loss (R, S, n) of the chunk's n epochs, ranks (R, S, n, n_test)."""
  bad = ~np.isfinite(loss)
  if bad.any():
    r, s, e = np.argwhere(bad)[0]
    return f'the training loss is {loss[r, s, e]} at epoch {epoch0 + e + 1} (run {r}, sigma #{s})'
  if not math.isfinite(params_max) or params_max > MAX_PARAM:
    return f'the weights overflow (largest |w| = {params_max:.3g}) by epoch {epoch0 + loss.shape[-1]}'
  uniform = math.log(n_fit)
  stuck = np.abs(loss[..., -1] - uniform) <= 2e-6 * uniform
  if stuck.any():
    r, s = np.argwhere(stuck)[0]
    return (f'the loss is stuck at ln({n_fit}) = {uniform:.4f}, the loss of uniform scores, at epoch '
            f'{epoch0 + loss.shape[-1]} (run {r}, sigma #{s})')
  last = ranks[..., -1, :]                                  # (R, S, n_test), 1-based, pessimistic ties
  tied = (last == last.shape[-1]).all(-1)                   # every partner behind every other candidate
  if last.shape[-1] >= MIN_TIED and tied.any():
    r, s = np.argwhere(tied)[0]
    return (f'every test score is tied (all {last.shape[-1]} test pairs at the worst rank: aR@k = 0) at epoch '
            f'{epoch0 + loss.shape[-1]} (run {r}, sigma #{s})')
  return None


def likely_field(sigmas: Sequence[float], lr: float) -> str:
  lo, hi = SIGMA_RANGE
  odd = [s for s in sigmas if not lo <= s <= hi]
  if odd:
    return (f'config.sigmas: the temperature {odd[0]:g} is far outside the usual {lo:g}..{hi:g} (paper: 1 and 15) '
            'and most likely the cause')
  return f'config.lr: the step size {lr:g} is most likely too large; lower config.lr'


def check(loss: np.ndarray, ranks: np.ndarray, n_fit: int, params, epoch0: int, sigmas: Sequence[float],
          lr: float) -> None:
  """Raises a one-line UserError (likely field first) when the chunk's outputs are degenerate."""
  what = sign(loss, ranks, n_fit, max_abs(params), epoch0)
  if what is not None:
    field, _, advice = likely_field(sigmas, lr).partition(': ')
    raise UserError(f'{field}: training collapsed: {what}; {advice}')
