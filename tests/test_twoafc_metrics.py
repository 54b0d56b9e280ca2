"""2AFC accuracy against a brute-force loop; per-reference means; the bootstrap interval."""
import numpy as np
import jax.numpy as jnp

from visim_jax.metrics import twoafc


def _data(seed=0, n=40, d=8, t=300):
  rng = np.random.RandomState(seed)
  f = rng.randn(n, d).astype(np.float32)
  ref = rng.randint(0, 10, t)
  a, b = rng.randint(0, n, t), rng.randint(0, n, t)
  lab = rng.rand(t) < 0.5
  return f, ref, a, b, lab


def _brute(sim, f, ref, a, b, lab):
  out = []
  for r, x, y, l in zip(ref, a, b, lab):
    sa, sb = sim(f[r], f[x]), sim(f[r], f[y])
    out.append(0.5 if sa == sb else float((sa > sb) == l))
  return np.asarray(out)


def _cos(u, v):
  return float(np.dot(u, v) / (np.linalg.norm(u) * np.linalg.norm(v)))


def test_cosine_accuracy_matches_brute_force():
  f, ref, a, b, lab = _data()
  a[:5] = b[:5]  # exact ties score 1/2
  got = np.asarray(twoafc.cosine_scores(jnp.asarray(f), ref, a, b, lab))
  want = _brute(_cos, f, ref, a, b, lab)
  np.testing.assert_allclose(got, want)
  assert (got[:5] == 0.5).all()


def test_transform_and_score_fn():
  f, ref, a, b, lab = _data(1)
  w = np.random.RandomState(2).randn(8, 16).astype(np.float32)
  adapt = lambda x: jnp.maximum(x @ w, 0.0)
  got = np.asarray(twoafc.transformed_scores(adapt, f, ref, a, b, lab))
  g = np.maximum(f @ w, 0)
  want = _brute(lambda u, v: _cos(u, v), g, ref, a, b, lab)
  np.testing.assert_allclose(got, want)
  score_fn = lambda r, c: -jnp.sum((r - c) ** 2, -1)  # any pair scorer (SimNet-like)
  got = np.asarray(twoafc.pair_fn_scores(score_fn, f, ref, a, b, lab, batch_size=64))
  want = _brute(lambda u, v: -float(np.sum((u - v) ** 2)), f, ref, a, b, lab)
  np.testing.assert_allclose(got, want)


def test_per_reference_and_summary():
  scores = np.array([1, 0, 1, 1, 0.5, 0], np.float32)
  refs = np.array(['r2', 'r2', 'r1', 'r1', 'r1', 'r3'])
  uniq, g = twoafc.group_ids(refs)
  assert list(uniq) == ['r2', 'r1', 'r3'] and list(g) == [0, 0, 1, 1, 1, 2]
  per, cnt = twoafc.per_group_mean(jnp.asarray(scores), jnp.asarray(g), 3)
  np.testing.assert_allclose(per, [0.5, 2.5 / 3, 0.0], rtol=1e-6)
  np.testing.assert_allclose(cnt, [2, 3, 1])
  s = twoafc.summary(scores, refs, n_boot=200)
  assert abs(s['accuracy'] - 3.5 / 6) < 1e-6 and s['n_references'] == 3
  assert abs(s['per_reference_mean'] - (0.5 + 2.5 / 3) / 3) < 1e-6
  assert s['ci_low'] <= s['accuracy'] <= s['ci_high']


def test_bootstrap_constant_and_width():
  lo, hi = twoafc.bootstrap_ci(np.ones(50), np.arange(50) % 5, n_boot=100)
  assert lo == hi == 1.0
  rng = np.random.RandomState(0)
  x = (rng.rand(2000) < 0.7).astype(np.float32)
  lo, hi = twoafc.bootstrap_ci(x, None, n_boot=500, unit='triplet')
  se = np.sqrt(0.7 * 0.3 / 2000)
  assert lo < x.mean() < hi and abs((hi - lo) - 2 * 1.96 * se) < 0.01
