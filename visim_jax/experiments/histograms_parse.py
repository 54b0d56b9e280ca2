"""The histograms experiment's gate: its config checked once (validate_config) into the estimator's options."""
from __future__ import annotations

import os

from visim_jax.experiments import checks
from visim_jax.core.errors import UserError
from visim_jax.metrics import histograms as H
from visim_jax.experiments import config_fields

DATASETS = ('demo', 'folder', 'tfds', 'features')


def validate_config(config) -> H.Options:
  def need(cond, field, msg):
    if not cond:
      raise UserError(f'config.{field}: {msg}')
  config = config_fields.select_source(config)  # config.features alone selects dataset='features'
  need(config.dataset in DATASETS, 'dataset', f'one of {DATASETS}, got {config.dataset!r}')
  need(config.normalization in H.NORMALIZATIONS, 'normalization', f'one of {H.NORMALIZATIONS}')
  need(config.normalization != 'source' or config.source_stats, 'source_stats',
       "an .npz with `mean` and `std` is required for normalization='source'")
  checks.fraction(config, 'sample_fraction', hi_open=False)
  need(config.dataset != 'folder' or config.data_dir, 'data_dir', 'a folder of class sub-folders is required')
  need(config.dataset != 'features' or config.features, 'features', 'an .npz path is required for dataset=features')
  need(config.dataset != 'tfds' or config.tfds.name, 'tfds.name', 'a TFDS dataset name is required for dataset=tfds')
  need(config.class_tree in ('', 'demo') or os.path.exists(config.class_tree), 'class_tree',
       f'{config.class_tree}: class tree file not found')
  checks.data_source(config, {'folder': (('data_dir', 'dir'),), 'features': (('features', 'file'),)})
  if config.normalization == 'source':
    checks.input_path(config, 'source_stats')
  else:
    checks.unused(config, ['source_stats'], f"with normalization={config.normalization!r}")
  checks.integer(config, 'bins', 1, 10**6)
  checks.integer(config, 'min_class_size', 2, 10**9)
  checks.integer(config, 'se_replicates', 0, 10**4)
  checks.integer(config, 'pairwise_max_classes', 0, 10**5)
  checks.integer(config, 'pairs.n_intra', 1, 10**9)
  checks.integer(config, 'pairs.n_inter', 1, 10**9)
  checks.integer(config, 'pairs.exhaustive_max', 1)
  checks.number(config, 'pairs.max_seconds', 0, lo_open=True)
  checks.integer(config, 'pairs.tile', 0, 2**16, note=' (0: the default)')
  checks.integer(config, 'pairs.chunk_elems', 0, 2**34, note=' (0: the default)')
  checks.integer(config, 'knn.k', 0, 10**4)
  checks.integer(config, 'knn.queries', 0, 10**9, note=' (0: every sample)')
  checks.integer(config, 'tree_min_children', 2, 10**6)
  checks.integer(config, 'tfds.max_examples', 0, note=' (0: the whole split)')
  checks.seed(config)
  config_fields.options(config)  # the backbone fields parsed (checked) once here too
  checks.integer(config, 'demo.n_pairs', 8, 100_000)
  checks.seed(config, 'demo.seed')
  for f in ('shard', 'plots'):
    checks.flag(config, f)
  p = config.pairs
  opts = H.Options(mode=p.mode, n_intra=p.n_intra, n_inter=p.n_inter, exhaustive_max=p.exhaustive_max,
                   max_seconds=p.max_seconds, tile=p.tile, chunk_elems=p.chunk_elems, seed=config.seed,
                   bins=config.bins, min_class_size=config.min_class_size, se_replicates=config.se_replicates,
                   pairwise_max_classes=config.pairwise_max_classes)
  opts.validate()
  return opts
