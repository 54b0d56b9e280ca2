"""Mini KADID-10k, TID2013 and PIPAL sets in their published layouts, from packaged photos only (issue 47's `:demo`).

4 references (192 x 192 crops of the packaged photos) x 4 distortion families of data/human_demo.py (blur, noise,
colour, superres) x 4 levels = 64 distorted images, named as KADID-10k names them (I<ref>_<family>_<level>.png).
The simulated DMOS (1..5, higher = better, as KADID-10k's): 5 - 4 v / (v + 0.35) + N(0, 0.15), v = the level times
a per-family visibility (blur 1.0, noise 1.3, colour 0.6, superres 0.9) times a log-normal factor per image, so
metrics that weigh the families differently rank differently. These are simulated opinions: the numbers rank
metrics on this toy set only and are not comparable with the published ones (QUALITY_DEMO_NOTE). The same images
and scores are written in six layouts (TID2013's MOS = (DMOS - 1) 9 / 4, PIPAL's Elo = 1000 + 250 DMOS, LIVE's
DMOS = (5 - DMOS) 20, higher = worse; CSIQ's DMOS = (5 - DMOS) / 4 in a csiq.DMOS.xlsx written with the standard
library, families as dst_idx 5 blur, 1 awgn, 6 contrast, 3 jpeg2000; PieAPP's per-image score = 5 - DMOS (higher =
worse, the reference's own row 0) and, per reference, 16 pairs (each image with the next in family-then-level order,
and the first with the reference as A), P(A closer) = 1 / (1 + exp((score_A - score_B) / 0.5)) rounded to 1/40 (40 observers), its test split only).
"""
from __future__ import annotations

import os

import numpy as np

from visim_jax.core import ops
from visim_jax.data import demo, human_demo

QUALITY_DEMO_VERSION = 5
SIZE = 192
FAMILIES = {'blur': 1.0, 'noise': 1.3, 'colour': 0.6, 'superres': 0.9}
LEVELS = (0.1, 0.25, 0.45, 0.7)
QUALITY_DEMO_NOTE = ('demo data: a mini KADID-10k built from 4 packaged photos with synthetic distortions and '
                     'simulated opinion scores (visim_jax/data/quality_demo.py); the correlations rank metrics on '
                     'this toy set only and are NOT comparable with published KADID-10k numbers')


def _build(folder: str, seed: int) -> None:
  """The same 4 x 16 renderings and simulated scores written in the KADID-10k, TID2013 and PIPAL layouts."""
  rng = np.random.RandomState(seed)
  sources = demo.source_images()
  names = sorted(n for n, im in sources.items() if min(im.size) >= SIZE)[:4]
  rows = []   # (ref index, family index, level index, reference image, distorted image, dmos 1..5)
  for r, name in enumerate(names, 1):
    ref, _ = human_demo._crop(sources[name].convert('RGB'), rng, SIZE)   # pylint: disable=protected-access
    for f, (family, vis) in enumerate(FAMILIES.items(), 1):
      for lv, level in enumerate(LEVELS, 1):
        v = level * vis * float(np.exp(rng.normal(0.0, 0.25)))
        dmos = float(np.clip(5.0 - 4.0 * v / (v + 0.35) + rng.normal(0.0, 0.15), 1.0, 5.0))
        rows.append((r, f, lv, ref, human_demo.render(ref, family, level, rng), dmos))
  save = human_demo._save   # pylint: disable=protected-access
  kadid, csv_rows = os.path.join(folder, 'kadid10k'), []
  tid, tid_lines = os.path.join(folder, 'tid2013'), []
  pipal, pipal_lines = os.path.join(folder, 'pipal'), {}
  for r, f, lv, ref, dist, dmos in rows:
    save(ref, os.path.join(kadid, 'images', f'I{r:02d}.png'))
    save(dist, os.path.join(kadid, 'images', f'I{r:02d}_{f:02d}_{lv:02d}.png'))
    csv_rows.append((f'I{r:02d}_{f:02d}_{lv:02d}.png', f'I{r:02d}.png', f'{dmos:.4f}', '0.5000'))
    ref.save(os.path.join(_dir(tid, 'reference_images'), f'I{r:02d}.BMP'), 'BMP')
    dist.save(os.path.join(_dir(tid, 'distorted_images'), f'i{r:02d}_{f:02d}_{lv}.bmp'), 'BMP')
    tid_lines.append(f'{(dmos - 1.0) * 9.0 / 4.0:.5f} i{r:02d}_{f:02d}_{lv}.bmp')
    ref.save(os.path.join(_dir(pipal, 'Train_Ref'), f'A{r:04d}.bmp'), 'BMP')
    dist.save(os.path.join(_dir(pipal, 'Train_Dis'), f'A{r:04d}_{f:02d}_{lv:02d}.bmp'), 'BMP')
    pipal_lines.setdefault(r, []).append(f'A{r:04d}_{f:02d}_{lv:02d}.bmp,{1000.0 + 250.0 * dmos:.4f}')
  _live(os.path.join(folder, 'live'), rows)
  _csiq(os.path.join(folder, 'csiq'), rows)
  _pieapp(os.path.join(folder, 'pieapp'), rows)
  ops.atomic_write_text(os.path.join(kadid, 'dmos.csv'),
                        human_demo._csv_text(('dist_img', 'ref_img', 'dmos', 'var'), csv_rows))  # pylint: disable=protected-access
  ops.atomic_write_text(os.path.join(tid, 'mos_with_names.txt'), '\n'.join(tid_lines) + '\n')
  for r, lines in pipal_lines.items():
    ops.atomic_write_text(os.path.join(_dir(pipal, 'Train_Label'), f'A{r:04d}.txt'), '\n'.join(lines) + '\n')


