"""The adaptation experiment (paper 001) end to end: config -> pairs -> features -> R runs -> aR@k report.

Data sources (config.dataset):
  'tll'      : config.data_dir with left/ and right/ (a pair = the same file name in both), optionally
               restricted by config.subset (e.g. the authors' TLL_obj.csv);
  'demo'     : the embedded offline look-alike pairs (visim_jax.data.demo);
  'features' : config.features, an .npz with `left`, `right` (N, D), optional `names`, and optional
               `left_flip`, `right_flip` (features of mirrored images, for config.flip).
Outputs in the workdir: config.json, metrics.json (schema in README), curves.npz, adapter.npz (run 0's
final PCA + W, for `python -m visim_jax.search --adapter=...`), TensorBoard scalars,
plots/recall_at_k.png, plots/training_curves.png, plots/retrieval_sheet.png, checkpoints/.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time

import jax
import numpy as np
from absl import logging
from tqdm.auto import tqdm

from visim_jax import features as features_lib
from visim_jax import report, sharding, train
from visim_jax.backbones import config as backbone_config
from visim_jax.data import npz
from visim_jax.data import pairs as pairs_lib

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
      raise ValueError(f'config.{field}: {msg} (got {config.get(field)!r})')
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
    need(bool(config.data_dir), 'data_dir', 'the TLL folder (with left/ and right/) is required for dataset=tll')
  if config.dataset == 'features':
    need(bool(config.features), 'features', 'an .npz path is required for dataset=features')


# ------------------------------------------------------------------------------------------------ data

def load_features(config, progress: bool = True):
  """(Features, names, (left_paths, right_paths) or None, description dict)."""
  if config.dataset == 'features':
    left, right, names = pairs_lib.load_feature_pairs(config.features)
    flips = None
    if config.flip:
      z = npz.read_arrays(config.features, (), ('left_flip', 'right_flip'))
      if len(z) < 2:
        raise KeyError(f'config.flip=True needs arrays left_flip and right_flip in {config.features}; '
                       'add them or pass --config.flip=False')
      flips = (z['left_flip'].astype(np.float32), z['right_flip'].astype(np.float32))
      pairs_lib.check_feature_pairs(flips[0], flips[1], names, source=f'{config.features} (flip)')
      if flips[0].shape != left.shape:
        raise ValueError(f'{config.features}: left_flip {flips[0].shape} and left {left.shape} shapes differ')
    feats = train.Features(left, right, *(flips or (None, None)))
    return feats, names, None, {'source': os.path.abspath(config.features)}

  pairs, root = pairs_lib.from_config(config)
  backbone, layers = backbone_config.build(config)
  get = lambda paths, tag, flip=False: backbone_config.features_of(
      config, backbone, layers, paths, pairs.names, tag, flip, progress)
  left, right = get(pairs.left, 'left'), get(pairs.right, 'right')
  flips = (get(pairs.left, 'left', True), get(pairs.right, 'right', True)) if config.flip else (None, None)
  pairs_lib.check_feature_pairs(left, right, pairs.names, source=f'{config.backbone} features')
  desc = {**backbone_config.describe(backbone, layers), 'root': os.path.abspath(root)}
  return train.Features(left, right, *flips), pairs.names, (pairs.left, pairs.right), desc


def check_sizes(hp: train.Hparams, n: int, dim: int, ks) -> None:
  n_train = hp.n_train(n)
  n_test = n - n_train
  if n_train < 2:
    raise ValueError(f'config.train_fraction: {n} pairs give a training split of {n_train} pairs')
  if n_test < max(ks):
    raise ValueError(f'config.ks: the test split has {n_test} pairs (of {n}, train_fraction={hp.train_fraction}), '
                     f'fewer than the largest k = {max(ks)}')
  fit_rows = 2 * (n if hp.pca_fit == 'all' else n_train)
  if hp.pca_dim > min(dim, fit_rows):
    raise ValueError(f'config.pca_dim={hp.pca_dim} exceeds min(feature dim {dim}, PCA samples {fit_rows})')


# ------------------------------------------------------------------------------------------ the program

def fingerprint(hp: train.Hparams, feats: train.Features) -> str:
  h = hashlib.sha256(json.dumps(hp.__dict__, sort_keys=True).encode())
  for a in feats:
    if a is not None:
      h.update(np.ascontiguousarray(a).tobytes())
  return h.hexdigest()[:20]


def train_all(hp: train.Hparams, feats: train.Features, ckpt_dir: str | None, checkpoint_every: int,
              progress: bool = True, stop_after_epoch: int | None = None, devices=None) -> dict:
  """Every run, with Orbax checkpoints every `checkpoint_every` epochs in ckpt_dir (None: no checkpoints).

  The runs axis is sharded over `devices` (default: every device of every host; see sharding.py).
  Returns numpy arrays: loss (R, E), ranks (R, E, n_test), raw/pca baseline ranks (R, n_test), explained
  variance (R,), final params, PCAs, test_idx (R, n_test). stop_after_epoch simulates a kill (for tests).
  """
  import orbax.checkpoint as ocp
  mesh = sharding.make_mesh('runs', devices)
  per_run, rep = sharding.split(mesh), sharding.replicated(mesh)
  runs = hp.runs
  hp_x = dataclasses.replace(hp, runs=sharding.padded(runs, mesh))  # extra runs are computed, then dropped
  n = feats.left.shape[0]
  feats_j = train.Features(*(None if a is None else sharding.to_global(np.asarray(a, np.float32), rep)
                             for a in feats))
  train_idx, test_idx = jax.jit(train.splits, static_argnums=(0, 1), out_shardings=per_run)(hp_x, n)

  n_test = test_idx.shape[1]
  state = jax.jit(train.init_state, static_argnums=0, out_shardings=per_run)(hp_x)
  loss = np.zeros((hp_x.runs, hp.epochs), np.float32)
  ranks = np.zeros((hp_x.runs, hp.epochs, n_test), np.int32)
  fit = jax.jit(train.fit_pcas, static_argnums=0, out_shardings=per_run)

  def saved_tree(state, pcas):
    return {'state': state, 'pca': dict(pcas._asdict()), 'loss': loss, 'ranks': ranks}

  mngr, start, pcas = None, 0, None
  if ckpt_dir:
    mngr = ocp.CheckpointManager(os.path.abspath(ckpt_dir), options=ocp.CheckpointManagerOptions(max_to_keep=2))
    if mngr.latest_step() is not None:
      start = int(mngr.latest_step())
      template = saved_tree(state, train.pca_lib.PCA(*jax.eval_shape(fit, hp_x, feats_j, train_idx)))
      abstract = jax.tree.map(
          lambda a: a if isinstance(a, np.ndarray) else jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=per_run),
          template)
      try:
        saved = mngr.restore(start, args=ocp.args.StandardRestore(abstract))
      except Exception as e:
        raise ValueError(f'{ckpt_dir}: cannot resume from epoch {start} ({type(e).__name__}: {e}); were the '
                         'checkpoints written with another device count? Use a new --workdir.') from e
      logging.info('resuming from %s at epoch %d', ckpt_dir, start)
      state = saved['state']
      pcas = train.pca_lib.PCA(**saved['pca'])
      loss[:, :start] = np.asarray(saved['loss'])[:, :start]
      ranks[:, :start] = np.asarray(saved['ranks'])[:, :start]
  if pcas is None:
    pcas = fit(hp_x, feats_j, train_idx)
  data = jax.jit(train.project, out_shardings=per_run)(feats_j, pcas, train_idx, test_idx)
  base = jax.jit(train.baselines, out_shardings=per_run)(feats_j, data, test_idx)
  evr = jax.jit(train.explained_variance, out_shardings=per_run)(feats_j, pcas, train_idx)

  chunk = jax.jit(train.train_chunk, static_argnums=(0, 3), out_shardings=per_run)
  bar = tqdm(total=hp.epochs, initial=start, desc=f'train {runs} runs', unit='epoch',
             disable=not (progress and report.is_writer()))
  epoch = start
  while epoch < hp.epochs:
    e = min(checkpoint_every - epoch % checkpoint_every, hp.epochs - epoch)
    state, l, r = chunk(hp_x, state, data, e)
    l = sharding.to_host(l)
    if not np.isfinite(l).all():
      raise FloatingPointError(f'training loss is NaN/Inf at epochs {epoch + 1}..{epoch + e} '
                               f'(try a smaller config.lr or config.sigma)')
    loss[:, epoch:epoch + e], ranks[:, epoch:epoch + e] = l, sharding.to_host(r)
    epoch += e
    bar.update(e)
    bar.set_postfix(loss=f'{l[:runs, -1].mean():.4f}')
    if mngr is not None:  # every process takes part in a (multi-host) Orbax save
      mngr.save(epoch, args=ocp.args.StandardSave(saved_tree(state, pcas)))
      mngr.wait_until_finished()
    if stop_after_epoch is not None and epoch >= stop_after_epoch and epoch < hp.epochs:
      bar.close()
      raise KeyboardInterrupt(f'stopped after epoch {epoch} (simulated kill)')
  bar.close()
  if mngr is not None:
    mngr.close()
  host = lambda x: jax.tree.map(lambda a: sharding.to_host(a)[:runs], x)
  return {'loss': loss[:runs], 'ranks': ranks[:runs], 'raw': host(base['raw']), 'pca': host(base['pca']),
          'explained_variance': host(evr), 'params': host(state.params), 'pcas': host(pcas),
          'test_idx': host(test_idx)}


# ---------------------------------------------------------------------------------------------- report

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
  validate_config(config)
  hp = hparams_from_config(config)
  ks = [int(k) for k in config.ks]
  t0 = time.time()
  feats, names, paths, desc = load_features(config, progress)
  check_sizes(hp, len(names), feats.left.shape[1], ks)
  os.makedirs(workdir, exist_ok=True)
  report.write_config(workdir, config)

  ckpt_dir = os.path.join(workdir, 'checkpoints') if config.checkpoint else None
  fp = fingerprint(hp, feats)
  if ckpt_dir:
    fp_file = os.path.join(workdir, 'checkpoints.fingerprint')
    if os.path.exists(ckpt_dir) and os.listdir(ckpt_dir):
      old = open(fp_file).read().strip() if os.path.exists(fp_file) else None
      if old != fp:
        raise ValueError(f'{ckpt_dir}: checkpoints of a different config or data; use a new --workdir '
                         'or delete that folder')
    if report.is_writer():
      report.atomic_write_text(fp_file, fp + '\n')
  t1 = time.time()
  out = train_all(hp, feats, ckpt_dir, config.checkpoint_every, progress,
                  config.debug_stop_after_epoch if config.debug_stop_after_epoch > 0 else None)
  t2 = time.time()
  summary = summarise(out, ks)
  metrics = {
      'experiment': 'adapt', 'dataset': config.dataset, **desc,
      'n_pairs': len(names), 'n_train': hp.n_train(len(names)), 'n_test': len(names) - hp.n_train(len(names)),
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
      'config': config.to_dict(),
  }
  report.write_json(os.path.join(workdir, 'metrics.json'), metrics)
  if report.is_writer():
    from visim_jax import export
    meta = {k: desc.get(k) for k in export.META_KEYS}
    meta['source'] = {'workdir': os.path.abspath(workdir), 'dataset': config.dataset, 'run': 0, 'epoch': hp.epochs}
    export.save_adapter(os.path.join(workdir, 'adapter.npz'), **export.run_arrays(out, 0), meta=meta)
    features_lib.save_npz_atomic(os.path.join(workdir, 'curves.npz'), loss=out['loss'],
                                 aR=summary['curve'], ks=np.asarray(ks))
    series = {'train/loss_mean': out['loss'].mean(0)}
    for j, k in enumerate(ks):
      series[f'test/aR_at_{k}_mean'] = summary['curve_mean'][:, j]
    report.write_scalars_series(workdir, series)
    if config.plots:
      from visim_jax import plots
      plots.recall_at_k(out, os.path.join(workdir, 'plots', 'recall_at_k.png'), summary['chosen_epoch'] - 1,
                        max_k=min(50, metrics['n_test']))
      plots.training_curves(out['loss'], summary['curve'], ks, summary['chosen_epoch'],
                            os.path.join(workdir, 'plots', 'training_curves.png'))
      if paths is not None:
        plots.retrieval_sheet(feats, out, names, paths, os.path.join(workdir, 'plots', 'retrieval_sheet.png'),
                              n_queries=config.sheet_queries)
  rows = []
  for k in ks:
    r = summary['results'][f'aR@{k}']
    rows.append([f'aR@{k}'] + [f"{r[c]['mean']:.4f} ± {r[c]['two_std']:.4f}"
                               for c in ('raw', 'pca', 'adapted_chosen_epoch', 'adapted_last_epoch')])
  print(f'\n{hp.runs} runs, {metrics["n_train"]}/{metrics["n_test"]} train/test pairs, sigma={hp.sigma}, '
        f'PCA fit on {hp.pca_fit}, chosen epoch {summary["chosen_epoch"]} (on test), workdir {workdir}')
  print(report.table(rows, ['metric', 'raw', 'pca', f'adapted@{summary["chosen_epoch"]}', f'adapted@{hp.epochs}']))
  print('(mean ± 2 std over runs)')
  return metrics
