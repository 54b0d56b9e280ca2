"""CoSIS / generic triplet loaders: the real annotation files (skipped where ../shared/data is absent)."""
import os

import numpy as np
import pytest

from visim_jax.data import cosis as T
from visim_jax.core.errors import UserError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COSIS = os.path.join(REPO, '..', 'shared', 'data', 'cosis')
needs_data = pytest.mark.skipif(not os.path.isdir(COSIS), reason=f'CoSIS annotations not found at {COSIS}')

# rows on disk (every one kept): 3 triples each
ROWS = {'mulref_test.txt': 3335, 'mulref_val.txt': 4003, 'dist_715.txt': 335, 'dist_2723.txt': 336,
        'dist_389.txt': 335, 'dist_1673.txt': 336, 'dist_1006.txt': 335, 'dist_254.txt': 335,
        'dist_2352.txt': 334, 'dist_667.txt': 334}


@needs_data
@pytest.mark.parametrize('name', sorted(ROWS))
def test_counts_and_headers(name):
  path = os.path.join(COSIS, name)
  t = T.load_cosis(path)
  assert len(t) == 3 * ROWS[name]
  assert T.read_cosis_rows(path).header == (name == 'mulref_val.txt')
  assert t.a_closer.all()
  assert (t.cls_a <= t.cls_b).all() and t.cls_a.min() >= 1 and t.cls_b.max() <= 5
  split = 'train' if name == 'mulref_test.txt' else 'val'
  assert all(k.startswith(split + '/') for k in t.keys())


@needs_data
def test_paper_sizes():
  test = T.load_cosis(os.path.join(COSIS, 'mulref_test.txt'))
  val = T.load_cosis(os.path.join(COSIS, 'mulref_val.txt'))
  assert len(val) == 12009 and len(val.references()) == 1320
  assert len(test) == 10005 and len(test.references()) == 1010
  # the upstream loader's '10,002' is what dropping the first (data) row leaves
  assert len(test) - 3 == 10002
  # the first data row of a headerless file is kept, and its triples come first
  assert test.line[0] == 1 and test.ref[0] == 'train/5880'
  assert val.line[0] == 2 and val.ref[0] == 'val/460'
  for ref, name in ((715, 'indoor'), (667, 'abstract')):
    t = T.load_cosis(os.path.join(COSIS, f'dist_{ref}.txt'))
    assert set(t.ref) == {f'val/{ref}'}
  assert list(T.context_files(COSIS)) == list(T.CONTEXTS.values())


@needs_data
def test_label_direction_and_classes_of_first_row():
  # dist_1006.txt line 1: `1006 4975 3 4635 4 2148 5` (closest first)
  t = T.load_cosis(os.path.join(COSIS, 'dist_1006.txt'))
  first = [(t.ref[i], t.a[i], t.b[i], t.cls_a[i], t.cls_b[i]) for i in range(3)]
  assert first == [('val/1006', 'val/4975', 'val/4635', 3, 4), ('val/1006', 'val/4975', 'val/2148', 3, 5),
                   ('val/1006', 'val/4635', 'val/2148', 4, 5)]


@needs_data
def test_filename_dict():
  d = T.read_filename_dict(os.path.join(COSIS, 'filename_dict.txt'))
  assert len(d) == 20000
  assert sum(k.startswith('val/') for k in d) == 5000
  assert d['val/0'] == 'h_f5946da2' and d['train/14999'] == 'h_c855b6f0'
  test = T.load_cosis(os.path.join(COSIS, 'mulref_test.txt'))
  assert all(k in d for k in test.keys())


@needs_data
def test_file_order_split_sizes():
  # the authors' get_mixing_data: the first len * 2 // 3 triples of each file train, the last third is held out
  for ref, rows in ((715, 335), (2723, 336), (2352, 334)):
    t = T.load_cosis(os.path.join(COSIS, f'dist_{ref}.txt'))
    train, held = T.split_context(t)
    assert len(train) == 3 * rows * 2 // 3 and len(held) == 3 * rows - 3 * rows * 2 // 3
    np.testing.assert_array_equal(np.r_[train, held], np.arange(3 * rows))   # file order, nothing lost
    assert t.line[held[-1]] == t.line[-1]                                        # the file's last rows
  assert [len(x) for x in T.split_context(T.load_cosis(os.path.join(COSIS, 'dist_715.txt')))] == [670, 335]
  assert [len(x) for x in T.split_context(T.load_cosis(os.path.join(COSIS, 'dist_2723.txt')))] == [672, 336]


@needs_data
def test_authors_pca_fit_set():
  # dist_reducedim/dist_dataprep: the first 320 of the sorted unique mulref_val reference ids after
  # np.random.seed(2); np.random.shuffle(...)
  val = T.load_cosis(os.path.join(COSIS, 'mulref_val.txt'))
  refs = T.authors_pca_refs(val.references())
  ids = np.unique([int(r.split('/')[1]) for r in val.references()]).astype(float)
  np.random.seed(2)
  np.random.shuffle(ids)
  assert refs == [f'val/{int(i)}' for i in ids[:320]] and set(refs) <= set(val.references())
  assert T.describe(val) == {'rows': 4003, 'triplets': 12009, 'header': True, 'references': 1320, 'split': 'val'}


