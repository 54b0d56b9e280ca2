"""NIGHTS (DreamSim, Fu et al. 2023): 2AFC triplets of Stable-Diffusion images, read as DreamSim's code reads them.

Download layout (`dataset/download_dataset.sh` of ssundaram21/dreamsim unzips nights.zip, 58 GB):
```
nights/
  data.csv                 one row per triplet (header; columns used below)
  ref/000/000.png ...      reference images        ref/<dir>/<n>.png
  distort/000/000_0.png    the two distortions     distort/<dir>/<n>_0.png, distort/<dir>/<n>_1.png
```
`data.csv` columns (DreamSim's `TwoAFCDataset` reads them by position: 0 id, 2 the target, 4 ref, 5 left,
6 right; we read them by name): `id, left_vote, right_vote, votes, ref_path, left_path, right_path, ...,
split, is_imagenet`. Paths are relative to the folder holding `data.csv` and must stay inside it (data/resolve.py:
an absolute path, `..` or a symbolic link out is refused naming the line); UTF-8 with or without a BOM
(readers.py: another encoding or a short row fails naming the line).

Readings (DreamSim `dataset/dataset.py` and `evaluation/score.py`):
  * Filter: rows with `votes >= 6` (DreamSim's "unanimous" 20,019 triplets of the released CSV); `min_votes`
    changes it. A missing votes value is dropped (pandas: NaN >= 6 is False).
  * Splits: train / val / test by the `split` column; test_imagenet / test_no_imagenet are the test rows with
    `is_imagenet` true / false (True/False, TRUE/FALSE, true/false or 1/0).
  * Target: `right_vote` as float32, the fraction of voters who chose the right image (`right_path`) as closer;
    after the filter it is 0 or 1. It becomes `TwoAFCSet.judge` with p0 = left, p1 = right, so the score
    `(d0 < d1)(1 - j) + (d1 < d0) j + 0.5 (d0 == d1)` is DreamSim's `score_nights_dataset` exactly.
  * Row order: the CSV's order (DreamSim's DataLoader uses shuffle=False on evaluation).
"""
from __future__ import annotations

import math
import os

import numpy as np

from visim_jax.core import readers
from visim_jax.data import resolve
from visim_jax.data.judgements import TwoAFCSet, check_files
from visim_jax.core.errors import UserError

SPLITS = ('train', 'val', 'test', 'test_imagenet', 'test_no_imagenet')
MIN_VOTES = 6
COLUMNS = ('id', 'right_vote', 'votes', 'ref_path', 'left_path', 'right_path', 'split', 'is_imagenet')
_TRUE = ('true', '1', '1.0')
_FALSE = ('false', '0', '0.0')


def _number(text: str, where: str, column: str) -> float:
  try:
    return float(text) if text.strip() else math.nan
  except ValueError:
    raise UserError(f'{where}: column {column!r} is not a number ({text!r})') from None


def load(root: str, split: str = 'test', min_votes: float = MIN_VOTES) -> TwoAFCSet:
  """The NIGHTS triplets of `split` under `root` (the folder holding data.csv), checked before decoding."""
  if split not in SPLITS:
    raise UserError(f'NIGHTS split: expected one of {SPLITS}, got {split!r}')
  csv_path = os.path.join(root, 'data.csv')
  if not os.path.isfile(csv_path):
    raise UserError(f'{csv_path}: NIGHTS data.csv not found (expected nights/data.csv, ref/ and distort/)')
  _, rows = readers.csv_table(csv_path, COLUMNS, 'NIGHTS data.csv')
  inside = resolve.Root(root).inside
  ids, ref, left, right, judge = [], [], [], [], []
  base, want = split.split('_')[0], None
  if split == 'test_imagenet':
    want = True
  elif split == 'test_no_imagenet':
    want = False
  for line, row in rows:
    where = f'{csv_path}:line {line}'
    votes = _number(row['votes'], where, 'votes')
    if not votes >= min_votes:
      continue
    if row['split'].strip() != base:
      continue
    if want is not None:
      flag = row['is_imagenet'].strip().lower()
      if flag not in _TRUE + _FALSE:
        raise UserError(f'{where}: is_imagenet must be True or False, got {row["is_imagenet"]!r}')
      if (flag in _TRUE) != want:
        continue
    p = _number(row['right_vote'], where, 'right_vote')
    if not 0.0 <= p <= 1.0:
      raise UserError(f'{where}: right_vote {row["right_vote"]!r} is not a fraction in [0, 1] '
                      '(DreamSim reads it as the fraction of voters choosing the right image)')
    ids.append(row['id'].strip())
    for col, out in (('ref_path', ref), ('left_path', left), ('right_path', right)):
      out.append(inside(row[col].strip(), where, col))
    judge.append(p)
  if not ref:
    raise UserError(f'{csv_path}: no triplets in split {split!r} with votes >= {min_votes:g}')
  check_files(ref + left + right, 'NIGHTS image')
  return TwoAFCSet(f'nights/{split}', ref, left, right, np.asarray(judge, np.float32), ids)
