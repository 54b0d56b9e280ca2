"""The adaptation experiment: vmapped runs = runs one by one, resume = no kill, end to end, bad input."""
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import subprocs
from test_runtime import kill_after
from visim_jax.models import adaptation
from visim_jax.losses import symmetric_ce
from visim_jax.core import pca
from visim_jax.training import adaptation_runs
from visim_jax.experiments import adapt

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, 'configs'))
import demo as demo_config  # noqa: E402
import tll as tll_config  # noqa: E402


def synthetic(n=60, d=24, seed=0, flip=True):
  """Pairs whose partner is a noisy, partly re-mixed copy: adaptation has something to learn."""
  rng = np.random.RandomState(seed)
  z = rng.randn(n, d).astype(np.float32)
  mix = np.eye(d, dtype=np.float32) + 0.8 * rng.randn(d, d).astype(np.float32)
  left = z + 0.3 * rng.randn(n, d).astype(np.float32)
  right = z @ mix + 0.3 * rng.randn(n, d).astype(np.float32)
  out = dict(left=left, right=right, names=np.array([f'{i:04d}.jpg' for i in range(n)]))
  if flip:
    out.update(left_flip=left + 0.05 * rng.randn(n, d).astype(np.float32),
               right_flip=right + 0.05 * rng.randn(n, d).astype(np.float32))
  return out


def features_config(path, **kw):
  c = tll_config.get_config()
  c.dataset, c.features = 'features', str(path)
  c.runs, c.epochs, c.pca_dim, c.adapt_dim, c.ks, c.checkpoint_every = 3, 12, 8, 32, (1, 5), 4
  c.plots = False
  for k, v in kw.items():
    setattr(c, k, v)
  return c


HP = adaptation_runs.Hparams(runs=3, pca_dim=8, adapt_dim=32, epochs=7, sigmas=(15.0,), lr=1e-2, seed=3, select_epoch='test')


def test_vmapped_runs_equal_runs_one_by_one():
  d = synthetic()
  feats = adaptation_runs.Features(*(jnp.asarray(d[k]) for k in ('left', 'right', 'left_flip', 'right_flip')))
  hp = HP
  out = adapt.train_all(hp, feats, None, checkpoint_every=3, progress=False)
  n = d['left'].shape[0]
  for r in range(hp.runs):
    key = jax.random.fold_in(jax.random.PRNGKey(hp.seed), r)
    perm = np.asarray(jax.random.permutation(jax.random.fold_in(key, 0), n))
    tr, te = perm[:hp.n_train(n)], perm[hp.n_train(n):]
    p = pca.fit(np.concatenate([d['left'][tr], d['right'][tr]]), hp.pca_dim)
    t = lambda x: pca.transform(p, x)
    views = [(t(d['left'][tr]), t(d['right'][tr])), (t(d['left_flip'][tr]), t(d['right_flip'][tr]))]
    params = adaptation.init(jax.random.fold_in(key, 1), hp.pca_dim, hp.adapt_dim)
    opt = optax.adam(hp.lr)
    st = opt.init(params)
    for _ in range(hp.epochs):
      loss_fn = lambda w: sum(symmetric_ce.loss_fn(w, a, b, hp.sigmas[0]) for a, b in views) / 2
      g = jax.grad(loss_fn)(params)
      upd, st = opt.update(g, st, params)
      params = optax.apply_updates(params, upd)
    # float32 reductions are ordered differently vmapped (and PCA is fit with a mask there); Adam turns those
    # ~1e-7 gradient differences on near-zero components into sign-like steps: a few weights move ~5e-4 apart
    diff = np.abs(out['params']['w'][r, 0] - params['w'])
    assert diff.max() < 2e-3 and np.median(diff) < 2e-5, (diff.max(), np.median(diff))
    np.testing.assert_array_equal(out['test_idx'][r], te)
    ranks = np.asarray(adaptation_runs.best_ranks(adaptation.adapt(params, t(d['left'][te])),
                                        adaptation.adapt(params, t(d['right'][te]))))
    np.testing.assert_array_equal(out['ranks'][r, 0, -1], ranks)


def test_bfloat16_training_tracks_float32():
  d = synthetic()
  feats = adaptation_runs.Features(d['left'], d['right'])
  import dataclasses
  f32 = adapt.train_all(HP, feats, None, checkpoint_every=7, progress=False)
  bf16 = adapt.train_all(dataclasses.replace(HP, dtype='bfloat16'), feats, None, checkpoint_every=7,
                         progress=False)
  np.testing.assert_allclose(bf16['loss'], f32['loss'], rtol=3e-2)
  diff = np.abs(bf16['params']['w'] - f32['params']['w'])
  assert diff.mean() < 0.01 * np.abs(f32['params']['w']).mean()  # Adam's sign-like steps flip a few tiny grads


