"""Context-sensitive (CS) models on cached features and their losses (paper 004, Sec. 4.1, Fig. 4, Sec. 5.1).

A CS model is trained on one context set (the triples of one fixed reference image, a `dist_<ref>` file); the
global model of Table 5 is the same model trained on the union of the eight sets. The paper fine-tunes a
backbone f; on cached features f is a trainable head on the frozen features:

  e(x)       = x W                              embedding head, W: D -> E, no bias (semi-orthogonal init, so an
                                                untrained head ranks like cosine on a random projection)
  h(R, A, B) = MLP([e(R), e(A), e(B)])          ranking block: 3E -> H -> ReLU -> 1 (H = 0: one linear layer,
                                                the authors' `nn.Linear(3 * E, 2)` up to the logit difference)
  s(R, A, B) = h(R, A, B) - h(R, B, A)          the ranking block's answer, antisymmetric by construction:
                                                s(R, B, A) = -s(R, A, B), so no position of A or B is favoured
  L          = CE([s, 0], answer) + 0.1 * L_triplet        (Sec. 5.1: 'cross entropy + 0.1 x triplet loss')

Context-based triplet loss (Sec. 4.1):
  L_diff    = [d(e(R), e(A)) - d(e(R), e(B))] * y,   y = -1 when A is closer, +1 otherwise
  L_triplet = max(margin - L_diff, 0),   margin = |cls_A - cls_B| / 5 + 0.2   (authors' triplet_loss.py)

Readings:
  * d in the loss is the squared L2 distance (authors' `compute_squared_distance`); by default (normalize=True)
    between L2-normalised embeddings, i.e. 2 - 2 cos in [0, 4], so the margin has a fixed scale.
  * Augmentation: every training triple's A and B are swapped (answer and classes with them) with
    probability 1/2 at each step (Sec. 5.1 'randomly swap candidate A and B'; the authors' loader trains on
    both orientations, `concatenate_flipped`).
  * The model's embedding answer and the distances the ensembles fuse are cosine distances 1 - cos(e(R), e(X))
    (authors' dist_cluster.py `cosine_distances`); the ranking block's answer is sign(s) (Table 7).

train_chunk() advances K models (one per set) by n steps in one jitted program: the K sets are padded to one
length with a mask, minibatches are drawn from each set's valid rows, and the steps are a lax.scan vmapped over
models. Step t's randomness is fold_in(model key, t), so chunked training equals one long call.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from visim_jax.core import cpu_kernels
from visim_jax.core.ops import l2_normalize


@dataclasses.dataclass(frozen=True)
class Hparams:
  embed_dim: int = 256
  hidden: int = 256               # ranking block hidden units; 0: one linear layer (the authors')
  triplet_weight: float = 0.1
  margin_base: float = 0.2
  margin_per_class: float = 0.2   # = 1/5
  normalize: bool = True
  lr: float = 1e-3
  weight_decay: float = 1e-4
  steps: int = 500
  batch_size: int = 64            # 0: full batch (every valid row of each set, every step)
  swap: bool = True
  seed: int = 0


class Batch(NamedTuple):
  """Triples as rows of a feature table (leading axes: models K, then rows n when padded)."""
  ref: jax.Array       # int32
  a: jax.Array
  b: jax.Array
  a_closer: jax.Array  # bool
  cls_a: jax.Array     # int (1..5; 0 unknown)
  cls_b: jax.Array
  mask: jax.Array      # float32: 1 for a real row, 0 for padding


def init(key: jax.Array, in_dim: int, hp: Hparams) -> dict:
  k1, k2, k3 = jax.random.split(key, 3)
  e, h = hp.embed_dim, hp.hidden
  if h == 0:
    rank = {'w1': jax.random.normal(k2, (3 * e, 1)) * jnp.sqrt(1.0 / (3 * e)), 'b1': jnp.zeros((1,))}
  else:
    rank = {'w1': jax.random.normal(k2, (3 * e, h)) * jnp.sqrt(2.0 / (3 * e)), 'b1': jnp.zeros((h,)),
            'w2': jax.random.normal(k3, (h,)) * jnp.sqrt(1.0 / h)}
  return {'embed': {'w': jax.nn.initializers.orthogonal()(k1, (in_dim, e), jnp.float32)}, 'rank': rank}


def embed(params: dict, x: jax.Array) -> jax.Array:
  return x @ params['embed']['w']


def _rank_out(p: dict, pre: jax.Array) -> jax.Array:
  """Ranking block output h from its first-layer pre-activation (n, H) -> (n,)."""
  return pre[..., 0] if 'w2' not in p else jax.nn.relu(pre) @ p['w2']


def rank_score(params: dict, er: jax.Array, ea: jax.Array, eb: jax.Array) -> jax.Array:
  """s = h(R, A, B) - h(R, B, A) (n,): > 0 when the ranking block answers 'A is closer'."""
  p = params['rank']
  h = lambda x, y: _rank_out(p, jnp.concatenate([er, x, y], -1) @ p['w1'] + p['b1'])
  return h(ea, eb) - h(eb, ea)


def sq_dist(u: jax.Array, v: jax.Array, normalize: bool = True) -> jax.Array:
  if normalize:
    u, v = l2_normalize(u), l2_normalize(v)
  return jnp.sum((u - v) ** 2, -1)


def margin(cls_a: jax.Array, cls_b: jax.Array, base: float = 0.2, per_class: float = 0.2) -> jax.Array:
  return jnp.abs(cls_a.astype(jnp.float32) - cls_b.astype(jnp.float32)) * per_class + base


def triplet_loss(er, ea, eb, a_closer, cls_a, cls_b, hp: Hparams = Hparams()) -> jax.Array:
  """Per-triple context-based triplet loss max(margin - L_diff, 0) (n,)."""
  y = jnp.where(a_closer, -1.0, 1.0)
  l_diff = (sq_dist(er, ea, hp.normalize) - sq_dist(er, eb, hp.normalize)) * y
  return jnp.maximum(margin(cls_a, cls_b, hp.margin_base, hp.margin_per_class) - l_diff, 0.0)


def per_triple_loss(params: dict, feats: jax.Array, batch: Batch, hp: Hparams) -> jax.Array:
  """CE of the ranking block's answer + triplet_weight x triplet loss, per triple (n,)."""
  er, ea, eb = (embed(params, feats[i]) for i in (batch.ref, batch.a, batch.b))
  s = rank_score(params, er, ea, eb)
  ce = jax.nn.softplus(jnp.where(batch.a_closer, -s, s))     # = CE of logits [s, 0] (class 0: A closer)
  return ce + hp.triplet_weight * triplet_loss(er, ea, eb, batch.a_closer, batch.cls_a, batch.cls_b, hp)


