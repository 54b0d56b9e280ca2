"""The backbone fields every experiment config shares, and what the experiments build from them.

Config fields (added by `add_fields`): backbone (a registry name), backbone_kwargs.{weights, random_init,
tiny} ('' / -1 / False mean 'not set'), layers (comma-separated stage names; '' = the backbone's default),
image_batch_size, dtype ('float32' | 'bfloat16': the backbone's compute dtype), cache_dir ('' =
~/.cache/visim_jax/features).
"""
from __future__ import annotations

import os
from typing import Sequence

import ml_collections
import numpy as np

from visim_jax.backbones.base import Backbone


def add_fields(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  c.backbone = 'efficientnet_lite0'
  c.backbone_kwargs = ml_collections.ConfigDict({'weights': '', 'random_init': -1, 'tiny': False})
  c.layers = ''
  c.image_batch_size = 32
  c.dtype = 'float32'
  c.cache_dir = ''
  return c


def kwargs(config) -> dict:
  """The options of config.backbone_kwargs that are set: not every backbone factory takes every option."""
  out = {}
  for k, v in config.backbone_kwargs.items():
    if v is None or v == '' or (isinstance(v, bool) and not v) or (k == 'random_init' and v < 0):
      continue
    out[k] = v
  return out


def cache_dir(config) -> str:
  return config.cache_dir or os.path.join(os.path.expanduser('~'), '.cache', 'visim_jax', 'features')


def build(config) -> tuple[Backbone, tuple[str, ...]]:
  """(backbone, pooled layers); unknown names fail here, naming the field, before any extraction."""
  from visim_jax import features
  from visim_jax.backbones.registry import get_backbone  # deferred: transformers is heavy
  if config.dtype not in ('float32', 'bfloat16'):
    raise ValueError(f"config.dtype: 'float32' or 'bfloat16', got {config.dtype!r}")
  if config.image_batch_size < 1:
    raise ValueError(f'config.image_batch_size: must be >= 1, got {config.image_batch_size}')
  backbone = get_backbone(config.backbone, **kwargs(config))
  layers = tuple(l.strip() for l in config.layers.split(',') if l.strip()) or tuple(backbone.layers)
  features.layer_dims(backbone, layers)
  return backbone, layers


def describe(backbone: Backbone, layers: Sequence[str]) -> dict:
  return {'backbone': backbone.name, 'weights_sha256': backbone.weights_id, 'layers': list(layers),
          'image_size': backbone.preprocess.size, 'preprocessing': backbone.preprocess.describe()}


def features_of(config, backbone: Backbone, layers: Sequence[str], paths: Sequence[str],
                names: Sequence[str] | None = None, tag: str = 'images', flip: bool = False,
                progress: bool = True) -> np.ndarray:
  """Pooled features of `paths` through the feature cache, with the config's batch size, dtype and cache."""
  from visim_jax import features
  return features.cached_features(backbone, paths, cache_dir(config), layers=layers, names=names, tag=tag,
                                  batch_size=config.image_batch_size, dtype=config.dtype, progress=progress,
                                  flip=flip)
