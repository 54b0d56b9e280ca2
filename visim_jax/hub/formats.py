"""What a downloaded file must look like before it is kept: `format_problem(path)` says what is wrong with a file
for the format its name promises (None: fine, or no rule for that name).

An HTML / XML page is never a download (an error or login page served with 200); .zip / .npz / torch's zip .pth
must have a readable central directory (a file cut short has none); .tar.gz / .gz must be a gzip stream that
reaches its end (full=True decompresses it once: ~0.3 s per 100 MB; full=False checks the magic bytes only);
.safetensors must have a JSON header whose tensors end exactly at the end of the file; .json must parse. These are
also the formats whose own structure proves that a file is whole (`proves_end`), when a server sends no length.
"""
from __future__ import annotations

import json
import os
import struct
import zipfile
import zlib

CHUNK = 1 << 20
WHOLE = ('.zip', '.npz', '.tar.gz', '.tgz', '.gz', '.safetensors', '.json')


def _zip_problem(path: str) -> str | None:
  try:
    with zipfile.ZipFile(path) as z:
      z.infolist()
  except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
    return f'not a complete zip archive ({" ".join(str(e).split())[:80]})'
  return None


def _gzip_problem(path: str, full: bool) -> str | None:
  with open(path, 'rb') as f:
    if f.read(2) != b'\x1f\x8b':
      return 'not a gzip file (no 1f 8b magic bytes)'
    if not full:
      return None
    f.seek(0)
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
      for block in iter(lambda: f.read(CHUNK), b''):
        while block and not d.eof:
          d.decompress(block, CHUNK)
          block = d.unconsumed_tail
          if d.eof:
            break
        if d.eof:
          break
    except zlib.error as e:
      return f'a corrupt gzip stream ({e})'
  return None if d.eof else 'a gzip stream that stops before its end (a cut or changed download)'


def _safetensors_problem(path: str) -> str | None:
  size = os.path.getsize(path)
  with open(path, 'rb') as f:
    head = f.read(8)
    if len(head) < 8:
      return 'too short for a safetensors file'
    (n,) = struct.unpack('<Q', head)
    if n > min(size - 8, 100 << 20):
      return f'not a safetensors file (header length {n} for a {size}-byte file)'
    try:
      header = json.loads(f.read(n))
    except ValueError:
      return 'not a safetensors file (its header is not JSON)'
  if not isinstance(header, dict):
    return 'not a safetensors file (its header is not a JSON object)'
  ends = [v.get('data_offsets', [0, 0])[1] for k, v in header.items() if k != '__metadata__' and isinstance(v, dict)]
  want = 8 + n + max(ends, default=0)
  if want != size:
    return f'a safetensors file of {size} bytes whose header describes {want}: cut short or padded'
  return None


def _json_problem(path: str) -> str | None:
  try:
    with open(path, encoding='utf-8-sig') as f:
      json.load(f)
  except (ValueError, UnicodeDecodeError) as e:
    return f'not JSON ({" ".join(str(e).split())[:60]})'
  return None


def format_problem(path: str, full: bool = True) -> str | None:
  """What is wrong with `path` for the format its name promises (None: fine or no rule). An HTML page is never a
  download; full=False: the cheap checks only (an existing file about to be reused)."""
  with open(path, 'rb') as f:
    start = f.read(512).lstrip().lower()
  name = path[:-len('.part')] if path.endswith('.part') else path
  low = name.lower()
  if not low.endswith(('.html', '.htm')) and start.startswith((b'<!doctype html', b'<html', b'<?xml', b'<head')):
    return 'an HTML / XML page, not the file (an error or login page served with 200)'
  if low.endswith(('.zip', '.npz')):
    return _zip_problem(path)
  if low.endswith(('.pth', '.pt', '.pth.tar', '.bin', '.ckpt')) and start[:2] == b'pk':
    return _zip_problem(path)          # torch's zip format (legacy pickles: no end to check)
  if low.endswith(('.tar.gz', '.tgz', '.gz')):
    return _gzip_problem(path, full)
  if low.endswith('.safetensors'):
    return _safetensors_problem(path)
  if low.endswith('.json'):
    return _json_problem(path)
  return None


def proves_end(path: str) -> bool:
  """The file's own format proves that it is whole (zip directory, gzip end, safetensors sizes, JSON)."""
  low = path[:-len('.part')].lower() if path.endswith('.part') else path.lower()
  return low.endswith(WHOLE)
