"""The CoSIS 2AFC experiment's gate: its config checked once (validate_config), the context models' hyper-parameters,
and their training memory against the device's (check_memory), before anything is allocated."""
from __future__ import annotations

from visim_jax.experiments import checks
from visim_jax.core import memory
from visim_jax.models import context
from visim_jax.data import cosis
from visim_jax.metrics import degenerate
from visim_jax.experiments import config_fields

PCA_FITS = ('val', 'authors')


def validate_config(config) -> None:
  """Every field's type and range (visim_jax/core/checks.py), naming the field; main.py calls it before the workdir
  is touched."""
  if config.features and config.image_dir:
    raise checks.fail('image_dir', 'set config.features or config.image_dir, not both', config.image_dir)
  checks.input_path(config, 'features')
  checks.input_path(config, 'image_dir', 'dir')
  if config.annotations != 'synthetic':
    checks.input_path(config, 'annotations', 'dir')
  checks.integer(config, 'stand_in_dim', 2, 2**16)
  checks.choice(config, 'model.split', cosis.SPLITS)
  checks.fraction(config, 'model.train_fraction')
  checks.integer(config, 'model.embed_dim', 1, 2**16)
  checks.integer(config, 'model.hidden', 0, 2**16, note=' (0: a linear ranking block)')
  checks.integer(config, 'model.steps', 1, 10**9)
  checks.integer(config, 'model.chunk_steps', 1)
  checks.integer(config, 'model.batch_size', 1, 2**20)
  checks.number(config, 'model.triplet_weight', 0, 1e3)
  checks.number(config, 'model.lr', 0, 10, lo_open=True)
  checks.number(config, 'model.weight_decay', 0, 1)
  checks.integer(config, 'ensemble.grid', 2, 10**4)
  checks.integer(config, 'ensemble.window', 2, 10**4)
  checks.number(config, 'ensemble.threshold', 0, 1)
  checks.choice(config, 'ensemble.pca_fit', PCA_FITS)
  for f in ('mlp_dim', 'mlp_hidden', 'mlp_batch'):
    checks.integer(config, f'ensemble.{f}', 1, 2**16)
  checks.integer(config, 'ensemble.mlp_epochs', 1, 10**7)
  checks.integer(config, 'ensemble.mlp_seeds', 1, 10**4)
  checks.number(config, 'ensemble.mlp_lr', 0, 10, lo_open=True)
  checks.number(config, 'ensemble.mlp_alpha', 0, 1e3)
  checks.integer(config, 'n_boot', 0, 10**6, note=' (0: no intervals)')
  checks.fraction(config, 'ci_level')
  degenerate.check_n_boot(config.n_boot, 'config.n_boot', 1 - config.ci_level)
  checks.seed(config)
  config_fields.options(config)  # the backbone fields parsed (checked) once here too


def model_hparams(config) -> context.Hparams:
  fields = ('embed_dim', 'hidden', 'triplet_weight', 'normalize', 'lr', 'weight_decay', 'steps', 'batch_size', 'swap')
  return context.Hparams(**{f: config.model[f] for f in fields}, seed=config.seed)


def check_memory(config, k: int, n: int, dim: int) -> None:
  """The K context models' training memory (bytes, a lower bound) against the device's, before allocating:
  parameters with Adam's moments and the gradient (the orthogonal init's QR as large), each step's embeddings of
  a batch of triplets, the loss history on host, the features."""
  m, f32 = config.model, memory.F32

  def est(v):
    e, h, b, s = (int(v[f'config.model.{f}']) for f in ('embed_dim', 'hidden', 'batch_size', 'steps'))
    params = dim * e + 3 * e * max(h, 1) + h
    return {'parameters': 5 * k * params * f32, 'activations': 3 * k * b * 3 * e * f32,
            'loss history': 2 * k * s * f32, 'features': n * dim * f32}
  sizes = {f'config.model.{f}': m[f] for f in ('embed_dim', 'hidden', 'batch_size', 'steps')}
  memory.check(est(sizes), memory.drivers(est, sizes),
               f'{k} models, embed_dim={m.embed_dim}, hidden={m.hidden}, batch_size={m.batch_size}, '
               f'steps={m.steps}, {n} images of {dim} features')
