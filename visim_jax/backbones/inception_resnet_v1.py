"""FaceNet's Inception-ResNet-v1 in Flax, with the state-dict keys of facenet-pytorch (VGGFace2 weights).

What the seed code (VieVie31/visual-similarity `featuresExtractor/models.py`, facenet-pytorch 2.5.2) loads:
`InceptionResnetV1(pretrained="vggface2")` (David Sandberg's 20180402-114759 VGGFace2 model converted by
facenet-pytorch: 20180402-114759-vggface2.pt) with the hook on module 'block8': the last Inception-ResNet-C block
(no ReLU), 1792 channels, spatially averaged by the seed's processor -- Table 1's 1792-d `facenet`.

Architecture (Szegedy et al. 2017, "Inception-v4, Inception-ResNet and the Impact of Residual Connections",
Sec. 3.2 and its Inception-ResNet-v1 figures; facenet-pytorch `models/inception_resnet_v1.py`):
- every BasicConv = conv (no bias) + BatchNorm (eps 1e-3) + ReLU;
- stem: 3x3/2 (32, valid), 3x3 (32, valid), 3x3 (64, same), maxpool 3x3/2, 1x1 (80), 3x3 (192, valid),
  3x3/2 (256, valid);
- 5 x Block35 (Inception-ResNet-A, 35x35 grid at 299px; branches 1x1 32 | 1x1 32, 3x3 32 | 1x1 32, 3x3 32, 3x3 32;
  concatenated 96 -> 1x1 conv with bias to 256; x + 0.17 * that, ReLU);
- Mixed_6a (reduction-A: 3x3/2 384 | 1x1 192, 3x3 192, 3x3/2 256 | maxpool 3x3/2) -> 896;
- 10 x Block17 (B: 1x1 128 | 1x1 128, 1x7 128, 7x1 128; 256 -> 896; scale 0.10);
- Mixed_7a (reduction-B: 1x1 256, 3x3/2 384 | 1x1 256, 3x3/2 256 | 1x1 256, 3x3 256, 3x3/2 256 | maxpool) -> 1792;
- 5 x Block8 (C: 1x1 192 | 1x1 192, 1x3 192, 3x1 192; 384 -> 1792; scale 0.20), then `block8` (scale 1, no ReLU);
- global mean, last_linear (1792 -> 512, no bias), last_bn (BatchNorm1d eps 1e-3), L2 normalisation: the FaceNet
  embedding (`final`). The VGGFace2 identity classifier (`logits.*`, 8631 classes) is not built.

Stages returned (NHWC): 'conv2d_4b' (end of the stem), 'repeat_1', 'mixed_6a', 'repeat_2', 'mixed_7a',
'repeat_3', 'block8', and 'embedding' (N, 512). Default layers: ('block8',), the seed's hook.

Preprocessing: the seed gives facenet no transform of its own, so it gets its default one: 224 x 224 bilinear
squash, ImageNet mean/std (not facenet-pytorch's `fixed_image_standardization` of 160 px face crops).
`preprocessing='native'`: 160 x 160 squash, (x - 127.5) / 128.

Weights: a safetensors file of facenet-pytorch's state dict (`conv2d_1a.conv.weight`,
`repeat_1.0.branch1.1.bn.running_var`, `mixed_7a.branch2.2.conv.weight`, `block8.conv2d.bias`, `last_bn.weight`,
...; `logits.*` dropped) at `$VISIM_JAX_WEIGHTS/facenet.safetensors`, written once by `python -m
visim_jax.backbones.convert --backbone=facenet --checkpoint=20180402-114759-vggface2.pt` (prepare_state_dict).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from visim_jax.core import ops
from visim_jax.backbones import weights as weights_lib
from visim_jax.backbones.base import Backbone
from visim_jax.backbones.resnet import preprocess as seed_transform  # the seed's default transform, one copy
from visim_jax.core import pooling
from visim_jax.core.errors import UserError
from visim_jax.data.preprocess import Preprocess

BN_EPS = 1e-3
DEFAULT_LAYERS = ('block8',)
STAGES = ('conv2d_4b', 'repeat_1', 'mixed_6a', 'repeat_2', 'mixed_7a', 'repeat_3', 'block8', 'embedding')
SOURCE = ('FaceNet Inception-ResNet-v1, VGGFace2 (facenet-pytorch InceptionResnetV1(pretrained="vggface2"), '
          '20180402-114759-vggface2.pt)')


@dataclasses.dataclass(frozen=True)
class Arch:
  div: int = 1                      # every channel count divided by this (tiny configs)
  repeats: tuple[int, int, int] = (5, 10, 5)
  image_size: int = 224             # the seed's input size (any size >= 75 px works)
  embedding: int = 512


FULL = Arch()
TINY = Arch(div=8, repeats=(1, 2, 1), image_size=112, embedding=16)  # block8 at 2 x 2


class BasicConv(nn.Module):
  features: int
  kernel: tuple[int, int]
  stride: int = 1
  padding: tuple[int, int] = (0, 0)
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    ph, pw = self.padding
    x = nn.Conv(self.features, self.kernel, (self.stride, self.stride), padding=((ph, ph), (pw, pw)),
                use_bias=False, dtype=self.dtype, name='conv')(x)
    x = nn.BatchNorm(use_running_average=True, epsilon=BN_EPS, dtype=self.dtype, name='bn')(x)
    return nn.relu(x)


def _max_pool(x):
  return pooling.max_pool(x, (3, 3), (2, 2))


class Block35(nn.Module):
  div: int
  scale: float = 0.17
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    c, conv = lambda n: n // self.div, functools.partial(BasicConv, dtype=self.dtype)
    b0 = conv(c(32), (1, 1), name='branch0')(x)
    b1 = conv(c(32), (3, 3), padding=(1, 1), name='branch1_1')(conv(c(32), (1, 1), name='branch1_0')(x))
    b2 = conv(c(32), (1, 1), name='branch2_0')(x)
    b2 = conv(c(32), (3, 3), padding=(1, 1), name='branch2_2')(conv(c(32), (3, 3), padding=(1, 1),
                                                                     name='branch2_1')(b2))
    out = nn.Conv(x.shape[-1], (1, 1), dtype=self.dtype, name='conv2d')(jnp.concatenate([b0, b1, b2], -1))
    return nn.relu(out * self.scale + x)


class Block17(nn.Module):
  div: int
  scale: float = 0.10
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    c, conv = lambda n: n // self.div, functools.partial(BasicConv, dtype=self.dtype)
    b0 = conv(c(128), (1, 1), name='branch0')(x)
    b1 = conv(c(128), (1, 1), name='branch1_0')(x)
    b1 = conv(c(128), (1, 7), padding=(0, 3), name='branch1_1')(b1)
    b1 = conv(c(128), (7, 1), padding=(3, 0), name='branch1_2')(b1)
    out = nn.Conv(x.shape[-1], (1, 1), dtype=self.dtype, name='conv2d')(jnp.concatenate([b0, b1], -1))
    return nn.relu(out * self.scale + x)


class Block8(nn.Module):
  div: int
  scale: float = 0.20
  relu: bool = True
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    c, conv = lambda n: n // self.div, functools.partial(BasicConv, dtype=self.dtype)
    b0 = conv(c(192), (1, 1), name='branch0')(x)
    b1 = conv(c(192), (1, 1), name='branch1_0')(x)
    b1 = conv(c(192), (1, 3), padding=(0, 1), name='branch1_1')(b1)
    b1 = conv(c(192), (3, 1), padding=(1, 0), name='branch1_2')(b1)
    out = nn.Conv(x.shape[-1], (1, 1), dtype=self.dtype, name='conv2d')(jnp.concatenate([b0, b1], -1))
    out = out * self.scale + x
    return nn.relu(out) if self.relu else out


class Mixed6a(nn.Module):
  div: int
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    c, conv = lambda n: n // self.div, functools.partial(BasicConv, dtype=self.dtype)
    b0 = conv(c(384), (3, 3), 2, name='branch0')(x)
    b1 = conv(c(192), (3, 3), padding=(1, 1), name='branch1_1')(conv(c(192), (1, 1), name='branch1_0')(x))
    b1 = conv(c(256), (3, 3), 2, name='branch1_2')(b1)
    return jnp.concatenate([b0, b1, _max_pool(x)], -1)


class Mixed7a(nn.Module):
  div: int
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    c, conv = lambda n: n // self.div, functools.partial(BasicConv, dtype=self.dtype)
    b0 = conv(c(384), (3, 3), 2, name='branch0_1')(conv(c(256), (1, 1), name='branch0_0')(x))
    b1 = conv(c(256), (3, 3), 2, name='branch1_1')(conv(c(256), (1, 1), name='branch1_0')(x))
    b2 = conv(c(256), (3, 3), padding=(1, 1), name='branch2_1')(conv(c(256), (1, 1), name='branch2_0')(x))
    b2 = conv(c(256), (3, 3), 2, name='branch2_2')(b2)
    return jnp.concatenate([b0, b1, b2, _max_pool(x)], -1)


class InceptionResnetV1(nn.Module):
  arch: Arch = FULL
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    a, d = self.arch, self.dtype
    c, conv = lambda n: n // a.div, functools.partial(BasicConv, dtype=d)
    x = conv(c(32), (3, 3), 2, name='conv2d_1a')(x.astype(d))
    x = conv(c(32), (3, 3), name='conv2d_2a')(x)
    x = conv(c(64), (3, 3), padding=(1, 1), name='conv2d_2b')(x)
    x = _max_pool(x)
    x = conv(c(80), (1, 1), name='conv2d_3b')(x)
    x = conv(c(192), (3, 3), name='conv2d_4a')(x)
    x = conv(c(256), (3, 3), 2, name='conv2d_4b')(x)
    stages = {'conv2d_4b': x}
    for i in range(a.repeats[0]):
      x = Block35(a.div, dtype=d, name=f'repeat_1_{i}')(x)
    stages['repeat_1'] = x
    x = stages['mixed_6a'] = Mixed6a(a.div, d, name='mixed_6a')(x)
    for i in range(a.repeats[1]):
      x = Block17(a.div, dtype=d, name=f'repeat_2_{i}')(x)
    stages['repeat_2'] = x
    x = stages['mixed_7a'] = Mixed7a(a.div, d, name='mixed_7a')(x)
    for i in range(a.repeats[2]):
      x = Block8(a.div, dtype=d, name=f'repeat_3_{i}')(x)
    stages['repeat_3'] = x
    x = stages['block8'] = Block8(a.div, 1.0, relu=False, dtype=d, name='block8')(x)
    e = nn.Dense(a.embedding, use_bias=False, dtype=d, name='last_linear')(x.mean(axis=(1, 2)))
    e = nn.BatchNorm(use_running_average=True, epsilon=BN_EPS, dtype=d, name='last_bn')(e)
    e = stages['embedding'] = ops.l2_normalize(e)
    return e, stages


def apply_facenet(arch: Arch, variables, x):
  """Pure (final, stages) on a normalised NHWC batch, computed at x.dtype."""
  return InceptionResnetV1(arch, x.dtype).apply(variables, x)


def apply_facenet_init(arch: Arch, variables, x):
  """The same outputs with variables made by `init` inside (`abstract=True`: shapes only under jax.eval_shape)."""
  del variables
  return InceptionResnetV1(arch, x.dtype).init_with_output(jax.random.PRNGKey(0), x)[0]


def preprocess_for(preprocessing: str = 'seed', size: int = 224) -> Preprocess:
  if preprocessing == 'seed':
    return seed_transform(size)
  if preprocessing == 'native':  # facenet-pytorch fixed_image_standardization on 160 px crops
    return Preprocess(size=160 if size == 224 else size, resize='squash', mean=(127.5,) * 3, std=(128.0,) * 3,
                      interpolation='bilinear')
  raise UserError(f"config.backbone_kwargs.preprocessing: {preprocessing!r} for facenet; expected 'seed' (the seed "
                  "code's default transform) or 'native' (facenet-pytorch's 160 px fixed standardisation)")


# ------------------------------------------------------------------------------------ weights (facenet-pytorch names)

def _module_path(prefix: str) -> tuple[str, ...]:
  """'repeat_1.0.branch1.1.bn' -> repeat_1_0/branch1_1/bn: a numeric part joins the name before it."""
  out: list[str] = []
  for p in prefix.split('.'):
    if p.isdigit() and out:
      out[-1] = f'{out[-1]}_{p}'
    else:
      out.append(p)
  return tuple(out)


def to_flax(sd: dict, where: str = 'weights') -> dict:
  """Stored tensors (facenet-pytorch names) -> flax {'params', 'batch_stats'} (weights.torch_to_flax)."""
  return weights_lib.torch_to_flax(sd, _module_path, where)


def variable_shapes(arch: Arch) -> dict:
  """The flax variable tree's shapes (jax.eval_shape; no weights made)."""
  x = jax.ShapeDtypeStruct((1, arch.image_size, arch.image_size, 3), jnp.float32)
  return jax.eval_shape(lambda x: InceptionResnetV1(arch).init(jax.random.PRNGKey(0), x), x)


