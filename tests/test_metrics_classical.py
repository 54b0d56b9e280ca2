"""visim_jax/models/classical.py calibrated against the reference code a user would otherwise call: pytorch-msssim
1.0.0 (SSIM, MS-SSIM), piq 0.8.0 (SSIM with its downsampling, MS-SSIM, PSNR), scikit-image (structural_similarity,
peak_signal_noise_ratio, rgb2lab: the LPIPS paper's Lab SSIM / L2 baselines), on the packaged photos and distorted
copies, several sizes, float32 and uint8 inputs."""
import importlib
import importlib.util
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from visim_jax.core.errors import UserError
from visim_jax.models import classical as C

torch = pytest.importorskip('torch')


def _piq():
  """piq's ssim / ms_ssim / psnr modules without piq/__init__.py (which imports torchvision for its other metrics);
  None when piq is not installed (its comparisons are then left out)."""
  spec = importlib.util.find_spec('piq')
  if spec is None:   # pip install --no-deps piq==0.8.0
    return None
  saved = sys.modules.get('piq')
  pkg = types.ModuleType('piq')
  pkg.__path__ = list(spec.submodule_search_locations)
  sys.modules['piq'] = pkg
  try:
    mods = {m: importlib.import_module(f'piq.{m}') for m in ('ssim', 'psnr', 'ms_ssim')}
    return types.SimpleNamespace(ssim=mods['ssim'].ssim, psnr=mods['psnr'].psnr,
                                 ms_ssim=mods['ms_ssim'].multi_scale_ssim)
  finally:
    if saved is None:
      sys.modules.pop('piq', None)
    else:
      sys.modules['piq'] = saved


def pairs(h, w, seed=0):
  """uint8 (4, h, w, 3) x2: photos vs noisy / blurred / JPEG copies / another photo, at h x w."""
  from PIL import Image, ImageFilter
  from skimage import data
  import io
  rng = np.random.default_rng(seed)
  photos = [np.asarray(Image.fromarray(getattr(data, k)()).resize((w, h), Image.BICUBIC))
            for k in ('astronaut', 'chelsea', 'coffee')]
  a, b = [], []
  for i, p in enumerate(photos + photos[:1]):
    kind = i % 4
    if kind == 0:
      q = np.clip(p + rng.normal(0, 15, p.shape), 0, 255).astype(np.uint8)
    elif kind == 1:
      q = np.asarray(Image.fromarray(p).filter(ImageFilter.GaussianBlur(1.5)))
    elif kind == 2:
      buf = io.BytesIO()
      Image.fromarray(p).save(buf, 'JPEG', quality=10)
      q = np.asarray(Image.open(buf).convert('RGB'))
    else:
      q = photos[1]
    a.append(p)
    b.append(q)
  return np.stack(a), np.stack(b)


def nchw(u):
  return torch.from_numpy(np.ascontiguousarray(u.transpose(0, 3, 1, 2)).astype(np.float32) / 255.0)


def ours(fn, x, y, opts, dtype):
  """Our metric on uint8 inputs (divided by 255 in `distance`'s way) or on float32 [0, 1] copies."""
  if dtype == 'uint8':
    return np.asarray(fn(C.prepare(x), C.prepare(y), opts))
  return np.asarray(fn(x.astype(np.float32) / 255.0, y.astype(np.float32) / 255.0, opts))


