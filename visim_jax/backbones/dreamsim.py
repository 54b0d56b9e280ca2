"""DreamSim (Fu et al. 2023, "DreamSim: Learning New Dimensions of Human Visual Similarity using Synthetic Data")
as backbones: the released LoRA adapters merged into the base towers once, at conversion.

What DreamSim's code does (ssundaram21/dreamsim v0.2.x: `dreamsim/model.py`, `config.py`,
`feature_extraction/extractor.py`, `vision_transformer.py`, `load_clip_as_dino.py`, `load_open_clip_as_dino.py`,
`load_synclr_as_dino.py`), and what is built here:
- every branch is a DINO-layout ViT (vit.py's module): DINO ViT-B/16 (torch hub `dino_vitb16`: exact GELU, LayerNorm
  eps 1e-6); CLIP / OpenCLIP ViTs re-saved by the authors in that layout ("load_clip_as_dino": `pos_drop` replaced
  by a LayerNorm = CLIP's ln_pre, every LayerNorm eps 1e-5, QuickGELU for OpenAI CLIP, exact GELU for OpenCLIP, the
  patch convolution with the bias their files hold, `proj` kept apart); SynCLR ViT-B/16 (DINO's vit_base, GELU,
  eps 1e-6);
- feature per branch (`feat_type` of `dreamsim_args`): 'cls' = the CLS token of the output of block 12 (the
  `extract_descriptors(img, layer=11)` hook on `blocks[11]`: *before* the final LayerNorm), for DINO and SynCLR;
  'embedding' = `model(x) @ proj` = ln_post(CLS) @ proj (the CLIP image embedding, not normalised), for CLIP and
  OpenCLIP;
- the branch features concatenated in `model_type` order, the MLP an identity (LoRA models), then
  `normalize_embedding` (normalize_embeds=True, the `dreamsim()` default): minus their mean over the feature axis,
  divided by their L2 norm: stage 'embedding' (the default layer; ensemble 768 + 512 + 512 = 1792-d);
- distance: `1 - F.cosine_similarity(embed_a, embed_b)`. 'embedding' has unit norm, so the cosine similarity of two
  pooled feature vectors (features.pool L2-normalises again, a no-op) is exactly 1 - DreamSim's distance: the
  `cosine` metric on `layers=('embedding',)` ranks as DreamSim does;
- preprocessing (`dreamsim()`'s `preprocess`): PIL Resize((224, 224), BICUBIC) (a squash, no crop), ToTensor
  ([0, 1]), then per branch `transforms.Normalize`: ImageNet mean/std for DINO and SynCLR, OpenAI CLIP mean/std for
  CLIP and OpenCLIP. Here the host squashes to 224 with PIL bicubic, the device divides by 255 and each branch
  normalises with its own mean/std inside `apply_fn`;
- LoRA (peft, `LoraConfig(r, lora_alpha, lora_dropout, bias, target_modules)` read from the adapter's
  `adapter_config.json`; DreamSim trains `target_modules=['qkv']`: the fused qkv Linear of every block of every
  branch): at eval `qkv(x) = W x + b + scale * B (A x)`, scale = lora_alpha / r (peft's `scaling`;
  lora_alpha / sqrt(r) when `use_rslora`), so the merged weight is W + scale * B A (bias unchanged; dropout is off at
  eval). Anything else in an adapter (other target modules, `use_dora`, `fan_in_fan_out`, trained biases,
  `modules_to_save`, rank/alpha patterns) is refused, naming the file and field.

Members (the `dreamsim_type`s of `dreamsim()` whose feature is the CLS/embedding: README's ensemble and its
single-branch models): `dreamsim_ensemble` (dino_vitb16 cls + clip_vitb16 embedding + open_clip_vitb16 embedding,
1792-d), `dreamsim_dino_vitb16` (768), `dreamsim_clip_vitb32` (512), `dreamsim_open_clip_vitb32` (512),
`dreamsim_synclr_vitb16` (768), `dreamsim_dinov2_vitb14` (768: the torch hub DINOv2 ViT-B/14, LayerScale, its
37 x 37 position embeddings resized to 16 x 16 at conversion exactly as its `interpolate_pos_encoding` does at every
224 px forward), and the `use_patch_model=True` models `dreamsim_dino_vitb16_patch`, `dreamsim_dinov2_vitb14_patch`
(feat_type 'cls_patch': `embed` = every token of block 12 normalised per token (`normalize_embedding_patch`),
`forward` = 1 - cosine of cat(CLS, mean of the patch tokens): 'embedding' is that concatenation, 1536-d, not of unit
norm; its cosine is still 1 - DreamSim's distance).

DreamSim's starting points (no LoRA: what `training/train.py` builds before `get_peft_model`, its members as
`ViTExtractor.create_model` picks them from `--load_dir`): `dreamsim_ensemble_pretrained` (configs/
train_ensemble_model_lora.yaml: torch hub `dino_vitb16` + `clip_vitb16_pretrain.pth.tar` (OpenAI CLIP ViT-B/16) +
`open_clip_vitb16_pretrain.pth.tar` (OpenCLIP ViT-B/16, `laion400m_e31` in load_open_clip_as_dino.py's sanity
check): the authors' DINO-layout files that dreamsim_ensemble_checkpoint.zip holds beside `ensemble_lora/`) and
`dreamsim_dino_vitb16_pretrained` (train_single_model_lora.yaml: torch hub `dino_vitb16`). Same taps, per-branch
Normalize and preprocessing as above; default stage 'concat' (PerceptualModel(normalize_embeds=False): what
DreamSim's training loss and eval_percep.py compare, 1 - cosine of the concatenation, not centred).

Stages: 'embedding' (default), 'concat' (the branch features concatenated, before the normalisation), per branch
KEY in ('dino', 'clip', 'open_clip', 'synclr', 'dinov2'): 'KEY' (its DreamSim feature), 'KEY_pooled' (CLS after the final
LayerNorm), 'KEY_patch_mean' (mean of the patch tokens after the final LayerNorm), 'KEY_tokens' (the last block's
tokens, (N, 1 + P, C)). Pooling several stages L2-normalises each one apart (features.pool): that is not DreamSim's
embedding; use 'embedding' for DreamSim's numbers.

Weights: `python -m visim_jax.backbones.convert --backbone=NAME --checkpoint=FOLDER`, FOLDER = DreamSim's
`cache_dir` as `dreamsim(pretrained=True, cache_dir=FOLDER)` leaves it (or the unzipped release checkpoint zip +
the torch-hub DINO file): `<tag>_lora/adapter_config.json` + `<tag>_lora/adapter_model.safetensors` (or `.bin`),
the base files of `BASE_FILES`, read as safetensors or through visim_jax.core.safe_pickle (never unpickled by torch).
Writes one safetensors (branch-prefixed vit.py names, LoRA merged) + the sha256 sidecar listing every input's sha256.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import re
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from visim_jax.backbones import vit
from visim_jax.backbones import weights as weights_lib
from visim_jax.core import readers
from visim_jax.backbones.base import Backbone, sha256_file
from visim_jax.data import resolve
from visim_jax.core.errors import UserError
from visim_jax.data.preprocess import Preprocess

IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
OPENAI_CLIP = ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711))

_CLIP_LAYOUT = dict(ln_eps=1e-5, ln_pre=True, patch_bias=True, proj_dim=512)
_TINY_CLIP = dict(ln_eps=1e-5, ln_pre=True, patch_bias=True, proj_dim=16, image_size=32)


@dataclasses.dataclass(frozen=True)
class Branch:
  key: str              # stage prefix and tensor-name prefix: dino | clip | open_clip | synclr | dinov2
  model_type: str       # DreamSim's model_type
  arch: vit.Arch
  tiny: vit.Arch
  feat: str             # 'cls' (CLS of the last block, before the final LayerNorm) | 'embedding' (ln_post(CLS) @ proj)
                        # | 'cls_patch' (all tokens of the last block; single-branch models only)
  norm: tuple           # (mean, std) on the [0, 1] scale
  # torch hub DINOv2: position embeddings stored for 518 px (37 x 37) and resized at every forward by
  # `interpolate_pos_encoding` (bicubic, scale_factor (g + offset) / 37, offset 0.1); done once here, at conversion
  pos_offset: float | None = None


def _dino(model_type='dino_vitb16', key='dino', feat='cls'):
  return Branch(key, model_type, vit.Arch(16, 768, 12, 12), vit.TINY, feat, IMAGENET)


def _clip(patch, open_clip=False):
  act = 'gelu' if open_clip else 'quick_gelu'
  return Branch('open_clip' if open_clip else 'clip', f'{"open_clip" if open_clip else "clip"}_vitb{patch}',
                vit.Arch(patch, 768, 12, 12, act=act, **_CLIP_LAYOUT), vit.Arch(8, 32, 2, 4, act=act, **_TINY_CLIP),
                'embedding', OPENAI_CLIP)


def _dinov2(feat='cls'):
  return Branch('dinov2', 'dinov2_vitb14', vit.Arch(14, 768, 12, 12, layer_scale=True),
                vit.Arch(8, 32, 2, 4, image_size=32, layer_scale=True), feat, IMAGENET, pos_offset=0.1)


# name -> (adapter folder tag, branches in DreamSim's model_type order); tag None: no adapter (the un-tuned members)
MODELS: dict[str, tuple[str | None, tuple[Branch, ...]]] = {
    'dreamsim_ensemble': ('ensemble', (_dino(), _clip(16), _clip(16, open_clip=True))),
    'dreamsim_dino_vitb16': ('dino_vitb16_single', (_dino(),)),
    'dreamsim_clip_vitb32': ('clip_vitb32_single', (_clip(32),)),
    'dreamsim_open_clip_vitb32': ('open_clip_vitb32_single', (_clip(32, open_clip=True),)),
    'dreamsim_synclr_vitb16': ('synclr_vitb16_single', (_dino('synclr_vitb16', 'synclr'),)),
    'dreamsim_dinov2_vitb14': ('dinov2_vitb14_single', (_dinov2(),)),
    # use_patch_model=True: trained through CLS and patch features (feat_type 'cls_patch')
    'dreamsim_dino_vitb16_patch': ('dino_vitb16_patch', (_dino(feat='cls_patch'),)),
    'dreamsim_dinov2_vitb14_patch': ('dinov2_vitb14_patch', (_dinov2('cls_patch'),)),
    # DreamSim's starting points (training/train.py: PerceptualModel over ViTExtractor's pretrained members, before
    # get_peft_model): configs/train_ensemble_model_lora.yaml's and train_single_model_lora.yaml's towers, no LoRA
    'dreamsim_ensemble_pretrained': (None, (_dino(), _clip(16), _clip(16, open_clip=True))),
    'dreamsim_dino_vitb16_pretrained': (None, (_dino(),)),
}
# DreamSim model_type -> the base file(s) its loader reads, relative to the cache_dir (first found is used)
BASE_FILES = {
    'dino_vitb16': ('checkpoints/dino_vitbase16_pretrain.pth', 'dino_vitbase16_pretrain.pth'),  # torch hub's file
    'clip_vitb16': ('clip_vitb16_pretrain.pth.tar',),
    'clip_vitb32': ('clip_vitb32_pretrain.pth.tar',),
    'open_clip_vitb16': ('open_clip_vitb16_pretrain.pth.tar',),
    'open_clip_vitb32': ('open_clip_vitb32_pretrain.pth.tar',),
    'synclr_vitb16': ('synclr_vit_b_16.pth',),
    'dinov2_vitb14': ('checkpoints/dinov2_vitb14_pretrain.pth', 'dinov2_vitb14_pretrain.pth'),  # torch hub's file
}
SOURCES = {
    'dreamsim_ensemble': 'DreamSim ensemble (DINO ViT-B/16 + CLIP ViT-B/16 + OpenCLIP ViT-B/16, LoRA on NIGHTS; '
                         'release v0.2.0 dreamsim_ensemble_checkpoint.zip)',
    'dreamsim_dino_vitb16': 'DreamSim single-branch DINO ViT-B/16 (dreamsim_dino_vitb16_checkpoint.zip)',
    'dreamsim_clip_vitb32': 'DreamSim single-branch CLIP ViT-B/32 (dreamsim_clip_vitb32_checkpoint.zip)',
    'dreamsim_open_clip_vitb32': 'DreamSim single-branch OpenCLIP ViT-B/32 (dreamsim_open_clip_vitb32_checkpoint.zip)',
    'dreamsim_synclr_vitb16': 'DreamSim single-branch SynCLR ViT-B/16 (v0.2.1 dreamsim_synclr_vitb16_checkpoint.zip)',
    'dreamsim_dinov2_vitb14': 'DreamSim single-branch DINOv2 ViT-B/14 (v0.2.1 dreamsim_dinov2_vitb14_checkpoint.zip)',
    'dreamsim_dino_vitb16_patch': 'DreamSim DINO ViT-B/16, CLS + patch features (v0.2.1 '
                                  'dreamsim_dino_vitb16_patch_checkpoint.zip)',
    'dreamsim_dinov2_vitb14_patch': 'DreamSim DINOv2 ViT-B/14, CLS + patch features (v0.2.1 '
                                    'dreamsim_dinov2_vitb14_patch_checkpoint.zip)',
    'dreamsim_ensemble_pretrained': 'DreamSim\'s un-tuned ensemble: torch hub DINO ViT-B/16 + the CLIP ViT-B/16 '
                                    '(OpenAI) and OpenCLIP ViT-B/16 (laion400m_e31) files of '
                                    'dreamsim_ensemble_checkpoint.zip, no LoRA',
    'dreamsim_dino_vitb16_pretrained': 'DreamSim\'s un-tuned single model: torch hub DINO ViT-B/16, no LoRA',
}
DEFAULT_LAYERS = ('embedding',)
# the un-tuned members: the feature DreamSim trains and evaluates them on (PerceptualModel(normalize_embeds=False):
# the concatenation, no centring; eval_percep.py's baseline and the training loss)
PRETRAINED_LAYERS = ('concat',)
IMAGE_SIZE = 224
TINY_SIZE = 32

_LORA_KEY = re.compile(r'(?:^|\.)extractor_list\.(\d+)\.model\.blocks\.(\d+)\.attn\.qkv\.lora_([AB])'
                       r'(?:\.default)?\.weight$')


def _model(name: str):
  if name not in MODELS:
    raise UserError(f'config.backbone: {name!r} is not a DreamSim model; known: {", ".join(MODELS)}')
  return MODELS[name]


def preprocess(size: int = IMAGE_SIZE) -> Preprocess:
  """DreamSim's `preprocess`: Resize((size, size), BICUBIC) on the PIL image, ToTensor ([0, 1]); the per-branch
  Normalize runs inside apply_fn."""
  return Preprocess(size=size, resize='squash', mean=(0.0, 0.0, 0.0), std=(255.0, 255.0, 255.0),
                    interpolation='bicubic')


def stage_names(branches: Sequence[Branch]) -> list[str]:
  out = []
  for b in branches:
    out += [b.key, f'{b.key}_pooled', f'{b.key}_patch_mean', f'{b.key}_tokens']
  return out + ['concat', 'embedding']


def normalize_embedding(x: jax.Array) -> jax.Array:
  """DreamSim's `normalize_embedding`: minus the mean over the feature axis, divided by the L2 norm."""
  x = x - x.mean(axis=-1, keepdims=True)
  return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


