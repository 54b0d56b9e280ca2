"""Runs an experiment from an ml_collections config file.

  python -m visim_jax.main --config=configs/demo.py --workdir=/tmp/visim_demo
  python -m visim_jax.main --config=configs/tll.py --workdir=DIR --config.data_dir=/path/to/TLL
  python -m visim_jax.main --list_backbones

The config's `experiment` field names a module of visim_jax.experiments whose `run(config, workdir)`
does config -> data -> features -> train -> eval -> report (training through visim_jax/training/runtime.py).
A user mistake (unknown `--config.x=y` field, bad value, missing file, full disk, busy workdir...) ends as one
line `error: <file or config.field>: <what to do>` on stderr with exit status 1 (visim_jax/core/errors.py); the
traceback is shown with --verbosity=1 or VISIM_TRACEBACK=1, as are absl / Orbax / JAX INFO logs (--verbosity=0).
"""
from __future__ import annotations

import importlib
import os

from absl import app, flags
from ml_collections import config_flags

from visim_jax.core import errors

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Path to an ml_collections config file.',
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Output folder (metrics.json, plots, checkpoints).')
_CACHE = flags.DEFINE_bool('compile_cache', True, 'Keep compiled programs in JAX\'s persistent cache '
                           '(~/.cache/visim_jax/jax_cache, or $VISIM_COMPILE_CACHE; VISIM_COMPILE_CACHE=0 = off) '
                           'so a second run of the same config does not compile again.')
_LIST = flags.DEFINE_bool('list_backbones', False, 'Print each backbone name, its default feature size, whether '
                          'its weights are on this machine (else the command that puts them there), its '
                          'description and aliases, and exit (no jax, no weights: instant).')

EXPERIMENTS = ('adapt', 'table1', 'simnet', 'histograms', 'twoafc', 'benchmark', 'nights_adapt', 'learn_triplets',
               'tune')


def run(config, workdir: str, compile_cache: bool = True):
  """What main() does, callable from a notebook: returns the experiment's summary dict.
  compile_cache: JAX's persistent compilation cache (visim_jax/training/compile_cache.py), on unless False or
  VISIM_COMPILE_CACHE=0."""
  experiment = config.get('experiment')
  if experiment not in EXPERIMENTS:
    raise errors.UserError(f'config.experiment: unknown experiment {experiment!r}; known: {", ".join(EXPERIMENTS)}')
  module = importlib.import_module(f'visim_jax.experiments.{experiment}')
  from visim_jax.training import compile_cache as cache_lib, runtime
  from visim_jax.core import paths
  from visim_jax.experiments import checks
  checks.expand_config(config)  # `~` and `$VAR` in every path field (data_dir, features, cache_dir, ...)
  workdir = paths.expand_path(workdir)
  module.validate_config(config)  # every field's type and range, before the workdir is touched
  cache_lib.enable(compile_cache)
  from visim_jax.core import precision
  with runtime.workdir_lock(workdir), precision.context(config.get('matmul_precision', 'default')):  # held from the start: a busy workdir is refused
    runtime.check_experiment(workdir, experiment)  # another experiment's workdir: refused, nothing read or written
    return module.run(config, workdir)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  if _LIST.value:
    from visim_jax.backbones import registry
    print(registry.listing())
    return
  if _CONFIG.value is None:
    raise app.UsageError('--config=configs/NAME.py is required (try configs/demo.py)')
  from visim_jax.training import distributed
  distributed.maybe_initialize()  # multi-host runs (TPU pods, SLURM); nothing on one machine
  config = _CONFIG.value
  workdir = _WORKDIR.value or os.path.join('workdirs', config.get('experiment', 'run'))
  run(config, workdir, _CACHE.value)


def run_main():
  errors.run(main)


if __name__ == '__main__':
  run_main()
