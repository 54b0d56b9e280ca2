"""Image-quality data sets (mean opinion scores of distorted images against their references), read in their
published layouts and checked before any image is decoded (issue 47). Each loader returns a `QualitySet`: the
reference and distorted image paths per row and the opinion score, oriented so that HIGHER = BETTER quality
(`higher_is_better` records the published direction; a DMOS where higher is worse is negated).

KADID-10k (Lin, Hosu & Saupe 2019; the zip of database.mmsp.uni-konstanz.de unpacks to `kadid10k/`):
```
kadid10k/
  dmos.csv                 header dist_img,ref_img,dmos,var; 10,125 rows (81 references x 25 distortions x 5 levels)
  images/I01.png           references            images/I<ref>.png
  images/I01_01_01.png     distorted images      images/I<ref>_<distortion>_<level>.png
```
`dmos` is the mean of the crowd's 1..5 ratings of the distorted image against its reference: HIGHER = BETTER
(KADID-10k paper, Section 3); `var` its variance (read, not used). File names in the CSV are relative to images/.
A row that is short, has a non-number dmos, or names a file outside the folder is refused naming the line
(core/readers.py, data/resolve.py); a missing image names the file (judgements.check_files).

TID2013 (Ponomarenko et al. 2015; tid2013.rar of ponomarenko.info unpacks to `tid2013/`):
```
tid2013/mos_with_names.txt      "<mos> <name>" per line, 3,000 lines (MOS 0..9, HIGHER = better)
tid2013/distorted_images/i01_01_1.bmp      i<ref>_<distortion>_<level>.bmp
tid2013/reference_images/I01.BMP           the reference of i<ref>_* (matched case-insensitively: the archive
                                           mixes I / i and BMP / bmp)
```
PIPAL (Gu et al. 2020; the NTIRE 2021 training set: Train_Ref, Train_Dis, Train_Label):
```
pipal/Train_Label/A0001.txt     "<distorted name>,<Elo score>" per line (HIGHER = better)
pipal/Train_Dis/A0001_00_00.bmp distorted images: <reference>_<type>_<index>.bmp
pipal/Train_Ref/A0001.bmp       references
```
LIVE Release 2 (Sheikh, Sabir & Bovik 2006; databaserelease2.zip of live.ece.utexas.edu):
```
databaserelease2/jp2k/img1.bmp ... img227.bmp, jpeg/ (233), wn/ (174), gblur/ (174), fastfading/ (174)
databaserelease2/refimgs/<name>.bmp         the 29 references
databaserelease2/refnames_all.mat           refnames_all: the reference name of each of the 982 images, in the order
                                            jp2k, jpeg, wn, gblur, fastfading, img1, img2, ... within each
databaserelease2/dmos_realigned.mat         dmos_new, orgs (the realigned DMOS; dmos.mat's dmos, orgs if absent)
```
DMOS: HIGHER = WORSE (negated here); rows with orgs = 1 (the references themselves) are left out, as the papers do.
The .mat files are read by scipy.io.loadmat (MATLAB arrays, no code), a missing variable or a count that does not
match the image folders is one line naming the file.

CSIQ (Larson & Chandler 2010, "Most apparent distortion"; the release of the CSIQ database, as DBCNN's / DeepQA's
loaders and pyiqa's meta_info_CSIQDataset.csv name its files):
```
csiq/csiq.DMOS.xlsx          sheet all_by_image (else the first sheet with the header): a header row holding
                             image, dst_idx, dst_type, dst_lev, dmos (dmos_std read, not used); 866 rows
csiq/src_imgs/1600.png       the 30 references, <image>.png
csiq/dst_imgs/awgn/1600.AWGN.1.png    dst_imgs/<folder>/<image>.<TYPE>.<dst_lev>.png, dst_idx 1..6 = awgn (AWGN),
                             jpeg (JPEG), jpeg2000 (jpeg2000), fnoise (fnoise), blur (BLUR), contrast (contrast);
                             matched case-insensitively (copies of the release differ in case)
```
The DMOS ships only as that .xlsx: it is read with the standard library (core/readers.xlsx_rows: zipfile + xml, the
cell values only), so the published file is used as downloaded, with no third-party spreadsheet reader and no
hand-exported CSV whose columns could drift. DMOS 0..1, HIGHER = WORSE (negated here).

PieAPP (Prashnani et al. 2018; all_data_PieAPP_dataset_CVPR_2018.zip, its dataset_README.md):
```
PieAPP/reference_images/test/ref_0001.png
PieAPP/distorted_images/test/ref_0001/distort_0001_<type>_<inter|intra>_<id>.png
PieAPP/labels/test/ref_0001_per_image_score.csv   header row; columns: reference, distorted image, score
PieAPP/labels/test/ref_0001_pairwise_labels.csv   header row; columns: reference, image A, image B, the
                                                  fraction of 40 observers who found A closer to the reference
```
Read from the test split, the only one whose every pair was judged by 40 observers (train / val hold ML-estimated
probabilities) and the only one with per-image scores. (a) `load_pieapp`: a quality set from the per-image scores
(the MAP Bradley-Terry estimate of each image's dissimilarity to its reference: HIGHER = WORSE, negated here; the
reference's own row, score 0 by construction, left out), as pyiqa scores PieAPP. (b) `load_pieapp_2afc`: a 2AFC set
(data/judgements.TwoAFCSet: p0 = A, p1 = B, judge = 1 - P(A closer)) from the pairwise files, every pair as
published (a pair where A is the reference itself, which the test split includes, is kept); an image named ref_*
is read from reference_images/test/, any other from distorted_images/test/<reference>/.
"""
from __future__ import annotations

