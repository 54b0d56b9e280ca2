"""odd_one_out.py and heads.py against plain-loop NumPy versions written here from the equations (AligNet's
losses.py / metrics.py, DreamSim's HingeLoss and MLP)."""
import math

import jax
import numpy as np
import pytest

from visim_jax.models import heads
from visim_jax.losses import odd_one_out as ooo


def _np_sims(e, kind):
  out = np.zeros((len(e), 3))
  for b in range(len(e)):
    v = [np.asarray(e[b, i], np.float64) for i in range(3)]
    if kind == 'cosine':
      v = [x / math.sqrt(sum(t * t for t in x)) for x in v]
    for p, (i, j) in enumerate(((0, 1), (0, 2), (1, 2))):
      out[b, p] = sum(v[i][d] * v[j][d] for d in range(len(v[i])))
  return out


def _softmax(z):
  m = max(z)
  ex = [math.exp(t - m) for t in z]
  return [t / sum(ex) for t in ex]


def _kl(p, q):
  return sum(pi * math.log(pi / qi) for pi, qi in zip(p, q) if pi > 0)


@pytest.fixture
def data():
  rng = np.random.RandomState(0)
  e = rng.randn(7, 3, 5).astype(np.float32)
  t = rng.randn(7, 3).astype(np.float32) * 3
  t[0] = [50.0, -50.0, -50.0]   # a near one-hot target (p log p with p ~ 0)
  return e, t


@pytest.mark.parametrize('kind', ['dot', 'cosine'])
def test_pair_similarities(data, kind):
  e, _ = data
  np.testing.assert_allclose(ooo.pair_similarities(e, kind), _np_sims(e, kind), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('tau', [1.0, 100.0, 0.1])
def test_hard_soft_losses(data, tau):
  e, t = data
  s = _np_sims(e, 'dot').astype(np.float32)
  odd = np.array([2, 1, 0, 2, 0, 1, 2])
  hard, kl, jsd = [], [], []
  for b in range(len(s)):
    q = _softmax([x / tau for x in s[b]])
    hard.append(-math.log(q[2 - odd[b]]))
    p = _softmax([x / 0.5 for x in t[b]])
    kl.append(_kl(p, q))
    m = [(a + c) / 2 for a, c in zip(p, q)]
    jsd.append((_kl(p, m) + _kl(q, m)) / 2)
  np.testing.assert_allclose(ooo.hard_ce(s, odd, tau), hard, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(ooo.soft_kl(s, t, tau, 0.5), kl, rtol=1e-3, atol=1e-5)
  np.testing.assert_allclose(ooo.soft_jsd(s, t, tau, 0.5), jsd, rtol=1e-3, atol=1e-6)
  # AligNet's ContrastiveTripletLoss with the odd one last: -s_ij / tau + logsumexp(s / tau)
  alig = [-s[b, 0] / tau + math.log(sum(math.exp(x / tau) for x in s[b])) for b in range(len(s))]
  np.testing.assert_allclose(ooo.hard_ce(s, np.full(len(s), 2), tau), alig, rtol=1e-4, atol=1e-5)
  # 'hard' on soft targets = hard on the teacher's odd one
  np.testing.assert_allclose(ooo.per_triplet('hard', s, t, tau), ooo.hard_ce(s, ooo.teacher_odd(t), tau))
  assert np.isfinite(np.asarray(jax.grad(lambda x: ooo.soft_jsd(x, t, tau).sum())(s))).all()


def test_hinge_matches_dreamsim(data):
  e, _ = data
  s = _np_sims(e, 'cosine').astype(np.float32)
  judge = np.array([0.0, 1.0, 0.6, 0.4, 0.5, 0.5001, 1.0], np.float32)
  want = []
  for b in range(len(s)):
    d0, d1 = 1 - s[b, 0], 1 - s[b, 1]
    y = -1 * (1 - 2 * np.round(judge[b]))       # DreamSim: round, then {0, 1} -> {-1, 1}
    want.append(max(0.0, 0.05 + (-1 * ((d0 - d1) * y))))
  np.testing.assert_allclose(ooo.hinge(s, judge, 0.05), want, rtol=1e-5, atol=1e-6)


def test_accuracy_rules():
  s = np.array([[3.0, 1.0, 0.0], [1.0, 3.0, 0.0], [0.0, 1.0, 3.0], [2.0, 2.0, 0.0]], np.float32)
  np.testing.assert_array_equal(ooo.correct(s, np.array([2, 1, 0, 2])), [1, 1, 1, 0])   # a tie is wrong ('lt')
  np.testing.assert_array_equal(ooo.correct(s, np.array([2, 1, 0, 2]), 'le'), [1, 1, 1, 1])
  np.testing.assert_array_equal(ooo.correct(s, np.array([0, 0, 2, 0])), [0, 0, 0, 0])
  np.testing.assert_array_equal(ooo.teacher_odd(s[:3]), [2, 1, 0])
  # AligNet's TripletAccuracy: argmax of [s_jk, s_ik, s_ij] == 2 (odd one last)
  alig = [int(np.argmax([r[2], r[1], r[0]]) == 2) for r in s]
  np.testing.assert_array_equal(ooo.correct(s, np.full(4, 2)), alig)


KINDS = (('adapter', 8), ('embed', 5), ('affine', 7), ('mlp', 3), ('identity', 0))


def test_heads_match_loops():
  rng = np.random.RandomState(1)
  x = rng.randn(4, 6).astype(np.float32)
  key = jax.random.PRNGKey(0)

  @jax.jit      # every head's init and apply in one compiled program (one compile, not one per op)
  def every_head(key, x):
    ps = {kind: heads.init(kind, key, 6, size) for kind, size in KINDS}
    wide = {kind: heads.init(kind, key, 16, 4) for kind in ('mlp', 'affine', 'embed')}
    return ps, {kind: heads.apply(kind, ps[kind], x) for kind, _ in KINDS}, wide
  params, outs, wide = jax.tree.map(np.asarray, every_head(key, x))
  for kind, size in KINDS:
    p, got = params[kind], outs[kind]
    want = np.zeros((4, heads.out_dim(kind, 6, size)))
    for n in range(4):
      if kind == 'mlp':
        h = [max(0.0, sum(x[n, i] * p['fc1']['w'][i, j] for i in range(6)) + p['fc1']['b'][j]) for j in range(size)]
        want[n] = [sum(h[j] * p['fc2']['w'][j, o] for j in range(size)) + p['fc2']['b'][o] + x[n, o] for o in range(6)]
      elif kind == 'identity':
        want[n] = x[n]
      else:
        lin = [sum(x[n, i] * p['w'][i, o] for i in range(6)) + (p['b'][o] if kind == 'affine' else 0.0)
               for o in range(size)]
        want[n] = [max(0.0, v) for v in lin] if kind == 'adapter' else lin
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  # inits: torch Linear bounds for 'mlp' and 'adapter', zero bias for 'affine', orthonormal columns for 'embed'
  p = wide['mlp']
  assert np.abs(p['fc1']['w']).max() <= 0.25 and np.abs(p['fc2']['b']).max() <= 0.5
  assert not wide['affine']['b'].any()
  w = wide['embed']['w']
  np.testing.assert_allclose(w.T @ w, np.eye(4), atol=1e-5)
