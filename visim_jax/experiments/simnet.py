"""The SimNet experiment (paper 002) as wiring: config -> vectors -> warm-up / Eq. 2 / SimNet* (runtime) -> retrieval.

config.mode: 'warmup' (imitate cosine on random pairs: held-out MSE and rho, Table 1); 'classes' (a labelled
set, same class = similar; dataset demo | folder (<class>/<image>) | features (.npz features + labels); split
'images' stratified or 'classes' held out; leave-one-out mAP / mP@k / recall@k among test images, optional
Oxford/Paris evaluation via config.retrieval.{gt, features}); 'pairs' (TLL-style: dataset tll | demo |
features; aR@k / R@k of the test pairs' N x N score matrix). Beside SimNet, cosine on the same vectors.
Phases share one step counter and one checkpoint tree (params, optimiser state, loss history, warm-up curve):
warm-up (config.warmup_steps), stage 1 (config.steps of balanced pairs), stage 2 = SimNet* (config.refine_steps:
a fresh random set of config.hard_set_size is scored all-against-all, pairs where g is worse than cosine form the
difficult pool, saved to hard_pairs.npz; config.hard_fraction of each batch comes from it). The optimiser state
is reset when stage 1 starts. Vectors: optional PCA fitted on training vectors (config.pca_dim), then L2
(config.normalize). The model math, samplers and jitted chunks are in visim_jax/models/simnet.py; figures in
plots/simnet.py; the data in experiments/simnet_data.py; the phases on the runtime, evaluation and report in
experiments/simnet_run.py. Outputs: config.json, metrics.json, curves.npz, TensorBoard, plots/, hard_pairs.npz, checkpoints/.
"""
from __future__ import annotations

import os
import time

import ml_collections
import numpy as np

from visim_jax.experiments import checks
from visim_jax.core import memory
from visim_jax.training import runtime
from visim_jax.models import simnet
from visim_jax.core.errors import UserError
from visim_jax.experiments import simnet_data, simnet_run
from visim_jax.experiments import config_fields

MODES = ('warmup', 'classes', 'pairs')
DATA_PATHS = {'tll': (('data_dir', 'dir'), ('subset', 'file')), 'folder': (('data_dir', 'dir'),), 'demo': (),
              'features': (('features', 'file'),)}
DATASETS = {'warmup': ('random',), 'classes': ('demo', 'folder', 'features'), 'pairs': ('tll', 'demo', 'features')}
NOT_FINGERPRINTED = ('plots', 'checkpoint', 'checkpoint_every', 'log_every', 'q_tile', 'd_tile', 'score_dtype',
                     'retrieval', 'ks')


def default_config() -> ml_collections.ConfigDict:
  """Every field the experiment reads (configs/simnet_*.py start from this)."""
  c = ml_collections.ConfigDict()
  c.experiment, c.mode, c.dataset = 'simnet', 'classes', 'demo'  # dataset: see DATASETS[mode]
  c.data_dir, c.subset, c.features = '', '', ''
  c.demo = ml_collections.ConfigDict({'root': '', 'n_pairs': 192, 'seed': 0})
  config_fields.add_fields(c)
  c.pca_dim = 0                # 0: no PCA; else PCA fitted on the training vectors
  c.normalize = True           # L2-normalise vectors before SimNet (after PCA)
  c.architecture = 'B'         # Table 1: A | B | C | D, or comma-separated widths '512,512'
  c.init, c.init_std = 'he', 0.01   # 'he' | 'normal' (N(0, init_std^2), the authors')
  c.delta = 0.4                # Eq. 2 margin (paper: 0.2 .. 0.8)
  c.optimizer = 'sgd'          # 'sgd' (paper) | 'adam'
  c.lr, c.momentum, c.weight_decay, c.decay_biases = 1e-3, 0.9, 5e-4, False
  c.batch_size = 100
  c.warmup_steps = 0           # random-pair warm-up steps (mode warmup: the whole run)
  c.warmup_dim = 512           # mode warmup only: vector size (RMAC: 512)
  c.warmup_x_dist = 'cube'     # 'cube' (the authors' imdb_random_vectors.m) | 'sphere'
  c.warmup_eval_pairs = 10000  # held-out random pairs for MSE / rho
  c.init_from = ''             # checkpoints/ folder of a previous run whose latest params start this one
  c.steps = 10000              # stage 1 (balanced random pairs, Eq. 2)
  c.refine_steps = 0           # stage 2 (SimNet*); 0 = plain SimNet
  c.hard_set_size = 500        # images (classes) or pairs (pairs) in the fresh random set scored all-vs-all
  c.hard_fraction = 0.5        # share of each stage-2 batch taken from the difficult pool
  c.split = 'images'           # classes mode: 'images' (stratified) | 'classes' (held-out classes)
  c.test_fraction, c.train_fraction = 0.25, 0.75   # classes mode, pairs mode
  c.ks = (1, 5, 10)
  c.seed = 0
  # Oxford/Paris: gt + features (precomputed .npz), or roots: comma-separated dataset folders (jpg/ + gnd_*.pkl,
  # data/retrieval.py) whose database images and cropped queries are described with the run's backbone (pooling=rmac)
  c.retrieval = ml_collections.ConfigDict({'gt': '', 'features': '', 'roots': ''})
  c.q_tile, c.d_tile, c.score_dtype = 256, 256, 'float32'
  c.log_every = 100            # steps per jitted chunk (a loss point, an eval point in warm-up)
  c.checkpoint, c.checkpoint_every, c.plots = True, 1000, True
  return c


