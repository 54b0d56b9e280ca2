"""Hugging Face's ResNet and RegNet (transformers `ResNetModel`, `RegNetModel`) in Flax, NHWC, with module names that
mirror the PyTorch checkpoints' keys.

Architecture (transformers `models/resnet/modeling_resnet.py` and `models/regnet/modeling_regnet.py`, 4.57 = 5.x):
- a conv layer is conv (padding k // 2, no bias, `groups`) -> BatchNorm (eps 1e-5) -> ReLU (none where the layer
  ends a residual branch); a shortcut is a 1x1 conv (stride) + BatchNorm, used when the channels or the stride change;
- ResNet stem (`embedder.embedder`): 7x7 stride-2 conv layer, then a 3x3 stride-2 max pool (pad 1);
  RegNet stem: a 3x3 stride-2 conv layer, no pool;
- four stages (`encoder.stages.S.layers.J`); the first layer of a stage has the stride: stage 1 strides 2 only when
  `downsample_in_first_stage` (RegNet: always; ResNet: False), the others 2;
- ResNet basic layer: 3x3 (stride), 3x3; bottleneck: 1x1 to out/4, 3x3, 1x1 to out, the stride on the 3x3 unless
  `downsample_in_bottleneck` (then on the first 1x1); out = ReLU(branch + shortcut);
- RegNet X layer: 1x1, 3x3 grouped (groups = max(1, out // groups_width), stride), 1x1 without ReLU; the Y layer puts a
  squeeze-excitation between the 3x3 and the last 1x1: x * sigmoid(conv1x1(ReLU(conv1x1(mean_hw(x))))), reduced
  width round(in_channels / 4) of the layer's *input* channels, both 1x1 with bias;
- pooled = global average of the last stage.
Stages returned: 'stem' (the stem's output: after the max pool for ResNet), 'stage1'..'stage4' (NHWC), 'pooled' (N, C).

Module names: the flax path is the PyTorch module path with each '.N' index joined to its name ('encoder.stages.0.
layers.1.layer.2.attention.0' -> encoder/stages_0/layers_1/layer_2/attention_0), so a checkpoint loads by
`weights.torch_to_flax(state, module_path)` (hf.py).
"""
from __future__ import annotations

import dataclasses
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
from visim_jax.core import pooling

BN_EPS = 1e-5


@dataclasses.dataclass(frozen=True)
class Arch:
  """The fields of transformers' ResNetConfig / RegNetConfig the modules use (hf.py reads them from config.json)."""
  kind: str                                  # 'resnet' | 'regnet'
  embedding_size: int
  hidden_sizes: tuple[int, ...]
  depths: tuple[int, ...]
  layer_type: str                            # resnet: 'basic' | 'bottleneck'; regnet: 'x' | 'y'
  downsample_in_first_stage: bool
  downsample_in_bottleneck: bool = False     # resnet bottleneck only
  groups_width: int = 64                     # regnet only


class ConvLayer(nn.Module):
  features: int
  kernel: int = 3
  stride: int = 1
  groups: int = 1
  relu: bool = True
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    p = self.kernel // 2
    x = nn.Conv(self.features, (self.kernel, self.kernel), (self.stride, self.stride), padding=((p, p), (p, p)),
                use_bias=False, feature_group_count=self.groups, dtype=self.dtype, name='convolution')(x)
    x = nn.BatchNorm(use_running_average=True, epsilon=BN_EPS, dtype=self.dtype, name='normalization')(x)
    return nn.relu(x) if self.relu else x


class ShortCut(nn.Module):
  features: int
  stride: int
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    x = nn.Conv(self.features, (1, 1), (self.stride, self.stride), padding='VALID', use_bias=False, dtype=self.dtype,
                name='convolution')(x)
    return nn.BatchNorm(use_running_average=True, epsilon=BN_EPS, dtype=self.dtype, name='normalization')(x)


class SqueezeExcitation(nn.Module):
  reduced: int
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    s = x.mean(axis=(1, 2), keepdims=True)
    s = nn.relu(nn.Conv(self.reduced, (1, 1), dtype=self.dtype, name='attention_0')(s))
    s = jax.nn.sigmoid(nn.Conv(x.shape[-1], (1, 1), dtype=self.dtype, name='attention_2')(s))
    return x * s


class Layer(nn.Module):
  """One residual layer of a stage (ResNet basic / bottleneck, RegNet X / Y)."""
  arch: Arch
  features: int
  stride: int = 1
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    c, out, s, d = self.arch, self.features, self.stride, self.dtype
    conv = lambda i, *a, **k: ConvLayer(*a, dtype=d, name=f'layer_{i}', **k)  # noqa: E731
    if c.kind == 'resnet' and c.layer_type == 'basic':
      h = conv(1, out, relu=False)(conv(0, out, 3, s)(x))
    elif c.kind == 'resnet':
      red, dib = out // 4, c.downsample_in_bottleneck
      h = conv(0, red, 1, s if dib else 1)(x)
      h = conv(2, out, 1, relu=False)(conv(1, red, 3, 1 if dib else s)(h))
    else:
      h = conv(1, out, 3, s, max(1, out // c.groups_width))(conv(0, out, 1)(x))
      if c.layer_type == 'y':
        h = SqueezeExcitation(int(round(x.shape[-1] / 4)), d, name='layer_2')(h)
        h = conv(3, out, 1, relu=False)(h)
      else:
        h = conv(2, out, 1, relu=False)(h)
    shortcut = ShortCut(out, s, d, name='shortcut')(x) if (x.shape[-1] != out or s != 1) else x
    return nn.relu(h + shortcut)


class Stage(nn.Module):
  arch: Arch
  features: int
  stride: int
  depth: int
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    for j in range(self.depth):
      x = Layer(self.arch, self.features, self.stride if j == 0 else 1, self.dtype, name=f'layers_{j}')(x)
    return x


class Encoder(nn.Module):
  arch: Arch
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    c, outs = self.arch, []
    for i, (width, depth) in enumerate(zip(c.hidden_sizes, c.depths)):
      stride = (2 if c.downsample_in_first_stage else 1) if i == 0 else 2
      x = Stage(c, width, stride, depth, self.dtype, name=f'stages_{i}')(x)
      outs.append(x)
    return outs


class Embeddings(nn.Module):
  arch: Arch
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    c = self.arch
    x = ConvLayer(c.embedding_size, 7 if c.kind == 'resnet' else 3, 2, dtype=self.dtype, name='embedder')(x)
    if c.kind == 'resnet':
      x = pooling.max_pool(x, (3, 3), (2, 2), ((1, 1), (1, 1)))
    return x


class ConvNet(nn.Module):
  arch: Arch
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    x = Embeddings(self.arch, self.dtype, name='embedder')(x.astype(self.dtype))
    stages = {'stem': x}
    for i, h in enumerate(Encoder(self.arch, self.dtype, name='encoder')(x)):
      stages[f'stage{i + 1}'] = h
    stages['pooled'] = stages[f'stage{len(self.arch.depths)}'].mean(axis=(1, 2))
    return stages['pooled'], stages


def module_path(prefix: str) -> tuple[str, ...]:
  """PyTorch module path (base-model prefix removed) -> flax path: each '.N' index joined to its name."""
  return tuple(re.sub(r'\.(\d+)', r'_\1', prefix).split('.'))


def torch_key(path: tuple[str, ...]) -> str:
  """The inverse of `module_path` for a module path (no leaf)."""
  return re.sub(r'_(\d+)', r'.\1', '.'.join(path))
