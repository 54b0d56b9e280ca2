"""The CoSIS 2AFC experiment (paper 004) end to end: annotations -> features -> CS models -> ensembles -> report.

Annotations (config.annotations): a CoSIS folder; '' = ../shared/data/cosis beside the checkout when present,
else a small synthetic set in the CoSIS format (written once under <cache_dir>/synthetic_cosis/, labels from a hidden
metric of the stand-in features); 'synthetic' forces it. Features, keyed by image id (`val/715`): stand-in
(seeded random vectors: on the real annotations out-of-sample accuracies are at chance, the run checks the
pipeline), config.features (.npz) or config.image_dir (BG-20k, through the backbone and its feature cache).

Steps: cosine baseline; 8 CS models + the global model (union of the 8 training parts, Table 5), all trained
in one vmapped program through the shared runtime (fingerprint, Orbax chunks, resume); every model on every
context's held-out part (Table 8) and on mulref_val / mulref_test (Table 4); ensembles fitted on mulref_val
and scored on both (Table 6 embeddings, Table 7 ranking blocks); every subset of the 8 models (Fig. 8).
Outputs: config.json, metrics.json (docs/twoafc.md), TensorBoard losses, plots/*.png, a console table.
"""
from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np

from visim_jax.core import cpu_kernels
from visim_jax.models import ensembles
from visim_jax.core import ops, report
from visim_jax.training import runtime
from visim_jax.backbones import features as features_lib
from visim_jax.models import context
from visim_jax.data import cosis
from visim_jax.core.errors import UserError
from visim_jax.experiments.twoafc_parse import check_memory, model_hparams, validate_config  # noqa: F401 (the gate)
from visim_jax.metrics import twoafc
from visim_jax.experiments import config_fields

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED_COSIS = os.path.join(REPO, '..', 'shared', 'data', 'cosis')


def annotations_dir(config, workdir: str) -> tuple[str, bool]:
  a = config.annotations
  if a == 'synthetic' or (not a and not os.path.isdir(SHARED_COSIS)):
    if config.features or config.image_dir:
      raise UserError('config.annotations: the synthetic set only works with stand-in features; point '
                      'config.annotations at the CoSIS folder')
    # an input, not a result: generated once beside the feature cache (a refused run writes nothing in the workdir)
    folder = os.path.join(features_lib.cache_dir(config.cache_dir), 'synthetic_cosis',
                          f'seed{config.seed}_dim{config.stand_in_dim}')
    done = os.path.join(folder, '.complete')
    if not os.path.exists(done):
      cosis.write_synthetic_cosis(folder, config.seed, config.stand_in_dim)
      ops.atomic_write_bytes(done, b'')
    return folder, True
  folder = a or SHARED_COSIS
  if not os.path.isdir(folder):
    raise UserError(f'config.annotations: folder {folder} not found')
  return os.path.abspath(folder), False


def all_triplets(sets) -> list:
  return list(sets['contexts'].values()) + [sets['mulref_val'], sets['mulref_test']]


def load_features(config, sets, folder: str, synthetic: bool, progress: bool = True):
  """(features (N, D) float32, {key: row}, description)."""
  keys = list(dict.fromkeys(k for t in all_triplets(sets) for k in t.keys()))
  if config.features:
    feats, table = cosis.load_feature_table(config.features)
    if not any(k in table for k in keys):  # names are BG-20k names: map through filename_dict
      table = cosis.keys_from_names(table, cosis.read_filename_dict(os.path.join(folder, 'filename_dict.txt')))
    for t in all_triplets(sets):
      t.indices(table, what=f'features file {config.features}')  # a missing id fails here, naming its line
    return feats, table, {'kind': 'npz', 'path': os.path.abspath(config.features), 'dim': int(feats.shape[1])}
  if config.image_dir:
    names = cosis.read_filename_dict(os.path.join(folder, 'filename_dict.txt'))
    paths = cosis.resolve_images(all_triplets(sets), names, config.image_dir)  # every file checked first
    from visim_jax.backbones import features
    fo = config_fields.options(config)
    backbone, layers = features.build(fo)
    feats = features.features_of(fo, backbone, layers, [paths[k] for k in keys], keys, 'cosis', progress=progress)
    return feats, {k: i for i, k in enumerate(keys)}, {
        'kind': 'images', 'image_dir': os.path.abspath(config.image_dir), 'backbone': backbone.name,
        'weights_sha256': backbone.weights_id, 'layers': list(layers), 'dim': int(feats.shape[1])}
  src = [cosis.synthetic_alias(k) for k in keys] if synthetic else keys
  feats = cosis.stand_in_features(src, config.stand_in_dim, config.seed)
  return feats, {k: i for i, k in enumerate(keys)}, {
      'kind': 'stand_in', 'dim': config.stand_in_dim, 'seed': config.seed,
      'note': ('STAND-IN FEATURES: seeded random vectors keyed by image id, not image features. '
               + ('On the synthetic annotations the labels follow a hidden metric of these vectors.' if synthetic
                  else 'On the real CoSIS annotations they say nothing about the images: out-of-sample accuracies '
                       'are at chance (see docs/twoafc.md); this run checks the pipeline, not the method.'))}


