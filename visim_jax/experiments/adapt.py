"""The adaptation experiment (paper 001) as wiring: config -> pairs -> features -> R runs (runtime) -> aR@k report.

Data sources (config.dataset):
  'tll'      : config.data_dir with left/ and right/ (a pair = the same file name in both), optionally
               restricted by config.subset (e.g. the authors' TLL_obj.csv);
  'demo'     : the embedded offline look-alike pairs (visim_jax.data.demo);
  'features' : config.features, an .npz with `left`, `right` (N, D), optional `names`, and optional
               `left_flip`, `right_flip` (features of mirrored images, for config.flip; without them the run
               goes on without the flip view and says so; one of the two alone is refused). A non-empty config.features
               alone selects it.
Sizes known before extraction (pairs, feature dim, pca_dim, ks) are checked before any image is read.
Outputs in the workdir: config.json, fingerprint.json, metrics.json (schema in README), curves.npz,
adapter.npz (run 0's final PCA + W, for `python -m visim_jax.search --adapter=...`), TensorBoard scalars
(per checkpoint chunk, while training), plots/*.png, checkpoints/ (see visim_jax/training/runtime.py).
"""
from __future__ import annotations

import dataclasses
import os
import time

import jax
import numpy as np

from visim_jax.core import cpu_kernels
from visim_jax.training import compile_cache
from visim_jax.backbones import features as features_lib
from visim_jax.training import collapse, runtime, adaptation_runs
from visim_jax.core import sharding
from visim_jax.data import npz
from visim_jax.data import pairs as pairs_lib
from visim_jax.core.errors import UserError
from visim_jax.experiments.adapt_parse import check_sizes, hparams_from_config, validate_config  # noqa: F401 (the gate)
from visim_jax.experiments import config_fields


def load_features(config, hp: adaptation_runs.Hparams, ks, progress: bool = True):
  """(Features, names, (left_paths, right_paths) or None, description dict); sizes checked before extraction."""
  if config.dataset == 'features':
    left, right, names = pairs_lib.load_feature_pairs(config.features)
    check_sizes(hp, len(names), left.shape[1], ks)
    flips, desc = (None, None), {'source': os.path.abspath(config.features)}
    if config.flip:
      z = npz.read_arrays(config.features, (), ('left_flip', 'right_flip'))
      if len(z) == 1:
        have, missing = (('left_flip', 'right_flip') if 'left_flip' in z else ('right_flip', 'left_flip'))
        raise UserError(f'config.features: {config.features} has {have} but no {missing}: the flip view needs '
                        'both (add it, or remove the other and pass --config.flip=False)')
      if not z:
        desc['flip_note'] = f'{config.features} has no left_flip/right_flip arrays: trained without the flip view'
        runtime.say(f'note: {desc["flip_note"]}')
      else:
        flips = (z['left_flip'].astype(np.float32), z['right_flip'].astype(np.float32))
        pairs_lib.check_feature_pairs(*flips, names, source=f'{config.features} (flip)')
        if flips[0].shape != left.shape:
          raise UserError(f'{config.features}: left_flip {flips[0].shape} and left {left.shape} shapes differ')
    return adaptation_runs.Features(left, right, *flips), names, None, desc

  pairs, root = config_fields.pairs(config)
  fo = config_fields.options(config)
  backbone, layers = features_lib.build(fo)
  check_sizes(hp, len(pairs), sum(backbone.layer_dims(layers).values()), ks)
  runtime.say(f'{len(pairs)} pairs from {root}; features: {backbone.name} ({",".join(layers)})')
  get = lambda paths, tag, flip=False: features_lib.features_of(
      fo, backbone, layers, paths, pairs.names, tag, flip, progress)
  left, right = get(pairs.left, 'left'), get(pairs.right, 'right')
  flips = (get(pairs.left, 'left', True), get(pairs.right, 'right', True)) if config.flip else (None, None)
  pairs_lib.check_feature_pairs(left, right, pairs.names, source=f'{config.backbone} features of {root}')
  desc = {**features_lib.describe(backbone, layers), 'root': os.path.abspath(root)}
  return adaptation_runs.Features(left, right, *flips), pairs.names, (pairs.left, pairs.right), desc


