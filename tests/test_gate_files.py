"""The gate for data files (issue 28 items 2 and 7): a hostile corpus made in tmp_path, no binary fixtures.

Every path read from a data file resolves inside its root (data/resolve.py): absolute paths, `..` and symbolic links
out are refused in one line naming the file and line; every text reader accepts UTF-8 with or without a BOM and turns
other bytes, short rows and overflowing integers into one UserError naming the file and line (readers.py); images
that do not decode name the file (data/images.py). Each case asserts: a user error (errors.is_user_error), one line,
the file (and line) named.
"""
import os
import pickle

import numpy as np
import pytest

from visim_jax.core import readers
from visim_jax.data import bapps, images, nights, pairs, resolve, retrieval, things
from visim_jax.data import cosis
from visim_jax.core.errors import UserError
from user_errors import refused


def _touch(path, data=b'x'):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'wb') as f:
    f.write(data)
  return str(path)


# ----------------------------------------------------------------------------------------------- the resolver

def test_resolver_refuses_absolute_dotdot_and_links_out(tmp_path):
  root = tmp_path / 'root'
  _touch(root / 'a' / 'x.png')
  _touch(tmp_path / 'outside' / 'y.png')
  assert resolve.inside(str(root), 'a/x.png', 'f.csv:line 2') == str(root / 'a' / 'x.png')
  refused(lambda: resolve.inside(str(root), '/etc/passwd', 'f.csv:line 2', 'ref_path'),
           'f.csv:line 2: ref_path', "'/etc/passwd'", 'is absolute')
  refused(lambda: resolve.inside(str(root), '../outside/y.png', 'f.csv:line 3', 'ref_path'),
           'f.csv:line 3', "'../outside/y.png'", f'leads outside {root}')
  refused(lambda: resolve.inside(str(root), 'a/../../outside/y.png', 'f.csv:line 3'), '..')
  os.symlink(tmp_path / 'outside' / 'y.png', root / 'a' / 'link.png')
  os.symlink(tmp_path / 'outside', root / 'dirlink')
  refused(lambda: resolve.inside(str(root), 'a/link.png', 'f.csv:line 4'), 'symbolic link')
  refused(lambda: resolve.inside(str(root), 'dirlink/y.png', 'f.csv:line 5'), 'symbolic link')
  os.symlink(root / 'a' / 'x.png', root / 'a' / 'inner.png')                    # a link inside the root: fine
  assert resolve.inside(str(root), 'a/inner.png', 'w') == str(root / 'a' / 'inner.png')
  os.symlink(root, tmp_path / 'alias')                                            # a root that is a link: fine
  assert resolve.inside(str(tmp_path / 'alias'), 'a/x.png', 'w') == str(tmp_path / 'alias' / 'a' / 'x.png')
  refused(lambda: resolve.check_tree(str(root), [str(root / 'a' / 'link.png')], 'BAPPS file'),
           str(root / 'a' / 'link.png'), 'outside')
  resolve.check_tree(str(root), [str(root / 'a' / 'inner.png'), str(root / 'a' / 'x.png')])


# ----------------------------------------------------------------------------------------------------- NIGHTS

HEADER = 'id,left_vote,right_vote,votes,ref_path,left_path,right_path,prompt,split,is_imagenet\n'


def _nights(tmp_path, rows, header=HEADER, encoding='utf-8'):
  root = tmp_path / 'nights'
  for i in range(2):
    for f in (f'ref/000/00{i}.png', f'distort/000/00{i}_0.png', f'distort/000/00{i}_1.png'):
      _touch(root / f)
  text = header + ''.join(rows)
  (root / 'data.csv').write_bytes(text.encode(encoding))
  return str(root)


def _row(i, ref=None, split='test'):
  ref = ref or f'ref/000/00{i}.png'
  return f'{i},1.0,0.0,6,{ref},distort/000/00{i}_0.png,distort/000/00{i}_1.png,a cat,{split},True\n'


def test_nights_paths_stay_inside_the_folder(tmp_path):
  root = _nights(tmp_path, [_row(0), _row(1)])
  assert len(nights.load(root, 'test')) == 2
  csv_path = os.path.join(root, 'data.csv')
  _touch(tmp_path / 'outside' / 'x.png')
  for bad in ('../outside/x.png', '/etc/passwd', str(tmp_path / 'outside' / 'x.png')):
    root = _nights(tmp_path, [_row(0), _row(1, bad)])
    refused(lambda: nights.load(root, 'test'), f'{csv_path}:line 3: ref_path', repr(bad), 'leads outside')
  root = _nights(tmp_path, [_row(0), _row(1)])
  os.remove(os.path.join(root, 'ref/000/001.png'))
  os.symlink('/etc/passwd', os.path.join(root, 'ref/000/001.png'))               # a link out: refused too
  refused(lambda: nights.load(root, 'test'), f'{csv_path}:line 3', 'symbolic link')


