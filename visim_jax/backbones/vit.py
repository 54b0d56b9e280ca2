"""timm / DeiT / DINO Vision Transformers in Flax, with the state-dict keys of timm and of DINO's torch hub.

Architecture (Dosovitskiy et al. 2021, "An Image is Worth 16x16 Words", Sec. 3.1, eq. 1-4; the same module in
timm's `vision_transformer.py` (v0.4.5, the seed code's pin) and DINO's `vision_transformer.py`):
- patch embedding: a p x p convolution of stride p (with bias), flattened to (N, HW/p^2, C);
- a learned class token prepended, learned position embeddings added (1 + HW/p^2 positions);
- L pre-norm blocks: x + proj(MHSA(LN1(x))), then x + fc2(GELU(fc1(LN2(x)))) (exact erf GELU, MLP ratio 4,
  qkv with bias, LayerNorm eps 1e-6, attention scale head_dim^-1/2);
- a final LayerNorm; the CLS token of its output is the image representation (timm's ViT then has a 1,000-class
  linear head, which is not built or stored here; DINO's hub models have none: `head` = Identity).

Members (paper 001 Table 1 names; what the seed code VieVie31/visual-similarity `featuresExtractor/models.py` loads):
- `vit`: timm `vit_base_patch16_224` (timm 0.4.5: jx_vit_base_p16_224-80ecf9dd.pth, Google's ViT-B/16 ImageNet-21k
  fine-tuned on 1k at 224), layer index -2 of `named_modules()` = `pre_logits` (Identity) = CLS after the final
  LayerNorm, 768-d;
- `deits16`, `deits8`: DINO hub `dino_deits16` / `dino_deits8` (ViT-S/16, ViT-S/8: width 384, 6 heads; renamed
  dino_vits16 / dino_vits8 in DINO's hub on 2021-05-22), layer 'head' (Identity) = CLS after the final norm, 384-d;
- `dino_vitb16`, `dino_vitb8`: DINO hub ViT-B/16, ViT-B/8 (width 768, 12 heads), 'head', 768-d.

Stages returned: 'embeddings' (tokens entering block 1, (N, 1 + P, C)), 'block1'..'blockL' (each block's output),
'pooled' (N, C): the CLS token after the final LayerNorm = `final`, 'patch_mean' (N, C): the mean of the patch tokens
after the final LayerNorm (CLS excluded), and, for towers with a projection (openclip.py), 'projection'. Default
layers: ('pooled',), what the seed hooks; `layers='patch_mean'` or `'block12'` (a token mean, CLS included) pool
otherwise.

Preprocessing: the seed code gives none of these models its own transform, so all use its default
(`featuresExtractor/transforms.py`): ToTensor, Resize([224, 224]) (bilinear squash of the tensor), ImageNet mean/std
-- for timm's ViT too, whose own config is mean = std = 0.5. `preprocessing='native'` gives each weight set's own
eval transform instead (timm: shorter side 248 bicubic, centre crop 224, mean = std = 0.5; DINO: shorter side 256
bicubic, centre crop 224, ImageNet mean/std).

Weights: a safetensors file of the PyTorch state dict in timm / DINO names (`cls_token`, `pos_embed`,
`patch_embed.proj.weight`, `blocks.0.attn.qkv.weight`, ..., `norm.weight`; timm's `head.*` dropped), default
`$VISIM_JAX_WEIGHTS/<name>.safetensors`, written once by `python -m visim_jax.backbones.convert --backbone=NAME
--checkpoint=FILE` (prepare_state_dict). Nothing is unpickled at run time.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import math
import re
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from visim_jax.backbones import weights as weights_lib
from visim_jax.backbones.base import Backbone, block_class
from visim_jax.backbones.resnet import preprocess as seed_transform  # the seed's default transform, one copy
from visim_jax.core.errors import UserError
from visim_jax.data.preprocess import IMAGENET_MEAN, IMAGENET_STD, Preprocess


@dataclasses.dataclass(frozen=True)
class Arch:
  patch: int
  width: int
  depth: int
  heads: int
  image_size: int = 224
  mlp_ratio: int = 4
  # CLIP-style towers in this layout (openclip.py, dreamsim.py): LayerNorm eps, MLP activation ('gelu' = exact erf
  # GELU, 'quick_gelu' = x * sigmoid(1.702 x), OpenAI CLIP's), a LayerNorm on the tokens before block 1 (CLIP's
  # ln_pre), a bias on the patch convolution, and a projection (width, proj_dim) of the pooled token (0: none)
  ln_eps: float = 1e-6
  act: str = 'gelu'
  ln_pre: bool = False
  patch_bias: bool = True
  proj_dim: int = 0
  layer_scale: bool = False  # DINOv2's per-channel LayerScale in every block (`blocks.N.ls1.gamma`, `ls2.gamma`)


ARCHS = {
    'vit': Arch(16, 768, 12, 12),
    'deits16': Arch(16, 384, 12, 6),
    'deits8': Arch(8, 384, 12, 6),
    'dino_vitb16': Arch(16, 768, 12, 12),
    'dino_vitb8': Arch(8, 768, 12, 12),
}
SOURCES = {
    'vit': 'timm vit_base_patch16_224 (timm 0.4.5 weights jx_vit_base_p16_224-80ecf9dd.pth; on the HF hub as '
           'timm/vit_base_patch16_224.orig_in21k_ft_in1k)',
    'deits16': 'DINO ViT-S/16 (torch hub facebookresearch/dino dino_deits16 = dino_vits16; '
               'dino_deitsmall16_pretrain.pth)',
    'deits8': 'DINO ViT-S/8 (dino_deits8 = dino_vits8; dino_deitsmall8_pretrain.pth)',
    'dino_vitb16': 'DINO ViT-B/16 (dino_vitb16; dino_vitbase16_pretrain.pth)',
    'dino_vitb8': 'DINO ViT-B/8 (dino_vitb8; dino_vitbase8_pretrain.pth)',
}
TINY = Arch(8, 32, 2, 4, image_size=32)  # 16 patches + CLS, 4 heads of 8
DEFAULT_LAYERS = ('pooled',)
LN_EPS = 1e-6


def preprocess_for(name: str, preprocessing: str = 'seed', size: int = 224) -> Preprocess:
  """The seed code's default transform ('seed'), or the weights' own eval transform ('native')."""
  if preprocessing == 'seed':
    return seed_transform(size)
  if preprocessing == 'native':
    if name == 'vit':  # timm default_cfg: crop_pct 0.9, bicubic, mean = std = 0.5
      return Preprocess(size=size, resize='shorter_crop', resize_to=int(size / 0.9), mean=(127.5,) * 3,
                        std=(127.5,) * 3, interpolation='bicubic')
    return Preprocess(size=size, resize='shorter_crop', resize_to=size * 256 // 224, mean=IMAGENET_MEAN,
                      std=IMAGENET_STD, interpolation='bicubic')  # DINO's eval_linear / eval_knn transform
  raise UserError(f"config.backbone_kwargs.preprocessing: {preprocessing!r} for {name}; expected 'seed' (the seed "
                  "code's default transform) or 'native' (the weights' own eval transform)")


def quick_gelu(x):
  return x * jax.nn.sigmoid(1.702 * x)


# The library's masks (zoo/spatial.py): inside `key_weights(w)` every Attention below (traced there) multiplies each
# patch key's attention by its share of the mask w ((N, H, W) in [0, 1], brought to the patch grid; leading CLS /
# register keys weight 1): a log-weight added to the logits, so w = 1 everywhere is the plain network.
_KEY_WEIGHTS = contextvars.ContextVar('visim_jax_vit_key_weights', default=None)


@contextlib.contextmanager
def key_weights(w):
  token = _KEY_WEIGHTS.set(w)
  try:
    yield
  finally:
    _KEY_WEIGHTS.reset(token)


def _key_bias(w, t: int):
  """(N, t) log-weights of the keys: leading tokens 0, the g x g patch grid log(share of the mask), -1e9 if none."""
  g = math.isqrt(t)
  lead = t - g * g
  if tuple(w.shape[1:3]) != (g, g):
    w = jnp.clip(jax.image.resize(w, w.shape[:1] + (g, g), 'linear', antialias=True), 0.0, 1.0)
  w = w.reshape(w.shape[0], g * g).astype(jnp.float32)
  patch = jnp.where(w > 0, jnp.log(jnp.maximum(w, 1e-30)), -1e9)
  return jnp.concatenate([jnp.zeros((w.shape[0], lead), jnp.float32), patch], axis=1)


class Attention(nn.Module):
  heads: int
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    n, t, c = x.shape
    hd = c // self.heads
    qkv = nn.Dense(3 * c, dtype=self.dtype, name='qkv')(x).reshape(n, t, 3, self.heads, hd)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    logits = jnp.einsum('nqhd,nkhd->nhqk', q * (hd ** -0.5), k).astype(jnp.float32)
    w = _KEY_WEIGHTS.get()
    if w is not None:
      logits = logits + _key_bias(w, t)[:, None, None, :]
    attn = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
    out = jnp.einsum('nhqk,nkhd->nqhd', attn, v).reshape(n, t, c)
    return nn.Dense(c, dtype=self.dtype, name='proj')(out)


class Block(nn.Module):
  """Pre-norm block; `mlp_dim` (default mlp_ratio * width) and `tanh_gelu` (the tanh GELU approximation, as
  big_vision's nn.gelu and SigLIP; default the exact erf GELU of timm/DINO) serve siglip.py too."""
  heads: int
  mlp_ratio: int = 4
  dtype: jnp.dtype = jnp.float32
  mlp_dim: int | None = None
  tanh_gelu: bool = False
  ln_eps: float = LN_EPS
  act: str = 'gelu'   # 'gelu' (exact erf, or tanh when tanh_gelu) | 'quick_gelu' (OpenAI CLIP's x * sigmoid(1.702 x))
  layer_scale: bool = False  # DINOv2's LayerScale: each branch's output times a learned per-channel gamma (ls1, ls2)

  @nn.compact
  def __call__(self, x):
    c = x.shape[-1]
    ln = functools.partial(nn.LayerNorm, epsilon=self.ln_eps, dtype=self.dtype)
    scale = ((lambda name, y: y * self.param(name, nn.initializers.ones, (c,)).astype(y.dtype)) if self.layer_scale
             else (lambda name, y: y))
    x = x + scale('ls1', Attention(self.heads, self.dtype, name='attn')(ln(name='norm1')(x)))
    h = nn.Dense(self.mlp_dim or c * self.mlp_ratio, dtype=self.dtype, name='fc1')(ln(name='norm2')(x))
    h = quick_gelu(h) if self.act == 'quick_gelu' else jax.nn.gelu(h, approximate=self.tanh_gelu)
    h = nn.Dense(c, dtype=self.dtype, name='fc2')(h)
    return x + scale('ls2', h)


def patch_embed(arch, x, dtype, use_bias: bool = True):
  """The p x p stride-p patch convolution ('patch_embed', VALID) of a compact module, flattened: ((N, P, C),
  (grid h, grid w)). Shared by the ViTs here and siglip.py."""
  x = nn.Conv(arch.width, (arch.patch, arch.patch), (arch.patch, arch.patch), padding='VALID', use_bias=use_bias,
              dtype=dtype, name='patch_embed')(x.astype(dtype))
  n, gh, gw, c = x.shape
  return x.reshape(n, gh * gw, c), (gh, gw)


class VisionTransformer(nn.Module):
  arch: Arch
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    a, d = self.arch, self.dtype
    x, (gh, gw) = patch_embed(a, x, d, use_bias=a.patch_bias)
    n, _, c = x.shape
    cls = self.param('cls_token', nn.initializers.normal(0.02), (1, 1, c))
    pos = self.param('pos_embed', nn.initializers.normal(0.02), (1, (a.image_size // a.patch) ** 2 + 1, c))
    if pos.shape[1] != gh * gw + 1:
      raise UserError(f'ViT input {gh * a.patch}x{gw * a.patch} does not fit the {a.image_size}px position '
                       'embeddings; resize images to the backbone\'s preprocess.size')
    x = jnp.concatenate([jnp.broadcast_to(cls.astype(d), (n, 1, c)), x], axis=1) + pos.astype(d)
    if a.ln_pre:
      x = nn.LayerNorm(epsilon=a.ln_eps, dtype=d, name='ln_pre')(x)
    stages = {'embeddings': x}
    for i in range(a.depth):
      x = block_class(Block)(a.heads, a.mlp_ratio, d, ln_eps=a.ln_eps, act=a.act, layer_scale=a.layer_scale, name=f'blocks_{i}')(x)
      stages[f'block{i + 1}'] = x
    x = nn.LayerNorm(epsilon=a.ln_eps, dtype=d, name='norm')(x)
    pooled = stages['pooled'] = x[:, 0]
    stages['patch_mean'] = x[:, 1:].mean(axis=1)  # open_clip's pool_type='avg' (after the final LayerNorm)
    if a.proj_dim:
      proj = self.param('proj', nn.initializers.normal(c ** -0.5), (c, a.proj_dim))
      stages['projection'] = pooled @ proj.astype(d)
    return pooled, stages


def stage_names(arch: Arch) -> list[str]:
  return (['embeddings'] + [f'block{i + 1}' for i in range(arch.depth)] + ['pooled', 'patch_mean']
          + (['projection'] if arch.proj_dim else []))


def apply_vit(arch: Arch, variables, x, module=VisionTransformer):
  """Pure (final, stages) of `module(arch, dtype)` on a normalised NHWC batch, computed at x.dtype."""
  return module(arch, x.dtype).apply(variables, x)


def apply_vit_init(arch: Arch, variables, x, module=VisionTransformer):
  """The same outputs with variables made by `init` inside (the `abstract=True` backbone: under jax.eval_shape
  it gives every stage's shape without making a weight)."""
  del variables
  return module(arch, x.dtype).init_with_output(jax.random.PRNGKey(0), x)[0]


# ------------------------------------------------------------------------------------ weights (timm / DINO names)

def _module_path(prefix: str, where: str = 'weights') -> tuple[str, ...]:
  """PyTorch module path -> flax module path: 'blocks.3.attn.qkv' -> blocks_3/attn/qkv, 'blocks.3.mlp.fc1' ->
  blocks_3/fc1, 'patch_embed.proj' -> patch_embed; 'norm' and 'blocks.3.norm1' keep their names."""
  parts = prefix.split('.')
  if parts[0] == 'blocks' and len(parts) in (3, 4) and parts[2] in ('norm1', 'norm2', 'attn', 'mlp'):
    rest = parts[2:]
    return (f'blocks_{parts[1]}',) + tuple(rest[1:] if rest[0] == 'mlp' else rest)
  if prefix == 'patch_embed.proj':
    return ('patch_embed',)
  if prefix in ('norm', 'ln_pre'):
    return (prefix,)
  raise UserError(f'{where}: unexpected module {prefix!r} for a timm/DINO ViT (these members have no pre_logits, '
                  'distillation token or representation layer)')


def to_flax(sd: dict, where: str = 'weights') -> dict:
  """Stored tensors (timm / DINO names, no head) -> flax {'params'}: conv OIHW -> HWIO, linear (out, in) ->
  (in, out), LayerNorm weight -> scale (weights.torch_to_flax); cls_token and pos_embed as they are."""
  tokens = {k: np.asarray(sd[k], np.float32) for k in ('cls_token', 'pos_embed', 'proj') if k in sd}
  gammas = {k: v for k, v in sd.items() if re.fullmatch(r'blocks\.\d+\.ls[12]\.gamma', k)}  # DINOv2 LayerScale
  rest = {k: v for k, v in sd.items() if k not in tokens and k not in gammas}
  variables = weights_lib.torch_to_flax(rest, functools.partial(_module_path, where=where), where)
  variables['params'].update(tokens)
  for k, v in gammas.items():
    _, i, ls, _ = k.split('.')
    variables['params'].setdefault(f'blocks_{i}', {})[ls] = np.asarray(v, np.float32)
  return variables


def variable_shapes(arch: Arch) -> dict:
  """The flax variable tree's shapes (jax.eval_shape; no weights made)."""
  x = jax.ShapeDtypeStruct((1, arch.image_size, arch.image_size, 3), jnp.float32)
  return jax.eval_shape(lambda x: VisionTransformer(arch).init(jax.random.PRNGKey(0), x), x)


def prepare_state_dict(name: str, sd: dict, where: str, tiny: bool = False) -> tuple[dict, dict]:
  """A raw timm / DINO checkpoint -> (tensors to store: their names, float32, no classifier; sidecar info).

  Drops a leading 'module.' / 'backbone.' (DINO training wrappers) and timm's ImageNet head (`head.*`); fails,
  naming the file, unless the rest fits NAME's architecture exactly."""
  arch = _arch(name, tiny)
  out = weights_lib.clean_state_dict(sd, drop=('head.',), prefixes=('module.', 'backbone.'))
  weights_lib.check_fits(to_flax(out, where), variable_shapes(arch), name, where)
  return out, {'architecture': dataclasses.asdict(arch)}


def _arch(name: str, tiny: bool) -> Arch:
  if name not in ARCHS:
    raise UserError(f'config.backbone: {name!r} is not a timm/DINO ViT; known: {", ".join(ARCHS)}')
  return TINY if tiny else ARCHS[name]


def vit_backbone(name: str, weights: str | None = None, random_init: int | None = None, tiny: bool = False,
                 layers: str | Sequence[str] | None = None, preprocessing: str = 'seed',
                 abstract: bool = False) -> Backbone:
  """A registered ViT: converted weights (offline), `random_init=SEED`, `tiny=True` (random, tiny config), or
  `abstract=True` (no weights: for jax.eval_shape size checks)."""
  arch = _arch(name, tiny)
  variables, weights_id, where = weights_lib.family_variables(
      name, weights=weights, random_init=random_init, tiny=tiny, abstract=abstract,
      init=VisionTransformer(arch).init, image_size=arch.image_size, to_flax=to_flax,
      shapes=lambda: variable_shapes(arch))
  layers = weights_lib.parse_layers(name, layers, DEFAULT_LAYERS, stage_names(arch))
  return Backbone(
      name=name,
      apply_fn=functools.partial(apply_vit_init if abstract else apply_vit, arch),
      variables=variables,
      preprocess=preprocess_for(name, preprocessing, arch.image_size),
      layers=layers,
      weights_id=weights_id,
      labels=None,
      description=f'{SOURCES[name]} [{where}; preprocessing {preprocessing}]',
  )