def train_all(hp: adaptation_runs.Hparams, feats: adaptation_runs.Features, run: runtime.Run | None = None, checkpoint_every: int = 25,
              progress: bool = True, devices=None, ks=(1,)) -> dict:
  """Every run through the runtime loop (checkpoints in `run`, none when run is None).

  The runs axis is sharded over `devices` (default: every device of every host; see sharding.py).
  Every run trains at every sigma of hp.sigmas in the same program (adaptation_runs.train_chunk).
  Returns numpy arrays: loss (R, S, E), ranks (R, S, E, n_test), val_ranks (R, S, E, n_val) or None,
  raw/pca baseline ranks (R, n_test), explained variance (R,), final params (R, S, ...), PCAs, test_idx
  (R, n_test), val_idx (R, n_val) or None; adaptation_runs.select_sigma(out, s) gives one sigma's view.
  """
  mesh = sharding.make_mesh('runs', devices)
  per_run, rep = sharding.split(mesh), sharding.replicated(mesh)
  runs = hp.runs
  hp_x = dataclasses.replace(hp, runs=sharding.padded(runs, mesh))  # extra runs are computed, then dropped
  feats_j = adaptation_runs.Features(*(None if a is None else sharding.to_global(np.asarray(a, np.float32), rep)
                             for a in feats))
  sp = cpu_kernels.jit(adaptation_runs.splits, static_argnums=(0, 1), out_shardings=per_run)(hp_x, len(feats.left))
  shape = lambda idx: (hp_x.runs, len(hp.sigmas), hp.epochs, idx.shape[1])
  fit = cpu_kernels.jit(adaptation_runs.fit_pcas, static_argnums=0, out_shardings=per_run)
  init = cpu_kernels.jit(adaptation_runs.init_state, static_argnums=0, out_shardings=per_run)
  host = {'loss': np.zeros(shape(sp.test)[:3], np.float32), 'ranks': np.zeros(shape(sp.test), np.int32)}
  if sp.val is not None:
    host['val_ranks'] = np.zeros(shape(sp.val), np.int32)
  tree, start = None, 0
  if run is not None and run.ckpt_dir:
    shapes = {'state': init.eval_shape(hp_x), 'pca': dict(fit.eval_shape(hp_x, feats_j, sp.train)._asdict())}
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=per_run), shapes)
    tree, start = run.restore({**abstract, **host})
    tree = {**tree, **{k: np.array(tree[k]) for k in host}} if start else None
  if tree is None:
    tree = {'state': init(hp_x), 'pca': dict(fit(hp_x, feats_j, sp.train)._asdict()), **host}
  pcas = adaptation_runs.pca_lib.PCA(**tree['pca'])
  data = cpu_kernels.jit(adaptation_runs.project, out_shardings=per_run)(feats_j, pcas, sp)
  base = cpu_kernels.jit(adaptation_runs.baselines, out_shardings=per_run)(feats_j, data, sp.test)
  evr = cpu_kernels.jit(adaptation_runs.explained_variance, static_argnums=0, out_shardings=per_run)(hp_x, feats_j, pcas, sp.train)
  chunk = adaptation_runs.chunk_program(out_shardings=per_run)

  def chunk_fn(tree, e0, n):
    state, o = chunk(hp_x, tree['state'], data, n)
    l, r = sharding.to_host(o.loss), sharding.to_host(o.test_ranks)
    collapse.check(l[:runs], r[:runs], hp.n_fit(len(feats.left)), state.params, e0, hp.sigmas, hp.lr)
    tree['loss'][:, :, e0:e0 + n], tree['ranks'][:, :, e0:e0 + n] = l, r
    if o.val_ranks is not None:
      tree['val_ranks'][:, :, e0:e0 + n] = sharding.to_host(o.val_ranks)
    aR = adaptation_runs.recall_from_ranks(r[:runs], ks).mean(0)             # (S, n, K)
    scalars = {}
    for s, sigma in enumerate(hp.sigmas):
      tag = '' if len(hp.sigmas) == 1 else f'/{adaptation_runs.sigma_key(sigma)}'
      scalars[f'train/loss_mean{tag}'] = l[:runs, s].mean(0)
      scalars.update({f'test/aR_at_{k}_mean{tag}': aR[s, :, j] for j, k in enumerate(ks)})
    return {**tree, 'state': state}, scalars

  tree = runtime.loop(tree, chunk_fn, start, hp.epochs, checkpoint_every, run=run, progress=progress,
                      desc=f'train {runs} runs (epochs)')
  to_host = lambda x: jax.tree.map(lambda a: sharding.to_host(a)[:runs], x)
  return {'loss': tree['loss'][:runs], 'ranks': tree['ranks'][:runs],
          'val_ranks': tree['val_ranks'][:runs] if sp.val is not None else None, 'raw': to_host(base['raw']),
          'pca': to_host(base['pca']), 'explained_variance': to_host(evr), 'params': to_host(tree['state'].params),
          'pcas': to_host(pcas), 'test_idx': to_host(sp.test), 'val_idx': None if sp.val is None else to_host(sp.val)}


