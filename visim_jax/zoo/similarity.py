"""One interface for "a model that says how similar two images are", used by every benchmark protocol.

A `Similarity` is two functions and what feeds them:

  features = sim.featurize(paths, tag)        host: one feature row (or pytree of rows) per image, computed once
                                               per image set (pooled backbone features go through features.py's
                                               on-disk cache; the others are kept in memory for the run)
  d = sim.distance(sim.params, f0, f1)         pure, jittable, vmappable: (B, ...) x (B, ...) -> (B,) float32;
                                               SMALLER = MORE SIMILAR (cosine: 1 - cos; SimNet: -g([x0, x1]))
  pair_distances(sim, feats0, i, feats1, j)    the jitted boundary: d for rows i of feats0 against rows j of feats1,
                                               in fixed-size batches (one compilation for any count)
  distance_matrix(sim, feats0, feats1)          (N0, N1), row blocks vmapped (retrieval protocols: aR@k)

A spec string names one model (`config.models` is a comma-separated list of them):

  cosine:<backbone>[:tiny][@<layer>+<layer>...]   a registered backbone (`--list_backbones`), its pooled
                                                  multi-layer vector (features.py: spatial mean, L2 per layer,
                                                  concatenated; default layers as everywhere else), 1 - cosine.
                                                  ':tiny' = the family's tiny random member (tests, demos)
  adapter:<adapter.npz | paper-001 workdir>        paper 001's PCA + ReLU(W .) on the backbone features its meta
                                                  names (adapter_file.load_adapter), 1 - cosine of the adapted vectors
  simnet:<paper-002 workdir>                       SimNet g([x0, x1]) on the workdir's backbone features (L2 when
                                                  the run normalised them); distance -g. Not symmetric: the
                                                  protocols pass (reference, candidate) in that order
  context:<paper-004 workdir>[@<model>|@mean]      a CoSIS context-sensitive embedding head e(x) = x W on the
                                                  workdir's backbone features, 1 - cos(e(x0), e(x1)); @global (the
                                                  default when trained), @<context> (indoor, city, ...), or @mean:
                                                  the equal-weight fused distance of the 8 context models (the
                                                  ensembles' weighted rule with w_k = 1/K)
  triplets:<learn_triplets workdir | head.npz>   the head a `learn_triplets` run trained (its head.npz) on the
                                                  backbone features its meta names; 1 - cos of the head's
                                                  embeddings, or -<e0, e1> when it was trained on dot products
  tuned:<tune workdir | tuned.npz>                the tower a `tune` run trained (LoRA merged or fully tuned,
                                                  zoo/tuned.py): its own embedding, 1 - cos
  tuned:<peft adapter folder>[@<backbone>]        a peft LoRA folder (DreamSim's epoch_<N>/, export --format=peft;
                                                  training/peft_file.py) merged into its tower
  lpips:alex | lpips:vgg [:tiny]                  LPIPS v0.1 (visim_jax/models/lpips.py): the images themselves are the
                                                  features (uint8 at the protocol's resolution: BAPPS 64x64 native,
                                                  224 elsewhere), the network runs inside `distance` (its spatial
                                                  maps would cost ~2 MB an image at 224)
  psnr | ssim | ms_ssim | l1 | l2 [:<variant>]     full-reference metrics (models/classical.py, docs/metrics.md) on the
  dists [:vgg[:tiny]]                             images, as LPIPS; distances 1 - ssim, 1 - ms_ssim, -psnr, l1, l2,
                                                  DISTS. Variants: ssim / ms_ssim presets (pytorch_msssim, piq,
                                                  skimage, lpips_lab), psnr / l1 / l2 colours (rgb, grey, y, lab)
  fsim | gmsd | ms_gmsd | vif_p | haarpsi | mdsi   the IQA metrics of models/iqa (its METRICS registry: piq's choices
  | vsi | srsim | dss | iw_ssim [:<variant>]     by default); distance 1 - s, or GMSD / MS-GMSD / MDSI themselves;
                                                  (reference, candidate) order: the metric gets (candidate, reference)

Reading a spec never decodes an image; a bad spec is one line naming config.models and the entry.
"""
from __future__ import annotations

import json


from visim_jax.zoo import from_runs, interface, tuned
from visim_jax.zoo.scoring import ImageTable
from visim_jax.zoo.interface import (Options, Similarity, backbone_from, backbone_identity, bad, cosine_distance, parse,
                                pooled_featurizer)
from visim_jax.zoo.interface import METRIC_KINDS


