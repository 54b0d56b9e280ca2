"""AligNet's released triplets as published (google-deepmind/alignet, data.py `AligNetTriplets`):

  <alignet_dir>/<transform>/<split>_<sampling>.npz     transform: 'untransformed' | 'uncertainty_distillation'
                                                       split: 'train' | 'val'; sampling: e.g. 'cluster_border_500'
    indices       (N, 3) integers   rows of tfds.data_source('imagenet2012', split='train') (BOTH splits index
                                    ImageNet's train split: AligNet's `imagenet_ds`)
    similarities  (N, 3) floats     the teacher's [s01, s02, s12]; the odd one out is image 2 (s12 the smallest)
    filenames     (N, 3) strings    the ImageNet file names of `indices` (not read by AligNet's loader, nor here)

`load` checks the keys, shapes and dtypes from the .npy headers before reading any array (the 10M-row train file's
`filenames` is never read), then every index against the image source's length and the similarities for finite
values; a bad file is one line naming the file and the key (errors.UserError). The result is a triplet_index
.TripletSet with `similarities` targets: AligNet's column order is ours ([s_01, s_02, s_12]).
"""
from __future__ import annotations

import os
import zipfile

import numpy as np

from visim_jax.core.errors import UserError
from visim_jax.data.triplet_index import TripletSet

TRANSFORMS = ('untransformed', 'uncertainty_distillation')
SPLITS = ('train', 'val')
KEYS = ('indices', 'similarities', 'filenames')
TFDS_NAME, TFDS_SPLIT = 'imagenet2012', 'train'


def path(alignet_dir: str, transform: str, split: str, sampling: str) -> str:
  """AligNetTriplets.from_args's file: <alignet_dir>/<transform>/<split>_<sampling>.npz."""
  return os.path.join(alignet_dir, transform, f'{split}_{sampling}.npz')


def _headers(p: str) -> dict:
  """{key: (shape, dtype)} of the .npz's arrays, read from the .npy headers only (nothing is decompressed beyond
  them)."""
  out = {}
  with zipfile.ZipFile(p) as z:
    for name in z.namelist():
      if not name.endswith('.npy'):
        continue
      with z.open(name) as f:
        fmt = np.lib.format
        read = fmt.read_array_header_1_0 if fmt.read_magic(f) == (1, 0) else fmt.read_array_header_2_0
        shape, _, dtype = read(f)
      out[name[:-4]] = (shape, dtype)
  return out


def load(p: str, n_images: int | None = None) -> TripletSet:
  """One released file, checked (module docstring); n_images: the ImageNet source's length (indices below it)."""
  if not os.path.isfile(p):
    raise UserError(f'{p}: AligNet triplet file not found (expected <alignet_dir>/<transform>/<split>_<sampling>.npz'
                    ' as google-deepmind/alignet publishes it)')
  try:
    heads = _headers(p)
  except Exception as e:  # not a zip, truncated, garbled header
    raise UserError(f'{p}: not a readable .npz file: {" ".join(str(e).split())[:160]}') from None
  for k in ('indices', 'similarities'):
    if k not in heads:
      raise UserError(f'{p}: key {k!r} missing (AligNet files hold {", ".join(KEYS)}; has {sorted(heads)})')
  n = heads['indices'][0][0] if len(heads['indices'][0]) == 2 else -1
  for k in KEYS:
    if k not in heads:
      continue
    shape, dtype = heads[k]
    kind = {'indices': 'iu', 'similarities': 'iuf', 'filenames': 'US'}[k]
    if dtype.kind not in kind or len(shape) != 2 or shape[1] != 3 or shape[0] != n or not n:
      what = {'indices': 'integers', 'similarities': 'numbers', 'filenames': 'strings'}[k]
      raise UserError(f'{p}: key {k!r} must be a non-empty (N, 3) array of {what} with N as in indices, got '
                      f'{dtype} {tuple(shape)}')
  try:
    with np.load(p, allow_pickle=False) as z:
      idx, sim = z['indices'], z['similarities']
  except Exception as e:
    raise UserError(f'{p}: not a readable .npz file: {" ".join(str(e).split())[:160]}') from None
  bad = idx < 0 if n_images is None else (idx < 0) | (idx >= n_images)
  if bad.any():
    t = int(np.argmax(bad.any(1)))
    raise UserError(f"{p}: key 'indices' row {t} holds {idx[t].tolist()}, outside 0..{(n_images or 0) - 1} (the "
                    f"rows of tfds imagenet2012 {TFDS_SPLIT}); {int(bad.any(1).sum())} row(s) out of range")
  same = (idx[:, 0] == idx[:, 1]) | (idx[:, 0] == idx[:, 2]) | (idx[:, 1] == idx[:, 2])
  if same.any():
    t = int(np.argmax(same))
    raise UserError(f"{p}: key 'indices' row {t} repeats an image ({idx[t].tolist()}); the three images must differ")
  if not np.isfinite(sim).all():
    t = int(np.argmax(~np.isfinite(sim).all(1)))
    raise UserError(f"{p}: key 'similarities' row {t} holds non-finite values ({sim[t].tolist()})")
  return TripletSet(idx.astype(np.int32), 'similarities', sim.astype(np.float32), [],
                    {'source': 'alignet', 'file': os.path.abspath(p)})