def test_nights_csv_bytes(tmp_path):
  root = _nights(tmp_path, [_row(0), _row(1)], encoding='utf-8-sig')              # a spreadsheet's BOM: fine
  t = nights.load(root, 'test')
  assert t.ids == ['0', '1'] and len(t) == 2
  csv_path = os.path.join(root, 'data.csv')
  root = _nights(tmp_path, [_row(0), _row(1).replace('a cat', 'un chat \xe9')], encoding='latin-1')
  refused(lambda: nights.load(root, 'test'), f'{csv_path}:line 3', 'not UTF-8')
  root = _nights(tmp_path, [_row(0), '1,1.0,0.0,6,ref/000/001.png\n'])             # a short row
  refused(lambda: nights.load(root, 'test'), f'{csv_path}:line 3', 'missing', 'right_path')
  root = _nights(tmp_path, [_row(0), _row(1).replace('a cat', '"a cat')])          # an unterminated quote
  refused(lambda: nights.load(root, 'train'), csv_path)


# ----------------------------------------------------------------------------------------------------- THINGS

def _things(tmp_path, n=4):
  root = tmp_path / 'things'
  for i in range(n):
    _touch(root / f'im{i}.png')
  return str(root)


def test_things_names_and_lists_stay_inside(tmp_path):
  root = _things(tmp_path)
  names = tmp_path / 'names.txt'
  names.write_text('im0\nim1\n../../x\nim3\n')
  tri = tmp_path / 'tri.txt'
  tri.write_text('0 1 3\n')
  refused(lambda: things.load(root, str(tri), 'index0', str(names)), f'{names}:line 3', "'../../x'", 'outside')
  names.write_text('im0\nim1\n/etc/passwd\nim3\n')
  refused(lambda: things.load(root, str(tri), 'index0', str(names)), f'{names}:line 3', 'absolute')
  lst = tmp_path / 'valset.txt'
  lst.write_text('im0 im1 im2\nim0 ../../../etc/passwd im1\n')
  refused(lambda: things.load(root, str(lst), 'dreamsim'), f'{lst}:line 2', 'outside')
  os.symlink('/etc/hostname', os.path.join(root, 'im9.png'))                     # a listed file linking out
  tri.write_text('0 1 4\n')                                                      # sorted: im9 is the fifth
  refused(lambda: things.load(root, str(tri), 'index0'), 'im9.png', 'outside')


def test_things_bytes_and_integers(tmp_path):
  root = _things(tmp_path)
  tri = tmp_path / 'tri.txt'
  tri.write_bytes('\ufeff0 1 2\n1 2 3\n'.encode('utf-8'))                        # BOM: fine
  assert things.load(root, str(tri), 'index0').triplets.tolist() == [[0, 1, 2], [1, 2, 3]]
  for bad in ('1e29', 'inf', 'nan', '1.5', '99999999999999999999999'):
    tri.write_text(f'0 1 2\n1 {bad} 3\n')
    refused(lambda: things.load(root, str(tri), 'index0'), f'{tri}:line 2', bad)
  tri.write_bytes(b'0 1 2\n1 2 \xff\n')
  refused(lambda: things.load(root, str(tri), 'index0'), f'{tri}:line 2', 'not UTF-8')
  osf = tmp_path / 'osf.csv'
  osf.write_text('image1\timage2\timage3\tchoice\n1\t2\t3\t1\n1\t2\t4\t1e29\n')
  refused(lambda: things.load(root, str(osf)), f'{osf}:line 3', '1e29', '2147483647')
  names = tmp_path / 'names.txt'
  names.write_bytes(b'im0\nim1\n\xe9\n')
  tri.write_text('0 1 2\n')
  refused(lambda: things.load(root, str(tri), 'index0', str(names)), f'{names}:line 3', 'not UTF-8')


# ------------------------------------------------------------------------------------------- BAPPS, TLL, CSV