import dataclasses
import math
import os

import numpy as np

from visim_jax.core import readers
from visim_jax.core.errors import UserError
from visim_jax.data import resolve
from visim_jax.data.judgements import check_files


@dataclasses.dataclass
class QualitySet:
  name: str
  refs: list[str]            # per row: the reference image
  dists: list[str]           # per row: the distorted image
  mos: np.ndarray            # (N,) float64, HIGHER = better quality
  higher_is_better: bool     # the published score's direction (False: negated into `mos`)

  def __len__(self) -> int:
    return len(self.dists)

  def paths(self) -> list[str]:
    return list(dict.fromkeys(self.refs + self.dists))


def _number(text: str, where: str, column: str) -> float:
  try:
    v = float(text)
  except ValueError:
    raise UserError(f'{where}: column {column!r} is not a number ({text!r})') from None
  if not math.isfinite(v):
    raise UserError(f'{where}: column {column!r} is not finite ({text!r})')
  return v


def load_kadid(root: str) -> QualitySet:
  """KADID-10k under `root` (the folder holding dmos.csv and images/)."""
  csv_path = os.path.join(root, 'dmos.csv')
  if not os.path.isfile(csv_path):
    raise UserError(f'{csv_path}: KADID-10k dmos.csv not found (expected kadid10k/dmos.csv and images/)')
  _, rows = readers.csv_table(csv_path, ('dist_img', 'ref_img', 'dmos', 'var'), 'KADID-10k dmos.csv')
  images = os.path.join(root, 'images')
  inside = resolve.Root(images).inside
  refs, dists, mos = [], [], []
  for line, row in rows:
    where = f'{csv_path}:line {line}'
    dists.append(inside(row['dist_img'].strip(), where, 'dist_img'))
    refs.append(inside(row['ref_img'].strip(), where, 'ref_img'))
    mos.append(_number(row['dmos'], where, 'dmos'))
  if not dists:
    raise UserError(f'{csv_path}: no rows')
  check_files(refs + dists, 'KADID-10k image')
  return QualitySet('kadid10k', refs, dists, np.asarray(mos, np.float64), True)


class _References:
  """A reference folder's images by file stem (case-insensitive): `refs(stem, where, shown)` -> its path, or one line
  naming the row and the folder."""

  def __init__(self, folder: str, what: str):
    if not os.path.isdir(folder):
      raise UserError(f'{folder}: {what} folder not found')
    self.folder = folder
    self.by_stem = {os.path.splitext(n)[0].lower(): os.path.join(folder, n) for n in sorted(os.listdir(folder))}

  def __call__(self, stem: str, where: str, shown: str) -> str:
    if stem.lower() not in self.by_stem:
      raise UserError(f'{where}: no reference image {shown} in {self.folder}')
    return self.by_stem[stem.lower()]


