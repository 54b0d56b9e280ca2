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