def test_bapps_and_tll_files_linking_out_are_refused(tmp_path):
  s = tmp_path / 'bapps' / 'jnd' / 'val' / 'cnn'
  for part in ('p0', 'p1'):
    _touch(s / part / '000000.png')
  (s / 'same').mkdir()
  np.save(s / 'same' / '000000.npy', np.float32(0.5))
  assert len(bapps.load_jnd(str(tmp_path / 'bapps'), 'cnn')['cnn']) == 1
  refused(lambda: bapps.load_jnd(str(tmp_path / 'bapps'), 'nosuch'), 'nosuch: BAPPS set folder not found',
          'config.bapps_jnd_sets')
  os.symlink('/etc/hostname', s / 'p1' / '000001.png')
  np.save(s / 'same' / '000001.npy', np.float32(0.5))
  _touch(s / 'p0' / '000001.png')
  refused(lambda: bapps.load_jnd(str(tmp_path / 'bapps'), 'cnn'), str(s / 'p1' / '000001.png'), 'outside')
  tll = tmp_path / 'tll'
  for side in ('left', 'right'):
    _touch(tll / side / 'a.png')
  assert pairs.load_pairs(str(tll)).names == ['a.png']
  os.symlink('/etc/hostname', tll / 'left' / 'b.png')
  _touch(tll / 'right' / 'b.png')
  refused(lambda: pairs.load_pairs(str(tll)), str(tll / 'left' / 'b.png'), 'outside')
  sub = tmp_path / 'subset.csv'
  sub.write_bytes(b',TLL_obj\n0,a.png\n1,\xff.png\n')
  refused(lambda: pairs.read_subset(str(sub)), f'{sub}:line 3', 'not UTF-8')


def test_generic_triplet_csv_paths_stay_beside_it(tmp_path):
  for n in ('r.png', 'x.png', 'y.png'):
    _touch(tmp_path / 'set' / n)
  csv_path = tmp_path / 'set' / 'set.csv'
  csv_path.write_text('\ufeffref,a,b,label\nr.png,x.png,y.png,a\n', encoding='utf-8')
  assert len(cosis.load_triplet_csv(str(csv_path))) == 1
  csv_path.write_text(f'r.png,x.png,{tmp_path / "set" / "y.png"},a\n')
  refused(lambda: cosis.load_triplet_csv(str(csv_path)), f'{csv_path}:line 1: b', 'absolute')
  csv_path.write_text('r.png,../set/x.png,y.png,a\n')
  refused(lambda: cosis.load_triplet_csv(str(csv_path)), f'{csv_path}:line 1: a', 'outside')
  d = tmp_path / 'dist_1.txt'
  d.write_text('1 2 1 3 2 99999999999999999999 3\n')
  refused(lambda: cosis.read_cosis_rows(str(d)), f'{d}:line 1', '2^31')
  d.write_bytes(b'1 2 1 3 2 4 3\n\xfe\n')
  refused(lambda: cosis.read_cosis_rows(str(d)), f'{d}:line 2', 'not UTF-8')


def test_retrieval_ground_truth_with_bad_values(tmp_path):
  p = tmp_path / 'gnd_x.pkl'
  p.write_bytes(pickle.dumps({'imlist': ['a', 'b'], 'qimlist': ['a'],
                              'gnd': [{'easy': ['zero'], 'hard': [], 'junk': [], 'bbx': [0, 0, 1, 1]}]}))
  refused(lambda: retrieval.load_revisited_gnd(str(p)), str(p), "gnd[0]['easy']", 'integer')
  p.write_bytes(pickle.dumps({'imlist': ['a'], 'qimlist': ['a'], 'gnd': 'x'}))
  refused(lambda: retrieval.load_revisited_gnd(str(p)), str(p), 'lists')
  p.write_bytes(pickle.dumps({'imlist': ['a']})[:-5])                               # truncated pickle
  refused(lambda: retrieval.load_revisited_gnd(str(p)), str(p), 'not a readable pickle')
  gt = tmp_path / 'gt'
  _touch(gt / 'q_1_query.txt', b'a 0 0 1 1\n')
  for s in ('good', 'ok', 'junk'):
    _touch(gt / f'q_1_{s}.txt', b'b\n')
  assert len(retrieval.load_classic_gt(str(gt))) == 1
  _touch(gt / 'q_1_good.txt', b'b\n\xff\n')
  refused(lambda: retrieval.load_classic_gt(str(gt)), 'q_1_good.txt:line 2', 'not UTF-8')


# ---------------------------------------------------------------------------------------------------- readers

def test_readers_one_line_each(tmp_path):
  assert readers.to_int(' 7 ', 'w') == 7 and readers.to_int('7.0', 'w') == 7 and readers.to_int('+3', 'w') == 3
  for bad in ('1e29', 'inf', '-inf', 'nan', '1.5', 'x', ''):
    refused(lambda: readers.to_int(bad, 'f.txt:line 9', -2**31, 2**31 - 1, 'index'), 'f.txt:line 9: index')
  j = tmp_path / 'index.json'
  j.write_text('[1, 2]')
  refused(lambda: readers.read_json(str(j), dict, 'shard index'), str(j), 'JSON list', 'JSON object')
  j.write_text('{"a": ')
  refused(lambda: readers.read_json(str(j)), f'{j}:line 1', 'not valid JSON')
  j.write_text('[' * 100000 + ']' * 100000)
  refused(lambda: readers.read_json(str(j)), str(j))
  j.write_bytes('\ufeff{"a": 1}'.encode())
  assert readers.read_json(str(j)) == {'a': 1}
  c = tmp_path / 't.csv'
  c.write_text('a,b,c\n1,2,3\n\n4,5\n')
  refused(lambda: readers.csv_table(str(c), ('a', 'c')), f'{c}:line 4', "missing ['c']")
  c.write_bytes(b'\xef\xbb\xbfid,x\n1,2\n')
  assert readers.csv_table(str(c), ('id',)) == (['id', 'x'], [(2, {'id': '1'})])


