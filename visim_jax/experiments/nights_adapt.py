"""Learning from human judgements as wiring: NIGHTS -> frozen features -> S seeds (training/human_heads.py, runtime) -> report.

Data (config.dataset): 'nights' reads config.nights_dir (data.csv, ref/, distort/; data/nights.py); 'demo' the
mini NIGHTS set of data/human_demo.py. Every image of train, val and test is embedded once through the feature
cache (features.py). The head (config.model: 'adapter' = paper 001's W + ReLU over a PCA fit on the train
images, 'triplet' = paper 004's embedding head) trains with DreamSim's hinge loss (losses/hinge.py), S seeds
vmapped, the epoch chosen on NIGHTS val, resumable through runtime.Run.
Outputs in the workdir: config.json, fingerprint.json, metrics.json (NIGHTS val / test / test_imagenet /
test_no_imagenet 2AFC scores with 95% bootstrap intervals for the frozen features, the PCA'd features and the
trained head; per-seed test scores), curves.npz, checkpoints/, and adapter.npz (model 'adapter': the seed
with the best val score, the adapter.npz format of training/adapter_file.py, so `adapter:<workdir>` ranks it on every protocol) or
triplet_head.npz (model 'triplet': w and meta).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from visim_jax.core import cpu_kernels
from visim_jax.experiments import checks
from visim_jax.core import memory, ops, pca, report
from visim_jax.training import adapter_file
from visim_jax.training import human_heads, runtime
from visim_jax.metrics import leaderboard
from visim_jax.backbones import features as features_lib
from visim_jax.data import human_demo, nights
from visim_jax.core.errors import UserError
from visim_jax.metrics import degenerate
from visim_jax.metrics import human as human_metrics
from visim_jax.experiments import config_fields

DATASETS = ('nights', 'demo')
EVAL_SPLITS = ('val', 'test', 'test_imagenet', 'test_no_imagenet')


def hparams_from_config(config) -> human_heads.Hparams:
  return human_heads.Hparams(model=config.model, adapt_dim=config.adapt_dim, embed_dim=config.embed_dim,
                            margin=config.margin, lr=config.lr, weight_decay=config.weight_decay,
                            batch_size=config.batch_size, epochs=config.epochs, seeds=config.seeds,
                            seed=config.seed, select=config.select_epoch)


def validate_config(config) -> None:
  checks.choice(config, 'dataset', DATASETS)
  if config.dataset == 'nights' and not config.nights_dir:
    raise checks.fail('nights_dir', 'the NIGHTS folder (data.csv, ref/, distort/) is required for dataset=nights',
                      config.nights_dir)
  checks.choice(config, 'model', human_heads.MODELS)
  checks.choice(config, 'select_epoch', human_heads.SELECT)
  # types and ranges through visim_jax/core/checks.py (nan, inf, huge or 'abc' named, no traceback)
  checks.integer(config, 'seeds', 1, 10**4)
  checks.integer(config, 'epochs', 1, 10**7)
  checks.integer(config, 'batch_size', 1, 2**20)
  for f in ('adapt_dim', 'embed_dim', 'pca_dim'):
    checks.integer(config, f, 1, 2**20)
  checks.integer(config, 'checkpoint_every', 1)
  checks.integer(config, 'min_votes', 0, 1000)
  checks.number(config, 'lr', 0, 10, lo_open=True)
  checks.number(config, 'margin', 0, 2, note=' (a margin between distances)')
  checks.number(config, 'weight_decay', 0, 1)
  checks.integer(config, 'n_boot', 0, 10**6, note=' (0: no intervals)')
  degenerate.check_n_boot(config.n_boot, 'config.n_boot')
  checks.seed(config)
  checks.seed(config, 'demo.seed')
  config_fields.options(config)  # the backbone fields parsed (checked) once here too
  checks.data_source(config, {'nights': (('nights_dir', 'dir'),), 'demo': ()})


def load_sets(config) -> tuple[dict, str]:
  """({split: TwoAFCSet} for train + EVAL_SPLITS, root), every file checked before any decoding."""
  root = config.nights_dir
  if config.dataset == 'demo':
    root = human_demo.demo_sets(config.demo.root or None, config.demo.seed,
                                cache_dir=config.get('cache_dir') or None).nights
    runtime.say(human_demo.DEMO_NOTE)
  return {s: nights.load(root, s, config.min_votes) for s in ('train',) + EVAL_SPLITS}, root


@functools.partial(cpu_kernels.jit, static_argnums=2)
def _pca(feats, rows, dim: int):
  """(PCA fit on the train images' rows, every image projected)."""
  p = pca.fit(feats[rows], dim)
  return p, pca.transform(p, feats)


PARAM_COPIES = 14   # see memory_bytes


def memory_bytes(hp: human_heads.Hparams, n_images: int, feat_dim: int, pca_dim: int) -> dict[str, int]:
  """What training holds at once (bytes), per part. Parameters: 14 copies of every seed's (in + 1) x out weights:
  the state (params, Adam's two moments, the best copy) both in and out of a jitted chunk (8; XLA's
  memory_analysis of human_heads.train_chunk: arguments 4.0, outputs 4.0), the step's gradients and updates (temps
  2.0) and the checkpoint's host copy of the state (4); measured 14.2 from the peak RSS of 1 vs 8 seeds (Lite0 1776
  -> 2048, CPU, 2026-11-26), where the former estimate said 5. Every seed embeds every image per step (forward,
  gradient, normalised copy); the host-side epoch logs (4 per seed and epoch, with their checkpoint copy); the
  features (and their PCA)."""
  f32 = memory.F32
  in_dim = pca_dim if hp.model == 'adapter' else feat_dim
  out = hp.adapt_dim if hp.model == 'adapter' else hp.embed_dim
  return {'parameters': PARAM_COPIES * hp.seeds * (in_dim + 1) * out * f32,
          'activations': 3 * hp.seeds * n_images * out * f32,
          'epoch logs': 2 * len(human_heads.EpochLog._fields) * hp.seeds * hp.epochs * f32,
          'features': n_images * (feat_dim + in_dim) * f32}


def check_memory(hp: human_heads.Hparams, n_images: int, feat_dim: int, pca_dim: int) -> None:
  """Refuses before allocating, naming the fields whose values drive the estimate, largest first (memory.drivers)."""
  width = 'adapt_dim' if hp.model == 'adapter' else 'embed_dim'
  est = lambda v: memory_bytes(dataclasses.replace(hp, **{k[7:]: int(x) for k, x in v.items()}), n_images,
                               feat_dim, pca_dim)
  sizes = {f'config.{k}': getattr(hp, k) for k in ('seeds', width, 'epochs')}
  memory.check(est(sizes), memory.drivers(est, sizes), f'seeds={hp.seeds}, epochs={hp.epochs}, {width}='
               f'{getattr(hp, width)}, {n_images} images of {feat_dim} features')


def _split(s, index) -> human_heads.Split:
  return human_heads.Split(*(jnp.asarray(r) for r in s.rows(index)), jnp.asarray(s.judge))


def run(config, workdir: str, progress: bool = True) -> dict:
  validate_config(config)
  hp = hparams_from_config(config)
  t0 = time.time()
  sets, root = load_sets(config)
  fo = config_fields.options(config)
  backbone, layers = features_lib.build(fo)
  paths = list(dict.fromkeys(p for s in sets.values() for p in s.paths()))
  check_memory(hp, len(paths), sum(backbone.layer_dims(layers).values()), int(config.pca_dim))  # before allocating
  runtime.say(f'NIGHTS {root}: ' + ', '.join(f'{k} {len(v)}' for k, v in sets.items()) +
              f' triplets, {len(paths)} images; features: {backbone.name} ({",".join(layers)})')
  feats = np.asarray(features_lib.features_of(fo, backbone, layers, paths, tag='nights', progress=progress),
                     np.float32)
  index = {p: i for i, p in enumerate(paths)}
  split = {k: _split(v, index) for k, v in sets.items()}
  train_rows = np.unique(np.concatenate([np.asarray(a) for a in split['train'][:3]]))
  p = None
  if hp.model == 'adapter':
    if config.pca_dim > min(len(train_rows), feats.shape[1]):
      raise UserError(f'config.pca_dim: {config.pca_dim} exceeds min(train images {len(train_rows)}, feature dim '
                      f'{feats.shape[1]}); use --config.pca_dim={min(len(train_rows), feats.shape[1])} or less')
    p, x = _pca(jnp.asarray(feats), jnp.asarray(train_rows), int(config.pca_dim))
  else:
    x = jnp.asarray(feats)
  desc = features_lib.describe(backbone, layers)
  recorded = config_fields.recorded_config(config, uses_backbone=True)
  fields = {**hp.__dict__, 'pca_dim': int(config.pca_dim) if hp.model == 'adapter' else None,
            'min_votes': config.min_votes}
  fp = runtime.fingerprint(fields, {'features': feats, **{f'{k} {f}': np.asarray(a) for k, s in split.items()
                                                          for f, a in s._asdict().items()}})
  host = lambda: {k: np.zeros((hp.seeds, hp.epochs), np.float32) for k in human_heads.EpochLog._fields}
  with runtime.Run(workdir, recorded, fp, config.checkpoint, progress, desc='train (epochs)') as rt:
    t1 = time.time()
    init = human_heads.init_state
    template = {'state': init.eval_shape(hp, x.shape[1]), **host()}
    tree, start = rt.restore(template) if config.checkpoint else (template, 0)
    tree = {**tree, **{k: np.array(tree[k]) for k in human_heads.EpochLog._fields}} if start else \
        {'state': init(hp, x.shape[1]), **host()}
    ev = (split['train'], split['val'], split['test'])

    def chunk_fn(tree, e0, n):
      state, log = human_heads.train_chunk(hp, x, *ev, tree['state'], e0, n)
      for k, v in log._asdict().items():
        tree[k][:, e0:e0 + n] = np.asarray(v)
      return {**tree, 'state': state}, {'train/loss_mean': np.asarray(log.train_loss).mean(0),
                                        'val/twoafc_mean': np.asarray(log.val_score).mean(0)}
    tree = rt.loop(tree, chunk_fn, start, hp.epochs, config.checkpoint_every)
    t2 = time.time()
    metrics = _metrics(config, hp, tree, x, feats, p, split, sets, desc, root)
    metrics['timing_s'] = {'data_and_features': t1 - t0, 'training_and_eval': t2 - t1}
    metrics = rt.write_metrics({**metrics, 'config': recorded})
    _outputs(rt, hp, tree, p, metrics, desc)
  _print(metrics, workdir)
  return metrics


def _score(d0, d1, judge, config) -> dict:
  return human_metrics.twoafc_interval(d0, d1, judge, n_resamples=int(config.n_boot), seed=int(config.seed))


@functools.partial(cpu_kernels.jit, static_argnums=(0, 5))
def _distances(hp, params, feats, x, splits, with_pca: bool):
  """{head: {split: (d0, d1)}} of the frozen features, the PCA'd ones ('adapter') and the trained head, in one
  compiled program (cosine distances; every image normalised once)."""
  unit = ops.l2_normalize
  cos = lambda f, s: (1.0 - jnp.sum(f[s.ref] * f[s.p0], -1), 1.0 - jnp.sum(f[s.ref] * f[s.p1], -1))
  heads = {'frozen': unit(feats), **({'pca': unit(x)} if with_pca else {})}
  out = {k: {s: cos(f, sp) for s, sp in splits.items()} for k, f in heads.items()}
  out['trained'] = {s: human_heads.distances(hp, params, x, sp) for s, sp in splits.items()}
  return out


def _metrics(config, hp, tree, x, feats, p, split, sets, desc, root) -> dict:
  state = tree['state']
  best = int(np.argmax(np.asarray(state.best_value)))       # the exported seed: the best by the epoch rule
  params = jax.tree.map(lambda a: a[best], state.best)
  dist = _distances(hp, params, jnp.asarray(feats), x, {s: split[s] for s in EVAL_SPLITS}, p is not None)
  results = {k: {s: _score(*d[s], split[s].judge, config) for s in EVAL_SPLITS} for k, d in dist.items()}
  epochs = np.asarray(state.best_epoch).tolist()
  test_at = [float(tree['test_score'][k, e - 1]) for k, e in enumerate(epochs)]
  return {'experiment': 'nights_adapt', 'dataset': config.dataset, 'nights_dir': os.path.abspath(root), **desc,
          'model': hp.model, 'n_triplets': {k: len(v) for k, v in sets.items()}, 'min_votes': config.min_votes,
          'seeds': hp.seeds, 'epochs': hp.epochs, 'epoch_rule': hp.select, 'epochs_selected': epochs,
          'exported_seed': best, 'results': results,
          'trained_test_per_seed': {'values': test_at, 'mean': float(np.mean(test_at)),
                                    'std': float(np.std(test_at))},
          'loss': f'DreamSim hinge max(0, {hp.margin} - (d0 - d1)(2 round(j) - 1)), d = 1 - cos',
          'score': "DreamSim's score_nights_dataset: (d0 < d1)(1 - j) + (d1 < d0) j + 0.5 (d0 == d1), mean",
          'ci': f'95% percentile bootstrap over triplets ({config.n_boot} resamples)'}


def _outputs(rt, hp, tree, p, metrics, desc) -> None:
  if not report.is_writer():
    return
  best = metrics['exported_seed']
  params = jax.tree.map(lambda a: np.asarray(a[best]), tree['state'].best)
  meta = {k: desc.get(k) for k in adapter_file.META_KEYS}
  meta['source'] = {'workdir': rt.workdir, 'experiment': 'nights_adapt', 'seed': best,
                    'epoch': metrics['epochs_selected'][best], 'epoch_rule': hp.select}
  if hp.model == 'adapter':
    adapter_file.save_adapter(rt.path('adapter.npz'), p.mean, p.components, p.scale, params['w'], meta=meta)
  else:
    runtime.write_npz(rt.path('triplet_head.npz'), w=params['w'], meta=np.asarray(json.dumps(meta, sort_keys=True)))
  runtime.write_npz(rt.path('curves.npz'), **{k: tree[k] for k in human_heads.EpochLog._fields})


def _print(metrics, workdir) -> None:
  cols = [c for c in ('frozen', 'pca', 'trained') if c in metrics['results']]
  rows = [[s] + [leaderboard.cell_text(metrics['results'][c][s], 4) for c in cols] for s in EVAL_SPLITS]
  runtime.say(f"\nNIGHTS 2AFC, model {metrics['model']} ({metrics['seeds']} seeds, epochs chosen by "
              f"{metrics['epoch_rule']}: {metrics['epochs_selected']}), workdir {workdir}")
  runtime.say(report.table(rows, ['split'] + cols))
  s = metrics['trained_test_per_seed']
  runtime.say(f"trained, test over seeds: {s['mean']:.4f} ± {s['std']:.4f}")
