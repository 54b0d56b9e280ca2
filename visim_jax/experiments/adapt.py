"""The adaptation experiment (paper 001) as wiring: config -> pairs -> features -> R runs (runtime) -> aR@k report.

Data sources (config.dataset):
  'tll'      : config.data_dir with left/ and right/ (a pair = the same file name in both), optionally
               restricted by config.subset (e.g. the authors' TLL_obj.csv);
  'demo'     : the embedded offline look-alike pairs (visim_jax.data.demo);
  'features' : config.features, an .npz with `left`, `right` (N, D), optional `names`, and optional
               `left_flip`, `right_flip` (features of mirrored images, for config.flip; without them the run
               goes on without the flip view and says so). A non-empty config.features alone selects it.
Sizes known before extraction (pairs, feature dim, pca_dim, ks) are checked before any image is read.
Outputs in the workdir: config.json, fingerprint.json, metrics.json (schema in README), curves.npz,
adapter.npz (run 0's final PCA + W, for `python -m visim_jax.search --adapter=...`), TensorBoard scalars
(per checkpoint chunk, while training), plots/*.png, checkpoints/ (see visim_jax/runtime.py).
"""
from __future__ import annotations

import dataclasses
import os
import time

import jax
import numpy as np

from visim_jax import features as features_lib
from visim_jax import runtime, sharding, train
from visim_jax.data import npz
from visim_jax.data import pairs as pairs_lib
from visim_jax.errors import UserError

DATASETS = ('tll', 'demo', 'features')


def hparams_from_config(config) -> train.Hparams:
  return train.Hparams(runs=config.runs, train_fraction=config.train_fraction, pca_dim=config.pca_dim,
                       pca_fit=config.pca_fit, pca_whiten=config.pca_whiten, adapt_dim=config.adapt_dim,
                       sigma=config.sigma, lr=config.lr, epochs=config.epochs, seed=config.seed,
                       dtype=config.train_dtype)


def validate_config(config) -> None:
  """Checks every field the experiment reads; raises naming the field."""
  def need(cond, field, msg):
    if not cond:
      raise UserError(f'config.{field}: {msg} (got {config.get(field)!r})')
  need(config.dataset in DATASETS, 'dataset', f'one of {DATASETS}')
  need(config.runs >= 1, 'runs', 'must be >= 1')
  need(0.0 < config.train_fraction < 1.0, 'train_fraction', 'must be in (0, 1)')
  need(config.pca_dim >= 1, 'pca_dim', 'must be >= 1')
  need(config.pca_fit in ('train', 'all'), 'pca_fit', "'train' or 'all'")
  need(config.adapt_dim >= 1, 'adapt_dim', 'must be >= 1')
  need(config.sigma > 0, 'sigma', 'must be > 0')
  need(config.lr > 0, 'lr', 'must be > 0')
  need(config.epochs >= 1, 'epochs', 'must be >= 1')
  need(config.train_dtype in ('float32', 'bfloat16'), 'train_dtype', "'float32' or 'bfloat16'")
  need(config.checkpoint_every >= 1, 'checkpoint_every', 'must be >= 1')
  need(len(config.ks) >= 1 and all(int(k) >= 1 for k in config.ks), 'ks', 'positive integers')
  if config.dataset == 'tll':
    need(bool(config.data_dir), 'data_dir', 'the TLL folder (with left/ and right/) is required for dataset=tll '
         '(or pass --config.features=FEATS.npz)')


def check_sizes(hp: train.Hparams, n: int, dim: int, ks) -> None:
  """What the pair count and feature size allow (run before feature extraction when they are known)."""
  n_train = hp.n_train(n)
  n_test = n - n_train
  if n_train < 2:
    raise UserError(f'config.train_fraction: {n} pairs give a training split of {n_train} pairs')
  if n_test < max(ks):
    raise UserError(f'config.ks: the test split has {n_test} pairs (of {n}, train_fraction={hp.train_fraction}), '
                    f'fewer than the largest k = {max(ks)}')
  fit_rows = 2 * (n if hp.pca_fit == 'all' else n_train)
  if hp.pca_dim > min(dim, fit_rows):
    raise UserError(f'config.pca_dim: {hp.pca_dim} exceeds min(feature dim {dim}, PCA samples {fit_rows}); '
                    f'use --config.pca_dim={min(dim, fit_rows)} or less')


