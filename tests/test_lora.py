"""models/lora.py: peft's initialisation, the merge W + scale a b against a NumPy loop, target selection, and the
dropout forward (peft's W x + b + scale B A dropout(x)) against NumPy with the same masks."""
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from visim_jax.core.errors import UserError
from visim_jax.models import lora


class Toy(nn.Module):
  @nn.compact
  def __call__(self, x):
    h = nn.Conv(6, (3, 3), strides=(2, 2), padding='SAME', name='conv')(x)
    h = h.reshape(h.shape[0], -1, 6)
    h = nn.Dense(12, name='qkv')(h)
    return nn.Dense(5, name='proj')(jax.nn.gelu(h, approximate=False)).mean(axis=1), {}


def _toy():
  x = jax.random.normal(jax.random.PRNGKey(1), (3, 8, 8, 4))
  variables = Toy().init(jax.random.PRNGKey(0), x)
  return variables, x, lambda v, x: Toy().apply(v, x)


def test_init_is_peft_default():
  variables, _, _ = _toy()
  cfg = lora.Config(r=4, alpha=8, targets=('qkv', 'conv'))
  tree = lora.init(jax.random.PRNGKey(3), variables['params'], cfg)
  assert sorted(tree) == ['conv', 'qkv']
  assert tree['qkv']['a'].shape == (6, 4) and tree['qkv']['b'].shape == (4, 12)
  assert tree['conv']['a'].shape == (3 * 3 * 4, 4) and tree['conv']['b'].shape == (4, 6)
  for path, fan_in in (('qkv', 6), ('conv', 36)):
    a = np.asarray(tree[path]['a'])
    assert np.abs(a).max() <= 1 / math.sqrt(fan_in) and np.abs(a).max() > 0.5 / math.sqrt(fan_in)
    assert not np.asarray(tree[path]['b']).any()
  assert cfg.scale == 2.0 and lora.Config(r=4, alpha=8, rslora=True).scale == 4.0
  assert lora.count(tree) == 6 * 4 + 4 * 12 + 36 * 4 + 4 * 6


