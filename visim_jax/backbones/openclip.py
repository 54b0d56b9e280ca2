"""OpenCLIP ViT image towers (LAION-2B weights) on the ViT module of vit.py, converted once from open_clip's state dict.

Architecture (open_clip `src/open_clip/transformer.py` VisionTransformer with the `ViT-B-32`, `ViT-B-16`, `ViT-L-14`
model configs, `model_configs/*.json`): a p x p stride-p patch convolution *without* bias, a class token and learned
position embeddings, `ln_pre` (LayerNorm on the tokens before block 1), L pre-norm residual blocks
(ln_1 -> multi-head attention with a fused qkv `in_proj` + bias -> out_proj; ln_2 -> c_fc -> GELU -> c_proj), exact
erf GELU (open_clip's `nn.GELU`; these laion2b models are not `-quickgelu` ones), LayerNorm eps 1e-5 (open_clip's
LayerNorm default), then `ln_post` on all tokens, the class token (`pool_type='tok'`, `final_ln_after_pool=False`)
and `@ proj` (width x embed_dim): `model.encode_image`. Heads = width / 64.

Members (open_clip `pretrained.py` tags):
- `openclip_vit_b32_laion2b`: ViT-B-32 `laion2b_s34b_b79k` (hf: laion/CLIP-ViT-B-32-laion2B-s34B-b79K), 512-d;
- `openclip_vit_b16_laion2b`: ViT-B-16 `laion2b_s34b_b88k` (laion/CLIP-ViT-B-16-laion2B-s34B-b88K), 512-d;
- `openclip_vit_l14_laion2b`: ViT-L-14 `laion2b_s32b_b82k` (laion/CLIP-ViT-L-14-laion2B-s32B-b82K), 768-d.

Stages (vit.py): 'embeddings' (after ln_pre), 'block1'..'blockL', 'pooled' (ln_post(CLS), width-d), 'patch_mean'
(mean of the ln_post'ed patch tokens: open_clip's pool_type='avg' before the projection), 'projection'
(`encode_image`, embed_dim). Default layers: ('projection',): the embedding the authors' `encode_image` returns
(paper 001 pooled OpenAI CLIP before its projection: `layers='pooled'` gives that reading).

Preprocessing (open_clip `pretrained.py` `_pcfg` + `transform.py` `image_transform`, eval): resize_mode 'shortest'
(shorter side 224, bicubic, torchvision Resize on a PIL image = PIL bicubic) + CenterCrop 224; mean/std OpenAI's
(0.48145466, 0.4578275, 0.40821073) / (0.26862954, 0.26130258, 0.27577711) for B/32 and B/16, Inception's
(0.5, 0.5, 0.5) / (0.5, 0.5, 0.5) for L/14 laion2b_s32b_b82k (its `_pcfg(mean=INCEPTION_MEAN, std=INCEPTION_STD)`).

Weights: the file users download from the hub repo above, `open_clip_pytorch_model.bin` (a torch pickle: read only
through visim_jax.core.safe_pickle) or `open_clip_model.safetensors`, converted once by
`python -m visim_jax.backbones.convert --backbone=NAME --checkpoint=FILE`: the `visual.*` tensors (the text tower is
dropped) renamed to vit.py's layout (`conv1` -> `patch_embed.proj`, `class_embedding` -> `cls_token`,
`positional_embedding` -> `pos_embed`, `transformer.resblocks.N.{ln_1,attn.in_proj_*,attn.out_proj,ln_2,mlp.c_fc,
mlp.c_proj}` -> `blocks.N.{norm1,attn.qkv,attn.proj,norm2,mlp.fc1,mlp.fc2}`, `ln_post` -> `norm`, `proj` kept).
"""
from __future__ import annotations

import dataclasses
import functools
import re
from typing import Sequence

import numpy as np

from visim_jax.backbones import vit
from visim_jax.backbones import weights as weights_lib
from visim_jax.backbones.base import Backbone
from visim_jax.core.errors import UserError
from visim_jax.data.preprocess import Preprocess

OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)
INCEPTION_MEAN = INCEPTION_STD = (0.5, 0.5, 0.5)

_CLIP = dict(ln_eps=1e-5, act='gelu', ln_pre=True, patch_bias=False)
ARCHS = {
    'openclip_vit_b32_laion2b': vit.Arch(32, 768, 12, 12, proj_dim=512, **_CLIP),
    'openclip_vit_b16_laion2b': vit.Arch(16, 768, 12, 12, proj_dim=512, **_CLIP),
    'openclip_vit_l14_laion2b': vit.Arch(14, 1024, 24, 16, proj_dim=768, **_CLIP),
}
SOURCES = {
    'openclip_vit_b32_laion2b': 'OpenCLIP ViT-B-32 laion2b_s34b_b79k (laion/CLIP-ViT-B-32-laion2B-s34B-b79K)',
    'openclip_vit_b16_laion2b': 'OpenCLIP ViT-B-16 laion2b_s34b_b88k (laion/CLIP-ViT-B-16-laion2B-s34B-b88K)',
    'openclip_vit_l14_laion2b': 'OpenCLIP ViT-L-14 laion2b_s32b_b82k (laion/CLIP-ViT-L-14-laion2B-s32B-b82K)',
}
NORMALISATION = {
    'openclip_vit_b32_laion2b': (OPENAI_MEAN, OPENAI_STD),
    'openclip_vit_b16_laion2b': (OPENAI_MEAN, OPENAI_STD),
    'openclip_vit_l14_laion2b': (INCEPTION_MEAN, INCEPTION_STD),
}
TINY = vit.Arch(8, 32, 2, 4, image_size=32, proj_dim=16, **_CLIP)
DEFAULT_LAYERS = ('projection',)

