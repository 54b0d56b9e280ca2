"""Image-quality data sets (mean opinion scores of distorted images against their references), read in their
published layouts and checked before any image is decoded (issue 47). Each loader returns a `QualitySet`: the
reference and distorted image paths per row and the opinion score, oriented so that HIGHER = BETTER quality
(`higher_is_better` records the published direction; a DMOS where higher is worse is negated).

KADID-10k (Lin, Hosu & Saupe 2019; the zip of database.mmsp.uni-konstanz.de unpacks to `kadid10k/`):
```
kadid10k/
  dmos.csv                 header dist_img,ref_img,dmos,var; 10,125 rows (81 references x 25 distortions x 5 levels)
  images/I01.png           references            images/I<ref>.png
  images/I01_01_01.png     distorted images      images/I<ref>_<distortion>_<level>.png
```
`dmos` is the mean of the crowd's 1..5 ratings of the distorted image against its reference: HIGHER = BETTER
(KADID-10k paper, Section 3); `var` its variance (read, not used). File names in the CSV are relative to images/.
A row that is short, has a non-number dmos, or names a file outside the folder is refused naming the line
(core/readers.py, data/resolve.py); a missing image names the file (judgements.check_files).
"""
from __future__ import annotations

import dataclasses
import math
import os

import numpy as np

from visim_jax.core import readers
from visim_jax.core.errors import UserError
from visim_jax.data import resolve
from visim_jax.data.judgements import check_files


@dataclasses.dataclass
class QualitySet:
  name: str
  refs: list[str]            # per row: the reference image
  dists: list[str]           # per row: the distorted image
  mos: np.ndarray            # (N,) float64, HIGHER = better quality
  higher_is_better: bool     # the published score's direction (False: negated into `mos`)

  def __len__(self) -> int:
    return len(self.dists)

  def paths(self) -> list[str]:
    return list(dict.fromkeys(self.refs + self.dists))


def _number(text: str, where: str, column: str) -> float:
  try:
    v = float(text)
  except ValueError:
    raise UserError(f'{where}: column {column!r} is not a number ({text!r})') from None
  if not math.isfinite(v):
    raise UserError(f'{where}: column {column!r} is not finite ({text!r})')
  return v


def load_kadid(root: str) -> QualitySet:
  """KADID-10k under `root` (the folder holding dmos.csv and images/)."""
  csv_path = os.path.join(root, 'dmos.csv')
  if not os.path.isfile(csv_path):
    raise UserError(f'{csv_path}: KADID-10k dmos.csv not found (expected kadid10k/dmos.csv and images/)')
  _, rows = readers.csv_table(csv_path, ('dist_img', 'ref_img', 'dmos', 'var'), 'KADID-10k dmos.csv')
  images = os.path.join(root, 'images')
  inside = resolve.Root(images).inside
  refs, dists, mos = [], [], []
  for line, row in rows:
    where = f'{csv_path}:line {line}'
    dists.append(inside(row['dist_img'].strip(), where, 'dist_img'))
    refs.append(inside(row['ref_img'].strip(), where, 'ref_img'))
    mos.append(_number(row['dmos'], where, 'dmos'))
  if not dists:
    raise UserError(f'{csv_path}: no rows')
  check_files(refs + dists, 'KADID-10k image')
  return QualitySet('kadid10k', refs, dists, np.asarray(mos, np.float64), True)


LOADERS = {'kadid': load_kadid}