def test_merge_equals_numpy_loop_and_keeps_the_rest():
  variables, _, _ = _toy()
  cfg = lora.Config(r=2, alpha=3, targets=('qkv', 'conv'))
  tree = lora.init(jax.random.PRNGKey(3), variables['params'], cfg)
  rng = np.random.default_rng(0)
  tree = jax.tree.map(lambda v: jnp.asarray(rng.normal(size=v.shape), jnp.float32), tree)
  merged = lora.merge(variables['params'], tree, cfg)
  for path in ('qkv', 'conv'):
    w = np.asarray(variables['params'][path]['kernel'], np.float64)
    a, b = np.asarray(tree[path]['a'], np.float64), np.asarray(tree[path]['b'], np.float64)
    flat = w.reshape(-1, w.shape[-1]).copy()
    for i in range(flat.shape[0]):
      for o in range(flat.shape[1]):
        flat[i, o] += 1.5 * sum(a[i, k] * b[k, o] for k in range(2))
    np.testing.assert_allclose(merged[path]['kernel'], flat.reshape(w.shape), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(merged[path]['bias'], variables['params'][path]['bias'])
  np.testing.assert_array_equal(merged['proj']['kernel'], variables['params']['proj']['kernel'])


def test_targets_select_by_suffix_or_regex_and_refuse_nothing():
  variables, _, _ = _toy()
  p = variables['params']
  assert lora.target_paths(p, lora.Config(targets=('qkv',))) == ['qkv']
  assert lora.target_paths(p, lora.Config(targets=('q.v|proj',))) == ['proj', 'qkv']
  with pytest.raises(UserError, match='select no kernel'):
    lora.target_paths(p, lora.Config(targets=('attn',)))
  with pytest.raises(UserError, match='name no kernel'):
    lora.merge(p, {'nope': {'a': jnp.zeros((6, 2)), 'b': jnp.zeros((2, 12))}}, lora.Config())


def test_forward_without_dropout_is_the_merged_model():
  variables, x, apply = _toy()
  cfg = lora.Config(r=2, alpha=4, targets=('qkv', 'conv'))
  tree = jax.tree.map(lambda v: v + 0.3, lora.init(jax.random.PRNGKey(3), variables['params'], cfg))
  want = apply(lora.merge_variables(variables, tree, cfg), x)[0]
  np.testing.assert_allclose(lora.forward(apply, variables, tree, cfg, x)[0], want, rtol=1e-6)
  cfg_d = lora.Config(r=2, alpha=4, dropout=0.5, targets=('qkv', 'conv'))
  np.testing.assert_allclose(lora.forward(apply, variables, tree, cfg_d, x, key=None)[0], want, rtol=1e-6)


def test_dropout_forward_is_pefts_formula():
  """y = W x + b + scale * (dropout(x) a) b with the masks dropout_mask draws, on a Dense and a Conv target,
  computed here by hand (NumPy for the Dense, lax.conv for the Conv's LoRA branch)."""
  variables, x, apply = _toy()
  rate = 0.4
  cfg = lora.Config(r=2, alpha=4, dropout=rate, targets=('qkv', 'conv'))
  tree = jax.tree.map(lambda v: v + 0.3, lora.init(jax.random.PRNGKey(3), variables['params'], cfg))
  key = jax.random.PRNGKey(7)
  got = jax.jit(lambda v, t, x, k: lora.forward(apply, v, t, cfg, x, k)[0])(variables, tree, x, key)

  p = variables['params']
  keep0 = np.asarray(lora.dropout_mask(key, 0, 0, x.shape, rate))          # 'conv' is target 0 (sorted)
  xd = np.where(keep0, np.asarray(x) / (1 - rate), 0.0)
  conv = lambda inp, k: jax.lax.conv_general_dilated(inp, k, (2, 2), 'SAME',
                                                     dimension_numbers=('NHWC', 'HWIO', 'NHWC'))
  d = (cfg.scale * np.asarray(tree['conv']['a']) @ np.asarray(tree['conv']['b'])).reshape(3, 3, 4, 6)
  h = np.asarray(conv(x, p['conv']['kernel'])) + np.asarray(p['conv']['bias']) + np.asarray(conv(jnp.asarray(xd), d))
  h = h.reshape(3, -1, 6)
  keep1 = np.asarray(lora.dropout_mask(key, 1, 0, h.shape, rate))
  hd = np.where(keep1, h / (1 - rate), 0.0)
  q = (h @ np.asarray(p['qkv']['kernel']) + np.asarray(p['qkv']['bias'])
       + cfg.scale * (hd @ np.asarray(tree['qkv']['a'])) @ np.asarray(tree['qkv']['b']))
  g = np.asarray(jax.nn.gelu(jnp.asarray(q), approximate=False))
  want = (g @ np.asarray(p['proj']['kernel']) + np.asarray(p['proj']['bias'])).mean(axis=1)
  np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
  assert 0.45 < keep1.mean() < 0.75


def test_ensemble_branches_get_their_own_adapters():
  """DreamSim's ensemble applies each branch apart ({'params': params[branch]}): the same module path in two
  branches must take two different adapters (identity of the kernel, not its path inside the branch)."""
  from visim_jax.backbones import dreamsim
  bb = dreamsim.dreamsim_backbone('dreamsim_ensemble', tiny=True)
  cfg = lora.Config(r=2, alpha=2, dropout=0.2)
  tree = lora.init(jax.random.PRNGKey(0), bb.variables['params'], cfg)
  assert len(tree) == 6 and sorted(tree)[0] == 'clip/blocks_0/attn/qkv'
  x = jnp.asarray(np.random.default_rng(0).uniform(0, 1, (2, 32, 32, 3)), jnp.float32)
  tree = jax.tree.map(lambda v: v + 0.1, tree)
  base = bb.apply_fn(bb.variables, x)[1]
  only_dino = {k: (v if k.startswith('dino/') else jax.tree.map(jnp.zeros_like, v)) for k, v in tree.items()}
  out = lora.forward(bb.apply_fn, bb.variables, only_dino, cfg, x, jax.random.PRNGKey(1))[1]
  assert not np.allclose(out['dino'], base['dino'])
  np.testing.assert_allclose(out['clip'], base['clip'], rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(out['open_clip'], base['open_clip'], rtol=1e-6, atol=1e-6)


def test_arrays_round_trip_and_refusals(tmp_path):
  variables, _, _ = _toy()
  cfg = lora.Config(r=2, alpha=4, targets=('qkv', 'conv'))
  tree = lora.init(jax.random.PRNGKey(3), variables['params'], cfg)
  np.savez(tmp_path / 'lora.npz', **lora.to_arrays(tree))
  back = lora.from_arrays(dict(np.load(tmp_path / 'lora.npz')))
  assert jax.tree.structure(back) == jax.tree.structure(tree)
  for x, y in zip(jax.tree.leaves(back), jax.tree.leaves(tree)):
    np.testing.assert_array_equal(x, y)
  with pytest.raises(UserError, match='unexpected key'):
    lora.from_arrays({'qkv/c': np.zeros(2)})
  with pytest.raises(UserError, match='lack a or b'):
    lora.from_arrays({'qkv/a': np.zeros(2)})
