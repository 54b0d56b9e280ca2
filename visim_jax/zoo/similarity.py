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
  lpips:alex | lpips:vgg [:tiny]                  LPIPS v0.1 (visim_jax/models/lpips.py): the images themselves are the
                                                  features (uint8 at the protocol's resolution: BAPPS 64x64 native,
                                                  224 elsewhere), the network runs inside `distance` (its spatial
                                                  maps would cost ~2 MB an image at 224)

Reading a spec never decodes an image; a bad spec is one line naming config.models and the entry.
"""
from __future__ import annotations

import json


from visim_jax.zoo import from_runs, tuned
from visim_jax.zoo.scoring import ImageTable
from visim_jax.zoo.interface import (Options, Similarity, backbone_from, backbone_identity, bad, cosine_distance, parse,
                                pooled_featurizer)


def build(spec: str, opts: Options = Options()) -> Similarity:
  """The model a spec names (weights and files read now: a missing one fails here, naming the entry)."""
  kind, target, option = parse(spec)
  return {'cosine': _cosine, 'adapter': from_runs.adapter, 'simnet': from_runs.simnet_model,
          'context': from_runs.context_model, 'lpips': _lpips, 'triplets': from_runs.triplets_model,
          'tuned': tuned.model}[kind](spec, target, option, opts)


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
