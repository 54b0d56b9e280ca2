"""THINGS odd-one-out (Hebart et al. 2020 / 2023): triplet lists over an image folder, in the forms in use.

Forms (`form=`; 'auto' tells 'osf' by its header, else reads 'dreamsim'):
  * 'dreamsim': DreamSim's `things_valset.txt` (evaluation/eval_datasets.py ThingsDataset): one triplet a line,
    `im1 im2 im3` separated by white space, image `<root>/<im>.png`; the odd one out is always the third
    (score.py counts a triplet right when d(1,2) <= d(1,3) and d(1,2) <= d(2,3)).
  * 'osf': the OSF triplet table `triplets_large_final_correctednc_correctedorder.csv` (osf.io/f5rn6,
    data/triplet_dataset): TAB-separated with a header `image1 image2 image3 choice RT noise_ceiling ...`;
    image1..3 are 1-based indices of the 1,854 THINGS concepts in THINGS order, `choice` is the 1-based column
    (1, 2, 3) of the image the participant chose as the odd one out (the authors' conversion script moves
    column `choice` last to make the 0-based train/validation/test .txt files). `noise_ceiling` (0: main set,
    1, 2, 3: the repeated test sets) can filter the rows.
  * 'index0': those derived files (`trainset.txt`, `validationset.txt`, `testset1.txt`, ...): `i j k`, 0-based
    concept indices, the odd one out third.
Index forms ('osf', 'index0') map concept k to an image by a names file (`names_file=`, one name a line in THINGS
order, e.g. `unique_id.txt`; a name is a file under root, with or without its image extension), else by the
sorted image files directly in `root` (then there must be at least as many images as the largest index).

Download layout: `<root>/` the images (DreamSim: `<im>.png` named as in its list; OSF: one image a concept),
plus the triplet file anywhere (`triplets_file=`).
"""
from __future__ import annotations

import os
import warnings

import numpy as np

from visim_jax.core import readers
from visim_jax.data import resolve
from visim_jax.data.images import IMAGE_EXTENSIONS
from visim_jax.data.judgements import OddOneOutSet, check_files
from visim_jax.core.errors import UserError

FORMS = ('auto', 'dreamsim', 'osf', 'index0')
OSF_COLUMNS = ('image1', 'image2', 'image3', 'choice')
INT_RANGE = (-2**31, 2**31 - 1)  # an index, choice or noise_ceiling beyond int32 is refused naming the line


def _lines(path: str, what: str = 'THINGS triplet file') -> list[tuple[int, str]]:
  if not os.path.isfile(path):
    raise UserError(f'{path}: {what} not found')
  return readers.text_lines(path, what)


def _detect(lines) -> str:
  first = lines[0][1].split('\t') if lines else []
  return 'osf' if all(c in [x.strip() for x in first] for c in OSF_COLUMNS) else 'dreamsim'


def _image_list(root: str, names_file: str | None) -> list[str]:
  """Concept order -> image path: the names file's lines resolved under root, else the sorted folder."""
  if not os.path.isdir(root):
    raise UserError(f'{root}: THINGS image folder not found')
  files = sorted(n for n in os.listdir(root) if n.lower().endswith(IMAGE_EXTENSIONS) and not n.startswith('.'))
  if names_file is None:
    if not files:
      raise UserError(f'{root}: no image files (looked for {", ".join(IMAGE_EXTENSIONS)})')
    return [os.path.join(root, n) for n in files]
  by_stem = {}
  for n in files:
    by_stem.setdefault(os.path.splitext(n)[0], n)
  out, inside = [], resolve.Root(root).inside
  for line, name in _lines(names_file, 'THINGS names file'):
    name = name.split('\t')[0].strip()
    path = inside(name, f'{names_file}:line {line}', 'image name')
    if os.path.isfile(path):
      out.append(path)
    elif name in by_stem:
      out.append(os.path.join(root, by_stem[name]))
    else:
      raise UserError(f'{names_file}:line {line}: no image {name!r} (or {name}.<ext>) in {root}')
  return out


def _index_rows(rows: np.ndarray, n_images: int, path: str, lines: np.ndarray, base: int) -> np.ndarray:
  idx = rows - base
  bad = (idx < 0) | (idx >= n_images)
  if bad.any():
    t = int(np.argmax(bad.any(1)))
    raise UserError(f'{path}:line {int(lines[t])}: image index {rows[t].tolist()} outside {base}..'
                    f'{n_images - 1 + base} (the image list has {n_images} images)')
  return idx.astype(np.int32)


def _ints(parts, where: str, n: int) -> list[int]:
  """The first n fields as integers (`7` or `7.0`); a field that is not one, or beyond int32, fails naming it."""
  if len(parts) < n:
    raise UserError(f'{where}: expected {n} fields, got {len(parts)}')
  return [readers.to_int(p, where, INT_RANGE[0], INT_RANGE[1], 'field') for p in parts[:n]]


def _first_line(path: str) -> str:
  if not os.path.isfile(path):
    raise UserError(f'{path}: THINGS triplet file not found')
  try:
    with open(path, encoding='utf-8-sig') as f:
      for s in f:
        if s.strip():
          return s.strip()
  except UnicodeDecodeError:
    readers.read_text(path, 'THINGS triplet file')  # raises naming the line of the first bad byte
  raise UserError(f'{path}: no triplets')


