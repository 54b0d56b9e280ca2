"""LoRA (Hu et al. 2021) as a pure transform of a flax parameter tree: W + (alpha / r) * A B on the kernels that a
name pattern selects, merged into plain weights for inference and export.

The tree (`init`): {'<module path>': {'a': (fan_in, r), 'b': (r, fan_out)}}, one entry per selected kernel, the
module path '/'-joined under `params` (DreamSim's towers: 'dino/blocks_3/attn/qkv'). A kernel of any rank is read as
the matrix (prod(shape[:-1]), shape[-1]) (flax Dense: (in, out); Conv: (kh, kw, in, out)), so
`merge` adds scale * (a @ b).reshape(kernel.shape) to it. In torch / peft names (Linear weight (out, in)):
lora_A.weight = a.T (r, in), lora_B.weight = b.T (out, r), the same delta B A transposed. A fused qkv Linear has one
`a` shared by q, k and v and one `b` of 3 x width rows, as peft's LoRA on DreamSim's `qkv` (target_modules=['qkv']).

Initialisation = peft's default (`init_lora_weights=True`): A as torch.nn.Linear's weight (kaiming_uniform with
a = sqrt(5): U(-1/sqrt(fan_in), 1/sqrt(fan_in)); for a Conv kernel fan_in = kh * kw * in as torch's conv A), B zero,
so the tuned tower starts as the pretrained one. scale = alpha / r (alpha / sqrt(r) with rslora), peft's `scaling`.

peft's names (`from_peft` / `to_peft`): DreamSim wraps its PerceptualModel with `get_peft_model(LoraConfig(
target_modules=['qkv']))` and `save_pretrained` writes adapter_model.safetensors (or .bin) with the keys
`base_model.model.extractor_list.<i>.model.blocks.<n>.attn.qkv.lora_A.weight` (r, in) / `lora_B.weight` (out, r)
(the live model's state dict has `lora_A.default.weight`: both are read). Branch i is the tower's i-th branch
(dreamsim.py's keys in `model_type` order: 'dino', 'clip', 'open_clip'), so that entry is our
'<key>/blocks_<n>/attn/qkv' with a = lora_A.T, b = lora_B.T; a plain ViT wrapped alone (no extractor_list) maps to
'blocks_<n>/...'. The modules of a timm / DINO block: attn.qkv, attn.proj, mlp.fc1, mlp.fc2 (ours attn/qkv,
attn/proj, fc1, fc2). to_peft writes save_pretrained's form (no adapter name), what `set_peft_model_state_dict`
and `PeftModel.from_pretrained` read; the arrays are transposed, never rounded: a round trip is exact.

Dropout (`forward` with rate > 0 and a key): peft computes y = W x + b + scale * B A dropout(x) in training, a
dropout mask per element of the layer's INPUT (per image, per token, per channel) on the LoRA branch only. That is not
a weight, so no merge expresses it; `forward` computes exactly peft's form instead: every flax nn.Dense / nn.Conv
whose module path is a target gets y + scale * (dropout(x) a) b through flax's method interception, with
masks `dropout_mask(key, i, call, shape, rate)` (target i in sorted path order): the parity test feeds the same
masks to peft's dropout slot. A module's path is its path inside the apply call plus where that call's params sit
in the tree (found by identity of the arrays at the root: DreamSim's ensemble applies each branch to
params[branch], so the branches' same-named blocks never mix; paths hold inside nn.remat too). Without dropout
(rate 0, or no key: evaluation) `forward` runs the merged weights, equal to peft's unmerged sum up to float rounding.
"""
from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Callable, Mapping, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from visim_jax.core.errors import UserError

Tree = Any


@dataclasses.dataclass(frozen=True)
class Config:
  """peft's LoraConfig fields that a plain LoRA needs (DreamSim's configs/train_*_lora.yaml: r 16, alpha 8 (ensemble)
  or 32 (single), dropout 0.3 / 0.2, targets ('qkv',))."""
  r: int = 16
  alpha: float = 8.0
  dropout: float = 0.0
  targets: tuple[str, ...] = ('qkv',)
  rslora: bool = False

  @property
  def scale(self) -> float:
    return self.alpha / (math.sqrt(self.r) if self.rslora else self.r)


def _path_str(path) -> str:
  return '/'.join(str(getattr(k, 'key', getattr(k, 'name', k))) for k in path)


