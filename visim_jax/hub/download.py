"""Downloading one file safely (stdlib urllib), and unpacking an archive without letting it write outside its folder.

`download(url, dest, sha256, size)`:
  * offline (VISIM_OFFLINE=1 or HF_HUB_OFFLINE=1): never opens a connection; a missing file is one UserError
    naming what to run where the network is allowed;
  * writes `dest.part`, resumes it with an HTTP Range request when it exists (a server that ignores Range
    restarts it from byte 0), fsyncs it and renames it to `dest` only once it is complete: `dest` never holds a
    partial file; an interrupted transfer leaves `dest.part` for the next call (retried `retries` times at once);
  * checks the length (Content-Length / the published size) and the sha256 (a full digest or a hex prefix): a
    wrong checksum deletes the part file and refuses in one line;
  * shows a tqdm progress bar.
`VISIM_FETCH_BASE_URL` (tests only) sends every request to that server instead: `https://host/path` is fetched
as `$VISIM_FETCH_BASE_URL/host/path`, so a local server can serve each source's exact layout.

`unpack(archive, dest)`: .zip / .tar(.gz, .bz2, .xz) members checked before anything is written: no absolute
path, no `..`, no link or device (tar), nothing that resolves outside `dest`; then extracted.
"""
from __future__ import annotations

import hashlib
import http.client
import os
import tarfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile

from visim_jax.core.errors import UserError

CHUNK = 1 << 20
BASE_URL_ENV = 'VISIM_FETCH_BASE_URL'
_TRUE = ('1', 'true', 'yes', 'on')


def offline() -> bool:
  """VISIM_OFFLINE or HF_HUB_OFFLINE set: nothing may touch the network."""
  return any(os.environ.get(k, '').strip().lower() in _TRUE for k in ('VISIM_OFFLINE', 'HF_HUB_OFFLINE'))


def effective_url(url: str) -> str:
  """`url`, or its path on the test server named by VISIM_FETCH_BASE_URL (module docstring)."""
  base = os.environ.get(BASE_URL_ENV, '').rstrip('/')
  if not base:
    return url
  u = urllib.parse.urlsplit(url)
  return f'{base}/{u.netloc}{u.path}'


def _digest_matches(digest: str, expected: str | None) -> bool:
  return expected is None or digest.startswith(expected.lower())


def sha256_of(path: str) -> str:
  h = hashlib.sha256()
  with open(path, 'rb') as f:
    for block in iter(lambda: f.read(CHUNK), b''):
      h.update(block)
  return h.hexdigest()


class _Interrupted(Exception):
  """The connection ended before the announced length: resumable."""


def _transfer(url: str, part: str, desc: str, progress: bool, timeout: float) -> None:
  """Appends the rest of `url` to `part` (Range from its length), until the server's announced end."""
  have = os.path.getsize(part) if os.path.exists(part) else 0
  req = urllib.request.Request(effective_url(url), headers={'User-Agent': 'visim_jax-fetch'})
  if have:
    req.add_header('Range', f'bytes={have}-')
  try:
    resp = urllib.request.urlopen(req, timeout=timeout)  # pylint: disable=consider-using-with
  except urllib.error.HTTPError as e:
    if e.code == 416 and have:   # the part file is already whole (or longer than the file): start again
      os.remove(part)
      return _transfer(url, part, desc, progress, timeout)
    raise UserError(f'{url}: HTTP {e.code} {e.reason}; check the address (visim_jax/hub/sources.py) or try later') from None
  except (urllib.error.URLError, OSError) as e:
    reason = getattr(e, 'reason', e)
    raise UserError(f'{url}: cannot connect ({reason}); check the network, or fetch it where the network is allowed '
                    'and copy the weights folder') from None
  from tqdm.auto import tqdm  # pylint: disable=g-import-not-at-top
  with resp:
    if have and resp.status != 206:  # Range ignored: the whole file comes again
      have = 0
    length = resp.headers.get('Content-Length')
    total = have + int(length) if length is not None else None
    mode = 'ab' if have else 'wb'
    got = have
    with open(part, mode) as f, tqdm(total=total, initial=have, desc=desc, unit='B', unit_scale=True,
                                     disable=not progress, leave=False) as bar:
      while True:
        try:
          block = resp.read(CHUNK)
        except (OSError, http.client.HTTPException) as e:   # reset or closed mid-body (IncompleteRead)
          f.flush()
          os.fsync(f.fileno())
          raise _Interrupted(f'{type(e).__name__} after {got} bytes') from None
        if not block:
          break
        f.write(block)
        got += len(block)
        bar.update(len(block))
      f.flush()
      os.fsync(f.fileno())
  if total is not None and got < total:
    raise _Interrupted(f'{got} of {total} bytes')


