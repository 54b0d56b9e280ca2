"""Ensembles against plain NumPy loops written from the paper / the authors' dist_cluster.py and dist_sliding.py:
fused weighted distances, majority vote (an even split is a tie), credibility-map weights, MLP weights, and
the subset sweep (Fig. 8) against a loop over subsets."""
import itertools

import jax
import jax.numpy as jnp
import numpy as np

from visim_jax.models import ensembles as E


def _np_fused(w, d_a, d_b, truth):
  """Per triple: A is closer when sum_k w_k d_k(R, A) < sum_k w_k d_k(R, B); 1/2 on a tie."""
  out = []
  for t in range(d_a.shape[1]):
    wa = sum(w[k, t] * d_a[k, t] for k in range(d_a.shape[0]))
    wb = sum(w[k, t] * d_b[k, t] for k in range(d_a.shape[0]))
    out.append(0.5 if wa == wb else float((wa < wb) == truth[t]))
  return np.asarray(out)


def _np_majority(d_a, d_b, truth, members):
  out = []
  for t in range(d_a.shape[1]):
    votes = sum(1 if d_a[k, t] < d_b[k, t] else -1 if d_a[k, t] > d_b[k, t] else 0 for k in members)
    out.append(0.5 if votes == 0 else float((votes > 0) == truth[t]))
  return np.asarray(out)


def _np_credibility_weights(xy_fit, acc, xy_new, grid, window, thres):
  """The authors' algorithm, loop by loop: get_bins, get_refbin_dict, get_grid_accs2d, sliding_window2d,
  get_ensemble_strategy2d(mode='thres'), then the lookup of each new point's cell."""
  k = acc.shape[0]
  edges = [np.linspace(xy_fit[:, d].min(), xy_fit[:, d].max(), grid + 1) for d in range(2)]

  def cell(p, d):
    for i in range(grid):
      if edges[d][i] <= p < edges[d][i + 1]:
        return i
    return 0 if p < edges[d][0] else grid - 1
  bins = [(cell(p[0], 0), cell(p[1], 1)) for p in xy_fit]
  half = window // 2
  strategy = np.zeros((k, grid, grid))
  for i in range(grid):
    for j in range(grid):
      members = [r for r, (bi, bj) in enumerate(bins) if max(0, i - half) <= bi < min(grid, i + half)
                 and max(0, j - half) <= bj < min(grid, j + half)]
      if not members:
        strategy[:, i, j] = 1.0 / k
        continue
      cred = np.array([np.mean([acc[m, r] for r in members]) for m in range(k)])
      s = np.where(cred > thres, cred, 0.0)
      if s.sum() == 0:
        s = np.zeros(k)
        s[np.argmax(cred)] = 1.0
      strategy[:, i, j] = s / s.sum()
  return np.stack([strategy[:, cell(p[0], 0), cell(p[1], 1)] for p in xy_new], 1)


def test_fused_distance_equals_numpy_formula():
  rng = np.random.RandomState(0)
  k, t = 4, 60
  d_a, d_b = rng.rand(k, t).astype(np.float32), rng.rand(k, t).astype(np.float32)
  d_b[:, :3] = d_a[:, :3]                        # exact ties score 1/2
  w = rng.rand(k, t).astype(np.float32)
  truth = rng.rand(t) < 0.5
  got = np.asarray(E.decision_scores(E.fused_decision(jnp.asarray(d_a), jnp.asarray(d_b), jnp.asarray(w)),
                                     jnp.asarray(truth)))
  np.testing.assert_allclose(got, _np_fused(w.astype(np.float64), d_a, d_b, truth), atol=0)
  assert (got[:3] == 0.5).all()
  # per-model weights (K,) broadcast over triples; swapping A and B flips every decision (antisymmetric)
  dec = E.fused_decision(jnp.asarray(d_a), jnp.asarray(d_b), jnp.asarray(w[:, 0]))
  np.testing.assert_array_equal(-dec, E.fused_decision(jnp.asarray(d_b), jnp.asarray(d_a), jnp.asarray(w[:, 0])))


def test_majority_vote_even_split_is_a_tie():
  d_a = jnp.asarray(np.r_[np.zeros((4, 1)), np.ones((4, 1))])   # 8 models: 4 say A, 4 say B
  d_b = 1 - d_a
  assert float(E.decision_scores(E.majority_decision(d_a, d_b), jnp.asarray([True]))[0]) == 0.5
  rng = np.random.RandomState(1)
  d_a, d_b = rng.rand(8, 50), rng.rand(8, 50)
  truth = rng.rand(50) < 0.5
  got = E.decision_scores(E.majority_decision(jnp.asarray(d_a), jnp.asarray(d_b)), jnp.asarray(truth))
  np.testing.assert_allclose(got, _np_majority(d_a, d_b, truth, range(8)))