def load_features(config, hp: train.Hparams, ks, progress: bool = True):
  """(Features, names, (left_paths, right_paths) or None, description dict); sizes checked before extraction."""
  if config.dataset == 'features':
    left, right, names = pairs_lib.load_feature_pairs(config.features)
    check_sizes(hp, len(names), left.shape[1], ks)
    flips, desc = (None, None), {'source': os.path.abspath(config.features)}
    if config.flip:
      z = npz.read_arrays(config.features, (), ('left_flip', 'right_flip'))
      if len(z) < 2:
        desc['flip_note'] = f'{config.features} has no left_flip/right_flip arrays: trained without the flip view'
        runtime.say(f'note: {desc["flip_note"]}')
      else:
        flips = (z['left_flip'].astype(np.float32), z['right_flip'].astype(np.float32))
        pairs_lib.check_feature_pairs(*flips, names, source=f'{config.features} (flip)')
        if flips[0].shape != left.shape:
          raise UserError(f'{config.features}: left_flip {flips[0].shape} and left {left.shape} shapes differ')
    return train.Features(left, right, *flips), names, None, desc

  pairs, root = pairs_lib.from_config(config)
  backbone, layers = features_lib.build(config)
  check_sizes(hp, len(pairs), sum(backbone.layer_dims(layers).values()), ks)
  runtime.say(f'{len(pairs)} pairs from {root}; features: {backbone.name} ({",".join(layers)})')
  get = lambda paths, tag, flip=False: features_lib.features_of(
      config, backbone, layers, paths, pairs.names, tag, flip, progress)
  left, right = get(pairs.left, 'left'), get(pairs.right, 'right')
  flips = (get(pairs.left, 'left', True), get(pairs.right, 'right', True)) if config.flip else (None, None)
  pairs_lib.check_feature_pairs(left, right, pairs.names, source=f'{config.backbone} features of {root}')
  desc = {**features_lib.describe(backbone, layers), 'root': os.path.abspath(root)}
  return train.Features(left, right, *flips), pairs.names, (pairs.left, pairs.right), desc


