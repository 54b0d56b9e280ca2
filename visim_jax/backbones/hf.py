"""The Hugging Face Flax families (transformers 4.57): CLIP vision, ViT, DINOv2, ResNet, RegNet.

Paper 001 (Risser-Maroix et al., Sec. 3 and annex Table 1) pools several layers of residual networks
(the four stage outputs: ResNet-50/101/152 -> 256+512+1024+2048 = 3840 dims) and only the last layer of
transformers ("we only extracted features from one of the last layer in models marked with a *":
ViT, DINO ViT, CLIP ViT-B/32 -> 768 dims, i.e. the width of the final pooled token, before any projection).

Stages returned (`apply_fn(variables, x_nhwc) -> (final, stages)`):
- ViT-like (clip_vit_*, vit_*, dinov2_*): 'embeddings' (tokens entering block 1), 'block1'..'blockL' (the
  hidden state after each transformer block, (N, 1 + patches, C); pooled by `features.pool` as a token mean,
  CLS token included), and 'pooled' (N, C): the final CLS token after the model's last LayerNorm
  (CLIP: post_layernorm, the input of the text-image projection; ViT/DINOv2: the final layernorm).
  `final` = 'pooled'. Default layers: ('pooled',), as the paper. Intermediate blocks are selectable by name
  (`config.layers=['block6', 'block12', 'pooled']` or `layers=` here).
  Note: for ViT the HF 'pooler' (dense + tanh, untrained in the ImageNet-1k classifier checkpoint) is not used.
- ResNet-like (hf_resnet*, regnet_*; the HF microsoft/resnet-* weights are timm-derived, not torchvision's:
  the paper's resnet18..152 are resnet.py's): 'stem' (after the stem max-pool), 'stage1'..'stage4' (NHWC), 'pooled' (global
  average of stage4, (N, C)). `final` = 'pooled'. Default layers: the four stage outputs.

Preprocessing follows each reference image processor: CLIP (CLIPImageProcessor): shorter side 224 bicubic,
centre crop 224, CLIP mean/std; ViT (ViTImageProcessor): squash to 224 bilinear, mean = std = 0.5;
DINOv2 (BitImageProcessor): shorter side 256 bicubic, crop 224, ImageNet mean/std; ResNet/RegNet
(ConvNextImageProcessor, crop_pct 0.875): shorter side 256 bicubic, crop 224, ImageNet mean/std.

DINOv2 (pre-trained at 518 px, 37x37 position embeddings) at 224 px: the PyTorch reference resizes the position
embeddings with `interpolate(size=(16, 16), mode='bicubic', align_corners=False)` (cubic a = -0.75); transformers'
Flax port uses a different kernel and scale (outputs differ by ~1e-2), so `_dinov2_at_size` resizes them the
reference way (`torch_bicubic_matrix`) and hands the module a config of the input size.

The transformers Flax modules take NHWC inside (their public __call__ transposes NCHW pixel_values); here the
module's `apply` is wrapped in a pure function with output_hidden_states=True, run at the dtype of the input
(bfloat16 inputs build a bfloat16 module, so the matmuls run in bf16), and the ResNet hidden states (which the
modules hand back NCHW) are transposed to NHWC.

Weights: see weights.py (local folder, HF cache, hub only when allowed). `random_init=SEED` builds the real
architecture with random weights (no network); `tiny=True` a tiny config of the family (tests).
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import os
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from visim_jax.backbones import weights as weights_lib
from visim_jax.backbones.base import Backbone, sha256_file
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
  config: dict             # the real architecture (used for random_init and to check loaded weights)
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

VIT_LIKE = ('clip', 'vit', 'dinov2')
# fields that must agree between a loaded config.json and the named architecture
_ARCH_FIELDS = ('hidden_size', 'num_hidden_layers', 'patch_size', 'hidden_sizes', 'depths', 'layer_type')


def _classes(family: str):
  import transformers  # pylint: disable=g-import-not-at-top
  return {
      'clip': (transformers.CLIPVisionConfig, transformers.FlaxCLIPVisionModel, {}),
      'vit': (transformers.ViTConfig, transformers.FlaxViTModel, {'add_pooling_layer': False}),
      'dinov2': (transformers.Dinov2Config, transformers.FlaxDinov2Model, {}),
      'resnet': (transformers.ResNetConfig, transformers.FlaxResNetModel, {}),
      'regnet': (transformers.RegNetConfig, transformers.FlaxRegNetModel, {}),
  }[family]


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


def _dinov2_at_size(arch, variables, size: int):
  """DINOv2 at an input grid other than its pre-training one (518 -> 224): the position embeddings resized the
  way the PyTorch reference does (transformers' Flax port resizes differently), and an architecture of that size."""
  pe = variables['params']['embeddings']['position_embeddings']
  n = int(round(np.sqrt(pe.shape[1] - 1)))
  g = size // arch.patch_size
  if g == n:
    return arch, variables
  m = jnp.asarray(torch_bicubic_matrix(n, g), jnp.float32)
  grid = pe[0, 1:].reshape(n, n, -1).astype(jnp.float32)
  grid = jnp.einsum('ia,jb,abc->ijc', m, m, grid, precision=jax.lax.Precision.HIGHEST).reshape(g * g, -1)
  new_pe = jnp.concatenate([pe[0, :1].astype(jnp.float32), grid])[None].astype(pe.dtype)
  params = dict(variables['params'])
  params['embeddings'] = dict(params['embeddings'], position_embeddings=new_pe)
  arch = copy.deepcopy(arch)
  arch.image_size = g * arch.patch_size
  return arch, dict(variables, params=params)


def apply_hf(module_class, module_kwargs: dict, arch, family: str, variables, x):
  """Pure (final, stages) of a transformers Flax module on a normalised NHWC batch, computed at x.dtype."""
  if family == 'dinov2':
    if x.shape[1] != x.shape[2]:
      raise UserError(f'dinov2: square inputs only, got {x.shape}')
    arch, variables = _dinov2_at_size(arch, variables, x.shape[1])
  module = module_class(config=arch, dtype=x.dtype, **module_kwargs)
  out = module.apply(variables, x, deterministic=True, output_hidden_states=True, return_dict=True)
  hs = out.hidden_states
  stages = {}
  if family in VIT_LIKE:
    stages['embeddings'] = hs[0]
    for i, h in enumerate(hs[1:]):
      stages[f'block{i + 1}'] = h
    pooled = out.last_hidden_state[:, 0] if family == 'vit' else out.pooler_output
  else:
    stages['stem'] = jnp.transpose(hs[0], (0, 2, 3, 1))
    for i, h in enumerate(hs[1:]):
      stages[f'stage{i + 1}'] = jnp.transpose(h, (0, 2, 3, 1))
    pooled = out.pooler_output.reshape(out.pooler_output.shape[:2])
  stages['pooled'] = pooled
  return pooled, stages


def _default_layers(family: str) -> tuple[str, ...]:
  return ('pooled',) if family in VIT_LIKE else ('stage1', 'stage2', 'stage3', 'stage4')


def _parse_layers(layers) -> tuple[str, ...] | None:
  if layers is None:
    return None
  if isinstance(layers, str):
    layers = [l.strip() for l in layers.split(',') if l.strip()]
  return tuple(layers)


def _random_variables(module, size: int, seed: int):
  x = jnp.zeros((1, size, size, 3), jnp.float32)
  return weights_lib.random_variables(lambda key: module.init({'params': key}, x, deterministic=True), seed)


def _check_arch(name: str, folder: str, want: dict, arch) -> None:
  for k in _ARCH_FIELDS:
    if k in want and hasattr(arch, k) and list(np.atleast_1d(getattr(arch, k))) != list(np.atleast_1d(want[k])):
      raise UserError(f'{name}: weights in {folder} are a different architecture: config.json {k}='
                       f'{getattr(arch, k)!r}, {name} expects {want[k]!r}')


def _image_size(family: str, arch, tiny: bool) -> int:
  """The input size: the position-embedding grid of CLIP/ViT (224 for the registered models), else 224."""
  if family in ('clip', 'vit'):
    return int(arch.image_size)
  return TINY_SIZE if tiny else 224


def read_hf_state(path: str, model_cls, shapes: dict) -> dict:
  """{collection: tree} from flax_model.msgpack (msgpack, no pickle) or model.safetensors (PyTorch layout, converted
  by transformers' PyTorch->Flax renaming, without torch). `shapes` is the eval_shape of the module's init."""
  if path.endswith('.msgpack'):
    from flax import serialization  # pylint: disable=g-import-not-at-top
    with open(path, 'rb') as f:
      data = f.read()
    try:
      state = serialization.msgpack_restore(data)
    except Exception as e:  # noqa: BLE001: truncated / not msgpack
      raise UserError(f'{path}: not a readable flax msgpack file ({type(e).__name__}: '
                      f'{" ".join(str(e).split())[:120]}); download it again') from None
  else:
    import types  # pylint: disable=g-import-not-at-top
    from transformers.modeling_flax_pytorch_utils import convert_pytorch_state_dict_to_flax  # pylint: disable=g-import-not-at-top
    shim = types.SimpleNamespace(base_model_prefix=model_cls.base_model_prefix,
                                 params=shapes if 'batch_stats' in shapes else shapes['params'])
    from visim_jax.core import readers  # pylint: disable=g-import-not-at-top
    state = convert_pytorch_state_dict_to_flax(readers.read_safetensors(path), shim)
  state = dict(state)
  return state if 'params' in state else {'params': state}


def select_variables(state: dict, shapes: dict, prefix: str, where: str) -> dict:
  """The variables `shapes` asks for, taken from `state` with or without the base-model prefix (a checkpoint of
  a model with a head, or of a two-tower CLIP, holds more); missing or mis-shaped entries fail naming `where`."""
  from flax.traverse_util import flatten_dict, unflatten_dict  # pylint: disable=g-import-not-at-top
  have = flatten_dict(state)
  out, missing, wrong = {}, [], []
  for key, sd in flatten_dict(shapes).items():
    col, rest = key[0], key[1:]
    candidates = [key, (col, prefix) + rest] + ([(col,) + rest[1:]] if rest and rest[0] == prefix else [])
    found = next((c for c in candidates if c in have), None)
    if found is None:
      missing.append('/'.join(key))
      continue
    value = np.asarray(have[found])
    if value.shape != tuple(sd.shape):
      wrong.append(f'{"/".join(key)} {value.shape} != {tuple(sd.shape)}')
      continue
    out[key] = value.astype(np.float32) if np.issubdtype(value.dtype, np.floating) else value
  if missing or wrong:
    raise UserError(f'{where}: weights do not fit the architecture ({len(missing)} missing, e.g. {missing[:3]}; '
                     f'{len(wrong)} of a wrong shape, e.g. {wrong[:3]})')
  return unflatten_dict(out)


def _load_pretrained(name: str, want: dict, folder: str, family: str):
  from visim_jax.core import readers  # pylint: disable=g-import-not-at-top
  path = weights_lib.hf_weight_file(folder, name)
  readers.read_json(os.path.join(folder, 'config.json'), dict, 'config.json')  # bad bytes / a list: one line
  config_cls, model_cls, module_kwargs = _classes(family)
  try:
    config = config_cls.from_pretrained(folder, local_files_only=True)
  except Exception as e:  # noqa: BLE001: transformers' own refusal of a config it cannot read
    raise UserError(f'{os.path.join(folder, "config.json")}: transformers cannot read it as a {config_cls.__name__} '
                    f'({type(e).__name__}: {" ".join(str(e).split())[:160]})') from None
  _check_arch(name, folder, want, config)
  module = model_cls.module_class(config=config, **module_kwargs)
  size = _image_size(family, config, tiny=False)
  x = jax.ShapeDtypeStruct((1, size, size, 3), jnp.float32)
  shapes = dict(jax.eval_shape(lambda x: module.init({'params': jax.random.PRNGKey(0)}, x, deterministic=True), x))
  state = read_hf_state(path, model_cls, shapes)
  variables = select_variables(state, shapes, model_cls.base_model_prefix, f'{name}: {path}')
  return config, variables, sha256_file(path)


def hf_backbone(name: str, weights: str | None = None, random_init: int | None = None, tiny: bool = False,
                layers: str | Sequence[str] | None = None) -> Backbone:
  """A registered HF Flax backbone: pretrained (offline-first), `random_init=SEED`, or `tiny=True` (random)."""
  if name not in SPECS:
    raise UserError(f'unknown HF backbone {name!r}; known: {", ".join(sorted(SPECS))}')
  spec = SPECS[name]
  config_cls, model_cls, module_kwargs = _classes(spec.family)
  if weights is not None and random_init is not None:
    raise UserError(f'{name}: weights= and random_init= are exclusive')
  want = TINY[spec.family] if tiny else spec.config
  if weights is None and (tiny or random_init is not None):
    seed = 0 if random_init is None else int(random_init)
    config = config_cls(**want)
    module = model_cls.module_class(config=config, **module_kwargs)
    variables = _random_variables(module, _image_size(spec.family, config, tiny), seed)
    weights_id = f'random:{seed}' + (':tiny' if tiny else '')
    description = f'{spec.description} [random weights, seed {seed}{", tiny config" if tiny else ""}]'
  else:  # tiny=True with weights=: a tiny-config folder (tests)
    folder = weights_lib.resolve_hf_folder(name, spec.hub_id, weights)
    config, variables, weights_id = _load_pretrained(name, want, folder, spec.family)
    description = f'{spec.description} [{folder}]'
  size = _image_size(spec.family, config, tiny)
  backbone = Backbone(
      name=name,
      apply_fn=functools.partial(apply_hf, model_cls.module_class, module_kwargs, config, spec.family),
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

