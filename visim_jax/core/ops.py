"""The small helpers every part of the package shares, one copy each (a leaf: imports nothing from visim_jax).

- `l2_normalize`: x / max(||x||, eps) on the last axis, eps = 1e-12 everywhere (JAX or NumPy input).
- `top_k`: lax.top_k's values and indices along rows, by a pruned exact search on a CPU (long rows).
- `running_topk`: the exact top-k of a score function scanned over database blocks (never the full matrix).
- `check_writable_dir`: a folder that exists (created now) and is writable, else a one-line UserError.
- `atomic_write_bytes` / `atomic_write_text` / `save_npz_atomic`: write to a temp file in the same folder, fsync,
  then `os.replace`; readers never see half a file, a failure leaves no temp file, and the result gets the
  permissions the user's umask gives a new file (mkstemp alone would make it 0600).
"""
from __future__ import annotations

import errno
import io
import os
import tempfile
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

EPS = 1e-12


def l2_normalize(x, eps: float = EPS, axis: int = -1):
  """Unit vectors along `axis`; zero vectors stay zero. NumPy in -> NumPy out, JAX in -> JAX out."""
  if isinstance(x, np.ndarray):
    return x / np.maximum(np.linalg.norm(x, axis=axis, keepdims=True), eps)
  return x / jnp.maximum(jnp.linalg.norm(x, axis=axis, keepdims=True), eps)


# top_k: rows at least this many groups long take the pruned path on a CPU (shorter ones: lax.top_k directly)
TOPK_GROUP = 32


