"""2AFC triplets (R, A, B): CoSIS annotation files (paper 004, Sec. 3), BG-20k image folders, a generic CSV.

CoSIS label files (`dist_<ref>.txt`, `mulref_val.txt`, `mulref_test.txt`): one annotation a row,
`ref id1 cls1 id2 cls2 id3 cls3`, the three candidates listed from closest to farthest to `ref`; cls is
1 almost the same .. 5 irrelevant. Each row yields three triples (ref, a, b) whose answer is 'a is closer':
(1, 2), (1, 3), (2, 3), in that order, with the candidates' classes (cls_a, cls_b).

Readings and the upstream quirks we do not repeat (see ../shared/data/README.md):
  * A header line is recognised by content (its first field is not an integer), never by file name: only
    `mulref_val.txt` has one; the first row of the other files is data and is kept. Blank lines are
    skipped; any other row that is not seven integers with classes in 1..5 fails with `path:line N`.
  * Both classes of a triple come from that triple's own candidates (upstream took positions 0 and 1).
  * A row whose classes decrease (a farther candidate with a closer class) contradicts the file's order
    and fails with its line number.
  * Id spaces: `mulref_test` ids index the BG-20k `train` split, every other file the `val` split (the
    split of a file is inferred from its name; pass `split=` to override). An image key is `split/idx`
    (e.g. `val/715`); `filename_dict.txt` (`idx split name`) maps keys to BG-20k file names.
  * Counts: keeping every row gives 10,005 triples for mulref_test (3,335 rows) and 12,009 for mulref_val
    (4,003 rows + header); the "10,002" quoted upstream is what dropping the first row leaves.

Generic CSV (other 2AFC sets): columns `ref,a,b,label` (header optional), image paths relative to the CSV's
folder and inside it (data/resolve.py refuses an absolute path, `..` or a link out, naming the line); label `a` or `1` = A is closer, `b` or `0` = B is closer. Keys are the resolved paths.
"""
from __future__ import annotations

import dataclasses
import os
import re
from typing import Mapping, Sequence

import numpy as np

from visim_jax.core import ops, readers
from visim_jax.data import npz, resolve
from visim_jax.data.images import IMAGE_EXTENSIONS
from visim_jax.core.errors import UserError

COSIS_PAIRS = ((0, 1), (0, 2), (1, 2))  # candidate positions (a, b) of a row's three triples; a is closer
CONTEXTS = {715: 'indoor', 2723: 'city', 389: 'ocean', 1673: 'field', 1006: 'mountain', 254: 'forest',
            2352: 'flower', 667: 'abstract'}  # the eight dist_<ref> files, paper order
SPLIT_FOLDERS = {'val': ('val', 'testval', 'test'), 'train': ('train',)}  # BG-20k sub-folders per split


@dataclasses.dataclass(frozen=True)
class Triplets:
  """T triples. Keys are strings (CoSIS: `split/idx`; CSV: image paths)."""
  ref: np.ndarray        # (T,) keys of the reference images
  a: np.ndarray          # (T,) keys of candidate A
  b: np.ndarray          # (T,) keys of candidate B
  a_closer: np.ndarray   # (T,) bool: the annotated answer, True when A is closer to the reference
  cls_a: np.ndarray      # (T,) int8 CoSIS class of A (1..5), 0 when unknown (CSV)
  cls_b: np.ndarray      # (T,) int8 CoSIS class of B
  line: np.ndarray       # (T,) int32 1-based line number of the triple's row in `source`
  source: str            # the file the triples came from

  def __len__(self) -> int:
    return len(self.ref)

  def keys(self) -> list[str]:
    """Every image key (references and candidates), first-appearance order."""
    return list(dict.fromkeys(np.stack([self.ref, self.a, self.b], 1).reshape(-1).tolist()))

  def references(self) -> list[str]:
    return list(dict.fromkeys(self.ref.tolist()))

  def subset(self, idx) -> 'Triplets':
    idx = np.asarray(idx)
    return dataclasses.replace(self, ref=self.ref[idx], a=self.a[idx], b=self.b[idx],
                               a_closer=self.a_closer[idx], cls_a=self.cls_a[idx], cls_b=self.cls_b[idx],
                               line=self.line[idx])

  def indices(self, key_to_row: Mapping[str, int], what: str = 'features') -> tuple[np.ndarray, ...]:
    """(ref, a, b) as int32 rows of a feature table; a missing key fails naming it and its line."""
    out = []
    for col in (self.ref, self.a, self.b):
      idx = np.fromiter((key_to_row.get(k, -1) for k in col.tolist()), np.int64, len(col))
      if (idx < 0).any():
        i = int(np.argmax(idx < 0))
        n_missing = len({k for k, j in zip(col.tolist(), idx.tolist()) if j < 0})
        raise UserError(f'{self.source}:line {int(self.line[i])}: image {str(col[i])!r} has no row in the {what} '
                       f'({n_missing} such image(s) in this column)')
      out.append(idx.astype(np.int32))
    return tuple(out)