def loss_fn(params: dict, feats: jax.Array, batch: Batch, hp: Hparams) -> jax.Array:
  """Masked mean of per_triple_loss (padding rows weigh nothing)."""
  w = batch.mask.astype(jnp.float32)
  return jnp.sum(per_triple_loss(params, feats, batch, hp) * w) / jnp.maximum(w.sum(), 1.0)


def swap_ab(key: jax.Array, batch: Batch) -> Batch:
  """Swaps A and B (with their classes, flipping the answer) in a random half of the rows."""
  s = jax.random.bernoulli(key, 0.5, batch.ref.shape)
  pick = lambda x, y: jnp.where(s, y, x)
  return batch._replace(a=pick(batch.a, batch.b), b=pick(batch.b, batch.a), a_closer=batch.a_closer ^ s,
                        cls_a=pick(batch.cls_a, batch.cls_b), cls_b=pick(batch.cls_b, batch.cls_a))


def optimizer(hp: Hparams):
  return optax.adamw(hp.lr, weight_decay=hp.weight_decay)


class State(NamedTuple):
  params: dict
  opt_state: optax.OptState


def _key(hp: Hparams, k) -> jax.Array:
  return jax.random.fold_in(jax.random.PRNGKey(hp.seed), k)


@functools.partial(cpu_kernels.jit, static_argnums=(0, 1, 2))
def init_state(hp: Hparams, in_dim: int, k: int) -> State:
  """K models' initial State (stacked); model k is initialised from fold_in(fold_in(PRNGKey(seed), k), 0)."""
  def one(i):
    params = init(jax.random.fold_in(_key(hp, i), 0), in_dim, hp)
    return State(params, optimizer(hp).init(params))
  return jax.vmap(one)(jnp.arange(k))


