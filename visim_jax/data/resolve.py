"""The one resolver for paths read *from* a data or index file: each must lead to a file inside its root.

A data file names other files (NIGHTS `data.csv` its images, a THINGS names list its images, a generic triplet CSV
its images, a `model.safetensors.index.json` its shards) and a downloaded folder holds files (BAPPS, TLL, DreamSim's
cache_dir) that may be symbolic links. Every such path goes through `inside(root, path, where)`: joined to the root
when relative, then refused in one `UserError` line naming the data file and row when it is absolute, climbs out
with `..`, or is (or passes through) a symbolic link whose real path is outside the root's real path:

    error: /d/nights/data.csv:line 12: ref_path '../outside/x.png' leads outside /d/nights; ...

A root that is itself a symbolic link (`nights -> /big/disk/nights`) is fine: the comparison is between real paths.
The returned path is the joined one (not the real one), so names and caches keep the spelling users see. A loader
makes one `Root` per data file: the root's real path and each folder's are found once, then a path costs one lstat.
(A leaf: imports only visim_jax.core.errors.)
"""
from __future__ import annotations

import os

from visim_jax.core.errors import UserError


def _within(path: str, root: str) -> bool:
  return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


class Root:
  """A data file's root folder; `inside` and `check` resolve paths under it (see the module docstring).

  `links_within`: a folder above `root` that symbolic links may lead into (a Hugging Face cache snapshot's files
  are links to the model's `blobs/`); names themselves must still stay in `root`."""

  def __init__(self, root: str, links_within: str | None = None):
    self.root = root
    self.real = os.path.realpath(links_within or root)
    self._folders: dict[str, bool] = {}

  def _leads_out(self, path: str) -> bool:
    folder = os.path.dirname(path)
    if folder not in self._folders:
      self._folders[folder] = _within(os.path.realpath(folder), self.real)
    return not self._folders[folder] or (os.path.islink(path) and not _within(os.path.realpath(path), self.real))

  def inside(self, path: str, where: str, what: str = 'path') -> str:
    """root/`path`, refused (UserError starting with `where`: the data file and line, `/d/nights/data.csv:line
    12`; `what`: the field, `ref_path`) unless it leads to a place inside the root."""
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
    joined = os.path.join(self.root, path)
    if not how and self._leads_out(joined):
      how = 'is a symbolic link to a place'
    if how:
      raise UserError(f'{where}: {what} {path!r} leads outside {self.root} ({how}); data files may only name files '
                      'inside their own folder: move the files there and name them relative to it')
    return joined

  def check(self, paths, what: str = 'file') -> None:
    """Each of `paths` (files found by listing the root) really lies inside it: neither it nor its folder is a
    symbolic link to a place outside; else one UserError naming the file."""
    for p in paths:
      if self._leads_out(p):
        raise UserError(f'{p}: {what} leads outside {self.root} (a symbolic link to {os.path.realpath(p)}); a '
                        'dataset folder may only hold files inside it: copy the files in, or point the root at the '
                        'real folder')


def inside(root: str, path: str, where: str, what: str = 'path', links_within: str | None = None) -> str:
  """`Root(root, links_within).inside(path, where, what)`: one path (loaders with many make one Root)."""
  return Root(root, links_within).inside(path, where, what)


def check_tree(root: str, paths, what: str = 'file') -> None:
  """`Root(root).check(paths, what)`."""
  Root(root).check(paths, what)
