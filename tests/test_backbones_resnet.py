"""torchvision-style ResNet / ResNeXt in Flax vs a minimal PyTorch reference written here, through the converter.

The reference follows the architecture as He et al. 2016 / Xie et al. 2017 describe it and torchvision builds it
(7x7 stem + max pool, BasicBlock or Bottleneck with the stride on the 3x3 conv, grouped 3x3 conv of width
int(planes * width_per_group / 64) * groups, 1x1 conv + BN shortcut), with torchvision's parameter names, and a
`base` width so that a tiny member can be built (64 in every real member).
"""
import jax
import numpy as np
import pytest

from torch_init import assert_stages_close, randomise, run_both
from visim_jax.backbones import convert, get_backbone, registry, resnet
from visim_jax.core.errors import UserError

torch = pytest.importorskip('torch')
nn = torch.nn
F = torch.nn.functional


class RefBlock(nn.Module):

  def __init__(self, arch, inplanes, planes, stride):
    super().__init__()
    out = planes * arch.expansion
    if arch.block == 'basic':
      self.conv1, self.bn1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False), nn.BatchNorm2d(planes)
      self.conv2, self.bn2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False), nn.BatchNorm2d(planes)
      self.conv3 = None
    else:
      width = int(planes * arch.width_per_group / arch.base) * arch.groups
      self.conv1, self.bn1 = nn.Conv2d(inplanes, width, 1, bias=False), nn.BatchNorm2d(width)
      self.conv2 = nn.Conv2d(width, width, 3, stride, 1, groups=arch.groups, bias=False)
      self.bn2 = nn.BatchNorm2d(width)
      self.conv3, self.bn3 = nn.Conv2d(width, out, 1, bias=False), nn.BatchNorm2d(out)
    self.downsample = None
    if stride != 1 or inplanes != out:
      self.downsample = nn.Sequential(nn.Conv2d(inplanes, out, 1, stride, bias=False), nn.BatchNorm2d(out))

  def forward(self, x):
    out = F.relu(self.bn1(self.conv1(x)))
    out = self.bn2(self.conv2(out))
    if self.conv3 is not None:
      out = self.bn3(self.conv3(F.relu(out)))
    return F.relu(out + (x if self.downsample is None else self.downsample(x)))


class RefResNet(nn.Module):

  def __init__(self, arch, num_classes=7):
    super().__init__()
    self.conv1, self.bn1 = nn.Conv2d(3, arch.base, 7, 2, 3, bias=False), nn.BatchNorm2d(arch.base)
    inplanes = arch.base
    for i, n in enumerate(arch.layers):
      planes, blocks = arch.base * 2 ** i, []
      for j in range(n):
        blocks.append(RefBlock(arch, inplanes, planes, (1 if i == 0 else 2) if j == 0 else 1))
        inplanes = planes * arch.expansion
      setattr(self, f'layer{i + 1}', nn.Sequential(*blocks))
    self.fc = nn.Linear(inplanes, num_classes)

  def forward(self, x):
    stages = {}
    x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, 2, 1)
    stages['stem'] = x
    for i in range(1, 5):
      x = getattr(self, f'layer{i}')(x)
      stages[f'stage{i}'] = x
    stages['pooled'] = x.mean(dim=(2, 3))
    return stages