def train_models(run_: runtime.Run, config, feats, train_sets: context.Batch, names) -> tuple:
  """K models through the runtime (Orbax chunks, resume): (params (K, ...), loss (K, steps))."""
  hp = model_hparams(config)
  k = train_sets.ref.shape[0]
  chunk = cpu_kernels.jit(functools.partial(context.train_chunk, hp), static_argnums=4)
  feats_j = jnp.asarray(feats)

  def chunk_fn(tree, step0, n):
    state, loss = chunk(feats_j, train_sets, tree['state'], step0, n)
    hist = np.array(tree['loss'])
    hist[:, step0:step0 + n] = np.asarray(loss)
    scalars = {f'train/loss_{x}': float(hist[j, step0:step0 + n].mean()) for j, x in enumerate(names)}
    return {'state': state, 'loss': hist}, scalars

  template = {'state': jax.device_get(context.init_state(hp, feats.shape[1], k)),
              'loss': np.zeros((k, hp.steps), np.float32)}
  tree, start = run_.restore(template)
  run_.bar(hp.steps + len(EVAL_PHASES) * eval_units(hp.steps), initial=start)  # one bar: training steps, then the evaluation phases
  runtime.say(f'training {k} models ({", ".join(names)}) x {hp.steps} steps, one vmapped program')
  tree = run_.loop(tree, chunk_fn, start, hp.steps, every=config.model.chunk_steps)
  return tree['state'].params, np.asarray(tree['loss'])


EVAL_PHASES = ('scoring every model', 'ensembles', 'bootstrap intervals', 'plots')


