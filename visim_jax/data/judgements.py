"""Records of human similarity judgements, shared by the NIGHTS, BAPPS and THINGS loaders, and their file checks.

- `TwoAFCSet`: T triplets (ref, p0, p1) and `judge` = the fraction of humans who chose p1 as closer to ref
  (BAPPS: the `judge/*.npy` value as LPIPS reads it; NIGHTS: the `right_vote` column as DreamSim reads it, p0 =
  `left_path`, p1 = `right_path`). Scored with LPIPS's / DreamSim's 2AFC rule (metrics/human.py).
- `JNDSet`: N pairs (p0, p1) and `same` = the fraction of humans who judged the two patches identical (BAPPS JND).
- `OddOneOutSet`: T triplets of rows of `images` and `odd` = the column (0, 1, 2) of the image humans chose as
  the odd one out (THINGS).

Paths are absolute-or-as-given file paths; `paths()` lists every image once (first-appearance order) and
`rows(index)` maps the triplets onto the rows of a feature table, so each image is embedded once.

Every loader checks its files before any image is decoded (`check_files`: each file exists, is a file and is
readable, else one `UserError` line naming the first bad file and how many others are bad). A full decode of
every image is `verify_images` (optional: the extraction names an undecodable file anyway).
"""
from __future__ import annotations

import dataclasses
import os
from typing import Mapping, Sequence

import numpy as np

from visim_jax.core.errors import UserError


def _unique(*lists: Sequence[str]) -> list[str]:
  return list(dict.fromkeys(p for lst in lists for p in lst))


def _rows(paths: Sequence[str], index: Mapping[str, int], what: str) -> np.ndarray:
  idx = np.fromiter((index.get(p, -1) for p in paths), np.int64, len(paths))
  if (idx < 0).any():
    raise UserError(f'{paths[int(np.argmax(idx < 0))]}: image has no row in the {what}')
  return idx.astype(np.int32)


@dataclasses.dataclass(frozen=True)
class TwoAFCSet:
  """2AFC triplets; judge[i] = fraction of humans who chose p1[i] (not p0[i]) as closer to ref[i]."""
  name: str
  ref: list[str]
  p0: list[str]
  p1: list[str]
  judge: np.ndarray        # (T,) float32 in [0, 1]
  ids: list[str] = dataclasses.field(default_factory=list)   # the source's item ids (file stem / csv id)

  def __len__(self) -> int:
    return len(self.ref)

  def paths(self) -> list[str]:
    return _unique(self.ref, self.p0, self.p1)

  def rows(self, index: Mapping[str, int], what: str = 'features') -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ref, p0, p1) as int32 rows of a table whose row of image path p is index[p]."""
    return tuple(_rows(col, index, what) for col in (self.ref, self.p0, self.p1))

  def subset(self, idx, name: str | None = None) -> 'TwoAFCSet':
    idx = np.asarray(idx, np.int64)
    pick = lambda lst: [lst[i] for i in idx.tolist()]
    return TwoAFCSet(name or self.name, pick(self.ref), pick(self.p0), pick(self.p1), self.judge[idx],
                     pick(self.ids) if self.ids else [])


@dataclasses.dataclass(frozen=True)
class JNDSet:
  """Same/different pairs; same[i] = fraction of humans who judged p0[i] and p1[i] identical."""
  name: str
  p0: list[str]
  p1: list[str]
  same: np.ndarray         # (N,) float32 in [0, 1]
  ids: list[str] = dataclasses.field(default_factory=list)

  def __len__(self) -> int:
    return len(self.p0)

  def paths(self) -> list[str]:
    return _unique(self.p0, self.p1)

  def rows(self, index: Mapping[str, int], what: str = 'features') -> tuple[np.ndarray, np.ndarray]:
    return tuple(_rows(col, index, what) for col in (self.p0, self.p1))


@dataclasses.dataclass(frozen=True)
class OddOneOutSet:
  """Odd-one-out triplets over `images`; odd[t] = column (0, 1 or 2) of triplets[t] humans chose as odd."""
  name: str
  images: list[str]
  triplets: np.ndarray     # (T, 3) int32 rows of `images`
  odd: np.ndarray          # (T,) int32 in {0, 1, 2}
  source: str = ''

  def __len__(self) -> int:
    return len(self.triplets)

  def paths(self) -> list[str]:
    return list(self.images)

  def rows(self, index: Mapping[str, int], what: str = 'features') -> np.ndarray:
    """(T, 3) int32 rows of a table whose row of image path p is index[p]."""
    return _rows(self.images, index, what)[self.triplets]


def check_files(paths: Sequence[str], what: str = 'file') -> None:
  """Each path exists, is a regular file and is readable; else one UserError naming the first bad one."""
  bad = []
  for p in dict.fromkeys(paths):
    if not os.path.isfile(p):
      bad.append((p, 'is a folder' if os.path.isdir(p) else 'not found'))
    elif not os.access(p, os.R_OK):
      bad.append((p, 'not readable (permission denied)'))
  if bad:
    p, why = bad[0]
    more = f' ({len(bad) - 1} more {what}s missing or unreadable)' if len(bad) > 1 else ''
    raise UserError(f'{p}: {what} {why}{more}')


def verify_images(paths: Sequence[str], num_threads: int = 2) -> None:
  """Fully decodes every image (images.check_images); one UserError naming the first that fails."""
  from visim_jax.data import images
  bad = images.check_images(list(dict.fromkeys(paths)), num_threads)
  if bad:
    more = f' ({len(bad) - 1} more undecodable images)' if len(bad) > 1 else ''
    raise UserError(f'{bad[0][1]}{more}')


def read_fraction(path: str, what: str) -> float:
  """A judgement stored as a one-value .npy (BAPPS judge/ and same/): its value, in [0, 1]."""
  try:
    a = np.load(path, allow_pickle=False)
  except Exception as e:
    raise UserError(f'{path}: not a readable .npy ({" ".join(str(e).split())[:120]})') from None
  a = np.asarray(a)
  if a.size != 1 or a.dtype.kind not in 'biuf':
    raise UserError(f'{path}: expected one number (the {what}), got a {a.dtype} array of shape {a.shape}')
  v = float(a.reshape(()))
  if not 0.0 <= v <= 1.0:
    raise UserError(f'{path}: {what} {v} is outside [0, 1]')
  return v
