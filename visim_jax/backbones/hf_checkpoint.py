"""A Hugging Face checkpoint folder read by key, without transformers: the weight file in any of its three formats,
config.json, and the keys of the five families hf.py builds (CLIP vision, ViT, DINOv2, ResNet, RegNet).

- Formats (`load_state`): flax_model.msgpack (msgpack, no pickle), model.safetensors, pytorch_model.bin (core.safe_pickle's
  restricted unpickler, no torch), preferred in that order in a folder (`state_file`: the flax file first, as the
  transformers-Flax version of hf.py did, so a folder's weights_id = that file's sha256 is unchanged). All three become
  {PyTorch key: array in PyTorch layout}: transformers' Flax modules name their parameters as the PyTorch ones (the
  key split on '.'; checked for these five families against transformers 4.57's own PyTorch -> Flax conversion,
  tests/test_backbones_hf.py), with kernel / scale / embedding for 'weight' and BatchNorm statistics in batch_stats.
- config.json (`read_config`): plain JSON over the config class's defaults (`DEFAULTS`: save_pretrained writes only
  the fields that differ from them); a CLIPModel config's image tower is its `vision_config`.
- Keys (`checkpoint_keys`): the base model's parameters as transformers' PyTorch model of the config names them,
  with shapes; a checkpoint of the model with a head (ViTForImageClassification, ResNetForImageClassification, ...)
  or of both CLIP towers holds them under a prefix ('vit.', 'resnet.', 'vision_model.', ...: `PREFIXES`), picked by
  key; heads, text towers and DINOv2's unused mask token are ignored. `variables_from_state` checks every key and
  shape, then converts: CLIP / ViT / DINOv2 to vit.py's names (q, k, v fused into qkv, rows q, k, v) and its
  `to_flax`; ResNet / RegNet by `weights.torch_to_flax` onto hf_resnet.py's mirrored module names.
- Random weights (`random_state`): weights.random_variables over the tree transformers' Flax port of the config had
  (the keys split on '.', Flax leaf names and layouts), then converted like a file: `random_init=SEED` gives the same
  numbers as the transformers-Flax version of hf.py did.
"""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np

from visim_jax.backbones import hf_resnet, vit
from visim_jax.backbones import weights as weights_lib
from visim_jax.core.errors import UserError

VIT_LIKE = ('clip', 'vit', 'dinov2')

# the defaults of transformers' config classes (CLIPVisionConfig, ViTConfig, Dinov2Config, ResNetConfig,
# RegNetConfig; the same in 4.57 and 5.x) for the fields used here: save_pretrained writes only the fields that
# differ from them, so a config.json is read over these
DEFAULTS: dict[str, dict] = {
    'clip': dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                 num_channels=3, image_size=224, patch_size=32, hidden_act='quick_gelu', layer_norm_eps=1e-5),
    'vit': dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                num_channels=3, image_size=224, patch_size=16, hidden_act='gelu', layer_norm_eps=1e-12, qkv_bias=True),
    'dinov2': dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, mlp_ratio=4, num_channels=3,
                   image_size=224, patch_size=14, hidden_act='gelu', layer_norm_eps=1e-6, qkv_bias=True,
                   use_swiglu_ffn=False),
    'resnet': dict(num_channels=3, embedding_size=64, hidden_sizes=[256, 512, 1024, 2048], depths=[3, 4, 6, 3],
                   layer_type='bottleneck', hidden_act='relu', downsample_in_first_stage=False,
                   downsample_in_bottleneck=False),
    'regnet': dict(num_channels=3, embedding_size=32, hidden_sizes=[128, 192, 512, 1088], depths=[2, 6, 12, 2],
                   groups_width=64, layer_type='y', hidden_act='relu', downsample_in_first_stage=True),
}
MODEL_TYPES = {'clip': ('clip', 'clip_vision_model'), 'vit': ('vit',), 'dinov2': ('dinov2',), 'resnet': ('resnet',),
               'regnet': ('regnet',)}
# the base model's key prefix in a checkpoint of the model with a head / of both CLIP towers ('' = the base model's)
PREFIXES = {'clip': ('vision_model.', ''), 'vit': ('vit.', ''), 'dinov2': ('dinov2.', ''), 'resnet': ('resnet.', ''),
            'regnet': ('regnet.', '')}
STATE_FILES = ('flax_model.msgpack', 'model.safetensors', 'pytorch_model.bin')
_OPTIONAL = ('embeddings.mask_token',)  # DINOv2's masked-image-modelling token: in the model, unused for features



