"""Ensembles of context-sensitive models (paper 004, Sec. 4.2, Figs. 5, 6, 8, Tables 6-7), as the authors combine them.

Each of the K models gives, for a triple (R, A, B), its cosine distances d_k(R, A) and d_k(R, B) (authors'
dist_cluster.py: `cosine_distances` of each model's embeddings). A weighted ensemble fuses the distances:

  decision(t) = sign( sum_k w_k(R) d_k(R, B) - sum_k w_k(R) d_k(R, A) )     +1: A closer, -1: B closer, 0: tie

(`get_weighted_distance` / `get_weighted_preds`), with weights that depend on the reference R only, fitted on
mulref_val from each model's per-reference correctness (the mean score of its triples with that reference).
Every decision is antisymmetric in (A, B) by construction. A tie scores 1/2.

  majority vote   sign(sum_k sign(d_k(R, B) - d_k(R, A))): the paper's Table 6 row; a 4-4 split is a tie.
  PCA credibility (`dist_sliding.py`, `get_ensemble_strategy2d(mode='thres')`) a 2-D PCA of the reference
  maps            features; per axis `grid`+1 edges spanning the fit points (np.linspace(min, max)); a point
                  falls in bin i when edge_i <= x < edge_i+1, points outside go to the first / last bin. Model
                  k's credibility at cell (i, j) is the mean per-reference correctness of the fit references
                  whose cell lies in rows [i - h, i + h) x columns [j - h, j + h), h = window // 2 (the
                  authors' slice, 10 cells for window 10), each reference once; undefined where that window
                  holds no reference. Weights: w_k = c_k where c_k > threshold (0.75), else 0; where no model
                  passes but the window holds references, the most credible model alone decides (w = 1);
                  then w / sum(w); an empty window gives 1/K to every model.
  MLP weights     (`ml_ensemble`, sklearn `MLPRegressor(hidden_layer_sizes=16, activation='logistic',
                  learning_rate_init=1e-3)`) one regressor per model on the 64-D PCA of the reference features:
                  P -> 16 logistic units -> 1 (identity), squared loss + L2 (alpha 1e-4), Adam, minibatches of
                  min(200, R), 200 epochs; fitted on the model's per-reference correctness. w_k = p_k / sum_j p_j.

A subset of the models (Fig. 8: every one of the 2^K - 1 subsets) is a 0/1 mask over k: each rule above is
applied to the models in the mask only (the PCA rule's 1/K becomes 1/|subset|). `subset_sweep` evaluates every
subset in one vmapped program.
"""
from __future__ import annotations

import functools
import itertools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from visim_jax.core import cpu_kernels
from visim_jax.core import pca as pca_lib
from visim_jax.data import cosis
from visim_jax.metrics import twoafc


# ------------------------------------------------------------------------------------------- decisions

def fused_decision(d_a: jax.Array, d_b: jax.Array, weights: jax.Array) -> jax.Array:
  """sign(sum_k w_k d_k(R, B) - sum_k w_k d_k(R, A)): d_a, d_b (K, T); weights (K, T) or (K,) -> (T,)."""
  w = weights if weights.ndim == 2 else weights[:, None]
  return jnp.sign(jnp.sum(w * d_b, 0) - jnp.sum(w * d_a, 0))


def majority_decision(d_a: jax.Array, d_b: jax.Array, mask: jax.Array | None = None) -> jax.Array:
  """sign of the sum of the (masked) models' votes sign(d_k(R, B) - d_k(R, A)); an even split is 0."""
  votes = jnp.sign(d_b - d_a)
  if mask is not None:
    votes = votes * mask[:, None]
  return jnp.sign(votes.sum(0))


def decision_scores(decision: jax.Array, a_closer: jax.Array) -> jax.Array:
  """Per-triple 2AFC scores of decisions in {+1, -1, 0}: 1 right, 0 wrong, 1/2 on a tie."""
  return 0.5 * (1.0 + decision * jnp.where(a_closer, 1.0, -1.0))


# ------------------------------------------------------------------------------------ credibility maps

