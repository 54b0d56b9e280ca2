"""A Similarity's map and masked distance (models/spatial.py's math wired to each spec kind): pure functions of the
params the library's `model.params` gives and float [0, 1] NHWC batches, so they jit, vmap and grad like
`apply_distance`.

  map_fn(sim)     -> f(params, x0, x1) -> (N, H, W)      or a UserError naming the spec (a model with no map)
  masked_fn(sim)  -> f(params, x0, x1, w) -> (N,)        w: (N, H, W) weights in [0, 1] at the input size

Embedding models take x at the network's input size (model.image_size) and return the map there.
"""
from __future__ import annotations

import jax.numpy as jnp

from visim_jax.core.errors import UserError
from visim_jax.zoo.interface import METRIC_KINDS

PIXEL = ('l1', 'l2', 'psnr')
WHERE = 'visim_jax.load'


def _metric_opts(sim):
  from visim_jax.models import classical  # pylint: disable=g-import-not-at-top
  target = sim.spec.partition(':')[2] or METRIC_KINDS[sim.kind]
  if sim.kind in ('ssim', 'ms_ssim'):
    return classical.SSIM_PRESETS[target]
  return classical.PixelOptions(target)


def _unit(x):
  x = jnp.asarray(x)
  return x.astype(jnp.float32) / 255.0 if x.dtype == jnp.uint8 else x.astype(jnp.float32)


def _dists_parts(params, x0, x1):
  from visim_jax.models import dists as dists_lib  # pylint: disable=g-import-not-at-top
  blocks = dists_lib._blocks_of(params)  # pylint: disable=protected-access
  return dists_lib.features(params, _unit(x0), blocks), dists_lib.features(params, _unit(x1), blocks)


def _embedding_stages(sim, params, x):
  x = sim.preprocess.normalise(_unit(x) * 255.0)
  _, stages = sim.backbone.apply_fn(params['backbone'], x)
  return stages


def _is_dreamsim(sim) -> bool:
  return str(sim.backbone.name).startswith('dreamsim')


def _check_embedding_layers(sim, for_mask: bool) -> None:
  from visim_jax.backbones import resolution  # pylint: disable=g-import-not-at-top
  from visim_jax.models import spatial  # pylint: disable=g-import-not-at-top
  stages = sim.backbone.stage_shapes()
  vit = resolution.is_vit(sim.backbone)
  for layer in sim.layers:
    s = stages[layer]
    local = len(s.shape) == 4 or (len(s.shape) == 3 and spatial.token_grid(s) is not None)
    if for_mask and not local and not vit:
      raise UserError(f'{WHERE}: {sim.spec!r}: a mask needs locations to pool, and layer {layer!r} is pooled from '
                      'the whole image by a network that cannot hide tokens (not a backbones/vit.py tower); use a '
                      'spec whose layers are maps or patch tokens (e.g. cosine:<backbone>@<block>), or '
                      'model.distance_map')
    if not for_mask and not local and not spatial.token_source(stages, layer):
      raise UserError(f'{WHERE}: {sim.spec!r}: no distance map: layer {layer!r} is a pooled vector with no map or '
                      'patch tokens before it (a pooled-only head); use model.distance')


def map_fn(sim):
  """f(params, x0, x1) -> (N, H, W) for this Similarity (models/spatial.py's docstring says what each map is)."""
  from visim_jax.models import lpips, spatial  # pylint: disable=g-import-not-at-top
  if sim.backbone is not None:
    _check_embedding_layers(sim, for_mask=False)
    norm = _is_dreamsim(sim)

    def emb(params, x0, x1):
      r0 = spatial.location_rows(_embedding_stages(sim, params, x0), sim.layers, norm)
      r1 = spatial.location_rows(_embedding_stages(sim, params, x1), sim.layers, norm)
      if sim.transform is not None:
        r0, r1 = sim.transform(r0), sim.transform(r1)
      n, h, w = r0.shape[:3]
      d = sim.distance(params['head'], r0.reshape(n * h * w, -1), r1.reshape(n * h * w, -1)).reshape(n, h, w)
      return spatial.to_size(d, x0.shape[1:3])
    return emb
  if sim.kind == 'lpips':
    return lambda params, x0, x1: lpips.distance_map(params, lpips.embed(params, _unit(x0)),
                                                     lpips.embed(params, _unit(x1)), x0.shape[1:3])
  if sim.kind == 'dists':
    return lambda params, x0, x1: spatial.dists_map(params, *_dists_parts(params, x0, x1), x0.shape[1:3])
  if sim.kind in PIXEL or sim.kind in ('ssim', 'ms_ssim'):
    opts = _metric_opts(sim)
    fn = {'ssim': spatial.ssim_map, 'ms_ssim': spatial.ms_ssim_map}.get(sim.kind)
    if fn is None:
      return lambda params, x0, x1: spatial.pixel_map(sim.kind, x0, x1, opts)
    return lambda params, x0, x1: fn(_unit(x0), _unit(x1), opts)
  raise UserError(f'{WHERE}: {sim.spec!r}: {sim.kind} has no distance map (one score per pair); use model.distance')


def masked_fn(sim):
  """f(params, x0, x1, w) -> (N,): the model's distance over the w-weighted locations (models/spatial.py)."""
  from visim_jax.models import lpips, spatial  # pylint: disable=g-import-not-at-top
  if sim.backbone is not None:
    from visim_jax.backbones import resolution, vit  # pylint: disable=g-import-not-at-top
    import contextlib  # pylint: disable=g-import-not-at-top
    _check_embedding_layers(sim, for_mask=True)
    hide = resolution.is_vit(sim.backbone)   # ViT towers: masked-out patches hidden from attention too

    def emb(params, x0, x1, w):
      with vit.key_weights(w) if hide else contextlib.nullcontext():
        s0, s1 = _embedding_stages(sim, params, x0), _embedding_stages(sim, params, x1)
      f0 = spatial.masked_pool(s0, sim.layers, w)
      f1 = spatial.masked_pool(s1, sim.layers, w)
      if sim.transform is not None:
        f0, f1 = sim.transform(f0), sim.transform(f1)
      return sim.distance(params['head'], f0, f1)
    return emb
  if sim.kind == 'lpips':
    return lambda params, x0, x1, w: spatial.lpips_masked(params['lin'], lpips.embed(params, _unit(x0)),
                                                          lpips.embed(params, _unit(x1)), w)
  if sim.kind == 'dists':
    return lambda params, x0, x1, w: spatial.dists_masked(params, *_dists_parts(params, x0, x1), w)
  if sim.kind in PIXEL or sim.kind in ('ssim', 'ms_ssim'):
    opts = _metric_opts(sim)
    if sim.kind in PIXEL:
      return lambda params, x0, x1, w: spatial.pixel_masked(sim.kind, x0, x1, w, opts)
    fn = spatial.ssim_masked if sim.kind == 'ssim' else spatial.ms_ssim_masked
    return lambda params, x0, x1, w: fn(_unit(x0), _unit(x1), w, opts)
  raise UserError(f'{WHERE}: {sim.spec!r}: {sim.kind} takes no mask (one score per pair); use model.distance')
