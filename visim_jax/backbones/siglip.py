"""SigLIP / SigLIP 2 image towers (FixRes) in Flax, with converters from Hugging Face safetensors and big_vision .npz.

Architecture (Zhai et al. 2023, "Sigmoid Loss for Language Image Pre-Training"; Tschannen et al. 2025, "SigLIP 2";
big_vision `models/vit.py` with variant B/16 or So400m/14 and pool_type='map'; transformers 4.57
`SiglipVisionModel`): a ViT without class token:
- patch embedding: a p x p stride-p convolution with bias (VALID: 384 px at p = 14 gives 27 x 27 patches),
  flattened to (N, P, C), plus learned position embeddings (P, C);
- L pre-norm blocks x + out(MHSA(LN1(x))), x + fc2(GELU_tanh(fc1(LN2(x)))) (vit.Block with the tanh GELU of
  big_vision's nn.gelu / HF's gelu_pytorch_tanh, MLP width 3072 (B) or 4304 (So400m), LayerNorm eps 1e-6);
- a final LayerNorm (big_vision `encoder_norm`, HF `post_layernorm`): the token outputs;
- the MAP head (multihead attention pooling, big_vision `MAPHead`, HF `SiglipMultiheadAttentionPoolingHead`):
  a learned probe (1, 1, C) attends to the tokens (q from the probe, k and v from the tokens, out projection; no
  norm before and no residual around the attention), then y + fc2(GELU_tanh(fc1(LN(y)))): the image embedding
  (HF `pooler_output`, big_vision `head_input`), before the image-text projection (SigLIP has none on images).

Members (names: siglip[2]_<variant><patch>_<resolution>; checkpoints: HF `google/siglip-*` / `google/siglip2-*`,
big_vision `gs://big_vision/siglip/*.npz` / `gs://big_vision/siglip2/*.npz`): see ARCHS, HUB_IDS and NPZ_FILES.
SigLIP 2's FixRes checkpoints have exactly SigLIP's image tower (big_vision README_siglip2.md: "compatible with
vit.py"); the NaFlex variants (variable resolution and aspect ratio, naflex_vit.py) are not supported.

Stages: 'embeddings' (patch tokens + positions, (N, P, C)), 'block1'..'blockL', 'tokens' (after the final
LayerNorm: HF last_hidden_state), 'mean' (the mean of 'tokens' over patches, (N, C): big_vision pool_type='gap'
applied to this tower) and 'pooled' (the MAP head output, (N, C)) = `final`. Pooling (`pooling=`): 'map'
(default layers ('pooled',): what the authors use as the image embedding) or 'mean' (layers ('mean',)); there is
no CLS token. `layers=` picks any stages instead.

Preprocessing (`preprocessing=`), by default the one of the weight source recorded when the file was converted
('auto'): resize the whole image to the model's size without crop (squash), values (x / 255 - 0.5) / 0.5 in
[-1, 1]; the resize kernel differs by source:
- 'hf': transformers' SiglipImageProcessor: PIL resize with the processor's `resample` (its default and the
  usual preprocessor_config.json value: 3 = bicubic; the converter reads preprocessor_config.json beside the
  checkpoint when there is one and records its kernel), rounded to uint8;
- 'big_vision': big_vision's `resize(RES)|value_range(-1, 1)` (the SigLIP / SigLIP 2 demo colabs):
  tf.image.resize bilinear without antialiasing, cast back to uint8 (interpolation 'tf_bilinear');
- 'open_clip': open_clip's SigLIP pretrained config (`_slpcfg`: bicubic, resize_mode 'squash', mean = std = 0.5):
  torchvision Resize((size, size), BICUBIC) of a PIL image = PIL bicubic, as 'hf'.
Random weights (tiny / random_init / abstract) use 'hf'. A converted file without its .json sidecar fails under
'auto' (the sidecar says which source it came from: guessing is how open_clip #1068 happened).

Weights: a safetensors file in HF SiglipVisionModel names without the `vision_model.` prefix
(`embeddings.patch_embedding.weight`, `encoder.layers.0.self_attn.q_proj.weight`, `post_layernorm.weight`,
`head.probe`, `head.attention.in_proj_weight`, ...), float32, default `$VISIM_JAX_WEIGHTS/<name>.safetensors`,
written once by `python -m visim_jax.backbones.convert --backbone=NAME --checkpoint=FILE` from an HF
model.safetensors (SiglipModel or SiglipVisionModel; the text tower is dropped), a big_vision .npz (img/ tower,
python-loop or scanned encoder blocks; renamed to the HF names, see siglip_layouts.npz_to_hf), or an open_clip / timm SigLIP
checkpoint (`visual.trunk.*` or timm's `vit_*_siglip_*` names; siglip_layouts.timm_to_hf).
"""
from __future__ import annotations

