"""One-time conversion of a public checkpoint into the offline weight file a backbone loads.

    python -m visim_jax.backbones.convert --backbone=resnet50 --checkpoint=resnet50-0676ba61.pth
    python -m visim_jax.backbones.convert --backbone=bit_m_r50x1 --checkpoint=BiT-M-R50x1.npz
    python -m visim_jax.backbones.convert --backbone=clip_rn50 --checkpoint=RN50.pt [--out=FILE.safetensors]
    python -m visim_jax.backbones.convert --backbone=openclip_vit_b32_laion2b --checkpoint=open_clip_model.safetensors
    python -m visim_jax.backbones.convert --backbone=dreamsim_ensemble --checkpoint=DREAMSIM_CACHE_DIR

Writes `--out` (default `$VISIM_JAX_WEIGHTS/<backbone>.safetensors`, the file the backbone looks for; see
weights.py): the network's tensors in the family's PyTorch names and layouts, float32, without classifier heads,
and `<out>.json` beside it: {"sha256" (of the output, checked at every load), "backbone", "source",
"source_sha256", "source_format", "num_tensors", + what the family records (its architecture)}.
Nothing is written unless the checkpoint fits the backbone's architecture exactly.

Inputs (read by `read_checkpoint`): a PyTorch state dict, zip or legacy `torch.save` (possibly under 'state_dict'
and with 'module.' prefixes), read by visim_jax.core.safe_pickle's restricted unpickler (no torch, no code run); a
.safetensors or .npz file (e.g. Google's original BiT .npz), or a sharded Hugging Face save given by its
`model.safetensors.index.json` (the shards beside it); a TorchScript archive (OpenAI's CLIP downloads), which
needs torch and runs the archive's code: convert only files you trust.

Families: `FAMILIES` maps a family module (the one a backbone name resolves to in registry.py) to the function
`prepare(name, tensors, where, tiny) -> (tensors to store, extra sidecar fields)` that renames, drops the head and
checks the architecture; a new family adds one line there. Families made of several files (DreamSim: LoRA adapter +
base towers) are in `FOLDER_FAMILIES` and take `--checkpoint=FOLDER`.
"""
from __future__ import annotations

import importlib
import json
import os
import sys
import zipfile

import numpy as np

from visim_jax.core import readers, safe_pickle
from visim_jax.backbones import registry
from visim_jax.backbones import weights as weights_lib
from visim_jax.backbones.store import write_converted  # noqa: F401 (convert.write_converted, as before)
from visim_jax.backbones.base import sha256_file
from visim_jax.data import resolve
from visim_jax.core.errors import UserError

# family module -> its `prepare` function (see the module docstring)
FAMILIES: dict[str, str] = {
    'visim_jax.backbones.resnet': 'prepare_state_dict',
    'visim_jax.backbones.bit': 'prepare_state_dict',
    'visim_jax.backbones.alexnet': 'prepare_state_dict',
    'visim_jax.backbones.clip_resnet': 'visim_jax.backbones.convert_clip:prepare_state_dict',
    'visim_jax.backbones.vgg': 'prepare_state_dict',
    'visim_jax.backbones.vit': 'prepare_state_dict',
    'visim_jax.backbones.efficientnet': 'prepare_state_dict',
    'visim_jax.backbones.inception_resnet_v1': 'prepare_state_dict',
    'visim_jax.backbones.siglip': 'prepare_state_dict',
    'visim_jax.backbones.openclip': 'prepare_state_dict',
}
# families converted from a folder of several files: `prepare_folder(name, folder, tiny) -> (tensors, sidecar
# fields incl. 'source_files': {relative path: sha256})`
FOLDER_FAMILIES: dict[str, str] = {
    'visim_jax.backbones.dreamsim': 'prepare_folder',
}


def _is_torchscript(path: str) -> bool:
  try:
    with zipfile.ZipFile(path) as z:
      return any(n.endswith('/constants.pkl') or n.split('/', 1)[-1].startswith('code/') for n in z.namelist())
  except (zipfile.BadZipFile, OSError, ValueError):
    return False


def read_shards(path: str) -> dict[str, np.ndarray]:
  """The tensors of a sharded Hugging Face save: every shard its `model.safetensors.index.json` weight_map names,
  each resolved inside the index's folder (data/resolve.py: no absolute path, `..` or symbolic link out). In a
  Hugging Face cache snapshot (`models--ORG--NAME/snapshots/REV/`, whose files are links to `../../blobs/`) the root
  is the model's cache folder `models--ORG--NAME`."""
  index = readers.read_json(path, dict, 'shard index')
  weight_map = index.get('weight_map')
  if not isinstance(weight_map, dict) or not weight_map:
    raise UserError(f'{path}: no weight_map object (expected a model.safetensors.index.json)')
  folder = os.path.dirname(path) or '.'
  parent = os.path.dirname(os.path.abspath(folder))
  root = os.path.dirname(parent) if os.path.basename(parent) == 'snapshots' else folder
  shards, inside = {}, resolve.Root(folder, links_within=root).inside
  for key, shard in weight_map.items():
    if not isinstance(shard, str):
      raise UserError(f'{path}: weight_map[{key!r}]: expected a shard file name, got {shard!r:.60}')
    if shard not in shards:
      shards[shard] = inside(shard, f'{path}: weight_map[{key!r}]', 'shard')
  missing = [p for p in shards.values() if not os.path.isfile(p)]
  if missing:
    raise UserError(f'{path}: shards missing: {", ".join(missing)}')
  return {k: v for s in sorted(shards) for k, v in weights_lib.read_tensors(shards[s]).items()}