def load_tid2013(root: str) -> QualitySet:
  """TID2013 under `root` (mos_with_names.txt, distorted_images/, reference_images/)."""
  txt = os.path.join(root, 'mos_with_names.txt')
  if not os.path.isfile(txt):
    raise UserError(f'{txt}: TID2013 mos_with_names.txt not found (expected tid2013/mos_with_names.txt, '
                    'distorted_images/ and reference_images/)')
  ref_of = _References(os.path.join(root, 'reference_images'), 'TID2013 reference_images')
  inside = resolve.Root(os.path.join(root, 'distorted_images')).inside
  refs, dists, mos = [], [], []
  for line, text in readers.text_lines(txt, 'TID2013 mos_with_names.txt'):
    if not text.strip():
      continue
    where = f'{txt}:line {line}'
    parts = text.split()
    if len(parts) != 2:
      raise UserError(f'{where}: expected "<mos> <image name>", got {text.strip()!r}')
    mos.append(_number(parts[0], where, 'mos'))
    dists.append(inside(parts[1], where, 'image name'))
    stem = parts[1].split('_')[0]
    refs.append(ref_of(stem, where, f'{stem.upper()}.BMP'))
  if not dists:
    raise UserError(f'{txt}: no rows')
  check_files(refs + dists, 'TID2013 image')
  return QualitySet('tid2013', refs, dists, np.asarray(mos, np.float64), True)


def load_pipal(root: str) -> QualitySet:
  """PIPAL's training set under `root` (Train_Label/*.txt, Train_Dis/, Train_Ref/)."""
  labels = os.path.join(root, 'Train_Label')
  if not os.path.isdir(labels):
    raise UserError(f'{labels}: PIPAL Train_Label folder not found (expected Train_Ref/, Train_Dis/, Train_Label/)')
  ref_of = _References(os.path.join(root, 'Train_Ref'), 'PIPAL Train_Ref')
  inside = resolve.Root(os.path.join(root, 'Train_Dis')).inside
  refs, dists, mos = [], [], []
  for name in sorted(n for n in os.listdir(labels) if n.endswith('.txt')):
    path = os.path.join(labels, name)
    for line, text in readers.text_lines(path, 'PIPAL label file'):
      if not text.strip():
        continue
      where = f'{path}:line {line}'
      parts = [t.strip() for t in text.split(',')]
      if len(parts) != 2:
        raise UserError(f'{where}: expected "<distorted image>,<Elo score>", got {text.strip()!r}')
      dists.append(inside(parts[0], where, 'image name'))
      mos.append(_number(parts[1], where, 'score'))
      stem = parts[0].split('_')[0]
      refs.append(ref_of(stem, where, stem))
  if not dists:
    raise UserError(f'{labels}: no label rows')
  check_files(refs + dists, 'PIPAL image')
  return QualitySet('pipal', refs, dists, np.asarray(mos, np.float64), True)


LIVE_FOLDERS = ('jp2k', 'jpeg', 'wn', 'gblur', 'fastfading')


def _mat(path: str, names: tuple[str, ...]) -> list:
  from scipy import io  # pylint: disable=g-import-not-at-top
  try:
    m = io.loadmat(path)
  except Exception as e:  # pylint: disable=broad-except  (a damaged or non-MATLAB file: one line)
    raise UserError(f'{path}: not a readable MATLAB file ({type(e).__name__}: {str(e)[:120]})') from None
  missing = [n for n in names if n not in m]
  if missing:
    raise UserError(f'{path}: no variable {missing[0]!r} (expected {", ".join(names)})')
  return [np.asarray(m[n]).reshape(-1) for n in names]


def load_live(root: str) -> QualitySet:
  """LIVE Release 2 under `root` (the five distortion folders, refimgs/, refnames_all.mat, dmos[_realigned].mat)."""
  import re  # pylint: disable=g-import-not-at-top
  dists = []
  for folder in LIVE_FOLDERS:
    d = os.path.join(root, folder)
    if not os.path.isdir(d):
      raise UserError(f'{d}: LIVE folder not found (expected {", ".join(LIVE_FOLDERS)}, refimgs/ and the .mat files '
                      'of databaserelease2)')
    names = [n for n in os.listdir(d) if re.fullmatch(r'img\d+\.bmp', n)]
    dists += [os.path.join(d, n) for n in sorted(names, key=lambda n: int(n[3:-4]))]
  realigned = os.path.join(root, 'dmos_realigned.mat')
  dmos, orgs = (_mat(realigned, ('dmos_new', 'orgs')) if os.path.isfile(realigned)
                else _mat(os.path.join(root, 'dmos.mat'), ('dmos', 'orgs')))
  (refnames,) = _mat(os.path.join(root, 'refnames_all.mat'), ('refnames_all',))
  if not len(dmos) == len(orgs) == len(refnames) == len(dists):
    raise UserError(f'{root}: {len(dists)} images in the five folders but {len(dmos)} DMOS values, {len(orgs)} orgs '
                    f'flags and {len(refnames)} reference names (databaserelease2 has 982 of each)')
  inside = resolve.Root(os.path.join(root, 'refimgs')).inside
  keep = [i for i in range(len(dists)) if int(orgs[i]) == 0]
  refs = [inside(str(np.asarray(refnames[i]).reshape(-1)[0]), f'{root}/refnames_all.mat:entry {i + 1}', 'refname')
          for i in keep]
  dists = [dists[i] for i in keep]
  check_files(refs + dists, 'LIVE image')
  return QualitySet('live', refs, dists, -np.asarray(dmos, np.float64)[keep], False)


