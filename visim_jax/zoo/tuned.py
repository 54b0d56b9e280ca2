"""`tuned:<tune workdir | tuned.npz>`: the tower a `tune` run trained, as a model like any other.

The pretrained backbone its meta names (the weights must be the ones the run tuned: their sha256 is checked) with
the run's LoRA factors merged into its kernels (W + alpha / r B A: plain weights, as DreamSim's released models) or
its fully tuned parameters, embedding each image as the run did (training/tower_step.embed without dropout: the
run's feature, token 0 of a sequence or the spatial mean of a map, then the head when one was trained). The tuned
tower is an ordinary Backbone whose stage 'tuned' is that embedding, weights_id 'tuned:<sha256 of tuned.npz>', so
the feature cache, the leaderboard, `vj.load` (embed, distance, the pure apply) and the search take it as they take
a pretrained one. Distance: 1 - cos of the embeddings (the features' cache L2-normalises rows; a run trained on dot
products is ranked by cosine here: docs/tuning.md).

`tuned:<peft adapter folder>[@<backbone>]`: a peft save_pretrained folder (adapter_config.json + adapter_model.
safetensors | .bin; DreamSim's training writes one an epoch) read by training/peft_file.py: the LoRA merged into the
tower it names or DreamSim's un-tuned tower it fits (`dreamsim_ensemble_pretrained`, ...), embedding with that
tower's feature ('concat', as DreamSim's eval_percep.py). `export_peft` writes a LoRA run in that form.
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


def tuned_backbone(spec: str, path: str, option: str = '', base=None):
  """(the tuned Backbone with its 'tuned' stage, meta) of a tuned.npz or of a peft adapter folder (its tower
  `option` or as training/peft_file.py finds it); `base`: the pretrained Backbone to apply it to (default: the one
  the meta names, its weights checked)."""
  from visim_jax.backbones import resolution
  from visim_jax.core.errors import UserError
  from visim_jax.models import lora as lora_lib
  from visim_jax.training import peft_file, tower_step, tuned_file
  sha_of = path
  try:
    if peft_file.is_adapter(path):
      meta, trainable, sha_of = peft_file.load(path, option)
    else:
      meta, trainable = tuned_file.load(path)
  except UserError as e:
    raise bad(spec, str(e)) from None
  if base is None:
    base, _ = backbone_from(spec, meta['backbone'], None, meta.get('weights_sha256'))
  if meta.get('weights_sha256') is None:   # a peft folder DreamSim wrote: the base it was applied to, recorded
    meta = {**meta, 'weights_sha256': base.weights_id}           # (the feature cache's identity holds it)
  tower = tower_step.tower(base, feature=meta.get('feature') or None, head=meta.get('head', 'identity'),
                           head_size=int(meta.get('head_size') or 0))
  lcfg = meta.get('lora') or {}
  hp = tower_step.Hparams(tune='frozen', lora=lora_lib.Config(**{**lcfg, 'targets': tuple(lcfg.get('targets', ()))}))
  if meta['tune'] == 'lora':
    try:
      variables = lora_lib.merge_variables(base.variables, trainable['lora'], hp.lora)
    except UserError as e:   # an adapter of another tower
      raise bad(spec, f'{path}: {e} ({base.name})') from None
  elif meta['tune'] == 'full':
    variables = {**base.variables, 'params': trainable['tower']}
  else:
    variables = base.variables
  head = {'head': trainable['head']} if 'head' in trainable else {}
  bare = dataclasses.replace(tower, normalise=lambda x, *a, **k: x)   # the Backbone hands apply_fn normalised images

  def apply_fn(v, x):
    final, stages = base.apply_fn(v['tower'], x)
    return final, {**stages, STAGE: tower_step.embed(hp, bare, v['head'], v['tower'], x)}
  # every Attention it runs is the base's: a mask hides patch keys in it as in the base (zoo/spatial.py)
  setattr(apply_fn, resolution.HIDES_KEYS, resolution.is_vit(base))
  sha = file_sha(sha_of)
  pre = meta.get('preprocessing')   # the pixels it was tuned on (config.pixels='alignet': AligNet's [0, 1])
  pre = base.preprocess if not pre else Preprocess(**{k: tuple(v) if isinstance(v, list) else v for k, v in pre.items()})
  tuned = dataclasses.replace(base, apply_fn=apply_fn, variables={'tower': variables, 'head': head}, preprocess=pre,
                              layers=(STAGE,), weights_id=f'tuned:{sha}',
                              description=f'{base.name} tuned ({meta["tune"]}) by {meta.get("workdir", path)}')
  return tuned, meta


def _peft_folder(target: str) -> bool:
  """A peft save_pretrained folder (DreamSim's epoch_<N>/, our export) and not a tune workdir."""
  from visim_jax.training import peft_file
  return peft_file.is_adapter(target) and not os.path.isfile(os.path.join(target, 'tuned.npz'))


def model(spec, target, option, opts):
  if _peft_folder(target):   # tuned:<peft folder>[@<backbone>]
    path = target
  else:
    path = run_file(spec, 'tuned', target, option, 'tuned.npz')
    if not os.path.isfile(path):
      raise bad(spec, f'{path}: no tuned.npz (give the workdir of a finished tune run, or a peft adapter folder)')
  backbone, meta = tuned_backbone(spec, path, option)
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


def export_peft(target: str, out: str | None = None) -> str:
  """Writes a LoRA run's factors as a peft adapter folder (training/peft_file.py: adapter_config.json +
  adapter_model.safetensors in DreamSim's names, what PeftModel.from_pretrained loads) at <out> (default
  <workdir>/peft_adapter); returns the folder. A fully tuned tower or a trained head has no peft LoRA form."""
  from visim_jax.core.errors import UserError
  from visim_jax.training import peft_file, tuned_file
  spec = f'tuned:{target}'
  path = os.path.join(target, 'tuned.npz') if os.path.isdir(target) else target
  if not os.path.isfile(path):
    raise bad(spec, f'{path}: no tuned.npz (give the workdir of a finished tune run)')
  try:
    meta, trainable = tuned_file.load(path)
  except UserError as e:
    raise bad(spec, str(e)) from None
  if meta['tune'] != 'lora' or 'head' in trainable:
    raise bad(spec, f"{path}: tune={meta['tune']!r}, head={meta.get('head')!r}: only LoRA factors without a trained "
                    "head have peft's form (write the merged weights instead: --format=merged)")
  out = out or os.path.join(os.path.dirname(os.path.abspath(path)), 'peft_adapter')
  try:
    return peft_file.save(out, trainable['lora'], meta['lora'], meta)
  except UserError as e:
    raise bad(spec, str(e)) from None
