"""Oxford5k / Paris6k ground truth as distributed by their authors, classic and revisited.

Classic (Philbin et al. 2007/2008, the `gt_files` folder): for every query id Q (e.g. `all_souls_1`) four text
files Q_query.txt (one line: `image x1 y1 x2 y2`, the image name with Oxford's `oxc1_` prefix, which is
stripped), Q_good.txt, Q_ok.txt, Q_junk.txt (one database image name a line, no extension). Positives are
good + ok; junk is ignored by the metric (visim_jax.metrics.map.evaluate_classic). Queries are sorted by id.

Revisited (Radenovic et al. 2018, gnd_roxford5k.pkl / gnd_rparis6k.pkl): a pickle of
{'imlist': [names], 'qimlist': [query names], 'gnd': [{'bbx': [x1, y1, x2, y2], 'easy': [idx], 'hard': [idx],
'junk': [idx]}, ...]} with indices into imlist. It is read with visim_jax.core.safe_pickle.load_data_pickle
(containers + numpy arrays only; never a plain pickle.load).

Classic as a pickle (cirtorch's gnd_oxford5k.pkl / gnd_paris6k.pkl: the same dict with {'bbx', 'ok', 'junk'}
per query) is read by the same loader and gets protocol 'classic'.

Both loaders return a `RetrievalGT` whose `gnd` holds index arrays into `imlist` (classic: {'ok', 'good',
'junk'}; revisited: {'easy', 'hard', 'junk'}), ready for metrics.map.evaluate_classic / evaluate_revisited.
Bad input raises naming the file (and line).

A dataset folder (`load_retrieval_set`), in revisitop's / cirtorch's layout `<root>/jpg/<name>.jpg` +
`<root>/gnd_<dataset>.pkl` (e.g. roxford5k, rparis6k, oxford5k, paris6k), or the original download
(`<root>/oxbuild_images/` or `<root>/images/` + a folder of `*_query.txt` files), gives the database image paths in imlist
order, the query image paths and their bounding boxes (queries are cropped to them: the standard protocol).
"""
from __future__ import annotations

import dataclasses
import glob
import os
from typing import Sequence

import numpy as np

from visim_jax.core import readers, safe_pickle
from visim_jax.core.errors import UserError

CLASSIC_SUFFIXES = ('good', 'ok', 'junk')


@dataclasses.dataclass
class RetrievalGT:
  protocol: str               # 'classic' | 'revisited'
  imlist: list[str]           # database image names (no extension)
  qimlist: list[str]          # query image names, one per query
  query_ids: list[str]        # classic: the gt file stem (all_souls_1); revisited: the query image name
  bboxes: np.ndarray          # (Q, 4) float: x1, y1, x2, y2 of the query region
  gnd: list[dict]             # per query: {name: int64 index array into imlist}

  def __len__(self):
    return len(self.qimlist)


def _strip_name(name: str) -> str:
  name = name.strip()
  if name.startswith('oxc1_'):
    name = name[len('oxc1_'):]
  return os.path.splitext(name)[0] if name.lower().endswith(('.jpg', '.jpeg', '.png')) else name


def _read_names(path: str) -> list[tuple[int, str]]:
  return readers.text_lines(path, 'ground-truth list')