def download(url: str, dest: str, sha256: str | None = None, size: int | None = None, *, what: str = '',
             progress: bool = True, retries: int = 2, timeout: float = 60.0) -> str:
  """`dest`, downloaded from `url` unless a complete, checked copy is there (module docstring); its path."""
  fetch_hint = what or f'python -m visim_jax.fetch (for {os.path.basename(dest)})'
  if os.path.isfile(dest):
    if sha256 is None or _digest_matches(sha256_of(dest), sha256):
      return dest
    os.remove(dest)   # a stale or corrupt copy under the final name: fetched again below
  if offline():
    raise UserError(f'{dest}: not here and the network is off (VISIM_OFFLINE / HF_HUB_OFFLINE); run `{fetch_hint}` '
                    'where the network is allowed, or unset them')
  os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
  part = dest + '.part'
  desc = os.path.basename(dest)
  for attempt in range(retries + 1):
    try:
      _transfer(url, part, desc, progress, timeout)
      break
    except _Interrupted as e:
      if attempt == retries:
        raise UserError(f'{url}: the transfer was cut short ({e}); run the same command again to resume '
                        f'({part} is kept for that)') from None
  got = os.path.getsize(part)
  if size is not None and got != size:
    os.remove(part)
    raise UserError(f'{url}: {got} bytes received, {size} published; the file was removed, run again')
  digest = sha256_of(part)
  if not _digest_matches(digest, sha256):
    os.remove(part)
    raise UserError(f'{url}: sha256 {digest} is not the published {sha256}; the download was removed (a changed or '
                    'corrupt file): run again, or report it if it persists')
  os.replace(part, dest)
  return dest


# ------------------------------------------------------------------------------------------------ unpacking

def _inside(root: str, name: str) -> bool:
  target = os.path.realpath(os.path.join(root, name))
  return target == root or target.startswith(root + os.sep)


def _check_name(archive: str, name: str, root: str) -> None:
  parts = name.replace('\\', '/').split('/')
  if name.startswith(('/', '\\')) or os.path.isabs(name) or (len(name) > 1 and name[1] == ':') or '..' in parts \
     or not _inside(root, name):
    raise UserError(f'{archive}: member {name!r} would be written outside {root}; refused (nothing unpacked)')


def unpack(archive: str, dest: str) -> list[str]:
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
      z.extractall(root)
      return [i.filename for i in infos]
  try:
    tf = tarfile.open(archive)  # pylint: disable=consider-using-with
  except tarfile.TarError as e:
    raise UserError(f'{archive}: neither a zip nor a tar archive ({e}); delete it and fetch again') from None
  with tf:
    members = tf.getmembers()
    for m in members:
      _check_name(archive, m.name, root)
      if not (m.isfile() or m.isdir()):
        raise UserError(f'{archive}: member {m.name!r} is a link or a device; refused (nothing unpacked)')
    if hasattr(tarfile, 'data_filter'):
      tf.extractall(root, members=members, filter='data')
    else:  # pragma: no cover - Python < 3.11.4
      tf.extractall(root, members=members)  # nosec: every member checked above
    return [m.name for m in members]