# ----------------------------------------------------------------------------------------------------- images

def test_undecodable_images_name_the_file(tmp_path, monkeypatch):
  from PIL import Image
  ok = tmp_path / 'ok.png'
  Image.fromarray(np.zeros((64, 64, 3), np.uint8) + 7).save(ok)
  data = ok.read_bytes()
  cases = {'cut.png': data[:len(data) // 2], 'empty.png': b'', 'text.png': b'hello, not a png\n'}
  for name, raw in cases.items():
    p = _touch(tmp_path / name, raw)
    line = refused(lambda: images.open_rgb(p), p)
    assert isinstance(images.ImageError(line), UserError)
  monkeypatch.setattr(Image, 'MAX_IMAGE_PIXELS', 64 * 64 // 4)                    # 64 x 64 > 2 x the limit: a bomb
  refused(lambda: images.open_rgb(str(ok)), str(ok), 'decompression bomb')


# ------------------------------------------------------------------------------------------- end to end (CLI)

def test_benchmark_cli_refuses_a_nights_path_out_of_its_folder(tmp_path):
  """`python -m visim_jax.main` on a NIGHTS folder whose data.csv names ../../../etc/passwd: exit 1, one line naming
  the file and line, no traceback, the workdir's files as they were (the runtime's .lock aside)."""
  import subprocess
  import sys
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  root = _nights(tmp_path, [_row(0, '../../../etc/passwd')])
  work = tmp_path / 'work'
  _touch(work / 'note.txt', b'keep')
  env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=repo)
  r = subprocess.run([sys.executable, '-m', 'visim_jax.main', f'--config={repo}/configs/benchmark.py',
                      f'--workdir={work}', f'--config.nights_dir={root}', '--config.nights_splits=test',
                      f'--config.cache_dir={tmp_path / "cache"}'], env=env, capture_output=True, text=True)
  lines = r.stderr.strip().splitlines()
  assert r.returncode == 1 and len(lines) == 1 and 'Traceback' not in r.stderr, r.stderr[-3000:]
  assert lines[0].startswith(f'error: {root}/data.csv:line 2: ref_path') and 'leads outside' in lines[0], lines
  assert sorted(set(os.listdir(work)) - {'.lock'}) == ['note.txt'] and (work / 'note.txt').read_bytes() == b'keep'


def test_npz_files_that_are_not_npz_say_what_they_are(tmp_path):
  """Text, a single .npy, a cut archive or pickled objects under a .npz name: our own words, never numpy's advice to
  load it unsafely (issue 44), through the one reader (readers.load_npz) the index files and feature files share."""
  from visim_jax.data import npz, triplet_index
  text = _touch(tmp_path / 'text.npz', b'ref,p0,p1\n0,1,2\n')
  single = str(tmp_path / 'single.npz')
  np.save(tmp_path / 'single.npy', np.zeros(3))
  os.replace(tmp_path / 'single.npy', single)
  good = str(tmp_path / 'good.npz')
  np.savez(good, triplets=np.array([[0, 1, 2], [2, 1, 0]], np.int32), odd=np.zeros(2, np.int32),
           images=np.array(['a', 'b', 'c']))
  cut = _touch(tmp_path / 'cut.npz', open(good, 'rb').read()[:-40])
  objects = str(tmp_path / 'objects.npz')
  np.savez(objects, triplets=np.array([{'a': 1}], dtype=object))
  for path, what in ((text, "it is text (first line 'ref,p0,p1')"), (single, 'a single .npy array'),
                     (cut, 'cut or corrupt'), (objects, 'Python objects')):
    for fn, head in ((lambda: triplet_index.load(path, field='config.train_file'), 'config.train_file'),
                     (lambda: npz.read_arrays(path, ('triplets',)), 'config.features'),
                     (lambda: readers.read_npz(path), path)):
      line = refused(fn, head, path, 'not a readable', what)
      assert 'allow_pickle' not in line and 'unsafely' not in line, line
  assert len(triplet_index.load(good)) == 2
