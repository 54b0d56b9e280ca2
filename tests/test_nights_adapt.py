"""Learning from NIGHTS judgements: DreamSim's hinge loss against its definition, chunked = one call, the
experiment end to end on the mini NIGHTS set (tiny random AlexNet), resume after a kill, adapter.npz."""
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from test_runtime import kill_after
from visim_jax.training import adapter_file
from visim_jax.losses import hinge
from visim_jax.training import human_heads, runtime
from visim_jax.experiments import nights_adapt
from visim_jax.experiments import config_fields

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, 'configs'))
import nights_adapt as nights_config  # noqa: E402


def loop_hinge(d0, d1, target, margin):   # util/train_utils.py HingeLoss, then / batch size (train.py)
  total = 0.0
  for a, b, t in zip(d0, d1, target):
    y = -1.0 * (1.0 - 2.0 * float(np.round(t)))   # torch.round: half to even, as np.round
    total += max(0.0, margin + (-1.0 * ((a - b) * y)))
  return total / len(d0)


def test_hinge_loss_is_dreamsims():
  rng = np.random.RandomState(0)
  d0, d1 = rng.rand(2, 64).astype(np.float32)
  t = rng.choice([0.0, 0.5, 1.0, 0.4, 0.6], 64).astype(np.float32)
  assert float(hinge.hinge_loss(d0, d1, t, 0.05)) == pytest.approx(loop_hinge(d0, d1, t, 0.05), abs=1e-6)
  m = np.arange(64) < 40
  assert float(hinge.hinge_loss(d0, d1, t, 0.05, jnp.asarray(m))) == pytest.approx(
      loop_hinge(d0[:40], d1[:40], t[:40], 0.05), abs=1e-6)


def synthetic(n_images=120, d=12, seed=0):
  """Judgements from a hidden metric on the first 3 dims: a head has something to learn."""
  rng = np.random.RandomState(seed)
  x = rng.randn(n_images, d).astype(np.float32)

  def split(t):
    r = rng.randint(0, n_images, (t, 3))
    dist = lambda a, b: ((x[a, :3] - x[b, :3]) ** 2).sum(1)
    j = (dist(r[:, 0], r[:, 2]) < dist(r[:, 0], r[:, 1])).astype(np.float32)
    return human_heads.Split(*(jnp.asarray(r[:, k], jnp.int32) for k in range(3)), jnp.asarray(j))
  return jnp.asarray(x), split(300), split(80), split(80)


def test_chunks_keep_the_best_val_epoch_and_learn():
  x, tr, va, te = synthetic()
  # paper 004's embedding head here; paper 001's adapter head in the experiment test below
  hp = human_heads.Hparams(model='triplet', embed_dim=8, batch_size=32, epochs=4, seeds=2, lr=1e-2)
  s = human_heads.init_state(hp, x.shape[1])
  s, l1 = human_heads.train_chunk(hp, x, tr, va, te, s, 0, 2)
  s, l2 = human_heads.train_chunk(hp, x, tr, va, te, s, 2, 2)   # (resuming = equal chunks: test_experiment_...)
  # the kept parameters are those of the best val epoch (earliest on ties), and they score what was logged
  v = np.concatenate([l1.val_score, l2.val_score], 1)
  best = np.asarray(s.best_epoch)
  assert (best == np.argmax(v, 1) + 1).all()
  for k in range(hp.seeds):
    p = jax.tree.map(lambda a: a[k], s.best)
    d0, d1 = human_heads.distances(hp, p, x, va)
    assert float(jnp.mean((d0 < d1) * (1 - va.judge) + (d1 < d0) * va.judge + 0.5 * (d0 == d1))) == \
        pytest.approx(v[k, best[k] - 1], abs=1e-6)
  loss = np.concatenate([l1.train_loss, l2.train_loss], 1)
  assert (loss[:, -1] < loss[:, 0]).all()