def eval_units(steps: int) -> int:
  """Bar units of one evaluation phase: together the phases weigh as much as training (measured: similar times)."""
  return max(1, steps // len(EVAL_PHASES))


def run(config, workdir: str, progress: bool = True) -> dict:
  validate_config(config)
  folder, synthetic = annotations_dir(config, workdir)
  sets = cosis.load_cosis_sets(folder)
  feats, table, feat_desc = load_features(config, sets, folder, synthetic, progress)
  ctx, val, test = sets['contexts'], sets['mulref_val'], sets['mulref_test']
  names = list(ctx)
  m = config.model
  splits = {n: cosis.split_context(t, m.split, m.train_fraction, config.seed + j)
            for j, (n, t) in enumerate(ctx.items())}
  rows = {n: (*t.indices(table), t.a_closer, t.cls_a.astype(np.int32), t.cls_b.astype(np.int32))
          for n, t in ctx.items()}
  train_parts = [tuple(c[splits[n][0]] for c in rows[n]) for n in names]
  if m.global_model:  # Table 5: one model on the union of the eight training parts
    train_parts.append(tuple(np.concatenate(c) for c in zip(*train_parts)))
  models = names + ['global'] * bool(m.global_model)
  train_sets = context.pad_sets(train_parts)
  fields = {'model': m.to_dict(), 'seed': config.seed, 'features': feat_desc, 'models': models}
  fp = runtime.fingerprint(fields, {'features': feats, **{f'training triplets ({f})': np.asarray(x)
                                                          for f, x in train_sets._asdict().items()}})
  check_memory(config, len(models), *feats.shape)
  with runtime.Run(workdir, config.to_dict(), fp, progress=progress, desc='context models') as run_:
    params, loss = train_models(run_, config, feats, train_sets, models)
    return evaluate(config, workdir, run_, folder, sets, feats, table, feat_desc, synthetic, splits, models, params,
                    loss)


def evaluate(config, workdir, run_, folder, sets, feats, table, feat_desc, synthetic, splits, models, params,
             loss) -> dict:
  """Every model on every evaluation set, the ensembles, metrics.json, plots and the console tables."""
  ctx, val, test = sets['contexts'], sets['mulref_val'], sets['mulref_test']
  names, m = list(ctx), config.model

  # every model on: each context's held-out part, mulref_val, mulref_test (one call)
  held = [ctx[n].subset(splits[n][1]) for n in names]
  parts = held + [val, test]
  idx = [np.concatenate(c) for c in zip(*(t.indices(table) for t in parts))]
  a_closer = np.concatenate([t.a_closer for t in parts])
  feats_j = jnp.asarray(feats)
  unit = eval_units(m.steps)
  with run_.phase(EVAL_PHASES[0], unit):
    d_a, d_b, s = (np.asarray(x) for x in cpu_kernels.jit(context.predict_all)(params, feats_j, *idx))
    cos = np.asarray(twoafc.cosine_scores(feats_j, *idx, a_closer))
  bounds = np.cumsum([0] + [len(t) for t in parts])
  sl = [slice(int(bounds[i]), int(bounds[i + 1])) for i in range(len(parts))]
  answers = {'embedding': (d_a, d_b), 'ranking_block': (np.asarray(jax.nn.sigmoid(-s)), np.asarray(jax.nn.sigmoid(s)))}
  scores = {kind: np.asarray(ensembles.decision_scores(jnp.sign(jnp.asarray(db - da)), jnp.asarray(a_closer)))
            for kind, (da, db) in answers.items()}
  acc = twoafc.Summaries(config.n_boot, config.ci_level, config.seed)
  per_context, cross = {}, {kind: np.zeros((len(models), len(names))) for kind in scores}
  for j, n in enumerate(names):
    for kind in scores:
      cross[kind][:, j] = scores[kind][:, sl[j]].mean(1)
    per_context[n] = {
        'reference': str(ctx[n].ref[0]), 'n_triplets': len(ctx[n]), 'n_train': int(len(splits[n][0])),
        'n_held_out': int(len(splits[n][1])), 'cosine_held_out': acc(cos[sl[j]], held[j], 'rows'),
        **{f'own_model_{kind}_held_out': acc(scores[kind][j, sl[j]], held[j], 'rows') for kind in scores},
        'final_train_loss': float(loss[j, -20:].mean())}
  nv, nt = len(names), len(names) + 1
  cc = {x: {kind: {'val': acc(scores[kind][i, sl[nv]], val), 'test': acc(scores[kind][i, sl[nt]], test)}
            for kind in scores} for i, x in enumerate(models)}
  baseline = {'val': acc(cos[sl[nv]], val), 'test': acc(cos[sl[nt]], test)}

  k = len(names)
  ens, extra = {}, {}
  with run_.phase(EVAL_PHASES[1], unit):
    for kind, (da, db) in answers.items():
      ens[kind], extra[kind] = ensembles.fit_and_score(
          config.ensemble, config.seed, lambda keys: feats[[table[x] for x in keys]], val, test,
          [x[:k] for x in (da[:, sl[nv]], db[:, sl[nv]])], [x[:k] for x in (da[:, sl[nt]], db[:, sl[nt]])], names,
          acc, anchors=[str(t.ref[0]) for t in ctx.values()])
  with run_.phase(EVAL_PHASES[2], unit):
    acc.fill()
  table6 = [{'description': f'not fine-tuned: cosine on {feat_desc["kind"]} features', 'val': baseline['val'],
             'test': baseline['test']}]
  if m.global_model:
    table6.append({'description': 'globally fine-tuned (union of the 8 context training parts)',
                   **cc['global']['embedding']})
  e = ens['embedding']
  table6 += [{'description': f'best single CS model ({e["best_single"]["model"]}, chosen on val)', **e['best_single']},
             {'description': 'majority vote', **e['majority_vote']},
             {'description': 'PCA credibility maps', **e['pca_credibility']},
             {'description': f'MLP weights (first of {config.ensemble.mlp_seeds} seeds; mean ± std in ensembles)',
              **e['mlp']}]
  table6 = [{'description': r['description'], 'val': r['val'], 'test': r['test']} for r in table6]
  files = {os.path.basename(t.source): cosis.describe(t) for t in all_triplets(sets)}
  metrics = {
      'experiment': 'twoafc', 'features': feat_desc,
      'annotations': {'dir': folder, 'synthetic': synthetic, 'files': files},
      'tie_rule': 'a tie (equal distances, a zero fused difference or an even vote) scores 1/2',
      'ci': f'{100 * config.ci_level:g}% percentile bootstrap over references (mulref sets) or annotation rows '
            '(context sets); in_sample: the ensemble was fitted (or the model chosen) on this set, as Table 6 val',
      'cosine_baseline': baseline,
      'context_models': {'hparams': model_hparams(config).__dict__, 'split': m.split,
                         'train_fraction': m.train_fraction,
                         'contexts': names, 'models': models, 'per_context': per_context,
                         'cross_context_held_out': {x: v.tolist() for x, v in cross.items()}, 'cc_accuracy': cc},
      'ensembles': ens['embedding'], 'ensembles_ranking_block': ens['ranking_block'], 'table6': table6,
      'config': config.to_dict()}
  metrics = run_.write_metrics(metrics)
  with run_.phase(EVAL_PHASES[3], unit):
    if report.is_writer() and config.plots:
      from visim_jax.plots import twoafc as plots
      plots.write_all(workdir, metrics, extra['embedding'], feat_desc['kind'] == 'stand_in')
  tag = '' if feat_desc['kind'] != 'stand_in' else '  [STAND-IN FEATURES: ' + (
      'synthetic annotations]' if synthetic else 'accuracies are at chance]')
  print(f'\nCoSIS 2AFC: {len(val)} val / {len(test)} test triples, {len(models)} models, '
        f'features: {feat_desc["kind"]} (dim {feats.shape[1]}){tag}')
  print(report.table([[r['description'], r['val']['accuracy'], r['test']['accuracy']] for r in table6],
                     ['model', 'mulref_val', 'mulref_test']))
  print(report.table([[n] + [per_context[n][f][x] for f in ('cosine_held_out', 'own_model_embedding_held_out',
                                                            'own_model_ranking_block_held_out') for x in ('accuracy',)]
                      for n in names], ['context (held out)', 'cosine', 'CS embedding', 'CS ranking block']))
  return metrics
