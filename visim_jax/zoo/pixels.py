"""A Similarity's distance as a pure function of pixels, for gradients with respect to the images (the attacks of
metrics/attacks.py; docs/robustness.md): `pixel_distance(sim) -> (fn, params)` with fn(params, x0, x1) -> (N,),
x float NHWC in [0, 1] (embedding models at `sim.preprocess.size`), or a one-line reason when there is none.

  lpips:*             lpips.distance of lpips.embed (LPIPS's own scaling inside), at the protocol's resolution
  psnr ssim ... dists the metric itself (models/classical.py, models/dists.py take floats in [0, 1])
  cosine / adapter /  the backbone's normalisation, its stages, the pooled layers, the head's transform and
  simnet / ...        distance: the path `features.extract` takes, without the uint8 rounding (api.Model.apply)
  no backbone         (a model read from a precomputed feature cache): None, with the reason
"""
from __future__ import annotations

from typing import Any, Callable

from visim_jax.zoo.interface import METRIC_KINDS, Similarity


def pixel_distance(sim: Similarity) -> tuple[Callable, Any] | str:
  if sim.kind == 'lpips':
    from visim_jax.models import lpips
    params = getattr(sim.params, 'params', sim.params)
    return (lambda p, x0, x1: lpips.distance(p, lpips.embed(p, x0), lpips.embed(p, x1))), params
  if sim.kind in METRIC_KINDS:
    return sim.distance, sim.params
  if sim.backbone is None:
    return (f'{sim.spec}: not differentiable with respect to the pixels here (its distances come from features '
            'computed elsewhere, no backbone in the model)')
  from visim_jax.backbones import features

  def rows(params, x):
    _, stages = sim.backbone.apply_fn(params['backbone'], sim.preprocess.normalise(x * 255.0))
    f = features.pool(stages, sim.layers)
    return f if sim.transform is None else sim.transform(f)

  def fn(params, x0, x1):
    return sim.distance(params['head'], rows(params, x0), rows(params, x1))
  return fn, {'backbone': sim.backbone.variables, 'head': sim.params}
