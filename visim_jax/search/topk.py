"""The pure math of look-alike search: exact top-k and partner ranks over a database sharded along its rows.

Each device holds a shard of the L2-normalised (N, D) database (NamedSharding P('db'), padded rows masked by
`valid`) and scans it in steps of `block` rows with `visim_jax.core.ops.running_topk` (each step's own top k by
`ops.top_k`, pruned on a CPU, then lax.top_k of [running k | step's k]; memory O(Q (k + block)) whatever N); the
S x k shard candidates are merged by one more top_k. The
index stores its shard in equal blocks (search/index.py); `scan_block` groups consecutive blocks into one step as
far as SCORE_TILE allows (the whole shard in one matmul and one top_k for small indexes).
Ties go to the lower index (lax.top_k is stable and candidates stay in index order): exactly a stable argsort
of -score. Partner ranks are pessimistic on ties, as in visim_jax/metrics/retrieval.py:
rank = 1 + #{j != partner, j != exclude : s_j >= s_partner}, the partner's score taken from the same blocked
matmul as every other score (so ties are decided on identical float values).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from visim_jax.core import cpu_kernels
from visim_jax.core import ops

AXIS = 'db'
# query x database scores held at once by one scan step, by backend. On a CPU a few MB of scores per step is the
# fastest (2-core box, process CPU time: 64 queries x 20,000 rows in one step took 0.88x the time of 5 steps of 4,000;
# 256 queries x 200,000 rows took 0.80x per row in 4,096-row steps what they took in 16,384-row ones); an accelerator
# wants few, large steps (each step is a few kernel launches).
SCORE_TILE = {'cpu': 1 << 21}
SCORE_TILE_ACCELERATOR = 1 << 26


def scan_block(n_local: int, block: int, queries: int, tile: int | None = None) -> int:
  """Rows per scan step for `queries` queries over a shard of n_local rows stored in blocks of `block`: the block
  times the largest g dividing n_local // block with queries x g x block <= tile (at least one block). Grouping
  consecutive blocks changes neither the scores nor the order of candidates, so the results are identical."""
  if tile is None:
    tile = SCORE_TILE.get(jax.default_backend(), SCORE_TILE_ACCELERATOR)
  nb = n_local // block
  best = 1
  for g in range(1, nb + 1):
    if nb % g == 0 and queries * g * block <= tile:
      best = g
  return best * block


def scores(q: jax.Array, d: jax.Array) -> jax.Array:
  """Cosine scores (Q, n) of unit queries against unit database rows, accumulated in float32."""
  precision = jax.lax.Precision.HIGHEST if d.dtype == jnp.float32 else None
  return jnp.einsum('qd,nd->qn', q.astype(d.dtype), d, precision=precision, preferred_element_type=jnp.float32)


def _blocks(d, valid, block):
  nb = d.shape[0] // block
  return d.reshape(nb, block, d.shape[1]), valid.reshape(nb, block)


def local_topk(q, d, valid, exclude, k: int, block: int, offset=0):
  """Top-k of queries (Q, D) in one shard d (n, D) (n a multiple of block) whose row 0 has global index
  `offset`; exclude (Q,) is a global index each query must not return (-1: none). Global indices, -1 if none."""

  def score_fn(blk, b):
    rows, ok = blk
    idx = offset + b * block + jnp.arange(block, dtype=jnp.int32)
    return jnp.where(ok[None, :] & (idx[None, :] != exclude[:, None]), scores(q, rows), -jnp.inf)

  s, i = ops.running_topk(score_fn, _blocks(d, valid, block), k, q.shape[0])
  return s, jnp.where(i >= 0, i + offset, -1)


def _scan_sum(q, d, valid, block, offset, fn, dtype):
  """sum over blocks of fn(scores (Q, block), global idx (block,), valid (block,)) -> (Q,)."""

  def step(acc, xs):
    (rows, ok), b = xs
    idx = offset + b * block + jnp.arange(block, dtype=jnp.int32)
    return acc + fn(scores(q, rows), idx, ok), None

  blocks = _blocks(d, valid, block)
  acc, _ = jax.lax.scan(step, jnp.zeros(q.shape[:1], dtype), (blocks, jnp.arange(blocks[1].shape[0])))
  return acc


def local_partner_score(q, d, valid, partner, block: int, offset=0):
  """s(query, database[partner]) from the ranking's blocked matmul (0 when the partner is in another shard)."""
  fn = lambda s, idx, ok: jnp.sum(jnp.where(idx[None, :] == partner[:, None], s, 0.0), axis=1)
  return _scan_sum(q, d, valid, block, offset, fn, jnp.float32)


def local_count_at_least(q, d, valid, threshold, skip, exclude, block: int, offset=0):
  """#{valid j, j != skip, j != exclude : s(query, j) >= threshold} per query (Q,) in one shard."""

  def fn(s, idx, ok):
    keep = ok[None, :] & (idx[None, :] != skip[:, None]) & (idx[None, :] != exclude[:, None])
    return jnp.sum(keep & (s >= threshold[:, None]), axis=1, dtype=jnp.int32)

  return _scan_sum(q, d, valid, block, offset, fn, jnp.int32)


def _offset(n_local):
  return jax.lax.axis_index(AXIS) * n_local


@functools.partial(cpu_kernels.jit, static_argnames=('k', 'block', 'mesh'))
def sharded_topk(queries, shards, valid, exclude, *, k: int, block: int, mesh):
  """Top-k over a database split along its rows across `mesh` (shards (S * n_local, D), valid (S * n_local,))."""
  n_local = shards.shape[0] // mesh.devices.size

  def local(q, d, v, ex):
    s, i = local_topk(q, d, v, ex, k, block, _offset(n_local))
    return s[None], i[None]

  s, i = jax.shard_map(local, mesh=mesh, in_specs=(P(), P(AXIS), P(AXIS), P()), out_specs=(P(AXIS), P(AXIS)),
                       check_vma=False)(queries, shards, valid, exclude)
  nq = queries.shape[0]
  s = jnp.transpose(s, (1, 0, 2)).reshape(nq, -1)  # shard order = index order: ties still go to lower indices
  i = jnp.transpose(i, (1, 0, 2)).reshape(nq, -1)
  top_s, pos = jax.lax.top_k(s, k)
  return top_s, jnp.take_along_axis(i, pos, axis=1)


@functools.partial(cpu_kernels.jit, static_argnames=('block', 'mesh'))
def sharded_partner_ranks(queries, shards, valid, partner, exclude, *, block: int, mesh):
  """1 + #{j != partner : s_j >= s_partner} (pessimistic ties) over the whole sharded database."""
  n_local = shards.shape[0] // mesh.devices.size
  spec = dict(mesh=mesh, out_specs=P(AXIS), check_vma=False)

  def score(q, d, v, p):
    return local_partner_score(q, d, v, p, block, _offset(n_local))[None]

  sp = jax.shard_map(score, in_specs=(P(), P(AXIS), P(AXIS), P()), **spec)(queries, shards, valid, partner).sum(0)

  def count(q, d, v, p, ex, t):
    return local_count_at_least(q, d, v, t, p, ex, block, _offset(n_local))[None]

  counts = jax.shard_map(count, in_specs=(P(), P(AXIS), P(AXIS), P(), P(), P()), **spec)(
      queries, shards, valid, partner, exclude, sp)
  return 1 + counts.sum(0)