def top_k(x: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
  """lax.top_k(x, k) of a 2-D x along its rows: the same values and the same indices (ties: the lower index), by a
  pruned exact search on a CPU, where XLA's TopK reads every element of a long row in a partial sort (64 x 20,000
  scores on the 2-core Xeon: 2.5-4.4 ms, 1.0 ms this way); lax.top_k itself elsewhere. Pure; call inside jit.
  Under vmap the lax.cond below runs both branches: call it unbatched.

  The row is cut into G strided groups (column g: elements g, g + G, g + 2G, ...); their maxima are one pass of
  element-wise maxima; the k groups of the largest maxima hold the row's top k (each of its k largest is at most
  its group's maximum, and k other groups' maxima would all be larger otherwise); the top k of those k groups'
  elements, laid out in index order, is the answer. Where more than k groups reach the k-th largest maximum (a tie,
  or fewer than k + 1 groups with a finite maximum) or a NaN is present, the choice of groups could differ
  from lax.top_k's order, so lax.top_k of the whole row answers instead (lax.cond: one branch runs)."""
  if x.ndim != 2 or jax.default_backend() != 'cpu':
    return tuple(jax.lax.top_k(x, k))
  rows, n = x.shape
  groups = n // TOPK_GROUP
  if groups < 4 * (k + 1):
    return tuple(jax.lax.top_k(x, k))
  per = -(-n // groups)
  xp = jnp.pad(x, ((0, 0), (0, groups * per - n)), constant_values=-jnp.inf) if groups * per > n else x
  x3 = xp.reshape(rows, per, groups)   # x3[r, j, g] = x[r, j * groups + g]
  gmax = x3.max(axis=1)                # reductions over a major axis only: XLA's row reductions are slow here
  top_max, top_g = jax.lax.top_k(gmax, k)   # (no slice of its outputs: XLA would turn it into a full sort)
  # groups reaching the k-th largest maximum, a NaN counting k + 1 (a dot: XLA's row reductions are slow here)
  reach = jnp.where(jnp.isnan(gmax), k + 1.0, (gmax >= top_max.min(axis=1, keepdims=True)).astype(jnp.float32))
  unsure = jnp.any(jnp.dot(reach, jnp.ones((groups,), jnp.float32)) > k)

  def pruned():
    g = jnp.sort(top_g, axis=1)   # groups in index order: (j, g) row-major is then increasing j * G + g
    cand = jnp.take_along_axis(x3, g[:, None, :], axis=2).reshape(rows, per * k)
    cand_i = (jnp.arange(per, dtype=g.dtype)[None, :, None] * groups + g[:, None, :]).reshape(rows, per * k)
    s, pos = jax.lax.top_k(cand, k)
    return s, jnp.take_along_axis(cand_i, pos, axis=1)

  return jax.lax.cond(unsure, lambda: tuple(jax.lax.top_k(x, k)), pruned)


def running_topk(score_fn: Callable[[jax.Array, jax.Array], jax.Array], blocks, k: int, rows: int,
                 n_valid: int | None = None, block_size: int | None = None):
  """Exact top-k over database blocks with a running candidate list (pure; call inside jit).

  score_fn(block, b) -> (rows, block_size) float scores of the `rows` queries against block `b` (its index);
  blocks: an array (or pytree of arrays) with a leading block axis, scanned in order; the database index of
  column j of block b is b * block_size + j. Columns at index >= n_valid (padding) never enter. Ties keep the
  lower database index. Returns (scores (rows, k) descending, indices (rows, k) int32; -inf / -1 where fewer
  than k columns qualify).
  """
  leaves = jax.tree.leaves(blocks)
  nb = leaves[0].shape[0]

  def step(carry, xs):
    best_s, best_i = carry
    block, b = xs
    s = score_fn(block, b).astype(jnp.float32)
    idx = b * s.shape[1] + jnp.arange(s.shape[1], dtype=jnp.int32)
    if n_valid is not None:
      s = jnp.where(idx[None, :] < n_valid, s, -jnp.inf)
    if s.shape[1] >= k:   # the block's own top k first (top_k: pruned on a CPU), then merged with the running k
      s, pos = top_k(s, k)
      idx = jnp.take(idx, pos)
    cand_s = jnp.concatenate([best_s, s], axis=1)  # running candidates first: they have the lower indices
    cand_i = jnp.concatenate([best_i, jnp.broadcast_to(idx, s.shape)], axis=1)
    top_s, pos = jax.lax.top_k(cand_s, k)
    return (top_s, jnp.take_along_axis(cand_i, pos, axis=1)), None

  init = (jnp.full((rows, k), -jnp.inf, jnp.float32), jnp.full((rows, k), -1, jnp.int32))
  (top_s, top_i), _ = jax.lax.scan(step, init, (blocks, jnp.arange(nb, dtype=jnp.int32)))
  return top_s, jnp.where(jnp.isfinite(top_s), top_i, -1)


def _umask() -> int:
  mask = os.umask(0)
  os.umask(mask)
  return mask


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
  """Writes `data` to `path` atomically (temp file + fsync + os.replace), with umask permissions."""
  path = os.fspath(path)
  if os.path.isdir(path):  # found before the temp file, so the error names `path`, not the temp file
    raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
  folder = os.path.dirname(os.path.abspath(path))
  os.makedirs(folder, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=folder, prefix='.tmp-', suffix=os.path.splitext(path)[1])
  try:
    with os.fdopen(fd, 'wb') as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    os.chmod(tmp, 0o666 & ~_umask())
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
  atomic_write_bytes(path, text.encode('utf-8'))


def save_npz_atomic(path: str | os.PathLike, **arrays) -> None:
  """np.savez of `arrays` written atomically (see atomic_write_bytes)."""
  buf = io.BytesIO()
  np.savez(buf, **arrays)
  atomic_write_bytes(path, buf.getvalue())


def check_writable_dir(path: str, what: str, label: str | None = None) -> None:
  """Creates folder `path` if needed; a one-line UserError when it cannot be a writable folder (a broken link, a
  file in the way, no permission). The message starts with `label` (e.g. 'config.cache_dir') or the path."""
  from visim_jax.core.errors import UserError  # pylint: disable=g-import-not-at-top
  head = f'{label}: {path}' if label else path
  if os.path.islink(path) and not os.path.exists(path):
    raise UserError(f'{head}: {what} is a broken symbolic link (to {os.readlink(path)}); remove it or choose '
                    'another folder')
  if os.path.exists(path) and not os.path.isdir(path):
    raise UserError(f'{head}: {what} is a file, not a folder; choose another path')
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as e:
    where = f'{label}: {e.filename or path}' if label else (e.filename or path)
    raise UserError(f'{where}: cannot create the {what} ({e.strerror}); choose a folder you can write to') from e
  if not os.access(path, os.W_OK | os.X_OK):
    raise UserError(f'{head}: the {what} is not writable; fix its permissions or choose another folder')