SPLITS = ('file_order', 'random')


def split_context(t: Triplets, how: str = 'file_order', train_fraction: float = 2 / 3,
                  seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """(train, held-out) triple indices of one context set.

  file_order (the authors' dist_dataprep.get_mixing_data, `testfrom = len(data) * 2 // 3`): the first
  floor(T * train_fraction) triples in file order train, the rest (the last third of the file) is held out;
  a row's three triples may straddle the cut, as upstream. random: a seeded permutation of the annotation rows
  (a row's three triples share its candidates, so they stay on one side), the first round(f * rows) train.
  """
  if how == 'file_order':
    n_train = int(np.floor(len(t) * train_fraction + 1e-9))
    return np.arange(n_train), np.arange(n_train, len(t))
  if how != 'random':
    raise UserError(f'config.model.split: must be one of {SPLITS}, got {how!r}')
  rows, inv = np.unique(t.line, return_inverse=True)
  perm = np.random.RandomState(seed).permutation(len(rows))
  is_train = np.zeros(len(rows), bool)
  is_train[perm[:int(round(train_fraction * len(rows)))]] = True
  keep = is_train[inv.reshape(-1)]
  return np.flatnonzero(keep), np.flatnonzero(~keep)


# ------------------------------------------------------------------------------------------------ CoSIS

@dataclasses.dataclass(frozen=True)
class CosisRows:
  rows: np.ndarray     # (R, 7) int64: ref id1 cls1 id2 cls2 id3 cls3
  lines: np.ndarray    # (R,) 1-based line numbers
  header: bool         # whether the file started with a header line
  path: str


def _is_int(s: str) -> bool:
  return re.fullmatch(r'[+-]?\d+', s) is not None


def read_cosis_rows(path: str) -> CosisRows:
  """Every annotation row of a CoSIS label file (header optional; blank lines skipped; nothing else dropped)."""
  if not os.path.isfile(path):
    raise UserError(f'{path}: CoSIS label file not found')
  rows, lines, header, seen_data = [], [], False, False
  for n, text in readers.text_lines(path, 'CoSIS label file'):
    fields = text.split()
    if not seen_data and not header and not _is_int(fields[0]):
      header = True  # e.g. 'ref order1 class1 order2 class2 order3 class3'
      continue
    seen_data = True
    if len(fields) != 7 or not all(_is_int(x) for x in fields):
      raise UserError(f'{path}:line {n}: expected 7 integers `ref id1 cls1 id2 cls2 id3 cls3`, '
                       f'got {text.strip()!r}')
    r = [int(x) for x in fields]
    if max(abs(v) for v in r) > 2**31 - 1:
      raise UserError(f'{path}:line {n}: an id beyond 2^31 - 1 in {text.strip()!r}')
    cls = r[2::2]
    if min(r[0::2] + [r[1], r[3], r[5]]) < 0:
      raise UserError(f'{path}:line {n}: negative image id in {text.strip()!r}')
    if not all(1 <= c <= 5 for c in cls):
      raise UserError(f'{path}:line {n}: classes must be in 1..5, got {cls}')
    if not cls[0] <= cls[1] <= cls[2]:
      raise UserError(f'{path}:line {n}: classes {cls} decrease, but candidates are listed from closest '
                       'to farthest')
    if len({r[0], r[1], r[3], r[5]}) != 4:
      raise UserError(f'{path}:line {n}: reference and candidates must be four different images: '
                       f'{text.strip()!r}')
    rows.append(r)
    lines.append(n)
  if not rows:
    raise UserError(f'{path}: no annotation rows')
  return CosisRows(np.asarray(rows, np.int64), np.asarray(lines, np.int32), header, path)


def split_of(path: str) -> str:
  """The BG-20k split a CoSIS file's ids index: `train` for mulref_test, `val` for every other file."""
  return 'train' if os.path.basename(path).startswith('mulref_test') else 'val'


def load_cosis(path: str, split: str | None = None) -> Triplets:
  """The 3 R triples of a CoSIS label file; keys `split/idx`."""
  split = split or split_of(path)
  if split not in SPLIT_FOLDERS:
    raise UserError(f'{path}: split must be one of {sorted(SPLIT_FOLDERS)}, got {split!r}')
  cr = read_cosis_rows(path)
  ids, cls = cr.rows[:, 1::2], cr.rows[:, 2::2]
  key = np.vectorize(lambda i: f'{split}/{i}', otypes=[object])
  refs, cands = key(cr.rows[:, 0]), key(ids)
  pa, pb = np.asarray(COSIS_PAIRS).T                       # (3,), (3,)
  t = lambda x: np.asarray(x).reshape(-1)                   # row-major: a row's three triples stay together
  n = len(cr.rows)
  return Triplets(ref=t(np.repeat(refs[:, None], 3, 1)).astype(str), a=t(cands[:, pa]).astype(str),
                  b=t(cands[:, pb]).astype(str), a_closer=np.ones(3 * n, bool),
                  cls_a=t(cls[:, pa]).astype(np.int8), cls_b=t(cls[:, pb]).astype(np.int8),
                  line=t(np.repeat(cr.lines[:, None], 3, 1)).astype(np.int32), source=path)


def context_files(folder: str) -> dict[str, str]:
  """{context name: path} of the dist_<ref>.txt files in `folder` (paper order, unknown refs after)."""
  if not os.path.isdir(folder):
    raise UserError(f'config.annotations: folder {folder} not found')
  found = {}
  for n in os.listdir(folder):
    m = re.fullmatch(r'dist_(\d+)\.txt', n)
    if m:
      found[int(m.group(1))] = os.path.join(folder, n)
  if not found:
    raise UserError(f'{folder}: no dist_<ref>.txt context files')
  order = [r for r in CONTEXTS if r in found] + sorted(r for r in found if r not in CONTEXTS)
  return {CONTEXTS.get(r, f'ref{r}'): found[r] for r in order}


def read_filename_dict(path: str) -> dict[str, str]:
  """{`split/idx`: BG-20k name} from `filename_dict.txt` (`idx split name` a line)."""
  if not os.path.isfile(path):
    raise UserError(f'{path}: filename_dict.txt not found')
  out, where = {}, {}
  for n, text in readers.text_lines(path, 'filename_dict.txt'):
    fields = text.split()
    if n == 1 and not _is_int(fields[0]):
      continue  # a header
    if len(fields) != 3 or not _is_int(fields[0]) or fields[1] not in SPLIT_FOLDERS:
      raise UserError(f'{path}:line {n}: expected `idx split name` with split in {sorted(SPLIT_FOLDERS)}, '
                       f'got {text.strip()!r}')
    key = f'{fields[1]}/{int(fields[0])}'
    if key in out:
      raise UserError(f'{path}:line {n}: duplicate id {key} (first on line {where[key]})')
    out[key], where[key] = fields[2], n
  if not out:
    raise UserError(f'{path}: empty filename dictionary')
  return out


def _index_folder(folder: str) -> dict[str, str]:
  out = {}
  with os.scandir(folder) as it:
    for e in it:
      if e.is_file() and e.name.lower().endswith(IMAGE_EXTENSIONS) and not e.name.startswith('.'):
        out.setdefault(os.path.splitext(e.name)[0], e.path)
  return out


def resolve_images(triplets: Sequence[Triplets], names: Mapping[str, str], image_dir: str) -> dict[str, str]:
  """{key: image path} of every image the triplets use, under a BG-20k folder.

  A key's file is `<image_dir>/<split folder>/<name>.<ext>` (split folders: val -> val/, testval/ or test/;
  train -> train/), or `<image_dir>/<name>.<ext>` for a flat folder. Every image is checked before
  anything is computed: an id missing from filename_dict.txt or a file missing on disk fails naming the
  id, the annotation file and line, and the folders searched.
  """
  if not os.path.isdir(image_dir):
    raise UserError(f'config.image_dir: folder {image_dir} not found')
  folders = {}
  for split, subs in SPLIT_FOLDERS.items():
    cands = [os.path.join(image_dir, s) for s in subs if os.path.isdir(os.path.join(image_dir, s))]
    folders[split] = cands + [image_dir]
  listing = {}
  out = {}
  for t in triplets:
    for col in (t.ref, t.a, t.b):
      for i, key in enumerate(col.tolist()):
        if key in out:
          continue
        if key not in names:
          raise UserError(f'{t.source}:line {int(t.line[i])}: image id {key} is not in filename_dict.txt')
        split = key.split('/', 1)[0]
        path = None
        for folder in folders[split]:
          if folder not in listing:
            listing[folder] = _index_folder(folder)
          path = listing[folder].get(names[key])
          if path:
            break
        if path is None:
          raise UserError(
              f'{t.source}:line {int(t.line[i])}: image {key} ({names[key]}.*) not found under '
              f'{", ".join(folders[split])}')
        out[key] = path
  return out


def load_cosis_sets(folder: str) -> dict:
  """{'contexts': {name: Triplets} (paper order), 'mulref_val': Triplets, 'mulref_test': Triplets} of a CoSIS folder."""
  ctx = {name: load_cosis(p) for name, p in context_files(folder).items()}
  sets = {'contexts': ctx}
  for name in ('mulref_val', 'mulref_test'):
    p = os.path.join(folder, f'{name}.txt')
    if not os.path.isfile(p):
      raise UserError(f'config.annotations: {p} not found')
    sets[name] = load_cosis(p)
  return sets



def describe(t: Triplets) -> dict:
  """{rows, triplets, header, references, split} of a CoSIS file's triplets (metrics.json)."""
  cr = read_cosis_rows(t.source)
  return {'rows': int(len(cr.rows)), 'triplets': len(t), 'header': cr.header, 'references': len(t.references()),
          'split': split_of(t.source)}


def authors_pca_refs(ref_val) -> list[str]:
  """The authors' PCA fit set (dist_dataprep.split_refs + dist_reducedim.all_data_reduced_dim): the first 320
  of the sorted unique mulref_val reference ids shuffled by np.random.seed(2); the 8 context references follow."""
  ids = np.unique([int(x.split('/', 1)[1]) for x in ref_val]).astype(np.float64)
  np.random.RandomState(2).shuffle(ids)
  return [f'val/{int(i)}' for i in ids[:320]]


# ------------------------------------------------------------------------- stand-in features, synthetic set

SYNTHETIC_VERSION = 1


def stand_in_features(keys, dim: int, seed: int) -> np.ndarray:
  """Seeded random vectors, each a pure function of (seed, image id): the same id always gets the same row."""
  out = np.empty((len(keys), dim), np.float32)
  for i, k in enumerate(keys):
    split, idx = k.split('/', 1)
    out[i] = np.random.default_rng([seed, 0 if split == 'val' else 1, int(idx)]).standard_normal(dim)
  return out


def write_synthetic_cosis(folder: str, seed: int = 0, dim: int = 32, n_val: int = 600, n_train: int = 400,
                          rows_per_context: int = 60, val_refs: int = 120, test_refs: int = 90) -> str:
  """A small CoSIS-format set (same file names and layout) whose answers follow a hidden metric.

  Truth: cosine after a fixed anisotropic rescaling of the stand-in features (dim = the stand-in dim), so plain
  cosine is informative but imperfect and a trained head can do better. Candidates of a row are sorted by
  truth similarity; classes are the similarity cut at (0.6, 0.3, 0, -0.3). mulref_val.txt gets a header line.
  """
  rng = np.random.RandomState(seed)
  scale = np.exp(np.linspace(1.5, -1.5, dim))[rng.permutation(dim)]
  keys = {'val': [f'val/{i}' for i in range(n_val)], 'train': [f'train/{i}' for i in range(n_train)]}
  truth = {s: stand_in_features(k, dim, seed) * scale for s, k in keys.items()}
  truth = {s: ops.l2_normalize(t) for s, t in truth.items()}

  def rows(split, ref, n):
    out = []
    pool = len(truth[split])
    for _ in range(n):
      c = rng.choice(np.setdiff1d(np.arange(pool), [ref]), 3, replace=False)
      sim = truth[split][c] @ truth[split][ref]
      order = np.argsort(-sim)
      cls = 5 - np.digitize(sim[order], [-0.3, 0.0, 0.3, 0.6])
      out.append([ref] + [v for j in range(3) for v in (int(c[order[j]]), int(cls[j]))])
    return out

  os.makedirs(folder, exist_ok=True)
  write = lambda name, rr, header='': ops.atomic_write_text(
      os.path.join(folder, name), header + ''.join(' '.join(map(str, r)) + '\n' for r in rr))
  ctx_refs = list(CONTEXTS)[:8]
  for j, r in enumerate(ctx_refs):  # contexts: the paper's reference ids, mapped into the small val pool
    ref = r % n_val
    write(f'dist_{r}.txt', [[r] + x[1:] for x in rows('val', ref, rows_per_context)])
  # the context refs are renamed to their paper ids: give those ids the features of the pool image
  val_rows = [x for ref in rng.choice(n_val, val_refs, replace=False) for x in rows('val', int(ref), 3)]
  write('mulref_val.txt', val_rows, 'ref order1 class1 order2 class2 order3 class3\n')
  write('mulref_test.txt',
        [x for ref in rng.choice(n_train, test_refs, replace=False) for x in rows('train', int(ref), 3)])
  names = [f'{i} val syn_val_{i}' for i in range(max(n_val, max(ctx_refs) + 1))]
  names += [f'{i} train syn_train_{i}' for i in range(n_train)]
  ops.atomic_write_text(os.path.join(folder, 'filename_dict.txt'), '\n'.join(names) + '\n')
  ops.atomic_write_text(os.path.join(folder, 'SYNTHETIC.txt'),
                           f'synthetic CoSIS-format set v{SYNTHETIC_VERSION}, seed {seed}, dim {dim}: not real data\n')
  return folder


def synthetic_alias(key: str, n_val: int = 600) -> str:
  """The pool image whose features a synthetic context reference (a paper id >= n_val) uses."""
  split, idx = key.split('/', 1)
  return f'{split}/{int(idx) % n_val}' if split == 'val' else key


# ---------------------------------------------------------------------------------------------- generic

_A_LABELS, _B_LABELS = ('a', '1', '1.0', 'true'), ('b', '0', '0.0', 'false')


def load_triplet_csv(path: str, check_files: bool = True) -> Triplets:
  """A generic 2AFC set: CSV rows `ref,a,b,label` (header optional); label a/1 = A closer, b/0 = B closer."""
  if not os.path.isfile(path):
    raise UserError(f'{path}: triplet CSV not found')
  base = os.path.dirname(os.path.abspath(path))
  refs, as_, bs, lab, lines = [], [], [], [], []
  inside = resolve.Root(base).inside
  for n, row in readers.csv_rows(path, 'triplet CSV'):
    row = [c.strip() for c in row]
    if not row or not any(row):
      continue
    if n == 1 and [c.lower() for c in row[:4]] == ['ref', 'a', 'b', 'label']:
      continue
    if len(row) != 4 or not all(row):
      raise UserError(f'{path}:line {n}: expected 4 fields `ref,a,b,label`, got {row}')
    l = row[3].lower()
    if l not in _A_LABELS + _B_LABELS:
      raise UserError(f'{path}:line {n}: label must be a/1 (A closer) or b/0 (B closer), got {row[3]!r}')
    p = [os.path.normpath(inside(c, f'{path}:line {n}', col))
         for c, col in zip(row[:3], ('ref', 'a', 'b'))]
    if check_files:
      for c, q in zip(row[:3], p):
        if not os.path.isfile(q):
          raise UserError(f'{path}:line {n}: image {c!r} not found ({q})')
    refs.append(p[0]), as_.append(p[1]), bs.append(p[2]), lab.append(l in _A_LABELS), lines.append(n)
  if not refs:
    raise UserError(f'{path}: no triplet rows')
  z = np.zeros(len(refs), np.int8)
  return Triplets(np.asarray(refs), np.asarray(as_), np.asarray(bs), np.asarray(lab, bool), z, z.copy(),
                  np.asarray(lines, np.int32), path)


# ------------------------------------------------------------------------------------- feature tables

def load_feature_table(path: str) -> tuple[np.ndarray, dict[str, int]]:
  """(features (N, D) float32, {key: row}) from an .npz with `features` and `names` (image keys).

  Names may be CoSIS keys (`val/715`) or BG-20k names (`h_f5946da2`, extension optional); see
  `keys_from_names` for mapping the latter.
  """
  z = npz.read_arrays(path, ('features', 'names'))
  feats = z['features'].astype(np.float32)
  names = [str(n) for n in z['names']]
  if feats.ndim != 2 or len(names) != len(feats):
    raise UserError(f'config.features: {path}: features {feats.shape} and {len(names)} names do not match')
  bad = ~np.isfinite(feats).all(1)
  if bad.any():
    raise UserError(f'config.features: {path}: NaN/Inf in {bad.sum()} row(s), first {names[int(np.argmax(bad))]!r}')
  table = {}
  for i, n in enumerate(names):
    if n in table:
      raise UserError(f'config.features: {path}: duplicate name {n!r}')
    table[n] = i
  return feats, table


def keys_from_names(table: Mapping[str, int], names: Mapping[str, str]) -> dict[str, int]:
  """Re-keys a {BG-20k name (or file name): row} table to {`split/idx`: row} through filename_dict."""
  if any('/' in k and k.split('/', 1)[0] in SPLIT_FOLDERS for k in table):
    return dict(table)
  stems = {os.path.splitext(os.path.basename(k))[0]: v for k, v in table.items()}
  return {key: stems[name] for key, name in names.items() if name in stems}