def load_classic_gt(gt_dir: str, imlist: Sequence[str] | None = None) -> RetrievalGT:
  """The classic gt_files folder. `imlist` = database image names (no extension, order = score columns); when
  None, the sorted union of every name in the good/ok/junk/query files is used (enough for tests, not for a
  real evaluation where the database holds distractors too)."""
  if not os.path.isdir(gt_dir):
    raise FileNotFoundError(f'config.gt_dir: ground-truth folder {gt_dir} not found')
  query_files = sorted(glob.glob(os.path.join(gt_dir, '*_query.txt')))
  if not query_files:
    raise UserError(f'{gt_dir}: no *_query.txt files (expected the Oxford/Paris gt_files layout)')
  queries = []
  for qf in query_files:
    qid = os.path.basename(qf)[:-len('_query.txt')]
    lines = _read_names(qf)
    if len(lines) != 1:
      raise UserError(f'{qf}: expected one line `image x1 y1 x2 y2`, found {len(lines)}')
    lineno, line = lines[0]
    fields = line.split()
    if len(fields) != 5:
      raise UserError(f'{qf}:{lineno}: expected `image x1 y1 x2 y2`, got {line!r}')
    try:
      bbox = [float(v) for v in fields[1:]]
    except ValueError:
      raise UserError(f'{qf}:{lineno}: bounding box is not 4 numbers: {line!r}') from None
    lists = {}
    for suffix in CLASSIC_SUFFIXES:
      path = os.path.join(gt_dir, f'{qid}_{suffix}.txt')
      if not os.path.isfile(path):
        raise FileNotFoundError(f'{path}: missing (query {qid} needs {qid}_{{good,ok,junk}}.txt)')
      lists[suffix] = [(path, n, _strip_name(name)) for n, name in _read_names(path)]
    queries.append((qid, _strip_name(fields[0]), bbox, lists))

  if imlist is None:
    names = {q[1] for q in queries}
    for q in queries:
      names.update(name for entries in q[3].values() for _, _, name in entries)
    imlist = sorted(names)
  imlist = [_strip_name(n) for n in imlist]
  index = {n: i for i, n in enumerate(imlist)}
  if len(index) != len(imlist):
    raise UserError('imlist: duplicate database image names')
  gnd = []
  for qid, _, _, lists in queries:
    entry = {}
    for suffix, entries in lists.items():
      idx = []
      for path, lineno, name in entries:
        if name not in index:
          raise UserError(f'{path}:{lineno}: image {name!r} is not in the database image list')
        idx.append(index[name])
      entry[suffix] = np.asarray(idx, np.int64)
    entry['ok'] = np.concatenate([entry['good'], entry['ok']])   # classic positives: good + ok
    gnd.append(entry)
  return RetrievalGT(protocol='classic', imlist=list(imlist), qimlist=[q[1] for q in queries],
                     query_ids=[q[0] for q in queries], bboxes=np.asarray([q[2] for q in queries], np.float64),
                     gnd=gnd)


def _array(value, dtype, where: str, what: str, size: int | None = None) -> np.ndarray:
  """`value` as a flat `dtype` array (of `size` entries), else one UserError naming `where`."""
  try:
    a = np.asarray(value, dtype).reshape(-1)
  except (ValueError, TypeError, OverflowError):
    raise UserError(f'{where}: expected {what}, got {str(value)[:60]!r}') from None
  if size is not None and a.size != size:
    raise UserError(f'{where}: expected {what}, got {a.size}')
  return a


