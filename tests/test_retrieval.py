"""aR@k against a brute-force reference, ties included."""
import itertools

import numpy as np

from visim_jax.metrics import retrieval


def brute_force_ar(sim, k):
  n = len(sim)
  found = 0
  for i in range(n):
    # pessimistic rank: every other candidate scoring >= the partner goes first
    r_lr = 1 + sum(1 for j in range(n) if j != i and sim[i, j] >= sim[i, i])
    r_rl = 1 + sum(1 for j in range(n) if j != i and sim[j, i] >= sim[i, i])
    found += (r_lr <= k) or (r_rl <= k)
  return found / n


def test_hand_made_case():
  sim = np.array([[0.9, 0.1, 0.2],    # pair 0: rank 1 left->right
                  [0.5, 0.4, 0.6],    # pair 1: rank 3 l->r, and column 1: 0.1, 0.4, 0.3 -> rank 1 r->l
                  [0.95, 0.2, 0.3]])  # pair 2: l->r rank 2; r->l column 2: 0.2, 0.6, 0.3 -> rank 2
  np.testing.assert_allclose(retrieval.asymmetric_recall(sim, [1, 2, 3]), [2 / 3, 1, 1])
  np.testing.assert_allclose(retrieval.recall(sim, [1, 2, 3]), [1 / 3, 2 / 3, 1])


def test_ties_are_pessimistic():
  sim = np.ones((3, 3))  # everything tied: the partner ranks last in both directions
  np.testing.assert_allclose(retrieval.asymmetric_recall(sim, [1, 2, 3]), [0, 0, 1])


def test_matches_brute_force_with_ties():
  rng = np.random.RandomState(0)
  for n, levels in itertools.product((5, 12), (3, 50)):
    sim = rng.randint(0, levels, (n, n)).astype(np.float32)  # few levels: many ties
    ks = [1, 2, 5]
    got = np.asarray(retrieval.asymmetric_recall(sim, ks))
    np.testing.assert_allclose(got, [brute_force_ar(sim, k) for k in ks])


def test_features_version_uses_cosine():
  rng = np.random.RandomState(1)
  x = rng.randn(6, 4)
  # scaling rows does not change cosine
  np.testing.assert_allclose(retrieval.asymmetric_recall_features(x, 3 * x + 0, [1]), [1.0])


# ------------------------------------------------------------------ Oxford/Paris dataset folders (data/retrieval.py)

def _fake_dataset(root, n_db=6, gnd_kind='revisited'):
  """revisitop's layout: <root>/jpg/<name>.jpg + <root>/gnd_<name>.pkl (a fabricated ground truth)."""
  import os
  import pickle
  from PIL import Image
  os.makedirs(os.path.join(root, 'jpg'), exist_ok=True)
  names = [f'img_{i:03d}' for i in range(n_db)] + ['q_000', 'q_001']
  rng = np.random.RandomState(0)
  for n in names:
    Image.fromarray(rng.randint(0, 255, (48, 64, 3), np.uint8)).save(os.path.join(root, 'jpg', n + '.jpg'))
  if gnd_kind == 'revisited':
    gnd = [{'bbx': [2.0, 3.0, 40.0, 30.0], 'easy': [0, 1], 'hard': [2], 'junk': [5]},
           {'bbx': [0.0, 0.0, 64.0, 48.0], 'easy': [3], 'hard': [], 'junk': []}]
  else:
    gnd = [{'bbx': [2.0, 3.0, 40.0, 30.0], 'ok': [0, 1, 2], 'junk': [5]},
           {'bbx': [0.0, 0.0, 64.0, 48.0], 'ok': [3], 'junk': []}]
  with open(os.path.join(root, f'gnd_{os.path.basename(root)}.pkl'), 'wb') as f:
    pickle.dump({'imlist': names[:n_db], 'qimlist': names[n_db:], 'gnd': gnd}, f)  # read back by safe_pickle
  return names


def test_revisited_and_classic_pkl_folders(tmp_path):
  from visim_jax.data import retrieval as data
  names = _fake_dataset(str(tmp_path / 'rtoy5k'))
  ds = data.load_retrieval_set(str(tmp_path / 'rtoy5k'))
  assert ds.name == 'rtoy5k' and ds.protocol == 'revisited' and len(ds.image_paths) == 6
  assert [p.rsplit('/', 1)[1] for p in ds.query_paths] == ['q_000.jpg', 'q_001.jpg']
  assert ds.image_paths[4].endswith('jpg/' + names[4] + '.jpg')
  np.testing.assert_allclose(ds.gt.bboxes[0], [2, 3, 40, 30])
  _fake_dataset(str(tmp_path / 'toy5k'), gnd_kind='classic')            # cirtorch's gnd_oxford5k.pkl style
  ds = data.load_retrieval_set(str(tmp_path / 'toy5k'))
  assert ds.protocol == 'classic'
  np.testing.assert_array_equal(ds.gt.gnd[0]['ok'], [0, 1, 2])


def test_retrieval_folder_errors(tmp_path):
  import os
  import pytest
  from visim_jax.data import retrieval as data
  from visim_jax.core.errors import UserError
  root = str(tmp_path / 'rtoy5k')
  names = _fake_dataset(root)
  os.remove(os.path.join(root, 'jpg', names[2] + '.jpg'))
  with pytest.raises(UserError, match=r"gnd_rtoy5k.pkl: 1 database image\(s\) not found .*'img_002'"):
    data.load_retrieval_set(root)
  os.remove(os.path.join(root, 'gnd_rtoy5k.pkl'))
  with pytest.raises(UserError, match='config.retrieval.roots: .*expected exactly one ground truth'):
    data.load_retrieval_set(root)
  with pytest.raises(FileNotFoundError, match='config.retrieval.roots'):
    data.load_retrieval_set(str(tmp_path / 'missing'))


def test_original_download_layout(tmp_path):
  """oxbuild_images/ + a gt_files folder (classic .txt files; Oxford's oxc1_ prefix), names resolved to paths."""
  import os
  from PIL import Image
  from visim_jax.data import retrieval as data
  root = tmp_path / 'oxford5k'
  os.makedirs(root / 'oxbuild_images')
  os.makedirs(root / 'gt_files_170407')
  for n in ('all_souls_1', 'all_souls_2', 'radcliffe_1'):
    Image.new('RGB', (8, 6)).save(root / 'oxbuild_images' / f'{n}.jpg')
  gt = root / 'gt_files_170407'
  (gt / 'all_souls_1_query.txt').write_text('oxc1_all_souls_1 1.0 2.0 7.0 5.0\n')
  (gt / 'all_souls_1_good.txt').write_text('all_souls_2\n')
  (gt / 'all_souls_1_ok.txt').write_text('')
  (gt / 'all_souls_1_junk.txt').write_text('radcliffe_1\n')
  ds = data.load_retrieval_set(str(root))
  assert ds.protocol == 'classic' and ds.gt.imlist == ['all_souls_1', 'all_souls_2', 'radcliffe_1']
  assert ds.query_paths == [str(root / 'oxbuild_images' / 'all_souls_1.jpg')]
  np.testing.assert_array_equal(ds.gt.gnd[0]['ok'], [1])
