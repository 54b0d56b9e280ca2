"""mAP (classic Oxford/Paris and revisited protocols), mP@k, recall@k, and the ground-truth loaders."""
import os
import pickle

import numpy as np
import pytest

from visim_jax.data import retrieval
from visim_jax.metrics import map as map_lib


def scores_for(order, n=None):
  """Scores that rank database indices in `order` (first = best)."""
  n = n or len(order)
  s = np.zeros(n, np.float32)
  s[list(order)] = np.arange(len(order), 0, -1)
  return s


def oxford_cpp_ap(pos, amb, ranked):
  """A line-by-line Python reading of the Oxford compute_ap.cpp loop (positives = good + ok, amb = junk)."""
  old_recall, old_precision, ap, hits, j = 0.0, 1.0, 0.0, 0, 0
  for item in ranked:
    if item in amb:
      continue
    if item in pos:
      hits += 1
    recall, precision = hits / len(pos), hits / (j + 1.0)
    ap += (recall - old_recall) * ((old_precision + precision) / 2.0)
    old_recall, old_precision = recall, precision
    j += 1
  return ap


def revisitop_ap(ranked, pos, junk):
  """revisitop's compute_map for one query, line by line: positive and junk positions in the ranking, each positive
  shifted up by the junk strictly before it (while pos[ip] > junk[ij]), then compute_ap's trapezoids."""
  ranked = list(ranked)
  p = [i for i, x in enumerate(ranked) if x in pos]
  jk = [i for i, x in enumerate(ranked) if x in junk]
  k = ij = 0
  for ip in range(len(p)):
    while ij < len(jk) and p[ip] > jk[ij]:
      k += 1
      ij += 1
    p[ip] -= k
  ap = 0.0
  for j, rank in enumerate(p):
    p0 = 1.0 if rank == 0 else j / rank
    ap += (p0 + (j + 1) / (rank + 1)) * (1.0 / len(pos)) / 2.0
  return ap


def test_hand_computed_ap_and_junk():
  # ranking P N P N: AP = (1 + (1/2 + 2/3) / 2) / 2 = 19/24
  s = scores_for([0, 1, 2, 3])[None]
  pos = np.array([[1, 0, 1, 0]], bool)
  out = map_lib.summarise(s, pos, ks=(1, 5))
  assert out['mAP'] == pytest.approx(19 / 24)
  assert out['mP@1'] == 1.0 and out['mP@5'] == pytest.approx(2 / 3)  # k' = min(last positive rank 3, 5)
  assert out['recall@1'] == 0.5 and out['recall@5'] == 1.0
  # J P N J P: junk removed -> P N P, the same AP; junk at the top does not push positives down
  s = scores_for([5, 0, 1, 6, 2], n=7)[None]
  pos = np.zeros((1, 7), bool); pos[0, [0, 2]] = True
  junk = np.zeros((1, 7), bool); junk[0, [5, 6]] = True
  assert map_lib.summarise(s, pos, junk)['mAP'] == pytest.approx(19 / 24)
  assert map_lib.summarise(s, pos)['mAP'] < 19 / 24  # without junk handling it would be lower


def test_query_without_positives_is_left_out():
  s = np.random.RandomState(0).rand(2, 5)
  pos = np.zeros((2, 5), bool); pos[0, int(np.argmax(s[0]))] = True
  out = map_lib.summarise(s, pos)
  assert out['mAP'] == 1.0 and out['n_empty'] == 1 and np.isnan(out['ap'][1])


def test_matches_oxford_cpp_and_revisitop_transcriptions():
  rng = np.random.RandomState(3)
  for _ in range(20):
    n = 24                              # one shape: one compilation
    s = rng.rand(n)
    lab = rng.randint(0, 3, n)          # 0 negative, 1 positive, 2 junk
    if not (lab == 1).any():
      lab[rng.randint(n)] = 1
    ranked = list(np.argsort(-s, kind='stable'))
    pos, junk = set(np.nonzero(lab == 1)[0]), set(np.nonzero(lab == 2)[0])
    got = float(map_lib.average_precision(s[None], (lab == 1)[None], (lab == 2)[None])[0])
    assert got == pytest.approx(oxford_cpp_ap(pos, junk, ranked), abs=1e-6)
    assert got == pytest.approx(revisitop_ap(ranked, pos, junk), abs=1e-6)


