"""`python -m visim_jax.main` user errors: exit status 1 and ONE stderr line `error: <file or config.field>: ...`
(no traceback unless --verbosity=1), nothing half-written; a second run into a busy workdir is refused."""
import errno
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from visim_jax.core import memory

from visim_jax.core import errors
from visim_jax.training import runtime
from visim_jax.experiments import config_fields

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = ['--config.runs=2', '--config.epochs=4', '--config.pca_dim=4', '--config.adapt_dim=8', '--config.ks=(1,2)',
         '--config.checkpoint_every=2', '--config.plots=False']


def feats(path, n=40, d=6, **override):
  rng = np.random.RandomState(0)
  left = rng.randn(n, d).astype(np.float32)
  arrays = dict(left=left, right=left + 0.3 * rng.randn(n, d).astype(np.float32))
  arrays.update(override)
  np.savez(path, **arrays)
  return str(path)


def cli(*args, code=None):
  """Runs the CLI (or `code` before it, e.g. to set a fault hook); returns (returncode, stdout, stderr)."""
  argv = ['visim', *args]
  prog = (code or '') + f'\nimport sys\nsys.argv = {argv!r}\nfrom visim_jax import main\nmain.run_main()\n'
  r = subprocess.run([sys.executable, '-c', prog], cwd=ROOT, capture_output=True, text=True,
                     env={**os.environ, 'JAX_PLATFORMS': 'cpu'})
  return r.returncode, r.stdout, r.stderr


def one_error_line(stderr):
  """The one `error:` line (progress bars may precede it; no traceback, nothing after it)."""
  lines = [l for l in stderr.splitlines() if l.strip()]
  errs = [l for l in lines if l.startswith('error: ')]
  assert len(errs) == 1 and lines[-1] == errs[0] and 'Traceback' not in stderr, stderr[-3000:]
  return errs[0][len('error: '):]


def test_unknown_field_names_it_and_the_known_ones(tmp_path):
  rc, _, err = cli('--config=configs/demo.py', f'--workdir={tmp_path / "w"}', '--config.demo.rot=3')
  assert rc == 1 and one_error_line(err) == 'config.demo.rot: unknown field; known: n_pairs, root, seed'
  rc, _, err = cli('--config=configs/demo.py', f'--workdir={tmp_path / "w"}', '--config.runs=abc')
  assert rc == 1 and one_error_line(err).startswith('config.runs: cannot use the value')
  assert not (tmp_path / 'w').exists()


@pytest.mark.parametrize('case', ['missing', 'nan', 'string', 'broken_link', 'workdir_is_file', 'cache_dir'])
def test_user_errors_are_one_line_naming_the_file(tmp_path, case):
  wd, f = tmp_path / 'w', tmp_path / 'f.npz'
  args = ['--config=configs/tll.py', f'--workdir={wd}', *SMALL]
  if case == 'missing':
    want = f'config.features: {tmp_path / "none.npz"} not found'
    args.append(f'--config.features={tmp_path / "none.npz"}')
  elif case == 'nan':
    left = np.ones((40, 6), np.float32) + np.arange(40)[:, None]
    left[5, 2] = np.nan
    args.append(f'--config.features={feats(f, left=left)}')
    want = f'{f}: left features have NaN/Inf in 1 row(s)'
  elif case == 'string':
    args.append(f'--config.features={feats(f, right=np.array(["a"] * 40))}')
    want = f"config.features: {f}: array 'right' holds <U1 values"
  elif case == 'broken_link':
    os.symlink(tmp_path / 'gone.npz', f)
    args.append(f'--config.features={f}')
    want = f'config.features: {f} is a broken symbolic link'
  elif case == 'workdir_is_file':
    wd.write_text('x')
    args.append(f'--config.features={feats(f)}')
    want = f'{wd}: workdir is a file, not a folder'
  else:  # a cache folder that cannot be created (a file is in the way), found before any image is read
    (tmp_path / 'file').write_text('x')
    args += ['--config.dataset=demo', f'--config.demo.root={tmp_path / "file" / "demo"}',
             f'--config.cache_dir={tmp_path / "file" / "cache"}']
    want = str(tmp_path / 'file')
  rc, _, err = cli(*args)
  msg = one_error_line(err)
  assert rc == 1 and want in msg, msg
  assert case == 'workdir_is_file' or not wd.exists()


def test_disk_full_during_save_then_rerun(tmp_path):
  wd, args = tmp_path / 'w', ['--config=configs/tll.py', f'--workdir={tmp_path / "w"}', *SMALL,
                              f'--config.features={feats(tmp_path / "f.npz")}']
  hook = ('import errno\nfrom visim_jax.training import runtime\ndef hook(phase, step, d):\n'
          '  if phase == "during_save" and step == 4:\n    raise OSError(errno.ENOSPC, "No space left on device")\n'
          'runtime.FAULT_HOOK = hook\n')
  rc, _, err = cli(*args, code=hook)
  msg = one_error_line(err)
  assert rc == 1 and msg.startswith(f'{wd / "checkpoints"}: saving checkpoint step 4 failed; the disk is full')
  leftovers = [n for _, dirs, files in os.walk(wd) for n in dirs + files if 'tmp' in n]
  assert not leftovers and not (wd / 'metrics.json').exists()
  rc, out, err = cli(*args)
  assert rc == 0, err[-2000:]
  assert 'resuming from step 2' in out and json.load(open(wd / 'metrics.json'))['fingerprint']


