"""Pooled multi-layer features and the feature cache."""
import glob
import os

import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from PIL import Image

from visim_jax.backbones import features
from visim_jax.backbones import get_backbone


def test_pool_lengths_and_per_layer_unit_norm():
  rng = np.random.RandomState(0)
  stages = {'a': jnp.asarray(rng.randn(2, 5, 5, 3)), 'b': jnp.asarray(rng.randn(2, 7, 4)),
            'c': jnp.asarray(rng.randn(2, 6))}
  v = np.asarray(features.pool(stages, ['a', 'b', 'c']))
  assert v.shape == (2, 3 + 4 + 6)
  for lo, hi in ((0, 3), (3, 7), (7, 13)):
    np.testing.assert_allclose(np.linalg.norm(v[:, lo:hi], axis=1), 1.0, rtol=1e-5)
  # the spatial mean, then L2
  m = np.asarray(stages['a']).mean(axis=(1, 2))
  np.testing.assert_allclose(v[:, :3], m / np.linalg.norm(m, axis=1, keepdims=True), rtol=1e-5)
  with pytest.raises(ValueError, match='config.layers'):
    features.pool(stages, ['zzz'])


def _images(folder, n=5, seed=0):
  rng = np.random.RandomState(seed)
  os.makedirs(folder, exist_ok=True)
  paths = []
  for i in range(n):
    p = os.path.join(folder, f'{i}.png')
    Image.fromarray(rng.randint(0, 255, (40, 50, 3), np.uint8)).save(p)
    paths.append(p)
  return paths


@pytest.fixture(scope='module')
def tiny():
  return get_backbone('efficientnet_lite0', random_init=0)


def test_extract_dims_match_layers(lite0, demo_root):
  paths = sorted(glob.glob(os.path.join(demo_root, 'left', '*.png')))[:3]
  f = features.extract(lite0, paths, batch_size=2, progress=False)
  assert f.shape == (3, 24 + 40 + 112 + 320 + 1280)
  np.testing.assert_allclose(np.linalg.norm(f, axis=1), np.sqrt(len(lite0.layers)), rtol=1e-4)
  # batch padding does not change the result
  np.testing.assert_allclose(features.extract(lite0, paths, batch_size=3, progress=False), f, atol=1e-5)


def test_cache_reused_and_invalidated(tmp_path, tiny, monkeypatch):
  paths = _images(str(tmp_path / 'img'))
  cache = str(tmp_path / 'cache')
  calls = []
  real = features.extract
  monkeypatch.setattr(features, 'extract', lambda *a, **k: calls.append(1) or real(*a, **k))
  kw = dict(cache_dir=cache, batch_size=4, progress=False, tag='t')
  f1 = features.cached_features(tiny, paths, **kw)
  f2 = features.cached_features(tiny, paths, **kw)
  assert len(calls) == 1 and np.array_equal(f1, f2)
  features.cached_features(tiny, paths, layers=('block7', 'head'), **kw)   # other layers
  assert len(calls) == 2
  features.cached_features(tiny, paths, flip=True, **kw)                   # other preprocessing
  assert len(calls) == 3
  os.utime(paths[0], ns=(1, 1))                                            # an image changed on disk
  features.cached_features(tiny, paths, **kw)
  assert len(calls) == 4
  features.cached_features(tiny, paths, **kw)
  assert len(calls) == 4


def test_corrupt_cache_is_rebuilt(tmp_path, tiny):
  paths = _images(str(tmp_path / 'img'))
  cache = str(tmp_path / 'cache')
  f1 = features.cached_features(tiny, paths, cache_dir=cache, batch_size=8, progress=False)
  (npz,) = glob.glob(os.path.join(cache, '*.npz'))
  data = open(npz, 'rb').read()
  open(npz, 'wb').write(data[:len(data) // 2])  # truncated
  assert features.read_cache(npz) is None
  f2 = features.cached_features(tiny, paths, cache_dir=cache, batch_size=8, progress=False)
  np.testing.assert_allclose(f1, f2, atol=1e-6)
  assert features.read_cache(npz) is not None


def test_bad_image_leaves_no_cache(tmp_path, tiny):
  paths = _images(str(tmp_path / 'img'))
  bad = tmp_path / 'img' / 'bad.png'
  bad.write_bytes(b'\x89PNG\r\n\x1a\n' + b'garbage' * 10)
  cache = tmp_path / 'cache'
  with pytest.raises(ValueError, match='bad.png'):
    features.cached_features(tiny, paths + [str(bad)], cache_dir=str(cache), batch_size=2, progress=False)
  assert not cache.exists() or not os.listdir(cache)


def test_bfloat16_features_close(tmp_path, lite0):
  paths = _images(str(tmp_path / 'img'), n=2)
  f32 = features.extract(lite0, paths, progress=False, batch_size=2)
  bf16 = features.extract(lite0, paths, progress=False, batch_size=2, dtype='bfloat16')
  cos = (f32 * bf16).sum(1) / np.linalg.norm(f32, axis=1) / np.linalg.norm(bf16, axis=1)
  assert (cos > 0.99).all()


def test_extraction_on_eight_devices_equals_one(tmp_path, tiny):
  import subprocess
  import sys
  paths = _images(str(tmp_path / 'img'), n=5)
  code = ('import sys, numpy as np, jax; from visim_jax.backbones import features; from visim_jax.backbones import get_backbone;'
          'bb = get_backbone("efficientnet_lite0", random_init=0); assert jax.local_device_count() == 8;'
          'np.save(sys.argv[1], features.extract(bb, sys.argv[2:], batch_size=3, progress=False))')
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu', 'XLA_FLAGS': '--xla_force_host_platform_device_count=8'}
  r = subprocess.run([sys.executable, '-c', code, str(tmp_path / 'f.npy'), *paths], cwd=root, env=env,
                     capture_output=True, text=True)
  assert r.returncode == 0, r.stderr[-3000:]
  np.testing.assert_allclose(np.load(tmp_path / 'f.npy'),
                             features.extract(tiny, paths, batch_size=3, progress=False), atol=1e-5)


def test_read_only_cache_is_read_and_a_miss_refused_before_extraction(tmp_path, tiny, monkeypatch):
  """A read-only cache that holds every feature is read (not refused as "not writable"); one that misses a
  feature is refused naming the folder before anything is extracted."""
  from visim_jax.core.errors import UserError
  paths = _images(str(tmp_path / 'img'))
  cache = str(tmp_path / 'cache')
  kw = dict(cache_dir=cache, batch_size=4, progress=False, tag='t')
  monkeypatch.setattr(features, 'extract', lambda b, ps, *a, **k: np.ones((len(ps), 3), np.float32))  # no compile
  f1 = features.cached_features(tiny, paths, **kw)
  real_access = os.access
  monkeypatch.setattr(os, 'access', lambda p, mode, **k: (not (mode & os.W_OK) or os.path.abspath(p) !=
                                                          os.path.abspath(cache)) and real_access(p, mode, **k))
  assert features.check_cache_dir(cache) == cache
  monkeypatch.setattr(features, 'extract', lambda *a, **k: pytest.fail('extracted from a read-only cache'))
  assert np.array_equal(features.cached_features(tiny, paths, **kw), f1)
  with pytest.raises(UserError, match=f'^{cache}: the feature cache folder is read-only and does not hold'):
    features.cached_features(tiny, paths, flip=True, **kw)
