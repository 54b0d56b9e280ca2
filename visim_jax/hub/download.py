"""Downloading one file so that only a complete, checked file is ever kept.

`download(url, dest, sha256, size)`:
  * offline (VISIM_OFFLINE=1 or HF_HUB_OFFLINE=1): never opens a connection; a missing file is one UserError
    naming what to run where the network is allowed;
  * Hugging Face files (`https://huggingface.co/<repo>/resolve/<rev>/<file>`) go through huggingface_hub's
    `hf_hub_download` (its size check, resume, file lock and the cache layout users know), then the blob's sha256 is
    checked against its LFS ETag (huggingface_hub names the blob by it but does not re-hash it) and the file is
    linked (or copied) to `dest`; a host that cannot be reached is found by one connection attempt first (no proxy
    set), so that huggingface_hub's five backed-off retries (~25 s) and their warnings do not come first, and its
    httpx errors (a connection cut mid-file) end as ours do;
  * other URLs (`requests`, whose urllib3 enforces Content-Length: a body shorter than announced is an error, not
    an end) go through our loop, kept because no library covers the rest: `dest.part` written, resumed only when
    the server proves it is the same file (`Range` with `If-Range:` the ETag or Last-Modified recorded when the part began, in
    `dest.part.json`; no validator, or a 200 answer: started again from byte 0); complete only when the length is
    known and matches (Content-Length / Content-Range total, the published size; a chunked body ends with its last
    chunk) and the sha256 matches where one is published;
  * before a file is kept (and when an existing `dest` is reused): the content type (an HTML page is never a
    checkpoint) and the format that its name promises (`format_problem`: zip / npz / pth central directory, a
    gzip stream that ends, safetensors header and size, JSON that parses): a lying Content-Length or an error
    page fails here, is removed, and the next run fetches again;
  * one lock per destination (hub/lock.py, both paths): a second fetch of the same file waits, then finds it complete;
  * time is bounded: `deadline` seconds in all (default max(1 h, length / 256 KiB/s)) and the idle limit (fewer than
    `min_rate` bytes/s over the last `idle_s` seconds, default 30 s, no byte at all included: the socket's read
    timeout), each a one-line error naming the command that resumes and keeping the part; a stalled transfer is not
    retried (a cut one is, `retries` times); progress is a tqdm bar on a terminal and otherwise a line when the
    transfer starts and one every `report_s` seconds (Hugging Face files too).
`VISIM_FETCH_BASE_URL` (tests only) sends every request to that server instead: `https://host/path` is fetched
as `$VISIM_FETCH_BASE_URL/host/path`, so a local server can serve each source's exact layout.

`unpack` (hub/unpack.py) and `format_problem` (hub/formats.py) are re-exported here.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import sys
import time
import urllib.parse

from visim_jax.core.errors import UserError
from visim_jax.hub.formats import format_problem, proves_end
from visim_jax.hub.lock import lock
from visim_jax.hub.unpack import unpack  # noqa: F401  pylint: disable=unused-import (fetch.py's name)

CHUNK = 1 << 20
BASE_URL_ENV = 'VISIM_FETCH_BASE_URL'
_TRUE = ('1', 'true', 'yes', 'on')
MIN_RATE = 1024          # bytes/s averaged over IDLE_S: below this a transfer is stalled
IDLE_S = 30.0            # the idle limit (python -m visim_jax.fetch --idle_s)
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


# --------------------------------------------------------------------------------------------- transfer

class NotFound(UserError):
  """The server has no such file (HTTP 404, huggingface_hub's EntryNotFoundError)."""


class Unreachable(UserError):
  """The host could not be reached: `url` and `reason` (whole, one line) for the caller's own remedy."""

  def __init__(self, url: str, reason: str):
    super().__init__(f'{url}: cannot connect ({reason}); check the network, or fetch it where the network is allowed '
                     'and copy the file')
    self.url, self.reason = url, reason


class _Interrupted(Exception):
  """The transfer ended before the file did: resumable, retried."""


class _Stalled(_Interrupted):
  """Fewer than min_rate bytes/s over the idle limit: resumable, not retried (the server is as slow the next time)."""


class _Progress:
  """tqdm on a terminal; otherwise a line when the transfer starts and one every `report_s` seconds."""

  def __init__(self, desc: str, total: int | None, initial: int, progress: bool, report_s: float):
    self.desc, self.total, self.got, self.report_s = desc, total, initial, report_s
    self.bar = None
    self.lines = progress and not sys.stderr.isatty()
    self.t_last = time.monotonic()
    if progress and not self.lines:
      from tqdm.auto import tqdm  # pylint: disable=g-import-not-at-top
      self.bar = tqdm(total=total, initial=initial, desc=desc, unit='B', unit_scale=True, leave=False)
    elif self.lines:
      size = f'{total / 2**20:,.1f} MiB' if total else 'size unknown'
      at = f', resuming at {initial / 2**20:,.1f} MiB' if initial else ''
      print(f'{desc}: downloading ({size}{at}; a line every {report_s:g} s)', file=sys.stderr, flush=True)

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


def _line_bar(report_s: float):
  """A tqdm stand-in for huggingface_hub (its `tqdm_class`): the lines _Progress prints off a terminal."""
  class LineBar(_Progress):
    def __init__(self, *_, desc: str = '', total: int | None = None, initial: int = 0, **__):
      super().__init__(desc, total, initial, True, report_s)

    def __enter__(self):
      return self

    def __exit__(self, *exc):
      self.close()
  return LineBar


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
  try:   # connect within `timeout`; then no read waits longer than the idle limit
    resp = requests.get(effective_url(url), headers=headers, stream=True, timeout=(timeout, clock['idle_s']),
                        allow_redirects=True)
  except requests.exceptions.ReadTimeout:
    raise _Stalled(f'no answer within the idle limit of {clock["idle_s"]:g} s') from None
  except requests.RequestException as e:
    raise Unreachable(url, _reason(e)) from None
  with resp:
    if resp.status_code == 416 and have:   # the part is already as long as the file (or longer): start again
      os.remove(part)
      resp.close()
      return _transfer(url, part, desc, progress, timeout, clock)
    if resp.status_code == 404:
      raise NotFound(f'{url}: HTTP 404 {resp.reason}; check the address (visim_jax/hub/sources.py) or try later')
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
            except (requests.exceptions.ReadTimeout, urllib3.exceptions.ReadTimeoutError, TimeoutError):
              raise _Stalled(f'no byte for {clock["idle_s"]:g} s after {got} bytes') from None
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
                    f'kept in {part}); run {clock["resume"]} to resume, on a faster network')
  window.append((now, got))
  while len(window) > 2 and now - window[1][0] >= clock['idle_s']:
    window.pop(0)
  t_old, b_old = window[0]
  if now - t_old >= clock['idle_s'] and (got - b_old) / (now - t_old) < clock['min_rate']:
    raise _Stalled(f'{got - b_old} bytes in the last {now - t_old:.1f} s, below {clock["min_rate"]:g} bytes/s')