def apply_dreamsim(branches: tuple[Branch, ...], tiny: bool, abstract: bool, variables, x):
  """Pure (embedding, stages) on a batch scaled to [0, 1] (NHWC), computed at x.dtype (the normalisation in f32)."""
  stages, feats = {}, []
  x32 = x.astype(jnp.float32)
  for b in branches:
    arch = b.tiny if tiny else b.arch
    xb = ((x32 - jnp.asarray(b.norm[0], jnp.float32)) / jnp.asarray(b.norm[1], jnp.float32)).astype(x.dtype)
    module = vit.VisionTransformer(arch, x.dtype)
    if abstract:
      _, s = module.init_with_output(jax.random.PRNGKey(0), xb)[0]
    else:
      _, s = module.apply({'params': variables['params'][b.key]}, xb)
    tokens = s[f'block{arch.depth}']
    if b.feat == 'cls_patch':  # every token of block 12, CLS included (normalised per token below)
      f = tokens
    else:
      f = tokens[:, 0] if b.feat == 'cls' else s['projection']
    stages.update({b.key: f, f'{b.key}_pooled': s['pooled'], f'{b.key}_patch_mean': s['patch_mean'],
                   f'{b.key}_tokens': tokens})
    feats.append(f.astype(jnp.float32))
  concat = stages['concat'] = jnp.concatenate(feats, axis=-1)
  if branches[0].feat == 'cls_patch':
    # normalize_embedding_patch (per token: minus its mean over channels, / its L2 norm), then `forward`'s
    # cat(CLS, adaptive_avg_pool of the patch tokens): cosine of two of these = 1 - DreamSim's distance
    t = normalize_embedding(concat)
    embedding = jnp.concatenate([t[:, 0], t[:, 1:].mean(axis=1)], axis=-1)
  else:
    embedding = normalize_embedding(concat)
  stages['embedding'] = embedding
  return embedding, stages


