"""The tune experiment's memory estimate, made before anything is allocated on a device.

Parameters, gradients and optimiser state are counted from the trees' shapes; the activations per image are
measured, not guessed: the residuals that jax.vjp keeps for the backward pass of the tower's embedding, traced
abstractly (jax.eval_shape: nothing computed or allocated) at 2 images and at 1, the difference being one image's
share (the weights, which every trace keeps, cancel). With rematerialisation only each block's input is kept,
plus one block's inside while it is recomputed: that figure is traced the same way (remat on) and the block's
share added as the no-remat residuals / number of blocks. core/memory.check_tower refuses, naming the field.

With `adversarial` each pass first runs the attack on its references: one forward + backward of the tower per APGD
step, with respect to the pixels (no parameter gradients): its residuals (traced the same way, per triplet) and the
APGD loop's images make the part 'attack', what the attack holds beyond the step's own activations (it ends before
they are made); a refusal where it is the largest part names config.adversarial.

XLA:CPU does not honour rematerialisation: its pipeline expands jax.checkpoint's optimisation barriers away and
the recomputed forward is merged back into the kept one (measured, jax 0.10.2: the compiled step of a full
SigLIP-B/16 tuning at 96 images a pass holds 23.43 GiB of temporaries with remat and without; a tiny ViT's 159 MB
with, 145 MB without). On a CPU the estimate therefore counts the activations of no remat whatever config.remat
says, and a refusal never suggests it (`remat_saves`); on GPUs and TPUs it halves to a tenth of them.
"""
from __future__ import annotations

import dataclasses
import re

import jax
import numpy as np

from visim_jax.core import memory


def _nbytes(tree) -> int:
  return int(sum(np.prod(l.shape) * np.dtype(l.dtype).itemsize for l in jax.tree.leaves(tree)))


def _count(tree) -> int:
  return int(sum(np.prod(l.shape) for l in jax.tree.leaves(tree)))


def residuals_per_image(hp, tower, trainable, frozen, image_shape, dtype) -> int:
  """Bytes the backward pass of `tower_step.embed` keeps per image (see the module docstring)."""
  from visim_jax.training import tower_step

  def res(n):
    def pullback(t, x):
      return jax.vjp(lambda t: tower_step.embed(hp, tower, t, frozen, x), t)[1]
    return _nbytes(jax.eval_shape(pullback, trainable, jax.ShapeDtypeStruct((n,) + tuple(image_shape), dtype)))
  return max(0, res(2) - res(1))


def attack_residuals_per_item(hp, tower, trainable, frozen, image_shape) -> int:
  """Bytes the attack's backward pass (`adversarial`: the gradient of the 2AFC cross-entropy at the reference,
  tower_step.adversarial_refs) keeps per triplet: the residuals of jax.vjp of the distances d(z, p0), d(z, p1) with
  respect to the reference z (2 embeddings of z with their residuals, p0 and p1 forward only), traced at 2 triplets
  and at 1 as `residuals_per_image`."""
  import jax.numpy as jnp
  from visim_jax.training import tower_step
  dist = tower_step.pixel_distance(hp, tower, frozen)

  def res(n):
    def pullback(t, z, a, b):
      return jax.vjp(lambda z: dist(t, jnp.concatenate([z, z]), jnp.concatenate([a, b])), z)[1]
    x = jax.ShapeDtypeStruct((n,) + tuple(image_shape), np.float32)
    return _nbytes(jax.eval_shape(pullback, trainable, x, x, x))
  return max(0, res(2) - res(1))


ATTACK_STATE_IMAGES = 12   # float32 images an attacked triplet keeps across APGD steps (its 3 images, the iterate,
                           # the previous one, the gradient, the best point and its gradient, the last wrong one, ...)


def remat_saves(backend: str | None = None) -> bool:
  """Whether rematerialisation lowers the peak on `backend` (default: JAX's): not on XLA:CPU (module docstring)."""
  return (backend or jax.default_backend()) != 'cpu'


