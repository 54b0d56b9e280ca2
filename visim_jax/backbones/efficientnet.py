"""EfficientNet B0-B3 (Tan & Le 2019) in Flax, as gen-efficientnet-pytorch / timm build them, with their keys.

What the seed code (VieVie31/visual-similarity `featuresExtractor/models.py`) loads: `torch.hub.load(
"rwightman/gen-efficientnet-pytorch", "efficientnet_bN", pretrained=True)`, i.e. Ross Wightman's PyTorch-trained
weights (efficientnet_b0_ra-3dd342df.pth, efficientnet_b1-533bc792.pth, efficientnet_b2_ra-bcdf34b7.pth,
efficientnet_b3_ra2-cf984f9c.pth; timm's `efficientnet_b0..b3` share the file names and state-dict keys), not the
TF ports (`tf_efficientnet_*`: TF 'SAME' padding, BatchNorm eps 1e-3). Layer `-2` of `named_modules()` is
`global_pool` (the classifier is last): the spatial mean of the head activation, 1280 / 1280 / 1408 / 1536-d.

Architecture (geffnet `_gen_efficientnet` + `efficientnet_builder.py`; the paper's Table 1 for B0, its eq. 3
scaling with (width, depth) = (1.0, 1.0), (1.0, 1.1), (1.1, 1.2), (1.2, 1.4)):
- stem: 3x3 conv stride 2 (round_channels(32 x width)), BatchNorm, Swish;
- seven stages of (repeats, kernel, stride, expansion, channels): (1, 3, 1, 1, 16), (2, 3, 2, 6, 24),
  (2, 5, 2, 6, 40), (3, 3, 2, 6, 80), (3, 5, 1, 6, 112), (4, 5, 2, 6, 192), (1, 3, 1, 6, 320); repeats scaled by
  ceil(r x depth), channels by round_channels (multiple of 8, at most 10% below); the first stage is a
  depthwise-separable block (dw conv, BN, Swish, SE, 1x1 conv, BN), the others inverted residuals (1x1 expansion,
  BN, Swish, dw conv, BN, Swish, SE, 1x1 projection, BN); a residual when stride 1 and in == out channels;
- squeeze-excite: spatial mean -> 1x1 conv (with bias) to round(in_chs x 0.25) -> Swish -> 1x1 conv -> sigmoid gate;
- head: 1x1 conv to round_channels(1280 x width), BatchNorm, Swish; global mean (then the 1,000-class
  classifier, which is neither built nor stored here).
PyTorch padding (symmetric k // 2), BatchNorm eps 1e-5, bias-free convolutions except SE.

Stages returned (NHWC): 'stem', 'block1'..'block7' (each stage's output), 'head' (after the head's Swish).
Default layers: ('head',) (its spatial mean is the seed's `global_pool` output). `final`: that mean (N, C).

Preprocessing: the seed's default transform (224 x 224 bilinear squash, ImageNet mean/std); `preprocessing=
'native'` gives timm's eval transform (input 224 / 240 / 260 / 300, shorter side / crop_pct 0.875 (B3: 0.904),
bicubic, centre crop).

Weights: a safetensors file of the PyTorch state dict (`conv_stem.weight`, `bn1.running_mean`,
`blocks.1.0.conv_pw.weight`, `blocks.1.0.se.conv_reduce.bias`, ..., `bn2.*`; `classifier.*` dropped) at
`$VISIM_JAX_WEIGHTS/<name>.safetensors`, written once by `python -m visim_jax.backbones.convert --backbone=NAME
--checkpoint=FILE` (prepare_state_dict).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from visim_jax.backbones import weights as weights_lib
from visim_jax.backbones.base import Backbone, block_class
from visim_jax.backbones.resnet import preprocess as seed_transform  # the seed's default transform, one copy
from visim_jax.backbones.efficientnet_lite import DepthwiseConv
from visim_jax.core.errors import UserError
from visim_jax.data.preprocess import IMAGENET_MEAN, IMAGENET_STD, Preprocess

# (repeats, kernel, stride, expansion, channels) of B0; stage 1 is depthwise-separable (expansion 1)
STAGES = ((1, 3, 1, 1, 16), (2, 3, 2, 6, 24), (2, 5, 2, 6, 40), (3, 3, 2, 6, 80), (3, 5, 1, 6, 112),
          (4, 5, 2, 6, 192), (1, 3, 1, 6, 320))
SE_RATIO = 0.25
BN_EPS = 1e-5
DEFAULT_LAYERS = ('head',)


@dataclasses.dataclass(frozen=True)
class Arch:
  width: float
  depth: float
  native_size: int          # timm's eval resolution (only used by preprocessing='native')
  crop_pct: float = 0.875


ARCHS = {
    'efficientnet_b0': Arch(1.0, 1.0, 224),
    'efficientnet_b1': Arch(1.0, 1.1, 240),
    'efficientnet_b2': Arch(1.1, 1.2, 260),
    'efficientnet_b3': Arch(1.2, 1.4, 300, 0.904),
}
SOURCES = {
    'efficientnet_b0': 'EfficientNet-B0 (gen-efficientnet efficientnet_b0, efficientnet_b0_ra-3dd342df.pth)',
    'efficientnet_b1': 'EfficientNet-B1 (gen-efficientnet efficientnet_b1, efficientnet_b1-533bc792.pth)',
    'efficientnet_b2': 'EfficientNet-B2 (gen-efficientnet efficientnet_b2, efficientnet_b2_ra-bcdf34b7.pth)',
    'efficientnet_b3': 'EfficientNet-B3 (gen-efficientnet efficientnet_b3, efficientnet_b3_ra2-cf984f9c.pth)',
}
# width 0.25 (every stage 8 channels, head 320), depth 0.5 (repeats 1,1,1,2,2,2,1): exercises the residual
# depthwise-separable block, strided and residual inverted residuals, 3x3 and 5x5 kernels, SE
TINY = Arch(0.25, 0.5, 32)
TINY_SIZE = 32


def make_divisible(v: float, divisor: int = 8, min_value: int | None = None) -> int:
  """geffnet's rounding: nearest multiple of `divisor` (at least min_value), never more than 10% below v."""
  min_value = min_value or divisor
  new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
  if new_v < 0.9 * v:
    new_v += divisor
  return new_v


