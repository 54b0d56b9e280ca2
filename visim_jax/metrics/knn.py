"""Leave-one-out kNN accuracy (k = 10), the accuracy paper 003 validates its metrics against (Sec. 3.4, Table 4).

Cosine on the same prepared features as the histograms (standardised, L2-normalised rows). For each query, its k
most similar OTHER samples with a label >= 0 (exact: ops.running_topk over database blocks, never the full
matrix) vote; ties between classes go to the class with the larger summed similarity (then the lower label).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from visim_jax.core import cpu_kernels
from visim_jax.core import ops
from visim_jax.metrics.pair_sampling import bucket


@functools.partial(cpu_kernels.jit, static_argnames=('k', 'num_classes', 'db_chunk'))
def knn_predict(x, labels, queries, *, k: int = 10, num_classes: int, db_chunk: int = 8192):
  """Leave-one-out kNN class of each query row (indices into x) among the rows with label >= 0: (Q,) int32.

  x: (N, D) L2-normalised, N a multiple of db_chunk (pad with label -1)."""
  n, d = x.shape
  xq = jnp.take(x, queries, axis=0).astype(jnp.float32)
  blocks = (x.reshape(n // db_chunk, db_chunk, d), labels.reshape(n // db_chunk, db_chunk))

  def score(block, b):
    xd, ld = block
    s = jnp.matmul(xq, xd.astype(jnp.float32).T, precision=jax.lax.Precision.HIGHEST)
    rows = b * db_chunk + jnp.arange(db_chunk)
    return jnp.where((ld[None, :] >= 0) & (rows[None, :] != queries[:, None]), s, -jnp.inf)

  vals, idx = ops.running_topk(score, blocks, k, queries.shape[0])
  found = idx >= 0
  onehot = jax.nn.one_hot(jnp.where(found, jnp.take(labels, jnp.maximum(idx, 0)), -1), num_classes)
  votes = onehot.sum(1)
  simsum = (onehot * jnp.where(found, vals, 0.0)[..., None]).sum(1)  # in [-k, k]
  return jnp.argmax(votes + (simsum + k) / (2 * k + 1), -1).astype(jnp.int32)  # tie-break term in [0, 1)


def knn_accuracy(x: jax.Array, labels: np.ndarray, num_classes: int, k: int = 10, queries: int = 0,
                 seed: int = 0, db_chunk: int = 8192, query_chunk: int = 1024):
  """Leave-one-out kNN accuracy over `queries` random samples (0: all) with label >= 0.

  Returns (accuracy, per-class accuracy (C,) with NaN for classes without a query)."""
  labels = np.asarray(labels, np.int32)
  n = x.shape[0]
  if len(labels) < n:  # rows padded by sharding
    labels = np.concatenate([labels, np.full(n - len(labels), -1, np.int32)])
  eligible = np.flatnonzero(labels >= 0)
  if queries and queries < len(eligible):
    eligible = np.sort(np.random.default_rng(seed).choice(eligible, queries, replace=False))
  db_chunk = int(min(db_chunk, bucket(n)))
  n_pad = -(-n // db_chunk) * db_chunk
  if n_pad != n:
    x = jnp.concatenate([x, jnp.zeros((n_pad - n, x.shape[1]), x.dtype)])
  lab = jnp.asarray(np.concatenate([labels, np.full(n_pad - n, -1, np.int32)]))
  preds = []
  q_chunk = int(min(query_chunk, bucket(len(eligible))))
  for s in range(0, len(eligible), q_chunk):
    qi = eligible[s:s + q_chunk]
    pad = np.concatenate([qi, np.full(q_chunk - len(qi), qi[0])]).astype(np.int32)
    preds.append(np.asarray(knn_predict(x, lab, jnp.asarray(pad), k=k, num_classes=num_classes,
                                        db_chunk=db_chunk))[:len(qi)])
  pred = np.concatenate(preds) if preds else np.zeros(0, np.int32)
  truth = labels[eligible]
  correct = pred == truth
  per_class = np.full(num_classes, np.nan)
  tot = np.bincount(truth, minlength=num_classes)
  hit = np.bincount(truth, weights=correct, minlength=num_classes)
  per_class[tot > 0] = hit[tot > 0] / tot[tot > 0]
  return float(correct.mean()) if len(correct) else float('nan'), per_class