def validate_config(config) -> None:
  """Every field's type and range (visim_jax/core/checks.py), naming the field; main.py calls it before the workdir
  is touched."""
  if config.mode != 'warmup':
    config = config_fields.select_source(config)
  checks.choice(config, 'mode', MODES)
  if config.mode != 'warmup':
    checks.choice(config, 'dataset', DATASETS[config.mode])
  try:
    simnet.hidden_sizes(simnet_run.arch(config.architecture))
  except (TypeError, ValueError) as e:
    raise checks.fail('architecture', 'a Table 1 letter (A, B, C, D) or comma-separated positive widths',
                      config.architecture) from e
  checks.choice(config, 'init', ('he', 'normal'))
  checks.number(config, 'init_std', 0, 10, lo_open=True)
  checks.choice(config, 'optimizer', ('sgd', 'adam'))
  checks.number(config, 'lr', 0, 10, lo_open=True)
  checks.number(config, 'momentum', 0, 1, hi_open=True)
  checks.number(config, 'weight_decay', 0, 1)
  checks.integer(config, 'batch_size', 2, 2**20)
  checks.number(config, 'delta', 0, 2, note=' (a margin between cosine targets)')
  for f in ('warmup_steps', 'steps', 'refine_steps'):
    checks.integer(config, f, 0, 10**9)
  checks.integer(config, 'pca_dim', 0, 2**20, note=' (0: no PCA)')
  checks.integer(config, 'log_every', 1)
  checks.integer(config, 'checkpoint_every', 1)
  checks.integer(config, 'warmup_dim', 2, 2**16)
  checks.integer(config, 'warmup_eval_pairs', 10, 10**6)
  checks.fraction(config, 'hard_fraction', lo_open=False, hi_open=False)
  checks.integer(config, 'hard_set_size', 2, 10**5)
  checks.integer(config, 'q_tile', 1, 2**16)
  checks.integer(config, 'd_tile', 1, 2**16)
  checks.choice(config, 'score_dtype', ('float32', 'bfloat16'))
  checks.numbers(config, 'ks', 1, 10**6, integer=True, example='(1, 5, 10)')
  checks.fraction(config, 'test_fraction')
  checks.fraction(config, 'train_fraction')
  checks.seed(config)
  for f in ('normalize', 'decay_biases', 'checkpoint', 'plots'):
    checks.flag(config, f)
  config_fields.options(config)  # the backbone fields parsed (checked) once here too
  checks.integer(config, 'demo.n_pairs', 8, 100_000)
  checks.seed(config, 'demo.seed')
  if config.mode == 'warmup':
    checks.integer(config, 'warmup_steps', 1, 10**9, note=' (mode=warmup trains the warm-up only)')
  else:
    if config.steps < 1 and not config.init_from:
      raise checks.fail('steps', 'must be >= 1 (0 only with init_from: evaluate it)', config.steps)
    checks.choice(config, 'split', ('images', 'classes'))
    if config.dataset in ('tll', 'folder') and not config.data_dir:
      raise checks.fail('data_dir', f'a folder is required for dataset={config.dataset}', config.data_dir)
    if config.dataset == 'features' and not config.features:
      raise checks.fail('features', 'an .npz path is required for dataset=features', config.features)
  checks.data_source(config, DATA_PATHS)
  for f in ('retrieval.gt', 'retrieval.features'):
    checks.input_path(config, f, 'dir' if os.path.isdir(checks.get(config, f)) else 'file')
  for root in str(config.retrieval.roots).split(','):
    if root.strip() and not os.path.isdir(root.strip()):
      raise UserError(f'config.retrieval.roots: {root.strip()}: folder not found')
  if config.get('require_retrieval', False) and not (config.retrieval.roots or config.retrieval.gt):
    raise UserError('config.retrieval.roots: configs/simnet_oxford.py evaluates Oxford/Paris and none is given: '
                    'pass --config.retrieval.roots=DIR[,DIR] (revisitop layout: DIR/jpg/*.jpg + DIR/gnd_NAME.pkl) '
                    'or --config.retrieval.gt=... with --config.retrieval.features=...; for SimNet without '
                    'Oxford/Paris offline: configs/simnet_classes.py:paper_demo')
  if bool(config.retrieval.gt) != bool(config.retrieval.features):
    raise UserError('config.retrieval: gt and features go together (ground truth + an .npz with database/queries)')
  if (config.retrieval.gt or config.retrieval.roots) and config.mode != 'classes':
    raise UserError('config.retrieval: Oxford/Paris evaluation is run in mode=classes')
  if config.retrieval.roots and (config.pooling != 'rmac' or config.dataset == 'features'):
    raise UserError('config.retrieval.roots: Oxford/Paris folders are described with the run\'s backbone and '
                    'pooling=rmac (cropped queries) from an image dataset; set --config.pooling=rmac, or give '
                    'precomputed retrieval.gt + retrieval.features')
  if config.init_from and not os.path.isdir(config.init_from):
    raise FileNotFoundError(f'config.init_from: {config.init_from} is not a checkpoints folder')


