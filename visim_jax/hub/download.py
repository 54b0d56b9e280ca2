"""Downloading one file so that only a complete, checked file is ever kept.

`download(url, dest, sha256, size)`:
  * offline (VISIM_OFFLINE=1 or HF_HUB_OFFLINE=1): never opens a connection; a missing file is one UserError
    naming what to run where the network is allowed;
  * Hugging Face files (`https://huggingface.co/<repo>/resolve/<rev>/<file>`) go through huggingface_hub's
    `hf_hub_download` (its size check, resume, file lock and the cache layout users know), then the blob's sha256 is
    checked against its LFS ETag (huggingface_hub names the blob by it but does not re-hash it) and the file is
    linked (or copied) to `dest`;
  * other URLs (`requests`, whose urllib3 enforces Content-Length: a body shorter than announced is an error, not
    an end) go through our loop, kept because no library covers the rest: one lock per destination (a second fetch
    of the same file waits, then finds it complete); `dest.part` written, resumed only when the server proves it is
    the same file (`Range` with `If-Range:` the ETag or Last-Modified recorded when the part began, in
    `dest.part.json`; no validator, or a 200 answer: started again from byte 0); complete only when the length is
    known and matches (Content-Length / Content-Range total, the published size; a chunked body ends with its last
    chunk) and the sha256 matches where one is published;
  * before a file is kept (and when an existing `dest` is reused): the content type (an HTML page is never a
    checkpoint) and the format that its name promises (`format_problem`: zip / npz / pth central directory, a
    gzip stream that ends, safetensors header and size, JSON that parses): a lying Content-Length or an error
    page fails here, is removed, and the next run fetches again;
  * time is bounded: `deadline` seconds in all (default max(1 h, length / 256 KiB/s)) and a stall rule (less than
    `min_rate` bytes/s over `stall_s` seconds), each a one-line error that keeps the part for a rerun; progress is a
    tqdm bar on a terminal and one line every `report_s` seconds otherwise.
`VISIM_FETCH_BASE_URL` (tests only) sends every request to that server instead: `https://host/path` is fetched
as `$VISIM_FETCH_BASE_URL/host/path`, so a local server can serve each source's exact layout.

`unpack` (hub/unpack.py) and `format_problem` (hub/formats.py) are re-exported here.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
import urllib.parse

from visim_jax.core.errors import UserError
from visim_jax.hub.formats import format_problem, proves_end
from visim_jax.hub.unpack import unpack  # noqa: F401  pylint: disable=unused-import (fetch.py's name)

CHUNK = 1 << 20
BASE_URL_ENV = 'VISIM_FETCH_BASE_URL'
_TRUE = ('1', 'true', 'yes', 'on')
MIN_RATE = 1024          # bytes/s averaged over STALL_S: below this a transfer is a stall
STALL_S = 120.0
REPORT_S = 30.0
_HF = re.compile(r'^https://huggingface\.co/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$')


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


# --------------------------------------------------------------------------------------------- the lock

@contextlib.contextmanager
def _dest_lock(dest: str, deadline: float):
  """One process at a time per destination (fcntl lock on a file outside the destination's folder)."""
  import fcntl  # pylint: disable=g-import-not-at-top
  folder = os.path.join(tempfile.gettempdir(), f'visim_jax-locks-{os.getuid()}')
  os.makedirs(folder, exist_ok=True)
  key = hashlib.sha256(os.path.abspath(dest).encode()).hexdigest()[:32]
  with open(os.path.join(folder, key + '.lock'), 'a+') as fh:
    t0, said = time.monotonic(), False
    while True:
      try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        break
      except OSError as e:
        if e.errno not in (errno.EAGAIN, errno.EACCES):
          raise
      if not said:
        print(f'{dest}: another process is downloading it; waiting', file=sys.stderr, flush=True)
        said = True
      if time.monotonic() - t0 > deadline:
        raise UserError(f'{dest}: another process has been downloading it for {deadline:.0f} s; wait for it, or stop '
                        'it and run again') from None
      time.sleep(0.2)
    try:
      yield
    finally:
      fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


# --------------------------------------------------------------------------------------------- transfer

class _Interrupted(Exception):
  """The transfer ended before the file did (or too slowly): resumable."""


class _Progress:
  """tqdm on a terminal; one line every REPORT_S seconds otherwise."""

  def __init__(self, desc: str, total: int | None, initial: int, progress: bool, report_s: float):
    self.desc, self.total, self.got, self.report_s = desc, total, initial, report_s
    self.bar = None
    self.lines = progress and not sys.stderr.isatty()
    self.t_last = time.monotonic()
    if progress and not self.lines:
      from tqdm.auto import tqdm  # pylint: disable=g-import-not-at-top
      self.bar = tqdm(total=total, initial=initial, desc=desc, unit='B', unit_scale=True, leave=False)

  def update(self, n: int) -> None:
    self.got += n
    if self.bar is not None:
      self.bar.update(n)
    elif self.lines and time.monotonic() - self.t_last >= self.report_s:
      self.t_last = time.monotonic()
      of = f' of {self.total / 2**20:,.1f} MiB ({100 * self.got / self.total:.0f}%)' if self.total else ''
      print(f'{self.desc}: {self.got / 2**20:,.1f} MiB{of}', file=sys.stderr, flush=True)

  def close(self) -> None:
    if self.bar is not None:
      self.bar.close()


def _read_sidecar(path: str) -> dict:
  try:
    with open(path, encoding='utf-8') as f:
      d = json.load(f)
    return d if isinstance(d, dict) else {}
  except (OSError, ValueError):
    return {}


def _validator(headers) -> dict:
  etag = headers.get('ETag')
  if etag and etag.startswith('W/'):   # a weak ETag cannot make a Range request conditional (RFC 9110 13.1.5)
    etag = None
  return {k: v for k, v in (('etag', etag), ('last_modified', headers.get('Last-Modified'))) if v}


def _transfer(url: str, part: str, desc: str, progress: bool, timeout: float, clock: dict) -> None:
  """Writes or resumes `part` from `url` until the file's announced end (module docstring)."""
  import requests  # pylint: disable=g-import-not-at-top
  import urllib3  # pylint: disable=g-import-not-at-top
  side = part + '.json'
  have = os.path.getsize(part) if os.path.exists(part) else 0
  known = _read_sidecar(side) if have else {}
  headers = {'User-Agent': 'visim_jax-fetch', 'Accept-Encoding': 'identity'}
  if have and known.get('url') == url and (known.get('etag') or known.get('last_modified')):
    headers['Range'] = f'bytes={have}-'
    headers['If-Range'] = known.get('etag') or known['last_modified']
  else:   # nothing to resume, or no proof that the server still has the same file: from byte 0
    have = 0
  try:
    resp = requests.get(effective_url(url), headers=headers, stream=True, timeout=timeout, allow_redirects=True)
  except requests.RequestException as e:
    raise UserError(f'{url}: cannot connect ({type(e).__name__}: {" ".join(str(e).split())[:120]}); check the '
                    'network, or fetch it where the network is allowed and copy the file') from None
  with resp:
    if resp.status_code == 416 and have:   # the part is already as long as the file (or longer): start again
      os.remove(part)
      resp.close()
      return _transfer(url, part, desc, progress, timeout, clock)
    if resp.status_code >= 400:
      raise UserError(f'{url}: HTTP {resp.status_code} {resp.reason}; check the address (visim_jax/hub/sources.py) '
                      'or try later')
    ctype = resp.headers.get('Content-Type', '').split(';')[0].strip().lower()
    if ctype == 'text/html' and not url.lower().endswith(('.html', '.htm')):
      raise UserError(f'{url}: the server sent an HTML page (Content-Type text/html), not the file: an error or '
                      'login page; check the address or try later (nothing kept)')
    length = resp.headers.get('Content-Length')
    if resp.status_code == 206 and have:   # the rest of the same file: Content-Range must start where we are
      m = re.match(r'bytes (\d+)-(\d+)/(\d+)$', resp.headers.get('Content-Range', '').strip())
      if not m or int(m.group(1)) != have or (known.get('total') and int(m.group(3)) != known['total']):
        resp.close()
        os.remove(part)
        return _transfer(url, part, desc, progress, timeout, clock)
      total = int(m.group(3))
    else:   # 200: the whole file (If-Range saw another version, or the server ignores Range)
      have = 0
      total = int(length) if length is not None and length.isdigit() else None
      with open(side, 'w', encoding='utf-8') as f:
        json.dump({'url': url, 'total': total, **_validator(resp.headers)}, f)
    chunked = 'chunked' in resp.headers.get('Transfer-Encoding', '').lower()
    if clock.get('deadline') is None:
      clock['deadline'] = max(3600.0, (total or 0) / (256 * 1024))
    bar = _Progress(desc, total, have, progress, clock['report_s'])
    got, window = have, [(time.monotonic(), have)]
    try:
      with open(part, 'ab' if have else 'wb') as f:
        try:
          while True:
            try:   # read1: what has arrived (a slow server cannot hold one read for ever); urllib3 raises on a
              block = resp.raw.read1(CHUNK, decode_content=False)   # body shorter than its Content-Length
            except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as e:
              raise _Interrupted(f'{type(e).__name__} after {got} bytes') from None
            if not block:
              break
            f.write(block)
            got += len(block)
            bar.update(len(block))
            _check_time(url, part, got, time.monotonic(), window, clock)
        finally:
          f.flush()
          os.fsync(f.fileno())
    finally:
      bar.close()
  if total is not None and got != total:
    raise _Interrupted(f'{got} of {total} bytes')
  if total is None and not chunked:
    clock['unproven'] = True   # no length, no chunks: the end of the connection may be a cut (checked by the caller)


def _check_time(url: str, part: str, got: int, now: float, window: list, clock: dict) -> None:
  if now - clock['t0'] > clock['deadline']:
    raise UserError(f'{url}: not finished within the deadline of {clock["deadline"]:.0f} s ({got} bytes so far, '
                    f'kept in {part}); run the same command again to resume, on a faster network')
  window.append((now, got))
  while len(window) > 2 and now - window[1][0] >= clock['stall_s']:
    window.pop(0)
  t_old, b_old = window[0]
  if now - t_old >= clock['stall_s'] and (got - b_old) / (now - t_old) < clock['min_rate']:
    raise _Interrupted(f'stalled: {got - b_old} bytes in the last {now - t_old:.0f} s (below {clock["min_rate"]} '
                       'bytes/s)')


def _hf_download(url: str, dest: str, m: re.Match, sha256: str | None, size: int | None, timeout: float) -> str:
  """A Hugging Face file through huggingface_hub (module docstring), checked, then linked or copied to `dest`."""
  from huggingface_hub import hf_hub_download  # pylint: disable=g-import-not-at-top
  from huggingface_hub import errors as hf_errors  # pylint: disable=g-import-not-at-top
  import requests  # pylint: disable=g-import-not-at-top
  base = os.environ.get(BASE_URL_ENV, '').rstrip('/')
  try:
    path = hf_hub_download(m['repo'], urllib.parse.unquote(m['file']), revision=m['rev'], etag_timeout=timeout,
                           endpoint=f'{base}/huggingface.co' if base else None)
  except (hf_errors.HfHubHTTPError, hf_errors.LocalEntryNotFoundError, requests.RequestException, OSError,
          ValueError) as e:
    raise UserError(f'{url}: {type(e).__name__}: {" ".join(str(e).split())[:160]}; check the address or the network, '
                    'then run again') from None
  blob = os.path.realpath(path)
  etag, digest, got = os.path.basename(blob), sha256_of(blob), os.path.getsize(blob)
  why = (f'sha256 {digest} is not its LFS ETag {etag}' if re.fullmatch(r'[0-9a-f]{64}', etag) and digest != etag
         else f'{got} bytes received, {size} published' if size is not None and got != size
         else f'sha256 {digest} is not the published {sha256}' if not _digest_matches(digest, sha256)
         else format_problem(blob))
  if why:
    os.remove(blob)
    raise UserError(f'{url}: {why}; the download was removed, run again (or report it if it persists)')
  tmp = dest + '.part'
  with contextlib.suppress(FileNotFoundError):
    os.remove(tmp)
  try:
    os.link(blob, tmp)
  except OSError:
    shutil.copyfile(blob, tmp)
  os.replace(tmp, dest)
  return dest


def download(url: str, dest: str, sha256: str | None = None, size: int | None = None, *, what: str = '',
             progress: bool = True, retries: int = 2, timeout: float = 60.0, deadline: float | None = None,
             min_rate: float = MIN_RATE, stall_s: float = STALL_S, report_s: float = REPORT_S) -> str:
  """`dest`, downloaded from `url` unless a complete, checked copy is there (module docstring); its path."""
  fetch_hint = what or f'python -m visim_jax.fetch (for {os.path.basename(dest)})'
  if os.path.isfile(dest):
    if (sha256 is None or _digest_matches(sha256_of(dest), sha256)) and not format_problem(dest, full=False):
      return dest
    os.remove(dest)   # a stale, corrupt or error-page copy under the final name: fetched again below
  if offline():
    raise UserError(f'{dest}: not here and the network is off (VISIM_OFFLINE / HF_HUB_OFFLINE); run `{fetch_hint}` '
                    'where the network is allowed, or unset them')
  os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
  m = _HF.match(url)
  if m:
    return _hf_download(url, dest, m, sha256, size, timeout)
  part = dest + '.part'
  clock = {'t0': time.monotonic(), 'deadline': deadline, 'min_rate': min_rate, 'stall_s': stall_s,
           'report_s': report_s}
  with _dest_lock(dest, deadline or 3600.0):
    if os.path.isfile(dest) and (sha256 is None or _digest_matches(sha256_of(dest), sha256)) \
       and not format_problem(dest, full=False):
      return dest   # another process finished it while we waited
    for attempt in range(retries + 1):
      if clock['deadline'] is not None and time.monotonic() - clock['t0'] > clock['deadline']:
        raise UserError(f'{url}: not finished within the deadline of {clock["deadline"]:.0f} s ({part} is kept); run '
                        'the same command again to resume, on a faster network')
      try:
        _transfer(url, part, os.path.basename(dest), progress, timeout, clock)
        break
      except _Interrupted as e:
        if attempt == retries:
          raise UserError(f'{url}: the transfer was cut short ({e}); run the same command again to resume '
                          f'({part} is kept for that)') from None
    got = os.path.getsize(part)

    def drop(msg: str) -> UserError:
      for p in (part, part + '.json'):
        with contextlib.suppress(FileNotFoundError):
          os.remove(p)
      return UserError(f'{url}: {msg}')
    if size is not None and got != size:
      raise drop(f'{got} bytes received, {size} published; the file was removed, run again')
    digest = sha256_of(part) if sha256 is not None else None   # no published checksum: no full re-read (58 GB)
    if digest is not None and not _digest_matches(digest, sha256):
      raise drop(f'sha256 {digest} is not the published {sha256}; the download was removed (a changed or corrupt '
                 'file): run again, or report it if it persists')
    why = format_problem(part)
    if why:
      raise drop(f'{why}; the download was removed (nothing kept): run again, or report it if it persists')
    if clock.get('unproven') and sha256 is None and size is None and not proves_end(part):
      raise drop(f'the server sent no length and the connection ended after {got} bytes: a complete file cannot '
                 'be told from a cut one (nothing kept); run again, or fetch it with another tool')
    os.replace(part, dest)
    with contextlib.suppress(FileNotFoundError):
      os.remove(part + '.json')
  return dest