def _live(live: str, rows) -> None:
  """LIVE Release 2's layout: family f -> folder f of LIVE's five (4 used), img<k>.bmp in row order, one
  reference row per folder (orgs = 1, as LIVE lists them), DMOS = (5 - dmos) 20 (higher = worse)."""
  from scipy import io  # pylint: disable=g-import-not-at-top
  from visim_jax.data import quality  # pylint: disable=g-import-not-at-top
  names, dmos, orgs = [], [], []
  for f, folder in enumerate(quality.LIVE_FOLDERS, 1):
    k = 0
    for r, ff, _, ref, dist, score in rows:
      if ff != f:
        continue
      k += 1
      dist.save(os.path.join(_dir(live, folder), f'img{k}.bmp'), 'BMP')
      ref.save(os.path.join(_dir(live, 'refimgs'), f'ref{r}.bmp'), 'BMP')
      names.append(f'ref{r}.bmp')
      dmos.append((5.0 - score) * 20.0)
      orgs.append(0)
    if k:   # LIVE also lists the references inside each folder (orgs = 1): one here, left out by the loader
      ref0 = next(row for row in rows if row[1] == f)
      ref0[3].save(os.path.join(live, folder, f'img{k + 1}.bmp'), 'BMP')
      names.append(f'ref{ref0[0]}.bmp')
      dmos.append(0.0)
      orgs.append(1)
  cells = np.empty((1, len(names)), dtype=object)
  cells[0, :] = names
  io.savemat(os.path.join(live, 'refnames_all.mat'), {'refnames_all': cells})
  io.savemat(os.path.join(live, 'dmos_realigned.mat'), {'dmos_new': np.asarray([dmos]), 'orgs': np.asarray([orgs])})
  _dir(live, 'fastfading')   # the fifth folder (empty here)


CSIQ_TYPE_OF_FAMILY = (5, 1, 6, 3)   # blur, noise, colour, superres -> CSIQ's dst_idx


def _csiq(csiq: str, rows) -> None:
  """CSIQ's layout: src_imgs/<image>.png, dst_imgs/<folder>/<image>.<TYPE>.<level>.png, csiq.DMOS.xlsx."""
  from visim_jax.data import quality  # pylint: disable=g-import-not-at-top
  table = [['CSIQ demo: simulated opinions (visim_jax/data/quality_demo.py)'],
           ['image', 'dst_idx', 'dst_type', 'dst_lev', 'dmos_std', 'dmos']]
  for r, f, lv, ref, dist, dmos in rows:
    t = CSIQ_TYPE_OF_FAMILY[f - 1]
    folder, token = quality.CSIQ_TYPES[t]
    ref.save(os.path.join(_dir(csiq, 'src_imgs'), f'img{r}.png'))
    dist.save(os.path.join(_dir(csiq, 'dst_imgs', folder), f'img{r}.{token}.{lv}.png'))
    table.append([f'img{r}', t, folder, lv, 0.05, round((5.0 - dmos) / 4.0, 6)])
  write_xlsx(os.path.join(csiq, quality.CSIQ_XLSX), 'all_by_image', table)


def _pieapp(pieapp: str, rows) -> None:
  """PieAPP's test split: reference_images/test/, distorted_images/test/ref_<n>/, labels/test/*.csv."""
  per_ref = {}
  for r, f, lv, ref, dist, dmos in rows:
    name = f'ref_{r:04d}'
    ref.save(os.path.join(_dir(pieapp, 'reference_images', 'test'), f'{name}.png'))
    d = f'distort_{r:04d}_{list(FAMILIES)[f - 1]}_inter_{lv}.png'
    dist.save(os.path.join(_dir(pieapp, 'distorted_images', 'test', name), d))
    per_ref.setdefault(name, []).append((d, 5.0 - dmos))
  labels = _dir(pieapp, 'labels', 'test')
  for name, items in per_ref.items():
    score = [f'{name}.png,{name}.png,0.0000'] + [f'{name}.png,{d},{s:.4f}' for d, s in items]
    ops.atomic_write_text(os.path.join(labels, f'{name}_per_image_score.csv'),
                          'ref. image,distorted image,score for distorted image\n' + '\n'.join(score) + '\n')
    pairs = [((f'{name}.png', 0.0), items[0])] + list(zip(items, items[1:]))   # 16 pairs per reference
    lines = [f'{name}.png,{a},{b},{round(40.0 / (1.0 + np.exp((sa - sb) / 0.5))) / 40.0:.3f}'
             for (a, sa), (b, sb) in pairs]
    ops.atomic_write_text(os.path.join(labels, f'{name}_pairwise_labels.csv'),
                          'ref. image,distorted image A,distorted image B,probability of preference for image A\n'
                          + '\n'.join(lines) + '\n')