def check_memory(config, d: dict) -> None:
  """SimNet's training memory (bytes, a lower bound) against the device's, before allocating: the MLP on 2 x dim
  inputs with Adam's moments and the gradient, a batch's activations, SimNet*'s all-vs-all hard set (labels and
  one score tile), the loss history on host, the training features. The refusal names the fields that drive it,
  largest first (memory.drivers; the architecture by its parameters' share)."""
  f32, dim = memory.F32, int(d['dim'])
  sizes = (2 * dim, *simnet.hidden_sizes(simnet_run.arch(config.architecture)), 1)
  params = sum((a + 1) * b for a, b in zip(sizes[:-1], sizes[1:]))
  steps = config.warmup_steps + config.steps + config.refine_steps
  train = d.get('train', {})

  def est(v):
    m = v['config.hard_set_size']
    return {'parameters': 5 * params * f32, 'activations': 3 * v['config.batch_size'] * sum(sizes) * f32,
            'hard set': m * m + v['config.q_tile'] * v['config.d_tile'] * sum(sizes[1:]) * f32 * bool(m),
            'loss history': 2 * steps * f32,
            'features': sum(np.asarray(x).nbytes for k, x in train.items() if k in ('a', 'b'))}
  m = config.hard_set_size if config.mode != 'warmup' and config.refine_steps else 0
  values = {'config.batch_size': config.batch_size, 'config.hard_set_size': m, 'config.q_tile': config.q_tile,
            'config.d_tile': config.d_tile}
  parts = est(values)
  fields = {'config.architecture': parts['parameters'], **memory.drivers(est, values)}
  memory.check(parts, dict(sorted(fields.items(), key=lambda fb: -fb[1])),
               f'architecture={config.architecture}, input 2 x {dim}, batch_size={config.batch_size}, '
               f'hard_set_size={config.hard_set_size}')


# ---------------------------------------------------------------------------------------------- the run

def run(config, workdir: str, progress: bool = True) -> dict:
  config = config_fields.select_source(config) if config.mode != 'warmup' else config
  validate_config(config)
  t0 = time.time()
  d = simnet_data.prepare(config, progress)
  check_memory(config, d)
  recorded = config_fields.recorded_config(config, uses_backbone=config.mode != 'warmup'
                                          and config.dataset != 'features')
  fields = {k: v for k, v in recorded.items() if k not in NOT_FINGERPRINTED}
  with runtime.Run(workdir, recorded, runtime.fingerprint(fields, d['fp']), config.checkpoint, progress,
                   desc=f'simnet {config.mode}') as rt:
    t1 = time.time()
    params, stats = simnet_run.train(config, rt, d)
    t2 = time.time()
    metrics = simnet_run.evaluate(config, params, d, stats)
    metrics['timing_s'] = {'data_and_features': t1 - t0, 'training': t2 - t1, 'evaluation': time.time() - t2}
    metrics['config'] = recorded
    metrics = rt.write_metrics(metrics)
    simnet_run.write_outputs(config, rt, stats)
  simnet_run.print_summary(metrics, [int(k) for k in config.ks])
  return metrics

