"""Every numeric field of every config (every documented `:arg` mode, nested fields too) set to 0, -1, nan, inf,
1e30, a huge int and 'abc': either the value is valid, or the run is refused with one line naming THAT field
before anything is written (an existing workdir's files stay byte-identical).

Cheap by design: the values go through the same `validate_config` main.run calls before the workdir is touched,
in-process; a value the config's type refuses is what the command line refuses as `config.<field>: cannot use
the value ...` (one subprocess shows it). The values validation accepts are listed in ACCEPTED with the reason;
the ones that need the data or the training to be judged (adaptation lr / sigmas of 1e30, a huge chunk size, an
adapt_dim beyond memory) run for real on a tiny features file, into a finished workdir that must not change.
"""
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from visim_jax.core import memory

from test_configs import documented_modes, load
from visim_jax import main
from visim_jax.core.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HUGE = 2**64
VALUES = {'0': 0, '-1': -1, 'nan': math.nan, 'inf': math.inf, '1e30': 1e30, 'huge': HUGE, 'abc': 'abc'}

# (field, value) pairs validation accepts, and why each is valid
ACCEPTED = {
    # documented zero / off values
    **{(f, '0'): 'documented' for f in (
        'seed', 'demo.seed', 'backbone_kwargs.random_init', 'rmac.whiten_dim', 'pca_dim', 'steps', 'refine_steps',
        'warmup_steps', 'momentum', 'weight_decay', 'hard_fraction', 'delta', 'ensemble.threshold',
        'model.hidden', 'model.triplet_weight', 'ensemble.mlp_alpha', 'n_boot', 'sheet_queries',
        'model.weight_decay', 'knn.k', 'knn.queries', 'pairs.tile', 'pairs.chunk_elems', 'se_replicates',
        'pairwise_max_classes', 'tfds.max_examples', 'lpips_size', 'image_size', 'nights_min_votes', 'min_val_pairs', 'margin',
        'min_votes',
        # learn_triplets: Adam's betas may be 0 (no momentum), no warm-up, k-means++ centres without Lloyd steps
        'b1', 'b2', 'warmup', 'synthetic.seed', 'triplets.kmeans_iters',
        # tune: LoRA without dropout (peft's default); decoding in the training process (no grain workers)
        'lora.dropout', 'worker_count')},
    ('backbone_kwargs.random_init', '-1'): 'documented: off',
    # chunk sizes have no upper bound: one chunk for the whole phase (run below for the adaptation)
    **{(f, 'huge'): 'one chunk' for f in ('checkpoint_every', 'log_every', 'model.chunk_steps')},
    # limits: a huge one is no limit (the exact histogram pass is still refused by its memory estimate)
    **{(f, v): 'a limit' for f, vs in (('pairs.exhaustive_max', ('huge',)), ('pairs.max_seconds', ('1e30', 'huge')),
                                       ('tfds.max_examples', ('huge',))) for v in vs},
    # the adaptation's step size and temperatures: judged on the first chunk's outputs (run below)
    **{(f, v): 'first-chunk collapse check' for f in ('lr', 'sigmas') for v in ('1e30', 'huge')},
}


def numeric_fields(c, prefix=''):
  for k in c.keys():
    v, f = c[k], prefix + k
    if hasattr(v, 'keys'):
      yield from numeric_fields(v, f + '.')
    elif isinstance(v, (int, float)) and not isinstance(v, bool):
      yield f
    elif isinstance(v, tuple) and v and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
      yield f


def set_field(c, field, value):
  """As `--config.field=value` sets it: a tuple field gets (value,); a type the field refuses raises."""
  *parents, last = field.split('.')
  node = c
  for p in parents:
    node = node[p]
  node[last] = (value,) if isinstance(node[last], tuple) else value


def placeholders(c, validate, tmp) -> list:
  """Data fields the mode needs (a folder or file it names when empty), filled with a placeholder path so that
  only the fuzzed field can be wrong: [(field, path)]."""
  from visim_jax.experiments import checks
  fill = []
  for _ in range(4):
    try:
      validate(c)
      return fill
    except UserError as e:
      field = str(e).split(':')[0].removeprefix('config.')
      try:
        empty = checks.get(c, field) in ('', str(tmp))
      except KeyError:
        empty = False
      if not empty:
        raise
      path = str(tmp)
      if str(e).endswith(' is not a file'):  # a file field: a placeholder file
        path = str(tmp / 'placeholder.npz')
        open(path, 'w').close()
      set_field(c, field, path)
      fill = [(f, v) for f, v in fill if f != field] + [(field, path)]
  return fill


MODES = documented_modes()


