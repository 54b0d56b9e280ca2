"""visim_jax/zoo/similarity.py: spec parsing, every model kind against a NumPy version of its distance, the boundary."""
import json
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from visim_jax.zoo import similarity as S

from visim_jax.zoo import interface

from visim_jax.zoo import scoring
from visim_jax.core.errors import UserError

OPTS = interface.Options(None, 8, 'float32', False)


@pytest.fixture(scope='module')
def photos(tmp_path_factory):
  from visim_jax.data import demo
  folder = tmp_path_factory.mktemp('photos')
  paths = []
  for i, (name, im) in enumerate(sorted(demo.source_images().items())[:5]):
    p = str(folder / f'{i}_{name}.png')
    im.convert('RGB').resize((48, 40)).save(p)
    paths.append(p)
  return paths


def _np_cos_dist(a, b):
  out = []
  for x, y in zip(a, b):
    out.append(1.0 - float(np.dot(x, y) / (np.linalg.norm(x) * np.linalg.norm(y))))
  return np.asarray(out)


@pytest.mark.parametrize('spec, needle', [
    ('dinov2_b14', 'expected <kind>:<target>'), ('nope:x', 'expected <kind>:<target>'), ('cosine:', 'nothing after'),
    ('lpips:squeeze', 'LPIPS nets'), ('lpips:alex@3', 'LPIPS nets'), ('lpips:alex:big', 'LPIPS nets')])
def test_bad_spec_is_one_line_naming_the_field(spec, needle):
  with pytest.raises(UserError) as e:
    interface.split_specs(spec)
  msg = str(e.value)
  assert msg.startswith(f'config.models: {spec!r}') and needle in msg and '\n' not in msg


def test_split_specs_refuses_duplicates_and_empty():
  assert interface.split_specs(' cosine:a , lpips:alex') == ['cosine:a', 'lpips:alex']
  with pytest.raises(UserError, match="listed twice"):
    interface.split_specs('lpips:alex,lpips:alex')
  with pytest.raises(UserError, match='config.models: empty'):
    interface.split_specs(' , ')


def test_unknown_backbone_layers_and_files_fail_at_build():
  with pytest.raises(UserError, match=r"config.models: 'cosine:nobackbone'.*--list_backbones"):
    S.build('cosine:nobackbone', OPTS)
  with pytest.raises(UserError, match=r"not among the resnet18 stages"):
    S.build('cosine:resnet18:tiny@layer9', OPTS)
  with pytest.raises(UserError, match=r"config.models: 'adapter:/no/such'.*no adapter.npz"):
    S.build('adapter:/no/such', OPTS)
  with pytest.raises(UserError, match=r"metrics.json: not found"):
    S.build('simnet:/no/such', OPTS)


@pytest.fixture(scope='module')
def tiny_cosine():
  return S.build('cosine:resnet18:tiny@stage3+stage4', OPTS)


def test_cosine_features_and_distances_match_numpy(tiny_cosine, photos):
  sim = tiny_cosine
  assert sim.kind == 'cosine' and sim.identity['layers'] == ['stage3', 'stage4']
  f = sim.featurize(photos, 'test')
  assert f.shape == (5, 32 + 64)
  i, j = np.array([0, 1, 2, 3, 4, 0, 2]), np.array([1, 2, 3, 4, 0, 0, 4])
  d = scoring.pair_distances(sim, f, i, f, j, batch_size=3)     # 3 batches, the last padded
  np.testing.assert_allclose(d, _np_cos_dist(f[i], f[j]), atol=1e-6)
  assert abs(d[5]) < 1e-6                                  # an image with itself
  m = scoring.distance_matrix(sim, f[:3], f, row_block=2)
  np.testing.assert_allclose(m, np.stack([_np_cos_dist(np.repeat(f[r:r + 1], 5, 0), f) for r in range(3)]),
                             atol=1e-6)