import dataclasses
import functools
import os
import re
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from visim_jax.core import readers
from visim_jax.backbones import weights as weights_lib
from visim_jax.backbones.base import Backbone, block_class
from visim_jax.backbones import siglip_layouts, vit
from visim_jax.backbones.vit import LN_EPS, Block, patch_embed
from visim_jax.core.errors import UserError
from visim_jax.data.preprocess import Preprocess


@dataclasses.dataclass(frozen=True)
class Arch:
  patch: int
  width: int
  depth: int
  heads: int
  mlp_dim: int
  image_size: int

  @property
  def grid(self) -> int:
    return self.image_size // self.patch


_B16 = dict(patch=16, width=768, depth=12, heads=12, mlp_dim=3072)
_SO400M = dict(width=1152, depth=27, heads=16, mlp_dim=4304)  # big_vision decode_variant('So400m')
ARCHS = {
    'siglip_b16_224': Arch(**_B16, image_size=224),
    'siglip_b16_256': Arch(**_B16, image_size=256),
    'siglip_b16_384': Arch(**_B16, image_size=384),
    'siglip_so400m14_384': Arch(patch=14, **_SO400M, image_size=384),
    'siglip2_b16_224': Arch(**_B16, image_size=224),
    'siglip2_b16_256': Arch(**_B16, image_size=256),
    'siglip2_b16_384': Arch(**_B16, image_size=384),
    'siglip2_so400m14_384': Arch(patch=14, **_SO400M, image_size=384),
    'siglip2_so400m16_384': Arch(patch=16, **_SO400M, image_size=384),
}
HUB_IDS = {
    'siglip_b16_224': 'google/siglip-base-patch16-224',
    'siglip_b16_256': 'google/siglip-base-patch16-256',
    'siglip_b16_384': 'google/siglip-base-patch16-384',
    'siglip_so400m14_384': 'google/siglip-so400m-patch14-384',
    'siglip2_b16_224': 'google/siglip2-base-patch16-224',
    'siglip2_b16_256': 'google/siglip2-base-patch16-256',
    'siglip2_b16_384': 'google/siglip2-base-patch16-384',
    'siglip2_so400m14_384': 'google/siglip2-so400m-patch14-384',
    'siglip2_so400m16_384': 'google/siglip2-so400m-patch16-384',
}
NPZ_FILES = {  # big_vision models/proj/image_text/two_towers.py VANITY_NAMES
    'siglip_b16_224': 'gs://big_vision/siglip/webli_en_b16_224_63724782.npz',
    'siglip_b16_256': 'gs://big_vision/siglip/webli_en_b16_256_60500360.npz',
    'siglip_b16_384': 'gs://big_vision/siglip/webli_en_b16_384_68578854.npz',
    'siglip_so400m14_384': 'gs://big_vision/siglip/webli_en_so400m_384_58765454.npz',
    'siglip2_b16_224': 'gs://big_vision/siglip2/siglip2_b16_224.npz',
    'siglip2_b16_256': 'gs://big_vision/siglip2/siglip2_b16_256.npz',
    'siglip2_b16_384': 'gs://big_vision/siglip2/siglip2_b16_384.npz',
    'siglip2_so400m14_384': 'gs://big_vision/siglip2/siglip2_so400m14_384.npz',
    'siglip2_so400m16_384': 'gs://big_vision/siglip2/siglip2_so400m16_384.npz',
}
TINY = Arch(patch=8, width=32, depth=2, heads=4, mlp_dim=48, image_size=32)  # 16 patches, 4 heads of 8
POOLING = {'map': ('pooled',), 'mean': ('mean',)}
SOURCES = ('hf', 'big_vision', 'open_clip')
HF_RESAMPLE = {2: 'bilinear', 3: 'bicubic'}  # PIL.Image.Resampling values in preprocessor_config.json