def round_channels(channels: int, multiplier: float) -> int:
  return make_divisible(channels * multiplier, 8)


@dataclasses.dataclass(frozen=True)
class BlockSpec:
  kind: str      # 'ds' (depthwise-separable) | 'ir' (inverted residual)
  kernel: int
  stride: int
  in_chs: int
  mid_chs: int
  out_chs: int
  se_chs: int


def block_specs(arch: Arch) -> tuple[tuple[BlockSpec, ...], ...]:
  """Per stage, the blocks of EfficientNet(width, depth) (geffnet's decode_arch_def + EfficientNetBuilder)."""
  in_chs = round_channels(32, arch.width)
  stages = []
  for s, (repeats, k, stride, e, c) in enumerate(STAGES):
    out = round_channels(c, arch.width)
    blocks = []
    for i in range(int(math.ceil(repeats * arch.depth))):
      mid = in_chs if s == 0 else make_divisible(in_chs * e)
      blocks.append(BlockSpec('ds' if s == 0 else 'ir', k, stride if i == 0 else 1, in_chs, mid, out,
                              make_divisible(in_chs * SE_RATIO, 1)))
      in_chs = out
    stages.append(tuple(blocks))
  return tuple(stages)


def stem_channels(arch: Arch) -> int:
  return round_channels(32, arch.width)


def head_channels(arch: Arch) -> int:
  return round_channels(1280, arch.width)