def test_adapter_applies_pca_and_w_then_cosine(tmp_path, tiny_cosine, photos):
  from visim_jax.training import adapter_file
  from visim_jax.backbones import registry
  b = registry.get_backbone('resnet18', tiny=True)
  layers = ('stage3', 'stage4')
  rng = np.random.RandomState(0)
  mean, comps, scale, w = rng.randn(96), rng.randn(96, 6), rng.rand(6) + 0.5, rng.randn(6, 10)
  adapter_file.save_adapter(str(tmp_path / 'adapter.npz'), mean, comps, scale, w, adapter_file.backbone_meta(b, layers))
  sim = S.build(f'adapter:{tmp_path}', OPTS)             # a workdir holding adapter.npz
  assert sim.kind == 'adapter' and len(sim.identity['adapter_sha256']) == 64
  f = sim.featurize(photos, 'test')
  raw = tiny_cosine.featurize(photos, 'test')
  want = np.maximum(((raw - mean) @ comps * scale) @ w, 0.0)
  np.testing.assert_allclose(f, want, rtol=1e-4, atol=1e-4)
  d = scoring.pair_distances(sim, f, [0, 1], f, [2, 3])
  np.testing.assert_allclose(d, _np_cos_dist(want[[0, 1]], want[[2, 3]]), atol=1e-5)
  # trained on other layers -> refused, naming the entry
  adapter_file.save_adapter(str(tmp_path / 'other.npz'), mean, comps, scale, w,
                      dict(adapter_file.backbone_meta(b, layers), weights_sha256='random:5:tiny'))
  with pytest.raises(UserError, match=r"config.models: 'adapter:.*other.npz'.*weights"):
    S.build(f'adapter:{tmp_path}/other.npz', OPTS)


