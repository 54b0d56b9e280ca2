"""BAPPS (LPIPS, Zhang et al. 2018): 2AFC and JND patch judgements, read as PerceptualSimilarity's code reads them.

Download layout (`scripts/download_dataset.sh` of richzhang/PerceptualSimilarity untars into `dataset/`):
```
dataset/
  2afc/train/{traditional,cnn,mix}/{ref,p0,p1}/NAME.png, judge/NAME.npy
  2afc/val/{traditional,cnn,superres,deblur,color,frameinterp}/{ref,p0,p1}/NAME.png, judge/NAME.npy
  jnd/val/{traditional,cnn}/{p0,p1}/NAME.png, same/NAME.npy
```
Pass `root` = that `dataset/` folder. judge/NAME.npy holds the fraction of humans who chose p1 as closer to
ref (0: all chose p0; train sets have 2 judgements a triplet, val sets 5); same/NAME.npy the fraction who
judged p0 and p1 identical (3 judgements a pair).

Readings (`data/dataset/twoafc_dataset.py`, `jnd_dataset.py`, `data/image_folder.py`):
  * Upstream lists each of ref/, p0/, p1/, judge/ on its own (os.walk, extensions .jpg .jpeg .png .ppm .bmp;
    .npy) and pairs them by *sorted position*. We pair them by file name (the stem) and fail on any file
    without its partners: identical on a complete set, and a missing file cannot shift every later pairing.
    Items are in sorted-path order, as upstream.
  * A file that is a symbolic link to a place outside its folder is refused (data/resolve.py).
  * The judge/same value is np.load(...) as float32 in [0, 1]; anything else fails naming the file.
  * Sets: all published sets of the split by default (test_dataset_model.py's val default is the six val
    sets); `sets=` picks some. Each set is scored on its own (the LPIPS paper reports per-set numbers).
"""
from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from visim_jax.data import resolve
from visim_jax.data.images import IMAGE_EXTENSIONS
from visim_jax.data.judgements import JNDSet, TwoAFCSet, check_files, read_fraction
from visim_jax.core.errors import UserError

TWOAFC_SETS = {'train': ('traditional', 'cnn', 'mix'),
               'val': ('traditional', 'cnn', 'superres', 'deblur', 'color', 'frameinterp')}
JND_SETS = ('traditional', 'cnn')


def _listing(folder: str, extensions: Sequence[str]) -> dict[str, str]:
  """{path relative to folder without extension: path} of the files under `folder` (recursive, as os.walk)."""
  if not os.path.isdir(folder):
    raise UserError(f'{folder}: BAPPS folder not found')
  exts = tuple(e.lower() for e in extensions)
  out = {}
  for dirpath, dirnames, names in os.walk(folder):
    dirnames.sort()
    for n in sorted(names):
      if n.startswith('.') or not n.lower().endswith(exts):
        continue
      path = os.path.join(dirpath, n)
      stem = os.path.splitext(os.path.relpath(path, folder))[0]
      if stem in out:
        raise UserError(f'{path}: two files named {stem!r} in {folder} ({out[stem]})')
      out[stem] = path
  if not out:
    raise UserError(f'{folder}: no {"/".join(exts)} files')
  resolve.check_tree(folder, out.values(), 'BAPPS file')
  return out


def _paired(set_dir: str, parts: Sequence[str], value: str) -> tuple[list[str], dict[str, dict[str, str]]]:
  """Names present in every part (images) and in `value` (.npy), sorted; a file without partners fails."""
  listings = {p: _listing(os.path.join(set_dir, p), IMAGE_EXTENSIONS) for p in parts}
  listings[value] = _listing(os.path.join(set_dir, value), ('.npy',))
  names = set(listings[value])
  for part, lst in listings.items():
    extra = sorted(set(lst) - names)
    if extra:
      raise UserError(f'{lst[extra[0]]}: no partner in {os.path.join(set_dir, value)} '
                      f'({len(extra)} such file(s) in {part}/)')
  for part, lst in listings.items():
    lacking = sorted(names - set(lst))
    if lacking:
      raise UserError(f'{os.path.join(set_dir, part, lacking[0])}.*: missing ({len(lacking)} name(s) of '
                      f'{value}/ have no file in {part}/)')
  return sorted(names, key=lambda n: listings[value][n]), listings


def _set_names(split_dir: str, sets, published: Sequence[str], field: str) -> list[str]:
  if sets is None:
    sets = published
  elif isinstance(sets, str):
    sets = [s for s in sets.split(',') if s]
  sets = list(sets)
  if not sets:
    raise UserError(f'{split_dir}: no BAPPS sets selected')
  for s in sets:
    if not os.path.isdir(os.path.join(split_dir, s)):
      raise UserError(f'{os.path.join(split_dir, s)}: BAPPS set folder not found (published sets here: '
                      f'{", ".join(published)}; choose some with {field}, or sets= in Python)')
  return sets


def load_2afc_set(set_dir: str, name: str) -> TwoAFCSet:
  """One 2AFC set folder (ref/, p0/, p1/, judge/)."""
  names, lst = _paired(set_dir, ('ref', 'p0', 'p1'), 'judge')
  ref, p0, p1 = ([lst[p][n] for n in names] for p in ('ref', 'p0', 'p1'))
  check_files(ref + p0 + p1, 'BAPPS image')
  judge = np.asarray([read_fraction(lst['judge'][n], 'judge fraction') for n in names], np.float32)
  return TwoAFCSet(name, ref, p0, p1, judge, list(names))


def load_jnd_set(set_dir: str, name: str) -> JNDSet:
  """One JND set folder (p0/, p1/, same/)."""
  names, lst = _paired(set_dir, ('p0', 'p1'), 'same')
  p0, p1 = ([lst[p][n] for n in names] for p in ('p0', 'p1'))
  check_files(p0 + p1, 'BAPPS image')
  same = np.asarray([read_fraction(lst['same'][n], 'same fraction') for n in names], np.float32)
  return JNDSet(name, p0, p1, same, list(names))


def load_2afc(root: str, split: str = 'val', sets=None) -> dict[str, TwoAFCSet]:
  """{set: TwoAFCSet} of `root`/2afc/`split`/<set> (root = the BAPPS `dataset/` folder), in `sets` order."""
  if split not in TWOAFC_SETS:
    raise UserError(f'BAPPS 2AFC split: expected one of {tuple(TWOAFC_SETS)}, got {split!r}')
  split_dir = os.path.join(root, '2afc', split)
  if not os.path.isdir(split_dir):
    raise UserError(f'{split_dir}: BAPPS 2AFC folder not found (expected <root>/2afc/{split}/<set>/'
                    '{ref,p0,p1,judge}; root is the dataset/ folder of the download)')
  return {s: load_2afc_set(os.path.join(split_dir, s), f'bapps/2afc/{split}/{s}')
          for s in _set_names(split_dir, sets, TWOAFC_SETS[split], 'config.bapps_sets')}


def load_jnd(root: str, sets=None) -> dict[str, JNDSet]:
  """{set: JNDSet} of `root`/jnd/val/<set> (root = the BAPPS `dataset/` folder)."""
  split_dir = os.path.join(root, 'jnd', 'val')
  if not os.path.isdir(split_dir):
    raise UserError(f'{split_dir}: BAPPS JND folder not found (expected <root>/jnd/val/<set>/{{p0,p1,same}}; '
                    'root is the dataset/ folder of the download)')
  return {s: load_jnd_set(os.path.join(split_dir, s), f'bapps/jnd/{s}')
          for s in _set_names(split_dir, sets, JND_SETS, 'config.bapps_jnd_sets')}
