"""What a normal run shows on the console (issue 45): `--help` is a success (exit 0) in every command, and no library's
log line reaches the console (Orbax's "Waiting for previous save to complete" on a loaded machine, absl / JAX
warnings), while visim_jax's own warnings and every error still do (core/errors.quiet_logs)."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_help_exits_0_and_other_flag_errors_stay_1():
  from absl import app, flags
  from visim_jax.core import errors
  app.define_help_flags()
  for argv in (['prog', '--help'], ['prog', '-?'], ['prog', '--helpfull']):
    with pytest.raises(SystemExit) as e:
      errors.flags_parser(argv)
    assert e.value.code == 0, argv
  with pytest.raises(SystemExit) as e:
    errors.flags_parser(['prog', '--no_such_flag_anywhere=1'])
  assert e.value.code == 1
  flags.FLAGS.unparse_flags()


def test_every_command_parses_flags_through_errors():
  """Each program with an absl main (the package's commands and benchmarks/*.py) runs through errors.run or passes
  errors.flags_parser to app.run, so `--help` exits 0 and a bad flag is one line."""
  bare = []
  for top in ('visim_jax', 'benchmarks'):
    for folder, _, files in os.walk(os.path.join(ROOT, top)):
      for name in files:
        if name.endswith('.py'):
          text = open(os.path.join(folder, name), encoding='utf-8').read()
          if re.search(r'app\.run\((?![^)]*flags_parser=errors\.flags_parser)', text):
            bare.append(os.path.relpath(os.path.join(folder, name), ROOT))
  assert bare == ['visim_jax/core/errors.py'], bare


SCRIPT = r'''
import os, sys, tempfile
import numpy as np
from visim_jax.core import errors

def main(argv):
  import orbax.checkpoint as ocp
  from orbax.checkpoint import checkpoint_manager as cm
  cm._WAIT_FOR_PREV_SAVE_WARNING_THRESHOLD_SECS = -1.0   # as on a loaded machine: every wait is "long"
  d = tempfile.mkdtemp()
  with ocp.CheckpointManager(d, options=ocp.CheckpointManagerOptions(enable_async_checkpointing=True)) as m:
    for step in range(3):
      m.save(step, args=ocp.args.StandardSave({'w': np.ones(4) * step}))
    m.wait_until_finished()
  import warnings
  warnings.warn('a library deprecation', FutureWarning)   # from __main__: not visim_jax
  from absl import logging
  import jax
  here = os.path.join(os.path.dirname(errors.__file__), 'fake_module.py')   # a warning of visim_jax's own
  exec(compile("logging.warning('visim_jax own warning: kept')", here, 'exec'), {'logging': logging})
  print('done', flush=True)

errors.run(main)
'''


def test_no_third_party_log_line_reaches_the_console(tmp_path):
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS='cpu')
  env.pop('VISIM_TRACEBACK', None)
  r = subprocess.run([sys.executable, '-c', SCRIPT], capture_output=True, text=True, env=env, timeout=300,
                     cwd=tmp_path)
  assert r.returncode == 0, r.stderr[-2000:]
  assert 'done' in r.stdout
  assert 'visim_jax own warning: kept' in r.stderr, r.stderr
  assert 'Waiting for previous save' not in r.stderr and 'FutureWarning' not in r.stderr, r.stderr
  others = [l for l in r.stderr.splitlines() if l.strip() and 'visim_jax own warning' not in l]
  assert not others, others
  # with --verbosity the libraries speak again (the developer's view)
  r = subprocess.run([sys.executable, '-c', SCRIPT, '--verbosity=0'], capture_output=True, text=True, env=env,
                     timeout=300, cwd=tmp_path)
  assert r.returncode == 0 and 'Waiting for previous save' in r.stderr, r.stderr[-2000:]