def test_simnet_distance_is_minus_g_in_pair_order(tmp_path, photos):
  import orbax.checkpoint as ocp
  from visim_jax.models import simnet
  from visim_jax.backbones import registry
  b = registry.get_backbone('resnet18', tiny=True)
  params = simnet.init_params(jax.random.PRNGKey(0), 64, (16,))
  with ocp.CheckpointManager(str(tmp_path / 'checkpoints')) as mngr:
    mngr.save(3, args=ocp.args.StandardSave({'params': params}))
    mngr.wait_until_finished()
  (tmp_path / 'metrics.json').write_text(json.dumps({
      'experiment': 'simnet', 'mode': 'classes', 'backbone': 'resnet18', 'layers': ['stage4'],
      'weights_sha256': b.weights_id, 'config': {'pca_dim': 0, 'pooling': 'mean', 'normalize': True}}))
  sim = S.build(f'simnet:{tmp_path}', OPTS)
  assert not sim.symmetric
  f = sim.featurize(photos, 'test')
  np.testing.assert_allclose(np.linalg.norm(f, axis=1), 1.0, atol=1e-5)
  d01 = scoring.pair_distances(sim, f, [0], f, [1])
  d10 = scoring.pair_distances(sim, f, [1], f, [0])

  def g(x, y):   # the MLP on the concatenation, as a plain loop over layers
    h = np.concatenate([x, y])
    names = sorted(params)
    for k, n in enumerate(names):
      h = h @ np.asarray(params[n]['w']) + np.asarray(params[n]['b'])
      if k < len(names) - 1:
        h = np.maximum(h, 0)
    return float(h[0])
  np.testing.assert_allclose(d01, [-g(f[0], f[1])], rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(d10, [-g(f[1], f[0])], rtol=1e-4, atol=1e-5)


@pytest.fixture()
def fake_lpips(monkeypatch):
  """A stand-in with visim_jax/models/lpips.py's API: embed -> normalised maps, distance -> weighted mean sq. diff."""
  mod = types.ModuleType('visim_jax.models.lpips')

  def load_lpips(net, tiny=False):
    return {'w': jnp.asarray([1.0, 2.0, 0.5]) * (1.0 if net == 'alex' else 3.0)}

  def embed(params, x):
    del params
    assert x.dtype == jnp.uint8   # the real embed takes uint8 (/ 255) or [0, 1] floats
    x = x.astype(jnp.float32) / 255.0
    return (x, x[:, ::2, ::2] ** 2)

  def distance(params, f0, f1):
    return sum(jnp.mean(jnp.sum(params['w'] * (a - b) ** 2, -1), axis=(1, 2)) for a, b in zip(f0, f1))
  def pair_distance(params, u0, u1):   # identical images: exactly 0, as lpips.pair_distance
    same = jnp.all(u0 == u1, axis=(1, 2, 3))
    return jnp.where(same, 0.0, distance(params, embed(params, u0), embed(params, u1)))
  mod.load_lpips, mod.embed, mod.distance, mod.pair_distance = load_lpips, embed, distance, pair_distance
  monkeypatch.setitem(sys.modules, 'visim_jax.models.lpips', mod)
  import visim_jax.models
  monkeypatch.setattr(visim_jax.models, 'lpips', mod, raising=False)   # `from visim_jax.models import lpips` reads it
  return mod


def test_lpips_reads_images_at_the_protocol_resolution(fake_lpips, photos):
  from visim_jax.data.preprocess import Preprocess
  sim = S.build('lpips:alex', OPTS)
  assert sim.kind == 'lpips' and sim.preprocess is None
  with pytest.raises(ValueError):
    sim.featurize(photos, 'x')
  pre = Preprocess(size=16, mean=(0.0,) * 3, std=(255.0,) * 3)
  table = sim.featurize(photos, 'x', pre)
  assert isinstance(table, scoring.ImageTable) and len(table) == 5
  x = table.take([0, 3])
  assert x.shape == (2, 16, 16, 3) and x.dtype == np.uint8
  d = scoring.pair_distances(sim, table, [0, 1], table, [3, 1])
  u0, u1 = x[0] / 255.0, x[1] / 255.0
  w = np.asarray([1.0, 2.0, 0.5])
  want = (np.mean(np.sum(w * (u0 - u1) ** 2, -1))
          + np.mean(np.sum(w * (u0[::2, ::2] ** 2 - u1[::2, ::2] ** 2) ** 2, -1)))
  np.testing.assert_allclose(d, [want, 0.0], rtol=1e-5, atol=1e-7)
  m = scoring.distance_matrix(sim, table, table, row_block=2)
  assert m.shape == (5, 5) and np.allclose(np.diag(m), 0) and np.allclose(m[0, 3], want, rtol=1e-5)


def test_context_heads_one_model_and_the_mean(tmp_path, photos):
  """A CoSIS workdir's checkpoint (the experiment's tree: state of K stacked models + loss): @global is one head's
  1 - cos(xW, yW); @mean averages the 8 context heads' distances."""
  import orbax.checkpoint as ocp
  from visim_jax.models import context as cs
  from visim_jax.backbones import registry
  b = registry.get_backbone('resnet18', tiny=True)
  contexts = ['c%d' % i for i in range(8)]
  models = contexts + ['global']
  hp = cs.Hparams(embed_dim=8, hidden=4, steps=5)
  state = jax.device_get(cs.init_state(hp, 64, len(models)))
  w = np.asarray(state.params['embed']['w'])             # (9, 64, 8): each model initialised from its own key
  with ocp.CheckpointManager(str(tmp_path / 'checkpoints')) as mngr:
    mngr.save(5, args=ocp.args.StandardSave({'state': state, 'loss': np.zeros((9, 5), np.float32)}))
    mngr.wait_until_finished()
  (tmp_path / 'metrics.json').write_text(json.dumps({
      'experiment': 'twoafc', 'features': {'kind': 'images', 'backbone': 'resnet18', 'layers': ['stage4'],
                                           'weights_sha256': b.weights_id, 'dim': 64},
      'context_models': {'models': models, 'contexts': contexts, 'hparams': hp.__dict__}}))
  one, mean = S.build(f'context:{tmp_path}', OPTS), S.build(f'context:{tmp_path}@mean', OPTS)
  assert one.identity['model'] == 'global' and mean.identity['model'] == 'mean'
  f = one.featurize(photos, 'test')
  d_one = scoring.pair_distances(one, f, [0, 2], f, [1, 4])
  d_mean = scoring.pair_distances(mean, f, [0, 2], f, [1, 4])
  np.testing.assert_allclose(d_one, _np_cos_dist(f[[0, 2]] @ w[-1], f[[1, 4]] @ w[-1]), atol=1e-5)
  want = np.mean([_np_cos_dist(f[[0, 2]] @ w[k], f[[1, 4]] @ w[k]) for k in range(8)], axis=0)
  np.testing.assert_allclose(d_mean, want, atol=1e-5)
  with pytest.raises(UserError, match=r"no model 'forest'.*known: c0"):
    S.build(f'context:{tmp_path}@forest', OPTS)