def fingerprint(hp: adaptation_runs.Hparams, feats: adaptation_runs.Features) -> runtime.Fingerprint:
  """What a run's results depend on: the training fields and the feature arrays (the data)."""
  fields = {('train_dtype' if k == 'dtype' else k): v for k, v in hp.__dict__.items()}
  return runtime.fingerprint(fields, {'left features': feats.left, 'right features': feats.right,
                                      'left mirrored features': feats.left_flip,
                                      'right mirrored features': feats.right_flip})


def run(config, workdir: str, progress: bool = True) -> dict:
  config = config_fields.select_source(config)
  validate_config(config)
  hp = hparams_from_config(config)
  ks = [int(k) for k in config.ks]
  t0, c0 = time.time(), compile_cache.clock().snapshot()
  feats, names, paths, desc = load_features(config, hp, ks, progress)
  recorded = config_fields.recorded_config(config, uses_backbone=config.dataset != 'features')
  with runtime.Run(workdir, recorded, fingerprint(hp, feats), config.checkpoint, progress) as rt:
    t1, c1 = time.time(), compile_cache.clock().snapshot()
    runtime.say(f'training {hp.runs} runs x {hp.epochs} epochs on {len(names)} pairs '
                f'({feats.left.shape[1]}-d features{", + flip view" if feats.left_flip is not None else ""})')
    out = train_all(hp, feats, rt, config.checkpoint_every, progress, ks=ks)
    t2, c2 = time.time(), compile_cache.since(c1)
    summary = adaptation_runs.summarise(hp, out, ks)
    n = len(names)
    metrics = rt.write_metrics({
        'experiment': 'adapt', 'dataset': config.dataset, **desc,
        'n_pairs': n, 'n_train': hp.n_train(n), 'n_fit': hp.n_fit(n), 'n_val': hp.n_val(n),
        'n_test': n - hp.n_train(n), 'feature_dim': int(feats.left.shape[1]), 'runs': hp.runs,
        'epochs': hp.epochs, 'ks': ks, 'sigmas': list(hp.sigmas), 'flip_augmentation': feats.left_flip is not None,
        'pca': {'dim': hp.pca_dim, 'fit': hp.pca_fit, 'whiten': hp.pca_whiten,
                'fit_description': ('each run fit on the left + right vectors of the pairs it trains on'
                                    if hp.pca_fit == 'train' else 'one fit on every vector the reference fits on: '
                                    'left, right and mirrored views of all pairs, test included'),
                'explained_variance': adaptation_runs.stats(out['explained_variance'])},
        'epoch_rule': adaptation_runs.describe_epoch_rules(hp, n, ks[0]),
        'epochs_selected': summary['epochs'],
        'results': {f'aR@{k}': {**summary['baselines'][f'aR@{k}'],
                                **{key: v[f'aR@{k}'] for key, v in summary['adapted'].items()}} for k in ks},
        'spread': 'std: one standard deviation over runs (ddof 0; Table 1\'s +-); two_std: Fig. 3\'s band',
        'ties': 'pessimistic: a candidate scoring equal to the partner ranks ahead of it',
        'timing_s': {'data_and_features': t1 - t0, 'training_and_eval': t2 - t1,  # compile: tracing + XLA
                     'compile': c1['seconds'] - c0['seconds'] + c2['seconds'],   # or its persistent-cache read
                     'extract': t1 - t0 - (c1['seconds'] - c0['seconds']), 'train': t2 - t1 - c2['seconds']},
        'config': recorded,
    })
    write_outputs(config, rt, out, summary, feats, names, paths, desc, metrics)
  print_table(hp, ks, metrics, workdir)
  return metrics