def test_credibility_weights_equal_the_authors_loop():
  rng = np.random.RandomState(2)
  k, r, grid, window = 3, 40, 12, 4
  xy = np.r_[rng.randn(30, 2), rng.randn(10, 2) * 0.2 + 2].astype(np.float32)
  acc = rng.rand(k, r).astype(np.float32)
  acc[1, 30:] = 0.95                            # model 1 is credible in the small cluster
  xy_new = np.r_[xy[:5], rng.randn(15, 2) * 2, [[9.0, -9.0]]].astype(np.float32)   # some outside the box
  cm = E.fit_credibility(jnp.asarray(xy), jnp.asarray(acc), grid, window)
  got = np.asarray(E.threshold_weights(*E.credibility(cm, jnp.asarray(xy_new)), 0.75))
  want = _np_credibility_weights(xy.astype(np.float64), acc, xy_new, grid, window, 0.75)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  assert np.isclose(got.sum(0), 1).all()
  # the window count equals a direct count of the fit points in [i - h, i + h) x [j - h, j + h)
  ij = np.asarray(E.cells(cm.edges, jnp.asarray(xy)))
  i, j = 5, 7
  direct = np.sum((ij[:, 0] >= i - 2) & (ij[:, 0] < i + 2) & (ij[:, 1] >= j - 2) & (ij[:, 1] < j + 2))
  assert float(cm.count[i, j]) == direct


def test_mlp_weights_follow_local_correctness():
  rng = np.random.RandomState(0)
  x = np.r_[rng.randn(40, 3) * 0.3 + [2, 0, 0], rng.randn(40, 3) * 0.3 - [2, 0, 0]].astype(np.float32)
  acc = np.stack([np.r_[np.full(40, 0.9), np.full(40, 0.3)], np.r_[np.full(40, 0.3), np.full(40, 0.9)]])
  params = E.fit_mlp(jax.random.PRNGKey(0), jnp.asarray(x), jnp.asarray(acc, jnp.float32), hidden=16, epochs=300,
                     lr=1e-2, batch_size=32)
  pred = E.mlp_predict(params, jnp.asarray(x[[0, 79]]))
  w = np.asarray(E.mlp_weights(pred))
  np.testing.assert_allclose(w.sum(0), 1.0, rtol=1e-5)
  assert w[0, 0] > 0.6 and w[1, 1] > 0.6
  np.testing.assert_allclose(np.asarray(E.mlp_weights(pred, jnp.asarray([0.0, 1.0])))[1], 1.0, rtol=1e-6)


def test_subset_sweep_equals_a_loop_over_subsets():
  rng = np.random.RandomState(3)
  k, t, r = 4, 90, 12
  d_a, d_b = rng.rand(k, t).astype(np.float32), rng.rand(k, t).astype(np.float32)
  truth = rng.rand(t) < 0.5
  groups = np.sort(rng.randint(0, r, t)).astype(np.int32)
  cred = rng.rand(k, r).astype(np.float32)
  cred[:, :2] = np.nan                                      # two references in empty windows
  count = np.where(np.isnan(cred[0]), 0.0, 3.0).astype(np.float32)
  pred = rng.rand(2, k, r).astype(np.float32)               # 2 MLP repeats
  masks = E.subset_masks(k)
  assert masks.shape == (15, 4) and list(masks.sum(1)) == [1] * 4 + [2] * 6 + [3] * 4 + [4]
  got = E.subset_sweep(jnp.asarray(masks), jnp.asarray(d_a), jnp.asarray(d_b), jnp.asarray(truth),
                       jnp.asarray(groups), jnp.asarray(cred), jnp.asarray(count), jnp.asarray(pred), 0.75, batch=4)
  for s, members in enumerate(c for n in range(1, k + 1) for c in itertools.combinations(range(k), n)):
    m = list(members)
    np.testing.assert_allclose(got['majority'][s], _np_majority(d_a, d_b, truth, m).mean(), rtol=1e-6)
    w = np.zeros((k, r))
    for ref in range(r):
      c = np.nan_to_num(cred[m, ref])
      sel = np.where(c > 0.75, c, 0.0)
      if sel.sum() == 0 and count[ref] > 0:
        sel = np.eye(len(m))[np.argmax(c)]
      w[m, ref] = sel / sel.sum() if sel.sum() > 0 else 1.0 / len(m)
    np.testing.assert_allclose(got['pca'][s], _np_fused(w[:, groups], d_a, d_b, truth).mean(), rtol=1e-6)
    for n in range(2):
      wm = np.zeros((k, r))
      wm[m] = pred[n, m] / pred[n, m].sum(0)
      np.testing.assert_allclose(got['mlp'][s, n], _np_fused(wm[:, groups], d_a, d_b, truth).mean(), rtol=1e-6)