def init_variables(branches, tiny, key, x):
  return {'params': {b.key: vit.VisionTransformer(b.tiny if tiny else b.arch).init(key, x)['params']
                     for b in branches}}


def variable_shapes(branches, tiny: bool) -> dict:
  size = TINY_SIZE if tiny else IMAGE_SIZE
  x = jax.ShapeDtypeStruct((1, size, size, 3), jnp.float32)
  return jax.eval_shape(lambda x: init_variables(branches, tiny, jax.random.PRNGKey(0), x), x)


def to_flax(branches, sd: dict, where: str = 'weights') -> dict:
  """Stored tensors ('<branch>.<vit.py name>') -> {'params': {branch: vit params}}."""
  params = {}
  keys = {b.key for b in branches}
  for b in branches:
    prefix = b.key + '.'
    sub = {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}
    params[b.key] = vit.to_flax(sub, where)['params']
  other = sorted(k for k in sd if k.split('.', 1)[0] not in keys)
  if other:
    raise UserError(f'{where}: entries of no branch of this model ({sorted(keys)}): {other[:3]}')
  return {'params': params}


# --------------------------------------------------------------------------------------------- conversion

PEFT_TARGETS = ('qkv', 'proj', 'fc1', 'fc2')   # the Linear modules of a DINO-layout block a peft adapter may name


