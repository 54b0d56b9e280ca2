"""TLL-style look-alike pairs: root/left/NAME and root/right/NAME are a pair (paired by name, never by order).

A subset list restricts the pairs (TLL_obj: a CSV with header `,TLL_obj`, an index column and a name, the
4,199 names listed twice in the authors' file; duplicates are dropped keeping the first order).
Precomputed features (`.npz` with `left`, `right` and optional `names`) skip images altogether.
"""
from __future__ import annotations

import dataclasses
import os

import numpy as np

from visim_jax.core import readers
from visim_jax.data import npz, resolve
from visim_jax.data.images import IMAGE_EXTENSIONS
from visim_jax.core.errors import UserError


@dataclasses.dataclass
class Pairs:
  names: list[str]
  left: list[str]   # image paths
  right: list[str]

  def __len__(self):
    return len(self.names)


def read_subset(path: str) -> list[str]:
  """Names from a subset file: a CSV whose last column holds names (header optional) or one name a line.

  Duplicates are removed, first occurrence order kept (the authors' TLL_obj.csv lists every name twice).
  """
  if not os.path.isfile(path):
    raise FileNotFoundError(f'config.subset: subset list {path} not found')
  rows = [r for _, r in readers.csv_rows(path, 'subset list') if r and any(c.strip() for c in r)]
  if not rows:
    raise UserError(f'{path}: empty subset list')
  names = [r[-1].strip() for r in rows]
  first = names[0]
  if not os.path.splitext(first)[1].lower() in IMAGE_EXTENSIONS:  # a header such as ',TLL_obj'
    names = names[1:]
  seen, out = set(), []
  for n in names:
    if n not in seen:
      seen.add(n)
      out.append(n)
  if not out:
    raise UserError(f'{path}: no names in subset list')
  return out


def _listing(folder: str) -> dict[str, str]:
  if not os.path.isdir(folder):
    raise FileNotFoundError(f'config.data_dir: folder {folder} not found (expected left/ and right/ inside)')
  out = {n: os.path.join(folder, n) for n in sorted(os.listdir(folder))
         if not n.startswith('.') and n.lower().endswith(IMAGE_EXTENSIONS)}
  resolve.check_tree(folder, out.values(), 'image')
  return out


def load_pairs(root: str, subset: str | None = None) -> Pairs:
  """Pairs under `root` (left/ and right/), optionally restricted to the names of a subset list.

  Raises naming the file: a left image without its right partner (or the reverse), a subset name missing
  on disk, an empty folder.
  """
  left = _listing(os.path.join(root, 'left'))
  right = _listing(os.path.join(root, 'right'))
  if not left:
    raise UserError(f'{os.path.join(root, "left")}: no images')
  stems_l = {}
  for n in left:  # duplicate names that differ only by extension are ambiguous
    stem = os.path.splitext(n)[0]
    if stem in stems_l:
      raise UserError(f'{root}/left: duplicate pair name {stem!r} ({stems_l[stem]} and {n})')
    stems_l[stem] = n
  if subset is not None:
    names = read_subset(subset)
    missing = [n for n in names if n not in left or n not in right]
    if missing:
      side = 'left' if missing[0] not in left else 'right'
      raise FileNotFoundError(
          f'{subset}: {len(missing)} subset name(s) have no image under {root}/{side}, e.g. {missing[0]!r}')
  else:
    only_l = sorted(set(left) - set(right))
    only_r = sorted(set(right) - set(left))
    if only_l:
      raise UserError(f'{left[only_l[0]]}: left image without its right partner ({len(only_l)} such)')
    if only_r:
      raise UserError(f'{right[only_r[0]]}: right image without its left partner ({len(only_r)} such)')
    names = sorted(left)
  return Pairs(names=names, left=[left[n] for n in names], right=[right[n] for n in names])


def load_feature_pairs(path: str) -> tuple[np.ndarray, np.ndarray, list[str]]:
  """(left, right, names) from a precomputed .npz; errors name the file and the field."""
  z = npz.read_arrays(path, ('left', 'right'), ('names',))
  left, right = z['left'].astype(np.float32), z['right'].astype(np.float32)
  names = [str(n) for n in z['names']] if 'names' in z else [f'{i:05d}' for i in range(len(left))]
  check_feature_pairs(left, right, names, source=path)
  return left, right, names


def check_feature_pairs(left, right, names, source='features') -> None:
  """Shapes agree, names are unique, no side is degenerate (NaN/Inf, zero vectors, all rows equal)."""
  if left.ndim != 2 or right.ndim != 2:
    raise UserError(f'{source}: left and right must be 2-D (N, D); got {left.shape} and {right.shape}')
  if left.shape != right.shape:
    raise UserError(f'{source}: left {left.shape} and right {right.shape} shapes differ')
  if len(names) != len(left):
    raise UserError(f'{source}: {len(names)} names for {len(left)} pairs')
  if len(set(names)) != len(names):
    dup = next(n for n in names if names.count(n) > 1)
    raise UserError(f'{source}: duplicate pair name {dup!r}')
  for side, a in (('left', left), ('right', right)):
    npz.check_features(a, source, names, what=f'{side} features')
