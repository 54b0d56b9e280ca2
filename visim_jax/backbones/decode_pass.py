"""A checked decode of every input image before a run writes anything (its record, its first result).

`check(paths, cache_dir)` fully decodes each image (visim_jax/data/images.py `check_images`, a thread pool) and
raises the first failure as one line naming the file (truncated, 0-byte, text saved as .png, decompression
bomb...). A pass that succeeded leaves a marker in the feature cache keyed by every file's path, size and
mtime, so the same unchanged images are not decoded twice; a changed file changes the key and is checked again.
"""
from __future__ import annotations

import contextlib
import os
from typing import Sequence

from visim_jax.core import ops


def _key(paths: Sequence[str]) -> str:
  from visim_jax.backbones.features import file_list_hash  # the feature cache's own key of a file list (one copy)
  try:
    return file_list_hash(paths)
  except OSError:
    return ''  # a missing file: no key, the decode names it


def check(paths: Sequence[str], cache_dir: str | None = None) -> None:
  """Every image of `paths` decodes (else the first failure as a UserError naming the file)."""
  from visim_jax.data import images
  paths = list(dict.fromkeys(paths))
  key = _key(paths)
  marker = os.path.join(cache_dir, 'decoded', key) if cache_dir and key else None
  if marker and os.path.exists(marker):
    return
  bad = images.check_images(paths)
  if bad:
    path, reason = bad[0]
    more = f' ({len(bad) - 1} more image(s) fail too)' if len(bad) > 1 else ''
    raise images.ImageError((reason if reason.startswith(path) else f'{path}: {reason}') + more)
  if marker:
    with contextlib.suppress(OSError):  # a read-only cache: checked again next time
      os.makedirs(os.path.dirname(marker), exist_ok=True)
      ops.atomic_write_bytes(marker, f'{len(paths)} images decoded\n'.encode())