def build(spec: str, opts: Options = Options()) -> Similarity:
  """The model a spec names (weights and files read now: a missing one fails here, naming the entry)."""
  kind, target, option = parse(spec)
  return {'cosine': _cosine, 'adapter': from_runs.adapter, 'simnet': from_runs.simnet_model,
          'context': from_runs.context_model, 'lpips': _lpips, 'triplets': from_runs.triplets_model,
          'tuned': tuned.model, **{k: _metric for k in METRIC_KINDS}}[kind](spec, target, option, opts)


def _cosine(spec, target, option, opts):
  name, _, variant = target.partition(':')
  if variant not in ('', 'tiny'):
    raise bad(spec, "the only variant after the backbone name is ':tiny'")
  layers = tuple(l for l in option.split('+') if l) if option else None
  backbone, layers = backbone_from(spec, name, layers, tiny=variant == 'tiny')
  ident = backbone_identity(backbone, layers)
  return Similarity(spec, 'cosine', cosine_distance, None, pooled_featurizer(backbone, layers, opts), ident,
                    backbone.preprocess, ('pooled', json.dumps(ident, sort_keys=True)), backbone=backbone,
                    layers=layers)


def _lpips(spec, target, option, opts):
  try:
    from visim_jax.models import lpips
  except ImportError as e:
    raise bad(spec, f'LPIPS is not available ({e})') from None
  net, _, variant = target.partition(':')
  model = lpips.load_lpips(net, tiny=variant == 'tiny')
  net_id = getattr(model, 'weights_id', None) or target

  def distance(params, u0, u1):   # uint8 images (embed divides by 255: its [0, 1] input, then LPIPS's scaling)
    return lpips.pair_distance(params, u0, u1)   # identical images: exactly 0, as the reference

  def featurize(paths, tag, pre):
    if pre is None:
      raise ValueError('lpips needs the protocol resolution')
    return ImageTable(tuple(paths), pre)
  return Similarity(spec, 'lpips', distance, model, featurize, {'lpips': target, 'version': '0.1',
                                                                'weights': str(net_id)}, None, ('images',))


def _images(paths, tag, pre):
  """The image kinds' features: the images themselves, decoded at the protocol's resolution when rows are taken."""
  if pre is None:
    raise ValueError('image metrics need the protocol resolution')
  return ImageTable(tuple(paths), pre)


def _metric(spec, target, option, opts):
  """psnr / ssim / ms_ssim / l1 / l2 (models/classical.py) and dists (models/dists.py) on the images, as LPIPS."""
  import dataclasses
  from visim_jax.core.errors import UserError
  from visim_jax.models import classical
  kind = spec.partition(':')[0]
  if option:
    raise bad(spec, f'{kind} takes no @option')
  if kind in interface.IQA_KINDS:
    from visim_jax.models import iqa
    variants = iqa.METRICS[kind].variants
    if target not in variants:
      raise bad(spec, f'{kind} variants: {", ".join(f"{kind}:{v}" for v in variants)}')
    fn = iqa.distance(kind, variants[target])
    distance = lambda params, u0, u1: fn(u0, u1)   # noqa: E731  (params unused)
    ident = {'metric': kind, 'options': dataclasses.asdict(variants[target])}
    return Similarity(spec, kind, distance, None, _images, ident, None, ('images',),
                      symmetric=kind not in ('vif_p', 'mdsi', 'iw_ssim'))
  if kind == 'dists':
    from visim_jax.models import dists as dists_lib
    if target not in ('vgg', 'vgg:tiny'):
      raise bad(spec, "DISTS runs on VGG16: 'dists', 'dists:vgg' (or 'dists:vgg:tiny': random weights)")
    try:
      params = dists_lib.load_dists(tiny=target.endswith(':tiny'))
    except UserError as e:
      raise bad(spec, str(e)) from None
    distance = dists_lib.pair_distance
    ident = {'metric': 'dists', 'weights': params.weights_id}
  else:
    variants = (classical.SSIM_PRESETS if kind in ('ssim', 'ms_ssim') else
                {c: classical.PixelOptions(c) for c in classical.COLOURS})
    if target not in variants:
      raise bad(spec, f'{kind} variants: {", ".join(f"{kind}:{v}" for v in variants)}')
    fn = classical.distance(kind, variants[target])
    distance = lambda params, u0, u1: fn(u0, u1)   # noqa: E731  (params unused)
    params, ident = None, {'metric': kind, 'options': dataclasses.asdict(variants[target])}
  return Similarity(spec, kind, distance, params, _images, ident, None, ('images',))