def read_peft_config(path: str, allowed: Sequence[str] = ('qkv',)) -> dict:
  """A peft LoRA adapter_config.json -> {'r', 'alpha', 'dropout', 'targets', 'rslora', 'scale'}; refuses what a
  plain W + scale * B A on the `allowed` modules does not express, naming the file and field."""
  if not os.path.isfile(path):
    raise UserError(f'{path}: not found (the LoRA adapter config peft\'s save_pretrained writes beside '
                    'adapter_model.*)')
  cfg = readers.read_json(path, dict, 'LoRA adapter config')
  for field in ('r', 'lora_alpha'):
    if not isinstance(cfg.get(field), (int, float)) or cfg[field] <= 0:
      raise UserError(f'{path}: field {field!r} missing or not a positive number')
  if cfg.get('peft_type', 'LORA') != 'LORA':
    raise UserError(f'{path}: peft_type {cfg["peft_type"]!r}; only LORA adapters can be merged')
  targets = cfg.get('target_modules')
  targets = [targets] if isinstance(targets, str) else list(targets or [])
  if not targets or not set(targets) <= set(allowed):
    raise UserError(f'{path}: target_modules {targets}; DreamSim adapters target ["qkv"] only' if list(allowed) ==
                    ['qkv'] else f'{path}: target_modules {targets}; expected some of {list(allowed)}')
  refused = {'bias': lambda v: v not in (None, 'none'), 'use_dora': bool, 'fan_in_fan_out': bool,
             'modules_to_save': bool, 'rank_pattern': bool, 'alpha_pattern': bool, 'layers_to_transform': bool}
  for field, bad in refused.items():
    if bad(cfg.get(field)):
      raise UserError(f'{path}: {field}={cfg[field]!r} is not supported (a plain LoRA merge W + scale * B A)')
  dropout = cfg.get('lora_dropout') or 0.0
  if not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
    raise UserError(f'{path}: lora_dropout {dropout!r}; expected a probability in [0, 1)')
  r, rslora = int(cfg['r']), bool(cfg.get('use_rslora'))
  return {'r': r, 'alpha': float(cfg['lora_alpha']), 'dropout': float(dropout), 'targets': sorted(set(targets)),
          'rslora': rslora, 'scale': float(cfg['lora_alpha'] / (np.sqrt(r) if rslora else r))}


