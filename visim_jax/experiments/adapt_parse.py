"""The adaptation's gate: its config checked once (validate_config), its hyper-parameters, and what the pair count,
feature size and memory allow (check_sizes, check_memory), all before any feature is extracted."""
from __future__ import annotations

import dataclasses

from visim_jax.experiments import checks
from visim_jax.core import memory
from visim_jax.training import adaptation_runs
from visim_jax.core.errors import UserError
from visim_jax.experiments import config_fields

DATASETS = ('tll', 'demo', 'features')
DATA_PATHS = {'tll': (('data_dir', 'dir'), ('subset', 'file')), 'demo': (), 'features': (('features', 'file'),)}


def hparams_from_config(config) -> adaptation_runs.Hparams:
  return adaptation_runs.Hparams(runs=config.runs, train_fraction=config.train_fraction, select_epoch=config.select_epoch,
                       val_fraction=config.val_fraction, min_val_pairs=config.min_val_pairs, pca_dim=config.pca_dim, pca_fit=config.pca_fit,
                       pca_whiten=config.pca_whiten, adapt_dim=config.adapt_dim,
                       sigmas=tuple(float(s) for s in config.sigmas), lr=config.lr, epochs=config.epochs,
                       seed=config.seed, dtype=config.train_dtype)


def validate_config(config) -> None:
  """Checks every field the experiment reads, types and ranges (visim_jax/core/checks.py); raises naming the field.
  main.py calls it before the workdir is touched; sizes that need the data are checked by check_sizes."""
  config = config_fields.select_source(config)
  checks.choice(config, 'dataset', DATASETS)
  checks.integer(config, 'runs', 1, 100_000)
  checks.fraction(config, 'train_fraction')
  checks.integer(config, 'pca_dim', 1, 2**20)
  checks.choice(config, 'pca_fit', adaptation_runs.PCA_FIT)
  checks.integer(config, 'adapt_dim', 1, 2**24)
  checks.numbers(config, 'sigmas', 0, lo_open=True, distinct=True, example='(15,) or (1, 15)')
  checks.choice(config, 'select_epoch', adaptation_runs.SELECT_EPOCH)
  checks.fraction(config, 'val_fraction')
  checks.integer(config, 'min_val_pairs', 0, 10**6)
  checks.number(config, 'lr', 0, lo_open=True)
  checks.integer(config, 'epochs', 1, 10_000_000)
  checks.choice(config, 'train_dtype', ('float32', 'bfloat16'))
  checks.integer(config, 'checkpoint_every', 1)
  checks.numbers(config, 'ks', 1, 10**6, integer=True, example='(1, 5, 20)')
  checks.seed(config)
  checks.integer(config, 'sheet_queries', 0, 1000)
  for f in ('flip', 'pca_whiten', 'checkpoint', 'plots'):
    checks.flag(config, f)
  config_fields.options(config)  # the backbone fields parsed (checked) once here too
  if 'demo' in config:
    checks.integer(config, 'demo.n_pairs', 8, 100_000)
    checks.seed(config, 'demo.seed')
  if config.dataset == 'tll' and not config.data_dir:
    raise checks.fail('data_dir', 'the TLL folder (with left/ and right/) is required for dataset=tll (or pass '
                      '--config.features=FEATS.npz)', config.data_dir)
  if config.dataset == 'features' and not config.features:
    raise checks.fail('features', 'an .npz path is required for dataset=features', config.features)
  checks.data_source(config, DATA_PATHS)


def check_sizes(hp: adaptation_runs.Hparams, n: int, dim: int, ks) -> None:
  """What the pair count and feature size allow (run before feature extraction when they are known)."""
  n_train, n_fit, n_val = hp.n_train(n), hp.n_fit(n), hp.n_val(n)
  n_test = n - n_train
  if n_fit < 2:
    raise UserError(f'config.train_fraction: {n} pairs give {n_fit} pairs to train on')
  if n_test < max(ks):
    if max(ks) > n // 2:  # even a test split of half the pairs could not hold it: the ks are wrong
      raise UserError(f'config.ks: the largest k = {max(ks)} exceeds the test split of {n_test} pairs (of {n}, '
                      f'train_fraction={hp.train_fraction}); lower the ks')
    raise UserError(f'config.train_fraction: {hp.train_fraction} leaves a test split of {n_test} pairs (of {n}), '
                    f'fewer than the largest k = {max(ks)} of config.ks; lower train_fraction')
  if hp.select_epoch == 'val' and n_val < 2:
    raise UserError(f'config.val_fraction: {hp.val_fraction} of the {n_train} training pairs is {n_val} validation '
                    'pairs; raise it, or pick the epoch another way (--config.select_epoch=last)')
  fit_rows = 2 * (n if hp.pca_fit == 'all' else n_fit)
  if hp.pca_dim > min(dim, fit_rows):
    raise UserError(f'config.pca_dim: {hp.pca_dim} exceeds min(feature dim {dim}, PCA samples {fit_rows}); '
                    f'use --config.pca_dim={min(dim, fit_rows)} or less')
  check_memory(hp, n, dim)


def memory_bytes(hp: adaptation_runs.Hparams, n: int, dim: int, views: int = 2) -> dict[str, int]:
  """What the training program must hold at once (bytes; a lower bound: XLA's temporaries come on top), per
  config field it grows with. Every run at every sigma is one vmapped program, so each term is R x S times:
  the parameters with Adam's two moments and the gradient, the full-batch step's activations (views x (left,
  right) x n_fit x adapt_dim) and their gradient, the n_fit^2 logits and their gradient, the test ranking; then
  the features and the host-side records of every epoch (loss, test and validation ranks)."""
  rs = hp.runs * len(hp.sigmas)
  n_fit, n_test, n_val = hp.n_fit(n), n - hp.n_train(n), hp.n_val(n)
  f32 = 4
  return {'adapt_dim': rs * (4 * hp.pca_dim * hp.adapt_dim + 2 * views * 2 * n_fit * hp.adapt_dim
                             + 2 * max(n_test, n_val) * hp.adapt_dim) * f32,
          'runs': rs * (2 * views * n_fit * n_fit + n_test * n_test + views * 2 * n_fit * hp.pca_dim) * f32
                  + hp.runs * dim * hp.pca_dim * f32,
          'epochs': rs * hp.epochs * (1 + n_test + n_val) * f32 * 2,
          'features': 2 * views * n * dim * f32}


def check_memory(hp: adaptation_runs.Hparams, n: int, dim: int) -> None:
  """Refuses (nothing run) a config whose training memory (memory_bytes, a lower bound) exceeds 90% of the
  device's (or the host's, on CPU) memory, naming the fields whose values drive it, largest first (memory.drivers:
  the estimate with each field alone at 1)."""
  def est(v):
    return memory_bytes(dataclasses.replace(hp, runs=int(v['config.runs']), epochs=int(v['config.epochs']),
                                            adapt_dim=int(v['config.adapt_dim']), pca_dim=int(v['config.pca_dim']),
                                            sigmas=tuple(hp.sigmas[:1]) * int(v['config.sigmas'])), n, dim)
  sizes = {'config.runs': hp.runs, 'config.epochs': hp.epochs, 'config.adapt_dim': hp.adapt_dim,
           'config.pca_dim': hp.pca_dim, 'config.sigmas': len(hp.sigmas)}
  memory.check(est(sizes), memory.drivers(est, sizes),
               f'runs={hp.runs}, {len(hp.sigmas)} sigma(s), epochs={hp.epochs}, pca_dim={hp.pca_dim}, '
               f'adapt_dim={hp.adapt_dim}, {n} pairs')
