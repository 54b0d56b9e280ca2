"""SimNet math: Eq. 2 against NumPy, split-layer all-pairs scoring against concatenation, streaming top-k,
difficult pairs, warm-up to rho > 0.9 (architecture A, CPU budget)."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from visim_jax import simnet


def np_mlp(params, x):
  names = sorted(params)
  h = x
  for n in names[:-1]:
    h = np.maximum(h @ np.asarray(params[n]['w'], np.float64) + np.asarray(params[n]['b'], np.float64), 0)
  last = params[names[-1]]
  return (h @ np.asarray(last['w'], np.float64) + np.asarray(last['b'], np.float64))[:, 0]


@pytest.fixture(scope='module')
def small():
  params = simnet.init_params(jax.random.PRNGKey(0), 6, (16, 8))
  rng = np.random.RandomState(0)
  q = rng.randn(7, 6).astype(np.float32)
  d = rng.randn(11, 6).astype(np.float32)
  return params, q, d


def test_shapes_and_param_counts():
  p = simnet.init_params(jax.random.PRNGKey(0), 512, simnet.ARCHITECTURES['A'])
  # Table 1: A has 2.1M parameters on 512-d RMAC vectors (1024 in)
  assert abs(simnet.num_params(p) - 2.1e6) < 0.05e6
  shapes = jax.eval_shape(lambda k: simnet.init_params(k, 512, simnet.ARCHITECTURES['B']), jax.random.PRNGKey(0))
  assert abs(sum(x.size for x in jax.tree.leaves(shapes)) - 21e6) < 0.5e6
  assert simnet.hidden_sizes('d') == (4096, 4096, 4096)
  with pytest.raises(ValueError, match='config.architecture'):
    simnet.hidden_sizes('E')


def test_apply_matches_numpy_and_is_ordered(small):
  params, q, d = small
  s = np.asarray(simnet.apply(params, q[:5], d[:5]))
  np.testing.assert_allclose(s, np_mlp(params, np.concatenate([q[:5], d[:5]], 1)), rtol=1e-4, atol=1e-5)
  assert not np.allclose(s, np.asarray(simnet.apply(params, d[:5], q[:5])))  # order matters


def test_loss_matches_numpy_formula(small):
  params, q, d = small
  xi, xj = q[:6], d[:6]
  lab = np.array([1, 0, 1, 1, 0, 0], bool)
  delta = 0.4
  s = np_mlp(params, np.concatenate([xi, xj], 1))
  cos = (xi * xj).sum(1) / np.linalg.norm(xi, axis=1) / np.linalg.norm(xj, axis=1)
  want = np.mean(np.abs(s - lab * (cos + delta) - (1 - lab) * (cos - delta)))  # Eq. 2 verbatim
  got = float(simnet.loss_fn(params, xi, xj, lab, delta))
  np.testing.assert_allclose(got, want, rtol=1e-5)
  np.testing.assert_allclose(float(simnet.warmup_loss_fn(params, xi, xj)), np.mean(np.abs(s - cos)), rtol=1e-5)


def test_train_step_decreases_loss(small):
  params, q, d = small
  tx = simnet.optimizer(1e-2, 0.9, 5e-4)
  state = tx.init(params)
  lab = np.arange(7) % 2 == 0
  step = jax.jit(lambda p, s: simnet.train_step(tx, p, s, q, d[:7], lab, 0.2))
  losses = []
  for _ in range(30):
    params, state, l = step(params, state)
    losses.append(float(l))
  assert losses[-1] < losses[0]


def test_sgd_weight_decay_like_torch():
  # optax chain == torch.optim.SGD(lr, momentum, weight_decay): v = m v + (g + wd w); w -= lr v
  tx = simnet.optimizer(0.1, 0.9, 0.5)
  w = {'w': jnp.array([1.0, -2.0])}
  s = tx.init(w)
  g = {'w': jnp.array([0.5, 0.5])}
  v = np.zeros(2)
  wn = np.array([1.0, -2.0])
  for _ in range(3):
    u, s = tx.update(g, s, w)
    w = optax.apply_updates(w, u)
    v = 0.9 * v + (0.5 + 0.5 * wn)
    wn = wn - 0.1 * v
  np.testing.assert_allclose(np.asarray(w['w']), wn, rtol=1e-6)


def test_score_matrix_equals_naive_concatenation(small):
  params, q, d = small
  want = np_mlp(params, np.concatenate([np.repeat(q, len(d), 0), np.tile(d, (len(q), 1))], 1)).reshape(7, 11)
  for qt, dt in ((3, 4), (7, 11), (64, 64)):  # several tiles with padding, one tile, tiles larger than the data
    got = np.asarray(simnet.score_matrix(params, q, d, q_tile=qt, d_tile=dt))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
  naive = np.asarray(simnet.score_matrix_naive(params, q, d, q_tile=3, d_tile=4))
  np.testing.assert_allclose(naive, want, rtol=1e-4, atol=1e-5)
  bf = np.asarray(simnet.score_matrix(params, q, d, q_tile=3, d_tile=4, compute_dtype='bfloat16'))
  np.testing.assert_allclose(bf, want, atol=0.05 * np.abs(want).max() + 0.02)


def test_top_k_streaming_over_tiles(small):
  params, q, d = small
  full = np_mlp(params, np.concatenate([np.repeat(q, len(d), 0), np.tile(d, (len(q), 1))], 1)).reshape(7, 11)
  s, i = simnet.top_k(params, q, d, k=5, q_tile=3, d_tile=4)  # 3 database tiles, the last one padded
  want_i = np.argsort(-full, axis=1, kind='stable')[:, :5]
  np.testing.assert_array_equal(np.asarray(i), want_i)
  np.testing.assert_allclose(np.asarray(s), np.take_along_axis(full, want_i, 1), rtol=1e-4, atol=1e-5)
  s_all, i_all = simnet.top_k(params, q, d, k=11, q_tile=2, d_tile=3)
  assert np.isfinite(np.asarray(s_all)).all() and sorted(np.asarray(i_all)[0]) == list(range(11))


def test_top_k_ties_keep_lower_index():
  # a zero last layer makes every score equal: the first k database indices must come back, in order
  params = simnet.init_params(jax.random.PRNGKey(1), 3, (4,))
  params['layer_01']['w'] = jnp.zeros_like(params['layer_01']['w'])
  x = np.random.RandomState(0).randn(9, 3).astype(np.float32)
  _, i = simnet.top_k(params, x[:2], x, k=4, q_tile=2, d_tile=2)
  np.testing.assert_array_equal(np.asarray(i), [[0, 1, 2, 3]] * 2)


def test_hard_pair_mask():
  s = jnp.array([0.5, 0.9, 0.5, 0.1])
  c = jnp.array([0.6, 0.6, 0.4, 0.4])
  lab = jnp.array([True, True, False, False])
  np.testing.assert_array_equal(np.asarray(simnet.hard_pair_mask(s, c, lab)), [True, False, True, False])


def test_random_pairs_cosine_spread():
  x, y, c = simnet.random_pairs(jax.random.PRNGKey(0), 2000, 16, norm=2.0)
  np.testing.assert_allclose(np.asarray(simnet.cosine(x, y)), np.asarray(c), atol=1e-5)
  np.testing.assert_allclose(np.linalg.norm(np.asarray(y), axis=1), 2.0, rtol=1e-5)
  hist = np.histogram(np.asarray(c), bins=4, range=(-1, 1))[0]
  assert hist.min() > 400


def test_warmup_architecture_a_reaches_rho_09():
  """Table 1 on a CPU budget: architecture A, 32-d vectors, 40k pairs (400 steps of 100), SGD lr 1e-2."""
  dim, steps, batch = 32, 400, 100
  params = simnet.init_params(jax.random.PRNGKey(0), dim, simnet.ARCHITECTURES['A'])
  tx = simnet.optimizer(1e-2, 0.9, 5e-4)

  @jax.jit
  def run(params, key):
    def body(carry, k):
      p, s = carry
      x, y, _ = simnet.random_pairs(k, batch, dim)
      l, g = jax.value_and_grad(simnet.warmup_loss_fn)(p, x, y)
      u, s = tx.update(g, s, p)
      return (optax.apply_updates(p, u), s), l
    (p, _), _ = jax.lax.scan(body, (params, tx.init(params)), jax.random.split(key, steps))
    return p

  params = run(params, jax.random.PRNGKey(1))
  x, y, c = simnet.random_pairs(jax.random.PRNGKey(2), 4000, dim)
  stats = simnet.regression_stats(simnet.apply(params, x, y), c)
  assert float(stats['rho']) > 0.9, stats
