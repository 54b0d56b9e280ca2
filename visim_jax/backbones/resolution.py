"""A ViT tower at another input size: its learned position embeddings interpolated over the patch grid, as the
authors' code does when an image is larger than the training size (docs/library.md "Any resolution").

  at_image_size(backbone, n) -> Backbone     the same network, preprocess.size = n, every `pos_embed` leaf
                                             (1, 1 + M*M, D) resized to the (n / p) x (n / p) grid

The interpolation is torch's `interpolate(mode='bicubic', align_corners=False)` of the M x M patch positions, the
class position kept (backbones/dreamsim.resize_pos_embed):
  DINO / DreamSim (facebookresearch/dino `interpolate_pos_encoding`, DreamSim's copy of it): scale_factor
  (g + 0.1) / M, the 0.1 DINO adds "to avoid floating point error in the interpolation";
  timm / open_clip ViTs (timm `resample_abs_pos_embed`): size = (g, g) (offset 0).
Only towers whose position embeddings are one `pos_embed` array (backbones/vit.py's families and DreamSim's
members) are resized; any other family is refused in one line (CNNs need nothing: run them at their size).
"""
from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from visim_jax.backbones.base import Backbone
from visim_jax.core.errors import UserError

DINO_OFFSET = 0.1


def offset_for(name: str) -> float:
  """DINO's +0.1 for DINO towers and DreamSim (whose ViT code is DINO's), 0 (timm's size=) otherwise."""
  return DINO_OFFSET if name.startswith(('dino_', 'dreamsim')) else 0.0


def _pos_leaves(variables) -> list[tuple[tuple, np.ndarray]]:
  flat = jax.tree_util.tree_flatten_with_path(variables)[0]
  return [(path, leaf) for path, leaf in flat if getattr(path[-1], 'key', None) == 'pos_embed']


def at_image_size(backbone: Backbone, n: int, where: str = 'image_size') -> Backbone:
  """`backbone` reading n x n images (module docstring); n == its size returns it unchanged."""
  from visim_jax.backbones import dreamsim  # pylint: disable=g-import-not-at-top
  size = backbone.preprocess.size
  if isinstance(n, bool) or not isinstance(n, int) or not 16 <= n <= 4096:
    raise UserError(f'{where}={n!r}: an integer number of pixels in 16..4096')
  if n == size:
    return backbone
  leaves = _pos_leaves(backbone.variables)
  if not leaves:
    raise UserError(f'{where}={n}: {backbone.name} has no ViT position embeddings to interpolate (a CNN or a '
                    f'family whose positions are stored otherwise); it runs at its size {size}: drop image_size')
  m = math.isqrt(int(leaves[0][1].shape[1]) - 1)
  patch = size // m if m else 0
  if not m or m * patch != size or n % patch:
    raise UserError(f'{where}={n}: {backbone.name} has {patch} px patches on a {size} px input; give a multiple of '
                    f'{patch}')
  apply_fn = _apply_at(backbone.apply_fn, n)
  if apply_fn is None:
    raise UserError(f'{where}={n}: {backbone.name}: its network is not one of backbones/vit.py\'s (a tuned or '
                    f'wrapped tower); it runs at its size {size}: drop image_size')
  grid, offset = n // patch, offset_for(backbone.name)
  resized = {path: jnp.asarray(dreamsim.resize_pos_embed(np.asarray(leaf, np.float32), grid, offset,
                                                         f'{backbone.name} pos_embed')).astype(leaf.dtype)
             for path, leaf in leaves}
  variables = jax.tree_util.tree_map_with_path(lambda p, v: resized.get(p, v), backbone.variables)
  pre = backbone.preprocess
  resize_to = None if pre.resize_to is None else int(round(pre.resize_to * n / size))
  return dataclasses.replace(backbone, variables=variables, apply_fn=apply_fn,
                             preprocess=dataclasses.replace(pre, size=n, resize_to=resize_to),
                             description=f'{backbone.description} [position embeddings interpolated to {n} px]')


def _apply_at(apply_fn, n: int):
  """backbones/vit.py's apply (a partial over its Arch, or DreamSim's over its members) with every Arch's
  image_size set to n (the module declares pos_embed's shape from it); None for any other function."""
  import functools  # pylint: disable=g-import-not-at-top
  from visim_jax.backbones import vit  # pylint: disable=g-import-not-at-top
  if not isinstance(apply_fn, functools.partial):
    return None
  changed = False

  def at(v):
    nonlocal changed
    if isinstance(v, vit.Arch):
      changed = True
      return dataclasses.replace(v, image_size=n)
    if isinstance(v, tuple) and v and all(dataclasses.is_dataclass(b) and hasattr(b, 'arch') for b in v):
      changed = True
      return tuple(dataclasses.replace(b, arch=at(b.arch), tiny=at(b.tiny)) for b in v)
    return v
  args = tuple(at(a) for a in apply_fn.args)
  return functools.partial(apply_fn.func, *args, **apply_fn.keywords) if changed else None


def has_position_embeddings(backbone: Backbone) -> bool:
  """Whether the tower has `pos_embed` leaves `at_image_size` interpolates (a ViT; CNNs have none)."""
  return bool(_pos_leaves(backbone.variables))


HIDES_KEYS = 'visim_jax_vit_inside'   # an apply_fn attribute: a wrapper (zoo/tuned.py) of a vit.py tower


def is_vit(backbone: Backbone) -> bool:
  """Whether the tower runs backbones/vit.py's network (its Attention honours vit.key_weights: the library's masks):
  vit.py's apply itself, or a function that wraps it and says so (`HIDES_KEYS`: a tuned tower, LoRA merged)."""
  return (getattr(backbone.apply_fn, HIDES_KEYS, False)
          or _apply_at(backbone.apply_fn, backbone.preprocess.size) is not None)