# ---------------------------------------------------------------------------------------------- checkpoint files

def state_file(folder: str) -> str:
  """The weight file of a save_pretrained / hub snapshot folder: the first of STATE_FILES present (the flax msgpack
  first, as before, so a folder holding several keeps its weights_id)."""
  for f in STATE_FILES:
    path = os.path.join(folder, f)
    if os.path.isfile(path):
      return path
  raise FileNotFoundError(f'{folder}: none of {", ".join(STATE_FILES)} found')


def _flax_to_torch(state: dict) -> dict[str, np.ndarray]:
  """A transformers Flax checkpoint's tree -> {PyTorch key: array in PyTorch layout}: transformers' Flax modules name
  their parameters as the PyTorch ones (a path joined with '.'), with kernel (Dense: (in, out); Conv: HWIO),
  scale (norms) and embedding (nn.Embed) for 'weight', and BatchNorm statistics in 'batch_stats' as mean / var."""
  from flax.traverse_util import flatten_dict  # pylint: disable=g-import-not-at-top
  cols = state if isinstance(state.get('params'), dict) else {'params': state}
  out = {}
  for col, tree in cols.items():
    if not isinstance(tree, dict):
      continue
    for path, v in flatten_dict(tree).items():
      v, leaf = np.asarray(v), path[-1]
      if col == 'batch_stats':
        leaf = {'mean': 'running_mean', 'var': 'running_var'}.get(leaf, leaf)
      elif leaf == 'kernel':
        leaf, v = 'weight', (v.transpose(3, 2, 0, 1) if v.ndim == 4 else v.T)
      elif leaf in ('scale', 'embedding'):
        leaf = 'weight'
      out['.'.join(tuple(path[:-1]) + (leaf,))] = v
  return out


def load_state(path: str) -> dict[str, np.ndarray]:
  """{PyTorch key: array in PyTorch layout} of an HF checkpoint (a file, or a folder: its `state_file`), whichever of
  flax_model.msgpack, model.safetensors or pytorch_model.bin; heads and text towers kept (picked by key later)."""
  from visim_jax.core import readers  # pylint: disable=g-import-not-at-top
  path = os.fspath(path)
  if os.path.isdir(path):
    path = state_file(path)
  if path.endswith('.msgpack'):
    from flax import serialization  # pylint: disable=g-import-not-at-top
    with open(path, 'rb') as f:
      data = f.read()
    try:
      state = serialization.msgpack_restore(data)
      if not isinstance(state, dict):
        raise ValueError(f'holds a {type(state).__name__}, not a parameter tree')
      return _flax_to_torch(state)
    except Exception as e:  # noqa: BLE001: truncated / not msgpack
      raise UserError(f'{path}: not a readable flax msgpack file ({type(e).__name__}: '
                      f'{" ".join(str(e).split())[:120]}); download it again') from None
  if path.endswith('.safetensors'):
    return readers.read_safetensors(path)
  if path.endswith('.bin'):
    return readers.read_torch(path)
  raise UserError(f'{path}: expected one of {", ".join(STATE_FILES)}')


# -------------------------------------------------------------------------------------------------- configs

def family_config(family: str, fields: dict) -> dict:
  """The config class's defaults updated by `fields` (config.json or a Spec), checked for what the modules build."""
  cfg = dict(DEFAULTS[family], **fields)
  if family == 'regnet':
    cfg['downsample_in_first_stage'] = True  # transformers 4.57 forces it whatever config.json says
  unsupported = []
  if cfg.get('num_channels', 3) != 3:
    unsupported.append(f'num_channels={cfg["num_channels"]}')
  if family in VIT_LIKE:
    if cfg['hidden_act'] not in ('gelu', 'quick_gelu'):
      unsupported.append(f'hidden_act={cfg["hidden_act"]!r}')
    if not cfg.get('qkv_bias', True):
      unsupported.append('qkv_bias=false')
    if cfg.get('use_swiglu_ffn'):
      unsupported.append('use_swiglu_ffn=true')
    if family != 'dinov2' and cfg['intermediate_size'] % cfg['hidden_size']:
      unsupported.append(f'intermediate_size={cfg["intermediate_size"]} (not a multiple of hidden_size)')
    if family == 'dinov2' and float(cfg['mlp_ratio']) != int(cfg['mlp_ratio']):
      unsupported.append(f'mlp_ratio={cfg["mlp_ratio"]}')
  elif cfg['hidden_act'] != 'relu':
    unsupported.append(f'hidden_act={cfg["hidden_act"]!r}')
  if unsupported:
    raise UserError(f'{family} config: {", ".join(unsupported)} is not supported by visim_jax\'s {family} module')
  return cfg


