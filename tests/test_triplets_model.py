"""The context-based triplet loss against a NumPy formula; A/B swap; vmapped training of K context models."""
import numpy as np
import jax
import jax.numpy as jnp

from visim_jax.models import context as tr


def _np_triplet(er, ea, eb, a_closer, cls_a, cls_b, normalize):
  if normalize:
    n = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)
    er, ea, eb = n(er), n(ea), n(eb)
  d_ra = ((er - ea) ** 2).sum(-1)
  d_rb = ((er - eb) ** 2).sum(-1)
  y = np.where(a_closer, -1.0, 1.0)
  margin = np.abs(cls_a - cls_b) / 5 + 0.2
  return np.maximum(margin - (d_ra - d_rb) * y, 0)


def test_triplet_loss_matches_numpy():
  rng = np.random.RandomState(0)
  er, ea, eb = (rng.randn(50, 6).astype(np.float32) for _ in range(3))
  lab = rng.rand(50) < 0.5
  ca, cb = rng.randint(1, 6, 50), rng.randint(1, 6, 50)
  for normalize in (True, False):
    hp = tr.Hparams(normalize=normalize)
    got = tr.triplet_loss(er, ea, eb, lab, ca, cb, hp)
    np.testing.assert_allclose(got, _np_triplet(er, ea, eb, lab, ca, cb, normalize), rtol=1e-5, atol=1e-5)
  # a well-separated, correctly ordered triple costs nothing; the reverse costs margin + gap
  r, a, b = np.array([[1., 0]]), np.array([[1., 0]]), np.array([[-1., 0]])
  assert float(tr.triplet_loss(r, a, b, np.array([True]), np.array([1]), np.array([5]))[0]) == 0.0
  np.testing.assert_allclose(tr.triplet_loss(r, a, b, np.array([False]), np.array([1]), np.array([5])), [4 + 1.0])


def test_swap_keeps_the_answer_consistent():
  b = tr.Batch(*(jnp.arange(8) + o for o in (0, 10, 20)), jnp.ones(8, bool), jnp.full(8, 1), jnp.full(8, 4),
               jnp.ones(8))
  s = tr.swap_ab(jax.random.PRNGKey(0), b)
  swapped = np.asarray(s.a) == np.asarray(b.b)
  assert 0 < swapped.sum() < 8
  np.testing.assert_array_equal(np.asarray(s.a_closer), ~swapped)
  np.testing.assert_array_equal(np.asarray(s.cls_a), np.where(swapped, 4, 1))
  # the loss of a swapped triple equals the loss of the original one (the model is asked the same thing)
  f = jax.random.normal(jax.random.PRNGKey(1), (30, 5))
  params = tr.init(jax.random.PRNGKey(2), 5, tr.Hparams(embed_dim=4, hidden=8))
  trip = lambda bb: tr.triplet_loss(*(tr.embed(params, f[i]) for i in (bb.ref, bb.a, bb.b)), bb.a_closer,
                                    bb.cls_a, bb.cls_b)
  np.testing.assert_allclose(trip(s), trip(b), rtol=1e-5)


def test_vmapped_training_learns_each_context_and_masks_padding():
  # features: a hidden 'truth' direction per context; answers follow it
  rng = np.random.RandomState(0)
  n, d = 60, 6
  f = rng.randn(n, d).astype(np.float32)
  sets = []
  for k, size in enumerate((90, 60)):
    ref = np.full(size, k)
    a, b = rng.randint(2, n, size), rng.randint(2, n, size)
    w = np.eye(d)[k + 2]
    a_closer = np.abs(f[a] @ w) < np.abs(f[b] @ w)
    sets.append((ref, a, b, a_closer, np.full(size, 2), np.full(size, 4)))
  batch = tr.pad_sets(sets)
  assert batch.ref.shape == (2, 90) and float(batch.mask[1].sum()) == 60
  hp = tr.Hparams(embed_dim=8, hidden=16, steps=100, batch_size=32, lr=2e-2)
  state, loss = jax.jit(tr.train, static_argnums=0)(hp, jnp.asarray(f), batch)
  loss = np.asarray(loss)
  assert loss.shape == (2, 100) and np.isfinite(loss).all()
  assert (loss[:, -20:].mean(1) < loss[:, :20].mean(1)).all()
  for k in range(2):
    p = jax.tree.map(lambda x: x[k], state.params)
    ref, a, b, lab = (jnp.asarray(x) for x in sets[k][:4])
    _, _, rank = tr.predict(p, jnp.asarray(f), ref, a, b)
    acc = float(np.mean((np.asarray(rank) > 0) == np.asarray(lab)))
    assert acc > 0.75, (k, acc)
  d_a, _, _ = tr.predict_all(state.params, jnp.asarray(f), ref, a, b)
  assert d_a.shape == (2, 60)
  # chunked training (the runtime's chunks) follows the same steps as one call (to float rounding: the
  # compiled programs differ); the same chunk schedule twice is bit-identical
  st = tr.init_state(hp, d, 2)
  chunk = jax.jit(tr.train_chunk, static_argnums=(0, 5))
  for step0 in (0, 50):
    st, part = chunk(hp, jnp.asarray(f), batch, st, step0, 50)
    np.testing.assert_allclose(np.asarray(part), loss[:, step0:step0 + 50], rtol=1e-5)
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6), st.params, state.params)


def test_predict_matches_the_plain_formulas_and_is_antisymmetric():
  rng = np.random.RandomState(3)
  f = jnp.asarray(rng.randn(20, 5).astype(np.float32))
  ref, a, b = (jnp.asarray(rng.randint(0, 20, 37)) for _ in range(3))
  for hidden in (6, 0):                                     # 0: the authors' linear ranking block
    params = tr.init(jax.random.PRNGKey(hidden), 5, tr.Hparams(embed_dim=4, hidden=hidden))
    d_a, d_b, s = tr.predict(params, f, ref, a, b, 8)       # chunk 8: 37 = 4 chunks + a remainder
    er, ea, eb = (np.asarray(tr.embed(params, f[i]), np.float64) for i in (ref, a, b))
    cos = lambda u, v: (u * v).sum(-1) / (np.linalg.norm(u, axis=-1) * np.linalg.norm(v, axis=-1))
    np.testing.assert_allclose(d_a, 1 - cos(er, ea), atol=1e-5)
    np.testing.assert_allclose(d_b, 1 - cos(er, eb), atol=1e-5)
    p = jax.tree.map(lambda x: np.asarray(x, np.float64), params['rank'])
    def h(x, y):                                            # the ranking block on one orientation, by hand
      z = np.concatenate([er, x, y], -1) @ p['w1'] + p['b1']
      return z[:, 0] if hidden == 0 else np.maximum(z, 0) @ p['w2']
    np.testing.assert_allclose(s, h(ea, eb) - h(eb, ea), rtol=1e-4, atol=1e-5)
    # antisymmetric by construction: swapping A and B negates the score exactly
    _, _, s_swapped = tr.predict(params, f, ref, b, a, 8)
    np.testing.assert_array_equal(np.asarray(s_swapped), -np.asarray(s))
    np.testing.assert_allclose(tr.rank_score(params, *(jnp.asarray(x, jnp.float32) for x in (er, ea, eb))), s,
                               rtol=1e-4, atol=1e-5)