def test_resume_after_kill_equals_no_kill(tmp_path, monkeypatch, capsys):
  from visim_jax.training import runtime
  np.savez(tmp_path / 'f.npz', **synthetic())
  full = adapt.run(features_config(tmp_path / 'f.npz'), str(tmp_path / 'full'), progress=False)
  monkeypatch.setattr(runtime, 'FAULT_HOOK', kill_after(8))
  with pytest.raises(KeyboardInterrupt):
    adapt.run(features_config(tmp_path / 'f.npz'), str(tmp_path / 'killed'), progress=False)
  monkeypatch.setattr(runtime, 'FAULT_HOOK', None)
  assert not os.path.exists(tmp_path / 'killed' / 'metrics.json')
  assert sorted(os.listdir(tmp_path / 'killed' / 'checkpoints')) == ['4', '8']
  resumed = adapt.run(features_config(tmp_path / 'f.npz'), str(tmp_path / 'killed'), progress=False)
  assert resumed['results'] == full['results']
  assert resumed['epochs_selected'] == full['epochs_selected']
  assert resumed['fingerprint'] == full['fingerprint']
  # a different config refuses to resume from these checkpoints, naming the field, and writes nothing
  before = open(tmp_path / 'killed' / 'config.json').read()
  with pytest.raises(ValueError, match=r'checkpoints of a different config .*sigmas'):
    adapt.run(features_config(tmp_path / 'f.npz', sigmas=(1.0,)), str(tmp_path / 'killed'), progress=False)
  assert open(tmp_path / 'killed' / 'config.json').read() == before
  # the newest checkpoint garbled (sharded run state): the run resumes from the previous one, same numbers
  monkeypatch.setattr(runtime, 'FAULT_HOOK', kill_after(8))
  with pytest.raises(KeyboardInterrupt):
    adapt.run(features_config(tmp_path / 'f.npz'), str(tmp_path / 'corrupt'), progress=False)
  monkeypatch.setattr(runtime, 'FAULT_HOOK', None)
  for root, _, files in os.walk(tmp_path / 'corrupt' / 'checkpoints' / '8'):
    for f in files:
      with open(os.path.join(root, f), 'r+b') as fh:
        fh.write(b'\x00garbage' * 4)
  capsys.readouterr()
  again = adapt.run(features_config(tmp_path / 'f.npz'), str(tmp_path / 'corrupt'), progress=False)
  assert again['results'] == full['results'] and again['fingerprint'] == full['fingerprint']
  out = capsys.readouterr().out
  assert 'checkpoint step 8 is unreadable' in out and 'resuming from step 4' in out


def test_pca_fit_all_and_no_flip(tmp_path):
  np.savez(tmp_path / 'f.npz', **synthetic(flip=False))
  m = adapt.run(features_config(tmp_path / 'f.npz', flip=False, pca_fit='all', checkpoint=False, runs=2),
                str(tmp_path / 'w'), progress=False)
  assert m['pca']['fit'] == 'all' and not m['flip_augmentation']
  assert 'test included' in m['pca']['fit_description']


def test_features_file_without_flip_arrays_runs_without_the_flip_view(tmp_path, capsys):
  np.savez(tmp_path / 'noflip.npz', **synthetic(flip=False))
  c = tll_config.get_config()           # dataset='tll': config.features alone selects the features source
  c.features = str(tmp_path / 'noflip.npz')
  c.runs, c.epochs, c.pca_dim, c.adapt_dim, c.ks, c.checkpoint, c.plots = 2, 3, 8, 16, (1, 5), False, False
  m = adapt.run(c, str(tmp_path / 'w'), progress=False)
  assert m['dataset'] == 'features' and not m['flip_augmentation']
  assert 'left_flip' in m['flip_note'] and capsys.readouterr().out.count('left_flip') == 1
  on_disk = json.load(open(tmp_path / 'w' / 'metrics.json'))
  assert on_disk['flip_note'] == m['flip_note']
  # backbone options do not apply to precomputed features: they are not recorded as if used
  assert 'backbone' not in on_disk['config'] and 'backbone' not in json.load(open(tmp_path / 'w' / 'config.json'))
  assert 'data_dir' not in on_disk['config'] and 'demo' not in on_disk['config']


def test_demo_end_to_end_adapted_beats_raw(tmp_path, demo_root):
  c = demo_config.get_config()
  c.demo.root = os.path.dirname(demo_root)
  c.cache_dir = str(tmp_path / 'cache')
  c.flip, c.runs, c.epochs, c.checkpoint_every = False, 5, 60, 30
  wd = str(tmp_path / 'wd')
  m = adapt.run(c, wd, progress=False)
  for name in ('metrics.json', 'config.json', 'curves.npz', 'adapter.npz', 'plots/recall_at_k.png',
               'plots/training_curves.png', 'plots/retrieval_sheet.png'):
    assert os.path.exists(os.path.join(wd, name)), name
  assert os.listdir(os.path.join(wd, 'tensorboard'))
  on_disk = json.load(open(os.path.join(wd, 'metrics.json')))
  assert on_disk['results'] == m['results']  # the returned summary is what was written
  r = on_disk['results']['aR@1']
  assert len(r['raw']['runs']) == 5 and on_disk['n_test'] == 48
  assert r['sigma=15']['last']['mean'] > r['raw']['mean'] and r['sigma=15']['val']['mean'] > r['raw']['mean']
  assert r['sigma=15']['test']['mean'] >= r['sigma=15']['last']['mean']  # the optimistic rule