def read_config(folder: str, family: str, name: str = '') -> dict:
  """config.json of a save_pretrained folder, as plain JSON over the family's defaults (CLIP: its vision_config)."""
  from visim_jax.core import readers  # pylint: disable=g-import-not-at-top
  path = os.path.join(folder, 'config.json')
  d = readers.read_json(path, dict, 'config.json')
  if family == 'clip' and d.get('model_type', 'clip') == 'clip':
    d = d.get('vision_config') or {}
    if not isinstance(d, dict):
      raise UserError(f'{path}: vision_config is a JSON {type(d).__name__}; expected an object')
    d = dict(d, model_type=d.get('model_type', 'clip_vision_model'))
  model_type = d.get('model_type')
  if model_type is not None and model_type not in MODEL_TYPES[family]:
    raise UserError(f'{path}: model_type {model_type!r} is not a {family} model; {name or family} expects '
                    f'{" or ".join(repr(t) for t in MODEL_TYPES[family])}')
  fields = {k: d[k] for k in DEFAULTS[family] if k in d}
  try:
    return family_config(family, fields)
  except UserError as e:
    raise UserError(f'{path}: {e}') from None


def vit_arch(family: str, cfg: dict) -> vit.Arch:
  """vit.py's Arch of a CLIP vision / ViT / DINOv2 config (the position-embedding grid of cfg['image_size'])."""
  c = cfg['hidden_size']
  ratio = int(cfg['mlp_ratio']) if family == 'dinov2' else cfg['intermediate_size'] // c
  common = dict(patch=int(cfg['patch_size']), width=c, depth=cfg['num_hidden_layers'],
                heads=cfg['num_attention_heads'], image_size=int(cfg['image_size']), mlp_ratio=ratio,
                ln_eps=float(cfg['layer_norm_eps']), act=cfg['hidden_act'])
  if family == 'clip':
    return vit.Arch(**common, ln_pre=True, patch_bias=False)
  return vit.Arch(**common, layer_scale=family == 'dinov2')


def convnet_arch(family: str, cfg: dict) -> hf_resnet.Arch:
  return hf_resnet.Arch(family, int(cfg['embedding_size']), tuple(cfg['hidden_sizes']), tuple(cfg['depths']),
                          cfg['layer_type'], bool(cfg['downsample_in_first_stage']),
                          bool(cfg.get('downsample_in_bottleneck', False)), int(cfg.get('groups_width', 64)))


# --------------------------------------------------------------------------------------- keys of the checkpoints

