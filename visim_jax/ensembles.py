"""Ensembles of context-sensitive models (paper 004, Sec. 4.2, Figs. 5-6, Table 6).

Every ensemble is a weighted vote of the K models' answers v_k in {+1 (A closer), -1 (B closer), 0 (tie)}:
  decision(t) = sign(sum_k w_k(t) v_k(t)),  scored like any 2AFC answer (1 right, 0 wrong, 1/2 on a tie).
The weights of a triple depend on its reference image only; they are fitted on `mulref_val` (per-reference
accuracy of each model) and applied to unseen references (`mulref_test`).

  majority vote     w_k = 1.
  PCA credibility   (Sec. 4.2 'Ensemble based on Credibility Maps', Fig. 5) a 2-D PCA of the fit references'
  map               features; the bounding box of their 2-D coordinates (widened by `pad` on each side) cut
                    into grid x grid cells (200 x 200); model k's map at a cell is the mean per-reference
                    accuracy of the fit references inside a window x window block of cells centred on it
                    (a sliding-window mean; every reference counts once). Cells with no reference in their
                    window take the model's mean per-reference accuracy. A new reference is projected,
                    clipped into the box, and reads credibility c_k from its cell.
                    Threshold weighting (our reading of 'determine the contribution of each CS model'):
                    w_k = max(c_k - threshold, 0): only models locally better than the threshold vote, in
                    proportion to their excess; where none is, the locally most credible model decides.
  MLP weights       (Sec. 4.2 'ML-Based Ensemble Strategy', Fig. 6) reference features reduced by PCA
                    (64 dims, whitened: unit variance per component) feed K small MLPs (one per model,
                    P -> hidden -> ReLU -> 1 -> sigmoid), each regressing its model's per-reference accuracy
                    (MSE over the fit references, Adam). At test time w_k = p_k / sum_j p_j.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from visim_jax import pca as pca_lib


def weighted_vote(votes: jax.Array, weights: jax.Array) -> jax.Array:
  """sign(sum_k w_k v_k): votes (K, T), weights (K, T) or (K,) -> (T,) in {+1, -1, 0}."""
  w = weights if weights.ndim == 2 else weights[:, None]
  return jnp.sign(jnp.sum(w * votes.astype(jnp.float32), axis=0))


def vote_scores(decision: jax.Array, a_closer: jax.Array) -> jax.Array:
  """Per-triple 2AFC scores of ensemble decisions (1 right, 0 wrong, 0.5 tie)."""
  return 0.5 * (1.0 + decision * jnp.where(a_closer, 1.0, -1.0))


def majority_weights(k: int, t: int) -> jax.Array:
  return jnp.ones((k, t), jnp.float32)


# --------------------------------------------------------------------------------- credibility maps

class CredibilityMaps(NamedTuple):
  pca: pca_lib.PCA     # 2-D projection of reference features
  lo: jax.Array        # (2,) lower corner of the grid box
  hi: jax.Array        # (2,) upper corner
  maps: jax.Array      # (K, G, G) credibility (sliding-window mean per-reference accuracy)
  support: jax.Array   # (G, G) number of fit references inside each cell's window


def cells(lo, hi, grid: int, xy: jax.Array) -> jax.Array:
  """(M, 2) int cell indices of 2-D points, clipped into the grid."""
  ij = jnp.floor((xy - lo) / jnp.maximum(hi - lo, 1e-12) * grid).astype(jnp.int32)
  return jnp.clip(ij, 0, grid - 1)


def box_sum(x: jax.Array, window: int) -> jax.Array:
  """Sum over a window x window block centred on each cell (zero outside), same shape (..., G, G)."""
  dims = (1,) * (x.ndim - 2) + (window, window)
  return jax.lax.reduce_window(x, 0.0, jax.lax.add, dims, (1,) * x.ndim, 'SAME')


def fit_credibility(ref_feats: jax.Array, per_ref_acc: jax.Array, grid: int = 200, window: int = 21,
                    pad: float = 0.02) -> CredibilityMaps:
  """Credibility maps of K models from their per-reference accuracy (K, R) at R references (R, D)."""
  p = pca_lib.fit(ref_feats, 2)
  xy = pca_lib.transform(p, ref_feats)
  lo, hi = xy.min(0), xy.max(0)
  span = jnp.maximum(hi - lo, 1e-6)
  lo, hi = lo - pad * span, hi + pad * span
  ij = cells(lo, hi, grid, xy)
  flat = ij[:, 0] * grid + ij[:, 1]
  count = jnp.zeros((grid * grid,)).at[flat].add(1.0).reshape(grid, grid)
  sums = jax.vmap(lambda a: jnp.zeros((grid * grid,)).at[flat].add(a))(per_ref_acc.astype(jnp.float32))
  sums = sums.reshape(-1, grid, grid)
  support = box_sum(count, window)
  fallback = per_ref_acc.mean(1)[:, None, None]
  maps = jnp.where(support > 0, box_sum(sums, window) / jnp.maximum(support, 1.0), fallback)
  return CredibilityMaps(p, lo, hi, maps, support)


def credibility(cm: CredibilityMaps, ref_feats: jax.Array) -> jax.Array:
  """(K, M) credibility of each model at M references (looked up in their cells)."""
  ij = cells(cm.lo, cm.hi, cm.maps.shape[-1], pca_lib.transform(cm.pca, ref_feats))
  return cm.maps[:, ij[:, 0], ij[:, 1]]


def threshold_weights(cred: jax.Array, threshold: float) -> jax.Array:
  """w_k = max(c_k - threshold, 0); a column with no model above the threshold: one-hot on its best model."""
  w = jnp.maximum(cred - threshold, 0.0)
  best = jax.nn.one_hot(jnp.argmax(cred, axis=0), cred.shape[0], axis=0)
  return jnp.where(w.sum(0, keepdims=True) > 0, w, best)


# -------------------------------------------------------------------------------------------- MLP

class MLPWeights(NamedTuple):
  pca: pca_lib.PCA
  params: dict         # K MLPs stacked on the leading axis (and seeds before it, when vmapped)


def mlp_init(key: jax.Array, in_dim: int, hidden: int) -> dict:
  k1, k2 = jax.random.split(key)
  return {'w1': jax.random.normal(k1, (in_dim, hidden)) * jnp.sqrt(2.0 / in_dim), 'b1': jnp.zeros((hidden,)),
          'w2': jax.random.normal(k2, (hidden,)) * jnp.sqrt(1.0 / hidden), 'b2': jnp.zeros(())}


def mlp_apply(params: dict, x: jax.Array) -> jax.Array:
  """Predicted accuracy in (0, 1) of one model at (M, P) reduced reference features -> (M,)."""
  return jax.nn.sigmoid(jax.nn.relu(x @ params['w1'] + params['b1']) @ params['w2'] + params['b2'])


def fit_mlp_params(key: jax.Array, x: jax.Array, per_ref_acc: jax.Array, hidden: int = 64, steps: int = 500,
                   lr: float = 1e-3, weight_decay: float = 1e-4) -> tuple[dict, jax.Array]:
  """K MLPs (vmapped) regressing per_ref_acc (K, R) from x (R, P); returns (params, final MSE (K,))."""
  opt = optax.adamw(lr, weight_decay=weight_decay)

  def one(k, y):
    params = mlp_init(k, x.shape[1], hidden)
    mse = lambda p: jnp.mean((mlp_apply(p, x) - y) ** 2)

    def step(carry, _):
      p, s = carry
      loss, g = jax.value_and_grad(mse)(p)
      u, s = opt.update(g, s, p)
      return (optax.apply_updates(p, u), s), loss
    (params, _), losses = jax.lax.scan(step, (params, opt.init(params)), None, length=steps)
    return params, losses[-1]

  keys = jax.random.split(key, per_ref_acc.shape[0])
  return jax.vmap(one)(keys, per_ref_acc.astype(jnp.float32))


def fit_mlp_weights(key: jax.Array, ref_feats: jax.Array, per_ref_acc: jax.Array, dim: int = 64,
                    hidden: int = 64, steps: int = 500, lr: float = 1e-3) -> MLPWeights:
  dim = min(dim, ref_feats.shape[0], ref_feats.shape[1])
  p = pca_lib.fit(ref_feats, dim, whiten=True)
  params, _ = fit_mlp_params(key, pca_lib.transform(p, ref_feats), per_ref_acc, hidden, steps, lr)
  return MLPWeights(p, params)


def mlp_weights(mw: MLPWeights, ref_feats: jax.Array) -> jax.Array:
  """(K, M) normalised weights p_k / sum_j p_j at M references."""
  x = pca_lib.transform(mw.pca, ref_feats)
  pred = jax.vmap(lambda prm: mlp_apply(prm, x))(mw.params)
  return pred / jnp.maximum(pred.sum(0, keepdims=True), 1e-12)
