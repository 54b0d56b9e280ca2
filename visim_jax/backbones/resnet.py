"""torchvision-style ResNet / ResNeXt in Flax (NHWC), for the torchvision, Facebook SSL/SWSL/WSL, Barlow Twins and
DINO weights that paper 001's Table 1 uses.

Architecture (He et al. 2016; Xie et al. 2017 for ResNeXt), as torchvision's `models/resnet.py` builds it:
- stem: 7x7 conv stride 2 (pad 3) + BatchNorm + ReLU, 3x3 max pool stride 2 (pad 1);
- four stages of BasicBlocks (resnet18/34: two 3x3 convs, expansion 1) or Bottlenecks (1x1, 3x3, 1x1,
  expansion 4) with the stride on the 3x3 conv ("ResNet v1.5"); a Bottleneck's inner width is
  `int(planes * width_per_group / 64) * groups` and its 3x3 conv has `groups` groups (ResNeXt 32x8d: groups 32,
  width_per_group 8); shortcut = 1x1 conv (stride) + BatchNorm when the shape changes. BatchNorm eps 1e-5.
Stages returned: 'stem' (after the max pool), 'stage1'..'stage4' (torchvision's layer1..layer4) and 'pooled'
(global average of stage4, `final`). The classifier (`fc`) is not kept: none of the paper's features use it and
Barlow Twins / DINO checkpoints have none.

Default layers: stage1..stage4, what the seed code (VieVie31/visual-similarity, featuresExtractor/models.py) hooks
("layer1".."layer4") for every member: 64+128+256+512 = 960 (resnet18/34), 256+512+1024+2048 = 3840 (the rest).
Preprocessing (the seed's featuresExtractor/transforms.py, used for every member): the whole image squashed to
224x224 with a bilinear resize, ImageNet mean/std.

Weights: a safetensors file in torchvision's names and layouts (`conv1.weight`, `layer1.0.downsample.0.weight`,
`layer3.5.bn2.running_var`, ...), written once by `python -m visim_jax.backbones.convert --backbone=NAME
--checkpoint=FILE` from the public checkpoint (see docs/backbones.md for each member's file).
"""
from __future__ import annotations

import dataclasses
import functools
import re
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from visim_jax.backbones import weights as weights_lib
from visim_jax.backbones.base import Backbone, block_class
from visim_jax.core import pooling
from visim_jax.core.errors import UserError
from visim_jax.data.preprocess import IMAGENET_MEAN, IMAGENET_STD, Preprocess


@dataclasses.dataclass(frozen=True)
class Arch:
  block: str                           # 'basic' | 'bottleneck'
  layers: tuple[int, int, int, int]
  groups: int = 1
  width_per_group: int = 64
  base: int = 64                       # stem width and stage-1 planes (64 in torchvision; smaller only for tiny)
  image_size: int = 224

  @property
  def expansion(self) -> int:
    return 1 if self.block == 'basic' else 4

  def stage_dims(self) -> tuple[int, ...]:
    return tuple(self.base * 2 ** i * self.expansion for i in range(4))


_R50, _R101 = (3, 4, 6, 3), (3, 4, 23, 3)