def _matches(module: str, targets: Sequence[str]) -> bool:
  """peft's list semantics: a target names a module by its last path components ('qkv' -> '.../attn/qkv',
  'attn/qkv' too); anything else must match the whole module path as a regular expression."""
  for t in targets:
    if module == t or module.endswith('/' + t):
      return True
    try:
      if re.fullmatch(t, module):
        return True
    except re.error as e:
      raise UserError(f'lora targets: {t!r} is not a module name or a regular expression ({e})') from None
  return False


def kernels(params: Tree) -> dict[str, jax.Array]:
  """{module path: kernel} of every 'kernel' leaf of rank >= 2 in `params` (the `params` collection)."""
  out = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    name = _path_str(path)
    if name.endswith('/kernel') and getattr(leaf, 'ndim', 0) >= 2:
      out[name[:-len('/kernel')]] = leaf
  return out


def target_paths(params: Tree, cfg: Config) -> list[str]:
  """The module paths that cfg.targets select, sorted; refuses a pattern that selects nothing."""
  found = sorted(m for m in kernels(params) if _matches(m, cfg.targets))
  if not found:
    some = sorted(kernels(params))[:6]
    raise UserError(f'lora targets {list(cfg.targets)} select no kernel of this tower (module paths look like '
                    f'{some})')
  return found


def init(key: jax.Array, params: Tree, cfg: Config) -> dict:
  """The LoRA tree for the kernels cfg.targets select: a ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (peft's
  kaiming_uniform(a=sqrt(5))), b = 0; target i's `a` from fold_in(key, i) (sorted paths)."""
  if cfg.r < 1:
    raise UserError(f'lora r: {cfg.r}; expected a positive rank')
  if not 0.0 <= cfg.dropout < 1.0:
    raise UserError(f'lora dropout: {cfg.dropout}; expected a probability in [0, 1)')
  ks = kernels(params)
  out = {}
  for i, path in enumerate(target_paths(params, cfg)):
    shape = ks[path].shape
    fan_in, fan_out = math.prod(shape[:-1]), shape[-1]
    bound = 1.0 / math.sqrt(fan_in)
    out[path] = {'a': jax.random.uniform(jax.random.fold_in(key, i), (fan_in, cfg.r), jnp.float32, -bound, bound),
                 'b': jnp.zeros((cfg.r, fan_out), jnp.float32)}
  return out


def delta(entry: Mapping[str, jax.Array], shape: Sequence[int], scale: float) -> jax.Array:
  """scale * a @ b in the kernel's shape (float32 product)."""
  a, b = entry['a'].astype(jnp.float32), entry['b'].astype(jnp.float32)
  return (scale * (a @ b)).reshape(shape)


def merge(params: Tree, lora: Mapping[str, Mapping[str, jax.Array]], cfg: Config) -> Tree:
  """`params` with W + scale * a @ b at every LoRA entry (same structure and dtypes): plain weights for inference
  and export. Refuses an entry whose module is missing or whose shapes do not fit."""
  if not lora:
    return params
  ks = kernels(params)
  missing = sorted(set(lora) - set(ks))
  if missing:
    raise UserError(f'lora: entries {missing[:3]} name no kernel of this tower')

  def fix(path, leaf):
    name = _path_str(path)
    module = name[:-len('/kernel')] if name.endswith('/kernel') else None
    if module not in lora:
      return leaf
    e = lora[module]
    if e['a'].shape[0] != math.prod(leaf.shape[:-1]) or e['b'].shape[-1] != leaf.shape[-1]:
      raise UserError(f'lora: {module}: a {e["a"].shape} / b {e["b"].shape} do not fit its kernel {leaf.shape}')
    return (leaf.astype(jnp.float32) + delta(e, leaf.shape, cfg.scale)).astype(leaf.dtype)
  return jax.tree_util.tree_map_with_path(fix, params)


def merge_variables(variables: Mapping, lora, cfg: Config) -> dict:
  """merge() on the `params` collection of a flax variables dict; other collections (batch_stats) unchanged."""
  return {**variables, 'params': merge(variables['params'], lora, cfg)}


def dropout_mask(key: jax.Array, index: int, call: int, shape: Sequence[int], rate: float) -> jax.Array:
  """The keep mask (bool) of target `index` at its `call`-th use in one forward (torch's nn.Dropout keeps with
  probability 1 - rate and scales the kept values by 1 / (1 - rate))."""
  k = jax.random.fold_in(jax.random.fold_in(key, index), call)
  return jax.random.bernoulli(k, 1.0 - rate, tuple(shape))