_BLOCK = re.compile(r'^transformer\.resblocks\.(\d+)\.(.+)$')
# open_clip block entry -> vit.py's (timm / DINO) name
_BLOCK_NAMES = {'ln_1.weight': 'norm1.weight', 'ln_1.bias': 'norm1.bias', 'ln_2.weight': 'norm2.weight',
                'ln_2.bias': 'norm2.bias', 'attn.in_proj_weight': 'attn.qkv.weight',
                'attn.in_proj_bias': 'attn.qkv.bias', 'attn.out_proj.weight': 'attn.proj.weight',
                'attn.out_proj.bias': 'attn.proj.bias', 'mlp.c_fc.weight': 'mlp.fc1.weight',
                'mlp.c_fc.bias': 'mlp.fc1.bias', 'mlp.c_proj.weight': 'mlp.fc2.weight', 'mlp.c_proj.bias': 'mlp.fc2.bias'}


def preprocess_for(name: str, size: int = 224) -> Preprocess:
  mean, std = NORMALISATION.get(name, (OPENAI_MEAN, OPENAI_STD))
  return Preprocess(size=size, resize='shorter_crop', resize_to=size, mean=tuple(255.0 * m for m in mean),
                    std=tuple(255.0 * s for s in std), interpolation='bicubic')


def rename_visual(sd: dict, where: str) -> dict:
  """open_clip's image-tower tensors (`visual.*`, text tower and logit_scale dropped) in vit.py's layout, float32;
  an unexpected `visual.*` entry (attentional pooler, layer scale, ...) fails naming it."""
  out = {}
  for key, v in sd.items():
    for prefix in ('module.', 'model.'):
      key = key[len(prefix):] if key.startswith(prefix) else key
    if not key.startswith('visual.'):
      continue
    k = key[len('visual.'):]
    v = np.ascontiguousarray(np.asarray(v, np.float32))
    if k == 'conv1.weight':
      out['patch_embed.proj.weight'] = v
    elif k == 'class_embedding':
      out['cls_token'] = v.reshape(1, 1, -1)
    elif k == 'positional_embedding':
      out['pos_embed'] = v[None]
    elif k in ('ln_pre.weight', 'ln_pre.bias', 'proj'):
      out[k] = v
    elif k in ('ln_post.weight', 'ln_post.bias'):
      out['norm.' + k.split('.')[1]] = v
    else:
      m = _BLOCK.match(k)
      if not m or m.group(2) not in _BLOCK_NAMES:
        raise UserError(f'{where}: unexpected image-tower entry {key} {v.shape}: not an OpenCLIP ViT with a class '
                        'token (attentional pooling, layer scale and other variants are not supported)')
      rest = _BLOCK_NAMES[m.group(2)]
      out[f'blocks.{m.group(1)}.{rest}'] = v
  if not out:
    raise UserError(f'{where}: no `visual.*` tensors: not an open_clip checkpoint (open_clip_pytorch_model.bin or '
                    'open_clip_model.safetensors)')
  return out


def prepare_state_dict(name: str, sd: dict, where: str, tiny: bool = False) -> tuple[dict, dict]:
  """An open_clip checkpoint -> (the image tower in vit.py's layout, sidecar info); checked against NAME's arch."""
  arch = _arch(name, tiny)
  out = rename_visual(sd, where)
  weights_lib.check_fits(vit.to_flax(out, where), vit.variable_shapes(arch), name, where)
  return out, {'architecture': dataclasses.asdict(arch)}


def _arch(name: str, tiny: bool) -> vit.Arch:
  if name not in ARCHS:
    raise UserError(f'config.backbone: {name!r} is not an OpenCLIP ViT; known: {", ".join(ARCHS)}')
  return TINY if tiny else ARCHS[name]


def openclip_backbone(name: str, weights: str | None = None, random_init: int | None = None, tiny: bool = False,
                      layers: str | Sequence[str] | None = None, abstract: bool = False) -> Backbone:
  """A registered OpenCLIP ViT: converted weights (offline), `random_init=SEED`, `tiny=True`, or `abstract=True`."""
  arch = _arch(name, tiny)
  variables, weights_id, where = weights_lib.family_variables(
      name, weights=weights, random_init=random_init, tiny=tiny, abstract=abstract,
      init=vit.VisionTransformer(arch).init, image_size=arch.image_size, to_flax=vit.to_flax,
      shapes=lambda: vit.variable_shapes(arch))
  return Backbone(
      name=name,
      apply_fn=functools.partial(vit.apply_vit_init if abstract else vit.apply_vit, arch),
      variables=variables,
      preprocess=preprocess_for(name, arch.image_size),
      layers=weights_lib.parse_layers(name, layers, DEFAULT_LAYERS, vit.stage_names(arch)),
      weights_id=weights_id,
      labels=None,
      description=f'{SOURCES[name]} [{where}]',
  )
