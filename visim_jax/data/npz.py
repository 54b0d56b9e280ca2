"""Reading a user-supplied .npz of arrays (never pickled objects), with errors that name the field and file."""
from __future__ import annotations

import os
from typing import Sequence

import numpy as np


def read_arrays(path: str, required: Sequence[str], optional: Sequence[str] = (),
                field: str = 'config.features') -> dict[str, np.ndarray]:
  """{name: array} of the `required` arrays (all must exist) and the `optional` ones present in `path`."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f'{field}: {path} not found')
  try:
    with np.load(path, allow_pickle=False) as z:
      files = list(z.files)
      arrays = {k: np.asarray(z[k]) for k in (*required, *optional) if k in files}
  except Exception as e:  # not a zip, truncated, pickled objects...
    raise ValueError(f'{field}: {path} is not a readable .npz ({e})') from None
  missing = [k for k in required if k not in arrays]
  if missing:
    raise ValueError(f'{field}: {path}: missing array(s) {missing} (has {files})')
  return arrays