def prepare_state_dict(name: str, sd: dict, where: str, tiny: bool = False) -> tuple[dict, dict]:
  """A raw facenet-pytorch checkpoint -> (tensors to store: its names, float32; sidecar info).

  Drops 'module.' prefixes, the VGGFace2 / CASIA identity classifier (`logits.*`) and `num_batches_tracked`;
  fails, naming the file, unless the rest fits the architecture exactly."""
  arch = TINY if tiny else FULL
  out = weights_lib.clean_state_dict(sd, drop=('logits.',))
  weights_lib.check_fits(to_flax(out, where), variable_shapes(arch), name, where)
  return out, {'architecture': dataclasses.asdict(arch)}


def facenet(name: str = 'facenet', weights: str | None = None, random_init: int | None = None, tiny: bool = False,
            layers: str | Sequence[str] | None = None, preprocessing: str = 'seed',
            abstract: bool = False) -> Backbone:
  """`facenet`: converted VGGFace2 weights (offline), `random_init=SEED`, `tiny=True` (random, tiny config), or
  `abstract=True` (no weights: for jax.eval_shape size checks)."""
  arch = TINY if tiny else FULL
  variables, weights_id, where = weights_lib.family_variables(
      name, weights=weights, random_init=random_init, tiny=tiny, abstract=abstract,
      init=InceptionResnetV1(arch).init, image_size=arch.image_size, to_flax=to_flax,
      shapes=lambda: variable_shapes(arch))
  layers = weights_lib.parse_layers(name, layers, DEFAULT_LAYERS, STAGES)
  return Backbone(
      name=name,
      apply_fn=functools.partial(apply_facenet_init if abstract else apply_facenet, arch),
      variables=variables,
      preprocess=preprocess_for(preprocessing, arch.image_size),
      layers=layers,
      weights_id=weights_id,
      labels=None,
      description=f'{SOURCE} [{where}; preprocessing {preprocessing}]',
  )
