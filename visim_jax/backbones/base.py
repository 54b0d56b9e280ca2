"""The backbone interface every family implements.

A backbone is a frozen network plus what is needed to feed it and read it:
- `apply_fn(variables, x)`: a pure function of the variables and a float NHWC batch already normalised by
  `preprocess`; returns `(final, stages)` with `final` the network's last output (logits, pooled embedding)
  and `stages` an ordered {stage_name: NHWC map or (N, tokens, C) sequence} of every stage's output.
- `preprocess`: how the host turns a decoded image into the uint8 array the device normalises.
- `layers`: the stages pooled into the feature vector by default (overridable by config).
- `weights_id`: a content hash of the weights (sha256 of the file, or 'random:<seed>' for test weights),
  recorded in every feature-cache manifest.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp

Stages = Mapping[str, jax.Array]


@dataclasses.dataclass(frozen=True)
class Preprocess:
  """Host-side geometry + device-side normalisation of an image.

  resize: 'squash' resizes the whole image to size x size (aspect ratio not kept);
          'shorter_crop' resizes the shorter side to `resize_to` (default `size`) and centre-crops size x size,
          as CLIP and the torchvision ImageNet transforms do.
  mean, std: per-channel, on the 0..255 scale: x_in = (x - mean) / std.
  """
  size: int = 224
  resize: str = 'squash'
  resize_to: int | None = None
  mean: tuple[float, float, float] = (127.0, 127.0, 127.0)
  std: tuple[float, float, float] = (128.0, 128.0, 128.0)
  interpolation: str = 'bilinear'

  def __post_init__(self):
    if not isinstance(self.size, int) or self.size < 8 or self.size > 4096:
      raise ValueError(f'preprocess.size: expected an integer in [8, 4096], got {self.size!r}')
    if self.resize not in ('squash', 'shorter_crop'):
      raise ValueError(f"preprocess.resize: expected 'squash' or 'shorter_crop', got {self.resize!r}")
    if self.resize_to is not None and self.resize_to < self.size:
      raise ValueError(f'preprocess.resize_to ({self.resize_to}) must be >= size ({self.size})')
    if self.interpolation not in ('bilinear', 'bicubic'):
      raise ValueError(f"preprocess.interpolation: 'bilinear' or 'bicubic', got {self.interpolation!r}")

  def normalise(self, images: jax.Array, dtype=jnp.float32) -> jax.Array:
    """uint8 (or float 0..255) NHWC -> normalised float NHWC, on device."""
    mean = jnp.asarray(self.mean, jnp.float32)
    std = jnp.asarray(self.std, jnp.float32)
    return ((images.astype(jnp.float32) - mean) / std).astype(dtype)

  def describe(self) -> dict:
    return dataclasses.asdict(self)


@dataclasses.dataclass
class Backbone:
  name: str
  apply_fn: Callable[[Any, jax.Array], tuple[jax.Array, Stages]]
  variables: Any
  preprocess: Preprocess
  layers: tuple[str, ...]
  weights_id: str
  labels: Sequence[str] | None = None
  description: str = ''

  def __call__(self, images_uint8: jax.Array, dtype=jnp.float32) -> tuple[jax.Array, Stages]:
    """Runs the network on a uint8 NHWC batch (pure in `variables`; jit the caller)."""
    x = self.preprocess.normalise(images_uint8, dtype)
    variables = self.variables
    if dtype != jnp.float32:
      variables = jax.tree.map(lambda v: v.astype(dtype) if jnp.issubdtype(v.dtype, jnp.floating) else v,
                               variables)
    return self.apply_fn(variables, x)

  def stage_names(self) -> tuple[str, ...]:
    x = jnp.zeros((1, self.preprocess.size, self.preprocess.size, 3), jnp.uint8)
    _, stages = jax.eval_shape(self.__call__, x)
    return tuple(stages)


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
  h = hashlib.sha256()
  with open(path, 'rb') as f:
    for block in iter(lambda: f.read(chunk), b''):
      h.update(block)
  return h.hexdigest()

