"""The backbone interface every family implements.

A backbone is a frozen network plus what is needed to feed it and read it:
- `apply_fn(variables, x)`: a pure function of the variables and a float NHWC batch already normalised by
  `preprocess`; returns `(final, stages)` with `final` the network's last output (logits, pooled embedding)
  and `stages` an ordered {stage_name: NHWC map or (N, tokens, C) sequence} of every stage's output.
- `preprocess`: how the host turns a decoded image into the array the device normalises: `images.load_batch`
  returns uint8 for PIL's kernels ('bilinear', 'bicubic') and float32 on the 0..255 scale for the seed's
  'torch_bilinear' (torch's un-rounded interpolation: rounding it to uint8 would change the features).
- `layers`: the stages pooled into the feature vector by default (overridable by config).
- `weights_id`: a content hash of the weights (sha256 of the file, or 'random:<seed>' for test weights),
  recorded in every feature-cache manifest.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import hashlib
import os
from typing import Any, Callable, Mapping, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from visim_jax.core.errors import UserError
from visim_jax.data.preprocess import Preprocess

Stages = Mapping[str, jax.Array]


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

  def __call__(self, images: jax.Array, dtype=jnp.float32) -> tuple[jax.Array, Stages]:
    """Runs the network on an NHWC batch as `images.load_batch(paths, self.preprocess)` returns it: uint8, or
    float32 on the 0..255 scale for interpolation='torch_bilinear' (pure in `variables`; jit the caller)."""
    x = self.preprocess.normalise(images, dtype)
    variables = self.variables
    if dtype != jnp.float32:
      variables = jax.tree.map(lambda v: v.astype(dtype) if jnp.issubdtype(v.dtype, jnp.floating) else v,
                               variables)
    return self.apply_fn(variables, x)

  def stage_shapes(self) -> dict:
    """{stage: ShapeDtypeStruct} for one image, by shape inference: no compute, and the variables are an argument
    of the traced function, so shape-only variables (`abstract=True`, weights.shapes_only()) work too."""
    x = jax.ShapeDtypeStruct((1, self.preprocess.size, self.preprocess.size, 3), jnp.uint8)
    _, stages = jax.eval_shape(lambda v, x: self.apply_fn(v, self.preprocess.normalise(x)), self.variables, x)
    return stages

  def stage_names(self) -> tuple[str, ...]:
    return tuple(self.stage_shapes())

  def layer_dims(self, layers: Sequence[str] | None = None) -> dict[str, int]:
    """{stage: channels} of the pooled `layers` (default: self.layers), by shape inference (no compute)."""
    layers = tuple(layers or self.layers)
    stages = self.stage_shapes()
    missing = [l for l in layers if l not in stages]
    if missing:
      raise UserError(f'config.layers: {missing} not among the {self.name} stages {sorted(stages)}')
    return {l: int(stages[l].shape[-1]) for l in layers}


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
  h = hashlib.sha256()
  with open(path, 'rb') as f:
    for block in iter(lambda: f.read(chunk), b''):
      h.update(block)
  return h.hexdigest()


# Rematerialisation per block (training/tower_step.py, Hparams.remat): inside `remat_blocks()`, the families that
# build their blocks through `block_class(Block)` (vit.py: vit / dino / openclip / DreamSim towers; siglip.py;
# resnet.py, bit.py, clip_resnet.py, efficientnet.py, efficientnet_lite.py) wrap each block in flax's nn.remat when the function is
# traced: the backward pass recomputes a block's activations from its input instead of keeping them. The parameter
# tree and the numbers are unchanged. (AlexNet and VGG have no blocks: their few layers are kept.)
_REMAT = contextvars.ContextVar('visim_jax_remat_blocks', default=False)


@contextlib.contextmanager
def remat_blocks(on: bool = True):
  token = _REMAT.set(bool(on))
  try:
    yield
  finally:
    _REMAT.reset(token)


@functools.lru_cache(maxsize=None)
def _remat(cls):
  return nn.remat(cls)


def block_class(cls):
  """`cls`, or nn.remat(cls) inside remat_blocks() (read at trace time)."""
  return _remat(cls) if _REMAT.get() else cls