def load_revisited_gnd(path: str) -> RetrievalGT:
  """gnd_roxford5k.pkl / gnd_rparis6k.pkl (revisited Oxford / Paris), validated."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f'config.gnd: revisited ground truth {path} not found')
  cfg = safe_pickle.load_data_pickle(path)
  if not isinstance(cfg, dict):
    raise UserError(f'{path}: expected a dict with imlist, qimlist, gnd; found {type(cfg).__name__}')
  for key in ('imlist', 'qimlist', 'gnd'):
    if key not in cfg:
      raise UserError(f'{path}: no {key!r} entry (found {sorted(cfg)})')
  imlist = [str(n) for n in cfg['imlist']]
  qimlist = [str(n) for n in cfg['qimlist']]
  raw = cfg['gnd'] if isinstance(cfg['gnd'], (list, tuple, np.ndarray)) else None
  if raw is None or not all(isinstance(x, (list, tuple, np.ndarray)) for x in (cfg['imlist'], cfg['qimlist'])):
    raise UserError(f'{path}: imlist, qimlist and gnd must be lists')
  raw = list(raw)
  if len(raw) != len(qimlist):
    raise UserError(f'{path}: {len(raw)} gnd entries for {len(qimlist)} queries')
  classic = bool(raw) and isinstance(raw[0], dict) and 'ok' in raw[0] and 'easy' not in raw[0]
  gnd, bboxes = [], []
  for q, g in enumerate(raw):
    if not isinstance(g, dict):
      raise UserError(f'{path}: gnd[{q}] is a {type(g).__name__}, expected a dict')
    entry = {}
    for key in (('ok', 'junk') if classic else ('easy', 'hard', 'junk')):
      if key not in g:
        raise UserError(f'{path}: gnd[{q}] has no {key!r} list')
      idx = _array(g[key], np.int64, f'{path}: gnd[{q}][{key!r}]', 'integer indices')
      if idx.size and (idx.min() < 0 or idx.max() >= len(imlist)):
        raise UserError(f'{path}: gnd[{q}][{key!r}] has an index outside [0, {len(imlist)})')
      entry[key] = idx
    gnd.append(entry)
    bbx = g.get('bbx')
    bboxes.append(_array(bbx, np.float64, f'{path}: gnd[{q}][\'bbx\']', '4 numbers', 4)
                  if bbx is not None else np.full(4, np.nan))
  return RetrievalGT(protocol='classic' if classic else 'revisited', imlist=imlist, qimlist=qimlist,
                     query_ids=list(qimlist),
                     bboxes=np.asarray(bboxes).reshape(-1, 4), gnd=gnd)


def load_gt(path: str, imlist: Sequence[str] | None = None) -> RetrievalGT:
  """A folder -> classic gt_files; a .pkl file -> revisited gnd."""
  if os.path.isdir(path):
    return load_classic_gt(path, imlist)
  if path.endswith('.pkl'):
    gt = load_revisited_gnd(path)
    if imlist is not None and [_strip_name(n) for n in imlist] != gt.imlist:
      raise UserError(f'{path}: its imlist differs from the database names given ({len(gt.imlist)} vs '
                       f'{len(imlist)} images, or another order)')
    return gt
  raise UserError(f'config.eval.gt: {path} is neither a gt_files folder nor a revisited .pkl')


# ---------------------------------------------------------------------------------------- dataset folders

IMAGE_DIRS = ('jpg', 'oxbuild_images', 'paris_images', 'images')
_EXTS = ('.jpg', '.jpeg', '.png')


@dataclasses.dataclass
class RetrievalSet:
  name: str                   # the folder's name (roxford5k, ...)
  gt: RetrievalGT
  image_paths: list[str]      # database images, in gt.imlist order
  query_paths: list[str]      # query images (full files; crop them to gt.bboxes)

  @property
  def protocol(self) -> str:
    return self.gt.protocol


def _find_gnd(root: str) -> str:
  """The one ground truth in `root`: a gnd_*.pkl, or a sub-folder of *_query.txt files (gt_files_170407/,
  paris_120310/, ...)."""
  pkls = sorted(glob.glob(os.path.join(root, 'gnd_*.pkl')))
  dirs = sorted(d for d in glob.glob(os.path.join(root, '*')) if os.path.isdir(d)
                and glob.glob(os.path.join(d, '*_query.txt')))
  found = pkls + dirs
  if len(found) != 1:
    raise UserError(f'config.retrieval.roots: {root}: expected exactly one ground truth (a gnd_*.pkl or a folder '
                    f'of *_query.txt files), found {[os.path.basename(f) for f in found] or "none"}; keep one')
  return found[0]


def _image_index(folder: str) -> dict[str, str]:
  """{name without extension: path} of the images in `folder` (and one level of sub-folders: Paris6k's
  paris/<landmark>/ layout)."""
  out = {}
  for dirpath, _, files in os.walk(folder):
    if os.path.relpath(dirpath, folder).count(os.sep) > 1:
      continue
    for f in files:
      stem, ext = os.path.splitext(f)
      if ext.lower() in _EXTS and not f.startswith('.'):
        out.setdefault(_strip_name(stem), os.path.join(dirpath, f))
  return out


def load_retrieval_set(root: str, gnd: str = '') -> RetrievalSet:
  """An Oxford/Paris-style folder: images + ground truth (see the module docstring); `gnd` overrides the look-up."""
  root = os.path.expanduser(root)
  if not os.path.isdir(root):
    raise FileNotFoundError(f'config.retrieval.roots: {root} is not a folder (expected jpg/ + gnd_*.pkl)')
  image_dir = next((os.path.join(root, d) for d in IMAGE_DIRS if os.path.isdir(os.path.join(root, d))), root)
  index = _image_index(image_dir)
  if not index:
    raise UserError(f'config.retrieval.roots: {image_dir} holds no .jpg/.png images')
  gnd_path = os.path.expanduser(gnd) if gnd else _find_gnd(root)
  gt = load_gt(gnd_path, sorted(index) if os.path.isdir(gnd_path) else None)

  def paths(names, what):
    missing = [n for n in names if _strip_name(n) not in index]
    if missing:
      raise UserError(f'{gnd_path}: {len(missing)} {what} image(s) not found in {image_dir} (first: '
                      f'{missing[0]!r}); download the full image set there')
    return [index[_strip_name(n)] for n in names]

  return RetrievalSet(name=os.path.basename(os.path.normpath(root)), gt=gt,
                      image_paths=paths(gt.imlist, 'database'), query_paths=paths(gt.qimlist, 'query'))