@pytest.mark.parametrize('size,dtype', [((48, 64), 'float32'), ((45, 71), 'uint8')])
def test_ssim_and_psnr_equal_the_references(size, dtype):
  import pytorch_msssim
  from skimage import metrics
  piq = _piq()
  x, y = pairs(*size)
  got = ours(C.ssim, x, y, C.SSIM_PRESETS['pytorch_msssim'], dtype)
  want = pytorch_msssim.ssim(nchw(x), nchw(y), data_range=1.0, size_average=False).numpy()
  np.testing.assert_allclose(got, want, atol=3e-5)
  want = [metrics.structural_similarity(a, b, channel_axis=-1, data_range=255, gaussian_weights=True, sigma=1.5,
                                        use_sample_covariance=False) for a, b in zip(x, y)]
  np.testing.assert_allclose(got, want, atol=1e-5)          # skimage in float64: "to match Wang et al."
  if piq:
    got = ours(C.ssim, x, y, C.SSIM_PRESETS['piq'], dtype)
    np.testing.assert_allclose(got, piq.ssim(nchw(x), nchw(y), data_range=1.0, reduction='none').numpy(), atol=5e-5)
  got = ours(C.ssim, x, y, C.SSIM_PRESETS['skimage'], dtype)
  want = [metrics.structural_similarity(a, b, channel_axis=-1, data_range=255) for a, b in zip(x, y)]
  np.testing.assert_allclose(got, want, atol=1e-5)
  got = ours(C.psnr, x, y, C.PixelOptions(), dtype)
  want = [metrics.peak_signal_noise_ratio(a, b, data_range=255) for a, b in zip(x, y)]
  np.testing.assert_allclose(got, want, atol=1e-4)
  if piq:
    np.testing.assert_allclose(got, piq.psnr(nchw(x), nchw(y), data_range=1.0, reduction='none').numpy(), atol=1e-4)
    got = ours(C.psnr, x, y, C.PixelOptions('grey'), dtype)
    want = piq.psnr(nchw(x), nchw(y), data_range=1.0, reduction='none', convert_to_greyscale=True).numpy()
    np.testing.assert_allclose(got, want, atol=1e-4)


def test_piq_downsampling_on_a_large_photo():
  """min side 400 -> piq average-pools by round(400 / 256) = 2 before SSIM (Wang's ssim.m rule)."""
  piq = _piq()
  if piq is None:
    pytest.skip('piq is not installed (pip install --no-deps piq==0.8.0)')
  x, y = pairs(400, 440, seed=1)
  x, y = x[:2], y[:2]
  got = ours(C.ssim, x, y, C.SSIM_PRESETS['piq'], 'float32')
  np.testing.assert_allclose(got, piq.ssim(nchw(x), nchw(y), data_range=1.0, reduction='none').numpy(), atol=5e-5)
  assert np.all(np.abs(got - ours(C.ssim, x, y, C.SSIM_PRESETS['pytorch_msssim'], 'float32')) > 1e-3)


def test_ms_ssim_equals_the_references():
  """Odd sides (163 -> 82 -> 41 -> 21 -> 11): pytorch_msssim pads with zeros on both sides, piq replicates on the
  top and left; float32 and uint8 inputs."""
  import pytorch_msssim
  piq = _piq()
  x, y = pairs(163, 170, seed=2)
  want = pytorch_msssim.ms_ssim(nchw(x), nchw(y), data_range=1.0, size_average=False).numpy()
  for dtype in ('float32', 'uint8'):
    np.testing.assert_allclose(ours(C.ms_ssim, x, y, C.SSIM_PRESETS['pytorch_msssim'], dtype), want, atol=3e-5)
  if piq:
    want_piq = piq.ms_ssim(nchw(x), nchw(y), data_range=1.0, reduction='none').numpy()
    for dtype in ('float32', 'uint8'):
      np.testing.assert_allclose(ours(C.ms_ssim, x, y, C.SSIM_PRESETS['piq'], dtype), want_piq, atol=3e-5)
    assert np.abs(want - want_piq).max() > 1e-5          # the two halvings differ on odd sides
  with pytest.raises(UserError, match='at least 161 px'):
    C.ms_ssim(np.zeros((1, 160, 200, 3), np.float32), np.zeros((1, 160, 200, 3), np.float32), C.SSIMOptions())


