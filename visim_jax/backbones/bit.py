"""BiT-M ResNetV2 (Kolesnikov et al. 2020, "Big Transfer") in Flax (NHWC), as timm's `resnetv2_*_bitm_in21k`.

Architecture (the paper's Sec. 2 + He et al. 2016 "Identity mappings"; timm 0.4.5 `models/resnetv2.py`, the
version the seed code pins in requirements.txt):
- every convolution is weight-standardised (per output channel, over (kh, kw, in)): timm 0.4.5's StdConv2d
  computes w' = (w - mean) / (std + 1e-5) (biased std); `weight_standardization='timm'` gives later timm's
  (w - mean) / sqrt(var + 1e-8) and 'big_transfer' the authors' (w - mean) / sqrt(var + 1e-10);
- stem: 7x7 conv stride 2 (pad 3), zero pad 1, 3x3 max pool stride 2 (timm's 'fixed' stem, no norm);
- pre-activation bottlenecks: x' = relu(GN(x)); shortcut = 1x1 conv(x') (first block of each stage) or x;
  out = conv1x1(x') -> relu(GN) -> conv3x3 (stride) -> relu(GN) -> conv1x1, + shortcut. GroupNorm 32 groups,
  eps 1e-5. Widths: stem 64*k, stages 256k, 512k, 1024k, 2048k (k the width factor), inner width 1/4;
- after the last stage: relu(GN(x)) ('norm', the pre-logits map).
Stages returned: 'stem', 'stage1'..'stage4' (each stage's output, before any norm), 'norm', 'pooled' (spatial
mean of 'norm', `final`). The 21k-class head is not kept.

Default layers: stage1, stage2, stage3, norm: the seed code hooks `list(model.named_modules())` indices
[6, 44, 93, -6] (R50/R101) and [6, 44, 137, -6] (R152), which in timm 0.4.5's module order are stages.0,
stages.1, stages.2 and `norm` (GroupNormAct, its ReLU included): 256k+512k+1024k+2048k = 3840k dims
(Table 1: 3840, 11520, 3840, 11520, 7680, 15360).
Preprocessing: BiT models have no "transform" in the seed's models.py, so they get its default one: squash to
224 (bilinear), ImageNet mean/std (`preprocess='seed'`). `preprocess='bit'` is BiT's own [-1, 1] scaling
(mean = std = 0.5) at 224.

Weights: timm names (`stem.conv.weight`, `stages.0.blocks.0.downsample.conv.weight`, `stages.1.blocks.2.norm2.bias`,
`norm.weight`, ...), converted once by `python -m visim_jax.backbones.convert --backbone=bit_m_r50x1
--checkpoint=F` from Google's original `BiT-M-R50x1.npz` (TF names, mapped here as timm's load_pretrained does)
or from timm's state dict / safetensors (`resnetv2_50x1_bit.goog_in21k`).
"""
from __future__ import annotations

import dataclasses
import functools
import re
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from visim_jax.backbones import resnet
from visim_jax.backbones import weights as weights_lib
from visim_jax.backbones.base import Backbone, block_class
from visim_jax.core import pooling
from visim_jax.core.errors import UserError
from visim_jax.data.preprocess import Preprocess

WS_VARIANTS = ('timm0.4.5', 'timm', 'big_transfer')


@dataclasses.dataclass(frozen=True)
class Arch:
  layers: tuple[int, int, int, int]
  width: int                    # the width factor k
  base: int = 64                # stem width / 4 x stage-1 inner width (64 in every real member)
  gn_groups: int = 32
  image_size: int = 224

  def chans(self, i: int) -> int:  # output channels of stage i (0-based)
    return self.base * 4 * 2 ** i * self.width


MEMBERS = {
    'bit_m_r50x1': (Arch((3, 4, 6, 3), 1), 'resnetv2_50x1_bitm_in21k', 'BiT-M-R50x1.npz'),
    'bit_m_r50x3': (Arch((3, 4, 6, 3), 3), 'resnetv2_50x3_bitm_in21k', 'BiT-M-R50x3.npz'),
    'bit_m_r101x1': (Arch((3, 4, 23, 3), 1), 'resnetv2_101x1_bitm_in21k', 'BiT-M-R101x1.npz'),
    'bit_m_r101x3': (Arch((3, 4, 23, 3), 3), 'resnetv2_101x3_bitm_in21k', 'BiT-M-R101x3.npz'),
    'bit_m_r152x2': (Arch((3, 8, 36, 3), 2), 'resnetv2_152x2_bitm_in21k', 'BiT-M-R152x2.npz'),
    'bit_m_r152x4': (Arch((3, 8, 36, 3), 4), 'resnetv2_152x4_bitm_in21k', 'BiT-M-R152x4.npz'),
}
DEFAULT_LAYERS = ('stage1', 'stage2', 'stage3', 'norm')
STAGES = ('stem', 'stage1', 'stage2', 'stage3', 'stage4', 'norm', 'pooled')
TINY_SIZE = 64