def read_lora_config(path: str) -> tuple[float, int]:
  """(scale, r) of a DreamSim adapter_config.json (target_modules ['qkv'])."""
  cfg = read_peft_config(path)
  return cfg['scale'], cfg['r']


def merge_lora(weight: np.ndarray, a: np.ndarray, b: np.ndarray, scale: float) -> np.ndarray:
  """W + scale * B A (float64 product, float32 result): peft's merged Linear weight."""
  return (weight.astype(np.float64) + scale * (b.astype(np.float64) @ a.astype(np.float64))).astype(np.float32)


def _find(folder: str, candidates: Sequence[str], what: str) -> str:
  for c in candidates:
    path = os.path.join(folder, c)
    if os.path.isfile(path):
      resolve.check_tree(folder, [path], what)  # a link out of DreamSim's folder is refused (data/resolve.py)
      return path
  raise UserError(f'{folder}: no {what} (looked for {", ".join(candidates)}); point --checkpoint at the folder '
                  "DreamSim's `dreamsim(pretrained=True, cache_dir=FOLDER)` fills (or the unzipped release "
                  'checkpoint plus torch hub\'s checkpoints/dino_vitbase16_pretrain.pth)')


def _base_tensors(branch: Branch, folder: str, tiny: bool, sources: dict) -> dict:
  from visim_jax.backbones import convert  # pylint: disable=g-import-not-at-top
  path = _find(folder, BASE_FILES[branch.model_type], f'{branch.model_type} base weights')
  sd, _ = convert.read_checkpoint(path)
  sources[os.path.relpath(path, folder)] = sha256_file(path)
  prefixes = ('module.visual.', 'module.', 'backbone.') if branch.key == 'synclr' else ('module.', 'backbone.')
  sd = weights_lib.clean_state_dict(sd, drop=('head.', 'mask_token'), prefixes=prefixes)
  sd = {('ln_pre.' + k[len('pos_drop.'):] if k.startswith('pos_drop.') else k): v for k, v in sd.items()}
  arch = branch.tiny if tiny else branch.arch
  if branch.pos_offset is not None and 'pos_embed' in sd:
    sd['pos_embed'] = resize_pos_embed(sd['pos_embed'], arch.image_size // arch.patch, branch.pos_offset, path)
  weights_lib.check_fits(vit.to_flax(sd, path), vit.variable_shapes(arch), branch.model_type, path)
  return sd


def resize_pos_embed(pos: np.ndarray, grid: int, offset: float, path: str = 'checkpoint') -> np.ndarray:
  """torch hub DINOv2's `interpolate_pos_encoding` for a grid x grid input: the M x M patch positions resized by
  `interpolate(mode='bicubic', scale_factor=(grid + offset) / M)` (align_corners False, no antialias), the class
  position kept; float64 matrices, float32 result. A pos_embed of another form (not (1, 1 + M^2, D)) is refused
  naming the checkpoint."""
  from visim_jax.backbones.hf import torch_bicubic_matrix  # pylint: disable=g-import-not-at-top
  shape = tuple(np.shape(pos))
  m = int(round(np.sqrt(shape[1] - 1))) if len(shape) == 3 and shape[0] == 1 and shape[1] >= 2 else 0
  if not m or m * m + 1 != shape[1] or not shape[2]:
    raise UserError(f'{path}: pos_embed has shape {shape}, not (1, 1 + M*M, D) (a class position and an M x M grid '
                    'of a ViT); not a DINO / DINOv2 checkpoint: point --checkpoint at the one DreamSim loads')
  if m == grid:
    return pos
  w = torch_bicubic_matrix(m, grid, scale_factor=(grid + offset) / m)
  patches = pos[0, 1:].astype(np.float64).reshape(m, m, -1)
  patches = np.einsum('ia,jb,abc->ijc', w, w, patches).reshape(grid * grid, -1)
  return np.concatenate([pos[0, :1].astype(np.float64), patches])[None].astype(np.float32)


def prepare_folder(name: str, folder: str, tiny: bool = False) -> tuple[dict, dict]:
  """DreamSim's cache_dir -> (the merged tensors to store, sidecar info incl. every input's sha256)."""
  from visim_jax.backbones import convert  # pylint: disable=g-import-not-at-top
  tag, branches = _model(name)
  if not os.path.isdir(folder):
    raise UserError(f'--checkpoint {folder}: {name} converts from a folder (DreamSim\'s cache_dir holding '
                    f'{f"{tag}_lora/ and " if tag else ""}the base checkpoints), not a file')
  sources: dict[str, str] = {}
  if tag is None:   # the un-tuned members: the base files only (a LoRA folder beside them is not read)
    tensors = {}
    for b in branches:
      tensors.update({f'{b.key}.{k}': v for k, v in _base_tensors(b, folder, tiny, sources).items()})
    return tensors, {'lora': None, 'branches': [b.model_type for b in branches], 'source_files': sources}
  lora_dir = os.path.join(folder, f'{tag}_lora')
  if not os.path.isdir(lora_dir):
    raise UserError(f'--checkpoint {folder}: no {tag}_lora/ folder (the LoRA adapter of {name}); point it at '
                    f"DreamSim's cache_dir after `dreamsim(pretrained=True, cache_dir=FOLDER, dreamsim_type="
                    f"'{tag.replace('_single', '')}')`, or at the unzipped release checkpoint")
  scale, r = read_lora_config(os.path.join(lora_dir, 'adapter_config.json'))
  adapter = _find(lora_dir, ('adapter_model.safetensors', 'adapter_model.bin'), 'LoRA adapter weights')
  lora, _ = convert.read_checkpoint(adapter)
  sources[os.path.relpath(os.path.join(lora_dir, 'adapter_config.json'), folder)] = sha256_file(
      os.path.join(lora_dir, 'adapter_config.json'))
  sources[os.path.relpath(adapter, folder)] = sha256_file(adapter)
  pairs: dict[tuple[int, int], dict[str, np.ndarray]] = {}
  for k, v in lora.items():
    m = _LORA_KEY.search(k)
    if not m:
      raise UserError(f'{adapter}: unexpected entry {k} {np.shape(v)}; a DreamSim adapter holds only '
                      'extractor_list.I.model.blocks.J.attn.qkv.lora_A/lora_B weights')
    pairs.setdefault((int(m.group(1)), int(m.group(2))), {})[m.group(3)] = np.asarray(v)
  tensors = {}
  for i, b in enumerate(branches):
    sd = _base_tensors(b, folder, tiny, sources)
    for (ext, block), ab in sorted(pairs.items()):
      if ext != i:
        continue
      key = f'blocks.{block}.attn.qkv.weight'
      if set(ab) != {'A', 'B'} or key not in sd:
        raise UserError(f'{adapter}: extractor_list.{ext} block {block}: needs lora_A and lora_B of an existing '
                        f'qkv layer (found {sorted(ab)}; {key} in the base: {key in sd})')
      a, bm, w = ab['A'], ab['B'], sd[key]
      if a.shape != (r, w.shape[1]) or bm.shape != (w.shape[0], r):
        raise UserError(f'{adapter}: extractor_list.{ext} block {block}: lora_A {a.shape} / lora_B {bm.shape} do '
                        f'not fit qkv {w.shape} with r={r}')
      sd[key] = merge_lora(w, a, bm, scale)
    tensors.update({f'{b.key}.{k}': v for k, v in sd.items()})
  extra_ext = sorted({e for e, _ in pairs} - set(range(len(branches))))
  if extra_ext:
    raise UserError(f'{adapter}: adapters for extractor_list {extra_ext}, but {name} has {len(branches)} branch(es)')
  return tensors, {'lora': {'scale': scale, 'r': r, 'merged_layers': len(pairs), 'adapter': adapter},
                   'branches': [b.model_type for b in branches], 'source_files': sources}


def dreamsim_backbone(name: str, weights: str | None = None, random_init: int | None = None, tiny: bool = False,
                      layers: str | Sequence[str] | None = None, abstract: bool = False) -> Backbone:
  """A DreamSim model: converted weights (offline), `random_init=SEED`, `tiny=True`, or `abstract=True`."""
  _, branches = _model(name)
  size = TINY_SIZE if tiny else IMAGE_SIZE
  variables, weights_id, where = weights_lib.family_variables(
      name, weights=weights, random_init=random_init, tiny=tiny, abstract=abstract,
      init=functools.partial(init_variables, branches, tiny), image_size=size,
      to_flax=functools.partial(to_flax, branches), shapes=lambda: variable_shapes(branches, tiny))
  return Backbone(
      name=name,
      apply_fn=functools.partial(apply_dreamsim, branches, tiny, abstract),
      variables=variables,
      preprocess=preprocess(size),
      layers=weights_lib.parse_layers(name, layers, PRETRAINED_LAYERS if MODELS[name][0] is None else DEFAULT_LAYERS,
                                      stage_names(branches)),
      weights_id=weights_id,
      labels=None,
      description=f'{SOURCES[name]} [{where}]',
  )