def test_bad_input_fails_before_writing(tmp_path):
  wd = tmp_path / 'wd'
  bad = synthetic()
  bad['right'][3, 2] = np.inf
  np.savez(tmp_path / 'inf.npz', **bad)
  with pytest.raises(ValueError, match='inf.npz: right features have NaN/Inf'):
    adapt.run(features_config(tmp_path / 'inf.npz'), str(wd), progress=False)
  np.savez(tmp_path / 'small.npz', **synthetic(n=20))
  with pytest.raises(ValueError, match='config.ks: the largest k = 20 exceeds the test split of 5 pairs'):
    adapt.run(features_config(tmp_path / 'small.npz', ks=(1, 20)), str(wd), progress=False)
  with pytest.raises(ValueError, match='config.data_dir'):
    c = tll_config.get_config()
    adapt.run(c, str(wd), progress=False)
  with pytest.raises(ValueError, match='config.sigmas'):
    adapt.run(features_config(tmp_path / 'small.npz', sigmas=(-1.0,)), str(wd), progress=False)
  assert not wd.exists()


def test_unknown_config_key_is_refused():
  r = subprocess.run([sys.executable, '-m', 'visim_jax.main', '--config=configs/demo.py', '--workdir=/nonexistent',
                      '--config.sigmaa=3'], cwd=ROOT, capture_output=True, text=True,
                     env={**os.environ, 'JAX_PLATFORMS': 'cpu'})
  assert r.returncode != 0 and 'sigmaa' in r.stderr
  assert not os.path.exists('/nonexistent')


def _worker(args, env_extra, cwd):
  """A subprocs.run_all job: tests/adapt_worker.py, no time limit (a loaded box is slow, not wrong)."""
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu', **env_extra}
  return dict(args=[sys.executable, os.path.join(ROOT, 'tests', 'adapt_worker.py'), *map(str, args)], cwd=cwd,
              env=env)


def _one_device_reference():
  d = synthetic()
  feats = adaptation_runs.Features(d['left'], d['right'], d['left_flip'], d['right_flip'])
  return adapt.train_all(HP, feats, None, checkpoint_every=3, progress=False, devices=jax.devices()[:1])


def _check_same(got, ref):
  np.testing.assert_allclose(got['loss'], ref['loss'], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(got['w'], ref['params']['w'], atol=1e-5)
  np.testing.assert_array_equal(got['raw'], ref['raw'])
  # ranks are integers from float comparisons: allow a rare near-tie flip
  assert (got['ranks'] != ref['ranks']).mean() < 1e-3


def test_eight_devices_equal_one(tmp_path):
  [(rc, log)] = subprocs.run_all([_worker([tmp_path / 'out.npz', tmp_path / 'ckpt'],
                                          {'XLA_FLAGS': '--xla_force_host_platform_device_count=8'}, tmp_path)])
  assert rc == 0, log[-3000:]
  got = np.load(tmp_path / 'out.npz')
  assert int(got['devices']) == 8
  _check_same(got, _one_device_reference())


def test_two_processes_equal_one(tmp_path):
  import shutil
  flags = {'XLA_FLAGS': '--xla_force_host_platform_device_count=2'}

  def jobs(port):  # a port taken between choosing and binding it is retried with another (subprocs)
    shutil.rmtree(tmp_path / 'ckpt', ignore_errors=True)
    return [_worker([tmp_path / 'out.npz', tmp_path / 'ckpt', i, 2, port], flags, tmp_path) for i in range(2)]
  for rc, log in subprocs.free_port_run(jobs):
    assert rc == 0, log[-3000:]
  got = np.load(tmp_path / 'out.npz')
  assert int(got['processes']) == 2 and int(got['devices']) == 4
  _check_same(got, _one_device_reference())


@pytest.mark.parametrize('family', ['clip_vit_b32', 'clip_rn50', 'dinov2_s14', 'vit_b16', 'resnet50',
                                    'regnet_y_040'])
def test_any_backbone_family_on_demo_pairs(tmp_path, tmp_path_factory, family):
  from visim_jax.data import demo
  root = tmp_path_factory.getbasetemp() / 'demo_small'
  c = demo_config.get_config()
  c.demo.root, c.demo.n_pairs = str(root), 24
  demo.demo_pairs(c.demo.root, c.demo.n_pairs, c.demo.seed)
  c.backbone, c.backbone_kwargs.tiny = family, True
  c.cache_dir = str(tmp_path_factory.getbasetemp() / 'cache_small')
  c.flip, c.runs, c.epochs, c.pca_dim, c.adapt_dim, c.ks, c.checkpoint, c.plots = (
      False, 2, 3, 16, 32, (1, 5), False, False)
  c.select_epoch = 'last'  # 18 training pairs: too few to hold validation pairs out
  m = adapt.run(c, str(tmp_path / 'wd'), progress=False)
  assert m['backbone'] == family and m['n_test'] == 6
  assert 0.0 <= m['results']['aR@1']['sigma=15']['last']['mean'] <= 1.0
