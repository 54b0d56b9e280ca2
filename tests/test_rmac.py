"""R-MAC against a plain-loop NumPy transcription of Tolias et al.'s region rule (rmac_regionvec_act.m) and of the
R-MAC chain (region MAC, L2, PCA-whitening, L2, sum, L2); region counts per level for a few shapes; extraction
with shape buckets through a tiny random VGG16."""
import math

import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from visim_jax.core import pca
from visim_jax.backbones import rmac
from visim_jax.experiments import config_fields


def np_regions(H, W, L=3, ovr=0.4):
  """The MATLAB rule, line by line (1-based MATLAB indices turned into 0-based starts)."""
  steps = np.array([2, 3, 4, 5, 6, 7], float)
  w = min(W, H)
  b = (max(H, W) - w) / (steps - 1)
  idx = int(np.argmin(np.abs(((w ** 2 - w * b) / w ** 2) - ovr))) + 1   # MATLAB's 1-based index
  Wd, Hd = (idx, 0) if H < W else ((0, idx) if H > W else (0, 0))
  out = []
  for l in range(1, L + 1):
    wl = math.floor(2 * w / (l + 1))
    wl2 = math.floor(wl / 2 - 1)
    bw = 0 if l + Wd - 1 == 0 else (W - wl) / (l + Wd - 1)
    cenW = [math.floor(wl2 + k * bw) - wl2 for k in range(l + Wd)]
    bh = 0 if l + Hd - 1 == 0 else (H - wl) / (l + Hd - 1)
    cenH = [math.floor(wl2 + k * bh) - wl2 for k in range(l + Hd)]
    for i_ in cenH:
      for j_ in cenW:
        if wl > 0:
          out.append((l, i_, j_, wl))
  return out


def np_rmac(X, white=None, L=3):
  """X (H, W, C) -> R-MAC: per region max over cells, L2, [whiten, L2], sum, L2 (all plain loops)."""
  H, W, C = X.shape
  total = np.zeros(C if white is None else white[1].shape[1])
  for _, t, s, side in np_regions(H, W, L):
    v = np.full(C, -np.inf)
    for y in range(t, t + side):
      for x in range(s, s + side):
        v = np.maximum(v, X[y, x])
    v = v / max(np.linalg.norm(v), 1e-12)
    if white is not None:
      mean, comps, scale = white
      v = ((v - mean) @ comps) * scale
      v = v / max(np.linalg.norm(v), 1e-12)
    total += v
  return total / np.linalg.norm(total)


@pytest.mark.parametrize('h,w', [(10, 10), (24, 32), (32, 24), (48, 64), (64, 48), (10, 40), (5, 7), (3, 3), (2, 9)])
def test_grid_equals_matlab_rule(h, w):
  got = [tuple(g) for g in rmac.region_grid(h, w)]
  assert got == np_regions(h, w)
  for _, t, s, side in got:       # inside the map
    assert 0 <= t and t + side <= h and 0 <= s and s + side <= w


def test_published_region_counts():
  assert rmac.region_counts(10, 10) == [1, 4, 9]          # square: 1 + 4 + 9 = 14
  assert rmac.region_counts(48, 64) == [2, 6, 12]         # 1024 x 768 image, conv5_3 64 x 48: ~20 regions
  assert rmac.region_counts(64, 48) == [2, 6, 12]         # portrait: extra regions along H
  assert rmac.region_counts(10, 40) == [6, 14, 24]        # 4:1 panorama: m = 5 extra along W
  assert rmac.num_regions(48, 64, include_global=True) == 21


def test_rmac_equals_numpy_loops():
  rng = np.random.RandomState(0)
  maps = np.maximum(rng.randn(3, 7, 9, 6), 0).astype(np.float32)   # post-ReLU maps
  regions_fit = rng.rand(200, 6).astype(np.float32)
  white = rmac.learn_whitening(regions_fit, dim=4)
  wnp = tuple(np.asarray(a, np.float64) for a in white)
  got = np.asarray(rmac.rmac(jnp.asarray(maps), white))
  want = np.stack([np_rmac(m.astype(np.float64), wnp) for m in maps])
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
  got0 = np.asarray(rmac.rmac(jnp.asarray(maps)))                    # no whitening
  np.testing.assert_allclose(got0, np.stack([np_rmac(m.astype(np.float64)) for m in maps]), rtol=1e-5, atol=1e-6)
  # the padded path (cached regions + offsets) gives the same descriptors
  r = np.asarray(rmac.region_vectors(jnp.asarray(maps)))
  offsets = np.arange(4) * r.shape[1]
  np.testing.assert_allclose(rmac.descriptors(r.reshape(-1, 6), offsets, white), got, rtol=1e-5, atol=1e-6)


