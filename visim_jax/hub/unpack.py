"""Unpacking an archive without letting it write outside its folder, or more than it may.

`unpack(archive, dest)`: .zip / .tar(.gz, .bz2, .xz) members checked before anything is written: no absolute
path, no `..`, no link or device (tar), nothing that resolves outside `dest`; every member's declared size within
`max_member`, their sum within `max_total`, `max_ratio` x the archive's size (a decompression bomb; image data sets
compress about 1x) and the free space of `dest` (less 1 GiB); then extracted member by member with the bytes
counted as they are written, so a member that holds more than it declares is cut there and refused. Our code:
zipfile and tarfile's 'data' filter bound paths and links, not sizes, and no library we depend on does.
"""
from __future__ import annotations

import errno
import os
import shutil
import tarfile
import zipfile
import zlib

from visim_jax.core.errors import UserError

CHUNK = 1 << 20
MAX_MEMBER = 1 << 40     # 1 TiB: one archive member's declared size
MAX_TOTAL = 1 << 41      # 2 TiB: all members together (NIGHTS is 58 GB unpacked)
MAX_RATIO = 100.0        # unpacked / packed bytes: PNG / JPEG sets compress ~1x, bombs 1000x
FREE_MARGIN = 1 << 30    # unpack keeps 1 GiB of the disk free


def _inside(root: str, name: str) -> bool:
  target = os.path.realpath(os.path.join(root, name))
  return target == root or target.startswith(root + os.sep)


def _check_name(archive: str, name: str, root: str) -> None:
  parts = name.replace('\\', '/').split('/')
  if name.startswith(('/', '\\')) or os.path.isabs(name) or (len(name) > 1 and name[1] == ':') or '..' in parts \
     or not _inside(root, name):
    raise UserError(f'{archive}: member {name!r} would be written outside {root}; refused (nothing unpacked)')


def _check_sizes(archive: str, sizes: list[tuple[str, int]], root: str, max_member: int, max_total: int,
                 max_ratio: float) -> None:
  for name, n in sizes:
    if n < 0 or n > max_member:
      raise UserError(f'{archive}: member {name!r} declares {n:,} bytes, more than the {max_member:,} allowed; '
                      'refused (nothing unpacked): not the published archive')
  total = sum(n for _, n in sizes)
  if total > max_total:
    raise UserError(f'{archive}: its members declare {total:,} bytes in all, more than the {max_total:,} allowed; '
                    'refused (nothing unpacked)')
  packed = max(os.path.getsize(archive), 1 << 20)
  if total > max_ratio * packed:
    raise UserError(f'{archive}: its members declare {total:,} bytes, {total / packed:,.0f} times the archive\'s '
                    f'{os.path.getsize(archive):,} (image data sets compress less than {max_ratio:.0f}x): a '
                    'decompression bomb or not the published archive; refused (nothing unpacked)')
  free = shutil.disk_usage(root).free
  if total > free - FREE_MARGIN:
    raise UserError(f'{archive}: unpacking needs {total / 2**30:,.2f} GiB, {root} has {free / 2**30:,.2f} GiB free '
                    f'(keeping {FREE_MARGIN / 2**30:.0f} GiB); free some space or unpack elsewhere (nothing unpacked)')


def _copy_bounded(src, out_path: str, declared: int, archive: str, name: str) -> None:
  """Copies at most `declared` bytes; a member holding more than it declares is refused (its file removed)."""
  left = declared
  with open(out_path, 'wb') as out:
    while True:
      block = src.read(min(CHUNK, left + 1))
      if not block:
        break
      if len(block) > left:
        out.close()
        os.remove(out_path)
        raise UserError(f'{archive}: member {name!r} holds more than the {declared:,} bytes it declares; refused')
      out.write(block)
      left -= len(block)


def unpack(archive: str, dest: str, max_member: int = MAX_MEMBER, max_total: int = MAX_TOTAL,
           max_ratio: float = MAX_RATIO) -> list[str]:
  """Extracts `archive` under `dest` after checking every member (module docstring); the member names."""
  root = os.path.realpath(dest)
  os.makedirs(root, exist_ok=True)
  if zipfile.is_zipfile(archive):
    with zipfile.ZipFile(archive) as z:
      infos = z.infolist()
      for info in infos:
        _check_name(archive, info.filename, root)
        if (info.external_attr >> 16) & 0o170000 == 0o120000:   # a symbolic link stored in the zip
          raise UserError(f'{archive}: member {info.filename!r} is a symbolic link; refused (nothing unpacked)')
      _check_sizes(archive, [(i.filename, i.file_size) for i in infos], root, max_member, max_total, max_ratio)
      for info in infos:
        out = os.path.join(root, info.filename)
        if info.is_dir():
          os.makedirs(out, exist_ok=True)
          continue
        os.makedirs(os.path.dirname(out), exist_ok=True)
        try:
          with z.open(info) as src:
            _copy_bounded(src, out, info.file_size, archive, info.filename)
        except (zipfile.BadZipFile, zlib.error, EOFError) as e:
          raise UserError(f'{archive}: member {info.filename!r} is corrupt ({e}); delete the archive and fetch '
                          'again') from None
      return [i.filename for i in infos]
  try:
    tf = tarfile.open(archive)  # pylint: disable=consider-using-with
  except tarfile.TarError as e:
    raise UserError(f'{archive}: neither a zip nor a tar archive ({e}); delete it and fetch again') from None
  with tf:
    try:
      members = tf.getmembers()
    except (tarfile.TarError, EOFError, zlib.error, OSError) as e:
      raise UserError(f'{archive}: a cut or corrupt tar archive ({type(e).__name__}: {e}); delete it and fetch '
                      'again (nothing unpacked)') from None
    for m in members:
      _check_name(archive, m.name, root)
      if not (m.isfile() or m.isdir()):
        raise UserError(f'{archive}: member {m.name!r} is a link or a device; refused (nothing unpacked)')
    _check_sizes(archive, [(m.name, m.size) for m in members if m.isfile()], root, max_member, max_total, max_ratio)
    for m in members:
      out = os.path.join(root, m.name)
      if m.isdir():
        os.makedirs(out, exist_ok=True)
        continue
      os.makedirs(os.path.dirname(out), exist_ok=True)
      src = tf.extractfile(m)
      try:
        _copy_bounded(src, out, m.size, archive, m.name)
      except (tarfile.TarError, EOFError, zlib.error, OSError) as e:
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
          raise UserError(f'{archive}: the disk under {root} is full; free some space and run again') from None
        raise UserError(f'{archive}: member {m.name!r} is cut or corrupt ({type(e).__name__}); delete the archive '
                        'and fetch again') from None
    return [m.name for m in members]