def test_busy_workdir_is_refused_naming_the_holder(tmp_path):
  args = ['--config=configs/tll.py', f'--workdir={tmp_path}', *SMALL, f'--config.features={feats(tmp_path / "f.npz")}']
  fp = runtime.fingerprint({}, [])
  with runtime.Run(str(tmp_path), {}, fp, checkpoint=False, progress=False):
    rc, _, err = cli(*args)
  assert rc == 1 and one_error_line(err).startswith(f'{tmp_path}: another run is using this workdir (pid {os.getpid()}')
  assert not (tmp_path / 'config.json').exists()  # the refused run wrote nothing (nor did the holder, yet)


def test_busy_workdir_is_refused_before_any_feature_extraction(tmp_path):
  """The lock is taken for the whole command: the demo run stops before extracting (its cache stays empty)."""
  wd, cache = tmp_path / 'w', tmp_path / 'cache'
  with runtime.workdir_lock(str(wd)):
    rc, _, err = cli('--config=configs/demo.py', f'--workdir={wd}', f'--config.cache_dir={cache}', *SMALL)
  assert rc == 1 and one_error_line(err).startswith(f'{wd}: another run is using this workdir')
  assert not cache.exists() or not any(cache.rglob('*.npz'))
  assert sorted(os.listdir(wd)) == ['.lock']  # nothing else written


def test_traceback_only_when_asked(tmp_path):
  rc, _, err = cli('--config=configs/tll.py', f'--workdir={tmp_path / "w"}', '--verbosity=1')
  assert rc == 1 and 'Traceback' in err and err.strip().splitlines()[-1].startswith('error: config.data_dir')


def test_is_user_error():
  assert errors.is_user_error(errors.UserError('x')) and errors.is_user_error(FileNotFoundError('x'))
  assert errors.is_user_error(OSError(errno.ENOSPC, 'full')) and errors.is_user_error(ValueError('config.x: bad'))
  assert not errors.is_user_error(ValueError('shapes (3,) and (4,) not aligned'))
  assert not errors.is_user_error(TypeError('x'))
  e = OSError(errno.ENOSPC, 'No space left on device', '/data/x.npz')
  assert errors.one_line(e) == '/data/x.npz: No space left on device; the disk is full: free some space and rerun'


# ------------------------------------------------------------------ issue 22: silent wrong results, wrong names

def test_table1_reuses_a_backbone_only_under_the_same_data(tmp_path, monkeypatch):
  """A finished backbone's metrics.json is read back only when its fingerprint (data included) matches: a
  subset cut at the same path changes the features, so the backbone runs again (refused if checkpoints differ)."""
  from ml_collections import config_dict
  from visim_jax.backbones import features as features_lib
  from visim_jax.training import adaptation_runs
  from visim_jax.experiments import adapt, table1
  sys.path.insert(0, os.path.join(ROOT, 'configs'))
  import importlib
  c = table1.adapt_config(importlib.import_module('table1').get_config('demo'), 'resnet18:tiny')
  rng = np.random.RandomState(0)
  full = adaptation_runs.Features(rng.randn(96, 8).astype(np.float32), rng.randn(96, 8).astype(np.float32))
  cut = adaptation_runs.Features(full.left[:80], full.right[:80])
  fp = adapt.fingerprint(adapt.hparams_from_config(c), full).digest
  sub = tmp_path / 'resnet18_tiny'
  sub.mkdir()
  m = {'config': json.loads(json.dumps(config_fields.recorded_config(c, uses_backbone=True))), 'fingerprint': fp}
  (sub / 'metrics.json').write_text(json.dumps(m))
  for data, want in ((full, m), (cut, None)):
    monkeypatch.setattr(adapt, 'load_features', lambda *a, d=data, **k: (d, None, None, {}))
    assert table1.finished(str(sub), config_dict.ConfigDict(c)) == want


def test_collapse_signs_name_the_likely_field():
  from visim_jax.training import collapse
  n_fit, ok_loss = 81, np.full((2, 1, 5), 3.0, np.float32)
  ranks = np.tile(np.arange(30), (2, 1, 5, 1))
  assert collapse.sign(ok_loss, ranks, n_fit, 1.0, 0) is None
  stuck = ok_loss.copy()
  stuck[1, 0, -1] = np.log(n_fit)
  assert 'stuck at ln(81)' in collapse.sign(stuck, ranks, n_fit, 1.0, 0)
  tied = ranks.copy()
  tied[0, 0, -1] = 30
  assert 'every test score is tied' in collapse.sign(ok_loss, tied, n_fit, 1.0, 0)
  assert 'overflow' in collapse.sign(ok_loss, ranks, n_fit, 1e30, 0)
  assert 'overflow' in collapse.sign(ok_loss, ranks, n_fit, float('inf'), 0)
  bad = ok_loss.copy()
  bad[0, 0, 2] = np.nan
  assert 'epoch 13' in collapse.sign(bad, ranks, n_fit, 1.0, 10)
  assert collapse.likely_field((15.0,), 1e30).startswith('config.lr:')
  assert collapse.likely_field((1.0, 1e30), 1e-3).startswith('config.sigmas:')
  with pytest.raises(errors.UserError, match=r'^config\.lr: training collapsed: the weights overflow'):
    collapse.check(ok_loss, ranks, n_fit, {'w': np.full((2, 2), 1e30, np.float32)}, 0, (15.0,), 1e30)