def test_whitening_is_pca_whitening():
  """Whitened region vectors of the fitting set have identity covariance (before the final L2)."""
  rng = np.random.RandomState(1)
  x = rng.randn(500, 5) @ rng.randn(5, 5)
  white = rmac.learn_whitening(x)
  xn = x / np.linalg.norm(x, axis=1, keepdims=True)
  z = np.asarray(pca.transform(white, jnp.asarray(xn, jnp.float32)), np.float64)
  np.testing.assert_allclose(np.cov(z.T), np.eye(5), atol=1e-3)


def test_extract_with_shape_buckets(tmp_path):
  from visim_jax.backbones import vgg
  b = vgg.vgg16(tiny=True)
  rng = np.random.RandomState(0)
  paths = []
  for i, (w, h) in enumerate([(80, 60), (60, 80), (80, 60), (200, 150), (80, 60)]):
    p = str(tmp_path / f'im{i}.png')
    Image.fromarray(rng.randint(0, 255, (h, w, 3), np.uint8)).save(p)
    paths.append(p)
  regions, offsets = rmac.extract_regions(b, paths, max_side=100, batch_size=2, progress=False)
  assert offsets[-1] == len(regions) and len(offsets) == 6
  # 200 x 150 is scaled to 100 x 75 (aspect kept); the others are not enlarged
  assert rmac.load_image(paths[3], max_side=100).shape == (75, 100, 3)
  assert rmac.load_image(paths[0], max_side=100).shape == (60, 80, 3)
  # each image alone equals its bucketed result
  for i in (1, 4):
    x = rmac.load_image(paths[i], 100)[None]
    _, stages = b(jnp.asarray(x))
    want = np.asarray(rmac.region_vectors(stages['conv5_3']))[0]
    np.testing.assert_allclose(regions[offsets[i]:offsets[i + 1]], want, rtol=1e-4, atol=1e-6)
  d = rmac.descriptors(regions, offsets)
  assert d.shape == (5, 16) and np.allclose(np.linalg.norm(d, axis=1), 1, atol=1e-5)
  # query crops: bbox in the image's own pixels
  assert rmac.load_image(paths[3], 1024, bbox=(10, 20, 110, 70)).shape == (50, 100, 3)


def _images(folder, sizes, seed=0):
  folder.mkdir(parents=True, exist_ok=True)
  rng = np.random.RandomState(seed)
  out = []
  for i, (w, h) in enumerate(sizes):
    p = str(folder / f'im{i}.jpg')
    Image.fromarray(rng.randint(0, 255, (h, w, 3), np.uint8)).save(p)
    out.append(p)
  return out