def _fast_ints(path: str, cols, skip: int, delimiter) -> np.ndarray | None:
  """The integer columns `cols` of a large table in one C pass (np.loadtxt), or None when any row does not
  parse (then the line-by-line reader names the line)."""
  try:
    with warnings.catch_warnings():   # a header-only file: numpy's 'input contained no data' is ours to say
      warnings.simplefilter('ignore', UserWarning)
      return np.loadtxt(path, dtype=np.int64, delimiter=delimiter, skiprows=skip, usecols=cols, ndmin=2,
                        comments=None, encoding='utf-8-sig')
  except (ValueError, IndexError, OverflowError):
    return None


def _osf_slow(path: str, cols, nc_col, noise_ceiling):
  rows, choice, where = [], [], []
  for line, s in _lines(path)[1:]:
    parts = s.split('\t')
    vals = _ints([parts[c] if c < len(parts) else '' for c in cols], f'{path}:line {line}', 4)
    if noise_ceiling is not None:
      if _ints([parts[nc_col] if nc_col < len(parts) else ''], f'{path}:line {line}', 1)[0] != noise_ceiling:
        continue
    if vals[3] not in (1, 2, 3):
      raise UserError(f'{path}:line {line}: choice must be 1, 2 or 3, got {vals[3]}')
    rows.append(vals[:3])
    choice.append(vals[3] - 1)
    where.append(line)
  return np.asarray(rows, np.int64).reshape(-1, 3), np.asarray(choice, np.int32), np.asarray(where)


def _osf(path: str, header_line: str, n_images: int, noise_ceiling):
  """(triplets (T, 3) 0-based rows of the image list, odd (T,)) of the OSF table."""
  header = [h.strip() for h in header_line.split('\t')]
  missing = [c for c in OSF_COLUMNS if c not in header]
  if missing:
    raise UserError(f'{path}: missing column(s) {missing} of the OSF table (tab-separated; has {header})')
  cols = [header.index(c) for c in OSF_COLUMNS]
  nc_col = header.index('noise_ceiling') if 'noise_ceiling' in header else None
  if noise_ceiling is not None and nc_col is None:
    raise UserError(f'{path}: no noise_ceiling column to filter on')
  a = _fast_ints(path, cols + ([nc_col] if noise_ceiling is not None else []), 1, '\t')
  if a is not None and noise_ceiling is not None:
    a = a[a[:, 4] == noise_ceiling]
  ok = a is not None and np.isin(a[:, 3], (1, 2, 3)).all() and ((a[:, :3] >= 1) & (a[:, :3] <= n_images)).all()
  if ok:
    rows, odd, where = a[:, :3], (a[:, 3] - 1).astype(np.int32), None
  else:  # a row that does not parse or is out of range: read line by line to name it
    rows, odd, where = _osf_slow(path, cols, nc_col, noise_ceiling)
  if not len(rows):
    raise UserError(f'{path}: no triplets' + (f' with noise_ceiling == {noise_ceiling}'
                                              if noise_ceiling is not None else ''))
  if where is None:
    return (rows - 1).astype(np.int32), odd
  return _index_rows(rows, n_images, path, where, 1), odd


def _index0(path: str, n_images: int) -> np.ndarray:
  a = _fast_ints(path, (0, 1, 2), 0, None)
  if a is not None and len(a) and ((a >= 0) & (a < n_images)).all():
    return a.astype(np.int32)
  lines = _lines(path)
  rows = [_ints(s.split(), f'{path}:line {line}', 3) for line, s in lines]
  if not rows:
    raise UserError(f'{path}: no triplets')
  return _index_rows(np.asarray(rows, np.int64), n_images, path, np.asarray([ln for ln, _ in lines]), 0)


def load(root: str, triplets_file: str, form: str = 'auto', names_file: str | None = None,
         noise_ceiling: int | None = None, name: str = 'things') -> OddOneOutSet:
  """The odd-one-out triplets of `triplets_file` over the images in `root`, checked before decoding."""
  if form not in FORMS:
    raise UserError(f'THINGS form: expected one of {FORMS}, got {form!r}')
  first = _first_line(triplets_file)
  if form == 'auto':
    form = _detect([(1, first)])
  if noise_ceiling is not None and form != 'osf':
    raise UserError(f'{triplets_file}: noise_ceiling filters the OSF table only (this file reads as {form!r})')

  if form == 'dreamsim':
    keys, images, tri, inside = {}, [], [], resolve.Root(root).inside
    for line, s in _lines(triplets_file):
      parts = s.split()
      if len(parts) != 3:
        raise UserError(f'{triplets_file}:line {line}: expected three image names, got {len(parts)} fields')
      for p in parts:
        if p not in keys:
          keys[p] = len(images)
          images.append(inside(f'{p}.png', f'{triplets_file}:line {line}', 'image name'))
      tri.append([keys[p] for p in parts])
    triplets = np.asarray(tri, np.int32)
    odd = np.full(len(triplets), 2, np.int32)
  else:
    image_list = _image_list(root, names_file)
    if form == 'osf':
      triplets, odd = _osf(triplets_file, first, len(image_list), noise_ceiling)
    else:  # index0
      triplets = _index0(triplets_file, len(image_list))
      odd = np.full(len(triplets), 2, np.int32)
    used = np.unique(triplets)
    remap = np.full(len(image_list), -1, np.int32)
    remap[used] = np.arange(len(used), dtype=np.int32)
    images = [image_list[i] for i in used.tolist()]
    triplets = remap[triplets]
  resolve.check_tree(root, images, 'THINGS image')
  check_files(images, 'THINGS image')
  return OddOneOutSet(name, images, triplets, odd, triplets_file)
