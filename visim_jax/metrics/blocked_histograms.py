"""The exact estimator: per-class histograms of EVERY pair by a blocked pass over the similarity matrix.

The kept samples (label >= 0) are padded to a multiple of a tile and the upper triangle of the (n, n) cosine
matrix is cut into (tile x tile) blocks I <= J. Each block is one matmul of two row tiles -> bin indices ->
segment sums into the counts, accumulated on the device; the block list is split over the devices of a 1-D
mesh (shard_map: x replicated, each device scans its blocks, a psum adds them), so memory is O(tile^2) plus
the features, and every unordered pair i < j is counted exactly once:

* same class y: intra[y, b] += w_i w_j;
* classes y != y': inter[y, b] += w_i w_j and inter[y', b] += w_i w_j (the pair is an inter pair of both
  classes), and, with pairwise=True, pair[y, y', b] += w_i w_j; the result is symmetrised, so pair[y, y']
  holds every pair between y and y'.

w are per-sample multiplicities, one row per replicate (R, n): ones give the plain histograms, multinomial
counts give bootstrap replicates of the whole computation in the same pass. Counts are int32 on the device:
the host adds the calls' results in int64, and a call covers few enough blocks that no bin can overflow.

`make_plan` / `check_plan` estimate memory and time before anything runs and refuse, naming the config field,
when a run would not fit. Pure math apart from that host driver (no I/O).
"""
from __future__ import annotations

import functools
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from visim_jax.core import cpu_kernels
from visim_jax.core import device_rows, memory
from visim_jax.core.errors import UserError
from visim_jax.metrics.bins import NUM_BINS, bin_index
from visim_jax.metrics.pair_sampling import bucket

INT32_MAX = 2 ** 31 - 1
AXIS = 'data'
# Rough pairs (similarity + 3 scatters) per second per device, for the time estimate only. CPU: measured on the
# shared 2-core box (benchmarks/histograms.py --mode=exact, D=256); accelerators: a conservative guess.
NOMINAL_PAIRS_PER_S = {'cpu': 2e7, 'gpu': 2e9, 'tpu': 2e9}


def default_tile() -> int:
  return 256 if jax.default_backend() == 'cpu' else 1024


class Plan(NamedTuple):
  samples: int          # kept samples n
  padded: int           # n rounded up (a power of two, a multiple of the tile): the shape, few compilations
  dim: int
  classes: int
  tile: int
  blocks: int           # tile blocks I <= J
  devices: int
  pairs: int            # unordered pairs of distinct samples: n (n - 1) / 2
  replicates: int
  pairwise: bool
  bytes_per_device: int
  seconds: float        # rough estimate (NOMINAL_PAIRS_PER_S)


