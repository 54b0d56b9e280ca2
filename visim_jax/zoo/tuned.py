"""`tuned:<tune workdir | tuned.npz>`: the tower a `tune` run trained, as a model like any other.

The pretrained backbone its meta names (the weights must be the ones the run tuned: their sha256 is checked) with
the run's LoRA factors merged into its kernels (W + alpha / r B A: plain weights, as DreamSim's released models) or
its fully tuned parameters, embedding each image as the run did (training/tower_step.embed without dropout: the
run's feature, token 0 of a sequence or the spatial mean of a map, then the head when one was trained). The tuned
tower is an ordinary Backbone whose stage 'tuned' is that embedding, weights_id 'tuned:<sha256 of tuned.npz>', so
the feature cache, the leaderboard, `vj.load` (embed, distance, the pure apply) and the search take it as they take
a pretrained one. Distance: 1 - cos of the embeddings (the features' cache L2-normalises rows; a run trained on dot
products is ranked by cosine here: docs/tuning.md).
"""
from __future__ import annotations

import dataclasses
import json
import os

import jax

from visim_jax.data.preprocess import Preprocess
from visim_jax.zoo.interface import (Similarity, backbone_from, backbone_identity, bad, cosine_distance, file_sha,
                                     pooled_featurizer, run_file)

STAGE = 'tuned'


def tuned_backbone(spec: str, path: str):
  """(the tuned Backbone with its 'tuned' stage, meta) of a tuned.npz."""
  from visim_jax.core.errors import UserError
  from visim_jax.models import lora as lora_lib
  from visim_jax.training import tower_step, tuned_file
  try:
    meta, trainable = tuned_file.load(path)
  except UserError as e:
    raise bad(spec, str(e)) from None
  base, _ = backbone_from(spec, meta['backbone'], None, meta.get('weights_sha256'))
  tower = tower_step.tower(base, feature=meta.get('feature') or None, head=meta.get('head', 'identity'),
                           head_size=int(meta.get('head_size') or 0))
  lcfg = meta.get('lora') or {}
  hp = tower_step.Hparams(tune='frozen', lora=lora_lib.Config(**{**lcfg, 'targets': tuple(lcfg.get('targets', ()))}))
  if meta['tune'] == 'lora':
    variables = lora_lib.merge_variables(base.variables, trainable['lora'], hp.lora)
  elif meta['tune'] == 'full':
    variables = {**base.variables, 'params': trainable['tower']}
  else:
    variables = base.variables
  head = {'head': trainable['head']} if 'head' in trainable else {}
  bare = dataclasses.replace(tower, normalise=lambda x, *a, **k: x)   # the Backbone hands apply_fn normalised images

  def apply_fn(v, x):
    final, stages = base.apply_fn(v['tower'], x)
    return final, {**stages, STAGE: tower_step.embed(hp, bare, v['head'], v['tower'], x)}
  sha = file_sha(path)
  pre = meta.get('preprocessing')   # the pixels it was tuned on (config.pixels='alignet': AligNet's [0, 1])
  pre = base.preprocess if not pre else Preprocess(**{k: tuple(v) if isinstance(v, list) else v for k, v in pre.items()})
  tuned = dataclasses.replace(base, apply_fn=apply_fn, variables={'tower': variables, 'head': head}, preprocess=pre,
                              layers=(STAGE,), weights_id=f'tuned:{sha}',
                              description=f'{base.name} tuned ({meta["tune"]}) by {meta.get("workdir", path)}')
  return tuned, meta


def model(spec, target, option, opts):
  path = run_file(spec, 'tuned', target, option, 'tuned.npz')
  if not os.path.isfile(path):
    raise bad(spec, f'{path}: no tuned.npz (give the workdir of a finished tune run)')
  backbone, meta = tuned_backbone(spec, path)
  layers = (STAGE,)
  ident = {**backbone_identity(backbone, layers), 'base_weights_sha256': meta.get('weights_sha256'),
           'tune': meta['tune']}
  return Similarity(spec, 'tuned', cosine_distance, None, pooled_featurizer(backbone, layers, opts), ident,
                    backbone.preprocess, ('pooled', json.dumps(ident, sort_keys=True)), backbone=backbone,
                    layers=layers)



def export(target: str, out: str | None = None) -> str:
  """Writes the tuned tower's merged weights (LoRA folded in: plain weights, no LoRA code needed to use them) as
  <out> (default <workdir>/merged.npz): 'variables/<path>' arrays in the backbone's flax layout, and the head's as
  'head/<path>', with a JSON meta (the backbone, the feature, head, similarity, tune); returns the path."""
  import numpy as np
  from visim_jax.training import runtime
  spec = f'tuned:{target}'
  path = os.path.join(target, 'tuned.npz') if os.path.isdir(target) else target
  if not os.path.isfile(path):
    raise bad(spec, f'{path}: no tuned.npz (give the workdir of a finished tune run)')
  backbone, meta = tuned_backbone(spec, path)
  out = out or os.path.join(os.path.dirname(os.path.abspath(path)), 'merged.npz')
  flat = {}
  for top, tree in (('variables', backbone.variables['tower']), ('head', backbone.variables['head'])):
    for kp, v in jax.tree_util.tree_flatten_with_path(tree)[0]:
      flat[top + '/' + '/'.join(str(getattr(k, 'key', k)) for k in kp)] = np.asarray(v)
  runtime.write_npz(out, **flat, meta=np.asarray(json.dumps({**meta, 'merged': True}, sort_keys=True, default=str)))
  return out
