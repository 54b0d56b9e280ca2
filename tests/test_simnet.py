"""SimNet math: Eq. 2 against NumPy, split-layer all-pairs scoring against concatenation, streaming top-k,
difficult pairs, warm-up to rho > 0.9 (architecture A, CPU budget)."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from visim_jax.models import simnet


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


def test_authors_init_normal_001():
  p = simnet.init_params(jax.random.PRNGKey(0), 256, (1024, 1024), init='normal')
  for name in sorted(p):
    w = np.asarray(p[name]['w'])
    assert abs(w.std() - 0.01) < 0.0005 and abs(w.mean()) < 0.001, name   # N(0, 0.01^2): init_simnet_simplenn.m
    assert not np.asarray(p[name]['b']).any()
  with pytest.raises(ValueError, match='config.init'):
    simnet.init_params(jax.random.PRNGKey(0), 4, (4,), init='xavier')


def test_no_weight_decay_on_biases():
  """MatConvNet's update with weightDecay [1 0], as a plain loop: v = m v - (wd_j w + g); w += lr v."""
  params = {'layer_00': {'w': jnp.array([[1.0, -2.0]]), 'b': jnp.array([0.5, -0.5])}}
  grads = {'layer_00': {'w': jnp.array([[0.1, 0.2]]), 'b': jnp.array([0.3, -0.1])}}
  for decay_biases in (False, True):
    tx = simnet.optimizer(0.1, 0.9, 0.05, decay_biases=decay_biases)
    p, s = params, tx.init(params)
    want = {k: np.asarray(v, np.float64) for k, v in params['layer_00'].items()}
    vel = {k: np.zeros_like(v) for k, v in want.items()}
    for _ in range(4):
      u, s = tx.update(grads, s, p)
      p = optax.apply_updates(p, u)
      for k in ('w', 'b'):
        wd = 0.05 if (k == 'w' or decay_biases) else 0.0
        vel[k] = 0.9 * vel[k] - (wd * want[k] + np.asarray(grads['layer_00'][k]))
        want[k] = want[k] + 0.1 * vel[k]
    for k in ('w', 'b'):
      np.testing.assert_allclose(np.asarray(p['layer_00'][k]), want[k], rtol=1e-6)


def test_warmup_inputs_as_the_authors_draw_them():
  """imdb_random_vectors.m: x = normalise(U(-1, 1)^D) (not a uniform direction). In 2-D the cube puts more mass
  near the diagonals than a uniform direction does; cosines stay exact and uniform either way."""
  def near_diagonal(x):
    ang = np.mod(np.arctan2(x[:, 1], x[:, 0]), np.pi / 2)
    return np.mean(np.abs(ang - np.pi / 4) < np.pi / 8)
  xc, _, _ = simnet.random_pairs(jax.random.PRNGKey(0), 20000, 2, x_dist='cube')
  xs, _, _ = simnet.random_pairs(jax.random.PRNGKey(0), 20000, 2, x_dist='sphere')
  assert near_diagonal(np.asarray(xc)) > 0.55 and abs(near_diagonal(np.asarray(xs)) - 0.5) < 0.02
  x16, y16, c16 = simnet.random_pairs(jax.random.PRNGKey(1), 2000, 16, x_dist='cube')
  np.testing.assert_allclose(np.asarray(simnet.cosine(x16, y16)), np.asarray(c16), atol=1e-5)
  with pytest.raises(ValueError, match='warmup_x_dist'):
    simnet.random_pairs(jax.random.PRNGKey(0), 4, 3, x_dist='ball')


def test_table1_mse_and_rho_cannot_both_hold():
  """For c ~ U(-1, 1) (var 1/3), any prediction with correlation rho has MSE >= (1 - rho^2) / 3 (the residual of
  the best affine fit): Table 1's A (MSE 0.00035, rho 0.909) would need MSE >= 0.058. docs/simnet.md."""
  rng = np.random.RandomState(0)
  c = rng.uniform(-1, 1, 200000)
  for rho, paper_mse in ((0.909, 0.00035), (0.965, 0.00019), (0.974, 0.00012)):   # Table 1: A, B, C
    assert paper_mse < (1 - rho ** 2) / 3 / 50                              # the paper's pair is impossible
    pred = rho * c + np.sqrt(1 - rho ** 2) * rng.randn(len(c)) * c.std()   # correlation rho with c
    stats = simnet.regression_stats(jnp.asarray(pred), jnp.asarray(c))
    assert abs(float(stats['rho']) - rho) < 0.003
    best = np.polyval(np.polyfit(pred, c, 1), pred)                       # best affine use of pred
    assert np.mean((best - c) ** 2) >= (1 - rho ** 2) / 3 * 0.98
