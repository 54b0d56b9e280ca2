"""The metrics as zoo specs (`vj.load('ssim').distance(a, b)` equals the reference), and batch-size invariance of
every kind of the zoo (these and cosine / LPIPS): a pair scores the same alone, inside any batch, in the
leaderboard's padded batches, and on 1 and 8 devices (a subprocess with 8 fake CPU devices)."""
import json
import os
import sys

import numpy as np
import pytest

import visim_jax as vj
from visim_jax.core.errors import UserError
from visim_jax.zoo import interface, scoring

sys.path.insert(0, os.path.dirname(__file__))
import subprocs  # noqa: E402  pylint: disable=g-import-not-at-top

# one spec of each kind (and the variants whose code differs); tiny random weights where the kind has a network
SPECS = ('psnr', 'psnr:y', 'ssim', 'ssim:skimage', 'l1', 'l2:lab', 'dists:vgg:tiny', 'lpips:alex:tiny',
         'cosine:alexnet:tiny', 'gmsd')
# on 8 devices: one spec of every kind (ms_ssim, which needs 161 px, is covered alone / batched below)
DEVICE_SPECS = ('psnr', 'ssim', 'l1', 'l2:lab', 'dists:vgg:tiny', 'lpips:alex:tiny', 'cosine:alexnet:tiny')
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def images(n=5, size=40, seed=0):
  """n uint8 pairs: a photo crop vs a noisy / shifted / other crop, and one identical pair."""
  from skimage import data
  rng = np.random.default_rng(seed)
  photo = data.astronaut()
  x, y = [], []
  for i in range(n):
    r, c = rng.integers(0, 400, 2)
    a = photo[r:r + size, c:c + size]
    b = (np.clip(a + rng.normal(0, 20, a.shape), 0, 255).astype(np.uint8) if i % 3 == 0 else
         photo[r + 3:r + 3 + size, c:c + size] if i % 3 == 1 else a)
    x.append(a)
    y.append(b)
  return np.stack(x), np.stack(y)


def test_load_equals_the_references():
  """vj.load(<metric>).distance on uint8 arrays = the reference package's score, as a distance."""
  torch = pytest.importorskip('torch')
  import pytorch_msssim
  from skimage import metrics
  x, y = images(4, 48)
  t = lambda u: torch.from_numpy(np.ascontiguousarray(u.transpose(0, 3, 1, 2)).astype(np.float32) / 255.0)
  want = 1 - pytorch_msssim.ssim(t(x), t(y), data_range=1.0, size_average=False).numpy()
  np.testing.assert_allclose(vj.load('ssim').distance(x, y), want, atol=3e-5)
  np.testing.assert_allclose(vj.load('ssim').distance(x[0], y[0]), want[0], atol=3e-5)   # one pair: a float
  want = [1 - metrics.structural_similarity(a, b, channel_axis=-1, data_range=255) for a, b in zip(x, y)]
  np.testing.assert_allclose(vj.load('ssim:skimage').distance(x, y), want, atol=1e-5)
  with np.errstate(divide='ignore'):
    want = [-metrics.peak_signal_noise_ratio(a, b, data_range=255) for a, b in zip(x, y)]
  got = vj.load('psnr').distance(x, y)
  np.testing.assert_allclose(got[:2], want[:2], atol=1e-4)
  assert got[2] == -80.0 and want[2] == -np.inf            # identical: piq's 1e-8 floor, skimage's infinity
  np.testing.assert_allclose(vj.load('l2').distance(x, y), ((x / 255. - y / 255.) ** 2).mean(axis=(1, 2, 3)),
                             rtol=1e-5)
  from test_metrics_dists import reference  # pylint: disable=g-import-not-at-top
  from visim_jax.models import dists
  if dists.package_weights() is None:
    pytest.skip('DISTS_pytorch is not installed')
  model = vj.load('dists')
  with torch.no_grad():
    want = reference(dists.load_dists())(t(x), t(y)).numpy()
  got = model.distance(x, y)
  np.testing.assert_allclose(got, want, atol=1e-5)
  assert got[2] == 0.0 and abs(want[2]) < 1e-5          # identical: the reference's rounding, our exact 0


