"""The similarity bins of paper 003 (Sec. 3.1: "a histogram from -1 to 1 with 100 bins"), shared by both estimators.

Bin b holds s with floor((s + 1) / 2 * bins) == b; s = 1 goes to the last bin (as np.histogram does) and values
outside [-1, 1] (rounding) are clipped into the end bins. MEAN(b) of Eq. 4 is the bin centre.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

NUM_BINS = 100


def bin_index(s: jax.Array, bins: int = NUM_BINS) -> jax.Array:
  """Bin of a similarity among `bins` equal bins on [-1, 1] (values outside are clipped)."""
  return jnp.clip(jnp.floor((s + 1.0) * (bins / 2.0)), 0, bins - 1).astype(jnp.int32)


def bin_centers(bins: int = NUM_BINS) -> np.ndarray:
  """MEAN(b) of Eq. 4: "the center of an edge", i.e. the centre of each bin."""
  return (-1.0 + (np.arange(bins) + 0.5) * 2.0 / bins).astype(np.float32)
