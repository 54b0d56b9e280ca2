"""CLIP's ModifiedResNet image towers (RN50, RN101, RN50x4, RN50x16, RN50x64) in Flax.

Architecture (Radford et al. 2021, "Learning Transferable Visual Models From Natural Language Supervision",
Sec. 2.4, and the OpenAI model card), as opposed to a torchvision ResNet:
- a stem of three 3x3 convolutions (stride 2, then 1, 1; widths w/2, w/2, w) each with BatchNorm + ReLU, then a
  2x2 average pool (no max pool);
- anti-aliased strided bottlenecks: the stride is a 2x2 average pool placed *before* the last 1x1 conv (after the
  3x3 conv), and the downsampling shortcut is avgpool -> 1x1 conv -> BatchNorm;
- the global average pool is replaced by attention pooling: one query (the spatial mean, plus position embedding)
  attends over the HW + 1 tokens with multi-head QKV attention, then an output projection (c_proj).
Widths: stage planes w, 2w, 4w, 8w (x4 expansion); heads = 32 w / 64; input size 224 (RN50, RN101), 288 (RN50x4),
384 (RN50x16), 448 (RN50x64). BatchNorm eps 1e-5.

Stages returned: 'stem' (after the average pool), 'stage1'..'stage4' (the four residual layers, NHWC) and
'attnpool' (N, output_dim): what paper 001 pools for clip_rn50 / clip_rn101 / clip_rn50x4 (Table 1: 3840 + 1024
= 4864, 3840 + 512 = 4352, 4800 + 640 = 5440 dims). Default layers: those five. `final` = 'attnpool' (the CLIP
image embedding).

Weights: a safetensors (or npz) file of the visual tower in PyTorch names and layouts (`conv1.weight`,
`layer1.0.downsample.0.weight`, `attnpool.q_proj.weight`, ...; a leading `visual.` is accepted), written once by
`python -m visim_jax.backbones.convert --backbone=NAME --checkpoint=FILE` from an OpenAI or open_clip checkpoint; its sha256 is checked against the
sidecar JSON (`<file>.json`) when present. Nothing is unpickled here. Default file:
`$VISIM_JAX_WEIGHTS/<name>.safetensors` (see weights.py).
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

from visim_jax.backbones import weights as weights_lib
from visim_jax.backbones.base import Backbone, block_class
from visim_jax.core.errors import UserError
from visim_jax.data.preprocess import Preprocess

CLIP_MEAN = tuple(255.0 * v for v in (0.48145466, 0.4578275, 0.40821073))
CLIP_STD = tuple(255.0 * v for v in (0.26862954, 0.26130258, 0.27577711))


@dataclasses.dataclass(frozen=True)
class Arch:
  layers: tuple[int, int, int, int]
  width: int
  output_dim: int
  image_size: int

  @property
  def heads(self) -> int:
    return self.width * 32 // 64


ARCHS = {
    'clip_rn50': Arch((3, 4, 6, 3), 64, 1024, 224),
    'clip_rn101': Arch((3, 4, 23, 3), 64, 512, 224),
    'clip_rn50x4': Arch((4, 6, 10, 6), 80, 640, 288),
    'clip_rn50x16': Arch((6, 8, 18, 8), 96, 768, 384),
    'clip_rn50x64': Arch((3, 15, 36, 10), 128, 1024, 448),
}
TINY = Arch((1, 2, 1, 1), 8, 16, 64)  # heads 4, attention over 2x2 + 1 tokens
DEFAULT_LAYERS = ('stage1', 'stage2', 'stage3', 'stage4', 'attnpool')


def _bn(name, dtype):
  return nn.BatchNorm(use_running_average=True, epsilon=1e-5, dtype=dtype, name=name)


def _conv(features, kernel, name, dtype):
  pad = kernel // 2
  return nn.Conv(features, (kernel, kernel), padding=((pad, pad), (pad, pad)), use_bias=False, dtype=dtype, name=name)


def _avg_pool(x, s):
  return nn.avg_pool(x, (s, s), strides=(s, s)) if s > 1 else x


class Bottleneck(nn.Module):
  planes: int
  stride: int = 1
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    d = self.dtype
    out = nn.relu(_bn('bn1', d)(_conv(self.planes, 1, 'conv1', d)(x)))
    out = nn.relu(_bn('bn2', d)(_conv(self.planes, 3, 'conv2', d)(out)))
    out = _avg_pool(out, self.stride)
    out = _bn('bn3', d)(_conv(self.planes * 4, 1, 'conv3', d)(out))
    identity = x
    if self.stride > 1 or x.shape[-1] != self.planes * 4:
      identity = _bn('downsample_bn', d)(_conv(self.planes * 4, 1, 'downsample_conv', d)(_avg_pool(x, self.stride)))
    return nn.relu(out + identity)


class AttentionPool(nn.Module):
  """Multi-head attention of the mean token over [mean; HW tokens] + learned positions, then c_proj."""
  num_heads: int
  output_dim: int
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    n, h, w, c = x.shape
    x = x.reshape(n, h * w, c)
    x = jnp.concatenate([x.mean(axis=1, keepdims=True), x], axis=1)
    pos = self.param('positional_embedding', nn.initializers.normal(c ** -0.5), (h * w + 1, c))
    x = x + pos.astype(x.dtype)[None]
    dense = functools.partial(nn.Dense, dtype=self.dtype)
    hd = c // self.num_heads
    q = dense(c, name='q_proj')(x[:, :1]).reshape(n, 1, self.num_heads, hd)
    k = dense(c, name='k_proj')(x).reshape(n, h * w + 1, self.num_heads, hd)
    v = dense(c, name='v_proj')(x).reshape(n, h * w + 1, self.num_heads, hd)
    logits = jnp.einsum('nqhd,nkhd->nhqk', q * (hd ** -0.5), k).astype(jnp.float32)
    attn = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
    out = jnp.einsum('nhqk,nkhd->nqhd', attn, v).reshape(n, c)
    return dense(self.output_dim, name='c_proj')(out)


class ModifiedResNet(nn.Module):
  layers: tuple[int, int, int, int]
  width: int
  output_dim: int
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    d, w = self.dtype, self.width
    x = x.astype(d)
    stages = {}
    x = nn.relu(_bn('bn1', d)(nn.Conv(w // 2, (3, 3), (2, 2), padding=((1, 1), (1, 1)), use_bias=False, dtype=d,
                                      name='conv1')(x)))
    x = nn.relu(_bn('bn2', d)(_conv(w // 2, 3, 'conv2', d)(x)))
    x = nn.relu(_bn('bn3', d)(_conv(w, 3, 'conv3', d)(x)))
    x = _avg_pool(x, 2)
    stages['stem'] = x
    for i, blocks in enumerate(self.layers):
      planes = w * 2 ** i
      for j in range(blocks):
        x = block_class(Bottleneck)(planes, (1 if i == 0 else 2) if j == 0 else 1, d, name=f'layer{i + 1}_{j}')(x)
      stages[f'stage{i + 1}'] = x
    out = AttentionPool(w * 32 // 64, self.output_dim, d, name='attnpool')(x)
    stages['attnpool'] = out
    return out, stages


def apply_clip_resnet(arch: Arch, variables, x):
  """Pure (final, stages) of the ModifiedResNet on a normalised NHWC batch, computed at x.dtype."""
  return ModifiedResNet(arch.layers, arch.width, arch.output_dim, x.dtype).apply(variables, x)


# ------------------------------------------------------------------------------------ weights (PyTorch names)

def strip_prefix(sd: dict) -> dict:
  """The visual tower's entries of a CLIP state dict: keys under 'visual.' (a 'module.' prefix dropped first), or
  every key when none is under 'visual.' (already a visual-only dict)."""
  sd = {(k[len('module.'):] if k.startswith('module.') else k): v for k, v in sd.items()}
  if any(k.startswith('visual.') for k in sd):
    return {k[len('visual.'):]: v for k, v in sd.items() if k.startswith('visual.')}
  return dict(sd)


def infer_arch(sd: dict, where: str = 'weights') -> Arch:
  """Layers / width / output dim / input size of a ModifiedResNet state dict (visual prefix stripped)."""
  try:
    layers = tuple(len({k.split('.')[1] for k in sd if k.startswith(f'layer{b}.')}) for b in (1, 2, 3, 4))
    width = int(sd['layer1.0.conv1.weight'].shape[0])
    output_dim = int(sd['attnpool.c_proj.weight'].shape[0])
    grid = int(round((sd['attnpool.positional_embedding'].shape[0] - 1) ** 0.5))
  except KeyError as e:
    raise UserError(f'{where}: not a CLIP ModifiedResNet visual state dict (missing {e}); ViT CLIP models are '
                     'loaded through the HF family clip_vit_*') from None
  if min(layers) < 1:
    raise UserError(f'{where}: not a CLIP ModifiedResNet (residual layers {layers})')
  return Arch(layers, width, output_dim, grid * 32)


def convert_state_dict(sd: dict, where: str = 'weights') -> dict:
  """PyTorch-named visual weights -> flax variables {'params', 'batch_stats'} (conv OIHW -> HWIO, linear W -> W.T)."""
  params, stats = {}, {}

  def put(tree, path, value):
    for p in path[:-1]:
      tree = tree.setdefault(p, {})
    tree[path[-1]] = np.asarray(value, np.float32)

  for key, v in sd.items():
    v = np.asarray(v)
    if key.endswith('num_batches_tracked'):
      continue
    m = re.fullmatch(r'layer(\d)\.(\d+)\.(.+)', key)
    path = [f'layer{m.group(1)}_{m.group(2)}'] + m.group(3).split('.') if m else key.split('.')
    if path[-3:-1] == ['downsample', '0']:
      path = path[:-3] + ['downsample_conv', path[-1]]
    elif path[-3:-1] == ['downsample', '1']:
      path = path[:-3] + ['downsample_bn', path[-1]]
    module, leaf = path[-2] if len(path) > 1 else '', path[-1]
    if module.startswith('bn') or module == 'downsample_bn':
      tree, name = {'weight': (params, 'scale'), 'bias': (params, 'bias'), 'running_mean': (stats, 'mean'),
                    'running_var': (stats, 'var')}[leaf]
      put(tree, path[:-1] + [name], v)
    elif leaf == 'positional_embedding':
      put(params, path, v)
    elif module.endswith('_proj'):
      put(params, path[:-1] + ['kernel' if leaf == 'weight' else 'bias'], v.T if leaf == 'weight' else v)
    elif leaf == 'weight' and v.ndim == 4:
      put(params, path[:-1] + ['kernel'], np.transpose(v, (2, 3, 1, 0)))
    else:
      raise UserError(f'{where}: unexpected entry {key} {v.shape} for a CLIP ModifiedResNet')
  return {'params': params, 'batch_stats': stats}


# one copy of each: the readers every converted-weights family uses (weights.py)
read_weights = weights_lib.read_tensors
check_sidecar = weights_lib.check_sidecar


def _module_shapes(arch: Arch):
  x = jax.ShapeDtypeStruct((1, arch.image_size, arch.image_size, 3), jnp.float32)
  model = ModifiedResNet(arch.layers, arch.width, arch.output_dim)
  return model, jax.eval_shape(lambda x: model.init(jax.random.PRNGKey(0), x), x)


def load_variables(path: str, want: Arch, name: str) -> tuple[dict, str]:
  if not os.path.isfile(path):
    raise FileNotFoundError(
        f'{name}: weights file {path} not found. Convert an OpenAI/open_clip checkpoint once: '
        f'`python -m visim_jax.backbones.convert --backbone={name} --checkpoint=RN50.pt --out={path}` (default location '
        f'{weights_lib.default_location(name)}.safetensors; set VISIM_JAX_WEIGHTS to move it), or pass '
        'weights=/path/to/file.safetensors; for tests use tiny=True or random_init=SEED')
  digest = check_sidecar(path)
  sd = strip_prefix(read_weights(path))
  arch = infer_arch(sd, path)
  if arch != want:
    raise UserError(f'{name}: {path} holds a different CLIP ResNet ({arch}); {name} is {want}')
  variables = convert_state_dict(sd, path)
  _, shapes = _module_shapes(arch)
  got = jax.tree.map(lambda a: a.shape, variables)
  expected = jax.tree.map(lambda a: tuple(a.shape), dict(shapes))
  if got != expected:
    raise UserError(f'{name}: {path}: converted weights do not fit the architecture {arch}')
  return variables, digest


def clip_resnet(name: str, weights: str | None = None, random_init: int | None = None, tiny: bool = False,
                layers: str | Sequence[str] | None = None) -> Backbone:
  """A CLIP ResNet backbone: converted weights (offline), `random_init=SEED`, or `tiny=True` (random, tiny)."""
  if name not in ARCHS:
    raise UserError(f'unknown CLIP ResNet {name!r}; known: {", ".join(ARCHS)}')
  if weights is not None and random_init is not None:
    raise UserError(f'{name}: weights= and random_init= are exclusive')
  arch = TINY if tiny else ARCHS[name]
  if weights is None and (tiny or random_init is not None):
    seed = 0 if random_init is None else int(random_init)
    model, _ = _module_shapes(arch)
    x = jnp.zeros((1, arch.image_size, arch.image_size, 3))
    variables = weights_lib.random_variables(lambda key: model.init(key, x), seed)
    weights_id = f'random:{seed}' + (':tiny' if tiny else '')
    where = f'random weights, seed {seed}{", tiny config" if tiny else ""}'
  else:
    path = os.path.expanduser(weights) if weights else weights_lib.default_location(name) + '.safetensors'
    variables, weights_id = load_variables(path, arch, name)
    where = path
  if isinstance(layers, str):
    layers = [l.strip() for l in layers.split(',') if l.strip()]
  layers = tuple(layers) if layers else DEFAULT_LAYERS
  unknown = set(layers) - {'stem', 'stage1', 'stage2', 'stage3', 'stage4', 'attnpool'}
  if unknown:
    raise UserError(f'{name}: layers={sorted(unknown)} unknown; stages: stem, stage1..stage4, attnpool')
  return Backbone(
      name=name,
      apply_fn=functools.partial(apply_clip_resnet, arch),
      variables=variables,
      preprocess=Preprocess(size=arch.image_size, resize='shorter_crop', resize_to=arch.image_size, mean=CLIP_MEAN,
                            std=CLIP_STD, interpolation='bicubic'),
      layers=layers,
      weights_id=weights_id,
      labels=None,
      description=f'CLIP {name[5:].upper()} image tower (ModifiedResNet, attention pool) [{where}]',
  )