def preprocess_for(arch: Arch, source: str, interpolation: str | None = None) -> Preprocess:
  """Squash to the model's size, (x - 127.5) / 127.5; the kernel of the weight source (module docstring)."""
  if source not in SOURCES:
    raise UserError(f"config.backbone_kwargs.preprocessing: {source!r}; expected 'auto' (the converted file's "
                    "weight source), 'hf' (SiglipImageProcessor), 'big_vision' (resize|value_range(-1, 1)) or "
                    "'open_clip' (its SigLIP transform)")
  if interpolation is None:
    interpolation = 'tf_bilinear' if source == 'big_vision' else 'bicubic'
  return Preprocess(size=arch.image_size, resize='squash', mean=(127.5,) * 3, std=(127.5,) * 3,
                    interpolation=interpolation)


# ------------------------------------------------------------------------------------------------------ model

class MAPHead(nn.Module):
  """Multihead attention pooling: a learned probe attends to the tokens, then a residual MLP (module docstring)."""
  heads: int
  mlp_dim: int
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    n, t, c = x.shape
    d, hd = self.dtype, c // self.heads
    probe = self.param('probe', nn.initializers.normal(0.02), (1, 1, c)).astype(d)
    q = nn.Dense(c, dtype=d, name='q')(probe).reshape(self.heads, hd)
    k = nn.Dense(c, dtype=d, name='k')(x).reshape(n, t, self.heads, hd)
    v = nn.Dense(c, dtype=d, name='v')(x).reshape(n, t, self.heads, hd)
    logits = jnp.einsum('hd,nkhd->nhk', q * (hd ** -0.5), k).astype(jnp.float32)
    attn = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
    y = nn.Dense(c, dtype=d, name='out')(jnp.einsum('nhk,nkhd->nhd', attn, v).reshape(n, c))
    h = nn.Dense(self.mlp_dim, dtype=d, name='fc1')(nn.LayerNorm(epsilon=LN_EPS, dtype=d, name='norm')(y))
    return y + nn.Dense(c, dtype=d, name='fc2')(jax.nn.gelu(h, approximate=True))


class SiglipVisionTower(nn.Module):
  arch: Arch
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    a, d = self.arch, self.dtype
    x, grid = patch_embed(a, x, d)
    pos = self.param('pos_embed', nn.initializers.normal(0.02), (1, a.grid * a.grid, a.width))
    if grid != (a.grid, a.grid):
      raise UserError(f'SigLIP input {grid[0] * a.patch}px does not fit the {a.image_size}px position '
                       "embeddings; resize images to the backbone's preprocess.size")
    x = x + pos.astype(d)
    stages = {'embeddings': x}
    for i in range(a.depth):
      x = block_class(Block)(a.heads, dtype=d, mlp_dim=a.mlp_dim, tanh_gelu=True, name=f'blocks_{i}')(x)
      stages[f'block{i + 1}'] = x
    x = stages['tokens'] = nn.LayerNorm(epsilon=LN_EPS, dtype=d, name='norm')(x)
    stages['mean'] = x.mean(axis=1)
    pooled = stages['pooled'] = MAPHead(a.heads, a.mlp_dim, d, name='head')(x)
    return pooled, stages


def variable_shapes(arch: Arch) -> dict:
  x = jax.ShapeDtypeStruct((1, arch.image_size, arch.image_size, 3), jnp.float32)
  return jax.eval_shape(lambda x: SiglipVisionTower(arch).init(jax.random.PRNGKey(0), x), x)


# ------------------------------------------------------------------------------- weights (HF names, stored)

_LAYER = re.compile(r'encoder\.layers\.(\d+)\.(.+)$')
_IN_LAYER = {'layer_norm1': ('norm1',), 'layer_norm2': ('norm2',), 'self_attn.out_proj': ('attn', 'proj'),
             'self_attn.qkv': ('attn', 'qkv'), 'mlp.fc1': ('fc1',), 'mlp.fc2': ('fc2',)}
_TOP = {'embeddings.patch_embedding': ('patch_embed',), 'post_layernorm': ('norm',),
        'head.layernorm': ('head', 'norm'), 'head.mlp.fc1': ('head', 'fc1'), 'head.mlp.fc2': ('head', 'fc2'),
        'head.attention.out_proj': ('head', 'out'), 'head.q': ('head', 'q'), 'head.k': ('head', 'k'),
        'head.v': ('head', 'v')}


def _module_path(prefix: str, where: str) -> tuple[str, ...]:
  m = _LAYER.match(prefix)
  if m and m.group(2) in _IN_LAYER:
    return (f'blocks_{m.group(1)}',) + _IN_LAYER[m.group(2)]
  if prefix in _TOP:
    return _TOP[prefix]
  raise UserError(f'{where}: unexpected entry {prefix!r} for a SigLIP image tower')