def train_all(hp: train.Hparams, feats: train.Features, run: runtime.Run | None = None, checkpoint_every: int = 25,
              progress: bool = True, devices=None, ks=(1,)) -> dict:
  """Every run through the runtime loop (checkpoints in `run`, none when run is None).

  The runs axis is sharded over `devices` (default: every device of every host; see sharding.py).
  Returns numpy arrays: loss (R, E), ranks (R, E, n_test), raw/pca baseline ranks (R, n_test), explained
  variance (R,), final params, PCAs, test_idx (R, n_test).
  """
  mesh = sharding.make_mesh('runs', devices)
  per_run, rep = sharding.split(mesh), sharding.replicated(mesh)
  runs = hp.runs
  hp_x = dataclasses.replace(hp, runs=sharding.padded(runs, mesh))  # extra runs are computed, then dropped
  feats_j = train.Features(*(None if a is None else sharding.to_global(np.asarray(a, np.float32), rep)
                             for a in feats))
  train_idx, test_idx = jax.jit(train.splits, static_argnums=(0, 1), out_shardings=per_run)(hp_x, len(feats.left))
  fit = jax.jit(train.fit_pcas, static_argnums=0, out_shardings=per_run)
  init = jax.jit(train.init_state, static_argnums=0, out_shardings=per_run)
  host = {'loss': np.zeros((hp_x.runs, hp.epochs), np.float32),
          'ranks': np.zeros((hp_x.runs, hp.epochs, test_idx.shape[1]), np.int32)}
  tree, start = None, 0
  if run is not None and run.ckpt_dir:
    shapes = {'state': jax.eval_shape(init, hp_x), 'pca': dict(jax.eval_shape(fit, hp_x, feats_j, train_idx)._asdict())}
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=per_run), shapes)
    tree, start = run.restore({**abstract, **host})
    tree = {**tree, 'loss': np.array(tree['loss']), 'ranks': np.array(tree['ranks'])} if start else None
  if tree is None:
    tree = {'state': init(hp_x), 'pca': dict(fit(hp_x, feats_j, train_idx)._asdict()), **host}
  pcas = train.pca_lib.PCA(**tree['pca'])
  data = jax.jit(train.project, out_shardings=per_run)(feats_j, pcas, train_idx, test_idx)
  base = jax.jit(train.baselines, out_shardings=per_run)(feats_j, data, test_idx)
  evr = jax.jit(train.explained_variance, out_shardings=per_run)(feats_j, pcas, train_idx)
  chunk = jax.jit(train.train_chunk, static_argnums=(0, 3), out_shardings=per_run)

  def chunk_fn(tree, e0, n):
    state, l, r = chunk(hp_x, tree['state'], data, n)
    l, r = sharding.to_host(l), sharding.to_host(r)
    tree['loss'][:, e0:e0 + n], tree['ranks'][:, e0:e0 + n] = l, r
    aR = train.recall_from_ranks(r[:runs], ks).mean(0)             # (n, K)
    return {**tree, 'state': state}, {'train/loss_mean': l[:runs].mean(0),
                                      **{f'test/aR_at_{k}_mean': aR[:, j] for j, k in enumerate(ks)}}

  tree = runtime.loop(tree, chunk_fn, start, hp.epochs, checkpoint_every, run=run, progress=progress,
                      desc=f'train {runs} runs (epochs)')
  to_host = lambda x: jax.tree.map(lambda a: sharding.to_host(a)[:runs], x)
  return {'loss': tree['loss'][:runs], 'ranks': tree['ranks'][:runs], 'raw': to_host(base['raw']),
          'pca': to_host(base['pca']), 'explained_variance': to_host(evr), 'params': to_host(tree['state'].params),
          'pcas': to_host(pcas), 'test_idx': to_host(test_idx)}


def _stats(values: np.ndarray) -> dict:
  values = np.asarray(values, np.float64)
  std = float(values.std(ddof=0))
  return {'mean': float(values.mean()), 'std': std, 'two_std': 2 * std, 'runs': values.tolist()}


def summarise(out: dict, ks) -> dict:
  ks = [int(k) for k in ks]
  curve = train.recall_from_ranks(out['ranks'], ks)     # (R, E, K)
  mean_curve = curve.mean(axis=0)                         # (E, K)
  chosen = int(np.argmax(mean_curve[:, 0]))               # first max of the mean test aR@k[0]
  results = {}
  for j, k in enumerate(ks):
    results[f'aR@{k}'] = {
        'raw': _stats(train.recall_from_ranks(out['raw'], [k])[:, 0]),
        'pca': _stats(train.recall_from_ranks(out['pca'], [k])[:, 0]),
        'adapted_chosen_epoch': _stats(curve[:, chosen, j]),
        'adapted_last_epoch': _stats(curve[:, -1, j]),
    }
  return {'results': results, 'chosen_epoch': chosen + 1, 'curve_mean': mean_curve, 'curve': curve}