def test_positive_and_junk_overlap_is_compute_ap_cpp():
  """An image both positive and junk: skipped but counted (compute_ap.cpp); revisitop keeps it as a positive and
  shifts later positives too, which can exceed 1 (the documented difference)."""
  s = scores_for([0, 1, 2, 3])[None]
  pos = np.array([[1, 1, 0, 0]], bool)
  junk = np.array([[1, 0, 0, 0]], bool)
  got = float(map_lib.average_precision(s, pos, junk)[0])
  assert got == pytest.approx(0.5) == pytest.approx(oxford_cpp_ap({0, 1}, {0}, [0, 1, 2, 3]))
  assert revisitop_ap([0, 1, 2, 3], {0, 1}, {0}) == pytest.approx(1.25)
  rng = np.random.RandomState(5)
  for _ in range(30):                     # random overlapping lists: always equal to the compute_ap.cpp loop
    n = 24
    sc = rng.rand(n)
    p, j = rng.rand(n) < 0.3, rng.rand(n) < 0.3
    p[rng.randint(n)] = True
    ranked = list(np.argsort(-sc, kind='stable'))
    want = oxford_cpp_ap(set(np.nonzero(p)[0]), set(np.nonzero(j)[0]), ranked)
    assert float(map_lib.average_precision(sc[None], p[None], j[None])[0]) == pytest.approx(want, abs=1e-6)


def test_revisited_three_settings_hand_computed():
  s = scores_for([0, 1, 2, 3, 4, 5])[None]
  gnd = [{'easy': [1, 5], 'hard': [3], 'junk': [0]}]
  out = map_lib.evaluate_revisited(s, gnd, ks=(1,))
  # easy: positives {1, 5}, ignored {0, 3}: 1P 2N 4N 5P -> (1 + (1/3 + 2/4)/2) / 2
  assert out['easy']['mAP'] == pytest.approx((1 + (1 / 3 + 1 / 2) / 2) / 2)
  # medium: positives {1, 3, 5}, ignored {0}: 1P 2N 3P 4N 5P
  assert out['medium']['mAP'] == pytest.approx((1 + (1 / 2 + 2 / 3) / 2 + (2 / 4 + 3 / 5) / 2) / 3)
  # hard: positive {3}, ignored {0, 1, 5}: 2N 3P 4N -> (0/1 + 1/2) / 2
  assert out['hard']['mAP'] == pytest.approx(0.25)
  assert out['hard']['mP@1'] == 0.0 and out['easy']['mP@1'] == 1.0


def test_label_masks_leave_one_out():
  labels = np.array([0, 0, 1, 1, 1])
  pos, junk = map_lib.label_masks(labels, labels, np.arange(5))
  assert not pos[np.arange(5), np.arange(5)].any() and junk[np.arange(5), np.arange(5)].all()
  assert pos.sum() == 2 + 6
  with pytest.raises(ValueError, match='outside'):
    map_lib.index_masks([[0, 7]], 5)


# ------------------------------------------------------------------------------------------ loaders

def write_classic(folder, queries):
  os.makedirs(folder, exist_ok=True)
  for qid, (qimg, good, ok, junk) in queries.items():
    with open(os.path.join(folder, f'{qid}_query.txt'), 'w') as f:
      f.write(f'oxc1_{qimg} 10.0 20.5 100.0 200.0\n')
    for suffix, names in (('good', good), ('ok', ok), ('junk', junk)):
      with open(os.path.join(folder, f'{qid}_{suffix}.txt'), 'w') as f:
        f.write(''.join(n + '\n' for n in names))