def _pad(k: int):
  return ((k // 2, k // 2), (k // 2, k // 2))


class SqueezeExcite(nn.Module):
  reduced: int
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    s = x.mean(axis=(1, 2), keepdims=True)
    s = nn.swish(nn.Conv(self.reduced, (1, 1), dtype=self.dtype, name='conv_reduce')(s))
    s = nn.Conv(x.shape[-1], (1, 1), dtype=self.dtype, name='conv_expand')(s)
    return x * jax.nn.sigmoid(s)


class Block(nn.Module):
  spec: BlockSpec
  dtype: jnp.dtype = jnp.float32
  depthwise_impl: str = 'auto'  # efficientnet_lite.depthwise_conv: 'shifted' on CPU, 'conv' elsewhere

  @nn.compact
  def __call__(self, x):
    b, d = self.spec, self.dtype
    bn = functools.partial(nn.BatchNorm, use_running_average=True, epsilon=BN_EPS, dtype=d)
    inp = x
    if b.kind == 'ir':
      x = nn.swish(bn(name='bn1')(nn.Conv(b.mid_chs, (1, 1), use_bias=False, dtype=d, name='conv_pw')(x)))
    x = DepthwiseConv(b.kernel, b.stride, self.depthwise_impl, _pad(b.kernel), name='conv_dw')(x)
    x = nn.swish(bn(name='bn2' if b.kind == 'ir' else 'bn1')(x))
    x = SqueezeExcite(b.se_chs, d, name='se')(x)
    proj = 'conv_pwl' if b.kind == 'ir' else 'conv_pw'
    x = bn(name='bn3' if b.kind == 'ir' else 'bn2')(nn.Conv(b.out_chs, (1, 1), use_bias=False, dtype=d,
                                                             name=proj)(x))
    if b.stride == 1 and b.in_chs == b.out_chs:
      x = x + inp
    return x


class EfficientNet(nn.Module):
  arch: Arch
  dtype: jnp.dtype = jnp.float32
  depthwise_impl: str = 'auto'

  @nn.compact
  def __call__(self, x):
    a, d = self.arch, self.dtype
    bn = functools.partial(nn.BatchNorm, use_running_average=True, epsilon=BN_EPS, dtype=d)
    x = nn.Conv(stem_channels(a), (3, 3), (2, 2), padding=_pad(3), use_bias=False, dtype=d, name='conv_stem')(
        x.astype(d))
    x = nn.swish(bn(name='bn1')(x))
    stages = {'stem': x}
    for s, blocks in enumerate(block_specs(a)):
      for i, spec in enumerate(blocks):
        x = block_class(Block)(spec, d, self.depthwise_impl, name=f'blocks_{s}_{i}')(x)
      stages[f'block{s + 1}'] = x
    x = nn.Conv(head_channels(a), (1, 1), use_bias=False, dtype=d, name='conv_head')(x)
    x = nn.swish(bn(name='bn2')(x))
    stages['head'] = x
    return x.mean(axis=(1, 2)), stages


def apply_efficientnet(arch: Arch, variables, x):
  """Pure (final, stages) on a normalised NHWC batch, computed at x.dtype."""
  return EfficientNet(arch, x.dtype).apply(variables, x)


def apply_efficientnet_init(arch: Arch, variables, x):
  """The same outputs with variables made by `init` inside (`abstract=True`: shapes only under jax.eval_shape)."""
  del variables  # 'conv': the same shapes, traced with far fewer ops than the CPU 'shifted' form
  return EfficientNet(arch, x.dtype, 'conv').init_with_output(jax.random.PRNGKey(0), x)[0]


def preprocess_for(name: str, arch: Arch, preprocessing: str = 'seed', tiny: bool = False) -> Preprocess:
  if preprocessing == 'seed':
    return seed_transform(TINY_SIZE if tiny else 224)
  if preprocessing == 'native':
    return Preprocess(size=arch.native_size, resize='shorter_crop',
                      resize_to=int(math.floor(arch.native_size / arch.crop_pct)), mean=IMAGENET_MEAN,
                      std=IMAGENET_STD, interpolation='bicubic')
  raise UserError(f"config.backbone_kwargs.preprocessing: {preprocessing!r} for {name}; expected 'seed' (the seed "
                  "code's default transform) or 'native' (timm's eval transform)")


# ------------------------------------------------------------------------------------ weights (geffnet / timm names)

def _module_path(prefix: str, where: str = 'weights') -> tuple[str, ...]:
  """'blocks.2.1.se.conv_reduce' -> blocks_2_1/se/conv_reduce; top-level names (conv_stem, bn1, conv_head, bn2)
  are kept."""
  parts = prefix.split('.')
  if parts[0] == 'blocks' and len(parts) >= 4 and parts[1].isdigit() and parts[2].isdigit():
    return (f'blocks_{parts[1]}_{parts[2]}',) + tuple(parts[3:])
  if prefix in ('conv_stem', 'bn1', 'conv_head', 'bn2'):
    return (prefix,)
  raise UserError(f'{where}: unexpected module {prefix!r} for a gen-efficientnet / timm EfficientNet')


def to_flax(sd: dict, where: str = 'weights') -> dict:
  """Stored tensors (geffnet / timm names) -> flax {'params', 'batch_stats'} (weights.torch_to_flax)."""
  return weights_lib.torch_to_flax(sd, functools.partial(_module_path, where=where), where)


def variable_shapes(arch: Arch) -> dict:
  """The flax variable tree's shapes (jax.eval_shape; no weights made)."""
  x = jax.ShapeDtypeStruct((1, TINY_SIZE, TINY_SIZE, 3), jnp.float32)
  return jax.eval_shape(lambda x: EfficientNet(arch, depthwise_impl='conv').init(jax.random.PRNGKey(0), x), x)


def prepare_state_dict(name: str, sd: dict, where: str, tiny: bool = False) -> tuple[dict, dict]:
  """A raw gen-efficientnet / timm checkpoint -> (tensors to store: its names, float32, no classifier; sidecar
  info). Drops 'module.' prefixes, `classifier.*` and `num_batches_tracked`; fails, naming the file, unless the
  rest fits NAME's architecture exactly (a B0 file for B3 does not). timm's `tf_efficientnet_bN` ports have the
  same keys and shapes but need TF 'SAME' padding and BatchNorm eps 1e-3: they cannot be told apart here, so
  convert the gen-efficientnet / timm `efficientnet_bN` file the seed code used."""
  arch = _arch(name, tiny)
  out = weights_lib.clean_state_dict(sd, drop=('classifier.',))
  weights_lib.check_fits(to_flax(out, where), variable_shapes(arch), name, where)
  return out, {'architecture': dataclasses.asdict(arch)}


def _arch(name: str, tiny: bool) -> Arch:
  if name not in ARCHS:
    raise UserError(f'config.backbone: {name!r} is not an EfficientNet B0-B3; known: {", ".join(ARCHS)}')
  return TINY if tiny else ARCHS[name]


def efficientnet(name: str, weights: str | None = None, random_init: int | None = None, tiny: bool = False,
                 layers: str | Sequence[str] | None = None, preprocessing: str = 'seed',
                 abstract: bool = False) -> Backbone:
  """A registered EfficientNet B0-B3: converted weights (offline), `random_init=SEED`, `tiny=True`, or
  `abstract=True` (no weights: for jax.eval_shape size checks)."""
  arch = _arch(name, tiny)
  variables, weights_id, where = weights_lib.family_variables(
      name, weights=weights, random_init=random_init, tiny=tiny, abstract=abstract, init=EfficientNet(arch).init,
      image_size=TINY_SIZE, to_flax=to_flax, shapes=lambda: variable_shapes(arch))
  layers = weights_lib.parse_layers(name, layers, DEFAULT_LAYERS, ['stem'] + [f'block{i}' for i in range(1, 8)] + ['head'])
  return Backbone(
      name=name,
      apply_fn=functools.partial(apply_efficientnet_init if abstract else apply_efficientnet, arch),
      variables=variables,
      preprocess=preprocess_for(name, arch, preprocessing, tiny),
      layers=layers,
      weights_id=weights_id,
      labels=None,
      description=f'{SOURCES[name]} [{where}; preprocessing {preprocessing}]',
  )