def run(config, workdir: str, progress: bool = True) -> dict:
  config = features_lib.select_source(config)
  validate_config(config)
  hp = hparams_from_config(config)
  ks = [int(k) for k in config.ks]
  t0 = time.time()
  feats, names, paths, desc = load_features(config, hp, ks, progress)
  recorded = features_lib.recorded_config(config, uses_backbone=config.dataset != 'features')
  fields = {('train_dtype' if k == 'dtype' else k): v for k, v in hp.__dict__.items()}
  with runtime.Run(workdir, recorded, runtime.fingerprint(fields, feats), config.checkpoint, progress) as rt:
    t1 = time.time()
    runtime.say(f'training {hp.runs} runs x {hp.epochs} epochs on {len(names)} pairs '
                f'({feats.left.shape[1]}-d features{", + flip view" if feats.left_flip is not None else ""})')
    out = train_all(hp, feats, rt, config.checkpoint_every, progress, ks=ks)
    t2 = time.time()
    summary = summarise(out, ks)
    n_train = hp.n_train(len(names))
    metrics = rt.write_metrics({
        'experiment': 'adapt', 'dataset': config.dataset, **desc,
        'n_pairs': len(names), 'n_train': n_train, 'n_test': len(names) - n_train,
        'feature_dim': int(feats.left.shape[1]), 'runs': hp.runs, 'epochs': hp.epochs, 'ks': ks,
        'sigma': hp.sigma, 'flip_augmentation': feats.left_flip is not None,
        'pca': {'dim': hp.pca_dim, 'fit': hp.pca_fit, 'whiten': hp.pca_whiten,
                'fit_description': ('each run fit on its own training split (left + right)' if hp.pca_fit == 'train'
                                    else 'fit on all vectors, test included (the reference code\'s choice)'),
                'explained_variance': _stats(out['explained_variance'])},
        'chosen_epoch': {'epoch': summary['chosen_epoch'],
                         'rule': f'argmax over epochs of the mean test aR@{ks[0]} across runs: selected on the test '
                                 'split, as the reference code does (optimistic); adapted_last_epoch is the honest '
                                 'fixed-budget number'},
        'results': summary['results'],
        'ties': 'pessimistic: a candidate scoring equal to the partner ranks ahead of it',
        'timing_s': {'data_and_features': t1 - t0, 'training_and_eval': t2 - t1},
        'config': recorded,
    })
    write_outputs(config, rt, out, summary, feats, names, paths, desc, metrics)
  print_table(hp, ks, metrics, summary, workdir)
  return metrics


def write_outputs(config, rt, out, summary, feats, names, paths, desc, metrics) -> None:
  """adapter.npz, curves.npz and the figures (process 0)."""
  from visim_jax import export, report
  if not report.is_writer():
    return
  meta = {k: desc.get(k) for k in export.META_KEYS}
  meta['source'] = {'workdir': rt.workdir, 'dataset': config.dataset, 'run': 0, 'epoch': metrics['epochs']}
  export.save_adapter(rt.path('adapter.npz'), **export.run_arrays(out, 0), meta=meta)
  runtime.write_npz(rt.path('curves.npz'), loss=out['loss'], aR=summary['curve'], ks=np.asarray(metrics['ks']))
  if config.plots:
    from visim_jax.plots import adapt as plots
    plots.recall_at_k(out, rt.path('plots', 'recall_at_k.png'), summary['chosen_epoch'] - 1,
                      max_k=min(50, metrics['n_test']))
    plots.training_curves(out['loss'], summary['curve'], metrics['ks'], summary['chosen_epoch'],
                          rt.path('plots', 'training_curves.png'))
    if paths is not None:
      plots.retrieval_sheet(feats, out, names, paths, rt.path('plots', 'retrieval_sheet.png'),
                            n_queries=config.sheet_queries)


def print_table(hp, ks, metrics, summary, workdir) -> None:
  from visim_jax import report
  rows = []
  for k in ks:
    r = summary['results'][f'aR@{k}']
    rows.append([f'aR@{k}'] + [f"{r[c]['mean']:.4f} ± {r[c]['two_std']:.4f}"
                               for c in ('raw', 'pca', 'adapted_chosen_epoch', 'adapted_last_epoch')])
  runtime.say(f'\n{hp.runs} runs, {metrics["n_train"]}/{metrics["n_test"]} train/test pairs, sigma={hp.sigma}, '
              f'PCA fit on {hp.pca_fit}, chosen epoch {summary["chosen_epoch"]} (on test), workdir {workdir}')
  runtime.say(report.table(rows, ['metric', 'raw', 'pca', f'adapted@{summary["chosen_epoch"]}',
                                  f'adapted@{hp.epochs}']))
  runtime.say('(mean ± 2 std over runs)')
