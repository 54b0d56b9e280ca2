"""The adaptation training program: every run in one jitted, vmapped program, checkpointed in chunks.

Per run r (vmapped over R runs, key r = fold_in(seed key, r)):
  split:  a seeded permutation; the first floor(train_fraction * N) pairs train, the rest test.
  PCA:    fit on the run's training vectors (left + right), or on all vectors (the reference's choice).
  init:   W ~ U(+-1/sqrt(pca_dim)); Adam(lr) state.
  epochs: lax.scan of full-batch steps (one step per epoch, loss averaged over the views: the pairs and,
          with flip augmentation, the pairs' mirrored images); after each step the test pairs are ranked
          (best partner rank over both directions, the input of aR@k).
The epochs run in chunks of `checkpoint_every` (one jitted call each, all runs at once); after each chunk
the state is saved with Orbax, so a killed run resumes at its last chunk and ends with the same numbers.
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from visim_jax import adaptation, pca as pca_lib
from visim_jax.metrics import retrieval


@dataclasses.dataclass(frozen=True)
class Hparams:
  runs: int = 20
  train_fraction: float = 0.75
  pca_dim: int = 256
  pca_fit: str = 'train'   # 'train' (each run's training split) | 'all' (reference: all vectors, test included)
  pca_whiten: bool = False
  adapt_dim: int = 1024
  sigma: float = 15.0
  lr: float = 1e-3
  epochs: int = 150
  seed: int = 0
  dtype: str = 'float32'   # matmul inputs of the training step: 'float32' | 'bfloat16' (f32 accumulation)

  def n_train(self, n: int) -> int:
    return int(np.floor(self.train_fraction * n))


class Features(NamedTuple):
  left: jax.Array                 # (N, D) pooled features
  right: jax.Array
  left_flip: jax.Array | None = None   # features of the mirrored images (augmentation)
  right_flip: jax.Array | None = None


class RunData(NamedTuple):
  """One run's projected data (leading axis R when batched)."""
  train_views: jax.Array  # (V, 2, n_train, pca_dim): views x (left, right)
  test: jax.Array         # (2, n_test, pca_dim)


class State(NamedTuple):
  params: Any
  opt_state: Any


def optimizer(hp: Hparams):
  return optax.adam(hp.lr)


def best_ranks(left: jax.Array, right: jax.Array) -> jax.Array:
  """min(rank left->right, rank right->left) of each pair under cosine similarity (pessimistic ties)."""
  lr, rl = retrieval.partner_ranks(retrieval.cosine_matrix(left, right))
  return jnp.minimum(lr, rl).astype(jnp.int32)


def splits(hp: Hparams, n: int) -> tuple[jax.Array, jax.Array]:
  """(train_idx (R, n_train), test_idx (R, n_test)): each run's seeded permutation."""
  keys = run_keys(hp)
  perms = jax.vmap(lambda k: jax.random.permutation(jax.random.fold_in(k, 0), n))(keys)
  nt = hp.n_train(n)
  return perms[:, :nt], perms[:, nt:]


def run_keys(hp: Hparams) -> jax.Array:
  base = jax.random.PRNGKey(hp.seed)
  return jax.vmap(lambda r: jax.random.fold_in(base, r))(jnp.arange(hp.runs))


def fit_pcas(hp: Hparams, feats: Features, train_idx: jax.Array) -> pca_lib.PCA:
  """One PCA per run (leading axis R)."""
  n = feats.left.shape[0]
  both = jnp.concatenate([feats.left, feats.right])
  if hp.pca_fit == 'all':
    p = pca_lib.fit(both, hp.pca_dim, whiten=hp.pca_whiten)
    return jax.tree.map(lambda a: jnp.broadcast_to(a, (hp.runs,) + a.shape), p)

  def one(tr):
    mask = jnp.zeros((n,), bool).at[tr].set(True)
    return pca_lib.fit(both, hp.pca_dim, jnp.concatenate([mask, mask]), whiten=hp.pca_whiten)
  return jax.lax.map(one, train_idx)  # sequential over runs: bounded memory for large D


def project(feats: Features, pcas: pca_lib.PCA, train_idx, test_idx) -> RunData:
  def one(p, tr, te):
    t = lambda x: pca_lib.transform(p, x)
    views = [jnp.stack([t(feats.left[tr]), t(feats.right[tr])])]
    if feats.left_flip is not None:
      views.append(jnp.stack([t(feats.left_flip[tr]), t(feats.right_flip[tr])]))
    return RunData(jnp.stack(views), jnp.stack([t(feats.left[te]), t(feats.right[te])]))
  return jax.vmap(one)(pcas, train_idx, test_idx)


def baselines(feats: Features, data: RunData, test_idx) -> dict[str, jax.Array]:
  """Best-partner ranks (R, n_test) of the raw concatenated features and of the PCA features."""
  raw = jax.vmap(lambda te: best_ranks(feats.left[te], feats.right[te]))(test_idx)
  pca = jax.vmap(lambda d: best_ranks(d[0], d[1]))(data.test)
  return {'raw': raw, 'pca': pca}


def explained_variance(feats: Features, pcas: pca_lib.PCA, train_idx: jax.Array) -> jax.Array:
  """(R,) share of the training vectors' variance each run's PCA keeps."""
  n = feats.left.shape[0]
  both = jnp.concatenate([feats.left, feats.right])

  def one(p, tr):
    mask = jnp.zeros((n,), bool).at[tr].set(True)
    return pca_lib.explained_variance_ratio(p, both, jnp.concatenate([mask, mask]))
  return jax.vmap(one)(pcas, train_idx)


def init_state(hp: Hparams) -> State:
  def one(k):
    params = adaptation.init(jax.random.fold_in(k, 1), hp.pca_dim, hp.adapt_dim)
    return State(params, optimizer(hp).init(params))
  return jax.vmap(one)(run_keys(hp))


def view_loss(params, train_views: jax.Array, sigma: float, dtype=jnp.float32) -> jax.Array:
  losses = jax.vmap(lambda v: adaptation.loss_fn(params, v[0], v[1], sigma, dtype))(train_views)
  return losses.mean()


def train_chunk(hp: Hparams, state: State, data: RunData, n_epochs: int):
  """n_epochs full-batch steps of every run; returns (state, loss (R, E), test ranks (R, E, n_test))."""
  opt = optimizer(hp)

  def one_run(st: State, d: RunData):
    def epoch(st: State, _):
      loss, grads = jax.value_and_grad(view_loss)(st.params, d.train_views, hp.sigma, jnp.dtype(hp.dtype))
      updates, opt_state = opt.update(grads, st.opt_state, st.params)
      params = optax.apply_updates(st.params, updates)
      ranks = best_ranks(adaptation.adapt(params, d.test[0]), adaptation.adapt(params, d.test[1]))
      return State(params, opt_state), (loss, ranks)
    return jax.lax.scan(epoch, st, None, length=n_epochs)

  state, (loss, ranks) = jax.vmap(one_run)(state, data)
  return state, loss, ranks


def recall_from_ranks(ranks: jax.Array | np.ndarray, ks: Sequence[int]) -> np.ndarray:
  """aR@k for each k from best-partner ranks (..., n_test) -> (..., len(ks))."""
  ranks = np.asarray(ranks)
  return np.stack([(ranks <= k).mean(axis=-1) for k in ks], axis=-1)