def forward(apply_fn: Callable, variables: Mapping, lora, cfg: Config, x, key: jax.Array | None = None):
  """apply_fn(variables with LoRA, x) as peft computes it: merged weights when dropout is off (cfg.dropout 0 or no
  key), else W x + b + scale * B A dropout(x) at every target (module docstring)."""
  if not lora:
    return apply_fn(variables, x)
  if cfg.dropout == 0.0 or key is None:
    return apply_fn(merge_variables(variables, lora, cfg), x)
  order = sorted(lora)
  index = {p: i for i, p in enumerate(order)}
  full_of = {id(leaf): _path_str(path) for path, leaf in jax.tree_util.tree_flatten_with_path(variables['params'])[0]}
  prefixes, calls = [], {}
  rate, scale = cfg.dropout, cfg.scale

  def root_prefix(mod) -> str:
    """Where the params a root module was applied to sit in `variables['params']` (DreamSim's ensemble applies each
    branch to params[branch]): found by identity of their arrays, which holds at the root (inside a lifted
    transform such as nn.remat the arrays are new tracers, hence paths below the root)."""
    for path, leaf in jax.tree_util.tree_flatten_with_path(mod.scope.variables().get('params', {}))[0]:
      full = full_of.get(id(leaf))
      rel = _path_str(path)
      if full is not None and full.endswith(rel):
        return full[:-len(rel)]
    return ''

  def interceptor(next_fun, args, kwargs, ctx):
    mod = ctx.module
    if ctx.method_name != '__call__':
      return next_fun(*args, **kwargs)
    if mod.path == () and mod.scope is not None and mod.scope.parent is None:
      prefixes.append(root_prefix(mod))
      try:
        return dense_or_conv(mod, next_fun, args, kwargs)
      finally:
        prefixes.pop()
    return dense_or_conv(mod, next_fun, args, kwargs)

  def dense_or_conv(mod, next_fun, args, kwargs):
    if not isinstance(mod, (nn.Dense, nn.Conv)):
      return next_fun(*args, **kwargs)
    path = (prefixes[-1] if prefixes else '') + '/'.join(mod.path)
    if path not in index:
      return next_fun(*args, **kwargs)
    i = index[path]
    y = next_fun(*args, **kwargs)
    xin = args[0]
    call = calls[i] = calls.get(i, -1) + 1
    keep = dropout_mask(key, i, call, xin.shape, rate)
    xd = jnp.where(keep, xin / (1.0 - rate), 0.0).astype(xin.dtype)
    e = lora[path]
    if isinstance(mod, nn.Dense):
      extra = (xd @ e['a'].astype(xd.dtype)) @ e['b'].astype(xd.dtype)
      extra = extra * jnp.asarray(scale, xd.dtype)
    else:
      k = delta(e, mod.scope.get_variable('params', 'kernel').shape, scale).astype(xd.dtype)
      extra = mod.clone(parent=None, use_bias=False, name=None).apply({'params': {'kernel': k}}, xd)
    return y + extra.astype(y.dtype)

  with nn.intercept_methods(interceptor):
    out = apply_fn(variables, x)
  unused = [order[i] for i in range(len(order)) if i not in calls]
  if unused:
    raise UserError(f'lora: targets {unused[:3]} were never called as a flax nn.Dense / nn.Conv in the forward; '
                    'dropout on them needs that (set the LoRA dropout to 0 to train their merged weights)')
  return out


def count(lora) -> int:
  """Trainable LoRA parameters."""
  return int(sum(x.size for x in jax.tree.leaves(lora)))


def to_arrays(lora) -> dict:
  """The LoRA tree as flat {'<module path>/a': array, '<module path>/b': array} (np.savez keys: a LoRA-only
  checkpoint holds these and the Config, nothing of the base)."""
  return {f'{path}/{k}': v for path, e in lora.items() for k, v in e.items()}


def from_arrays(arrays: Mapping[str, Any]) -> dict:
  """Inverse of to_arrays; refuses keys that are not '<module path>/a' or '/b', or an entry lacking one."""
  out: dict = {}
  for key, v in arrays.items():
    path, _, k = key.rpartition('/')
    if k not in ('a', 'b') or not path:
      raise UserError(f'lora arrays: unexpected key {key!r} (expected <module path>/a and <module path>/b)')
    out.setdefault(path, {})[k] = jnp.asarray(v)
  bad = sorted(p for p, e in out.items() if set(e) != {'a', 'b'})
  if bad:
    raise UserError(f'lora arrays: {bad[:3]} lack a or b')
  return out