def _parity(name, tmp_path):
  arch = resnet.tiny_arch(resnet.MEMBERS[name][0])
  ref = randomise(RefResNet(arch), 0)
  ckpt = tmp_path / f'{name}.pth'
  torch.save({f'module.{k}': v for k, v in ref.state_dict().items()}, ckpt)  # a DataParallel-style save
  out = tmp_path / f'{name}.safetensors'
  info = convert.convert(name, str(ckpt), str(out), tiny=True)
  assert info['backbone'] == name and info['num_tensors'] == sum(
      1 for k in ref.state_dict() if not k.startswith('fc.') and not k.endswith('num_batches_tracked'))

  backbone = get_backbone(name, weights=str(out), tiny=True)
  assert backbone.weights_id == info['sha256']
  final, stages, want = run_both(backbone, ref, arch.image_size)
  assert_stages_close(stages, want, name=name)
  np.testing.assert_allclose(final, want['pooled'], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize('name', ['resnet18', 'resnet50', 'resnext101_32x8d_wsl'])
def test_parity_with_pytorch_reference(name, tmp_path):
  """BasicBlock, Bottleneck, and a grouped (ResNeXt) Bottleneck, each at a tiny width through the converter."""
  _parity(name, tmp_path)


TABLE1 = {'resnet18': 960, 'resnet34': 960, 'resnet50': 3840, 'resnet101': 3840, 'resnet152': 3840,
          'resnet50_ssl': 3840, 'resnext101_32x8d_ssl': 3840, 'resnet50_swsl': 3840, 'resnext101_32x8d_swsl': 3840,
          'resnext101_32x16d_swsl': 3840, 'resnext101_32x8d_wsl': 3840, 'resnext101_32x16d_wsl': 3840,
          'resnext101_32x32d_wsl': 3840, 'resnext101_32x48d_wsl': 3840, 'barlow': 3840, 'dino_resnet50': 3840}


def test_full_size_members_have_table1_sizes_and_the_seed_preprocessing():
  for name, size in TABLE1.items():
    assert registry.pooled_dim(name) == size, name
    b = get_backbone(name, abstract=True)
    assert b.layers == resnet.DEFAULT_LAYERS
    pre = b.preprocess
    assert (pre.size, pre.resize, pre.interpolation) == (224, 'squash', 'torch_bilinear')
    np.testing.assert_allclose(np.array(pre.mean) / 255, (0.485, 0.456, 0.406))
  # parameter counts = torchvision's without the 1000-class fc (2048 * 1000 + 1000): ResNet-50 25,557,032;
  # ResNeXt-101 32x48d 828,411,176 (~829M in Mahajan et al. 2018), grouped width 1536 in stage 1
  def count(name):
    return sum(int(np.prod(v.shape)) for v in jax.tree.leaves(resnet.variable_shapes(resnet.MEMBERS[name][0])['params']))
  assert count('resnet50') == 25_557_032 - 2_049_000
  assert count('resnext101_32x48d_wsl') == 828_411_176 - 2_049_000
  shapes = resnet.variable_shapes(resnet.MEMBERS['resnext101_32x48d_wsl'][0])
  assert shapes['params']['layer1_0']['conv2']['kernel'].shape == (3, 3, 48, 1536)


def test_converter_checks_the_architecture_and_missing_weights_name_the_command(tmp_path, monkeypatch):
  arch = resnet.MEMBERS['resnet18'][0]
  sd = RefResNet(arch).state_dict()
  torch.save(sd, tmp_path / 'r18.pth')
  with pytest.raises(UserError, match='do not fit resnet50'):
    convert.convert('resnet50', str(tmp_path / 'r18.pth'), str(tmp_path / 'o.safetensors'))
  assert not (tmp_path / 'o.safetensors').exists()
  monkeypatch.setenv('VISIM_JAX_WEIGHTS', str(tmp_path / 'w'))
  info = convert.convert('resnet18', str(tmp_path / 'r18.pth'))  # default --out: the offline weights folder
  assert info['out'] == str(tmp_path / 'w' / 'resnet18.safetensors')
  b = get_backbone('resnet18')
  np.testing.assert_array_equal(b.variables['params']['layer2_0']['downsample_conv']['kernel'],
                                sd['layer2.0.downsample.0.weight'].numpy().transpose(2, 3, 1, 0))
  np.testing.assert_array_equal(b.variables['batch_stats']['layer4_1']['bn2']['var'],
                                sd['layer4.1.bn2.running_var'].numpy())
  with pytest.raises(UserError, match='convert --backbone=resnet34'):
    get_backbone('resnet34')