def _read_torchscript(path: str) -> dict[str, np.ndarray]:
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise UserError(f'--checkpoint {path} is a TorchScript archive: converting it needs torch '
                    '(pip install torch, the optional `torch` extra)') from None
  try:
    module = torch.jit.load(path, map_location='cpu')
    return {k: v.detach().float().cpu().numpy() for k, v in module.state_dict().items()
            if v.dtype.is_floating_point}
  except Exception as e:  # noqa: BLE001: a zip that only looks like TorchScript, a truncated or foreign archive
    msg = ' '.join(str(e).split())[:160]
    raise UserError(f'--checkpoint {path}: not a loadable TorchScript archive ({type(e).__name__}: {msg}); '
                    'convert the original download, or a plain state dict') from None


def read_checkpoint(path: str) -> tuple[dict[str, np.ndarray], str]:
  """({name: array}, format) from any supported input (see the module docstring); bad bytes: one UserError line."""
  if not os.path.isfile(path):
    raise UserError(f'--checkpoint {path}: no such file')
  if path.endswith(('.safetensors', '.npz')):
    return weights_lib.read_tensors(path), os.path.splitext(path)[1][1:]
  if path.endswith('.safetensors.index.json'):  # a sharded Hugging Face save: every shard its weight_map names
    return read_shards(path), 'safetensors (sharded)'
  if _is_torchscript(path):
    return _read_torchscript(path), 'torchscript'
  try:
    sd = safe_pickle.load_torch_state_dict(path)
  except safe_pickle.UnsafePickleError as e:
    raise UserError(f'--checkpoint {path}: refused by the restricted unpickler ({e}); save a plain state dict '
                    '(`torch.save(model.state_dict(), path)`) and convert that') from None
  for nest in ('model', 'state_dict_ema'):  # checkpoints that wrap the state dict once more
    if set(sd) <= {nest} | {'epoch', 'optimizer', 'args', 'arch'} and isinstance(sd.get(nest), dict):
      sd = sd[nest]
  return {k: v for k, v in sd.items() if isinstance(v, np.ndarray)}, 'state_dict'


def _prepare_target(name: str) -> tuple[str, str]:
  """(module, function) of NAME's converter (nothing imported); a family without one fails in one line."""
  module = registry.target(name).split(':')[0]
  if module in FOLDER_FAMILIES:
    return module, FOLDER_FAMILIES[module]
  if module not in FAMILIES:
    raise UserError(f'--backbone {name}: its family ({module}) has no converter; families with one: '
                    f'{", ".join(sorted(FAMILIES))}')
  fn = FAMILIES[module]
  return tuple(fn.split(':')) if ':' in fn else (module, fn)


def _prepare_fn(name: str):
  module, fn = _prepare_target(name)
  return getattr(importlib.import_module(module), fn)


def convert(backbone: str, checkpoint: str, out: str | None = None, tiny: bool = False) -> dict:
  """Converts `checkpoint` for `backbone` (tiny: a tiny-config checkpoint, tests); returns the sidecar content."""
  checkpoint = os.path.expanduser(checkpoint)
  try:
    backbone = registry.canonical(backbone)  # an alias converts to the file the registry name loads
  except ValueError as e:
    raise UserError(f'--backbone {backbone}: {str(e).partition(": ")[2]}') from None
  out = weights_lib.converted_path(backbone, out)
  _prepare_target(backbone)  # a family without a converter fails before anything is read
  if registry.target(backbone).split(':')[0] in FOLDER_FAMILIES:
    tensors, extra = _prepare_fn(backbone)(backbone, checkpoint, tiny)
    info = {'backbone': backbone, 'source': os.path.abspath(checkpoint), 'source_format': 'folder', 'out': out,
            **extra}
    return write_converted(tensors, out, info)
  sd, fmt = read_checkpoint(checkpoint)  # bad bytes fail here, before the family (jax) is imported
  tensors, extra = _prepare_fn(backbone)(backbone, sd, checkpoint, tiny)
  info = {'backbone': backbone, 'source': os.path.abspath(checkpoint), 'source_sha256': sha256_file(checkpoint),
          'source_format': fmt, 'out': out, **extra}
  return write_converted(tensors, out, info)


def main(argv) -> None:
  from absl import flags  # pylint: disable=g-import-not-at-top
  if len(argv) > 1:
    raise UserError(f'unexpected arguments: {argv[1:]}')
  f = flags.FLAGS
  if not f.backbone or not f.checkpoint:
    raise UserError('--backbone=NAME and --checkpoint=FILE are required (names: python -m visim_jax.main '
                    '--list_backbones)')
  info = convert(f.backbone, f.checkpoint, f.out or None)
  print(json.dumps(info, indent=2, sort_keys=True))
  print(f'use: --config.backbone={f.backbone}' + ('' if not f.out else f' --config.backbone_kwargs.weights={info["out"]}'),
        file=sys.stderr)


def run_main() -> None:
  from absl import flags  # pylint: disable=g-import-not-at-top
  from visim_jax.core import errors  # pylint: disable=g-import-not-at-top
  flags.DEFINE_string('backbone', None, 'the backbone name the weights are for (as in --list_backbones)')
  flags.DEFINE_string('checkpoint', None, 'the public checkpoint: .pth/.pt/.bin state dict, .safetensors, .npz, '
                      'model.safetensors.index.json (sharded)')
  flags.DEFINE_string('out', None, 'output .safetensors (default $VISIM_JAX_WEIGHTS/<backbone>.safetensors)')
  errors.run(main)  # the one command-line wrapper: user errors and bad flags as one line `error: ...`, exit 1


if __name__ == '__main__':
  run_main()
