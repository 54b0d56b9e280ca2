"""The index on the host side: placing the normalised vectors on the local devices, and asking it questions
in fixed-size query chunks (one compilation); the math is in search/topk.py."""
from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from visim_jax.core import device_rows, ops
from visim_jax.core import sharding as sharding_lib
from visim_jax.core.errors import UserError
from visim_jax.search import topk


@dataclasses.dataclass
class Index:
  """L2-normalised vectors split across the local devices (rows padded to S x n_local, masked by `valid`)."""
  vectors: jax.Array   # (S * n_local, D), NamedSharding P('db')
  valid: jax.Array     # (S * n_local,) bool
  n: int
  block: int
  mesh: jax.sharding.Mesh

  @property
  def dim(self) -> int:
    return int(self.vectors.shape[1])

  @property
  def n_local(self) -> int:
    return int(self.vectors.shape[0]) // self.mesh.devices.size

  def scan(self, queries: int) -> int:
    """Rows per scan step for a chunk of `queries` queries (topk.scan_block)."""
    return topk.scan_block(self.n_local, self.block, queries)


def equal_blocks(rows: int, block: int) -> tuple[int, int]:
  """(block, n_blocks): `rows` cut into the fewest blocks of at most `block` rows, all of one size rounded up to a
  multiple of 8 (so a shard is padded by a few rows, not by up to a whole block: 20,000 rows in blocks of 8,192 were
  24,576 rows scanned, now 3 x 6,672)."""
  nb = -(-rows // block)
  size = -(-rows // nb)
  if size > 8:
    size = min(-(-size // 8) * 8, max(block, 8))
    nb = -(-rows // size)
  return size, nb


def build_index(vectors, block: int = 4096, devices=None, dtype: str = 'float32') -> Index:
  """Index of (N, D) vectors (normalised here), each device's shard cut into equal blocks of at most `block` rows
  (equal_blocks: little padding); a search scans several blocks per step where its scores fit (topk.scan_block).
  vectors may be a memory-mapped array: they are checked and put on the devices a block of rows at a time
  (device_rows.put_rows), so the host never holds a second full copy."""
  if not hasattr(vectors, 'shape'):
    vectors = np.asarray(vectors, np.float32)
  if vectors.ndim != 2 or len(vectors) == 0:
    raise UserError(f'build_index: expected a non-empty (N, D) array, got shape {vectors.shape}')
  if not device_rows.all_finite(vectors):
    raise UserError('build_index: NaN/Inf in the vectors')
  if block < 1:
    raise UserError(f'--block: must be >= 1, got {block}')
  mesh = sharding_lib.make_mesh(topk.AXIS, devices if devices is not None else jax.local_devices())
  s = mesh.devices.size
  n = len(vectors)
  per = -(-n // s)
  block, nb = equal_blocks(per, block)
  n_local = nb * block
  total = s * n_local
  valid = np.zeros((total,), bool)
  valid[:n] = True
  split = NamedSharding(mesh, P(topk.AXIS))
  x = device_rows.put_rows(vectors, total, split, jnp.dtype(dtype),
                           transform=lambda b: ops.l2_normalize(b.astype(jnp.float32)))
  return Index(x, jax.device_put(valid, split), n, block, mesh)


def _query_chunks(queries: np.ndarray, extra: Sequence[np.ndarray], query_block: int):
  """Yields (start, count, padded queries, padded extras) in fixed-size chunks (one compilation)."""
  nq = len(queries)
  qb = max(1, min(query_block, nq))
  for start in range(0, nq, qb):
    q = queries[start:start + qb]
    c = len(q)
    pad = qb - c
    q = np.concatenate([q, np.zeros((pad, q.shape[1]), np.float32)]) if pad else q
    ex = [np.concatenate([e[start:start + qb], np.full((pad,), -1, np.int32)]) if pad else e[start:start + qb]
          for e in extra]
    yield start, c, q, ex


def _check_queries(index: Index, queries) -> np.ndarray:
  queries = np.asarray(queries, np.float32)
  if queries.ndim != 2 or queries.shape[1] != index.dim:
    raise UserError(f'search: queries of shape {queries.shape}, the index holds {index.dim}-d vectors')
  return ops.l2_normalize(queries)


def search(index: Index, queries, k: int, exclude=None, query_block: int = 256) -> tuple[np.ndarray, np.ndarray]:
  """(scores (Q, k), indices (Q, k)) of the k most cosine-similar index rows for each query row."""
  qn = _check_queries(index, queries)
  limit = index.n - (1 if exclude is not None else 0)
  if not 1 <= k <= max(limit, 0):
    raise UserError(f'--k={k}: must be in [1, {limit}] (the index holds {index.n} images'
                    f'{", one excluded per query" if exclude is not None else ""})')
  exclude = np.full((len(qn),), -1, np.int32) if exclude is None else np.asarray(exclude, np.int32)
  rep = NamedSharding(index.mesh, P())
  out_s = np.empty((len(qn), k), np.float32)
  out_i = np.empty((len(qn), k), np.int32)
  for start, c, q, (ex,) in _query_chunks(qn, [exclude], query_block):
    s, i = topk.sharded_topk(jax.device_put(q, rep), index.vectors, index.valid, jax.device_put(ex, rep),
                             k=k, block=index.scan(len(q)), mesh=index.mesh)
    out_s[start:start + c], out_i[start:start + c] = np.asarray(s)[:c], np.asarray(i)[:c]
  return out_s, out_i


def partner_ranks(index: Index, queries, partner, exclude=None, query_block: int = 256) -> np.ndarray:
  """1-based rank of index row partner[q] for each query (pessimistic ties), over the whole index."""
  qn = _check_queries(index, queries)
  partner = np.asarray(partner, np.int32)
  if partner.shape != (len(qn),) or (partner < 0).any() or (partner >= index.n).any():
    raise ValueError(f'partner_ranks: partner must be (Q,) indices into the {index.n} index rows')
  exclude = np.full((len(qn),), -1, np.int32) if exclude is None else np.asarray(exclude, np.int32)
  rep = NamedSharding(index.mesh, P())
  out = np.empty((len(qn),), np.int64)
  for start, c, q, (p, ex) in _query_chunks(qn, [partner, exclude], query_block):
    p = np.where(p < 0, 0, p).astype(np.int32)
    r = topk.sharded_partner_ranks(jax.device_put(q, rep), index.vectors, index.valid, jax.device_put(p, rep),
                                   jax.device_put(ex, rep), block=index.scan(len(q)), mesh=index.mesh)
    out[start:start + c] = np.asarray(r)[:c]
  return out


def rank_metrics(ranks: np.ndarray, ks=(1, 5, 10)) -> dict:
  ranks = np.asarray(ranks, np.float64)
  out = {'mean_rank': float(ranks.mean()), 'median_rank': float(np.median(ranks)),
         'mrr': float((1.0 / ranks).mean())}
  out.update({f'recall@{k}': float((ranks <= k).mean()) for k in ks})
  return out
