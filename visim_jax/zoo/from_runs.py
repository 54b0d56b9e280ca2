"""Models a training run wrote, by spec: adapter: (paper 001), simnet: (paper 002), context: (paper 004), triplets:
(learn_triplets' head). Each reads its workdir's files (adapter.npz, Orbax checkpoints, head.npz) and the backbone
its meta names, and refuses a missing or foreign file in one line naming the spec.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os

import jax
import jax.numpy as jnp
import numpy as np

from visim_jax.core import cpu_kernels
from visim_jax.core import ops
from visim_jax.core.errors import UserError
from visim_jax.zoo.interface import (FIELD, Similarity, backbone_from, backbone_identity, bad, cosine_distance, file_sha,
                                pooled_featurizer, run_file)


def _simnet_distance(params, f0, f1):
  from visim_jax.models import simnet
  return -simnet.apply(params, f0.astype(jnp.float32), f1.astype(jnp.float32))


def _context_distance(params, f0, f1):
  """Mean over the stacked heads W (K, D, E) of 1 - cos(f0 W_k, f1 W_k) (K = 1 for one model)."""
  def one(w):
    return cosine_distance(None, f0.astype(jnp.float32) @ w, f1.astype(jnp.float32) @ w)
  return jax.vmap(one)(params['w']).mean(0)


def _dot_distance(params, f0, f1):
  """-<f0, f1> row-wise (a head trained on raw dot products; params unused)."""
  del params
  return -jnp.sum(f0.astype(jnp.float32) * f1.astype(jnp.float32), -1)


def adapter(spec, target, option, opts):
  from visim_jax.training import adapter_file
  path = run_file(spec, 'adapter', target, option, 'adapter.npz')
  if not os.path.isfile(path):
    from visim_jax.training import workdir
    kind = workdir.recorded_experiment(target) if os.path.isdir(target) else None
    if kind == 'adapt':
      advice = f'write it from its checkpoints with `python -m visim_jax.export --workdir={target}`'
    elif kind == 'nights_adapt':
      advice = ('a nights_adapt run writes it when it ends (config.model=adapter): rerun that command to finish it; '
                'a triplet head is not an adapter')
    else:
      advice = 'give an adaptation workdir or an adapter.npz file'
    raise bad(spec, f'{path}: no adapter.npz; {advice}')
  try:
    ad = adapter_file.load_adapter(path)
  except UserError as e:
    raise bad(spec, str(e)) from None
  meta = ad.meta
  if not meta.get('backbone'):
    raise bad(spec, f'{path}: the adapter was trained on a features file (meta.backbone is empty): it cannot '
                     'describe images')
  backbone, layers = backbone_from(spec, meta['backbone'], meta.get('layers'), meta.get('weights_sha256'))
  adapter_file.check_backbone(ad, backbone, layers, f'{FIELD}: {spec!r}')
  transform = cpu_kernels.jit(functools.partial(adapter_file.adapt_arrays, ad.mean, ad.components, ad.scale, ad.w))
  ident = {**backbone_identity(backbone, layers), 'adapter_sha256': file_sha(path)}
  return Similarity(spec, 'adapter', cosine_distance, None, pooled_featurizer(backbone, layers, opts, transform),
                    ident, backbone.preprocess, ('adapter', path, ident['adapter_sha256']), backbone=backbone,
                    layers=layers, transform=transform)


def _read_metrics(spec: str, workdir: str) -> dict:
  path = os.path.join(workdir, 'metrics.json')
  if not os.path.isfile(path):
    raise bad(spec, f'{path}: not found (give a finished run\'s workdir)')
  try:
    with open(path, encoding='utf-8') as f:
      m = json.load(f)
  except (ValueError, UnicodeDecodeError) as e:
    raise bad(spec, f'{path}: unreadable ({" ".join(str(e).split())[:120]})') from None
  if not isinstance(m, dict):
    raise bad(spec, f'{path}: not a run\'s metrics (a JSON object expected, got {type(m).__name__})')
  return m


def _restored(spec: str, what: str, fn):
  """fn() reading a trained model's files; a missing, truncated or mismatched file ends as one line naming
  the spec and `what` (the folder), never a traceback."""
  try:
    return fn()
  except UserError as e:
    raise bad(spec, str(e)) from None
  except Exception as e:  # pylint: disable=broad-except  (Orbax / tensorstore / shape errors of a bad file)
    raise bad(spec, f'{what}: cannot be restored ({type(e).__name__}: {" ".join(str(e).split())[:160]}); '
                     'give the workdir of a finished run') from None


def simnet_model(spec, target, option, opts):
  from visim_jax.training import runtime
  if option:
    raise bad(spec, 'simnet: takes no @option')
  m = _read_metrics(spec, target)
  cfg = m.get('config', {})
  if m.get('experiment') != 'simnet' or m.get('mode') == 'warmup':
    raise bad(spec, f'{target}: not a SimNet run on images (experiment {m.get("experiment")!r}, mode '
                     f'{m.get("mode")!r})')
  if not m.get('backbone'):
    raise bad(spec, f'{target}: SimNet was trained on a features file: it cannot describe images')
  if cfg.get('pca_dim', 0) or cfg.get('pooling', 'mean') != 'mean':
    raise bad(spec, f'{target}: SimNet on PCA-reduced or R-MAC vectors is not supported here (the run keeps no '
                     'PCA); train with pca_dim=0 and pooling=mean')
  backbone, layers = backbone_from(spec, m['backbone'], m.get('layers'), m.get('weights_sha256'))
  ckpt = os.path.join(target, 'checkpoints')
  params = jax.tree.map(jnp.asarray, _restored(spec, ckpt, lambda: runtime.latest_params(ckpt)))
  if not isinstance(params, dict) or not jax.tree.leaves(params):
    raise bad(spec, f'{ckpt}: holds no SimNet parameters')
  normalize = bool(cfg.get('normalize', True))
  transform = ops.l2_normalize if normalize else None
  ident = {**backbone_identity(backbone, layers), 'simnet_workdir': os.path.abspath(target),
           'params_sha256': _tree_sha(params), 'normalize': normalize}
  return Similarity(spec, 'simnet', _simnet_distance, params, pooled_featurizer(backbone, layers, opts, transform),
                    ident, backbone.preprocess, ('pooled', json.dumps(backbone_identity(backbone, layers),
                                                                      sort_keys=True), normalize), symmetric=False,
                    backbone=backbone, layers=layers, transform=transform)


def _tree_sha(tree) -> str:
  h = hashlib.sha256()
  for leaf in jax.tree.leaves(tree):
    h.update(np.ascontiguousarray(np.asarray(leaf)).tobytes())
  return h.hexdigest()


def context_model(spec, target, option, opts):
  import orbax.checkpoint as ocp
  from visim_jax.models import context
  m = _read_metrics(spec, target)
  if m.get('experiment') != 'twoafc':
    raise bad(spec, f'{target}: not a CoSIS 2AFC (paper 004) workdir')
  feat, cm = m.get('features'), m.get('context_models')
  if not isinstance(feat, dict) or not isinstance(cm, dict) or not all(
      k in cm for k in ('models', 'contexts', 'hparams')) or 'dim' not in feat:
    raise bad(spec, f'{target}/metrics.json: not a finished CoSIS run (features / context_models missing)')
  if feat.get('kind') != 'images':
    raise bad(spec, f'{target}: its models were trained on {feat.get("kind")} features, not on a backbone\'s: '
                     'they cannot describe images (train with config.image_dir)')
  models, names = list(cm['models']), list(cm['contexts'])
  choice = option or ('global' if 'global' in models else 'mean')
  if choice != 'mean' and choice not in models:
    raise bad(spec, f'no model {choice!r} in {target}; known: {", ".join(map(str, models))}, mean')
  backbone, layers = backbone_from(spec, feat.get('backbone'), feat.get('layers'), feat.get('weights_sha256'))
  ckpt = os.path.join(os.path.abspath(target), 'checkpoints')

  def restore():
    hp = context.Hparams(**{k: v for k, v in cm['hparams'].items() if k in context.Hparams.__dataclass_fields__})
    template = {'state': jax.device_get(context.init_state(hp, int(feat['dim']), len(models))),
                'loss': np.zeros((len(models), hp.steps), np.float32)}
    with ocp.CheckpointManager(ckpt, options=ocp.CheckpointManagerOptions(read_only=True)) as mngr:
      step = mngr.latest_step()
      if step is None:
        raise UserError(f'{ckpt}: no checkpoint')
      return mngr.restore(step, args=ocp.args.StandardRestore(template))['state']
  state = _restored(spec, ckpt, restore)
  w = np.asarray(state.params['embed']['w'])      # (K, D, E)
  rows = list(range(len(names))) if choice == 'mean' else [models.index(choice)]
  params = {'w': jnp.asarray(w[rows])}
  ident = {**backbone_identity(backbone, layers), 'context_workdir': os.path.abspath(target), 'model': choice,
           'params_sha256': _tree_sha(params)}
  return Similarity(spec, 'context', _context_distance, params, pooled_featurizer(backbone, layers, opts), ident,
                    backbone.preprocess, ('pooled', json.dumps(backbone_identity(backbone, layers), sort_keys=True)),
                    backbone=backbone, layers=layers)


def triplets_model(spec, target, option, opts):
  from visim_jax.models import heads
  from visim_jax.training import head_file
  path = run_file(spec, 'triplets', target, option, 'head.npz')
  if not os.path.isfile(path):
    raise bad(spec, f'{path}: no head.npz (give a finished learn_triplets workdir)')
  try:   # a crafted or damaged file is one line naming it (training/head_file.py)
    params, meta = head_file.load_head(path)
  except UserError as e:
    raise bad(spec, str(e)) from None
  if not meta.get('backbone'):
    raise bad(spec, f'{path}: the head was trained on synthetic features: it cannot describe images')
  backbone, layers = backbone_from(spec, meta['backbone'], meta.get('layers'), meta.get('weights_sha256'))
  try:
    head_file.check_shapes(path, params, meta, sum(backbone.layer_dims(layers).values()))
  except UserError as e:
    raise bad(spec, str(e)) from None
  transform = cpu_kernels.jit(functools.partial(heads.apply, meta['head'], params))
  ident = {**backbone_identity(backbone, layers), 'head_sha256': file_sha(path)}
  dist = _dot_distance if meta.get('similarity') == 'dot' else cosine_distance
  return Similarity(spec, 'triplets', dist, None, pooled_featurizer(backbone, layers, opts, transform), ident,
                    backbone.preprocess, ('triplets', path, ident['head_sha256']), backbone=backbone,
                    layers=layers, transform=transform)