def tiny_arch(arch: Arch) -> Arch:
  return Arch((1, 2, 1, 1), arch.width if arch.width <= 2 else 2, 4, 4, TINY_SIZE)


def standardize(w: jax.Array, variant: str = 'timm0.4.5') -> jax.Array:
  """Weight standardisation of an HWIO kernel per output channel (over H, W, I); see the module docstring."""
  mean = w.mean(axis=(0, 1, 2), keepdims=True)
  var = jnp.square(w - mean).mean(axis=(0, 1, 2), keepdims=True)
  if variant == 'timm0.4.5':
    return (w - mean) / (jnp.sqrt(var) + 1e-5)
  return (w - mean) * jax.lax.rsqrt(var + (1e-8 if variant == 'timm' else 1e-10))


class StdConv(nn.Module):
  features: int
  kernel: int
  stride: int = 1
  ws: str = 'timm0.4.5'
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    k, pad = self.kernel, self.kernel // 2
    w = self.param('kernel', nn.initializers.lecun_normal(), (k, k, x.shape[-1], self.features))
    w = standardize(w.astype(jnp.float32), self.ws).astype(self.dtype)
    return jax.lax.conv_general_dilated(x, w, (self.stride, self.stride), ((pad, pad), (pad, pad)),
                                        dimension_numbers=('NHWC', 'HWIO', 'NHWC'))


def _gn_relu(x, name, groups, dtype):
  return nn.relu(nn.GroupNorm(num_groups=groups, epsilon=1e-5, use_fast_variance=False, dtype=dtype, name=name)(x))


class PreActBottleneck(nn.Module):
  out: int
  stride: int
  project: bool
  groups: int
  ws: str
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    conv = functools.partial(StdConv, ws=self.ws, dtype=self.dtype)
    mid = self.out // 4
    x_pre = _gn_relu(x, 'norm1', self.groups, self.dtype)
    shortcut = conv(self.out, 1, self.stride, name='downsample_conv')(x_pre) if self.project else x
    y = conv(mid, 1, name='conv1')(x_pre)
    y = conv(mid, 3, self.stride, name='conv2')(_gn_relu(y, 'norm2', self.groups, self.dtype))
    y = conv(self.out, 1, name='conv3')(_gn_relu(y, 'norm3', self.groups, self.dtype))
    return y + shortcut


class ResNetV2(nn.Module):
  arch: Arch
  ws: str = 'timm0.4.5'
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    a, d = self.arch, self.dtype
    x = x.astype(d)
    stages = {}
    x = StdConv(a.base * a.width, 7, 2, self.ws, d, name='stem_conv')(x)
    x = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))  # ConstantPad2d(1, 0.) then a valid 3x3/2 max pool
    x = pooling.max_pool(x, (3, 3), (2, 2))
    stages['stem'] = x
    for i, blocks in enumerate(a.layers):
      for j in range(blocks):
        x = block_class(PreActBottleneck)(a.chans(i), (1 if i == 0 else 2) if j == 0 else 1, j == 0, a.gn_groups, self.ws, d,
                             name=f'stage{i + 1}_{j}')(x)
      stages[f'stage{i + 1}'] = x
    x = _gn_relu(x, 'norm', a.gn_groups, d)
    stages['norm'] = x
    stages['pooled'] = x.mean(axis=(1, 2))
    return stages['pooled'], stages


def apply_bit(arch: Arch, ws: str, variables, x):
  return ResNetV2(arch, ws, x.dtype).apply(variables, x)


def apply_bit_init(arch: Arch, ws: str, variables, x):
  """Outputs with variables made inside (the `abstract=True` backbone, for jax.eval_shape only)."""
  del variables
  return ResNetV2(arch, ws, x.dtype).init_with_output(jax.random.PRNGKey(0), x)[0]


def variable_shapes(arch: Arch):
  x = jax.ShapeDtypeStruct((1, arch.image_size, arch.image_size, 3), jnp.float32)
  return jax.eval_shape(lambda x: ResNetV2(arch).init(jax.random.PRNGKey(0), x), x)


# ------------------------------------------------------------------------------------------- weights (timm names)

def _module_path(prefix: str) -> tuple[str, ...]:
  if prefix == 'stem.conv':
    return ('stem_conv',)
  m = re.fullmatch(r'stages\.(\d)\.blocks\.(\d+)\.(.+)', prefix)
  if m:
    return (f'stage{int(m.group(1)) + 1}_{m.group(2)}', m.group(3).replace('downsample.conv', 'downsample_conv'))
  return (prefix,)


