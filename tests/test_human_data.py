"""NIGHTS / BAPPS / THINGS loaders on folders in the exact published layouts (data/human_demo.py) and their
one-line errors on bad input."""
import hashlib
import os
import shutil

import numpy as np
import pytest

from visim_jax.data import bapps, human_demo, nights, things
from visim_jax.core.errors import UserError


def _copy(src, tmp_path):
  dst = tmp_path / os.path.basename(src)
  shutil.copytree(src, dst)
  return str(dst)


def test_nights_splits_filter_and_target(human_demo_sets):
  root = human_demo_sets.nights
  sizes = {s: len(nights.load(root, s)) for s in nights.SPLITS}
  # 24 / 8 / 16 rows with votes >= 6; the 4 test rows with votes 5 are dropped (DreamSim's filter)
  assert sizes == {'train': 24, 'val': 8, 'test': 16, 'test_imagenet': 8, 'test_no_imagenet': 8}
  assert len(nights.load(root, 'test', min_votes=5)) == 20
  t = nights.load(root, 'test')
  assert t.name == 'nights/test' and t.judge.dtype == np.float32 and set(t.judge.tolist()) <= {0.0, 1.0}
  import csv
  rows = {r['id']: r for r in csv.DictReader(open(os.path.join(root, 'data.csv')))}
  for i, rid in enumerate(t.ids):   # p0 = left_path, p1 = right_path, judge = right_vote (DreamSim's column 2)
    assert t.p0[i] == os.path.join(root, rows[rid]['left_path'])
    assert t.p1[i] == os.path.join(root, rows[rid]['right_path'])
    assert t.judge[i] == float(rows[rid]['right_vote'])
  assert sorted(nights.load(root, 'test_imagenet').ids + nights.load(root, 'test_no_imagenet').ids) == sorted(t.ids)
  assert len(t.paths()) == 3 * len(t)
  rows = t.rows({p: i for i, p in enumerate(t.paths())})
  assert [r.tolist() for r in rows] == [list(range(16 * k, 16 * k + 16)) for k in range(3)]


def test_nights_errors_name_the_file(human_demo_sets, tmp_path):
  root = _copy(human_demo_sets.nights, tmp_path)
  with pytest.raises(UserError, match='split'):
    nights.load(root, 'testing')
  os.remove(os.path.join(root, 'distort', '000', '040_1.png'))   # a test row (rows 32..47)
  with pytest.raises(UserError, match=r'040_1.png: NIGHTS image not found'):
    nights.load(root, 'test')
  assert len(nights.load(root, 'train')) == 24                   # other splits do not need that file
  csv_path = os.path.join(root, 'data.csv')
  text = open(csv_path).read()
  open(csv_path, 'w').write(text.replace('right_vote', 'rv', 1))
  with pytest.raises(UserError, match=r"data.csv: missing column\(s\) \['right_vote'\]"):
    nights.load(root, 'train')
  lines = text.splitlines()
  lines[1] = lines[1].replace(',0.0,1.0,', ',0.0,7.0,').replace(',1.0,0.0,', ',0.0,7.0,')
  open(csv_path, 'w').write('\n'.join(lines) + '\n')
  with pytest.raises(UserError, match=r'data.csv:line 2: right_vote .* not a fraction'):
    nights.load(root, 'train')
  with pytest.raises(UserError, match='NIGHTS data.csv not found'):
    nights.load(str(tmp_path / 'nowhere'), 'test')


def test_bapps_2afc_and_jnd(human_demo_sets):
  val = bapps.load_2afc(human_demo_sets.bapps, 'val')
  assert list(val) == list(bapps.TWOAFC_SETS['val']) and all(len(s) == 8 for s in val.values())
  assert list(bapps.load_2afc(human_demo_sets.bapps, 'train')) == ['traditional', 'cnn', 'mix']
  s = val['superres']
  assert s.name == 'bapps/2afc/val/superres' and s.ids == [f'{i:06d}' for i in range(8)]
  for i, n in enumerate(s.ids):     # sorted order; judge = the .npy value (fraction preferring p1)
    assert s.ref[i].endswith(f'superres/ref/{n}.png') and s.p1[i].endswith(f'superres/p1/{n}.png')
    assert s.judge[i] == np.load(os.path.join(human_demo_sets.bapps, '2afc/val/superres/judge', n + '.npy'))[0]
  assert list(bapps.load_2afc(human_demo_sets.bapps, 'val', sets='color,cnn')) == ['color', 'cnn']
  jnd = bapps.load_jnd(human_demo_sets.bapps)
  assert list(jnd) == ['traditional', 'cnn'] and len(jnd['cnn']) == 12 and jnd['cnn'].same.dtype == np.float32


def test_bapps_errors_name_the_file(human_demo_sets, tmp_path):
  root = _copy(human_demo_sets.bapps, tmp_path)
  with pytest.raises(UserError, match=r'2afc/val/nosuch: BAPPS set folder not found'):
    bapps.load_2afc(root, 'val', sets=['nosuch'])
  d = os.path.join(root, '2afc', 'val', 'cnn')
  os.remove(os.path.join(d, 'p1', '000003.png'))
  with pytest.raises(UserError, match=r'cnn/p1/000003\.\*: missing'):
    bapps.load_2afc(root, 'val')
  np.save(os.path.join(d, 'judge', '000009.npy'), np.zeros(1))   # a judgement without its images
  with pytest.raises(UserError, match=r'cnn/ref/000009\.\*: missing \(1 name\(s\) of judge/'):
    bapps.load_2afc(root, 'val', sets=['cnn'])
  e = os.path.join(root, '2afc', 'val', 'color', 'judge', '000002.npy')
  np.save(e, np.asarray([1.5]))
  with pytest.raises(UserError, match=r'color/judge/000002.npy: judge fraction 1.5 is outside'):
    bapps.load_2afc(root, 'val', sets=['color'])
  open(e, 'w').write('not numpy')
  with pytest.raises(UserError, match=r'000002.npy: not a readable .npy'):
    bapps.load_2afc(root, 'val', sets=['color'])
  shutil.rmtree(os.path.join(root, 'jnd'))
  with pytest.raises(UserError, match=r'jnd/val: BAPPS JND folder not found'):
    bapps.load_jnd(root)


