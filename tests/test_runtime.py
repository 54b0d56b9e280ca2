"""visim_jax.training.runtime: faults at every checkpoint phase, a full disk, a corrupt newest step, the workdir lock, a
refused resume that writes nothing, and the workdir's OS errors. A tiny NumPy chunk function keeps it fast; the
checkpoints are real Orbax ones."""
import errno
import json
import os
import sys

import numpy as np
import pytest

from visim_jax.training import runtime
from visim_jax.core.errors import UserError

END, EVERY, SAVE = 10, 2, 2


def chunk_fn(tree, s0, n):
  """Deterministic steps: w <- 0.9 w + (step + 1); the loss history records sum(w) per step."""
  w, loss = np.array(tree['w']), np.array(tree['loss'])
  for s in range(s0, s0 + n):
    w = 0.9 * w + (s + 1)
    loss[s] = w.sum()
  return {'w': w, 'loss': loss}, {'train/loss': loss[s0:s0 + n]}


def train(workdir, lr=0.1, data=(1.0, 2.0)):
  fp = runtime.fingerprint({'lr': lr}, [np.asarray(data)])
  with runtime.Run(str(workdir), {'lr': lr}, fp, progress=False) as run:
    tree, start = run.restore({'w': np.zeros(3, np.float32), 'loss': np.zeros(END, np.float32)})
    tree = run.loop(tree, chunk_fn, start, END, EVERY, SAVE)
    return run.write_metrics({'loss': tree['loss'].tolist(), 'start': start})


@pytest.fixture(scope='module')
def reference(tmp_path_factory):
  return train(tmp_path_factory.mktemp('ref'))


def hook_at(phase, step, exc):
  """A runtime.FAULT_HOOK raising `exc` at `phase` of `step` (the other test files' runs import it)."""
  def hook(p, s, directory):
    if p == phase and s == step:
      raise exc
  return hook


def kill_after(step):
  """A runtime.FAULT_HOOK that kills the run (KeyboardInterrupt) right after the checkpoint of `step`."""
  return hook_at('after_save', step, KeyboardInterrupt(f'simulated kill after step {step}'))


def assert_clean(workdir):
  """No temporary file or folder anywhere in the workdir, no metrics.json."""
  for root, dirs, files in os.walk(workdir):
    for n in dirs + files:
      assert 'tmp' not in n, os.path.join(root, n)
  assert not os.path.exists(os.path.join(workdir, 'metrics.json'))


@pytest.mark.parametrize('phase', runtime.SAVE_PHASES)
def test_kill_at_every_save_phase_then_rerun_equals_no_kill(tmp_path, monkeypatch, reference, phase):
  monkeypatch.setattr(runtime, 'FAULT_HOOK', hook_at(phase, 6, KeyboardInterrupt('simulated kill')))
  with pytest.raises(KeyboardInterrupt):
    train(tmp_path)
  assert_clean(tmp_path)
  steps = sorted(int(s) for s in os.listdir(tmp_path / 'checkpoints') if s.isdigit())
  assert steps[-1] == (6 if phase == 'after_save' else 4)  # a save that did not finish leaves no step
  monkeypatch.setattr(runtime, 'FAULT_HOOK', None)
  again = train(tmp_path)
  assert again['loss'] == reference['loss'] and again['start'] == steps[-1]
  assert again['fingerprint'] == reference['fingerprint']


@pytest.mark.parametrize('full', [
    OSError(errno.ENOSPC, 'No space left on device'),
    # what Orbax's TensorStore writer raises on a real full disk (seen on a 64 KB tmpfs)
    ValueError('RESOURCE_EXHAUSTED: Error writing "loss/.zarray" in OCDBT database: Failed to write 174 bytes: '
               "No space left on device [os_error_code='28'] [tensorstore_spec='{}']")], ids=['oserror', 'tensorstore'])
def test_disk_full_during_save_is_one_line_and_leaves_nothing(tmp_path, monkeypatch, reference, full):
  monkeypatch.setattr(runtime, 'FAULT_HOOK', hook_at('during_save', 4, full))
  with pytest.raises(UserError) as e:
    train(tmp_path)
  msg = str(e.value)
  assert msg.startswith(str(tmp_path / 'checkpoints')) and 'disk is full' in msg and '\n' not in msg
  assert_clean(tmp_path)
  monkeypatch.setattr(runtime, 'FAULT_HOOK', None)
  assert train(tmp_path)['loss'] == reference['loss']


