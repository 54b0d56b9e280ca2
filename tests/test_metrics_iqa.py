"""The ten IQA metrics of visim_jax/models/iqa calibrated against piq 0.8.0 (its metric modules imported without
piq/__init__.py, which needs torchvision) on the packaged photos and noisy / blurred / JPEG / other-photo copies at
256 px and at an odd size, float32 and uint8 inputs; the default variant and the named alternatives; the zoo
specs (distance direction, identical pairs exactly 0, the (reference, candidate) order) and batch invariance."""
import importlib
import importlib.util
import sys
import types

import numpy as np
import pytest

from visim_jax.models import classical, iqa
from test_metrics_classical import nchw, pairs

torch = pytest.importorskip('torch')
# piq's function per metric and the keyword arguments of each of our variants
PIQ = {'fsim': ('fsim', 'fsim'), 'gmsd': ('gmsd', 'gmsd'), 'ms_gmsd': ('gmsd', 'multi_scale_gmsd'),
       'vif_p': ('vif', 'vif_p'), 'haarpsi': ('haarpsi', 'haarpsi'), 'mdsi': ('mdsi', 'mdsi'), 'vsi': ('vsi', 'vsi'),
       'srsim': ('srsim', 'srsim'), 'dss': ('dss', 'dss'), 'iw_ssim': ('iw_ssim', 'information_weighted_ssim')}
VARIANT_KWARGS = {('ms_gmsd', 'chromatic'): {'chromatic': True},
                  ('mdsi', 'mult'): {'combination': 'mult'}, ('srsim', 'chromatic'): {'chromatic': True}}
ODD = (181, 211)
ATOL = 3e-5     # float32 rounding: measured <= 1.4e-5 (DSS's DC term on 0..255 DCT coefficients), most <= 5e-7


def _piq(name):
  spec = importlib.util.find_spec('piq')
  if spec is None:
    pytest.skip('piq is not installed (pip install --no-deps piq==0.8.0)')
  saved = sys.modules.get('piq')
  pkg = types.ModuleType('piq')
  pkg.__path__ = list(spec.submodule_search_locations)
  sys.modules['piq'] = pkg
  try:
    mod, fn = PIQ[name]
    return getattr(importlib.import_module(f'piq.{mod}'), fn)
  finally:
    if saved is None:
      sys.modules.pop('piq', None)
    else:
      sys.modules['piq'] = saved


@pytest.fixture(scope='module')
def photos():
  a, b = pairs(256, 256)
  c, d = pairs(*ODD, seed=1)
  return {256: (a[[0, 2]], b[[0, 2]]), 'odd': (c[[0, 1, 3]], d[[0, 1, 3]])}   # noise, JPEG / noise, blur, other


def _want(name, cand, ref, **kwargs):
  """piq's score, one pair at a time (piq's SR-SIM normalises saliency over its whole batch)."""
  fn = _piq(name)
  return np.concatenate([fn(nchw(cand[i:i + 1]), nchw(ref[i:i + 1]), reduction='none', **kwargs).numpy()
                         for i in range(len(cand))])


CASES = [(n, 256, 'piq') for n in iqa.METRICS] + [(n, 'odd', 'piq') for n in iqa.METRICS] + [
    (n, 'odd', v) for (n, v) in VARIANT_KWARGS]


@pytest.mark.parametrize('name,size,variant', CASES)
def test_equals_piq(photos, name, size, variant):
  ref, cand = photos[size]
  m = iqa.METRICS[name]
  opts = m.variants[variant]
  if size == 256:    # float32 [0, 1] inputs
    got = np.asarray(m.fn(cand.astype(np.float32) / 255.0, ref.astype(np.float32) / 255.0, opts))
  else:              # uint8 through the range gate
    got = np.asarray(m.fn(classical.prepare(cand), classical.prepare(ref), opts))
  want = _want(name, cand, ref, **VARIANT_KWARGS.get((name, variant), {}))
  np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)
  if variant == 'piq' and size == 'odd':
    # the zoo's distance: (reference, candidate), smaller = more similar, identical pairs exactly 0
    d = np.asarray(iqa.distance(name, opts)(ref, cand))    # the same shapes: the compiled metric is reused
    np.testing.assert_allclose(d, 1.0 - want if m.higher_is_more_similar else want, atol=ATOL, rtol=0)
    assert np.all(d[:2] < d[2])                            # the distorted copies are nearer than another photo
    assert np.all(np.asarray(iqa.distance(name, opts)(ref, ref)) == 0.0)