class CredibilityMaps(NamedTuple):
  edges: jax.Array     # (2, grid + 1) bin edges per axis (np.linspace over the fit points)
  maps: jax.Array      # (K, grid, grid) windowed mean per-reference correctness; NaN where the window is empty
  count: jax.Array     # (grid, grid) number of fit references in each cell's window


def grid_edges(xy: jax.Array, grid: int) -> jax.Array:
  """(2, grid + 1) edges: linspace(min, max, grid + 1) of each axis of the 2-D fit points (authors' get_bins)."""
  lo, hi = xy.min(0), xy.max(0)
  t = jnp.linspace(0.0, 1.0, grid + 1)
  return lo[:, None] + (hi - lo)[:, None] * t[None, :]


def cells(edges: jax.Array, xy: jax.Array) -> jax.Array:
  """(M, 2) int32 bins: edge_i <= x < edge_i+1; below the first edge -> 0, at or above the last -> grid - 1."""
  grid = edges.shape[1] - 1
  ij = [jnp.searchsorted(edges[d], xy[:, d], side='right') - 1 for d in range(2)]
  return jnp.clip(jnp.stack(ij, 1), 0, grid - 1).astype(jnp.int32)


def window_sum(x: jax.Array, window: int) -> jax.Array:
  """Sum over rows [i - h, i + h) and columns [j - h, j + h) (clipped to the grid), h = window // 2; (..., G, G)."""
  h = window // 2
  dims = (1,) * (x.ndim - 2) + (2 * h, 2 * h)
  pad = ((0, 0),) * (x.ndim - 2) + ((h, h - 1), (h, h - 1))
  return jax.lax.reduce_window(x, 0.0, jax.lax.add, dims, (1,) * x.ndim, pad)


@functools.partial(cpu_kernels.jit, static_argnames=('grid', 'window'))
def fit_credibility(xy: jax.Array, per_ref_acc: jax.Array, grid: int = 200, window: int = 10) -> CredibilityMaps:
  """Credibility maps of K models from their per-reference correctness (K, R) at R fit points xy (R, 2)."""
  edges = grid_edges(xy, grid)
  ij = cells(edges, xy)
  flat = ij[:, 0] * grid + ij[:, 1]
  count = jnp.zeros((grid * grid,)).at[flat].add(1.0).reshape(grid, grid)
  sums = jax.vmap(lambda a: jnp.zeros((grid * grid,)).at[flat].add(a))(per_ref_acc.astype(jnp.float32))
  wcount = window_sum(count, window)
  wsum = window_sum(sums.reshape(-1, grid, grid), window)
  maps = jnp.where(wcount > 0, wsum / jnp.maximum(wcount, 1.0), jnp.nan)
  return CredibilityMaps(edges, maps, wcount)


def credibility(cm: CredibilityMaps, xy: jax.Array) -> tuple[jax.Array, jax.Array]:
  """((K, M) credibility, NaN in empty windows; (M,) window counts) of M points (their cells)."""
  ij = cells(cm.edges, xy)
  return cm.maps[:, ij[:, 0], ij[:, 1]], cm.count[ij[:, 0], ij[:, 1]]


def threshold_weights(cred: jax.Array, count: jax.Array, threshold: float = 0.75,
                      mask: jax.Array | None = None) -> jax.Array:
  """The authors' 'thres' strategy on (K, M) credibilities -> (K, M) weights summing to 1 over the masked models."""
  k = cred.shape[0]
  m = jnp.ones((k,), bool) if mask is None else mask.astype(bool)
  c = jnp.where(m[:, None], jnp.nan_to_num(cred, nan=0.0), 0.0)
  w = jnp.where(c > threshold, c, 0.0)
  best = jax.nn.one_hot(jnp.argmax(jnp.where(m[:, None], c, -jnp.inf), axis=0), k, axis=0)
  w = jnp.where((w.sum(0) == 0) & (count > 0), best, w)
  total = w.sum(0, keepdims=True)
  uniform = m[:, None] / jnp.maximum(m.sum(), 1)
  return jnp.where(total > 0, w / jnp.where(total > 0, total, 1.0), uniform)


# ------------------------------------------------------------------------------------------------- MLP

