"""Images, demo pairs and TLL-style pairs: loaders and their errors on bad input."""
import hashlib
import os

import numpy as np
import pytest
from PIL import Image

from conftest import shared_data
from visim_jax.data.preprocess import Preprocess
from visim_jax.data import demo, images, pairs
from visim_jax.experiments import config_fields


def test_image_errors_name_the_file(tmp_path):
  (tmp_path / 'notes.png').write_text('hello')
  with pytest.raises(images.ImageError, match='notes.png.*not an image'):
    images.open_rgb(tmp_path / 'notes.png')
  good = tmp_path / 'good.jpg'
  Image.fromarray(np.zeros((64, 64, 3), np.uint8) + 100).save(good, quality=95)
  data = good.read_bytes()
  (tmp_path / 'cut.jpg').write_bytes(data[:len(data) // 3])
  with pytest.raises(images.ImageError, match='cut.jpg'):
    images.open_rgb(tmp_path / 'cut.jpg')
  with pytest.raises(images.ImageError, match='missing.png.*not found'):
    images.open_rgb(tmp_path / 'missing.png')
  (tmp_path / 'empty').mkdir()
  with pytest.raises(ValueError, match='empty.*no image files'):
    images.list_images(tmp_path / 'empty')


def test_wrong_image_size_setting():
  with pytest.raises(ValueError, match='preprocess.size'):
    Preprocess(size=0)
  with pytest.raises(ValueError, match='preprocess.resize'):
    Preprocess(size=64, resize='stretchy')


def test_resize_modes():
  im = Image.fromarray(np.zeros((50, 100, 3), np.uint8))
  assert images.resize(im, Preprocess(size=32)).shape == (32, 32, 3)
  assert images.resize(im, Preprocess(size=32, resize='shorter_crop', resize_to=40)).shape == (32, 32, 3)


def _digest(folder):
  h = hashlib.sha256()
  for side in ('left', 'right'):
    for n in sorted(os.listdir(os.path.join(folder, side))):
      h.update(open(os.path.join(folder, side, n), 'rb').read())
  h.update(open(os.path.join(folder, 'classes.csv'), 'rb').read())
  return h.hexdigest()


def test_demo_pairs_deterministic_and_large_enough(tmp_path, demo_root):
  again = demo.demo_pairs(str(tmp_path), n_pairs=192, seed=0)
  assert again != demo_root and _digest(again) == _digest(demo_root)
  other = demo.demo_pairs(str(tmp_path), n_pairs=192, seed=1)
  assert _digest(other) != _digest(demo_root)
  p = pairs.load_pairs(demo_root)
  assert len(p) >= 150 and p.names[0] == '00001.png'
  classes = demo.demo_classes(demo_root)
  assert len(set(classes.values())) >= 10


def _tll(tmp_path, names_left, names_right):
  for side, names in (('left', names_left), ('right', names_right)):
    (tmp_path / side).mkdir(parents=True, exist_ok=True)
    for n in names:
      Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / side / n)
  return str(tmp_path)


def test_pairs_by_name_not_order(tmp_path):
  root = _tll(tmp_path, ['b.png', 'a.png'], ['a.png', 'b.png'])
  p = pairs.load_pairs(root)
  assert p.names == ['a.png', 'b.png']
  assert [os.path.basename(x) for x in p.left] == [os.path.basename(x) for x in p.right]


def test_pair_errors(tmp_path):
  root = _tll(tmp_path / 'x', ['a.png', 'b.png'], ['a.png'])
  with pytest.raises(ValueError, match='b.png: left image without its right partner'):
    pairs.load_pairs(root)
  root = _tll(tmp_path / 'y', ['a.png', 'a.jpg'], ['a.png', 'a.jpg'])
  with pytest.raises(ValueError, match="duplicate pair name 'a'"):
    pairs.load_pairs(root)
  root = _tll(tmp_path / 'z', ['a.png'], ['a.png'])
  sub = tmp_path / 'subset.csv'
  sub.write_text(',TLL_obj\n0,a.png\n1,zz.png\n')
  with pytest.raises(FileNotFoundError, match="subset.csv: 1 subset name.*'zz.png'"):
    pairs.load_pairs(root, str(sub))
  with pytest.raises(FileNotFoundError, match='config.data_dir'):
    pairs.load_pairs(str(tmp_path / 'nowhere'))


def test_real_tll_obj_subset_list():
  names = pairs.read_subset(shared_data('tll', 'TLL_obj.csv'))
  assert len(names) == 4199 and len(set(names)) == 4199
  assert all(n.endswith('.jpg') and len(n) == 9 for n in names)


def test_feature_pairs_errors(tmp_path):
  l = np.random.RandomState(0).rand(4, 3).astype(np.float32) + 0.1  # distinct rows: constant features are refused
  np.savez(tmp_path / 'ok.npz', left=l, right=l, names=np.array(['a', 'b', 'c', 'd']))
  assert pairs.load_feature_pairs(str(tmp_path / 'ok.npz'))[0].shape == (4, 3)
  np.savez(tmp_path / 'shape.npz', left=l, right=np.ones((4, 5)))
  with pytest.raises(ValueError, match='shape.npz: left .* and right .* shapes differ'):
    pairs.load_feature_pairs(str(tmp_path / 'shape.npz'))
  bad = l.copy()
  bad[2, 1] = np.nan
  np.savez(tmp_path / 'nan.npz', left=bad, right=l)
  with pytest.raises(ValueError, match='nan.npz: left features have NaN/Inf'):
    pairs.load_feature_pairs(str(tmp_path / 'nan.npz'))
  np.savez(tmp_path / 'dup.npz', left=l, right=l, names=np.array(['a', 'a', 'c', 'd']))
  with pytest.raises(ValueError, match="duplicate pair name 'a'"):
    pairs.load_feature_pairs(str(tmp_path / 'dup.npz'))
  np.savez(tmp_path / 'noright.npz', left=l)
  with pytest.raises(ValueError, match=r"noright.npz: missing array\(s\) \['right'\]"):
    pairs.load_feature_pairs(str(tmp_path / 'noright.npz'))


def test_demo_honours_cache_dir_and_umask(tmp_path, monkeypatch):
  monkeypatch.setenv('HOME', str(tmp_path / 'home'))
  monkeypatch.delenv('VISIM_CACHE', raising=False)
  old = os.umask(0o022)
  try:
    folder = demo.demo_pairs(n_pairs=8, seed=3, cache_dir=str(tmp_path / 'cache'))
  finally:
    os.umask(old)
  assert folder == str(tmp_path / 'cache' / 'demo' / 'pairs-v2-n8-seed3')
  assert not (tmp_path / 'home').exists()
  modes = {oct(os.stat(os.path.join(folder, p)).st_mode & 0o777)
           for p in ('classes.csv', 'DONE.json', 'left/00001.png', 'right/00008.png')}
  assert modes == {'0o644'} and oct(os.stat(folder).st_mode & 0o777) == '0o755'
  assert not [n for n in os.listdir(tmp_path / 'cache' / 'demo') if n.startswith('.tmp')]
  from ml_collections import ConfigDict
  cfg = ConfigDict({'demo': {'root': '', 'n_pairs': 8, 'seed': 3}, 'cache_dir': str(tmp_path / 'cache')})
  assert config_fields.demo_root(cfg) == folder
  with pytest.raises(ValueError, match='config.demo.n_pairs'):
    demo.demo_pairs(str(tmp_path), n_pairs=4)