def test_random_split_keeps_rows_together(tmp_path):
  body = ''.join(f'1000 {3 * i + 1} 1 {3 * i + 2} 2 {3 * i + 3} 3\n' for i in range(30))
  t = T.load_cosis(_write(tmp_path, 'dist_5.txt', body))
  train, held = T.split_context(t, 'random', 2 / 3, seed=0)
  assert len(train) == 60 and len(held) == 30 and not set(t.line[train]) & set(t.line[held])
  assert sorted(np.r_[train, held]) == list(range(90))
  with pytest.raises(UserError, match='config.model.split'):
    T.split_context(t, 'shuffle')


def _write(tmp_path, name, text):
  p = tmp_path / name
  p.write_text(text)
  return str(p)


def test_header_detection_and_blank_lines(tmp_path):
  body = '5 1 1 2 3 3 5\n\n6 1 2 2 2 4 4\n'
  a = T.load_cosis(_write(tmp_path, 'dist_5.txt', body))
  b = T.load_cosis(_write(tmp_path, 'mulref_val.txt', 'ref order1 class1 order2 class2 order3 class3\n' + body))
  assert len(a) == len(b) == 6
  assert list(a.line) == [1, 1, 1, 3, 3, 3] and list(b.line) == [2, 2, 2, 4, 4, 4]
  assert list(a.cls_a) == [1, 1, 3, 2, 2, 2] and list(a.cls_b) == [3, 5, 5, 2, 4, 4]


@pytest.mark.parametrize('text,line,msg', [
    ('1 2 1 3 2 4 3\n1 2 1 3 2 4\n', 2, '7 integers'),
    ('1 2 1 3 2 4 3\n1 2 1 3 x 4 3\n', 2, '7 integers'),
    ('1 2 1 3 2 4 9\n', 1, 'classes must be in 1..5'),
    ('1 2 1 3 2 4 3\n\n1 2 3 3 2 4 3\n', 3, 'decrease'),
    ('1 2 1 2 2 4 3\n', 1, 'four different'),
    ('1 2 1 3 2 4 3\nref a b c d e f\n', 2, '7 integers'),  # a header after data is malformed
])
def test_malformed_rows_name_the_line(tmp_path, text, line, msg):
  p = _write(tmp_path, 'dist_1.txt', text)
  with pytest.raises(UserError, match=rf'dist_1.txt:line {line}: .*{msg}'):
    T.load_cosis(p)


def test_image_folder_resolution_and_errors(tmp_path):
  fd = _write(tmp_path, 'filename_dict.txt', '0 val img_a\n1 val img_b\n2 val img_c\n3 val img_d\n0 train tr_0\n')
  labels = T.load_cosis(_write(tmp_path, 'dist_0.txt', '0 1 1 2 2 3 3\n'))
  names = T.read_filename_dict(fd)
  bg = tmp_path / 'BG-20k'
  (bg / 'testval').mkdir(parents=True)
  for n in ('img_a', 'img_b', 'img_c'):
    (bg / 'testval' / f'{n}.jpg').write_bytes(b'x')
  with pytest.raises(UserError, match=r'dist_0.txt:line 1: image val/3 \(img_d\.\*\) not found'):
    T.resolve_images([labels], names, str(bg))
  (bg / 'testval' / 'img_d.png').write_bytes(b'x')
  paths = T.resolve_images([labels], names, str(bg))
  assert paths['val/3'].endswith('testval/img_d.png') and len(paths) == 4
  missing = T.load_cosis(_write(tmp_path, 'dist_9.txt', '0 1 1 2 2 9 3\n'))
  with pytest.raises(UserError, match=r'dist_9.txt:line 1: image id val/9 is not in filename_dict'):
    T.resolve_images([missing], names, str(bg))
  with pytest.raises(UserError, match=r'bad_dict.txt:line 2'):
    T.read_filename_dict(_write(tmp_path, 'bad_dict.txt', '0 val a\n1 test b\n'))
  with pytest.raises(UserError, match=r'line 2: duplicate id val/0'):
    T.read_filename_dict(_write(tmp_path, 'dup_dict.txt', '0 val a\n0 val b\n'))


def test_feature_table_indices_name_the_line(tmp_path):
  t = T.load_cosis(_write(tmp_path, 'dist_0.txt', '0 1 1 2 2 3 3\n0 1 1 2 2 7 3\n'))
  table = {f'val/{i}': i for i in range(4)}
  with pytest.raises(UserError, match=r"dist_0.txt:line 2: image 'val/7' has no row"):
    t.indices(table)
  r, a, b = t.subset(np.arange(3)).indices(table)
  assert list(r) == [0, 0, 0] and list(a) == [1, 1, 2] and list(b) == [2, 3, 3]
  assert T.keys_from_names({'img_b.jpg': 5}, {'val/1': 'img_b', 'val/2': 'x'}) == {'val/1': 5}


def test_generic_csv(tmp_path):
  for n in ('r.png', 'x.png', 'y.png'):
    (tmp_path / n).write_bytes(b'x')
  p = _write(tmp_path, 'set.csv', 'ref,a,b,label\nr.png,x.png,y.png,a\nr.png,x.png,y.png,0\n')
  t = T.load_triplet_csv(p)
  assert list(t.a_closer) == [True, False] and list(t.line) == [2, 3]
  assert t.ref[0] == str(tmp_path / 'r.png')
  with pytest.raises(UserError, match=r'set2.csv:line 1: label'):
    T.load_triplet_csv(_write(tmp_path, 'set2.csv', 'r.png,x.png,y.png,maybe\n'))
  with pytest.raises(UserError, match=r"set3.csv:line 1: image 'z.png' not found"):
    T.load_triplet_csv(_write(tmp_path, 'set3.csv', 'r.png,x.png,z.png,1\n'))