def test_cache_and_whitening_sources(tmp_path, monkeypatch):
  from visim_jax.backbones import features
  from visim_jax.backbones import vgg
  b = vgg.vgg16(tiny=True)
  paths = _images(tmp_path / 'db', [(64, 48), (48, 64), (64, 48)])
  white_dir = tmp_path / 'white'
  _images(white_dir, [(64, 48)] * 3, seed=1)
  cache = str(tmp_path / 'cache')
  opts = rmac.Options(max_side=64, whiten_on=str(white_dir))
  d1 = rmac.describe_images(b, paths, opts, cache, features.file_list_hash, batch_size=2, progress=False)
  assert d1.shape == (3, 16) and np.allclose(np.linalg.norm(d1, axis=1), 1, atol=1e-5)
  # cached: a second call extracts nothing
  monkeypatch.setattr(rmac, 'extract_regions', lambda *a, **k: (_ for _ in ()).throw(AssertionError('recomputed')))
  d2 = rmac.describe_images(b, paths, opts, cache, features.file_list_hash, batch_size=2, progress=False)
  np.testing.assert_array_equal(d1, d2)
  # the same whitening from a saved .npz (mean/components/scale) and from the raw region vectors
  wr, _ = rmac.cached_regions(b, rmac.images_in(str(white_dir)), opts, cache,
                              features.file_list_hash(rmac.images_in(str(white_dir))), tag='whiten', progress=False)
  white = rmac.learn_whitening(wr)
  rmac.save_whitening(str(tmp_path / 'w.npz'), white)
  np.savez(tmp_path / 'r.npz', regions=wr)
  for src in ('w.npz', 'r.npz'):
    o = rmac.Options(max_side=64, whiten_on=str(tmp_path / src))
    np.testing.assert_allclose(rmac.describe_images(b, paths, o, cache, features.file_list_hash, batch_size=2,
                                                    progress=False), d1, rtol=1e-4, atol=1e-5)
  # no whitening differs; a changed option misses the cache (and would recompute)
  d0 = rmac.describe_images(b, paths, rmac.Options(max_side=64), cache, features.file_list_hash, progress=False)
  assert not np.allclose(d0, d1)
  with pytest.raises(AssertionError, match='recomputed'):
    rmac.describe_images(b, paths, rmac.Options(max_side=64, levels=2), cache, features.file_list_hash,
                         progress=False)
  (tmp_path / 'ds').mkdir()
  (tmp_path / 'ds' / 'jpg').symlink_to(white_dir)                     # a dataset root: its jpg/ folder
  assert rmac.images_in(str(tmp_path / 'ds')) == [str(tmp_path / 'ds' / 'jpg' / f'im{i}.jpg') for i in range(3)]
  np.savez(tmp_path / 'few.npz', regions=np.ones((3, 16), np.float32))
  from visim_jax.core.errors import UserError
  with pytest.raises(UserError, match='config.rmac.whiten_on: .*at least as many vectors'):
    rmac.load_whitening(b, rmac.Options(whiten_on=str(tmp_path / 'few.npz')), None, features.file_list_hash)
  with pytest.raises(UserError, match='config.rmac.levels'):
    rmac.Options(levels=0)


def test_pooling_rmac_through_the_features_glue(tmp_path):
  """backbone=vgg16, pooling=rmac: every experiment's features_of gives R-MAC descriptors (tiny VGG: 16-d)."""
  import ml_collections
  from visim_jax.backbones import features
  from visim_jax.core.errors import UserError
  c = config_fields.add_fields(ml_collections.ConfigDict())
  c.backbone, c.backbone_kwargs.tiny, c.pooling = 'vgg16', True, 'rmac'
  c.cache_dir, c.rmac.max_side = str(tmp_path / 'cache'), 64
  paths = _images(tmp_path / 'im', [(64, 48), (48, 64)])
  fo = config_fields.options(c)
  b, layers = features.build(fo)
  assert layers == ('conv5_3',)
  x = features.features_of(fo, b, layers, paths, progress=False)
  np.testing.assert_allclose(x, rmac.describe_images(b, paths, rmac.Options(max_side=64), None,
                                                     features.file_list_hash, progress=False), rtol=1e-5)
  q = features.rmac_features(fo, b, paths[:1], bboxes=[(0, 0, 32, 32)], tag='queries', progress=False)
  assert q.shape == (1, 16) and not np.allclose(q, x[:1])
  xf = features.features_of(fo, b, layers, paths, flip=True, progress=False)     # the mirrored view
  mirrored = str(tmp_path / 'mirror.png')
  Image.fromarray(np.asarray(Image.open(paths[0]))[:, ::-1]).save(mirrored)
  np.testing.assert_allclose(xf[0], features.features_of(fo, b, layers, [mirrored], progress=False)[0], rtol=1e-4,
                             atol=1e-6)
  c.rmac.levels = 0
  with pytest.raises(UserError, match='config.rmac.levels'):
    config_fields.options(c)
  c.rmac.levels, c.pooling = 3, 'gem'
  with pytest.raises(UserError, match='config.pooling'):
    config_fields.options(c)
