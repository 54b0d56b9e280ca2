"""visim_jax.core.ops.top_k (the pruned exact top-k used on a CPU) and running_topk: the same values and indices as
a stable descending argsort written here in NumPy (ties: the lower index), on ties, -inf, NaN, every row length."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from visim_jax.core import cpu_kernels
from visim_jax.core import ops


def reference_topk(x: np.ndarray, k: int):
  """Plain loop: for each row, indices sorted by (value descending, index ascending), NaN first (lax.top_k's order:
  a NaN compares above every number)."""
  vals, idx = [], []
  for row in x:
    order = sorted(range(len(row)), key=lambda j: (0 if np.isnan(row[j]) else 1,
                                                   -row[j] if not np.isnan(row[j]) else 0.0, j))[:k]
    idx.append(order)
    vals.append([row[j] for j in order])
  return np.array(vals, np.float32), np.array(idx, np.int32)


def _check(x, k):
  got_s, got_i = cpu_kernels.jit(lambda a: ops.top_k(a, k))(jnp.asarray(x))
  want_s, want_i = reference_topk(np.asarray(x), k)
  np.testing.assert_array_equal(np.asarray(got_i), want_i)
  np.testing.assert_array_equal(np.asarray(got_s), want_s)
  lax_s, lax_i = jax.lax.top_k(jnp.asarray(x), k)
  np.testing.assert_array_equal(np.asarray(got_i), np.asarray(lax_i))


@pytest.mark.parametrize('n', [11, 127, 1000, 1331, 4096 + 3])
def test_top_k_equals_a_stable_sort_on_random_rows(n):
  rng = np.random.default_rng(n)
  _check(rng.standard_normal((5, n)).astype(np.float32), 10)


def test_top_k_ties_inf_and_nan_follow_the_same_order():
  rng = np.random.default_rng(0)
  for trial in range(12):
    n = int(rng.integers(400, 3000))
    x = rng.integers(0, int(rng.integers(1, 6)), (4, n)).astype(np.float32)   # many ties, at the k-th value too
    if trial % 3 == 1:
      x[:, rng.integers(0, n, n - 5)] = -np.inf       # fewer than k finite values in the row
    if trial % 3 == 2:
      x[1, rng.integers(0, n, 3)] = np.nan
    _check(x, 10)
  # duplicates of the best rows (a database holding one image twice): equal scores straddle the k-th place
  x = rng.standard_normal((3, 5000)).astype(np.float32)
  x[:, 4000:4012] = x[:, 100:112]
  _check(x, 10)
  _check(np.full((2, 3000), -np.inf, np.float32), 5)


def test_running_topk_over_blocks_equals_the_whole_row():
  rng = np.random.default_rng(1)
  s = rng.integers(0, 50, (6, 8 * 700)).astype(np.float32)   # ties across blocks
  blocks = jnp.asarray(s.T.reshape(8, 700, 6))

  def score(block, b):
    del b
    return block.T

  vals, idx = cpu_kernels.jit(lambda bl: ops.running_topk(score, bl, 7, 6, n_valid=8 * 700 - 13))(blocks)
  want_s, want_i = reference_topk(np.where(np.arange(8 * 700) < 8 * 700 - 13, s, -np.inf), 7)
  np.testing.assert_array_equal(np.asarray(idx), want_i)
  np.testing.assert_array_equal(np.asarray(vals), want_s)