def test_things_forms_agree(human_demo_sets):
  h = human_demo_sets
  ds = things.load(h.things, h.things_dreamsim)                          # auto -> dreamsim
  osf = things.load(h.things, h.things_osf, names_file=h.things_names)   # auto -> osf
  osf_sorted = things.load(h.things, h.things_osf, form='osf')           # sorted folder = concept order
  assert len(ds) == len(osf) == 32 and (ds.odd == 2).all() and set(osf.odd.tolist()) == {0, 1, 2}

  def triplet_sets(s):   # (frozenset of the pair, odd image) per triplet
    out = []
    for t, o in zip(s.triplets, s.odd):
      names = [os.path.basename(s.images[i]) for i in t]
      out.append((frozenset(n for k, n in enumerate(names) if k != o), names[o]))
    return out
  assert triplet_sets(ds) == triplet_sets(osf) == triplet_sets(osf_sorted)
  # every odd one is a view of another photo than the pair's
  assert all(len({n.rsplit('_', 1)[0] for n in pair}) == 1 and odd.rsplit('_', 1)[0] not in
             {n.rsplit('_', 1)[0] for n in pair} for pair, odd in triplet_sets(ds))
  assert things.load(h.things, h.things_osf, noise_ceiling=0).triplets.shape == (32, 3)


def test_things_osf_line_reader_equals_the_fast_one(human_demo_sets, tmp_path):
  h = human_demo_sets
  fast = things.load(h.things, h.things_osf)
  lines = open(h.things_osf).read().splitlines()
  first = lines[1].split('\t')
  lines[1] = '\t'.join([first[0] + '.0'] + first[1:])          # '7.0': np.loadtxt refuses it, the line reader not
  (tmp_path / 't.csv').write_text('\n'.join(lines) + '\n')
  slow = things.load(h.things, str(tmp_path / 't.csv'))
  assert slow.images == fast.images and (slow.triplets == fast.triplets).all() and (slow.odd == fast.odd).all()


def test_things_index0_and_errors(human_demo_sets, tmp_path):
  h = human_demo_sets
  f = tmp_path / 'validationset.txt'
  f.write_text('0 1 2\n3 4 5\n')
  s = things.load(h.things, str(f), form='index0')
  names = sorted(os.listdir(h.things))
  assert [os.path.basename(p) for p in s.images] == names[:6] and s.triplets.tolist() == [[0, 1, 2], [3, 4, 5]]
  f.write_text('0 1 2\n3 4 99\n')
  with pytest.raises(UserError, match=r'validationset.txt:line 2: image index \[3, 4, 99\] outside 0..31'):
    things.load(h.things, str(f), form='index0')
  f.write_text('a b\n')
  with pytest.raises(UserError, match=r'line 1: expected three image names'):
    things.load(h.things, str(f))
  f.write_text('image1\timage2\timage3\tchoice\n1\t2\t3\t4\n')
  with pytest.raises(UserError, match=r'line 2: choice must be 1, 2 or 3'):
    things.load(h.things, str(f))
  f.write_text('astronaut_1 astronaut_2 nosuch\n')
  with pytest.raises(UserError, match=r'nosuch.png: THINGS image not found'):
    things.load(h.things, str(f))
  with pytest.raises(UserError, match='triplet file not found'):
    things.load(h.things, str(tmp_path / 'none.txt'))


def _digest(folder):
  h = hashlib.sha256()
  for dirpath, dirnames, files in os.walk(folder):
    dirnames.sort()
    for n in sorted(files):
      if n != 'DONE.json':
        h.update(os.path.relpath(os.path.join(dirpath, n), folder).encode())
        h.update(open(os.path.join(dirpath, n), 'rb').read())
  return h.hexdigest()


def test_human_demo_is_deterministic(human_demo_sets, tmp_path):
  again = human_demo.demo_sets(str(tmp_path), seed=0)
  assert again.root != human_demo_sets.root and _digest(again.root) == _digest(human_demo_sets.root)
  assert human_demo.demo_sets(str(tmp_path), seed=0) == again            # written once


def test_verify_images_and_subset(human_demo_sets, tmp_path):
  from visim_jax.data import judgements
  t = nights.load(human_demo_sets.nights, 'val')
  judgements.verify_images(t.paths()[:3])
  bad = tmp_path / 'cut.png'
  bad.write_bytes(open(t.ref[0], 'rb').read()[:200])
  with pytest.raises(UserError, match=r'cut.png: corrupt, truncated'):
    judgements.verify_images([t.ref[1], str(bad)])
  s = t.subset([2, 0], name='two')
  assert s.name == 'two' and s.ref == [t.ref[2], t.ref[0]] and s.ids == [t.ids[2], t.ids[0]]
  assert s.judge.tolist() == [t.judge[2], t.judge[0]]
  with pytest.raises(UserError, match='image has no row in the features'):
    t.rows({})