def to_flax(sd: dict, where: str = 'weights') -> dict:
  """Stored tensors (HF names) -> flax {'params'}: q/k/v of each block fused into one qkv kernel (vit.Attention),
  the MAP head's fused in_proj split into q, k, v; position embeddings (P, C) -> (1, P, C)."""
  if any('/' in k for k in sd):
    raise UserError(f'{where}: a big_vision checkpoint (param paths with "/"): convert it once with '
                    '`python -m visim_jax.backbones.convert --backbone=NAME --checkpoint=FILE.npz`')
  sd = {k: np.asarray(v, np.float32) for k, v in sd.items()}
  special = {'embeddings.position_embedding.weight', 'head.probe', 'head.attention.in_proj_weight',
             'head.attention.in_proj_bias'}
  rest = {k: v for k, v in sd.items() if k not in special}
  for k in [k for k in rest if '.self_attn.q_proj.' in k]:
    leaf = k.rsplit('.', 1)[1]
    base = k[:-len(f'q_proj.{leaf}')]
    parts = [rest.pop(f'{base}{p}_proj.{leaf}', None) for p in 'qkv']
    if any(p is None for p in parts):
      raise UserError(f'{where}: {base}: q_proj / k_proj / v_proj {leaf} incomplete')
    rest[f'{base}qkv.{leaf}'] = np.concatenate(parts, axis=0)
  for leaf in ('weight', 'bias'):
    fused = sd.get(f'head.attention.in_proj_{leaf}')
    if fused is not None:
      for p, part in zip('qkv', np.split(fused, 3, axis=0)):
        rest[f'head.{p}.{leaf}'] = part
  leftover = sorted(k for k in rest if re.search(r'\.self_attn\.[kv]_proj\.', k))
  if leftover:
    raise UserError(f'{where}: {leftover[0]} without its q_proj')
  variables = weights_lib.torch_to_flax(rest, functools.partial(_module_path, where=where), where)
  params = variables['params']
  if 'embeddings.position_embedding.weight' in sd:
    params['pos_embed'] = sd['embeddings.position_embedding.weight'][None]
  if 'head.probe' in sd:
    params.setdefault('head', {})['probe'] = sd['head.probe'].reshape(1, 1, -1)
  return variables


def _hf_preprocessing(where: str, arch: Arch) -> dict:
  """{'interpolation'} from preprocessor_config.json beside an HF checkpoint (SiglipImageProcessor's defaults when
  there is none); fails on a processor that is not SigLIP's fixed-size squash to [-1, 1]."""
  path = os.path.join(os.path.dirname(os.path.abspath(where)), 'preprocessor_config.json')
  if not os.path.isfile(path):
    return {'interpolation': 'bicubic', 'processor': 'SiglipImageProcessor defaults (no preprocessor_config.json)'}
  cfg = readers.read_json(path, dict, 'preprocessor_config.json')
  resample = cfg.get('resample', 3)
  size = cfg.get('size', {'height': arch.image_size, 'width': arch.image_size})
  problems = []
  if resample not in HF_RESAMPLE:
    problems.append(f'resample {resample} (expected 2 bilinear or 3 bicubic)')
  if (size.get('height'), size.get('width')) != (arch.image_size, arch.image_size):
    problems.append(f'size {size} (expected {arch.image_size} x {arch.image_size})')
  for key in ('image_mean', 'image_std'):
    if not np.allclose(cfg.get(key, [0.5] * 3), 0.5):
      problems.append(f'{key} {cfg.get(key)} (expected 0.5)')
  if not cfg.get('do_resize', True) or 'max_num_patches' in cfg:
    problems.append('not a fixed-size resize (a NaFlex processor?)')
  if problems:
    raise UserError(f'{path}: not a SigLIP FixRes image processor: {"; ".join(problems)}')
  return {'interpolation': HF_RESAMPLE[resample], 'processor': path}