def train_chunk(hp: Hparams, feats: jax.Array, sets: Batch, state: State, step0, n: int) -> tuple[State, jax.Array]:
  """Steps step0+1 .. step0+n of the K models (sets: leading axes (K, n_max), padded, masked).

  Pure and jittable (hp and n static). Returns (state, loss (K, n)).
  """
  opt = optimizer(hp)
  n_max = sets.ref.shape[1]

  def one(k, st: State, s: Batch):
    key = _key(hp, k)

    def step(st: State, t):
      kb, ks = jax.random.split(jax.random.fold_in(key, t + 1))
      if hp.batch_size > 0:
        p = s.mask / jnp.maximum(s.mask.sum(), 1.0)
        b = jax.tree.map(lambda x: x[jax.random.choice(kb, n_max, (hp.batch_size,), p=p)], s)
      else:
        b = s
      if hp.swap:
        b = swap_ab(ks, b)
      loss, grads = jax.value_and_grad(loss_fn)(st.params, feats, b, hp)
      updates, opt_state = opt.update(grads, st.opt_state, st.params)
      return State(optax.apply_updates(st.params, updates), opt_state), loss

    return jax.lax.scan(step, st, step0 + jnp.arange(n))

  return jax.vmap(one)(jnp.arange(sets.ref.shape[0]), state, sets)


def train(hp: Hparams, feats: jax.Array, sets: Batch) -> tuple[State, jax.Array]:
  """All hp.steps steps in one call: (state, loss (K, steps)). Equals chained train_chunk calls."""
  return train_chunk(hp, feats, sets, init_state(hp, feats.shape[1], sets.ref.shape[0]), 0, hp.steps)


def predict(params: dict, feats: jax.Array, ref, a, b, chunk: int | None = None):
  """(d(R, A), d(R, B), s(R, A, B)), each (n,) float32: cosine distances 1 - cos of the embeddings and the
  antisymmetric ranking-block score (> 0: A closer).

  The feature table is embedded once, and the ranking block's first layer applied once per image (it is linear
  in the concatenation: [e_R, e_A, e_B] W1 = e_R W1_R + e_A W1_A + e_B W1_B); the triples then gather rows,
  `chunk` triples at a time (bounded memory for millions of triples).
  """
  p = params['rank']
  e = embed(params, feats)
  en = l2_normalize(e)
  d = e.shape[1]
  pr, pa, pb = e @ p['w1'][:d], e @ p['w1'][d:2 * d], e @ p['w1'][2 * d:]

  def one(t):
    r, x, y = t
    h = lambda u, v: _rank_out(p, pr[r] + pa[u] + pb[v] + p['b1'])
    return 1.0 - jnp.sum(en[r] * en[x], -1), 1.0 - jnp.sum(en[r] * en[y], -1), h(x, y) - h(y, x)

  chunk = chunk or (1024 if jax.default_backend() == 'cpu' else 16384)
  return jax.lax.map(one, (jnp.asarray(ref), jnp.asarray(a), jnp.asarray(b)), batch_size=chunk)


def predict_all(params: dict, feats: jax.Array, ref, a, b):
  """predict() of K stacked models: three (K, n) arrays."""
  return jax.vmap(lambda p: predict(p, feats, ref, a, b))(params)


def pad_sets(sets: list[tuple[np.ndarray, ...]]) -> Batch:
  """Stacks K sets of (ref, a, b, a_closer, cls_a, cls_b) numpy rows, padded to the longest, with masks."""
  n = max(len(s[0]) for s in sets)
  cols = []
  for j, dtype in enumerate((np.int32, np.int32, np.int32, bool, np.int32, np.int32)):
    cols.append(np.stack([np.pad(np.asarray(s[j], dtype), (0, n - len(s[j]))) for s in sets]))
  mask = np.stack([np.pad(np.ones(len(s[0]), np.float32), (0, n - len(s[0]))) for s in sets])
  return Batch(*(jnp.asarray(c) for c in cols), jnp.asarray(mask))
