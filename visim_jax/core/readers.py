"""The readers every loader uses for user files: bad bytes end as one `UserError` line naming the file (and line).

- `read_text` / `text_lines` / `csv_rows`: UTF-8 text, with or without a byte-order mark (spreadsheets write one;
  it never becomes part of the first column's name). Other encodings fail naming the file and the line of the
  first bad byte; a NUL byte or an unterminated quote in a CSV fails naming the line.
- `to_int`: an integer field (`3`, `+3`, `3.0`), refused naming file, line and bound when it is not an integer or
  lies outside [lo, hi] (`1e29`, `inf`, `nan`, `1.5`).
- `read_json`: JSON of the expected type (a dict, for index.json / adapter_config.json / sidecars).
- `read_safetensors`, `read_npz`: {name: array} of a .safetensors / .npz (plain numeric arrays only: object arrays
  are refused, allow_pickle=False; `load_npz`, the .npz reader they and the data loaders share, says what a file that
  is no .npz is: text, a single .npy, a cut archive); `read_torch`: a PyTorch state dict through visim_jax.core.safe_pickle (no code runs).
- `xlsx_rows`: the cell texts of one sheet of an Office Open XML workbook (.xlsx), read with the standard library
  (zipfile + xml: the cell values only, no formulas evaluated, no macros, no third-party reader); a file that is no
  .xlsx or lacks the sheet fails naming the file.
Missing files raise FileNotFoundError (reported in one line by errors.run). Images: data/images.py (ImageError).
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
from typing import Any

import numpy as np

from visim_jax.core.errors import UserError

_ADVICE = 'save it as UTF-8 (with or without a byte-order mark)'


def _short(e: BaseException, n: int = 160) -> str:
  text = ' '.join(str(e).split()) or type(e).__name__
  return text[:n] + ('...' if len(text) > n else '')


def read_text(path: str, what: str = 'file') -> str:
  """The whole file as text (UTF-8, a leading BOM dropped); non-UTF-8 bytes fail naming the file and line."""
  path = os.fspath(path)
  with open(path, 'rb') as f:
    data = f.read()
  try:
    return data.decode('utf-8-sig')
  except UnicodeDecodeError as e:
    line = data[:e.start].count(b'\n') + 1
    raise UserError(f'{path}:line {line}: {what} is not UTF-8 text (byte 0x{data[e.start]:02x}); '
                    f'{_ADVICE}') from None


def text_lines(path: str, what: str = 'file') -> list[tuple[int, str]]:
  """[(1-based line number, stripped text)] of the non-blank lines."""
  return [(i, s.strip()) for i, s in enumerate(read_text(path, what).splitlines(), start=1) if s.strip()]


def csv_rows(path: str, what: str = 'CSV file', **fmt) -> list[tuple[int, list[str]]]:
  """[(line number where the row ends, fields)] of a CSV (csv.reader with `fmt`), blank rows kept as []."""
  reader = csv.reader(io.StringIO(read_text(path, what), newline=''), **fmt)
  rows = []
  try:
    for row in reader:
      rows.append((reader.line_num, row))
  except csv.Error as e:
    raise UserError(f'{path}:line {reader.line_num + 1}: {what} does not parse as CSV ({_short(e)})') from None
  return rows


def csv_table(path: str, columns, what: str = 'CSV file') -> tuple[list[str], list[tuple[int, dict[str, str]]]]:
  """(header, [(line, {column: text})]) of a CSV with a header row holding every one of `columns` (names
  stripped); a row with fewer fields than a needed column fails naming the file and line."""
  rows = csv_rows(path, what)
  rows = [(n, r) for n, r in rows if r and any(c.strip() for c in r)]
  if not rows:
    raise UserError(f'{path}: empty {what} (expected a header row)')
  header = [h.strip() for h in rows[0][1]]
  missing = [c for c in columns if c not in header]
  if missing:
    raise UserError(f'{path}: missing column(s) {missing} (has {header})')
  where = {c: header.index(c) for c in columns}
  need = max(where.values()) + 1
  out = []
  for n, r in rows[1:]:
    if len(r) < need:
      short = [c for c, i in where.items() if i >= len(r)]
      raise UserError(f'{path}:line {n}: {len(r)} field(s), the header has {len(header)}; missing {short}')
    out.append((n, {c: r[i] for c, i in where.items()}))
  return header, out


_XLSX = '{http://schemas.openxmlformats.org/spreadsheetml/2006/main}'
_XLSX_REL = '{http://schemas.openxmlformats.org/officeDocument/2006/relationships}id'


def _column(ref: str) -> int:
  n = 0
  for ch in ref:
    if not ch.isalpha():
      break
    n = n * 26 + ord(ch.upper()) - 64
  return n - 1


def xlsx_rows(path: str, sheet: str | None = None,
              what: str = 'spreadsheet') -> tuple[str, list[tuple[int, list[str]]]]:
  """(sheet name, [(1-based row number, cell texts)]) of `sheet` (None: the first) of an .xlsx. Shared and inline
  strings are read as text, numbers as written (an integral number without its '.0'), empty cells as ''."""
  import posixpath  # pylint: disable=g-import-not-at-top
  import zipfile  # pylint: disable=g-import-not-at-top
  from xml.etree import ElementTree  # pylint: disable=g-import-not-at-top
  path = os.fspath(path)
  try:
    with zipfile.ZipFile(path) as z:
      names = set(z.namelist())
      read = lambda n: ElementTree.fromstring(z.read(n))  # noqa: E731
      book = read('xl/workbook.xml')
      rels = {r.get('Id'): r.get('Target') for r in read('xl/_rels/workbook.xml.rels')}
      sheets = [(e.get('name'), rels.get(e.get(_XLSX_REL), '')) for e in book.iter(f'{_XLSX}sheet')]
      if not sheets:
        raise UserError(f'{path}: {what} has no sheet')
      chosen = [s for s in sheets if sheet is None or s[0] == sheet][:1]
      if not chosen:
        raise UserError(f'{path}: {what} has no sheet {sheet!r} (has {", ".join(s[0] for s in sheets)})')
      name, target = chosen[0]
      target = target.lstrip('/') if target.startswith('/') else posixpath.normpath(posixpath.join('xl', target))
      shared = []
      if 'xl/sharedStrings.xml' in names:
        shared = [''.join(t.text or '' for t in si.iter(f'{_XLSX}t')) for si in read('xl/sharedStrings.xml')]
      out = []
      for k, row in enumerate(read(target).iter(f'{_XLSX}row'), start=1):
        cells = {}
        for j, c in enumerate(row.iter(f'{_XLSX}c')):
          ref, kind, v = c.get('r', ''), c.get('t', 'n'), c.find(f'{_XLSX}v')
          text = v.text if v is not None and v.text is not None else ''
          if kind == 's' and text:
            text = shared[int(text)]
          elif kind == 'inlineStr':
            text = ''.join(t.text or '' for t in c.iter(f'{_XLSX}t'))
          elif kind == 'n' and text:
            f = float(text)
            text = str(int(f)) if f.is_integer() and abs(f) < 2**53 else text
          cells[_column(ref) if ref else j] = text
        out.append((int(row.get('r', k)), [cells.get(i, '') for i in range(max(cells) + 1)] if cells else []))
      return name, out
  except UserError:
    raise
  except (zipfile.BadZipFile, KeyError, ElementTree.ParseError, ValueError, IndexError, OSError) as e:
    if isinstance(e, FileNotFoundError):
      raise
    raise UserError(f'{path}: not a readable .xlsx {what} ({type(e).__name__}: {_short(e, 120)})') from None


def to_int(text: str, where: str, lo: int | None = None, hi: int | None = None, what: str = 'value') -> int:
  """An integer field (`3`, `+3`, `3.0`), refused (UserError starting with `where`) when it is not an integer or
  lies outside [lo, hi]."""
  s = str(text).strip()
  try:
    v = int(s)
  except ValueError:
    try:
      f = float(s)
    except ValueError:
      raise UserError(f'{where}: {what} {s!r} is not an integer') from None
    if not math.isfinite(f) or f != int(f):
      raise UserError(f'{where}: {what} {s!r} is not an integer') from None
    v = int(f)
  if (lo is not None and v < lo) or (hi is not None and v > hi):
    raise UserError(f'{where}: {what} {s} is outside {lo if lo is not None else "-inf"}..'
                    f'{hi if hi is not None else "inf"}')
  return v


def read_json(path: str, expect: type = dict, what: str = 'JSON file') -> Any:
  """The parsed JSON of `path`, which must be an `expect` (dict, list...); else one line naming the file."""
  text = read_text(path, what)
  try:
    value = json.loads(text)
  except json.JSONDecodeError as e:
    raise UserError(f'{path}:line {e.lineno}: {what} is not valid JSON ({e.msg})') from None
  except RecursionError:
    raise UserError(f'{path}: {what} is nested too deeply to read') from None
  if not isinstance(value, expect):
    raise UserError(f'{path}: {what} holds a JSON {type(value).__name__}; expected a JSON '
                    f'{ {dict: "object", list: "array"}.get(expect, expect.__name__) }')
  return value


def _check_arrays(path: str, arrays: dict) -> dict[str, np.ndarray]:
  for k, a in arrays.items():
    if not isinstance(a, np.ndarray) or a.dtype.kind not in 'biuf':
      raise UserError(f'{path}: tensor {k!r} holds {getattr(a, "dtype", type(a).__name__)} values; weights must be '
                      'real numbers')
  return arrays


def read_safetensors(path: str) -> dict[str, np.ndarray]:
  """{name: array} of a .safetensors file; a bad header, truncated data or an unknown dtype fail in one line."""
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise FileNotFoundError(f'{path}: no such file')
  try:
    arrays = load_file(path)
  except Exception as e:  # noqa: BLE001: SafetensorError, OSError, ValueError (bad header / dtype / length)
    raise UserError(f'{path}: not a readable .safetensors file ({_short(e)}); convert or download it again') from None
  return _check_arrays(path, arrays)


def load_npz(path: str, what: str = '.npz file', advice: str = 'rewrite it with numpy.savez', where: str = '',
             keys=None) -> dict[str, np.ndarray]:
  """{name: array} of a .npz archive as stored (dtypes unchecked: the caller's), pickles never loaded. A file that is
  not a zip archive (text, a single .npy, other bytes), a cut archive or one holding object arrays fail in our own
  words, never numpy's "load it unsafely with allow_pickle" advice. where: the message's head (default `path`);
  keys: the arrays read (those present; None: all)."""
  import zipfile  # pylint: disable=g-import-not-at-top
  path = os.fspath(path)
  head = where or path
  if not os.path.isfile(path):
    raise FileNotFoundError(f'{head}: no such file')
  if not zipfile.is_zipfile(path):
    with open(path, 'rb') as f:
      start = f.read(4096)
    if start.startswith(b'PK\x03\x04'):
      kind = 'it is cut or corrupt (a zip archive without its central directory)'
    elif start.startswith(b'\x93NUMPY'):
      kind = 'it is a single .npy array, not a .npz (zip) archive of named arrays'
    elif start and b'\0' not in start:
      line = start.decode('utf-8', 'replace').lstrip('\ufeff').splitlines()[0][:60] if start.strip() else ''
      kind = f'it is text (first line {line!r}), not a .npz (zip) archive' if line else \
          'it is text, not a .npz (zip) archive'
    else:
      kind = 'it is empty' if not start else 'it is not a .npz (zip) archive'
    raise UserError(f'{head}: not a readable {what}: {kind}; {advice}')
  try:
    with np.load(path, allow_pickle=False) as z:
      return {k: z[k] for k in z.files if keys is None or k in keys}
  except ValueError as e:
    if 'allow_pickle' in str(e) or 'Object arrays' in str(e):
      raise UserError(f'{head}: not a readable {what}: it holds Python objects (pickled arrays), which are never '
                      f'loaded; save plain numeric or string arrays ({advice})') from None
    raise UserError(f'{head}: not a readable {what} ({_short(e)}); {advice}') from None
  except Exception as e:  # noqa: BLE001: a cut or corrupt archive (BadZipFile, zlib.error, EOFError, OSError)
    raise UserError(f'{head}: not a readable {what}: it is cut or corrupt ({type(e).__name__}: {_short(e)}); '
                    f'{advice}') from None


def read_npz(path: str) -> dict[str, np.ndarray]:
  """{name: array} of a .npz of plain numeric arrays (never pickled objects)."""
  return _check_arrays(path, load_npz(path))


def read_torch(path: str) -> dict[str, np.ndarray]:
  """A PyTorch state dict (zip or legacy torch.save) read by visim_jax.core.safe_pickle (restricted, no torch)."""
  from visim_jax.core import safe_pickle  # pylint: disable=g-import-not-at-top
  return safe_pickle.load_torch_state_dict(path)