def make_plan(samples: int, dim: int, classes: int, bins: int = NUM_BINS, tile: int = 0, replicates: int = 1,
              pairwise: bool = False, devices: int | None = None) -> Plan:
  tile = int(min(tile or default_tile(), bucket(samples, 8)))
  padded = -(-bucket(samples, tile) // tile) * tile  # a power of two (few compilations), a multiple of the tile
  tiles = -(-samples // tile)  # blocks of padding rows only are never scheduled
  d = devices or jax.device_count()
  c = bucket(classes, 2)
  hist = replicates * (2 * c * bins + (c * c * bins if pairwise else 0)) * 4
  per_tile = (6 + 3 * replicates) * tile * tile * 4 + 2 * tile * dim * 4
  nbytes = padded * dim * 4 + replicates * padded * 4 + per_tile + 3 * hist
  pairs = samples * (samples - 1) // 2
  rate = NOMINAL_PAIRS_PER_S.get(jax.default_backend(), 2e9) * d / max(1.0, replicates ** 0.5)
  return Plan(samples, padded, dim, classes, tile, tiles * (tiles + 1) // 2, d, pairs, replicates, pairwise,
              int(nbytes), pairs / rate)


def describe(plan: Plan) -> str:
  return (f'{plan.samples:,} samples -> {plan.pairs:,} pairs in {plan.blocks:,} blocks of {plan.tile}x{plan.tile} '
          f'on {plan.devices} device(s): about {plan.bytes_per_device / 2**30:.2f} GiB per device and '
          f'~{plan.seconds:,.0f} s')


def check_plan(plan: Plan, max_seconds: float, field: str = 'config.pairs.mode') -> None:
  """UserError (nothing run) when the exact pass would not fit in memory or would exceed max_seconds."""
  limit = memory.limit_bytes()
  if plan.bytes_per_device > 0.8 * limit:
    raise UserError(f'{field}: the exact pass needs {describe(plan)}, more than 80% of the '
                    f'{limit / 2**30:.1f} GiB available; use pairs.mode=random or fewer samples')
  if plan.seconds > max_seconds:
    raise UserError(f'{field}: the exact pass needs {describe(plan)} (estimate at '
                    f'{NOMINAL_PAIRS_PER_S.get(jax.default_backend(), 2e9):.0e} pairs/s/device), over '
                    f'pairs.max_seconds={max_seconds:g}; use pairs.mode=random, more devices, or raise '
                    'pairs.max_seconds')


def _block_counts(x, labels, weights, i, j, ok, *, classes, bins, tile, pairwise):
  """Counts of one block (rows of tile i, columns of tile j): (R, 2 * C * bins) and (R, C * C * bins)."""
  xr = jax.lax.dynamic_slice_in_dim(x, i * tile, tile).astype(jnp.float32)
  xc = jax.lax.dynamic_slice_in_dim(x, j * tile, tile).astype(jnp.float32)
  b = bin_index(jnp.matmul(xr, xc.T, precision=jax.lax.Precision.HIGHEST), bins)
  lr = jax.lax.dynamic_slice_in_dim(labels, i * tile, tile)
  lc = jax.lax.dynamic_slice_in_dim(labels, j * tile, tile)
  wr = jax.lax.dynamic_slice_in_dim(weights, i * tile, tile, axis=1)
  wc = jax.lax.dynamic_slice_in_dim(weights, j * tile, tile, axis=1)
  gi, gj = i * tile + jnp.arange(tile), j * tile + jnp.arange(tile)
  valid = ok & (lr[:, None] >= 0) & (lc[None, :] >= 0) & (gi[:, None] < gj[None, :])
  same = lr[:, None] == lc[None, :]
  w = wr[:, :, None] * wc[:, None, :] * valid.astype(jnp.int32)  # (R, T, T)
  w_inter = jnp.where(same, 0, w)
  r0, c0 = jnp.maximum(lr, 0)[:, None], jnp.maximum(lc, 0)[None, :]
  cb = classes * bins
  seg = jnp.concatenate([(jnp.where(same, 0, cb) + r0 * bins + b).ravel(), (cb + c0 * bins + b).ravel()])
  r = w.shape[0]
  # one scatter whose updates are rows of R replicate weights (faster than R scatters of scalars)
  upd = jnp.concatenate([w.reshape(r, -1), w_inter.reshape(r, -1)], axis=1).T
  hist = jnp.zeros((2 * cb, r), jnp.int32).at[seg].add(upd, mode='promise_in_bounds').T
  if not pairwise:
    return hist, jnp.zeros((r, 0), jnp.int32)
  seg_p = ((r0 * classes + c0) * bins + b).ravel()
  pair = jnp.zeros((classes * cb, r), jnp.int32).at[seg_p].add(w_inter.reshape(r, -1).T, mode='promise_in_bounds')
  return hist, pair.T


@functools.lru_cache(maxsize=64)
def _program(mesh: Mesh, classes: int, bins: int, tile: int, pairwise: bool):
  """jit(shard_map(scan over this device's blocks, then psum)) for one static configuration."""
  step = functools.partial(_block_counts, classes=classes, bins=bins, tile=tile, pairwise=pairwise)

  def local(x, labels, weights, ij, ok):
    r = weights.shape[0]

    def body(carry, blk):
      (i, j), o = blk
      h, p = step(x, labels, weights, i, j, o)
      return (carry[0] + h, carry[1] + p), None

    init = (jnp.zeros((r, 2 * classes * bins), jnp.int32),
            jnp.zeros((r, classes * classes * bins if pairwise else 0), jnp.int32))
    (h, p), _ = jax.lax.scan(body, init, ((ij[:, 0], ij[:, 1]), ok))
    return jax.lax.psum(h, AXIS), jax.lax.psum(p, AXIS)

  return cpu_kernels.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(), P(), P(), P(AXIS), P(AXIS)),
                               out_specs=(P(), P()), check_vma=False))


