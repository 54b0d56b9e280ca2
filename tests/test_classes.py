"""Labelled-set loaders (visim_jax/data/classes.py): folders, demo, TFDS (mock), feature files, class trees."""
import os

import numpy as np
import pytest
from PIL import Image

from visim_jax.data import classes
from visim_jax.core.errors import UserError


def write_folder(root, sizes=(3, 2, 0), size=24):
  rng = np.random.default_rng(0)
  for i, n in enumerate(sizes):
    d = os.path.join(root, f'class{i}')
    os.makedirs(d)
    for j in range(n):
      Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(os.path.join(d, f'{j}.png'))
  return root


def test_image_folder(tmp_path):
  root = write_folder(str(tmp_path / 'set'))
  open(os.path.join(root, 'class0', 'notes.txt'), 'w').close()
  open(os.path.join(root, 'loose.png'), 'w').close()
  data = classes.image_folder(root)
  assert data.class_names == ['class0', 'class1', 'class2']
  assert data.labels.tolist() == [0, 0, 0, 1, 1]
  assert all(p.endswith('.png') for p in data.paths)
  assert data.empty_classes == ['class2']
  with pytest.raises(UserError, match='image folder not found'):
    classes.image_folder(str(tmp_path / 'nope'))
  os.makedirs(tmp_path / 'flat')
  with pytest.raises(ValueError, match='no class sub-folders'):
    classes.image_folder(str(tmp_path / 'flat'))
  os.makedirs(tmp_path / 'emptyset' / 'a')
  with pytest.raises(ValueError, match='no image files'):
    classes.image_folder(str(tmp_path / 'emptyset'))


def test_demo_labelled(demo_root):
  data = classes.demo_labelled(os.path.dirname(demo_root), 192, 0)
  assert len(data.paths) == 2 * 192 and len(data.labels) == 2 * 192
  assert len(data.class_names) >= 8
  assert np.bincount(data.labels).min() >= 2
  # both sides of a pair carry the same label
  assert (data.labels[:192] == data.labels[192:]).all()


def test_load_feature_file(tmp_path):
  p = str(tmp_path / 'f.npz')
  np.savez(p, features=np.ones((4, 3)), labels=np.array([0, 0, 1, 1]), class_names=np.array(['a', 'b']))
  f, l, n = classes.load_feature_file(p)
  assert f.shape == (4, 3) and f.dtype == np.float32 and l.tolist() == [0, 0, 1, 1] and n == ['a', 'b']
  np.savez(p, features=np.ones((4, 3)), labels=np.array([0, 0, 1]))
  with pytest.raises(ValueError, match='4 feature rows but 3 labels'):
    classes.load_feature_file(p)
  np.savez(p, features=np.ones((4, 3)))
  with pytest.raises(ValueError, match=r"missing array\(s\) \['labels'\]"):
    classes.load_feature_file(p)
  bad = np.ones((4, 3))
  bad[2, 1] = np.nan
  np.savez(p, features=bad, labels=np.array([0, 0, 1, 1]))
  with pytest.raises(ValueError, match=r'1 feature rows hold NaN.*\[2\]'):
    classes.load_feature_file(p)
  np.savez(p, features=np.ones((4, 3)), labels=np.array([0., 0, 1, 1]))
  with pytest.raises(ValueError, match='integer'):
    classes.load_feature_file(p)
  with pytest.raises(FileNotFoundError):
    classes.load_feature_file(str(tmp_path / 'missing.npz'))
  with open(p, 'w') as fh:
    fh.write('not a zip')
  with pytest.raises(ValueError, match='not a readable .npz'):
    classes.load_feature_file(p)


def test_read_class_tree(tmp_path):
  p = tmp_path / 'tree.txt'
  p.write_text('# wordnet style\nn001 n002\nn001 n003\n\nn002 n004 n005  # two children\n')
  assert classes.read_class_tree(str(p)) == {'n001': ['n002', 'n003'], 'n002': ['n004', 'n005']}
  p.write_text('a b\nlonely\n')
  with pytest.raises(ValueError, match=r'tree.txt:2: expected'):
    classes.read_class_tree(str(p))
  p.write_text('a a\n')
  with pytest.raises(ValueError, match=r'tree.txt:1: .* its own child'):
    classes.read_class_tree(str(p))


def test_tfds_mock_source(tmp_path):
  tfds = pytest.importorskip('tensorflow_datasets')
  from visim_jax.data.preprocess import Preprocess
  with tfds.testing.mock_data(num_examples=5):
    source, names = classes.tfds_source('imagenet2012', 'validation', str(tmp_path))
    assert len(source) == 5 and len(names) == 1000 and names[0].startswith('n0')
    pre = Preprocess(size=32)
    batches = list(classes.tfds_batches(source, pre, 2, range(5)))
  assert [b[0].shape for b in batches] == [(2, 32, 32, 3), (2, 32, 32, 3), (1, 32, 32, 3)]
  assert all(b[0].dtype == np.uint8 for b in batches)
  assert np.concatenate([b[1] for b in batches]).shape == (5,)


def test_load_source_stats(tmp_path):
  p = str(tmp_path / 'stats.npz')
  np.savez(p, mean=np.zeros(3), std=np.ones(3))
  mean, std = classes.load_source_stats(p, 3)
  assert mean.dtype == np.float32 and std.tolist() == [1, 1, 1]
  with pytest.raises(UserError, match=r'config.source_stats: .*stats.npz: mean/std shapes \(3,\)/\(3,\), features have dim 4'):
    classes.load_source_stats(p, 4)
  np.savez(p, mean=np.zeros(3))
  with pytest.raises(ValueError, match='std'):
    classes.load_source_stats(p, 3)
