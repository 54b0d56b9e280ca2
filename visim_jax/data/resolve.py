"""The one resolver for paths read *from* a data or index file: each must lead to a file inside its root.

A data file names other files (NIGHTS `data.csv` its images, a THINGS names list its images, a generic triplet CSV
its images, a `model.safetensors.index.json` its shards) and a downloaded folder holds files (BAPPS, TLL, DreamSim's
cache_dir) that may be symbolic links. Every such path goes through `inside(root, path, where)`: joined to the root
when relative, then refused in one `UserError` line naming the data file and row when it is absolute, climbs out
with `..`, or is (or passes through) a symbolic link whose real path is outside the root's real path:

    error: /d/nights/data.csv:line 12: ref_path '../outside/x.png' leads outside /d/nights; ...

A root that is itself a symbolic link (`nights -> /big/disk/nights`) is fine: the comparison is between real paths.
The returned path is the joined one (not the real one), so names and caches keep the spelling users see.
(A leaf: imports only visim_jax.errors.)
"""
from __future__ import annotations

import os

from visim_jax.errors import UserError


def _within(path: str, root: str) -> bool:
  return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def inside(root: str, path: str, where: str, what: str = 'path', links_within: str | None = None) -> str:
  """`root`/`path`, refused (UserError starting with `where`) unless it leads to a place inside `root`.

  `where` names the data file and row (`/d/nights/data.csv:line 12`); `what` the field (`ref_path`).
  `links_within`: a folder above `root` that symbolic links may lead into (a Hugging Face cache snapshot's files
  are links to the model's `blobs/`); the name itself must still stay in `root`."""
  path = str(path)
  how = ''
  if not path:
    raise UserError(f'{where}: {what} is empty')
  if '\0' in path:
    how = 'holds a NUL character'
  elif os.path.isabs(path) or path.startswith('~'):
    how = 'is absolute'
  elif '..' in path.replace('\\', '/').split('/'):
    how = 'climbs out with ..'
  joined = os.path.join(root, path)
  if not how:
    real_root = os.path.realpath(links_within or root)
    if not _within(os.path.realpath(joined), real_root):
      how = 'is a symbolic link to a place'
  if how:
    raise UserError(f'{where}: {what} {path!r} leads outside {root} ({how}); data files may only name files '
                    'inside their own folder: move the files there and name them relative to it')
  return joined


def check_tree(root: str, paths, what: str = 'file') -> None:
  """Each of `paths` (files found by listing `root`) really lies inside `root`: neither it nor its folder is a
  symbolic link to a place outside; else one UserError naming the file. One lstat per file, one realpath per
  folder (and per link)."""
  real_root = os.path.realpath(root)
  folders: dict[str, bool] = {}
  for p in paths:
    d = os.path.dirname(p)
    if d not in folders:
      folders[d] = _within(os.path.realpath(d), real_root)
    if not folders[d] or (os.path.islink(p) and not _within(os.path.realpath(p), real_root)):
      raise UserError(f'{p}: {what} leads outside {root} (a symbolic link to {os.path.realpath(p)}); a dataset '
                      'folder may only hold files inside it: copy the files in, or point the root at the real folder')