def prepare_state_dict(name: str, sd: dict, where: str, tiny: bool = False) -> tuple[dict, dict]:
  """A raw checkpoint (HF model.safetensors, big_vision .npz, open_clip / timm) -> (the image tower in HF names,
  sidecar info {'architecture', 'weights_source', 'interpolation'}); fails, naming the file, unless it fits NAME."""
  arch = _arch(name, tiny)
  if any('/' in k for k in sd):  # big_vision's flattened param paths; HF names are dotted
    out, source, extra = siglip_layouts.npz_to_hf(sd, where), 'big_vision', {'interpolation': 'tf_bilinear'}
  elif any(k.endswith('attn_pool.latent') for k in sd):  # timm's VisionTransformer (open_clip's SigLIP trunk)
    out, source, extra = siglip_layouts.timm_to_hf(sd, where), 'open_clip', {'interpolation': 'bicubic'}
  else:
    out = {}
    for k, v in sd.items():
      if k.startswith('vision_model.'):
        k = k[len('vision_model.'):]
      elif k.startswith(('text_model.', 'logit_scale', 'logit_bias')):
        continue
      if k.endswith('position_ids'):
        continue
      out[k] = np.ascontiguousarray(np.asarray(v, np.float32))
    if not any(k.startswith('encoder.layers.') for k in out):
      raise UserError(f'{where}: no SigLIP image tower (HF vision_model.*, big_vision img/, open_clip '
                      'visual.trunk.* entries) found')
    source, extra = 'hf', None
  weights_lib.check_fits(to_flax(out, where), variable_shapes(arch), name, where)
  extra = extra or _hf_preprocessing(where, arch)  # after the architecture check: that error comes first
  return out, {'architecture': dataclasses.asdict(arch), 'weights_source': source, **extra}


def _arch(name: str, tiny: bool) -> Arch:
  if name not in ARCHS:
    raise UserError(f'config.backbone: {name!r} is not a SigLIP image tower; known: {", ".join(ARCHS)}')
  return TINY if tiny else ARCHS[name]


def _recorded_preprocessing(path: str, name: str) -> tuple[str, str]:
  """(source, interpolation) recorded in the sidecar of a converted file."""
  sidecar = path + '.json'
  if not os.path.isfile(sidecar):
    raise UserError(f'{path}: its sidecar {sidecar} is missing: it records whether the weights came from Hugging '
                    'Face, big_vision or open_clip, which decides the resize kernel; convert again, or pass '
                    "preprocessing='hf', 'big_vision' or 'open_clip'")
  info = readers.read_json(sidecar, dict, 'weights sidecar')
  source = info.get('weights_source')
  if source not in SOURCES:
    raise UserError(f'{sidecar}: no weights_source (hf / big_vision / open_clip) recorded for {name}; convert '
                    f'again with `{weights_lib.convert_command(name)}`')
  return source, info.get('interpolation')


def siglip_backbone(name: str, weights: str | None = None, random_init: int | None = None, tiny: bool = False,
                    layers: str | Sequence[str] | None = None, pooling: str = 'map', preprocessing: str = 'auto',
                    abstract: bool = False) -> Backbone:
  """A registered SigLIP / SigLIP 2 image tower: converted weights (offline), `random_init=SEED`, `tiny=True`, or
  `abstract=True` (no weights: jax.eval_shape size checks). pooling: 'map' | 'mean'; preprocessing:
  'auto' | 'hf' | 'big_vision' | 'open_clip' (module docstring)."""
  arch = _arch(name, tiny)
  if pooling not in POOLING:
    raise UserError(f"config.backbone_kwargs.pooling: {pooling!r} for {name}; expected 'map' (the MAP head, "
                    "default) or 'mean' (mean of the patch tokens); SigLIP has no CLS token")
  variables, weights_id, where = weights_lib.family_variables(
      name, weights=weights, random_init=random_init, tiny=tiny, abstract=abstract,
      init=SiglipVisionTower(arch).init, image_size=arch.image_size, to_flax=to_flax,
      shapes=lambda: variable_shapes(arch))
  interpolation = None
  if preprocessing == 'auto':
    if weights_id.startswith(('random:', 'abstract')):
      preprocessing = 'hf'
    else:
      preprocessing, interpolation = _recorded_preprocessing(where, name)
  pre = preprocess_for(arch, preprocessing, interpolation)
  stages = ['embeddings'] + [f'block{i + 1}' for i in range(arch.depth)] + ['tokens', 'mean', 'pooled']
  layers = weights_lib.parse_layers(name, layers, POOLING[pooling], stages)
  source = f'{HUB_IDS[name]} / {NPZ_FILES[name].rsplit("/", 1)[1]}'
  return Backbone(
      name=name,
      apply_fn=functools.partial(vit.apply_vit_init if abstract else vit.apply_vit, arch, module=SiglipVisionTower),
      variables=variables,
      preprocess=pre,
      layers=layers,
      weights_id=weights_id,
      labels=None,
      description=f'SigLIP image tower {source} [{where}; preprocessing {preprocessing} ({pre.interpolation}); '
                  f'pooling {pooling}]',
  )