def test_specs_and_errors():
  assert interface.parse('ssim') == ('ssim', 'pytorch_msssim', '')
  assert interface.parse('dists') == ('dists', 'vgg', '')
  assert interface.split_specs('ssim,psnr:y,lpips:alex') == ['ssim', 'psnr:y', 'lpips:alex']
  for spec, msg in (('ssim:matlab', 'ssim variants: ssim:pytorch_msssim'), ('psnr:hsv', 'psnr variants'),
                    ('dists:alex', 'DISTS runs on VGG16'), ('ssim:skimage@x', 'takes no @option')):
    with pytest.raises(UserError, match=msg):
      vj.load(spec)
  m = vj.load('ssim')
  assert m.kind == 'ssim' and not m.is_embedding and m.params is None
  with pytest.raises(UserError, match='ms_ssim: images of 40x40 px'):
    vj.load('ms_ssim').distance(*images(1, 40))


@pytest.mark.parametrize('spec', SPECS)
def test_a_pair_scores_the_same_alone_and_in_any_batch(spec):
  x, y = images(5)
  full = np.asarray(vj.load(spec, fetch=False, batch_size=8).distance(x, y))
  alone = np.array([vj.load(spec, fetch=False).distance(x[i], y[i]) for i in range(len(x))], np.float32)
  chunks = np.asarray(vj.load(spec, fetch=False, batch_size=2).distance(x, y))
  np.testing.assert_allclose(alone, full, rtol=1e-5, atol=1e-6)     # float32 rounding, not bit for bit: XLA orders
  np.testing.assert_allclose(chunks, full, rtol=1e-5, atol=1e-6)    # a row's reductions by the batch's shape
  sim = vj.load(spec, fetch=False).similarity
  if not sim.backbone:   # the leaderboard's path: rows gathered and padded into power-of-two batches
    table = np.concatenate([x, y])
    padded = scoring.pair_distances(sim, table, np.arange(5), table, np.arange(5, 10), batch_size=4)
    np.testing.assert_allclose(padded, full, rtol=1e-5, atol=1e-6)
  assert full[2] == full.min() and alone[2] == full[2]     # the identical pair: the closest, the same value


def test_ms_ssim_batch_invariance():
  x, y = images(3, 161)
  m = vj.load('ms_ssim')
  np.testing.assert_allclose([m.distance(x[i], y[i]) for i in range(3)], m.distance(x, y), rtol=1e-5, atol=1e-6)


CHILD = r'''
import json, sys
import jax, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import visim_jax as vj
sys.path.insert(0, {tests!r})
from test_metrics_zoo import DEVICE_SPECS, images
assert jax.device_count() == {n}, jax.devices()
x, y = images(8)
out = {{}}
for spec in DEVICE_SPECS:
  m = vj.load(spec, fetch=False)
  if m.is_embedding:   # the pure functional form, images at the model's input size
    s = m.image_size
    fx = np.asarray(jax.image.resize(x / 255.0, (8, s, s, 3), 'bilinear'), np.float32)
    fy = np.asarray(jax.image.resize(y / 255.0, (8, s, s, 3), 'bilinear'), np.float32)
    fn, args = jax.jit(m.apply_distance), (m.params, fx, fy)
  else:
    fn, args = jax.jit(m.similarity.distance), (m.similarity.params, x, y)
  if {n} > 1:
    sh = NamedSharding(Mesh(np.array(jax.devices()), ('b',)), P('b'))
    args = (args[0],) + tuple(jax.device_put(a, sh) for a in args[1:])
  out[spec] = np.asarray(fn(*args)).tolist()
print('RESULT ' + json.dumps(out))
'''


def test_one_and_eight_devices_agree():
  """The same 8 pairs on 1 device and sharded over 8 fake CPU devices (one pair each): the same scores."""
  tests = os.path.dirname(os.path.abspath(__file__))
  jobs = []
  for n in (1, 8):
    env = {**os.environ, 'XLA_FLAGS': f'--xla_force_host_platform_device_count={n}', 'JAX_PLATFORMS': 'cpu',
           'PYTHONPATH': ROOT + os.pathsep + os.environ.get('PYTHONPATH', '')}
    jobs.append({'args': [sys.executable, '-c', CHILD.format(tests=tests, n=n)], 'env': env, 'cwd': ROOT})
  (rc1, log1), (rc8, log8) = subprocs.run_all(jobs)
  assert rc1 == 0, log1[-3000:]
  assert rc8 == 0, log8[-3000:]
  one = json.loads(next(l for l in log1.splitlines() if l.startswith('RESULT '))[7:])
  eight = json.loads(next(l for l in log8.splitlines() if l.startswith('RESULT '))[7:])
  for spec in DEVICE_SPECS:
    np.testing.assert_allclose(eight[spec], one[spec], rtol=1e-5, atol=1e-6, err_msg=spec)