def test_corrupt_newest_checkpoint_resumes_from_the_previous_step(tmp_path, monkeypatch, reference, capsys):
  monkeypatch.setattr(runtime, 'FAULT_HOOK', hook_at('after_save', 8, KeyboardInterrupt()))
  with pytest.raises(KeyboardInterrupt):
    train(tmp_path)
  monkeypatch.setattr(runtime, 'FAULT_HOOK', None)
  for root, _, files in os.walk(tmp_path / 'checkpoints' / '8'):  # garble every file of the newest step
    for f in files:
      with open(os.path.join(root, f), 'r+b') as fh:
        n = len(fh.read())
        fh.seek(0)
        fh.write(b'\x00garbage' * max(1, n // 8))
  again = train(tmp_path)
  assert again['start'] == 6 and again['loss'] == reference['loss']
  assert 'checkpoint step 8 is unreadable' in capsys.readouterr().out


def test_changed_config_or_data_is_refused_before_anything_is_written(tmp_path, monkeypatch):
  monkeypatch.setattr(runtime, 'FAULT_HOOK', hook_at('after_save', 4, KeyboardInterrupt()))
  with pytest.raises(KeyboardInterrupt):
    train(tmp_path)
  monkeypatch.setattr(runtime, 'FAULT_HOOK', None)
  before = {n: open(tmp_path / n).read() for n in ('config.json', 'fingerprint.json')}
  with pytest.raises(UserError, match=r'holds checkpoints of a different config or data \(config.lr \(0.1 -> 0.2\)\)'):
    train(tmp_path, lr=0.2)
  with pytest.raises(UserError, match=r'the data differ'):
    train(tmp_path, data=(1.0, 3.0))
  fp = runtime.fingerprint({'lr': 0.2}, [np.asarray((1.0, 2.0))])
  with pytest.raises(UserError, match='different config'):  # even a run that would not checkpoint
    with runtime.Run(str(tmp_path), {'lr': 0.2}, fp, checkpoint=False, progress=False):
      pass
  assert {n: open(tmp_path / n).read() for n in before} == before
  assert sorted(os.listdir(tmp_path / 'checkpoints')) == ['2', '4']


def test_workdir_lock_refuses_a_second_run_and_takes_over_a_stale_lock(tmp_path, reference):
  fp = runtime.fingerprint({'lr': 0.1}, [np.asarray((1.0, 2.0))])
  with runtime.Run(str(tmp_path), {'lr': 0.1}, fp, progress=False):
    with pytest.raises(UserError, match=rf'{tmp_path}: another run is using this workdir \(pid {os.getpid()} on '):
      train(tmp_path)
  # a lock file left by a dead process holds no flock: the next run takes it over
  (tmp_path / '.lock').write_text('pid 999999 on host elsewhere\n')
  m = train(tmp_path)
  assert m['loss'] == reference['loss']
  assert json.load(open(tmp_path / 'metrics.json'))['fingerprint'] == json.load(
      open(tmp_path / 'fingerprint.json'))['fingerprint']


def test_workdir_os_errors_are_one_line_naming_the_path(tmp_path):
  (tmp_path / 'file').write_text('x')
  with pytest.raises(UserError, match=rf'^{tmp_path / "file"}: workdir is a file, not a folder'):
    train(tmp_path / 'file')
  os.symlink(tmp_path / 'nowhere', tmp_path / 'link')
  with pytest.raises(UserError, match=rf'^{tmp_path / "link"}: workdir is a broken symbolic link'):
    train(tmp_path / 'link')
  with pytest.raises(UserError, match=rf'^{tmp_path / "file"}.*cannot create the workdir'):
    train(tmp_path / 'file' / 'sub')
  if os.geteuid() != 0:  # root writes anywhere: a read-only folder cannot be simulated
    (tmp_path / 'ro').mkdir(mode=0o555)
    with pytest.raises(UserError, match=rf'^{tmp_path / "ro"}.*not writable'):
      train(tmp_path / 'ro')


def test_one_bar_over_training_and_the_phases_after_it(tmp_path, capsys):
  """The run's one bar reaches 100% only when the last phase after training ends (twoafc: scoring, ensembles,
  bootstrap, plots), showing each phase's name; a resumed run starts the same bar at its step."""
  fp = runtime.fingerprint({'lr': 0.1}, [np.zeros(2)])
  with runtime.Run(str(tmp_path / 'w'), {'lr': 0.1}, fp, checkpoint=False) as run:
    bar = run.bar(END + 4, initial=0)
    run.loop({'w': np.zeros(3), 'loss': np.zeros(END)}, chunk_fn, 0, END, EVERY)
    assert run.bar(123) is bar and bar.n == END and bar.total == END + 4  # the loop moved the same bar
    with run.phase('ensembles', 2):
      assert 'ensembles' in str(bar)
    assert bar.n == END + 2 and not bar.disable
    with run.phase('plots', 2):
      pass
    assert bar.n == bar.total
  err = capsys.readouterr().err
  assert f'{END + 4}/{END + 4}' in err and 'plots' in err


def test_adapt_names_its_arrays_and_keeps_its_digest():
  """The adaptation run's fingerprint names its feature arrays (a refused rerun says which differ) with the same
  digest as the unnamed sequence it replaced (table1's cached results stay valid)."""
  from visim_jax.experiments import adapt
  from visim_jax.training import adaptation_runs
  rng = np.random.RandomState(0)
  feats = adaptation_runs.Features(rng.randn(4, 3).astype(np.float32), rng.randn(4, 3).astype(np.float32))
  hp = adaptation_runs.Hparams()
  fp = adapt.fingerprint(hp, feats)
  assert list(fp.data_parts) == ['left features', 'right features']
  assert fp.data_sha256 == runtime.fingerprint({}, list(feats)).data_sha256


def test_scalar_writer_leaves_torch_unimported(tmp_path):
  """TensorBoard scalars are written without importing torch (tensorboardX's writer tries to: ~5 s a run), and the
  event file holds them."""
  import subprocess
  code = ('import sys; from visim_jax.core import report; w = report.metric_writer(sys.argv[1]); '
          'w.write_scalars(3, {"loss": 0.5}); w.close(); print("torch" in sys.modules)')
  r = subprocess.run([sys.executable, '-c', code, str(tmp_path)], capture_output=True, text=True,
                     env={**os.environ, 'JAX_PLATFORMS': 'cpu'})
  assert r.returncode == 0 and r.stdout.split() == ['False'], r.stderr[-2000:]
  (event,) = os.listdir(tmp_path / 'tensorboard')
  assert b'loss' in open(tmp_path / 'tensorboard' / event, 'rb').read()