CSIQ_TYPES = {1: ('awgn', 'AWGN'), 2: ('jpeg', 'JPEG'), 3: ('jpeg2000', 'jpeg2000'), 4: ('fnoise', 'fnoise'),
              5: ('blur', 'BLUR'), 6: ('contrast', 'contrast')}   # dst_idx: (folder, file-name token)
CSIQ_XLSX = 'csiq.DMOS.xlsx'
CSIQ_COLUMNS = ('image', 'dst_idx', 'dst_lev', 'dmos')


def _csiq_table(xlsx: str) -> list[tuple[str, dict[str, str]]]:
  """[(where, {column: text})] of the DMOS sheet: all_by_image if the workbook has it, else its first sheet."""
  try:
    name, rows = readers.xlsx_rows(xlsx, 'all_by_image', 'CSIQ DMOS workbook')
  except UserError as e:
    if 'no sheet' not in str(e):
      raise
    name, rows = readers.xlsx_rows(xlsx, None, 'CSIQ DMOS workbook')
  for k, (line, cells) in enumerate(rows):
    header = [c.strip().lower() for c in cells]
    if all(c in header for c in CSIQ_COLUMNS):
      at = {c: header.index(c) for c in CSIQ_COLUMNS}
      out = []
      for n, r in rows[k + 1:]:
        if not any(c.strip() for c in r):
          continue
        where = f'{xlsx}:sheet {name} row {n}'
        if len(r) <= max(at.values()):
          raise UserError(f'{where}: {len(r)} cell(s); the header names {", ".join(CSIQ_COLUMNS)}')
        out.append((where, {c: r[i].strip() for c, i in at.items()}))
      return out
  raise UserError(f'{xlsx}: sheet {name} has no header row with {", ".join(CSIQ_COLUMNS)}')


def load_csiq(root: str) -> QualitySet:
  """CSIQ under `root` (csiq.DMOS.xlsx, src_imgs/, dst_imgs/<type>/)."""
  xlsx = os.path.join(root, CSIQ_XLSX)
  if not os.path.isfile(xlsx):
    raise UserError(f'{xlsx}: CSIQ {CSIQ_XLSX} not found (expected csiq.DMOS.xlsx, src_imgs/ and dst_imgs/ of the '
                    'CSIQ release)')
  ref_of = _References(os.path.join(root, 'src_imgs'), 'CSIQ src_imgs')
  listing = {}
  refs, dists, mos = [], [], []
  for where, row in _csiq_table(xlsx):
    t = readers.to_int(row['dst_idx'], where, 1, 6, 'dst_idx')
    lev = readers.to_int(row['dst_lev'], where, 1, 99, 'dst_lev')
    image = row['image']
    folder, token = CSIQ_TYPES[t]
    d = os.path.join(root, 'dst_imgs', folder)
    if folder not in listing:
      listing[folder] = ({n.lower(): n for n in os.listdir(d)} if os.path.isdir(d) else {})
    want = f'{image}.{token}.{lev}.png'
    if want.lower() not in listing[folder]:
      raise UserError(f'{where}: {os.path.join(d, want)}: CSIQ image not found')
    refs.append(ref_of(image, where, f'{image}.png'))
    dists.append(os.path.join(d, listing[folder][want.lower()]))
    mos.append(_number(row['dmos'], where, 'dmos'))
  if not dists:
    raise UserError(f'{xlsx}: no rows under the header')
  check_files(refs + dists, 'CSIQ image')
  return QualitySet('csiq', refs, dists, -np.asarray(mos, np.float64), False)


