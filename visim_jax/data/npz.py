"""Reading a user-supplied .npz of arrays (never pickled objects), with errors that name the field and file.

Every array must hold real numbers (bool / int / float), except the text arrays in TEXT (names, labels...):
a string or complex array elsewhere is a one-line error naming the file and the array. `check_features`
refuses feature matrices no similarity can be computed on (NaN/Inf, zero vectors, every row equal), naming
the file and the rows.
"""
from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from visim_jax.core import readers
from visim_jax.core.errors import UserError

TEXT = ('names', 'labels', 'class_names', 'imlist', 'qimlist')


def read_arrays(path: str, required: Sequence[str], optional: Sequence[str] = (),
                field: str = 'config.features') -> dict[str, np.ndarray]:
  """{name: array} of the `required` arrays (all must exist) and the `optional` ones present in `path`."""
  if os.path.islink(path) and not os.path.exists(path):
    raise FileNotFoundError(f'{field}: {path} is a broken symbolic link (to {os.readlink(path)}); fix it')
  if not os.path.isfile(path):
    raise FileNotFoundError(f'{field}: {path} not found')
  arrays = readers.load_npz(path, '.npz file', where=f'{field}: {path}', keys=(*required, *optional))
  missing = [k for k in required if k not in arrays]
  if missing:
    with np.load(path, allow_pickle=False) as z:   # a readable archive (load_npz): the names it has
      files = list(z.files)
    raise UserError(f'{field}: {path}: missing array(s) {missing} (has {files})')
  for k, a in arrays.items():
    if a.dtype.kind == 'c' or (k not in TEXT and a.dtype.kind not in 'biuf'):
      raise UserError(f'{field}: {path}: array {k!r} holds {a.dtype} values; it must hold real numbers '
                      '(save it as float32)')
  return arrays


SCALE_RANGE = (1e-15, 1e15)  # |x| beyond: float32 squares (1e30) and their sums over rows overflow / underflow


def check_features(x: np.ndarray, source: str, names: Sequence[str] | None = None, what: str = 'features') -> None:
  """Refuses a feature matrix (N, D) with non-finite rows, zero vectors, a scale float32 cannot square (largest
  |x| outside SCALE_RANGE) or all rows equal, naming the rows."""
  def rows(mask):
    idx = np.flatnonzero(mask)
    shown = [names[i] for i in idx[:5]] if names is not None else idx[:5].tolist()
    return f'{len(idx)} row(s), first {shown}'
  if x.ndim != 2:
    raise UserError(f'{source}: {what} must be 2-D (N, D), got shape {x.shape}')
  bad = ~np.isfinite(x).all(axis=1)
  if bad.any():
    raise UserError(f'{source}: {what} have NaN/Inf in {rows(bad)}; recompute them')
  zero = ~(x != 0).any(axis=1)
  if zero.any():
    raise UserError(f'{source}: {what} have zero vectors (no direction, cosine undefined) in {rows(zero)}; '
                    'recompute them or drop those rows')
  top = float(np.abs(x).max()) if x.size else 1.0
  if not SCALE_RANGE[0] <= top <= SCALE_RANGE[1]:
    raise UserError(f'{source}: the {what} reach at most |x| = {top:.3g}, outside [{SCALE_RANGE[0]:g}, '
                    f'{SCALE_RANGE[1]:g}]: their float32 squares and sums (norms, PCA, cosine) would '
                    f'{"overflow" if top > 1 else "underflow"}; rescale them (e.g. divide by their mean norm)')
  if len(x) > 1 and (x == x[:1]).all():
    raise UserError(f'{source}: every row of the {what} is the same vector (all {len(x)} rows): nothing can be '
                    'retrieved; check how they were computed')