def _vit_like_keys(family: str, cfg: dict) -> dict[str, tuple[int, ...]]:
  """{key: PyTorch shape} of the base model's parameters (prefix removed), for CLIP vision / ViT / DINOv2."""
  c, p, depth = cfg['hidden_size'], int(cfg['patch_size']), cfg['num_hidden_layers']
  n = (int(cfg['image_size']) // p) ** 2 + 1
  hidden = c * int(cfg['mlp_ratio']) if family == 'dinov2' else cfg['intermediate_size']
  ln = lambda k: {f'{k}.weight': (c,), f'{k}.bias': (c,)}  # noqa: E731
  lin = lambda k, o, i: {f'{k}.weight': (o, i), f'{k}.bias': (o,)}  # noqa: E731
  if family == 'clip':
    keys = {'embeddings.class_embedding': (c,), 'embeddings.patch_embedding.weight': (c, 3, p, p),
            'embeddings.position_embedding.weight': (n, c), **ln('pre_layrnorm')}
    for i in range(depth):
      b = f'encoder.layers.{i}.'
      for t in ('q', 'k', 'v', 'out'):
        keys.update(lin(f'{b}self_attn.{t}_proj', c, c))
      keys.update({**ln(b + 'layer_norm1'), **ln(b + 'layer_norm2'), **lin(b + 'mlp.fc1', hidden, c),
                   **lin(b + 'mlp.fc2', c, hidden)})
    keys.update(ln('post_layernorm'))
    return keys
  keys = {'embeddings.cls_token': (1, 1, c), 'embeddings.position_embeddings': (1, n, c),
          'embeddings.patch_embeddings.projection.weight': (c, 3, p, p),
          'embeddings.patch_embeddings.projection.bias': (c,)}
  if family == 'dinov2':
    keys['embeddings.mask_token'] = (1, c)
  for i in range(depth):
    b = f'encoder.layer.{i}.'
    for t in ('query', 'key', 'value'):
      keys.update(lin(f'{b}attention.attention.{t}', c, c))
    keys.update(lin(b + 'attention.output.dense', c, c))
    if family == 'vit':
      keys.update({**ln(b + 'layernorm_before'), **ln(b + 'layernorm_after'),
                   **lin(b + 'intermediate.dense', hidden, c), **lin(b + 'output.dense', c, hidden)})
    else:
      keys.update({**ln(b + 'norm1'), **ln(b + 'norm2'), **lin(b + 'mlp.fc1', hidden, c),
                   **lin(b + 'mlp.fc2', c, hidden), f'{b}layer_scale1.lambda1': (c,),
                   f'{b}layer_scale2.lambda1': (c,)})
  keys.update(ln('layernorm'))
  return keys


def _convnet_shapes(arch: hf_resnet.Arch) -> dict:
  x = jax.ShapeDtypeStruct((1, 64, 64, 3), jnp.float32)
  return dict(jax.eval_shape(lambda x: hf_resnet.ConvNet(arch).init(jax.random.PRNGKey(0), x), x))


def module_shapes(family: str, cfg: dict) -> dict:
  """The family module's variable tree as shapes (no weights): what a backbone holds under weights.shapes_only()."""
  if family in VIT_LIKE:
    return dict(vit.variable_shapes(vit_arch(family, cfg)))
  return _convnet_shapes(convnet_arch(family, cfg))


def _convnet_keys(arch: hf_resnet.Arch) -> dict[str, tuple[int, ...]]:
  """{key: PyTorch shape} of an HF ResNet / RegNet base model (prefix removed), from the module's own tree (its
  names mirror the keys; hf_resnet.torch_key)."""
  from flax.traverse_util import flatten_dict  # pylint: disable=g-import-not-at-top
  keys = {}
  for (col, *path, leaf), sd in flatten_dict(_convnet_shapes(arch)).items():
    shape = tuple(sd.shape)
    if col == 'batch_stats':
      leaf = 'running_' + leaf
    elif leaf == 'kernel':
      leaf, shape = 'weight', shape[::-1][:2] + shape[:2]
    elif leaf == 'scale':
      leaf = 'weight'
    keys[f'{hf_resnet.torch_key(tuple(path))}.{leaf}'] = shape
  return keys


def checkpoint_keys(family: str, cfg: dict) -> dict[str, tuple[int, ...]]:
  """{key: PyTorch shape} of the base model's parameters and BatchNorm statistics as transformers' PyTorch model
  of `cfg` names them (without the 'vision_model.' / 'vit.' / ... prefix)."""
  if family in VIT_LIKE:
    return _vit_like_keys(family, cfg)
  return _convnet_keys(convnet_arch(family, cfg))


def _base_model(family: str, state: dict, probe: str) -> dict:
  """The base model's entries of a checkpoint, prefix removed (the first of PREFIXES[family] under which `probe` is)."""
  for prefix in PREFIXES[family]:
    if prefix + probe in state:
      return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
  return {}


def _to_timm(family: str, depth: int, sd: dict) -> dict:
  """CLIP vision / ViT / DINOv2 keys -> vit.py's (timm) names: q, k, v fused into qkv (rows q, k, v)."""
  def ln_lin(src, dst):
    return {f'{dst}.weight': sd[f'{src}.weight'], f'{dst}.bias': sd[f'{src}.bias']}

  if family == 'clip':
    c = sd['embeddings.class_embedding'].shape[-1]
    out = {'cls_token': sd['embeddings.class_embedding'].reshape(1, 1, c),
           'pos_embed': sd['embeddings.position_embedding.weight'][None],
           'patch_embed.proj.weight': sd['embeddings.patch_embedding.weight'],
           **ln_lin('pre_layrnorm', 'ln_pre'), **ln_lin('post_layernorm', 'norm')}
    block, qkv, names = 'encoder.layers.{}.', 'self_attn.{}_proj', {
        'self_attn.out_proj': 'attn.proj', 'layer_norm1': 'norm1', 'layer_norm2': 'norm2', 'mlp.fc1': 'mlp.fc1',
        'mlp.fc2': 'mlp.fc2'}
    parts = ('q', 'k', 'v')
  else:
    out = {'cls_token': sd['embeddings.cls_token'], 'pos_embed': sd['embeddings.position_embeddings'],
           **ln_lin('embeddings.patch_embeddings.projection', 'patch_embed.proj'), **ln_lin('layernorm', 'norm')}
    block, qkv, parts = 'encoder.layer.{}.', 'attention.attention.{}', ('query', 'key', 'value')
    names = {'attention.output.dense': 'attn.proj'}
    names.update({'layernorm_before': 'norm1', 'layernorm_after': 'norm2', 'intermediate.dense': 'mlp.fc1',
                  'output.dense': 'mlp.fc2'} if family == 'vit' else
                 {'norm1': 'norm1', 'norm2': 'norm2', 'mlp.fc1': 'mlp.fc1', 'mlp.fc2': 'mlp.fc2'})
  for i in range(depth):
    b = block.format(i)
    for leaf in ('weight', 'bias'):
      out[f'blocks.{i}.attn.qkv.{leaf}'] = np.concatenate([sd[f'{b}{qkv.format(t)}.{leaf}'] for t in parts])
    for src, dst in names.items():
      out.update(ln_lin(b + src, f'blocks.{i}.{dst}'))
    if family == 'dinov2':
      out[f'blocks.{i}.ls1.gamma'] = sd[f'{b}layer_scale1.lambda1']
      out[f'blocks.{i}.ls2.gamma'] = sd[f'{b}layer_scale2.lambda1']
  return out


def variables_from_state(family: str, cfg: dict, state: dict, where: str) -> dict:
  """Flax variables of the family's module from a checkpoint's {key: array} (PyTorch names and layouts, any prefix
  of PREFIXES): the base model's entries picked by key, checked against `cfg`'s shapes, converted."""
  want = checkpoint_keys(family, cfg)
  sd = _base_model(family, state, next(iter(want)))
  missing = [k for k in want if k not in sd and k not in _OPTIONAL]
  wrong = [f'{k} {tuple(np.shape(sd[k]))} != {s}' for k, s in want.items() if k in sd and tuple(np.shape(sd[k])) != s]
  if missing or wrong:
    prefixes = ' or '.join(repr(p) for p in PREFIXES[family] if p)
    raise UserError(f'{where}: weights do not fit the architecture ({len(missing)} missing, e.g. {missing[:3]}'
                    f'{f" (with or without the prefix {prefixes})" if prefixes else ""}; {len(wrong)} of a wrong '
                    f'shape, e.g. {wrong[:3]})')
  sd = {k: np.asarray(sd[k], np.float32) for k in want if k in sd and k not in _OPTIONAL}
  if family in VIT_LIKE:
    arch = vit_arch(family, cfg)
    variables = vit.to_flax(_to_timm(family, arch.depth, sd), where)
    return variables
  return weights_lib.torch_to_flax(sd, hf_resnet.module_path, where)


def random_state(family: str, cfg: dict, seed: int) -> dict[str, np.ndarray] | None:
  """Random weights as {key: array} (PyTorch names and layouts), drawn by weights.random_variables over the tree the
  transformers Flax port of `cfg` had (its parameter names are the keys split on '.', in sorted order: the same
  numbers as before this module was ours). None under weights.shapes_only()."""
  from flax.traverse_util import unflatten_dict  # pylint: disable=g-import-not-at-top
  tree = {}
  for key, shape in checkpoint_keys(family, cfg).items():
    *path, leaf = key.split('.')
    col = 'params'
    if leaf.startswith('running_'):
      col, leaf = 'batch_stats', leaf[len('running_'):]
    elif leaf == 'weight' and len(shape) == 4:
      leaf, shape = 'kernel', shape[2:] + shape[1::-1]
    elif leaf == 'weight' and len(shape) == 2:
      leaf, shape = ('embedding', shape) if key.endswith('position_embedding.weight') else ('kernel', shape[::-1])
    elif leaf == 'weight':
      leaf = 'scale'
    tree[(col, *path, leaf)] = shape
  tree = unflatten_dict(tree)
  out = weights_lib.random_variables(lambda key: jax.tree.map(jnp.zeros, tree, is_leaf=lambda s: isinstance(s, tuple)),
                                     seed)
  if isinstance(jax.tree.leaves(out)[0], jax.ShapeDtypeStruct):
    return None
  return _flax_to_torch(out)