def exact_histograms(x, labels: np.ndarray, num_classes: int, *, bins: int = NUM_BINS, tile: int = 0,
                     weights: np.ndarray | None = None, pairwise: bool = False,
                     devices: Sequence[jax.Device] | None = None, progress=None):
  """Exact (intra (R, C, bins), inter (R, C, bins), pair (R, C, C, bins) or None) int64 counts of every pair.

  x: (N, D) L2-normalised features (a jax array, or a NumPy / memory-mapped array: put on the devices by
  blocks); labels (N,) in [0, num_classes) or -1 (left out);
  weights: (R, N) non-negative integer multiplicities (default: one replicate of ones); devices: the devices to
  split the blocks over (default: all). progress: an optional callable(done_blocks, total_blocks).
  """
  labels = np.asarray(labels)
  rows = np.flatnonzero(labels >= 0)
  weights = np.ones((1, len(labels)), np.int32) if weights is None else np.asarray(weights)
  devices = list(devices or jax.devices())
  d = len(devices)
  plan = make_plan(len(rows), x.shape[1], num_classes, bins, tile, weights.shape[0], pairwise, d)
  t, n_pad, c = plan.tile, plan.padded, bucket(num_classes, 2)
  idx = np.zeros(n_pad, np.int32)
  idx[:len(rows)] = rows
  lab = np.full(n_pad, -1, np.int32)
  lab[:len(rows)] = labels[rows]
  w = np.zeros((weights.shape[0], n_pad), np.int32)
  w[:, :len(rows)] = weights[:, rows]
  mesh = Mesh(np.asarray(devices), (AXIS,))
  rep = NamedSharding(mesh, P())
  if isinstance(x, jax.Array):
    xk = jax.device_put(jnp.take(x, jnp.asarray(idx), axis=0), rep)
  else:  # host / memory-mapped features: put block by block, no second full copy on the host
    xk = device_rows.put_rows(x, n_pad, rep, jax.dtypes.canonicalize_dtype(x.dtype), rows=rows)
  lab_d, w_d = jax.device_put(lab, rep), jax.device_put(w, rep)

  ii, jj = np.triu_indices(-(-len(rows) // t))  # blocks of padding rows only are never scheduled
  blocks = np.stack([ii, jj], 1).astype(np.int32)
  wmax = max(int(w.max()), 1)
  per_call = max(1, INT32_MAX // (d * t * t * wmax * wmax))  # blocks per device per call: no int32 overflow
  k = 1 << int(np.floor(np.log2(min(per_call, max(1, -(-len(blocks) // d))))))
  calls = -(-len(blocks) // (d * k))
  pad = calls * d * k - len(blocks)
  ok = np.concatenate([np.ones(len(blocks), bool), np.zeros(pad, bool)])
  blocks = np.concatenate([blocks, np.zeros((pad, 2), np.int32)])
  fn = _program(mesh, c, bins, t, pairwise)
  split = NamedSharding(mesh, P(AXIS))
  hist = np.zeros((w.shape[0], 2 * c * bins), np.int64)
  pair = np.zeros((w.shape[0], c * c * bins if pairwise else 0), np.int64)
  for call in range(calls):
    sl = slice(call * d * k, (call + 1) * d * k)
    # block q of the call goes to device q % d: neighbouring blocks (similar cost) are spread over devices
    ij = blocks[sl].reshape(k, d, 2).transpose(1, 0, 2).reshape(d * k, 2)
    o = ok[sl].reshape(k, d).T.reshape(d * k)
    h, p = fn(xk, lab_d, w_d, jax.device_put(ij, split), jax.device_put(o, split))
    hist += np.asarray(h, np.int64)
    pair += np.asarray(p, np.int64)
    if progress:
      progress(min((call + 1) * d * k, len(ii)), len(ii))
  hist = hist.reshape(-1, 2, c, bins)[:, :, :num_classes]
  if pairwise:
    pair = pair.reshape(-1, c, c, bins)
    pair = (pair + pair.transpose(0, 2, 1, 3))[:, :num_classes, :num_classes]
  return hist[:, 0], hist[:, 1], (pair if pairwise else None)