def test_zoo_specs_batches_and_errors(photos):
  """vj.load(name[:variant]) = iqa.distance; a pair scores the same alone and in a batch; bad variants and too-small
  images are one line."""
  import visim_jax as vj
  from visim_jax.core.errors import UserError
  ref, cand = photos['odd']
  m = vj.load('gmsd')
  whole = np.asarray(m.distance(ref, cand))
  np.testing.assert_allclose([m.distance(ref[i], cand[i]) for i in range(2)], whole[:2], atol=1e-6, rtol=1e-5)
  np.testing.assert_allclose(vj.load('mdsi:mult').distance(ref[:2], cand[:2]),
                             iqa.distance('mdsi', iqa.METRICS['mdsi'].variants['mult'])(ref[:2], cand[:2]), atol=1e-6)
  # gmsd:paper = the authors' std2 (N - 1) on the same map: sqrt(N / (N - 1)) times piq's population std
  m = iqa.METRICS['gmsd']
  piq_v = np.asarray(m.fn(cand, ref, m.variants['piq']))
  n = ((ODD[0] + 1) // 2) * ((ODD[1] + 1) // 2)      # the map after the 2x downsampling
  np.testing.assert_allclose(np.asarray(m.fn(cand, ref, m.variants['paper'])), piq_v * np.sqrt(n / (n - 1)),
                             rtol=1e-5)
  with pytest.raises(UserError, match="vif_p variants: vif_p:piq"):
    vj.load('vif_p:paper')
  with pytest.raises(UserError, match='iw_ssim: images of 64x64 px; iw_ssim needs sides of at least 161 px'):
    vj.load('iw_ssim').distance(ref[:1, :64, :64], cand[:1, :64, :64])


def _matlab_same_down(a, f):
  """MATLAB `conv2(a, fspecial('average', f), 'same')` then `a(1:f:end, 1:f:end)`, by plain loops: the full 2-D
  convolution, its central part from index floor(f / 2) (MATLAB's 'same': conv([-1 2 3 -2 0 1 2], [2 4 -1 1],
  'same') = [15 5 -9 7 6 7 -1], its documentation's example), every f-th sample from the first."""
  h, w = a.shape
  full = np.zeros((h + f - 1, w + f - 1))
  for i in range(h):
    for j in range(w):
      full[i:i + f, j:j + f] += a[i, j] / (f * f)
  return full[f // 2:f // 2 + h, f // 2:f // 2 + w][::f, ::f]


def test_fsim_paper_follows_featuresim_m(photos):
  """`fsim:paper` (FeatureSIM.m): its downsampling, round and YIQ coefficients against plain NumPy versions of the
  MATLAB rules; on the odd-size photos (f = 1) it differs from piq's by the colour matrix only, slightly."""
  from visim_jax.models.iqa import fsim as fsim_lib, ops
  u, v = np.array([-1, 2, 3, -2, 0, 1, 2.0]), np.array([2, 4, -1, 1.0])
  assert np.convolve(u, v)[len(v) // 2:len(v) // 2 + len(u)].tolist() == [15, 5, -9, 7, 6, 7, -1]   # 'same'
  rng = np.random.default_rng(0)
  for h, w, f in ((7, 8, 2), (10, 9, 3), (9, 13, 4), (5, 6, 1)):
    x = rng.random((2, h, w)).astype(np.float32)
    got = np.asarray(ops.box_same_down(x, f))
    np.testing.assert_allclose(got, np.stack([_matlab_same_down(t, f) for t in x]), atol=1e-6)
  assert [ops.matlab_factor(s, s + 9) for s in (383, 384, 640, 1152)] == [1, 2, 3, 5]   # MATLAB: halves up
  assert [ops.wang_factor(s, s + 9) for s in (640, 1152)] == [2, 4]                      # Python: halves to even
  rgb = rng.random((4, 3))
  yiq = np.asarray(ops.mix(rgb.astype(np.float32), ops.YIQ_MATLAB))
  want = [[0.299 * r + 0.587 * g + 0.114 * b, 0.596 * r - 0.274 * g - 0.322 * b, 0.211 * r - 0.523 * g + 0.312 * b]
          for r, g, b in rgb]
  np.testing.assert_allclose(yiq, want, atol=1e-6)
  p = np.array([-0.5, -1e-3, 0.0, 0.3, 1.0], np.float32)       # S_I S_Q; MATLAB real(p .^ 0.03), principal power
  np.testing.assert_allclose(np.asarray(fsim_lib.chroma_term(p, matlab=True)), np.real(p.astype(complex) ** 0.03),
                             atol=1e-6)
  np.testing.assert_allclose(np.asarray(fsim_lib.chroma_term(p)), np.abs(p) ** 0.03, atol=1e-6)   # piq's
  ref, cand = photos['odd']
  m = iqa.METRICS['fsim']
  piq_v, paper = (np.asarray(m.fn(cand, ref, m.variants[v])) for v in ('piq', 'paper'))
  assert m.variants['paper'] == fsim_lib.FSIMOptions(matlab=True)
  assert 0 < np.max(np.abs(paper - piq_v)) < 2e-3


def _matlab_imresize_bilinear(n_in, n_out):
  """(n_out, n_in): MATLAB `imresize(., 'bilinear')` along one axis by its documented rule, 1-based as MATLAB: the
  output sample i sits at u = i / s + (1 - 1 / s) / 2 (s = n_out / n_in); triangle kernel 1 - |x|, widened to
  s (1 - |s x|) when s < 1 (antialiasing, the default); taps floor(u - width / 2) + (0 .. ceil(width) + 1); the
  weights normalised to sum 1; indices outside 1..n mirrored ([1:n, n:-1:1] repeated)."""
  s = n_out / n_in
  width = 2.0 / s if s < 1 else 2.0
  m = np.zeros((n_out, n_in))
  for i in range(1, n_out + 1):
    u = i / s + 0.5 * (1 - 1 / s)
    left = int(np.floor(u - width / 2))
    taps, wts = [], []
    for t in range(int(np.ceil(width)) + 2):
      j, x = left + t, u - (left + t)
      wts.append(s * max(0.0, 1 - abs(s * x)) if s < 1 else max(0.0, 1 - abs(x)))
      taps.append(j)
    mirror = list(range(1, n_in + 1)) + list(range(n_in, 0, -1))
    for j, wt in zip(taps, wts):
      m[i - 1, mirror[(j - 1) % (2 * n_in)] - 1] += wt / sum(wts)
  return m


def _vsi_m(img1, img2):
  """VSI.m with its SDSP, float64 NumPy, (H, W, 3) 0..255 images: MATLAB imresize
  bilinear to 256 x 256 and back, RGB2Lab with Xr = 0.9642, Zr = 0.8251, the log-Gabor (omega0 0.021, sigmaF 1.34)
  on the centred grid (k - 129) / 256 masked outside radius 0.5, the central prior on 1-based coordinates minus 128
  (sigmaD 145), the warm prior (sigmaC 0.001), mat2gray; LMN; F = MATLAB round(min(H, W) / 256), conv2 'same' box
and every F-th pixel; Scharr by conv2 'same'; real((S_I S_Q)^0.02) pooled by the larger saliency."""
  def sdsp(im):
    h, w, _ = im.shape
    mh, mw = _matlab_imresize_bilinear(h, 256), _matlab_imresize_bilinear(w, 256)
    ds = np.stack([mh @ im[..., c] @ mw.T for c in range(3)], -1) / 255.0
    lin = np.where(ds <= 0.04045, ds / 12.92, ((ds + 0.055) / 1.055) ** 2.4)
    xyz = lin @ np.array([[0.4124564, 0.3575761, 0.1804375], [0.2126729, 0.7151522, 0.0721750],
                          [0.0193339, 0.1191920, 0.9503041]]).T / np.array([0.9642, 1.0, 0.8251])
    fx = np.where(xyz > 0.008856, np.cbrt(xyz), (903.3 * xyz + 16) / 116)
    lab = np.stack([116 * fx[..., 1] - 16, 500 * (fx[..., 0] - fx[..., 1]), 200 * (fx[..., 1] - fx[..., 2])], -1)
    k = (np.arange(1, 257) - 129) / 256.0
    u2, u1 = np.meshgrid(k, k, indexing='ij')
    inside = u1 ** 2 + u2 ** 2 <= 0.25
    radius = np.fft.ifftshift(np.sqrt((u1 * inside) ** 2 + (u2 * inside) ** 2))
    radius[0, 0] = 1
    with np.errstate(divide='ignore'):
      lg = np.exp(-np.log(radius / 0.021) ** 2 / (2 * 1.34 ** 2))
    lg[0, 0] = 0
    sf = np.sqrt(sum(np.real(np.fft.ifft2(np.fft.fft2(lab[..., c]) * lg)) ** 2 for c in range(3)))
    r, c = np.meshgrid(np.arange(1, 257), np.arange(1, 257), indexing='ij')
    sd = np.exp(-((r - 128.0) ** 2 + (c - 128.0) ** 2) / 145.0 ** 2)
    na, nb = ((t - t.min()) / (t.max() - t.min()) for t in (lab[..., 1], lab[..., 2]))
    sc = 1 - np.exp(-(na ** 2 + nb ** 2) / 0.001 ** 2)
    vs = _matlab_imresize_bilinear(256, h) @ (sf * sd * sc) @ _matlab_imresize_bilinear(256, w).T
    return (vs - vs.min()) / (vs.max() - vs.min())

  def scharr(x):
    k = np.array([[3, 0, -3], [10, 0, -10], [3, 0, -3]]) / 16.0
    p = np.pad(x, 1)
    gx = sum(k[2 - i, 2 - j] * p[i:i + x.shape[0], j:j + x.shape[1]] for i in range(3) for j in range(3))
    gy = sum(k.T[2 - i, 2 - j] * p[i:i + x.shape[0], j:j + x.shape[1]] for i in range(3) for j in range(3))
    return np.sqrt(gx ** 2 + gy ** 2)

  sim = lambda a, b, c: (2 * a * b + c) / (a * a + b * b + c)  # noqa: E731
  lmn = np.array([[0.06, 0.63, 0.27], [0.30, 0.04, -0.35], [0.34, -0.6, 0.17]])
  v1, v2 = sdsp(img1), sdsp(img2)
  l1, l2 = img1 @ lmn.T, img2 @ lmn.T
  f = max(1, int(np.floor(min(img1.shape[:2]) / 256 + 0.5)))
  v1, v2 = _matlab_same_down(v1, f), _matlab_same_down(v2, f)
  l1, l2 = (np.stack([_matlab_same_down(t[..., c], f) for c in range(3)], -1) for t in (l1, l2))
  s = (sim(scharr(l1[..., 0]), scharr(l2[..., 0]), 386.0) ** 0.4 * sim(v1, v2, 1.27)
       * np.real((sim(l1[..., 1], l2[..., 1], 130.0) * sim(l1[..., 2], l2[..., 2], 130.0)).astype(complex) ** 0.02))
  weight = np.maximum(v1, v2)
  return (s * weight).sum() / weight.sum()


def test_vsi_paper_follows_vsi_m(photos):
  """`vsi:paper` (VSI.m and its SDSP): MATLAB imresize 'bilinear' (antialiased shrink) against a plain-loop version
  of its rule, and the whole index against a float64 NumPy VSI.m (its F = 1 path; the F > 1 downsampling is
  ops.box_same_down + ops.matlab_factor, checked in the FSIM test above); piq's differs from it."""
  from visim_jax.models.iqa import ops, vsi as vsi_lib
  for n_in, n_out in ((181, 256), (256, 181), (300, 256), (256, 211), (5, 3)):
    np.testing.assert_allclose(ops.imresize_matrix(n_in, n_out, n_out / n_in, 'triangle'),
                               _matlab_imresize_bilinear(n_in, n_out), atol=1e-12)
  m = iqa.METRICS['vsi']
  assert m.variants['paper'] == vsi_lib.VSIOptions(matlab=True)
  ref, cand = photos['odd']
  ref, cand = ref[:2, :48, :40], cand[:2, :48, :40]     # F = 1; 400 x 420 (F = 2) checked once: 2e-7
  paper, piq_v = (np.asarray(m.fn(cand, ref, m.variants[v])) for v in ('paper', 'piq'))
  want = [_vsi_m(cand[i].astype(np.float64), ref[i].astype(np.float64)) for i in range(2)]
  np.testing.assert_allclose(paper, want, atol=2e-6, rtol=0)
  assert np.max(np.abs(piq_v - np.asarray(want))) > 1e-4


def _vifp_mscale(ref, dist, sigma_nsq=2.0):
  """vifp_mscale.m (Sheikh & Bovik's pixel-domain VIF) in float64 NumPy, step by step: four scales, Gaussian
  windows N = 2^(4 - scale + 1) + 1 with sigma N / 5 (fspecial, normalised), filter2 'valid', subsampling (1:2:end),
  the 1e-10 guards, num / den."""
  from scipy import signal
  num = den = 0.0
  for scale in range(1, 5):
    n = 2 ** (4 - scale + 1) + 1
    i = np.arange(n) - (n - 1) / 2
    win = np.exp(-(i[:, None] ** 2 + i[None] ** 2) / (2 * (n / 5) ** 2))
    win /= win.sum()
    f = lambda a: signal.correlate2d(a, win, 'valid')  # noqa: E731
    if scale > 1:
      ref, dist = f(ref)[::2, ::2], f(dist)[::2, ::2]
    mu1, mu2 = f(ref), f(dist)
    s1, s2, s12 = f(ref * ref) - mu1 ** 2, f(dist * dist) - mu2 ** 2, f(ref * dist) - mu1 * mu2
    s1[s1 < 0] = 0
    s2[s2 < 0] = 0
    g = s12 / (s1 + 1e-10)
    sv = s2 - g * s12
    g[s1 < 1e-10] = 0
    sv[s1 < 1e-10] = s2[s1 < 1e-10]
    s1[s1 < 1e-10] = 0
    g[s2 < 1e-10] = 0
    sv[s2 < 1e-10] = 0
    sv[g < 0] = s2[g < 0]
    g[g < 0] = 0
    sv[sv <= 1e-10] = 1e-10
    num += np.sum(np.log10(1 + g ** 2 * s1 / (sv + sigma_nsq)))
    den += np.sum(np.log10(1 + s1 / sigma_nsq))
  return num / den


def test_vif_p_follows_vifp_mscale_m():
  """vif_p (piq's) against a float64 transcription of the authors' vifp_mscale.m on textured grey pairs: piq's
  guards (1e-8, and + 1e-8 on num and den) against the code's 1e-10 change nothing float32 can resolve, so there is
  no `vif_p:paper` (docs/metrics.md)."""
  rng = np.random.default_rng(3)
  ref = rng.integers(0, 256, (64, 72)).astype(np.float64)
  ref = (ref + np.roll(ref, 1, 0) + np.roll(ref, 1, 1)) / 3                 # some spatial correlation
  dists = [np.clip(ref + rng.normal(0, s, ref.shape), 0, 255) for s in (5.0, 25.0)] + [0.6 * ref + 40]
  rgb = lambda a: np.repeat((a / 255.0)[None, ..., None], 3, -1).astype(np.float32)  # noqa: E731  R = G = B
  for d in dists:
    got = float(np.asarray(iqa.METRICS['vif_p'].fn(rgb(d), rgb(ref), iqa.vif.VIFOptions()))[0])
    assert got == pytest.approx(_vifp_mscale(ref, d), rel=1e-4)   # measured <= 6e-5 (float32)