def test_lpips_paper_lab_baselines():
  """PerceptualSimilarity's L2 / SSIM baselines (colorspace Lab): .5 mean((Lab/100)^2 diff) and skimage SSIM on Lab
  with data_range 100 (its DSSIM is (1 - that) / 2), and rgb2lab itself."""
  from skimage import color, metrics
  x, y = pairs(40, 52, seed=3)
  np.testing.assert_allclose(np.asarray(C.rgb_to_lab(x.astype(np.float32) / 255.0)), color.rgb2lab(x), atol=2e-4)
  got = ours(C.l2, x, y, C.PixelOptions('lab'), 'uint8')
  want = [.5 * np.mean((color.rgb2lab(a) / 100. - color.rgb2lab(b) / 100.) ** 2) for a, b in zip(x, y)]
  np.testing.assert_allclose(got, want, rtol=1e-4)
  got = ours(C.ssim, x, y, C.SSIM_PRESETS['lpips_lab'], 'uint8')
  want = [metrics.structural_similarity(color.rgb2lab(a), color.rgb2lab(b), channel_axis=-1, data_range=100)
          for a, b in zip(x, y)]
  np.testing.assert_allclose(got, want, atol=2e-5)


def test_pixel_metrics_against_numpy_and_directions():
  x, y = pairs(20, 24, seed=4)
  xf, yf = x / 255.0, y / 255.0
  np.testing.assert_allclose(C.l1(xf, yf), np.abs(xf - yf).mean(axis=(1, 2, 3)), rtol=1e-5)
  np.testing.assert_allclose(C.l2(xf, yf), ((xf - yf) ** 2).mean(axis=(1, 2, 3)), rtol=1e-5)
  luma = lambda v: (16 + v @ np.array([65.481, 128.553, 24.966])) / 255.0
  want = -10 * np.log10(((luma(xf) - luma(yf)) ** 2).mean(axis=(1, 2)) + 1e-8)
  np.testing.assert_allclose(C.psnr(xf, yf, C.PixelOptions('y')), want, atol=1e-4)
  same = np.asarray(C.psnr(xf, xf))
  np.testing.assert_allclose(same, 80.0, atol=1e-4)
  for name in C.METRICS:
    opts = C.SSIMOptions() if name in ('ssim', 'ms_ssim') else C.PixelOptions()
    if name == 'ms_ssim':
      continue
    d = C.distance(name, opts)
    assert np.all(np.asarray(d(x, x)) <= np.asarray(d(x, y)))       # identical pairs: the smallest distance
    np.testing.assert_allclose(d(x, y), d(xf.astype(np.float32), yf.astype(np.float32)), atol=1e-5)
  np.testing.assert_array_equal(C.distance('ssim', C.SSIMOptions())(x, x), 0.0)   # exactly 0, as LPIPS
  np.testing.assert_array_equal(C.distance('psnr', C.PixelOptions())(x, x), -80.0)


def test_differentiable_and_jitted():
  x, y = pairs(32, 32, seed=5)
  xf, yf = jnp.asarray(x / 255.0, jnp.float32), jnp.asarray(y / 255.0, jnp.float32)
  for fn, opts in ((C.ssim, C.SSIMOptions()), (C.psnr, C.PixelOptions()), (C.l2, C.PixelOptions('lab')),
                   (C.ssim, C.SSIM_PRESETS['lpips_lab'])):
    g = jax.grad(lambda a: fn(a, yf, opts).sum())(xf)
    assert g.shape == xf.shape and bool(jnp.all(jnp.isfinite(g))) and float(jnp.abs(g).max()) > 0


def test_options_are_checked():
  with pytest.raises(UserError, match='window side'):
    C.SSIMOptions(size=8).check()
  with pytest.raises(UserError, match='colour'):
    C.PixelOptions('hsv').check()
  with pytest.raises(UserError, match='smaller than the 11x11 window'):
    C.ssim(np.zeros((1, 8, 8, 3), np.float32), np.zeros((1, 8, 8, 3), np.float32), C.SSIMOptions())
  with pytest.raises(UserError, match=r'\[0, 1\]'):
    C.prepare(np.full((1, 8, 8, 3), 200.0, np.float32))