@pytest.mark.parametrize('name, arg', MODES, ids=[f'{n}:{a}' if a else n for n, a in MODES])
def test_every_numeric_field(name, arg, tmp_path):
  from importlib import import_module
  base = load(name).get_config(arg)
  validate = import_module(f'visim_jax.experiments.{base.experiment}').validate_config
  fill = placeholders(base, validate, tmp_path)  # then the mode itself is valid
  accepted, unexpected = [], []
  for field in numeric_fields(base):
    for vname, value in VALUES.items():
      c = load(name).get_config(arg)
      for f, v in fill:
        set_field(c, f, v)
      try:
        set_field(c, field, value)
      except (TypeError, ValueError):
        continue  # the command line refuses it: `config.<field>: cannot use the value ...`
      try:
        validate(c)
      except UserError as e:
        assert str(e).startswith(f'config.{field}:'), (field, vname, str(e))
        assert '\n' not in str(e)
      else:
        (accepted if (field, vname) in ACCEPTED else unexpected).append((field, vname))
  assert not unexpected, f'{name}:{arg}: accepted by validation but not in ACCEPTED: {unexpected}'
  assert accepted  # the table is exercised


# ------------------------------------------------------------------------------ real runs, a finished workdir

TINY = dict(runs=1, epochs=2, pca_dim=4, adapt_dim=8, ks=(1, 2), checkpoint=False, plots=False,
            checkpoint_every=HUGE, val_fraction=0.2)


def tiny_config(features, **override):
  c = load('tll').get_config('local')
  c.features = features
  for k, v in {**TINY, **override}.items():
    c[k] = v
  return c


@pytest.fixture(scope='module')
def finished(tmp_path_factory):
  d = tmp_path_factory.mktemp('fuzz')
  rng = np.random.RandomState(0)
  left = rng.randn(60, 12).astype(np.float32)
  np.savez(d / 'F.npz', left=left, right=left + 0.4 * rng.randn(60, 12).astype(np.float32))
  wd = d / 'W'
  main.run(tiny_config(str(d / 'F.npz')), str(wd))  # checkpoint_every = 2^64: one chunk, valid
  return str(d / 'F.npz'), wd


def snapshot(wd):
  return {os.path.relpath(os.path.join(r, f), wd): open(os.path.join(r, f), 'rb').read()
          for r, _, fs in os.walk(wd) for f in fs if f != '.lock'}


@pytest.mark.parametrize('field, value', [
    ('seed', HUGE), ('lr', math.inf), ('sigmas', (math.nan,)), ('adapt_dim', 10**7),  # refused before the run
    ('lr', 1e30), ('sigmas', (1e30,)),                                                # at the first chunk
])
def test_a_failed_run_leaves_a_finished_workdir_as_it_was(finished, field, value, monkeypatch):
  monkeypatch.setattr(memory, 'limit_bytes', lambda: 8 * 2**30)  # the same on every machine
  features, wd = finished
  before = snapshot(wd)
  assert {'config.json', 'fingerprint.json', 'metrics.json', 'adapter.npz'} <= set(before)
  with pytest.raises(UserError, match=rf'^config\.{field}: '):
    main.run(tiny_config(features, **{field: value}), str(wd))
  assert snapshot(wd) == before


def cli(*args):
  r = subprocess.run([sys.executable, '-m', 'visim_jax.main', *args], cwd=ROOT, capture_output=True, text=True,
                     timeout=300, env={**os.environ, 'JAX_PLATFORMS': 'cpu'})
  lines = [l for l in r.stderr.splitlines() if l.strip()]
  assert r.returncode == 1 and len(lines) == 1 and lines[0].startswith('error: '), r.stderr[-2000:]
  return lines[0][len('error: '):]


def test_command_line_refusals_are_one_line(finished, tmp_path):
  features, wd = finished
  before = snapshot(wd)
  feat = ['--config=configs/tll.py:local', f'--config.features={features}', f'--workdir={wd}']
  assert cli(*feat, '--config.seed=99999999999999999999').startswith('config.seed: must be an integer in')
  assert cli(*feat, '--config.sigmas=abc').startswith('config.sigmas: must be one or more')
  assert snapshot(wd) == before
  # the batch size that hung the 2AFC training at 0/100 is refused before anything runs
  assert cli('--config=configs/twoafc.py:local', '--config.model.batch_size=0',
             f'--workdir={tmp_path / "t"}').startswith('config.model.batch_size: must be an integer in [1,')
  assert not (tmp_path / 't').exists()


def test_a_collapsed_run_into_a_new_workdir_leaves_no_trace(finished, tmp_path):
  features, _ = finished
  with pytest.raises(UserError, match=r'^config\.lr: training collapsed'):
    main.run(tiny_config(features, lr=1e30, checkpoint=True), str(tmp_path / 'new'))
  assert not (tmp_path / 'new').exists()