# name -> (architecture, where the weights come from); all are torchvision's ResNet class
MEMBERS: dict[str, tuple[Arch, str]] = {
    'resnet18': (Arch('basic', (2, 2, 2, 2)), 'torchvision resnet18 ImageNet-1k (resnet18-5c106cde.pth)'),
    'resnet34': (Arch('basic', (3, 4, 6, 3)), 'torchvision resnet34 ImageNet-1k (resnet34-333f7ec4.pth)'),
    'resnet50': (Arch('bottleneck', _R50), 'torchvision resnet50 ImageNet-1k (resnet50-19c8e357.pth)'),
    'resnet101': (Arch('bottleneck', _R101), 'torchvision resnet101 ImageNet-1k (resnet101-5d3b4d8f.pth)'),
    'resnet152': (Arch('bottleneck', (3, 8, 36, 3)),
                  'torchvision resnet152 ImageNet-1k (resnet152-b121ed2d.pth)'),
    'resnet50_ssl': (Arch('bottleneck', _R50), 'ResNet-50 semi-supervised YFCC100M -> ImageNet-1k (Yalniz et al. 2019)'),
    'resnext101_32x8d_ssl': (Arch('bottleneck', _R101, 32, 8), 'ResNeXt-101 32x8d semi-supervised (Yalniz et al. 2019)'),
    'resnext101_32x16d_ssl': (Arch('bottleneck', _R101, 32, 16),
                              'ResNeXt-101 32x16d semi-supervised (what the seed code loads under resnext101_32x8d_ssl)'),
    'resnet50_swsl': (Arch('bottleneck', _R50), 'ResNet-50 semi-weakly supervised IG-1B -> ImageNet-1k'),
    'resnext101_32x8d_swsl': (Arch('bottleneck', _R101, 32, 8), 'ResNeXt-101 32x8d semi-weakly supervised'),
    'resnext101_32x16d_swsl': (Arch('bottleneck', _R101, 32, 16), 'ResNeXt-101 32x16d semi-weakly supervised'),
    'resnext101_32x8d_wsl': (Arch('bottleneck', _R101, 32, 8), 'ResNeXt-101 32x8d weakly supervised IG-940M (WSL)'),
    'resnext101_32x16d_wsl': (Arch('bottleneck', _R101, 32, 16), 'ResNeXt-101 32x16d weakly supervised (WSL)'),
    'resnext101_32x32d_wsl': (Arch('bottleneck', _R101, 32, 32), 'ResNeXt-101 32x32d weakly supervised (WSL)'),
    'resnext101_32x48d_wsl': (Arch('bottleneck', _R101, 32, 48), 'ResNeXt-101 32x48d weakly supervised (WSL)'),
    'barlow': (Arch('bottleneck', _R50), 'Barlow Twins ResNet-50, self-supervised ImageNet-1k (facebookresearch/barlowtwins)'),
    'dino_resnet50': (Arch('bottleneck', _R50), 'DINO ResNet-50, self-supervised ImageNet-1k (facebookresearch/dino)'),
}
DEFAULT_LAYERS = ('stage1', 'stage2', 'stage3', 'stage4')
STAGES = ('stem', 'stage1', 'stage2', 'stage3', 'stage4', 'pooled')
TINY_SIZE = 64


def tiny_arch(arch: Arch) -> Arch:
  """A tiny random-weights member of the same kind (block type, grouped or not): base width 8, 64 px."""
  return Arch(arch.block, (1, 2, 1, 1), 4 if arch.groups > 1 else 1, 4 if arch.groups > 1 else 8, 8, TINY_SIZE)


def preprocess(size: int = 224) -> Preprocess:
  """The seed code's default transform (featuresExtractor/transforms.py: ToTensor, Resize([224, 224]) on the float
  tensor, Normalize): squash to size x size with torch's non-antialiased bilinear kernel, ImageNet mean/std."""
  return Preprocess(size=size, resize='squash', mean=IMAGENET_MEAN, std=IMAGENET_STD, interpolation='torch_bilinear')


def _conv(features, kernel, stride, name, groups=1, dtype=jnp.float32):
  pad = kernel // 2
  return nn.Conv(features, (kernel, kernel), (stride, stride), padding=((pad, pad), (pad, pad)), use_bias=False,
                 feature_group_count=groups, dtype=dtype, name=name)


def _bn(name, dtype):
  return nn.BatchNorm(use_running_average=True, epsilon=1e-5, dtype=dtype, name=name)


class Block(nn.Module):
  arch: Arch
  planes: int
  stride: int
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    a, d = self.arch, self.dtype
    out_ch = self.planes * a.expansion
    if a.block == 'basic':
      out = nn.relu(_bn('bn1', d)(_conv(self.planes, 3, self.stride, 'conv1', dtype=d)(x)))
      out = _bn('bn2', d)(_conv(self.planes, 3, 1, 'conv2', dtype=d)(out))
    else:
      width = int(self.planes * a.width_per_group / a.base) * a.groups
      out = nn.relu(_bn('bn1', d)(_conv(width, 1, 1, 'conv1', dtype=d)(x)))
      out = nn.relu(_bn('bn2', d)(_conv(width, 3, self.stride, 'conv2', a.groups, d)(out)))
      out = _bn('bn3', d)(_conv(out_ch, 1, 1, 'conv3', dtype=d)(out))
    identity = x
    if self.stride != 1 or x.shape[-1] != out_ch:
      identity = _bn('downsample_bn', d)(_conv(out_ch, 1, self.stride, 'downsample_conv', dtype=d)(x))
    return nn.relu(out + identity)


