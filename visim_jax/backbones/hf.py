"""The Hugging Face families: CLIP vision, ViT, DINOv2, ResNet, RegNet, as visim_jax's own Flax modules loading the
hub checkpoints' own files by their keys (no transformers at run time).

Paper 001 (Risser-Maroix et al., Sec. 3 and annex Table 1) pools several layers of residual networks
(the four stage outputs: ResNet-50/101/152 -> 256+512+1024+2048 = 3840 dims) and only the last layer of
transformers ("we only extracted features from one of the last layer in models marked with a *":
ViT, DINO ViT, CLIP ViT-B/32 -> 768 dims, i.e. the width of the final pooled token, before any projection).

Modules (checked against transformers' PyTorch `modeling_clip.py`, `modeling_vit.py`, `modeling_dinov2.py`,
`modeling_resnet.py`, `modeling_regnet.py`, 4.57 and 5.x):
- CLIP vision, ViT and DINOv2 are vit.py's VisionTransformer (pre-norm blocks, fused qkv, final LayerNorm, CLS):
  CLIP with `ln_pre` (pre_layrnorm), a patch convolution without bias, quick_gelu, LayerNorm eps 1e-5, and its
  post_layernorm on the CLS token (= the final norm applied to every token, then the CLS taken); ViT with exact
  GELU and LayerNorm eps 1e-12 (ViTConfig's); DINOv2 with LayerScale (layer_scale1/2.lambda1) and eps 1e-6.
  The architecture fields come from the checkpoint's config.json (read as JSON over the config class's defaults).
- ResNet and RegNet: hf_resnet.py (module names mirroring the checkpoint keys).

Stages returned (`apply_fn(variables, x_nhwc) -> (final, stages)`):
- ViT-like (clip_vit_*, vit_*, dinov2_*): 'embeddings' (tokens entering block 1; CLIP: after pre_layrnorm),
  'block1'..'blockL' (the hidden state after each transformer block, (N, 1 + patches, C); pooled by `features.pool`
  as a token mean, CLS token included), and 'pooled' (N, C): the final CLS token after the model's last LayerNorm
  (CLIP: post_layernorm, the input of the text-image projection; ViT/DINOv2: the final layernorm) = transformers'
  hidden_states[0..L] and pooler_output (ViT: last_hidden_state[:, 0]). `final` = 'pooled'. Default layers:
  ('pooled',), as the paper. Intermediate blocks are selectable by name (`config.layers=['block6', 'block12',
  'pooled']` or `layers=` here). Note: for ViT the HF 'pooler' (dense + tanh, absent from the ImageNet-1k
  classifier checkpoint) is not used.
- ResNet-like (hf_resnet*, regnet_*; the HF microsoft/resnet-* weights are timm-derived, not torchvision's:
  the paper's resnet18..152 are resnet.py's): 'stem' (after the stem max-pool), 'stage1'..'stage4' (NHWC), 'pooled'
  (global average of stage4, (N, C)). `final` = 'pooled'. Default layers: the four stage outputs.

Preprocessing follows each reference image processor: CLIP (CLIPImageProcessor): shorter side 224 bicubic,
centre crop 224, CLIP mean/std; ViT (ViTImageProcessor): squash to 224 bilinear, mean = std = 0.5;
DINOv2 (BitImageProcessor): shorter side 256 bicubic, crop 224, ImageNet mean/std; ResNet/RegNet
(ConvNextImageProcessor, crop_pct 0.875): shorter side 256 bicubic, crop 224, ImageNet mean/std.

DINOv2 (pre-trained at 518 px, 37x37 position embeddings) at 224 px: the PyTorch reference (transformers'
`Dinov2Embeddings.interpolate_pos_encoding`) resizes the position embeddings with
`interpolate(size=(16, 16), mode='bicubic', align_corners=False)` in float32 (cubic a = -0.75); `_dinov2_at_size`
does the same with `torch_bicubic_matrix`, as the transformers-Flax version of this file did.

Weights: a save_pretrained / hub snapshot folder (see weights.py: local folder, HF cache, hub only when allowed)
with config.json and one of flax_model.msgpack (msgpack, no pickle), model.safetensors, pytorch_model.bin (read by
core.safe_pickle's restricted unpickler, no torch), preferred in that order (`state_file`; the weights_id is that
file's sha256, as before). Every format is brought to the PyTorch checkpoint's keys and layouts (`load_state`), the
base model's entries are picked by key (with or without the 'vision_model.' / 'vit.' / 'dinov2.' / 'resnet.' /
'regnet.' prefix of a checkpoint with a head or a text tower) and checked against the config's shapes.
`random_init=SEED` builds the real architecture with random weights (no network); `tiny=True` a tiny config of the
family (tests). The random weights are drawn as the transformers-Flax version drew them (weights.random_variables
over the Flax port's parameter tree, in its order), so 'random:SEED' keeps meaning the same numbers.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from visim_jax.backbones import hf_resnet, vit
from visim_jax.backbones import weights as weights_lib
from visim_jax.backbones.base import Backbone, sha256_file
from visim_jax.backbones.hf_checkpoint import (  # noqa: F401 (hf.load_state etc.: the fetch side's names, hf-api)
    DEFAULTS, PREFIXES, STATE_FILES, VIT_LIKE, checkpoint_keys, convnet_arch, family_config, load_state,
    module_shapes, random_state, read_config, state_file, variables_from_state, vit_arch)
from visim_jax.core.errors import UserError
from visim_jax.data.preprocess import Preprocess

CLIP_MEAN = tuple(255.0 * v for v in (0.48145466, 0.4578275, 0.40821073))
CLIP_STD = tuple(255.0 * v for v in (0.26862954, 0.26130258, 0.27577711))
IMAGENET_MEAN = tuple(255.0 * v for v in (0.485, 0.456, 0.406))
IMAGENET_STD = tuple(255.0 * v for v in (0.229, 0.224, 0.225))

TINY_SIZE = 32


def _preprocess(family: str, size: int = 224) -> Preprocess:
  if family == 'clip':
    return Preprocess(size=size, resize='shorter_crop', resize_to=size, mean=CLIP_MEAN, std=CLIP_STD,
                      interpolation='bicubic')
  if family == 'vit':
    return Preprocess(size=size, resize='squash', mean=(127.5,) * 3, std=(127.5,) * 3, interpolation='bilinear')
  # dinov2, resnet, regnet: shorter side 256/224 * size, centre crop
  return Preprocess(size=size, resize='shorter_crop', resize_to=round(size * 256 / 224), mean=IMAGENET_MEAN,
                    std=IMAGENET_STD, interpolation='bicubic')


@dataclasses.dataclass(frozen=True)
class Spec:
  family: str              # clip | vit | dinov2 | resnet | regnet
  hub_id: str
  config: dict             # the real architecture in config.json fields (random_init; checked against loaded ones)
  description: str


_CLIP_B = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
               image_size=224, hidden_act='quick_gelu', layer_norm_eps=1e-5, projection_dim=512)
_CLIP_L = dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
               image_size=224, patch_size=14, hidden_act='quick_gelu', layer_norm_eps=1e-5, projection_dim=768)
_DINO = dict(image_size=518, patch_size=14, mlp_ratio=4, layerscale_value=1.0, use_swiglu_ffn=False)


def _regnet(depths, widths, group):
  return dict(embedding_size=32, depths=list(depths), hidden_sizes=list(widths), groups_width=group, layer_type='y')


SPECS: dict[str, Spec] = {
    'clip_vit_b32': Spec('clip', 'openai/clip-vit-base-patch32', dict(_CLIP_B, patch_size=32),
                         'CLIP ViT-B/32 image tower (OpenAI, 400M image-text pairs), pooled token 768-d'),
    'clip_vit_b16': Spec('clip', 'openai/clip-vit-base-patch16', dict(_CLIP_B, patch_size=16),
                         'CLIP ViT-B/16 image tower (OpenAI), pooled token 768-d'),
    'clip_vit_l14': Spec('clip', 'openai/clip-vit-large-patch14', _CLIP_L,
                         'CLIP ViT-L/14 image tower (OpenAI), pooled token 1024-d'),
    'vit_b16': Spec('vit', 'google/vit-base-patch16-224', dict(),
                    'ViT-B/16 (ImageNet-21k + 1k), final CLS token 768-d'),
    'vit_l16': Spec('vit', 'google/vit-large-patch16-224',
                    dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16),
                    'ViT-L/16 (ImageNet-21k + 1k), final CLS token 1024-d'),
    'dinov2_s14': Spec('dinov2', 'facebook/dinov2-small',
                       dict(_DINO, hidden_size=384, num_hidden_layers=12, num_attention_heads=6),
                       'DINOv2 ViT-S/14 (self-supervised, LVD-142M), CLS token 384-d'),
    'dinov2_b14': Spec('dinov2', 'facebook/dinov2-base',
                       dict(_DINO, hidden_size=768, num_hidden_layers=12, num_attention_heads=12),
                       'DINOv2 ViT-B/14, CLS token 768-d'),
    'dinov2_l14': Spec('dinov2', 'facebook/dinov2-large',
                       dict(_DINO, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16),
                       'DINOv2 ViT-L/14, CLS token 1024-d'),
    'hf_resnet18': Spec('resnet', 'microsoft/resnet-18',
                     dict(layer_type='basic', hidden_sizes=[64, 128, 256, 512], depths=[2, 2, 2, 2]),
                     'ResNet-18 ImageNet-1k (HF), stages 64+128+256+512'),
    'hf_resnet34': Spec('resnet', 'microsoft/resnet-34',
                     dict(layer_type='basic', hidden_sizes=[64, 128, 256, 512], depths=[3, 4, 6, 3]),
                     'ResNet-34 ImageNet-1k (HF), stages 64+128+256+512'),
    'hf_resnet50': Spec('resnet', 'microsoft/resnet-50', dict(depths=[3, 4, 6, 3]),
                     'ResNet-50 ImageNet-1k (HF), stages 256+512+1024+2048'),
    'hf_resnet101': Spec('resnet', 'microsoft/resnet-101', dict(depths=[3, 4, 23, 3]),
                      'ResNet-101 ImageNet-1k (HF), stages 256+512+1024+2048'),
    'hf_resnet152': Spec('resnet', 'microsoft/resnet-152', dict(depths=[3, 8, 36, 3]),
                      'ResNet-152 ImageNet-1k (HF), stages 256+512+1024+2048'),
    'regnet_y_040': Spec('regnet', 'facebook/regnet-y-040', _regnet((2, 6, 12, 2), (128, 192, 512, 1088), 64),
                         'RegNetY-4.0GF ImageNet-1k (HF)'),
    'regnet_y_080': Spec('regnet', 'facebook/regnet-y-080', _regnet((2, 4, 10, 1), (168, 448, 896, 2016), 56),
                         'RegNetY-8.0GF ImageNet-1k (HF)'),
    'regnet_y_160': Spec('regnet', 'facebook/regnet-y-160', _regnet((2, 4, 11, 1), (224, 448, 1232, 3024), 112),
                         'RegNetY-16GF ImageNet-1k (HF)'),
    'regnet_y_320': Spec('regnet', 'facebook/regnet-y-320', _regnet((2, 5, 12, 1), (232, 696, 1392, 3712), 232),
                         'RegNetY-32GF ImageNet-1k (HF)'),
}

# tiny configs of each family (random weights, TINY_SIZE input) for tests
TINY: dict[str, dict] = {
    'clip': dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 image_size=TINY_SIZE, patch_size=8, hidden_act='quick_gelu', layer_norm_eps=1e-5, projection_dim=16),
    'vit': dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                image_size=TINY_SIZE, patch_size=8),
    # image_size 48 != TINY_SIZE: the position embeddings are interpolated, as for the real model (518 -> 224)
    'dinov2': dict(hidden_size=32, mlp_ratio=2, num_hidden_layers=2, num_attention_heads=4, image_size=48,
                   patch_size=8, layerscale_value=1.0),
    'resnet': dict(embedding_size=8, hidden_sizes=[8, 16, 24, 32], depths=[1, 2, 1, 1], layer_type='bottleneck'),
    'regnet': dict(embedding_size=8, hidden_sizes=[8, 16, 24, 32], depths=[1, 2, 1, 1], groups_width=8,
                   layer_type='y'),
}

# fields that must agree between a loaded config.json and the named architecture
_ARCH_FIELDS = ('hidden_size', 'num_hidden_layers', 'patch_size', 'hidden_sizes', 'depths', 'layer_type')


def _check_arch(name: str, folder: str, want: dict, cfg: dict) -> None:
  for k in _ARCH_FIELDS:
    if k in want and k in cfg and list(np.atleast_1d(cfg[k])) != list(np.atleast_1d(want[k])):
      raise UserError(f'{name}: weights in {folder} are a different architecture: config.json {k}='
                      f'{cfg[k]!r}, {name} expects {want[k]!r}')


# ------------------------------------------------------------------------------------------------- the backbone

def torch_bicubic_matrix(n_in: int, n_out: int, a: float = -0.75, scale_factor: float | None = None) -> np.ndarray:
  """(n_out, n_in) matrix of PyTorch's `interpolate(mode='bicubic', align_corners=False)` along one axis.

  Source coordinate (i + 0.5) * n_in / n_out - 0.5 (not clamped), Keys cubic kernel with a = -0.75, border
  indices clamped: what DINOv2's reference resizes its 37x37 position embeddings with. With `scale_factor` (torch's
  `interpolate(scale_factor=s)`, recompute_scale_factor unset: the torch hub DINOv2's (g + 0.1) / 37) the source
  coordinate is (i + 0.5) / s - 0.5.
  """
  m = np.zeros((n_out, n_in))
  ratio = n_in / n_out if scale_factor is None else 1.0 / scale_factor
  for i in range(n_out):
    src = (i + 0.5) * ratio - 0.5
    x0 = int(np.floor(src))
    t = src - x0
    w = [((a * (t + 1) - 5 * a) * (t + 1) + 8 * a) * (t + 1) - 4 * a,
         ((a + 2) * t - (a + 3)) * t * t + 1,
         ((a + 2) * (1 - t) - (a + 3)) * (1 - t) * (1 - t) + 1,
         ((a * (2 - t) - 5 * a) * (2 - t) + 8 * a) * (2 - t) - 4 * a]
    for k in range(4):
      m[i, min(max(x0 - 1 + k, 0), n_in - 1)] += w[k]
  return m


def _dinov2_at_size(arch: vit.Arch, variables, size: int):
  """DINOv2 at an input grid other than its pre-training one (518 -> 224): the position embeddings resized the way
  the PyTorch reference does (float32, torch_bicubic_matrix), and the Arch of that grid."""
  pe = variables['params']['pos_embed']
  n = int(round(np.sqrt(pe.shape[1] - 1)))
  g = size // arch.patch
  if g == n:
    return arch, variables
  m = jnp.asarray(torch_bicubic_matrix(n, g), jnp.float32)
  grid = pe[0, 1:].reshape(n, n, -1).astype(jnp.float32)
  grid = jnp.einsum('ia,jb,abc->ijc', m, m, grid, precision=jax.lax.Precision.HIGHEST).reshape(g * g, -1)
  new_pe = jnp.concatenate([pe[0, :1].astype(jnp.float32), grid])[None].astype(pe.dtype)
  params = dict(variables['params'], pos_embed=new_pe)
  return dataclasses.replace(arch, image_size=g * arch.patch), dict(variables, params=params)


def apply_vit_like(family: str, arch: vit.Arch, variables, x):
  """Pure (final, stages) of CLIP vision / ViT / DINOv2 on a normalised NHWC batch, computed at x.dtype."""
  if family == 'dinov2':
    if x.shape[1] != x.shape[2]:
      raise UserError(f'dinov2: square inputs only, got {x.shape}')
    arch, variables = _dinov2_at_size(arch, variables, x.shape[1])
  final, stages = vit.apply_vit(arch, variables, x)
  return final, {k: v for k, v in stages.items() if k in ('embeddings', 'pooled') or k.startswith('block')}


def apply_convnet(arch: hf_resnet.Arch, variables, x):
  """Pure (final, stages) of HF ResNet / RegNet on a normalised NHWC batch, computed at x.dtype."""
  return hf_resnet.ConvNet(arch, x.dtype).apply(variables, x)


def _default_layers(family: str) -> tuple[str, ...]:
  return ('pooled',) if family in VIT_LIKE else ('stage1', 'stage2', 'stage3', 'stage4')


def _parse_layers(layers) -> tuple[str, ...] | None:
  if layers is None:
    return None
  if isinstance(layers, str):
    layers = [l.strip() for l in layers.split(',') if l.strip()]
  return tuple(layers)


def _image_size(family: str, cfg: dict, tiny: bool) -> int:
  """The input size: the position-embedding grid of CLIP/ViT (224 for the registered models), else 224."""
  if family in ('clip', 'vit'):
    return int(cfg['image_size'])
  return TINY_SIZE if tiny else 224


def _apply_fn(family: str, cfg: dict):
  if family in VIT_LIKE:
    return functools.partial(apply_vit_like, family, vit_arch(family, cfg))
  return functools.partial(apply_convnet, convnet_arch(family, cfg))


def _load_pretrained(name: str, want: dict, folder: str, family: str):
  path = state_file(folder)
  cfg = read_config(folder, family, name)
  _check_arch(name, folder, want, cfg)
  variables = variables_from_state(family, cfg, load_state(path), f'{name}: {path}')
  return cfg, variables, sha256_file(path)


def hf_backbone(name: str, weights: str | None = None, random_init: int | None = None, tiny: bool = False,
                layers: str | Sequence[str] | None = None) -> Backbone:
  """A registered HF backbone: pretrained (offline-first), `random_init=SEED`, or `tiny=True` (random)."""
  if name not in SPECS:
    raise UserError(f'unknown HF backbone {name!r}; known: {", ".join(sorted(SPECS))}')
  spec = SPECS[name]
  if weights is not None and random_init is not None:
    raise UserError(f'{name}: weights= and random_init= are exclusive')
  want = TINY[spec.family] if tiny else spec.config
  if weights is None and (tiny or random_init is not None):
    seed = 0 if random_init is None else int(random_init)
    cfg = family_config(spec.family, want)
    sd = random_state(spec.family, cfg, seed)
    variables = (module_shapes(spec.family, cfg) if sd is None else
                 variables_from_state(spec.family, cfg, sd, f'{name}: random weights'))
    weights_id = f'random:{seed}' + (':tiny' if tiny else '')
    description = f'{spec.description} [random weights, seed {seed}{", tiny config" if tiny else ""}]'
  else:  # tiny=True with weights=: a tiny-config folder (tests)
    folder = weights_lib.resolve_hf_folder(name, spec.hub_id, weights)
    cfg, variables, weights_id = _load_pretrained(name, want, folder, spec.family)
    description = f'{spec.description} [{folder}]'
  size = _image_size(spec.family, cfg, tiny)
  backbone = Backbone(
      name=name,
      apply_fn=_apply_fn(spec.family, cfg),
      variables=variables,
      preprocess=_preprocess(spec.family, size),
      layers=_parse_layers(layers) or _default_layers(spec.family),
      weights_id=weights_id,
      labels=None,
      description=description,
  )
  if layers is not None:
    unknown = set(backbone.layers) - set(backbone.stage_names())
    if unknown:
      raise UserError(f'{name}: layers={sorted(unknown)} unknown; stages: {", ".join(backbone.stage_names())}')
  return backbone
