"""Large (N, D) host arrays (a memory-mapped feature cache, say 1.28M x 768) put on the devices block by block.

put_rows(x, total, sharding) returns the (total, D) device array whose first rows are x's (optionally a `rows`
selection, a `transform` applied per block on the device, a dtype) and whose remaining rows are zeros, laid out
by `sharding` (rows split over the mesh, or replicated). Each device's buffer is created once and filled in place
(a jitted dynamic_update_slice with the buffer donated), one block of rows at a time: the host holds one block,
never a second full copy (`jnp.asarray(x)` then `x[idx]` held two on a CPU backend, where the device is the host).
"""
from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from visim_jax.core import cpu_kernels

BLOCK_ROWS = 1 << 15


@functools.lru_cache(maxsize=None)
def _updater(transform: Callable | None, dtype):
  def update(buf, blk, start):
    y = blk if transform is None else transform(blk)
    return jax.lax.dynamic_update_slice(buf, y.astype(dtype), (start, jnp.int32(0)))
  return cpu_kernels.jit(update, donate_argnums=0)


def put_rows(x, total: int, sharding: jax.sharding.Sharding, dtype=None, transform: Callable | None = None,
             rows: np.ndarray | None = None, block: int = BLOCK_ROWS) -> jax.Array:
  """(total, D) array on `sharding`: row i < n is transform(x[rows[i]]) (x[i] without rows), rows >= n are zero.
  x: any (N, D) array-like with numpy slicing (np.memmap included); transform: a jnp function of a block."""
  n = len(rows) if rows is not None else len(x)
  if n > total:
    raise ValueError(f'put_rows: {n} rows do not fit in {total}')
  d = x.shape[1]
  dtype = jnp.dtype(dtype or x.dtype)
  update = _updater(transform, dtype)
  shards = []
  for dev, index in sharding.addressable_devices_indices_map((total, d)).items():
    r0, r1 = index[0].indices(total)[:2]
    buf = jnp.zeros((r1 - r0, d), dtype, device=dev)
    for s in range(r0, min(r1, n), block):
      e = min(s + block, r1, n)
      blk = np.asarray(x[rows[s:e]] if rows is not None else x[s:e])
      buf = update(buf, jax.device_put(blk, dev), np.int32(s - r0))
    shards.append(buf)
  return jax.make_array_from_single_device_arrays((total, d), sharding, shards)


def all_finite(x, block: int = BLOCK_ROWS) -> bool:
  """np.isfinite(x).all() one block of rows at a time (no full-size temporary)."""
  return all(np.isfinite(np.asarray(x[s:s + block])).all() for s in range(0, len(x), block))