def n_blocks(backbone) -> int:
  """Blocks a remat'd tower recomputes one at a time (stages named block<k>, at least 1)."""
  return max(1, sum(bool(re.fullmatch(r'.*block_?\d+', s)) for s in backbone.stage_names()))


def estimate(hp, tower, backbone, trainable, image_shape, images_per_device: int, fsdp: int):
  """(parts for hp.remat, parts with remat on or None, sizes text): core/memory.tower_parts of this run (trainable:
  the abstract trainable tree of tower_step.init_state)."""
  frozen = backbone.variables
  if hp.tune == 'full':
    frozen = {k: v for k, v in frozen.items() if k != 'params'}
  n_all, n_train = _count(frozen) + _count(trainable), _count(trainable)
  dtype = np.float32 if backbone.preprocess.interpolation == 'torch_bilinear' else np.uint8
  opt = dict(opt_slots=2, init_copy=hp.weight_decay > 0, fsdp=fsdp)
  plain = residuals_per_image(dataclasses.replace(hp, remat=False), tower, trainable, frozen, image_shape, dtype)
  if hp.remat and remat_saves():
    act = residuals_per_image(hp, tower, trainable, frozen, image_shape, dtype) + plain / n_blocks(backbone)
    parts, other = memory.tower_parts(n_all, n_train, act, images_per_device, **opt), None
  else:
    parts = memory.tower_parts(n_all, n_train, plain, images_per_device, **opt)
    other = None
    if parts['activations'] > 0.5 * memory.limit_bytes() and remat_saves():   # only then is remat worth a trace
      r = residuals_per_image(dataclasses.replace(hp, remat=True), tower, trainable, frozen, image_shape, dtype)
      other = memory.tower_parts(n_all, n_train, r + plain / n_blocks(backbone), images_per_device, **opt)
  sizes = (f'{n_all:,} parameters, {n_train:,} trainable, {images_per_device} images a device a pass, '
           f'{parts["activations"] / max(images_per_device, 1) / 2**20:,.1f} MiB of activations an image'
           + ('' if remat_saves() or not hp.remat else ' (remat saves nothing on XLA:CPU)'))
  if hp.adv_eps:
    attack, per = _attack(hp, tower, trainable, frozen, image_shape, images_per_device, backbone)
    parts['attack'] = max(0.0, attack - parts['activations'])
    if other is not None:
      other['attack'] = max(0.0, attack - other['activations'])
    sizes += f'; the attack {per / 2**20:,.1f} MiB a triplet'
  return parts, other, sizes


def _attack(hp, tower, trainable, frozen, image_shape, images_per_device: int, backbone) -> tuple[float, float]:
  """(bytes of the attack's peak, bytes a triplet) in a pass of `adversarial`: its backward pass's residuals and the
  state of the APGD loop for the pass's triplets. It runs before the step's own forward and backward (its
  residuals are freed by then), so the estimate's part 'attack' is what it holds beyond the step's activations."""
  per = attack_residuals_per_item(dataclasses.replace(hp, remat=False), tower, trainable, frozen, image_shape)
  if hp.remat and remat_saves():
    per = attack_residuals_per_item(hp, tower, trainable, frozen, image_shape) + per / n_blocks(backbone)
  per += ATTACK_STATE_IMAGES * int(np.prod(image_shape)) * 4
  triplets = images_per_device // (4 if hp.two_refs else 3)
  return float(per) * triplets, float(per)


def check(hp, tower, backbone, trainable, image_shape, images_per_device: int, fsdp: int) -> dict:
  """The estimate, refused in one line when it does not fit; returns the parts (recorded in metrics.json)."""
  parts, other, sizes = estimate(hp, tower, backbone, trainable, image_shape, images_per_device, fsdp)
  memory.check_tower(parts, sizes, hp.remat, other)
  return {k: int(v) for k, v in parts.items()}