def write_xlsx(path: str, sheet: str, table) -> None:
  """A one-sheet .xlsx (Office Open XML) with the standard library: strings as shared strings, numbers as numbers
  (what core/readers.xlsx_rows reads; the demo's and the tests' CSIQ workbook)."""
  import zipfile  # pylint: disable=g-import-not-at-top
  from xml.sax.saxutils import escape  # pylint: disable=g-import-not-at-top
  main = 'http://schemas.openxmlformats.org/spreadsheetml/2006/main'
  rel = 'http://schemas.openxmlformats.org/officeDocument/2006/relationships'
  strings, cells = {}, []
  for i, row in enumerate(table, 1):
    out = []
    for j, v in enumerate(row):
      ref = f'{chr(65 + j)}{i}'
      if isinstance(v, str):
        out.append(f'<c r="{ref}" t="s"><v>{strings.setdefault(v, len(strings))}</v></c>')
      else:
        out.append(f'<c r="{ref}"><v>{v!r}</v></c>')
    cells.append(f'<row r="{i}">{"".join(out)}</row>')
  parts = {
      '[Content_Types].xml': (
          '<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
          '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
          '<Default Extension="xml" ContentType="application/xml"/>'
          '<Override PartName="/xl/workbook.xml" ContentType="application/vnd.openxmlformats-officedocument.'
          'spreadsheetml.sheet.main+xml"/><Override PartName="/xl/worksheets/sheet1.xml" ContentType="application/'
          'vnd.openxmlformats-officedocument.spreadsheetml.worksheet+xml"/><Override PartName="/xl/sharedStrings.xml" '
          'ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.sharedStrings+xml"/></Types>'),
      '_rels/.rels': (
          '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships"><Relationship '
          'Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/officeDocument" '
          'Target="xl/workbook.xml"/></Relationships>'),
      'xl/workbook.xml': (f'<workbook xmlns="{main}" xmlns:r="{rel}"><sheets><sheet name="{escape(sheet)}" '
                          'sheetId="1" r:id="rId1"/></sheets></workbook>'),
      'xl/_rels/workbook.xml.rels': (
          '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships"><Relationship '
          f'Id="rId1" Type="{rel}/worksheet" Target="worksheets/sheet1.xml"/><Relationship Id="rId2" '
          f'Type="{rel}/sharedStrings" Target="sharedStrings.xml"/></Relationships>'),
      'xl/worksheets/sheet1.xml': f'<worksheet xmlns="{main}"><sheetData>{"".join(cells)}</sheetData></worksheet>',
      'xl/sharedStrings.xml': (f'<sst xmlns="{main}" count="{len(strings)}" uniqueCount="{len(strings)}">'
                               + ''.join(f'<si><t>{escape(s)}</t></si>' for s in strings) + '</sst>'),
  }
  os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
  with zipfile.ZipFile(path + '.tmp', 'w', zipfile.ZIP_DEFLATED) as z:
    for name, text in parts.items():
      z.writestr(name, '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n' + text)
  os.replace(path + '.tmp', path)


def _dir(*parts) -> str:
  path = os.path.join(*parts)
  os.makedirs(path, exist_ok=True)
  return path


def quality_demo(root: str | None = None, seed: int = 0, cache_dir: str | None = None) -> dict[str, str]:
  """Writes (once) the mini sets and returns {'kadid' | 'tid2013' | 'pipal' | 'live' | 'csiq' | 'pieapp': folder}
  (root as data/demo.py's)."""
  folder = demo.write_once(root or demo.default_root(cache_dir), f'quality-v{QUALITY_DEMO_VERSION}-seed{seed}',
                           lambda f: _build(f, seed), {'version': QUALITY_DEMO_VERSION, 'seed': seed})
  return {'kadid': os.path.join(folder, 'kadid10k'), 'tid2013': os.path.join(folder, 'tid2013'),
          'pipal': os.path.join(folder, 'pipal'), 'live': os.path.join(folder, 'live'),
          'csiq': os.path.join(folder, 'csiq'), 'pieapp': os.path.join(folder, 'pieapp')}


def kadid_demo(root: str | None = None, seed: int = 0, cache_dir: str | None = None) -> str:
  return quality_demo(root, seed, cache_dir)['kadid']