PIEAPP_SPLIT = 'test'


def _pieapp_files(root: str, suffix: str) -> list[str]:
  labels = os.path.join(root, 'labels', PIEAPP_SPLIT)
  if not os.path.isdir(labels):
    raise UserError(f'{labels}: PieAPP labels/test folder not found (expected reference_images/, distorted_images/ '
                    'and labels/ of all_data_PieAPP_dataset_CVPR_2018)')
  files = sorted(n for n in os.listdir(labels) if n.endswith(suffix))
  if not files:
    raise UserError(f'{labels}: no ref_<n>{suffix} files')
  return [os.path.join(labels, n) for n in files]


def _pieapp_rows(path: str, columns: int, what: str):
  """[(where, fields)] of a PieAPP label file (its header row skipped), each with at least `columns` fields."""
  out = []
  for line, r in readers.csv_rows(path, what)[1:]:
    if not any(c.strip() for c in r):
      continue
    where = f'{path}:line {line}'
    if len(r) < columns:
      raise UserError(f'{where}: {len(r)} field(s), a PieAPP {what} row has {columns}')
    out.append((where, [c.strip() for c in r]))
  return out


class _PieAPPImages:
  """The image of a name in a reference's label file: ref_* in reference_images/test/, else its distorted folder."""

  def __init__(self, root: str):
    self.refs = resolve.Root(os.path.join(root, 'reference_images', PIEAPP_SPLIT)).inside
    self.dists = resolve.Root(os.path.join(root, 'distorted_images', PIEAPP_SPLIT)).inside

  def __call__(self, name: str, ref: str, where: str, column: str) -> str:
    if name.startswith('ref_'):
      return self.refs(name, where, column)
    return self.dists(f'{os.path.splitext(ref)[0]}/{name}', where, column)


def load_pieapp(root: str) -> QualitySet:
  """PieAPP's test split as a quality set: labels/test/*_per_image_score.csv (module docstring)."""
  image = _PieAPPImages(root)
  refs, dists, mos = [], [], []
  for path in _pieapp_files(root, '_per_image_score.csv'):
    for where, r in _pieapp_rows(path, 3, 'per-image score file'):
      if r[1] == r[0]:
        continue   # the reference's own row (score 0 by construction)
      refs.append(image(r[0], r[0], where, 'reference'))
      dists.append(image(r[1], r[0], where, 'distorted image'))
      mos.append(_number(r[2], where, 'score'))
  if not dists:
    raise UserError(f'{os.path.join(root, "labels", PIEAPP_SPLIT)}: no per-image score rows')
  check_files(refs + dists, 'PieAPP image')
  return QualitySet('pieapp', refs, dists, -np.asarray(mos, np.float64), False)


def load_pieapp_2afc(root: str):
  """PieAPP's test split as 2AFC triplets: labels/test/*_pairwise_labels.csv (module docstring)."""
  from visim_jax.data.judgements import TwoAFCSet  # pylint: disable=g-import-not-at-top
  image = _PieAPPImages(root)
  ref, p0, p1, judge, ids = [], [], [], [], []
  for path in _pieapp_files(root, '_pairwise_labels.csv'):
    for where, r in _pieapp_rows(path, 4, 'pairwise label file'):
      p = _number(r[3], where, 'probability of preference for A')
      if not 0.0 <= p <= 1.0:
        raise UserError(f'{where}: the probability of preference for A is {r[3]}, not in [0, 1]')
      ref.append(image(r[0], r[0], where, 'reference'))
      p0.append(image(r[1], r[0], where, 'image A'))
      p1.append(image(r[2], r[0], where, 'image B'))
      judge.append(1.0 - p)
      ids.append(f'{os.path.basename(path)}:{where.rsplit(":", 1)[1]}')
  if not ref:
    raise UserError(f'{os.path.join(root, "labels", PIEAPP_SPLIT)}: no pairwise label rows')
  check_files(list(dict.fromkeys(ref + p0 + p1)), 'PieAPP image')
  return TwoAFCSet('pieapp', ref, p0, p1, np.asarray(judge, np.float32), ids)


LOADERS = {'kadid': load_kadid, 'tid2013': load_tid2013, 'pipal': load_pipal, 'live': load_live, 'csiq': load_csiq,
           'pieapp': load_pieapp}