class ResNet(nn.Module):
  arch: Arch
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    a, d = self.arch, self.dtype
    x = x.astype(d)
    stages = {}
    x = nn.relu(_bn('bn1', d)(_conv(a.base, 7, 2, 'conv1', dtype=d)(x)))
    x = pooling.max_pool(x, (3, 3), (2, 2), ((1, 1), (1, 1)))
    stages['stem'] = x
    for i, blocks in enumerate(a.layers):
      for j in range(blocks):
        x = block_class(Block)(a, a.base * 2 ** i, (1 if i == 0 else 2) if j == 0 else 1, d, name=f'layer{i + 1}_{j}')(x)
      stages[f'stage{i + 1}'] = x
    stages['pooled'] = x.mean(axis=(1, 2))
    return stages['pooled'], stages


def apply_resnet(arch: Arch, variables, x):
  """Pure (final, stages) on a normalised NHWC batch, computed at x.dtype."""
  return ResNet(arch, x.dtype).apply(variables, x)


def apply_resnet_init(arch: Arch, variables, x):
  """The same outputs with variables made by `init` inside (the `abstract=True` backbone: under jax.eval_shape it
  gives every stage's shape without making a single weight)."""
  del variables
  return ResNet(arch, x.dtype).init_with_output(jax.random.PRNGKey(0), x)[0]


def variable_shapes(arch: Arch):
  """The flax variable tree's shapes (jax.eval_shape; no weights made)."""
  x = jax.ShapeDtypeStruct((1, arch.image_size, arch.image_size, 3), jnp.float32)
  return jax.eval_shape(lambda x: ResNet(arch).init(jax.random.PRNGKey(0), x), x)


# ------------------------------------------------------------------------------------ weights (torchvision names)

def _module_path(prefix: str) -> tuple[str, ...]:
  m = re.fullmatch(r'layer(\d)\.(\d+)\.(.+)', prefix)
  if not m:
    return (prefix,)
  rest = {'downsample.0': 'downsample_conv', 'downsample.1': 'downsample_bn'}.get(m.group(3), m.group(3))
  return (f'layer{m.group(1)}_{m.group(2)}', rest)


def prepare_state_dict(name: str, sd: dict, where: str, tiny: bool = False) -> tuple[dict, dict]:
  """A raw checkpoint -> (the tensors to store: torchvision names, float32, no classifier; info for the sidecar).

  Accepts 'module.' prefixes (DataParallel saves) and drops `fc.*` and `num_batches_tracked`; fails unless the
  rest fits NAME's architecture exactly.
  """
  arch = _arch(name, tiny)
  out = weights_lib.clean_state_dict(sd, drop=('fc.',))
  weights_lib.check_fits(weights_lib.torch_to_flax(out, _module_path, where), variable_shapes(arch), name, where)
  return out, {'architecture': dataclasses.asdict(arch)}


def _arch(name: str, tiny: bool) -> Arch:
  if name not in MEMBERS:
    raise UserError(f'config.backbone: {name!r} is not a torchvision-style ResNet; known: {", ".join(MEMBERS)}')
  arch = MEMBERS[name][0]
  return tiny_arch(arch) if tiny else arch


def resnet_backbone(name: str, weights: str | None = None, random_init: int | None = None, tiny: bool = False,
                    layers: str | Sequence[str] | None = None, abstract: bool = False) -> Backbone:
  """A torchvision-style ResNet/ResNeXt: converted weights (offline), `random_init=SEED`, `tiny=True`, or
  `abstract=True` (no weights: for jax.eval_shape size checks, e.g. `layer_dims`; running it would use a random
  init)."""
  arch = _arch(name, tiny)
  variables, weights_id, where = weights_lib.family_variables(
      name, weights=weights, random_init=random_init, tiny=tiny, abstract=abstract, init=ResNet(arch).init,
      image_size=arch.image_size, to_flax=lambda sd, where: weights_lib.torch_to_flax(sd, _module_path, where),
      shapes=lambda: variable_shapes(arch))
  layers = weights_lib.parse_layers(name, layers, DEFAULT_LAYERS, STAGES)
  return Backbone(
      name=name,
      apply_fn=functools.partial(apply_resnet_init if abstract else apply_resnet, arch),
      variables=variables,
      preprocess=preprocess(arch.image_size),
      layers=layers,
      weights_id=weights_id,
      labels=None,
      description=f'{MEMBERS[name][1]} [{where}]',
  )