def _reason(e: BaseException) -> str:
  """Why a connection failed, whole and on one line: the OS's words where there are some ('Connection refused',
  'Name or service not known'), else the exception's type and message."""
  text = ' '.join(str(e).split())
  m = re.search(r'\[Errno -?\d+\] ([^\'"\])]+)', text)
  if m:
    return m.group(1).strip().rstrip('.')
  return f'{type(e).__name__}: {text}' if text else type(e).__name__


def _probe(url: str, timeout: float) -> None:
  """One TCP connection to the host of `url` (where it is really fetched from): Unreachable at once when there is
  none. Skipped behind a proxy (the host is reached through it)."""
  import socket  # pylint: disable=g-import-not-at-top
  if any(os.environ.get(k) for k in ('https_proxy', 'HTTPS_PROXY', 'http_proxy', 'HTTP_PROXY', 'all_proxy',
                                     'ALL_PROXY')):
    return
  u = urllib.parse.urlsplit(effective_url(url))
  try:
    socket.create_connection((u.hostname, u.port or (443 if u.scheme == 'https' else 80)),
                             timeout=min(timeout, 15.0)).close()
  except OSError as e:
    raise Unreachable(url, e.strerror or _reason(e)) from None


def _transport_errors() -> tuple[type[BaseException], ...]:
  """The HTTP client errors huggingface_hub lets through (httpx2 or httpx, whichever it uses)."""
  out = []
  for mod in ('httpx2', 'httpx'):
    try:
      m = __import__(mod)
    except ImportError:
      continue
    out += [getattr(m, n) for n in ('HTTPError', 'StreamError', 'InvalidURL') if isinstance(getattr(m, n, None), type)]
  return tuple(out)


@contextlib.contextmanager
def _quiet_hub():
  """huggingface_hub's retry warnings ('... thrown while requesting HEAD ...') are not shown: its errors end in our
  one line."""
  import logging  # pylint: disable=g-import-not-at-top
  logger = logging.getLogger('huggingface_hub')
  level = logger.level
  logger.setLevel(logging.ERROR)
  try:
    yield
  finally:
    logger.setLevel(level)