def test_classic_gt_loader_and_eval(tmp_path):
  imlist = ['a_1', 'a_2', 'a_3', 'b_1', 'b_2', 'x_1']
  write_classic(str(tmp_path / 'gt'), {'a_1': ('a_1', ['a_1', 'a_2'], ['a_3'], ['x_1']),
                                        'b_1': ('b_1', ['b_1'], [], ['b_2'])})
  gt = retrieval.load_gt(str(tmp_path / 'gt'), imlist)
  assert gt.protocol == 'classic' and gt.query_ids == ['a_1', 'b_1'] and gt.qimlist == ['a_1', 'b_1']
  np.testing.assert_array_equal(gt.gnd[0]['ok'], [0, 1, 2])
  np.testing.assert_array_equal(gt.gnd[0]['junk'], [5])
  np.testing.assert_allclose(gt.bboxes[0], [10, 20.5, 100, 200])
  scores = np.array([scores_for([5, 0, 3, 1, 2, 4]), scores_for([4, 3, 0, 1, 2, 5])])
  out = map_lib.evaluate_classic(scores, gt.gnd)
  # q0: junk 5 dropped -> 0P 3N 1P 2P: (1 + (1/2+2/3)/2 + (2/3+3/4)/2)/3 ; q1: junk 4 dropped -> 3P: 1
  q0 = (1 + (1 / 2 + 2 / 3) / 2 + (2 / 3 + 3 / 4) / 2) / 3
  assert out['mAP'] == pytest.approx((q0 + 1) / 2)
  assert retrieval.load_classic_gt(str(tmp_path / 'gt')).imlist == sorted(imlist)


def test_classic_gt_errors(tmp_path):
  folder = str(tmp_path / 'gt')
  write_classic(folder, {'a_1': ('a_1', ['a_1'], [], [])})
  with pytest.raises(ValueError, match=r'a_1_good.txt:1: image .a_1. is not in the database'):
    retrieval.load_classic_gt(folder, ['b_1'])
  with open(os.path.join(folder, 'a_1_query.txt'), 'w') as f:
    f.write('oxc1_a_1 1 2 3\n')
  with pytest.raises(ValueError, match=r'a_1_query.txt:1: expected'):
    retrieval.load_classic_gt(folder)
  write_classic(folder, {'a_1': ('a_1', ['a_1'], [], [])})
  os.remove(os.path.join(folder, 'a_1_ok.txt'))
  with pytest.raises(FileNotFoundError, match='a_1_ok.txt'):
    retrieval.load_classic_gt(folder)
  with pytest.raises(FileNotFoundError, match='config.gt_dir'):
    retrieval.load_classic_gt(str(tmp_path / 'nope'))


def test_revisited_gnd_loader(tmp_path):
  cfg = {'imlist': ['a', 'b', 'c', 'd'], 'qimlist': ['a', 'c'],
         'gnd': [{'bbx': [1.0, 2.0, 3.0, 4.0], 'easy': np.array([1]), 'hard': [3], 'junk': []},
                 {'bbx': None, 'easy': [], 'hard': [2], 'junk': [0]}]}
  path = str(tmp_path / 'gnd_rtest.pkl')
  with open(path, 'wb') as f:
    pickle.dump(cfg, f)  # writing is fine; reading goes through safe_pickle
  gt = retrieval.load_gt(path)
  assert gt.protocol == 'revisited' and gt.imlist == ['a', 'b', 'c', 'd'] and len(gt) == 2
  np.testing.assert_array_equal(gt.gnd[0]['hard'], [3])
  assert np.isnan(gt.bboxes[1]).all()
  out = map_lib.evaluate_revisited(np.array([scores_for([0, 1, 2, 3]), scores_for([2, 0, 1, 3])]), gt.gnd)
  assert out['easy']['n_empty'] == 1 and out['medium']['mAP'] == pytest.approx(((1 / 4 + (1 / 3 + 2 / 4) / 2) / 2 + 1) / 2)
  bad = dict(cfg, gnd=[{'easy': [9], 'hard': [], 'junk': []}, cfg['gnd'][1]])
  with open(path, 'wb') as f:
    pickle.dump(bad, f)
  with pytest.raises(ValueError, match=r"gnd\[0\]\['easy'\] has an index outside"):
    retrieval.load_revisited_gnd(path)


def test_revisited_gnd_refuses_code(tmp_path):
  path = str(tmp_path / 'evil.pkl')
  with open(path, 'wb') as f:
    pickle.dump({'imlist': [], 'qimlist': [], 'gnd': [os.getcwd]}, f)
  from visim_jax.core.safe_pickle import UnsafePickleError
  with pytest.raises(UnsafePickleError):
    retrieval.load_revisited_gnd(path)