def test_size_messages_name_the_field_that_is_wrong(monkeypatch):
  from visim_jax.training import adaptation_runs
  from visim_jax.experiments import adapt
  monkeypatch.setattr(memory, 'limit_bytes', lambda: 8 * 2**30)  # the same on every machine
  with pytest.raises(errors.UserError, match=r'^config\.train_fraction: 0\.99 leaves a test split of 2 pairs'):
    adapt.check_sizes(adaptation_runs.Hparams(train_fraction=0.99, pca_dim=8), 120, 64, [1, 5, 20])
  with pytest.raises(errors.UserError, match=r'^config\.ks: the largest k = 100 exceeds'):
    adapt.check_sizes(adaptation_runs.Hparams(pca_dim=8), 120, 64, [1, 100])
  with pytest.raises(errors.UserError, match=r'^config\.adapt_dim: this run needs at least [\d,.]+ GiB'):
    adapt.check_sizes(adaptation_runs.Hparams(pca_dim=8, adapt_dim=10**7, runs=2), 120, 64, [1, 5])
  with pytest.raises(errors.UserError, match=r'^config\.ensemble\.grid: must be an integer in \[2,'):
    from ml_collections import config_dict
    from visim_jax.experiments import twoafc
    sys.path.insert(0, os.path.join(ROOT, 'configs'))
    import importlib
    c = importlib.import_module('twoafc').get_config('local')
    c.ensemble.grid = 0
    twoafc.validate_config(c)


@pytest.mark.parametrize('case', ['half_flip', 'scale_1e30', 'scale_1e-30'])
def test_features_file_refusals_name_the_file(tmp_path, case):
  from visim_jax import main as main_lib
  sys.path.insert(0, os.path.join(ROOT, 'configs'))
  import importlib
  rng = np.random.RandomState(0)
  left = rng.randn(40, 6).astype(np.float32)
  f = str(tmp_path / 'f.npz')
  scale = {'half_flip': 1.0, 'scale_1e30': 1e30, 'scale_1e-30': 1e-30}[case]
  extra = {'left_flip': left} if case == 'half_flip' else {}
  np.savez(f, left=left * scale, right=(left + 0.3 * rng.randn(40, 6)).astype(np.float32) * scale, **extra)
  c = importlib.import_module('tll').get_config('local')
  c.features, c.pca_dim, c.adapt_dim, c.ks = f, 4, 8, (1, 2)
  want = (f'config.features: {f} has left_flip but no right_flip' if case == 'half_flip' else
          f'{f}: the left features reach at most')
  with pytest.raises(errors.UserError, match='^' + want.replace('.', r'\.')):
    main_lib.run(c, str(tmp_path / 'w'))
  assert not (tmp_path / 'w').exists()


def test_adapter_of_random_bytes_and_out_folder_are_named(tmp_path):
  from visim_jax.training import adapter_file
  bad = tmp_path / 'random.npz'
  bad.write_bytes(np.random.RandomState(0).bytes(4000))
  with pytest.raises(errors.UserError, match=f'^{bad}: unreadable adapter file'):
    adapter_file.load_adapter(str(bad))
  folder = tmp_path / 'existing'
  folder.mkdir()
  arrays = dict(pca_mean=np.zeros(4), pca_components=np.eye(4, 2), pca_scale=np.ones(2), w=np.ones((2, 3)))
  with pytest.raises(IsADirectoryError) as e:
    adapter_file.save_adapter(str(folder), **arrays, meta=dict.fromkeys(adapter_file.META_KEYS))
  assert errors.one_line(e.value).startswith(f'{folder}: Is a directory')
  assert os.listdir(folder) == []  # no temporary file left


def test_decompression_bomb_is_skipped_with_its_reason(tmp_path, monkeypatch):
  from PIL import Image
  from visim_jax.data import images
  from visim_jax.search import folder
  p = str(tmp_path / 'big.png')
  Image.new('L', (100, 100)).save(p)
  monkeypatch.setattr(Image, 'MAX_IMAGE_PIXELS', 1000)  # 100 x 100 is then > 2x the limit, as 20000^2 is
  [(path, reason)] = images.check_images([p])
  assert path == p and 'decompression bomb' in reason
  assert folder._reason({'path': p, 'reason': reason}).startswith('too large to decode safely, a decompression bomb')