def _hf_download(url: str, dest: str, m: re.Match, sha256: str | None, size: int | None, timeout: float,
                 progress: bool, report_s: float, resume: str) -> str:
  """A Hugging Face file through huggingface_hub (module docstring), checked, then linked or copied to `dest`."""
  from huggingface_hub import hf_hub_download  # pylint: disable=g-import-not-at-top
  from huggingface_hub import errors as hf_errors  # pylint: disable=g-import-not-at-top
  import requests  # pylint: disable=g-import-not-at-top
  base = os.environ.get(BASE_URL_ENV, '').rstrip('/')
  _probe(url, timeout)
  bar = {'tqdm_class': _line_bar(report_s)} if progress and not sys.stderr.isatty() else {}
  try:
    with _quiet_hub():
      path = hf_hub_download(m['repo'], urllib.parse.unquote(m['file']), revision=m['rev'], etag_timeout=timeout,
                             endpoint=f'{base}/huggingface.co' if base else None, **bar)
  except hf_errors.EntryNotFoundError as e:
    raise NotFound(f'{url}: HTTP 404 ({type(e).__name__}); check the address (visim_jax/hub/sources.py)') from None
  except _transport_errors() as e:   # a connection cut mid-file, a read timeout: huggingface_hub resumed 5 times
    raise UserError(f'{url}: the transfer was cut short ({_reason(e)}); run {resume} to resume (the '
                    'Hugging Face cache keeps what arrived)') from None
  except hf_errors.LocalEntryNotFoundError as e:   # no connection (after the probe) and nothing cached
    raise Unreachable(url, _reason(e.__cause__ or e.__context__ or e)) from None
  except (hf_errors.HfHubHTTPError, requests.RequestException, OSError, ValueError) as e:
    raise UserError(f'{url}: {type(e).__name__}: {" ".join(str(e).split())}; check the address or the network, '
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
  tmp = f'{dest}.{os.getpid()}.part'
  with contextlib.suppress(FileNotFoundError):
    os.remove(tmp)
  try:
    os.link(blob, tmp)
  except OSError:
    shutil.copyfile(blob, tmp)
  os.replace(tmp, dest)
  return dest


def _usable(dest: str, sha256: str | None) -> bool:
  return os.path.isfile(dest) and (sha256 is None or _digest_matches(sha256_of(dest), sha256)) \
      and not format_problem(dest, full=False)


def download(url: str, dest: str, sha256: str | None = None, size: int | None = None, *, what: str = '',
             progress: bool = True, retries: int = 2, timeout: float = 60.0, deadline: float | None = None,
             min_rate: float = MIN_RATE, idle_s: float | None = None, report_s: float = REPORT_S) -> str:
  """`dest`, downloaded from `url` unless a complete, checked copy is there (module docstring); its path.
  what: the command that fetches it again (named by every message that asks for a rerun)."""
  idle_s = IDLE_S if idle_s is None else float(idle_s)
  fetch_hint = what or f'python -m visim_jax.fetch (for {os.path.basename(dest)})'
  if os.path.isfile(dest):
    if _usable(dest, sha256):
      return dest
    os.remove(dest)   # a stale, corrupt or error-page copy under the final name: fetched again below
  if offline():
    raise UserError(f'{dest}: not here and the network is off (VISIM_OFFLINE / HF_HUB_OFFLINE); run `{fetch_hint}` '
                    'where the network is allowed, or unset them')
  os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
  m = _HF.match(url)
  part = dest + '.part'
  clock = {'t0': time.monotonic(), 'deadline': deadline, 'min_rate': min_rate, 'idle_s': idle_s,
           'report_s': report_s, 'resume': f'`{what}` again' if what else 'the same command again'}
  with lock(dest, deadline=deadline or 3600.0):
    if _usable(dest, sha256):
      return dest   # another process finished it while we waited
    if m:
      return _hf_download(url, dest, m, sha256, size, timeout, progress, report_s, clock['resume'])
    for attempt in range(retries + 1):
      if clock['deadline'] is not None and time.monotonic() - clock['t0'] > clock['deadline']:
        raise UserError(f'{url}: not finished within the deadline of {clock["deadline"]:.0f} s ({part} is kept); run '
                        f'{clock["resume"]} to resume, on a faster network')
      try:
        _transfer(url, part, os.path.basename(dest), progress, timeout, clock)
        break
      except _Stalled as e:
        raise UserError(f'{url}: stalled ({e}; the idle limit is {idle_s:g} s, `--idle_s` of python -m '
                        f'visim_jax.fetch); run {clock["resume"]} to resume ({part} is kept for that)') from None
      except _Interrupted as e:
        if attempt == retries:
          raise UserError(f'{url}: the transfer was cut short ({e}); run {clock["resume"]} to resume '
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