def from_big_transfer_npz(sd: dict) -> dict:
  """Google's original BiT .npz (TF names, HWIO kernels) -> timm names and PyTorch layouts (OIHW), as timm's
  ResNetV2.load_pretrained maps them; the head (`resnet/head/...`) is left out."""
  p = 'resnet/'
  out = {'stem.conv.weight': sd[f'{p}root_block/standardized_conv2d/kernel'],
         'norm.weight': sd[f'{p}group_norm/gamma'], 'norm.bias': sd[f'{p}group_norm/beta']}
  for key in sd:
    m = re.fullmatch(rf'{p}block(\d)/unit(\d+)/([abc])/(standardized_conv2d/kernel|group_norm/gamma|group_norm/beta|'
                     r'proj/standardized_conv2d/kernel)', key)
    if not m:
      continue
    stage, unit, part, what = int(m.group(1)) - 1, int(m.group(2)) - 1, m.group(3), m.group(4)
    i = 'abc'.index(part) + 1
    block = f'stages.{stage}.blocks.{unit}.'
    name = {'standardized_conv2d/kernel': f'conv{i}.weight', 'group_norm/gamma': f'norm{i}.weight',
            'group_norm/beta': f'norm{i}.bias', 'proj/standardized_conv2d/kernel': 'downsample.conv.weight'}[what]
    out[block + name] = sd[key]
  # kernels HWIO -> OIHW; GroupNorm gamma / beta flattened to (C,) whatever their stored rank
  return {k: np.asarray(v).transpose(3, 2, 0, 1) if k.endswith('conv.weight') or re.search(r'conv\d\.weight$', k)
          else np.asarray(v).reshape(-1) for k, v in out.items()}


def prepare_state_dict(name: str, sd: dict, where: str, tiny: bool = False) -> tuple[dict, dict]:
  """timm ResNetV2 state dict or Google's BiT .npz -> timm-named tensors without the head; checked against NAME."""
  arch = _arch(name, tiny)
  if any(k.startswith('resnet/') for k in sd):
    try:
      sd = from_big_transfer_npz(sd)
    except KeyError as e:
      raise UserError(f'{where}: not a BiT ResNetV2 .npz (missing {e})') from None
  out = weights_lib.clean_state_dict(sd, drop=('head.', 'fc.'))
  weights_lib.check_fits(weights_lib.torch_to_flax(out, _module_path, where), variable_shapes(arch), name, where)
  return out, {'architecture': dataclasses.asdict(arch), 'timm_name': MEMBERS[name][1]}


def _arch(name: str, tiny: bool) -> Arch:
  if name not in MEMBERS:
    raise UserError(f'config.backbone: {name!r} is not a BiT-M ResNetV2; known: {", ".join(MEMBERS)}')
  arch = MEMBERS[name][0]
  return tiny_arch(arch) if tiny else arch


def make_preprocess(kind: str = 'seed', size: int = 224) -> Preprocess:
  if kind == 'seed':
    return resnet.preprocess(size)  # the seed's default transform (one copy)
  if kind == 'bit':
    return Preprocess(size=size, resize='squash', mean=(127.5,) * 3, std=(127.5,) * 3, interpolation='bilinear')
  raise UserError(f"config.backbone_kwargs.preprocess: 'seed' or 'bit', got {kind!r}")


def bit_backbone(name: str, weights: str | None = None, random_init: int | None = None, tiny: bool = False,
                 layers: str | Sequence[str] | None = None, abstract: bool = False, preprocess: str = 'seed',
                 weight_standardization: str = 'timm0.4.5') -> Backbone:
  """A BiT-M ResNetV2: converted weights (offline), `random_init=SEED`, `tiny=True`, or `abstract=True` (no
  weights; for jax.eval_shape). `preprocess`: 'seed' | 'bit'; `weight_standardization`: one of WS_VARIANTS."""
  arch = _arch(name, tiny)
  if weight_standardization not in WS_VARIANTS:
    raise UserError(f'config.backbone_kwargs.weight_standardization: one of {WS_VARIANTS}, got '
                    f'{weight_standardization!r}')
  pre = make_preprocess(preprocess, arch.image_size)
  variables, weights_id, where = weights_lib.family_variables(
      name, weights=weights, random_init=random_init, tiny=tiny, abstract=abstract, init=ResNetV2(arch).init,
      image_size=arch.image_size, to_flax=lambda sd, where: weights_lib.torch_to_flax(sd, _module_path, where),
      shapes=lambda: variable_shapes(arch))
  layers = weights_lib.parse_layers(name, layers, DEFAULT_LAYERS, STAGES)
  apply = apply_bit_init if abstract else apply_bit
  return Backbone(
      name=name,
      apply_fn=functools.partial(apply, arch, weight_standardization),
      variables=variables,
      preprocess=pre,
      layers=layers,
      weights_id=weights_id,
      labels=None,
      description=f'BiT-M {name[6:].upper()} ImageNet-21k (timm {MEMBERS[name][1]}) [{where}]',
  )
