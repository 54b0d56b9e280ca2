"""AlexNet conv part in Flax vs a minimal PyTorch AlexNet written here (torchvision's layout and names)."""
import jax
import numpy as np
import pytest

from torch_init import assert_stages_close, randomise, run_both
from visim_jax.backbones import alexnet, convert, get_backbone, registry

torch = pytest.importorskip('torch')
nn = torch.nn


class RefAlexNet(nn.Module):
  """Conv 11/4 p2, pool, conv 5 p2, pool, conv 3 x3, pool; a classifier, as torchvision's (indices matter)."""

  def __init__(self, convs):
    super().__init__()
    layers, cin = [], 3
    for c, k, s, p, pool in convs:
      layers += [nn.Conv2d(cin, c, k, s, p), nn.ReLU(inplace=True)] + ([nn.MaxPool2d(3, 2)] if pool else [])
      cin = c
    self.features = nn.Sequential(*layers)
    self.avgpool = nn.AdaptiveAvgPool2d((6, 6))
    self.classifier = nn.Sequential(nn.Dropout(), nn.Linear(cin * 36, 32), nn.ReLU(inplace=True), nn.Dropout(),
                                    nn.Linear(32, 32), nn.ReLU(inplace=True), nn.Linear(32, 10))

    self._stages = {}
    relus = [m for m in self.features if isinstance(m, nn.ReLU)]
    for i, m in enumerate(relus, 1):
      m.register_forward_hook(lambda mod, inp, out, k=f'conv{i}': self._stages.__setitem__(k, out.clone()))

  def forward(self, x):
    self._stages = {}
    self._stages['features'] = self.features(x)
    return dict(self._stages)


def test_parity_with_pytorch_reference_through_the_converter(tmp_path):
  ref = randomise(RefAlexNet(alexnet.TINY), 0)
  assert [k for k in ref.state_dict() if k.startswith('features.')][::2] == [
      f'features.{i}.weight' for i in alexnet.TORCH_INDEX]
  torch.save(ref.state_dict(), tmp_path / 'alexnet.pth')
  info = convert.convert('alexnet', str(tmp_path / 'alexnet.pth'), str(tmp_path / 'a.safetensors'), tiny=True)
  assert info['num_tensors'] == 10  # classifier dropped
  b = get_backbone('alexnet', weights=str(tmp_path / 'a.safetensors'), tiny=True)
  final, stages, want = run_both(b, ref, alexnet.TINY_SIZE)
  assert_stages_close(stages, want)
  np.testing.assert_allclose(final, want['features'].mean(axis=(1, 2)), atol=1e-4, rtol=1e-4)


def test_full_size_is_table1_and_shapes_are_torchvision():
  assert registry.pooled_dim('alexnet') == 256  # paper 001 Table 1
  b = get_backbone('alexnet', abstract=True)
  x = jax.ShapeDtypeStruct((1, 224, 224, 3), np.uint8)
  _, stages = jax.eval_shape(b.__call__, x)
  assert stages['features'].shape == (1, 6, 6, 256) and stages['conv1'].shape == (1, 55, 55, 64)
  shapes = alexnet.variable_shapes(alexnet.CONVS, 224)['params']
  assert shapes['conv2']['kernel'].shape == (5, 5, 64, 192)
  assert b.preprocess.resize == 'squash' and b.layers == ('features',)