def demo_config(tmp_path_factory, h, **kw):
  c = nights_config.get_config('demo')
  c.demo.root = os.path.dirname(h.root)   # the session's human_demo_sets (written once)
  c.cache_dir = str(tmp_path_factory.getbasetemp() / 'cache_adapt')
  c.backbone, c.backbone_kwargs.tiny = 'alexnet', True
  c.pca_dim, c.adapt_dim, c.embed_dim, c.epochs, c.seeds, c.checkpoint_every, c.n_boot = 8, 16, 8, 4, 2, 2, 50
  for k, v in kw.items():
    setattr(c, k, v)
  return c


def test_experiment_end_to_end_resume_and_adapter(tmp_path, tmp_path_factory, monkeypatch, human_demo_sets):
  full = nights_adapt.run(demo_config(tmp_path_factory, human_demo_sets), str(tmp_path / 'full'), progress=False)
  assert full['n_triplets'] == {'train': 24, 'val': 8, 'test': 16, 'test_imagenet': 8, 'test_no_imagenet': 8}
  assert set(full['results']) == {'frozen', 'pca', 'trained'}
  for r in full['results'].values():
    assert r['test']['n'] == 16 and r['test']['ci_low'] <= r['test']['score'] <= r['test']['ci_high']
  assert len(full['epochs_selected']) == 2 and all(1 <= e <= 4 for e in full['epochs_selected'])
  # adapter.npz: export's format; applied to the frozen features it gives the trained head's test score
  ad = adapter_file.load_adapter(str(tmp_path / 'full' / 'adapter.npz'))
  assert ad.meta['backbone'] == 'alexnet' and ad.meta['source']['seed'] == full['exported_seed']
  from visim_jax.backbones import features as features_lib
  from visim_jax.data import nights
  c = demo_config(tmp_path_factory, human_demo_sets)
  fo = config_fields.options(c)
  backbone, layers = features_lib.build(fo)
  t = nights.load(full['nights_dir'], 'test')
  f = features_lib.features_of(fo, backbone, layers, t.paths(), tag='check', progress=False)
  e = np.asarray(adapter_file.apply_adapter(ad, jnp.asarray(f)))
  e = e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-12)
  rows = t.rows({p: i for i, p in enumerate(t.paths())})
  d0, d1 = (1 - (e[rows[0]] * e[rows[k]]).sum(1) for k in (1, 2))
  score = np.mean((d0 < d1) * (1 - t.judge) + (d1 < d0) * t.judge + 0.5 * (d0 == d1))
  assert score == pytest.approx(full['results']['trained']['test']['score'], abs=1e-5)
  # killed after epoch 2's checkpoint, resumed: the same numbers
  monkeypatch.setattr(runtime, 'FAULT_HOOK', kill_after(2))
  with pytest.raises(KeyboardInterrupt):
    nights_adapt.run(demo_config(tmp_path_factory, human_demo_sets), str(tmp_path / 'killed'), progress=False)
  monkeypatch.setattr(runtime, 'FAULT_HOOK', None)
  assert not os.path.exists(tmp_path / 'killed' / 'metrics.json')
  resumed = nights_adapt.run(demo_config(tmp_path_factory, human_demo_sets), str(tmp_path / 'killed'), progress=False)
  assert resumed['results'] == full['results'] and resumed['epochs_selected'] == full['epochs_selected']
  with pytest.raises(ValueError, match=r'checkpoints of a different config .*margin'):
    nights_adapt.run(demo_config(tmp_path_factory, human_demo_sets, margin=0.1), str(tmp_path / 'killed'), progress=False)


def test_config_errors_name_the_field(tmp_path, tmp_path_factory, human_demo_sets):
  c = nights_config.get_config()
  with pytest.raises(ValueError, match='config.nights_dir'):
    nights_adapt.run(c, str(tmp_path / 'w'), progress=False)
  with pytest.raises(ValueError, match='config.model'):
    nights_adapt.run(demo_config(tmp_path_factory, human_demo_sets, model='mlp'), str(tmp_path / 'w'), progress=False)
  with pytest.raises(ValueError, match=r'config.pca_dim: 64 exceeds min\(train images 72, feature dim 16\)'):
    nights_adapt.run(demo_config(tmp_path_factory, human_demo_sets, pca_dim=64), str(tmp_path / 'w'), progress=False)