# ------------------------------------------------------------------------------------------------ peft's names

PEFT_PREFIX = 'base_model.model.'
_PEFT_KEY = re.compile(r'^(?:base_model\.model\.)?(?:extractor_list\.(\d+)\.model\.)?blocks\.(\d+)\.'
                       r'(attn\.qkv|attn\.proj|mlp\.fc1|mlp\.fc2)\.lora_([AB])(?:\.default)?\.weight$')
_TORCH_TO_OURS = {'attn.qkv': 'attn/qkv', 'attn.proj': 'attn/proj', 'mlp.fc1': 'fc1', 'mlp.fc2': 'fc2'}
_OURS_TO_TORCH = {v: k for k, v in _TORCH_TO_OURS.items()}
_OUR_PATH = re.compile(r'^(?:([^/]+)/)?blocks_(\d+)/(attn/qkv|attn/proj|fc1|fc2)$')


def from_peft(state_dict: Mapping[str, Any], branches: Sequence[str] = (), where: str = 'peft adapter') -> dict:
  """peft's LoRA tensors (module docstring) -> our tree {path: {'a': lora_A.T, 'b': lora_B.T}}; `branches`: the
  tower's branch keys in extractor_list order (() for a plain ViT). Anything else is refused, naming `where`."""
  out: dict = {}
  for key, v in state_dict.items():
    m = _PEFT_KEY.match(key)
    if not m:
      raise UserError(f'{where}: unexpected entry {key!r}: a LoRA adapter of a DINO-layout ViT holds '
                      '[base_model.model.][extractor_list.I.model.]blocks.N.<attn.qkv|...>.lora_A/lora_B weights')
    ext, block, module, ab = m.groups()
    if bool(branches) != (ext is not None) or (ext is not None and int(ext) >= len(branches)):
      raise UserError(f'{where}: {key!r} does not fit a tower of {len(branches) or "no"} branches '
                      f'{list(branches)} (extractor_list index {ext})')
    path = (f'{branches[int(ext)]}/' if ext is not None else '') + f'blocks_{block}/{_TORCH_TO_OURS[module]}'
    w = np.asarray(v)
    if w.ndim != 2:
      raise UserError(f'{where}: {key!r} has shape {w.shape}; a LoRA Linear weight is a matrix')
    e = out.setdefault(path, {})
    k = 'a' if ab == 'A' else 'b'
    if k in e:
      raise UserError(f'{where}: {key!r}: lora_{ab} of {path} given twice')
    e[k] = jnp.asarray(w.T)
  for path, e in sorted(out.items()):
    if set(e) != {'a', 'b'} or e['a'].shape[1] != e['b'].shape[0]:
      raise UserError(f'{where}: {path}: needs lora_A (r, in) and lora_B (out, r) of one rank '
                      f'(found {({k: tuple(v.shape) for k, v in e.items()})})')
  if not out:
    raise UserError(f'{where}: no LoRA tensors')
  return out


def to_peft(tree: Mapping[str, Mapping[str, Any]], branches: Sequence[str] = ()) -> dict[str, np.ndarray]:
  """Our tree -> {peft key (save_pretrained's form): torch-layout array}: lora_A.weight = a.T (r, in),
  lora_B.weight = b.T (out, r), exactly (no rounding). A path outside a DINO-layout block is refused."""
  index = {k: i for i, k in enumerate(branches)}
  out = {}
  for path, e in sorted(tree.items()):
    m = _OUR_PATH.match(path)
    if not m or (m.group(1) is not None) != bool(branches) or (m.group(1) is not None and m.group(1) not in index):
      raise UserError(f'lora: {path!r} has no peft name: peft export covers the qkv / proj / fc1 / fc2 kernels of a '
                      f'DINO-layout ViT{f" with branches {list(branches)}" if branches else ""}')
    branch, block, module = m.groups()
    head = PEFT_PREFIX + (f'extractor_list.{index[branch]}.model.' if branch is not None else '')
    name = f'{head}blocks.{block}.{_OURS_TO_TORCH[module]}'
    out[f'{name}.lora_A.weight'] = np.ascontiguousarray(np.asarray(e['a']).T)
    out[f'{name}.lora_B.weight'] = np.ascontiguousarray(np.asarray(e['b']).T)
  return out
