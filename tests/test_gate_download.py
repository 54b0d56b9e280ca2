"""The download and unpack gate against a hostile corpus made here: lying and slow servers on 127.0.0.1 (a
Content-Length of half the body, no length and a dropped connection, a file changed between two attempts, an HTML
error page served with 200, one byte at a time), two fetches of one file at once, and archive bombs (a member far
larger than its archive, a size beyond the disk's free space). Each case ends in one line or in the right file,
within a few seconds, and writes at most a few MB (hub/download.py, hub/formats.py, hub/unpack.py)."""
import gzip
import hashlib
import http.server
import io
import os
import tarfile
import threading
import time
import urllib.parse
import zipfile

import pytest

from user_errors import refused
from visim_jax.hub import download, unpack as unpack_lib


class Lying:
  """{path: body} with per-path lies: 'half_length' (Content-Length = half the body, the whole body sent),
  'no_length_drop' (no Content-Length, half the body, then the connection closes), 'drop_once' (the first answer
  sends half of an honest length), 'html' (an error page with 200), 'slow' (one byte every 0.2 s),
  'no_validator' (no ETag / Last-Modified), 'cut' (half of an honest length, every time), 'silent' (the headers, then
  no byte for 5 s)."""

  def __init__(self):
    self.files, self.modes, self.requests = {}, {}, []
    srv = self

    class Handler(http.server.BaseHTTPRequestHandler):
      protocol_version = 'HTTP/1.0'

      def log_message(self, *args):
        pass

      def do_HEAD(self):  # pylint: disable=invalid-name  (huggingface_hub's metadata: commit, ETag = LFS sha256)
        path = urllib.parse.urlsplit(self.path).path
        body, mode = srv.files.get(path), srv.modes.get(path, '')
        if body is None:
          self.send_error(404)
          return
        sha = hashlib.sha256(body if mode != 'hf_wrong_sha' else b'another file').hexdigest()
        self.send_response(200)
        self.send_header('Content-Length', str(len(body)))
        self.send_header('X-Repo-Commit', '1' * 40)
        self.send_header('ETag', f'"{sha}"')
        self.end_headers()

      def do_GET(self):  # pylint: disable=invalid-name
        path = urllib.parse.urlsplit(self.path).path
        srv.requests.append((path, self.headers.get('Range'), self.headers.get('If-Range')))
        body, mode = srv.files.get(path), srv.modes.get(path, '')
        if body is None:
          self.send_error(404)
          return
        etag = '"' + hashlib.sha256(body).hexdigest()[:16] + '"'
        if mode == 'html':
          page = b'<!DOCTYPE html><html><body>Service unavailable</body></html>'
          self.send_response(200)
          self.send_header('Content-Type', 'text/html')
          self.send_header('Content-Length', str(len(page)))
          self.end_headers()
          self.wfile.write(page)
          return
        start, rng = 0, self.headers.get('Range')
        if rng and self.headers.get('If-Range') == etag:
          start = int(rng.split('=')[1].split('-')[0])
          self.send_response(206)
          self.send_header('Content-Range', f'bytes {start}-{len(body) - 1}/{len(body)}')
        else:
          self.send_response(200)
        rest = body[start:]
        if mode != 'no_validator':
          self.send_header('ETag', etag)
        if mode == 'half_length':
          self.send_header('Content-Length', str(len(rest) // 2))
        elif mode != 'no_length_drop':
          self.send_header('Content-Length', str(len(rest)))
        self.end_headers()
        if mode == 'silent':
          time.sleep(5)
          return
        if mode in ('no_length_drop', 'drop_once', 'cut'):
          if mode == 'drop_once':
            srv.modes[path] = ''
          self.wfile.write(rest[:len(rest) // 2])
          return
        if mode == 'slow':
          for b in rest:
            self.wfile.write(bytes([b]))
            self.wfile.flush()
            time.sleep(0.2)
          return
        self.wfile.write(rest)

    self.httpd = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
    self.httpd.daemon_threads = True
    self.base = f'http://127.0.0.1:{self.httpd.server_address[1]}'
    self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)

  def put(self, url: str, body: bytes, mode: str = '') -> None:
    u = urllib.parse.urlsplit(url)
    self.files[f'/{u.netloc}{u.path}'] = body
    self.modes[f'/{u.netloc}{u.path}'] = mode


@pytest.fixture
def lying(monkeypatch):
  s = Lying()
  s.thread.start()
  monkeypatch.setenv(download.BASE_URL_ENV, s.base)
  for k in ('VISIM_OFFLINE', 'HF_HUB_OFFLINE'):
    monkeypatch.delenv(k, raising=False)
  yield s
  s.httpd.shutdown()
  s.httpd.server_close()


def _targz(n: int = 200_000) -> bytes:
  buf = io.BytesIO()
  with tarfile.open(fileobj=buf, mode='w:gz') as tf:
    data = os.urandom(n)
    info = tarfile.TarInfo('jnd/x.bin')
    info.size = len(data)
    tf.addfile(info, io.BytesIO(data))
  return buf.getvalue()


def _zip(members: dict, compression=zipfile.ZIP_STORED) -> bytes:
  buf = io.BytesIO()
  with zipfile.ZipFile(buf, 'w', compression) as z:
    for k, v in members.items():
      z.writestr(k, v)
  return buf.getvalue()


def _left(folder) -> list:
  return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


@pytest.mark.parametrize('name,body', [('jnd.tar.gz', _targz()), ('nights.zip', _zip({'a.bin': os.urandom(100_000)}))])
def test_a_content_length_of_half_the_body_is_never_kept(lying, tmp_path, name, body):
  url = f'https://example.org/data/{name}'
  lying.put(url, body, 'half_length')
  dest = tmp_path / name
  refused(lambda: download.download(url, str(dest), progress=False), url, 'nothing kept')
  assert _left(tmp_path) == []   # no file under its final name, no part: the next run fetches again
  lying.modes.clear()
  download.download(url, str(dest), progress=False)
  assert dest.read_bytes() == body


def test_no_length_and_a_dropped_connection_is_not_complete(lying, tmp_path):
  url = 'https://example.org/models/w-0123abcd.bin'
  lying.put(url, os.urandom(50_000), 'no_length_drop')
  refused(lambda: download.download(url, str(tmp_path / 'w.bin'), progress=False), 'no length', 'nothing kept')
  url2 = 'https://example.org/data/nights.zip'   # a zip: its missing central directory says it is cut
  lying.put(url2, _zip({'a.bin': os.urandom(50_000)}), 'no_length_drop')
  refused(lambda: download.download(url2, str(tmp_path / 'nights.zip'), progress=False), 'not a complete zip')
  assert _left(tmp_path) == []


def test_resume_only_when_the_server_proves_the_same_file(lying, tmp_path):
  url, dest = 'https://example.org/data/jnd.tar.gz', str(tmp_path / 'jnd.tar.gz')
  old, new = _targz(), _targz()
  lying.put(url, old, 'drop_once')
  refused(lambda: download.download(url, dest, retries=0, progress=False), 'cut short', '.part')
  assert os.path.getsize(dest + '.part') == len(old) // 2
  lying.put(url, new)   # the file changed on the server: its ETag too
  download.download(url, dest, progress=False)
  assert open(dest, 'rb').read() == new   # If-Range saw another version: a whole new file, not old + new
  assert lying.requests[-1][1] == f'bytes={len(old) // 2}-' and lying.requests[-1][2]   # asked with If-Range
  assert not os.path.exists(dest + '.part') and not os.path.exists(dest + '.part.json')
  # the same file, resumed: one Range request that appends
  os.remove(dest)
  lying.put(url, old, 'drop_once')
  with pytest.raises(Exception):
    download.download(url, dest, retries=0, progress=False)
  download.download(url, dest, progress=False)
  assert open(dest, 'rb').read() == old and lying.requests[-1][1] == f'bytes={len(old) // 2}-'
  # a server without ETag or Last-Modified: never resumed (no Range sent), fetched whole
  os.remove(dest)
  lying.put(url, old, 'no_validator')
  with open(dest + '.part', 'wb') as f:
    f.write(new[:1000])
  download.download(url, dest, progress=False)
  assert open(dest, 'rb').read() == old and lying.requests[-1][1] is None


@pytest.mark.parametrize('name', ['config.json', 'model.safetensors', 'adapter.npz'])
def test_an_html_error_page_is_never_kept_nor_reused(lying, tmp_path, name):
  url = f'https://example.org/repo/{name}'
  lying.put(url, b'x', 'html')
  dest = tmp_path / name
  refused(lambda: download.download(url, str(dest), progress=False), url, 'HTML')
  assert _left(tmp_path) == []
  dest.write_bytes(b'<!DOCTYPE html><html>old error page</html>')   # left by an older version under the final name
  n = len(lying.requests)
  refused(lambda: download.download(url, str(dest), progress=False), 'HTML')
  assert len(lying.requests) == n + 1 and not dest.exists()   # asked again, nothing reused


def test_a_slow_server_meets_the_deadline_and_the_idle_limit(lying, tmp_path):
  url = 'https://example.org/models/w-0123abcd.bin'
  lying.put(url, os.urandom(200), 'slow')
  t0 = time.monotonic()
  refused(lambda: download.download(url, str(tmp_path / 'w.bin'), progress=False, deadline=1.0), 'deadline')
  assert time.monotonic() - t0 < 5
  # a trickle (5 bytes/s) and a server that sends nothing: abandoned after the idle limit, not retried, the part kept
  # and the command that resumes named
  for mode, dest in (('slow', 'v.bin'), ('silent', 's.bin')):
    lying.put(url, os.urandom(200), mode)
    n, t0 = len(lying.requests), time.monotonic()
    refused(lambda: download.download(url, str(tmp_path / dest), progress=False, min_rate=100, idle_s=0.6,
                                      what='python -m visim_jax.fetch w'),
            'stalled', 'idle limit is 0.6 s', '--idle_s', 'run `python -m visim_jax.fetch w` again to resume')
    assert time.monotonic() - t0 < 3 and len(lying.requests) == n + 1, mode
  assert download.IDLE_S < 60


def test_a_hugging_face_file_cut_mid_way_is_one_line_and_resumes(lying, tmp_path, monkeypatch):
  """huggingface_hub raises its HTTP client's errors (httpx: RemoteProtocolError) once its own retries are spent."""
  import types
  import huggingface_hub.constants
  import huggingface_hub.file_download as hf_fd
  monkeypatch.setattr(huggingface_hub.constants, 'HF_HUB_CACHE', str(tmp_path / 'hf'))
  monkeypatch.setattr(hf_fd, 'time', types.SimpleNamespace(sleep=lambda s: None, time=time.time))   # its 5 x 1 s
  url = 'https://huggingface.co/org/model/resolve/main/model.safetensors'
  header = b'{"w":{"dtype":"F32","shape":[4096],"data_offsets":[0,16384]}}'
  body = len(header).to_bytes(8, 'little') + header + os.urandom(16384)
  lying.put(url, body, 'cut')
  dest = tmp_path / 'w' / 'model.safetensors'
  refused(lambda: download.download(url, str(dest), progress=False, what='python -m visim_jax.fetch m'), url,
          'cut short', 'run `python -m visim_jax.fetch m` again to resume')
  assert not dest.exists()
  lying.modes.clear()   # the server recovers: the rerun is complete
  download.download(url, str(dest), progress=False)
  assert dest.read_bytes() == body


def test_progress_off_a_terminal_is_one_line_at_a_time(lying, tmp_path, capsys):
  url = 'https://example.org/models/w-0123abcd.bin'
  lying.put(url, os.urandom(4 * 2**20))
  download.download(url, str(tmp_path / 'w.bin'), progress=True, report_s=0.0)
  err = capsys.readouterr().err
  assert 'w.bin:' in err and 'MiB' in err and '\r' not in err


def test_two_fetches_of_one_file_at_once(lying, tmp_path):
  url, dest = 'https://example.org/models/w-0123abcd.bin', str(tmp_path / 'w.bin')
  body = os.urandom(20)
  lying.put(url, body, 'slow')   # 4 s of transfer: the second caller waits on the lock, then finds the file
  out, errors = [], []

  def one():
    try:
      out.append(download.download(url, dest, progress=False))
    except Exception as e:  # pylint: disable=broad-except
      errors.append(e)
  threads = [threading.Thread(target=one) for _ in range(2)]
  for t in threads:
    t.start()
    time.sleep(0.3)
  for t in threads:
    t.join(20)
  assert errors == [] and out == [dest, dest] and open(dest, 'rb').read() == body
  assert len([r for r in lying.requests if r[0].endswith('w-0123abcd.bin')]) == 1


# ------------------------------------------------------------------------------------------------ archive bombs

def _du(folder) -> int:
  return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(folder) for f in fs)


def test_a_zip_bomb_is_refused_before_writing(tmp_path):
  path = tmp_path / 'nights.zip'
  path.write_bytes(_zip({'nights/data.csv': b'id\n', 'nights/big.bin': bytes(200 * 2**20)}, zipfile.ZIP_DEFLATED))
  assert path.stat().st_size < 2**20
  refused(lambda: unpack_lib.unpack(str(path), str(tmp_path / 'out')), str(path), 'decompression bomb')
  assert _du(tmp_path / 'out') == 0


def test_a_tar_gz_bomb_and_a_full_disk_are_refused_before_writing(tmp_path, monkeypatch):
  buf = io.BytesIO()
  with tarfile.open(fileobj=buf, mode='w:gz') as tf:
    info = tarfile.TarInfo('jnd/big.bin')
    info.size = 120 * 2**20
    tf.addfile(info, io.BytesIO(bytes(info.size)))
  path = tmp_path / 'jnd.tar.gz'
  path.write_bytes(buf.getvalue())
  refused(lambda: unpack_lib.unpack(str(path), str(tmp_path / 'out')), 'decompression bomb')
  refused(lambda: unpack_lib.unpack(str(path), str(tmp_path / 'out'), max_ratio=1e9, max_member=2**20),
          'jnd/big.bin', 'declares')
  refused(lambda: unpack_lib.unpack(str(path), str(tmp_path / 'out'), max_ratio=1e9, max_total=2**20), 'in all')
  usage = unpack_lib.shutil.disk_usage(str(tmp_path))
  monkeypatch.setattr(unpack_lib.shutil, 'disk_usage',
                      lambda p: usage._replace(free=unpack_lib.FREE_MARGIN + 50 * 2**20))
  refused(lambda: unpack_lib.unpack(str(path), str(tmp_path / 'out'), max_ratio=1e9), 'free')
  assert _du(tmp_path / 'out') == 0


def test_a_member_larger_than_it_declares_is_cut_and_refused(tmp_path):
  data = os.urandom(3 * 2**20)
  raw = _zip({'a.bin': data})
  # the same archive whose headers say 1000 bytes (local header and central directory)
  lie = raw.replace(len(data).to_bytes(4, 'little'), (1000).to_bytes(4, 'little'))
  path = tmp_path / 'lie.zip'
  path.write_bytes(lie)
  with pytest.raises(Exception) as info:
    unpack_lib.unpack(str(path), str(tmp_path / 'out'))
  from visim_jax.core import errors
  assert errors.is_user_error(info.value), repr(info.value)
  assert _du(tmp_path / 'out') <= 1000


def test_gzip_stream_check(tmp_path):
  from visim_jax.hub import formats
  good = tmp_path / 'a.tar.gz'
  good.write_bytes(gzip.compress(os.urandom(10_000)))
  assert formats.format_problem(str(good)) is None
  cut = tmp_path / 'b.tar.gz'
  cut.write_bytes(good.read_bytes()[:5000])
  assert 'stops before its end' in formats.format_problem(str(cut))


def test_hugging_face_files_through_huggingface_hub_with_their_sha256(lying, tmp_path, monkeypatch):
  import huggingface_hub.constants
  monkeypatch.setattr(huggingface_hub.constants, 'HF_HUB_CACHE', str(tmp_path / 'hf'))
  url = 'https://huggingface.co/org/model/resolve/main/config.json'
  lying.put(url, b'{"hidden_size": 8}')
  dest = tmp_path / 'w' / 'config.json'
  download.download(url, str(dest), progress=False)
  assert dest.read_bytes() == b'{"hidden_size": 8}'
  url = 'https://huggingface.co/org/model/resolve/main/model.safetensors'
  lying.put(url, b'\0' * 64, 'hf_wrong_sha')   # the body is not the file its LFS ETag names
  refused(lambda: download.download(url, str(tmp_path / 'w' / 'model.safetensors'), progress=False),
          'not its LFS ETag', 'removed')
  assert not (tmp_path / 'w' / 'model.safetensors').exists()


def test_no_published_checksum_no_full_hash(lying, tmp_path, monkeypatch):
  """A file with no published sha256 (nights.zip, 58 GB) is checked by length and format, never re-read whole to hash
  it; with a published one the hash is checked."""
  body = _zip({'a.bin': os.urandom(50_000)})
  url = 'https://example.org/data/nights.zip'
  lying.put(url, body)
  def no_hash(path):
    raise AssertionError(f'{path} hashed in full without a published checksum')
  dest = tmp_path / 'nights.zip'
  with monkeypatch.context() as m:
    m.setattr(download, 'sha256_of', no_hash)
    download.download(url, str(dest), progress=False)
  assert dest.read_bytes() == body
  lying.put('https://example.org/data/other.zip', body)
  refused(lambda: download.download('https://example.org/data/other.zip', str(tmp_path / 'other.zip'), '0' * 64,
                                    progress=False), 'not the published')
