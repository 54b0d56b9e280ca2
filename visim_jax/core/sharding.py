"""Placing arrays on every device of every host: one 1-D Mesh, NamedShardings, host <-> global arrays.

What is sharded where:
- adaptation training: the runs axis (R) of the state, the projected data and the outputs; the features
  themselves are replicated (they are small: N x D). R is padded up to a multiple of the device count
  (the extra runs are computed and dropped; run r's randomness depends on r only, so results are the same
  on 1 or 8 devices).
- feature extraction: the image batch axis (padded to a multiple of the local device count); with several
  hosts each host decodes and runs its own contiguous slice of the file list.
No pmap: jit partitions the vmapped programs from the input shardings.
"""
from __future__ import annotations

import math

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from visim_jax.core.errors import UserError


def make_mesh(axis: str, devices=None) -> Mesh:
  devices = np.asarray(devices if devices is not None else jax.devices())
  return Mesh(devices.reshape(-1), (axis,))


def padded(n: int, mesh: Mesh) -> int:
  """n rounded up to a multiple of the mesh size."""
  size = mesh.devices.size
  return int(math.ceil(n / size) * size)


def split(mesh: Mesh) -> NamedSharding:
  """Leading axis split across the mesh."""
  return NamedSharding(mesh, P(mesh.axis_names[0]))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def to_global(x: np.ndarray, sharding: NamedSharding) -> jax.Array:
  """A global array from a host array that every process holds in full (works across hosts)."""
  x = np.asarray(x)
  return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])


def to_host(x) -> np.ndarray:
  """The full value of a (possibly multi-host) global array as numpy, on every process."""
  if jax.process_count() > 1 and isinstance(x, jax.Array) and not x.is_fully_addressable:
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return np.asarray(x)


# ------------------------------------------------------------------------ training meshes: ('data', 'fsdp')
# The tower training path (training/tower_step.py): a 2-D mesh whose 'data' axis and 'fsdp' axis together split the
# batch over every device of every host, and whose 'fsdp' axis also shards the parameters, the optimiser state and
# the frozen weights (each leaf along its largest dimension that the fsdp size divides; leaves under FSDP_MIN_SIZE
# elements, or with no such dimension, are replicated). fsdp=1 is plain data parallelism. The fsdp axis is the
# inner one, so with jax.devices()' order (by process) a parameter's shards stay within a host where they can.

DATA, FSDP = 'data', 'fsdp'
BATCH_AXES = (DATA, FSDP)
FSDP_MIN_SIZE = 1024


def train_mesh(fsdp: int = 1, devices=None) -> Mesh:
  """The ('data', 'fsdp') mesh over `devices` (default: every device of every process): data = count // fsdp."""
  devices = np.asarray(devices if devices is not None else jax.devices()).reshape(-1)
  if fsdp < 1 or devices.size % fsdp:
    raise UserError(f'fsdp: {fsdp} does not divide the {devices.size} devices; pick a divisor of {devices.size}')
  return Mesh(devices.reshape(devices.size // fsdp, fsdp), BATCH_AXES)


def batch_sharding(mesh: Mesh, ndim: int = 1) -> NamedSharding:
  """A batch's leading axis over every device of the training mesh (the other axes whole)."""
  del ndim
  return NamedSharding(mesh, P(BATCH_AXES))


def param_spec(mesh: Mesh, shape, min_size: int = FSDP_MIN_SIZE) -> P:
  """The fsdp PartitionSpec of one leaf: its largest dimension that the fsdp size divides (the first of equals),
  or replicated (small leaves, no such dimension, fsdp = 1)."""
  n = mesh.shape[FSDP]
  shape = tuple(shape)
  if n == 1 or math.prod(shape) < min_size:
    return P()
  dims = [d for d, s in enumerate(shape) if s % n == 0]
  if not dims:
    return P()
  d = max(dims, key=lambda i: (shape[i], -i))
  return P(*([None] * d + [FSDP]))


def param_sharding(mesh: Mesh, shape, min_size: int = FSDP_MIN_SIZE) -> NamedSharding:
  return NamedSharding(mesh, param_spec(mesh, shape, min_size))


def param_shardings(mesh: Mesh, tree, min_size: int = FSDP_MIN_SIZE):
  """The tree of param_sharding of every array leaf (by shape: parameters and the optimiser's moments that mirror
  them get the same layout)."""
  return jax.tree.map(lambda x: param_sharding(mesh, np.shape(x), min_size), tree)


def constrain_params(mesh: Mesh, tree, min_size: int = FSDP_MIN_SIZE):
  """with_sharding_constraint of every leaf to its fsdp layout (inside jit: the state a step returns)."""
  return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, param_sharding(mesh, x.shape, min_size)), tree)


def place_params(mesh: Mesh, tree, min_size: int = FSDP_MIN_SIZE):
  """Host values that every process holds in full -> global arrays in their fsdp layout."""
  return jax.tree.map(lambda x: to_global(np.asarray(x), param_sharding(mesh, np.shape(x), min_size)), tree)


def from_local(x: np.ndarray, mesh: Mesh) -> jax.Array:
  """A global batch from each process's own contiguous slice of it (process i holds rows i*n/P .. (i+1)*n/P)."""
  return multihost_utils.host_local_array_to_global_array(np.asarray(x), mesh, P(BATCH_AXES))