def write_outputs(config, rt, out, summary, feats, names, paths, desc, metrics) -> None:
  """adapter.npz (the last sigma), curves.npz and the figures (per sigma; process 0)."""
  from visim_jax.training import adapter_file
  from visim_jax.core import report
  if not report.is_writer():
    return
  sigmas = metrics['sigmas']
  last = adaptation_runs.select_sigma(out, len(sigmas) - 1)
  meta = {k: desc.get(k) for k in adapter_file.META_KEYS}
  meta['source'] = {'workdir': rt.workdir, 'dataset': config.dataset, 'run': 0, 'epoch': metrics['epochs'],
                    'sigma': sigmas[-1], 'note': exported_note(metrics)}
  adapter_file.save_adapter(rt.path('adapter.npz'), **adapter_file.run_arrays(last, 0), meta=meta)
  val = {} if summary['val_curves'] is None else {'val_aR': summary['val_curves']}
  runtime.write_npz(rt.path('curves.npz'), loss=out['loss'], aR=summary['curves'], **val, sigmas=np.asarray(sigmas),
                    ks=np.asarray(metrics['ks']))
  if config.plots:
    from visim_jax.plots import adapt as plots
    plots.all_figures(out, summary, metrics, rt.path('plots'))
    if paths is not None:
      plots.retrieval_sheet(feats, last, names, paths, rt.path('plots', 'retrieval_sheet.png'),
                            n_queries=config.sheet_queries, label=exported_note(metrics))


def exported_note(metrics) -> str:
  """What adapter.npz and the retrieval sheet hold, against the epoch the headline reports."""
  key = adaptation_runs.sigma_key(metrics['sigmas'][-1])
  rule = metrics['epoch_rule']['primary']
  head = metrics['epochs_selected'][key][rule]
  return (f'run 0, {key}, last epoch ({metrics["epochs"]})' +
          ('' if head == metrics['epochs'] else f'; the headline reports the {rule} rule\'s epoch {head}'))


def shown_rules(epoch_rule: dict, eps: dict) -> list[str]:
  """The epoch rules the console table shows: the headline's first, then val, last, test; only the headline's when it
  fell back to the last epoch (too few validation pairs: an argmax over epochs of so few pairs moves with float
  rounding, so those columns would differ between CPUs; metrics.json keeps every rule)."""
  if 'fallback' in epoch_rule:
    return [epoch_rule['primary']]
  return list(dict.fromkeys(r for r in (epoch_rule['primary'], 'val', 'last', 'test') if r in eps))


def print_table(hp, ks, metrics, workdir) -> None:
  from visim_jax.core import report
  rule = metrics['epoch_rule']['primary']
  runtime.say(f'\n{hp.runs} runs, {metrics["n_fit"]}/{metrics["n_val"]}/{metrics["n_test"]} train/val/test pairs, '
              f'PCA fit on {hp.pca_fit} (variance kept {metrics["pca"]["explained_variance"]["mean"]:.4f}), '
              f'epoch rule {rule}, workdir {workdir}')
  for key, eps in metrics['epochs_selected'].items():
    rules = shown_rules(metrics['epoch_rule'], eps)
    head = ['metric', 'raw', 'pca'] + [f'{key} {r}@{eps[r]}' + (' (optimistic)' if r == 'test' else '')
                                       for r in rules]
    rows = [[f'aR@{k}'] + [f"{metrics['results'][f'aR@{k}'][c]['mean']:.4f} ± "
                           f"{metrics['results'][f'aR@{k}'][c]['std']:.4f}" for c in ('raw', 'pca')] +
            [f"{metrics['results'][f'aR@{k}'][key][r]['mean']:.4f} ± {metrics['results'][f'aR@{k}'][key][r]['std']:.4f}"
             for r in rules] for k in ks]
    runtime.say(report.table(rows, head))
  runtime.say('(mean ± 1 std over runs, as Table 1; Fig. 3 draws ± 2 std: two_std in metrics.json)')
  if 'fallback' in metrics['epoch_rule']:
    runtime.say(f'note: {metrics["epoch_rule"]["fallback"]}')
  runtime.say(f'adapter.npz and plots/retrieval_sheet.png: {exported_note(metrics)}')