def mlp_init(key: jax.Array, in_dim: int, hidden: int) -> dict:
  """sklearn's MLPRegressor init for logistic units: U(-b, b), b = sqrt(2 / (fan_in + fan_out)), biases too."""
  ks = jax.random.split(key, 4)
  u = lambda k, shape, fi, fo: jax.random.uniform(k, shape, jnp.float32, -1, 1) * jnp.sqrt(2.0 / (fi + fo))
  return {'w1': u(ks[0], (in_dim, hidden), in_dim, hidden), 'b1': u(ks[1], (hidden,), in_dim, hidden),
          'w2': u(ks[2], (hidden,), hidden, 1), 'b2': u(ks[3], (), hidden, 1)}


def mlp_apply(params: dict, x: jax.Array) -> jax.Array:
  """Predicted correctness of one model at (M, P) reduced reference features -> (M,) (identity output)."""
  return jax.nn.sigmoid(x @ params['w1'] + params['b1']) @ params['w2'] + params['b2']


def fit_mlp(key: jax.Array, x: jax.Array, per_ref_acc: jax.Array, hidden: int = 16, epochs: int = 200,
            lr: float = 1e-3, alpha: float = 1e-4, batch_size: int = 200) -> dict:
  """K regressors (stacked on the leading axis), model k's fitted on (x (R, P), per_ref_acc[k] (R,)).

  Each epoch visits a fresh permutation of the R references in ceil(R / b) minibatches (the last one partial,
  b = min(batch_size, R)); loss = mean squared error / 2 + alpha / 2 ||W||^2 / batch (sklearn's), Adam.
  """
  r = x.shape[0]
  bs = min(batch_size, r)
  n_b = -(-r // bs)
  opt = optax.adam(lr, b1=0.9, b2=0.999, eps=1e-8)

  def loss(p, xb, yb, mb):
    n = jnp.maximum(mb.sum(), 1.0)
    err = jnp.sum(mb * (mlp_apply(p, xb) - yb) ** 2) / (2 * n)
    return err + 0.5 * alpha * (jnp.sum(p['w1'] ** 2) + jnp.sum(p['w2'] ** 2)) / n

  def one(k, y):
    k_init, k_perm = jax.random.split(k)
    p = mlp_init(k_init, x.shape[1], hidden)
    perms = jnp.argsort(jax.random.uniform(k_perm, (epochs, r)), axis=1)        # a fresh order each epoch
    order = jnp.pad(perms, ((0, 0), (0, n_b * bs - r))).reshape(epochs * n_b, bs)    # (steps, batch)
    valid = jnp.tile((jnp.arange(n_b * bs) < r).astype(jnp.float32).reshape(n_b, bs), (epochs, 1))

    def step(c, xs):
      p, s = c
      idx, mb = xs
      g = jax.grad(loss)(p, x[idx], y[idx], mb)
      u, s = opt.update(g, s, p)
      return (optax.apply_updates(p, u), s), None
    return jax.lax.scan(step, (p, opt.init(p)), (order, valid))[0][0]

  keys = jax.random.split(key, per_ref_acc.shape[0])
  return jax.vmap(one)(keys, per_ref_acc.astype(jnp.float32))


def mlp_predict(params: dict, x: jax.Array) -> jax.Array:
  """(K, M) predicted correctness of the K stacked regressors at M points."""
  return jax.vmap(lambda p: mlp_apply(p, x))(params)


def mlp_weights(pred: jax.Array, mask: jax.Array | None = None) -> jax.Array:
  """w_k = p_k / sum_j p_j over the masked models (the authors divide by the plain sum, whatever its sign)."""
  if mask is not None:
    pred = pred * mask[:, None]
  total = pred.sum(0, keepdims=True)
  return pred / jnp.where(total == 0, 1.0, total)


# ------------------------------------------------------------------------------ fitted on val, applied

@functools.partial(cpu_kernels.jit, static_argnames=('hidden', 'epochs', 'lr', 'alpha', 'batch_size'))
def fit_mlp_repeats(keys: jax.Array, x: jax.Array, per_ref_acc: jax.Array, hidden: int = 16, epochs: int = 200,
                    lr: float = 1e-3, alpha: float = 1e-4, batch_size: int = 200) -> dict:
  """fit_mlp once per key (N repeats, the paper's 'three times'), one program: params with axes (N, K, ...)."""
  return jax.vmap(lambda k: fit_mlp(k, x, per_ref_acc, hidden, epochs, lr, alpha, batch_size))(keys)


@functools.partial(cpu_kernels.jit, static_argnames=('threshold',))
def ensemble_scores(cm: CredibilityMaps, xy: jax.Array, mlp_params: dict, x_mlp: jax.Array, d_a: jax.Array,
                    d_b: jax.Array, a_closer: jax.Array, groups: jax.Array, best, threshold: float = 0.75) -> dict:
  """Per-triple scores of the best single model, majority vote, PCA credibility and MLP ensembles (N repeats)
  at triples whose references (rows of xy (R, 2) / x_mlp (R, P)) are indexed by groups (T,).

  Also returns the credibility 'cred' (K, R), window 'count' (R,) and MLP predictions 'mlp_pred' (N, K, R) at
  the references (the inputs of subset_sweep).
  """
  score = lambda dec: decision_scores(dec, a_closer)
  cred, count = credibility(cm, xy)
  pred = jax.vmap(lambda p: mlp_predict(p, x_mlp))(mlp_params)
  w_pca = threshold_weights(cred, count, threshold)[:, groups]
  return {'best_single': score(jnp.sign(d_b[best] - d_a[best])), 'majority_vote': score(majority_decision(d_a, d_b)),
          'pca_credibility': score(fused_decision(d_a, d_b, w_pca)),
          'mlp': jax.vmap(lambda p: score(fused_decision(d_a, d_b, mlp_weights(p)[:, groups])))(pred),
          'cred': cred, 'count': count, 'mlp_pred': pred}


# -------------------------------------------------------------------------------------- subset sweep

def subset_masks(k: int) -> np.ndarray:
  """(2^k - 1, k) bool: every non-empty subset of k models, by size r = 1..k, then lexicographic (itertools)."""
  rows = [np.isin(np.arange(k), c) for r in range(1, k + 1) for c in itertools.combinations(range(k), r)]
  return np.stack(rows)


@functools.partial(cpu_kernels.jit, static_argnames=('threshold', 'batch'))
def subset_sweep(masks: jax.Array, d_a: jax.Array, d_b: jax.Array, a_closer: jax.Array, groups: jax.Array,
                 cred: jax.Array, count: jax.Array, mlp_pred: jax.Array, threshold: float = 0.75,
                 batch: int = 8) -> dict:
  """Accuracy of every subset ensemble in one vmapped program (Fig. 8).

  masks (S, K); d_a, d_b (K, T); a_closer (T,); groups (T,) the reference index of each triple; cred (K, R),
  count (R,): credibility at the R references; mlp_pred (N, K, R): N MLP repeats' predicted correctness.
  Returns {'majority': (S,), 'pca': (S,), 'mlp': (S, N)} accuracies. The per-reference weights of all subsets
  are computed at once ((S, K, R) and (S, N, K, R)); fused decisions sign(sum_k w_k (d_k(R, B) - d_k(R, A)))
  then gather the weights per triple for `batch` subsets at a time (memory batch x N x K x T).
  """
  diff = d_b - d_a                                                            # (K, T)
  truth = jnp.where(a_closer, 1.0, -1.0)
  acc = lambda fused: jnp.mean(0.5 * (1.0 + jnp.sign(fused) * truth), -1)
  mf = masks.astype(jnp.float32)
  w_pca = jax.vmap(lambda m: threshold_weights(cred, count, threshold, m))(masks)             # (S, K, R)
  w_mlp = jax.vmap(lambda m: jax.vmap(lambda p: mlp_weights(p, m))(mlp_pred))(mf)             # (S, N, K, R)
  fused_acc = lambda w: acc(jnp.einsum('...kt,kt->...t', jnp.take(w, groups, axis=-1), diff))
  return {'majority': acc(mf @ jnp.sign(diff)), 'pca': jax.lax.map(fused_acc, w_pca, batch_size=batch),
          'mlp': jax.lax.map(fused_acc, w_mlp, batch_size=batch)}


# ------------------------------------------------------------------------------ the paper's protocol

def fit_and_score(e, seed: int, feats_of, val, test, dist_val, dist_test, names, acc,
                  anchors=()) -> tuple[dict, dict]:
  """The paper's protocol (Sec. 4.2, 5.4): weights fitted on mulref_val (`val`), scored on val (in-sample) and
  mulref_test (`test`): best single model, majority vote, PCA credibility maps, MLP weights, and every subset.

  e: the options (config.ensemble: grid, window, threshold, pca_fit, mlp_*, sweep); feats_of(keys) -> (n, D)
  reference features; dist_val / dist_test: (d_a, d_b) (K, T) of the K models; acc(scores, triplets, **extra)
  -> a summary dict (metrics.twoafc.Summaries); anchors: the context reference keys (the authors' PCA fit set adds
  them). Returns (metrics, extras for the plots).
  """
  (ref_val, g_val), (ref_test, g_test) = twoafc.group_ids(val.ref), twoafc.group_ids(test.ref)
  f = lambda keys: jnp.asarray(feats_of(keys))
  dv, dt = [jnp.asarray(x) for x in dist_val], [jnp.asarray(x) for x in dist_test]
  sc_val = decision_scores(jnp.sign(dv[1] - dv[0]), jnp.asarray(val.a_closer))
  acc_val, _ = twoafc.per_group_mean(sc_val, jnp.asarray(g_val), len(ref_val))       # (K, R) correctness
  fit_rows = list(ref_val) if e.pca_fit == 'val' else cosis.authors_pca_refs(ref_val) + list(anchors)
  fit_feats = f(fit_rows)
  dim = min(max(2, e.mlp_dim), *fit_feats.shape)
  pca = pca_lib.fit(fit_feats, dim)
  xy = {'val': pca_lib.transform(pca, f(ref_val)), 'test': pca_lib.transform(pca, f(ref_test))}
  cm = fit_credibility(xy['val'][:, :2], acc_val, e.grid, e.window)
  keys = jax.random.split(jax.random.PRNGKey(seed), e.mlp_seeds)
  mlp = fit_mlp_repeats(keys, xy['val'][:, :e.mlp_dim], acc_val, e.mlp_hidden, e.mlp_epochs, e.mlp_lr,
                        e.mlp_alpha, e.mlp_batch)
  best = int(np.argmax(np.asarray(sc_val.mean(1))))
  out = {'best_single': {'model': names[best], 'chosen_on': 'mulref_val accuracy'}, 'majority_vote': {},
         'pca_credibility': {'grid': e.grid, 'window': e.window, 'threshold': e.threshold, 'pca_fit': e.pca_fit},
         'mlp': {'pca_dim': int(min(e.mlp_dim, dim)), 'hidden': e.mlp_hidden, 'seeds': e.mlp_seeds}}
  for split, t, (da, db), g in (('val', val, dv, g_val), ('test', test, dt, g_test)):
    r = ensemble_scores(cm, xy[split][:, :2], mlp, xy[split][:, :e.mlp_dim], da, db, jnp.asarray(t.a_closer),
                        jnp.asarray(g), best, e.threshold)
    fitted = split == 'val'
    for name in ('best_single', 'majority_vote', 'pca_credibility'):
      out[name][split] = acc(r[name], t, in_sample=fitted and name != 'majority_vote')
    runs = np.asarray(r['mlp'])
    out['mlp'][split] = acc(runs[0], t, in_sample=fitted, accuracy_mean=float(runs.mean()),
                            accuracy_std=float(runs.mean(1).std()), accuracy_seeds=runs.mean(1).tolist())
  if e.sweep:
    masks = subset_masks(len(names))
    res = subset_sweep(jnp.asarray(masks), *dt, jnp.asarray(test.a_closer), jnp.asarray(g_test), r['cred'],
                       r['count'], r['mlp_pred'], e.threshold)
    out['subset_sweep'] = {'split': 'mulref_test', 'size': masks.sum(1).tolist(),
                           'subsets': [[names[i] for i in np.flatnonzero(mk)] for mk in masks],
                           **{x: np.asarray(v).tolist() for x, v in res.items()}}
  return out, {'credibility': cm, 'xy_val': np.asarray(xy['val'][:, :2]), 'acc_val': np.asarray(acc_val),
               'names': names}
