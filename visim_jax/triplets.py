"""Context-sensitive (CS) models on cached features and their losses (paper 004, Sec. 4.1, Fig. 4, Sec. 5.1).

A CS model is trained on one context set (the triples of one fixed reference image, a `dist_<ref>` file).
The paper fine-tunes a backbone f; on cached features f is a trainable head on the frozen features:

  e(x)   = x W                                   embedding head, W: D -> E, no bias (semi-orthogonal init,
                                                 so an untrained head ranks like cosine on a random projection)
  logits = MLP([e(R), e(A), e(B)])               ranking block: 3E -> H -> ReLU -> 2 (class 0: A closer)
  L      = CE(logits, answer) + 0.1 * L_triplet  (Sec. 5.1: 'cross entropy + 0.1 x triplet loss')

Context-based triplet loss (Sec. 4.1):
  L_diff    = [d(e(R), e(A)) - d(e(R), e(B))] * y,   y = -1 when A is closer, +1 otherwise
  L_triplet = max(margin - L_diff, 0)

Readings (the issue fixes what the paper leaves open):
  * margin = |cls_A - cls_B| / 5 + 0.2: wider when the annotators' classes of A and B differ more; 0.2 for
    two candidates of the same class. Note the sign: with y = -1 for 'A closer', L_diff > 0 when the
    embedding agrees, so the loss asks d(R, B) - d(R, A) >= margin.
  * d is the squared L2 distance. By default (normalize=True) between L2-normalised embeddings, i.e.
    2 - 2 cos in [0, 4], so the margin has a fixed scale; normalize=False uses the raw embeddings.
  * Augmentation: every training triple's A and B are swapped (answer and classes with them) with
    probability 1/2 at each step (Sec. 5.1, 'randomly swap candidate A and B').
  * The model's 2AFC answer is the embedding distance (A closer when d(R, A) < d(R, B)): the paper's
    ensembles use the embeddings (Table 6); the ranking block's own answer is reported beside it (Table 7).

train() fits K models (one per context) in one jitted program: the K sets are padded to one length with a
mask, minibatches are drawn from each set's valid rows, and the steps are a lax.scan vmapped over models.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax


@dataclasses.dataclass(frozen=True)
class Hparams:
  embed_dim: int = 256
  hidden: int = 256
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
  return {
      'embed': {'w': jax.nn.initializers.orthogonal()(k1, (in_dim, e), jnp.float32)},
      'rank': {'w1': jax.random.normal(k2, (3 * e, h)) * jnp.sqrt(2.0 / (3 * e)), 'b1': jnp.zeros((h,)),
               'w2': jax.random.normal(k3, (h, 2)) * jnp.sqrt(1.0 / h), 'b2': jnp.zeros((2,))},
  }


def embed(params: dict, x: jax.Array) -> jax.Array:
  return x @ params['embed']['w']


def rank_logits(params: dict, er: jax.Array, ea: jax.Array, eb: jax.Array) -> jax.Array:
  """Ranking block on the concatenated embeddings: (n, 2) logits, class 0 = A closer."""
  p = params['rank']
  h = jax.nn.relu(jnp.concatenate([er, ea, eb], -1) @ p['w1'] + p['b1'])
  return h @ p['w2'] + p['b2']


def sq_dist(u: jax.Array, v: jax.Array, normalize: bool = True, eps: float = 1e-12) -> jax.Array:
  if normalize:
    u = u / jnp.maximum(jnp.linalg.norm(u, axis=-1, keepdims=True), eps)
    v = v / jnp.maximum(jnp.linalg.norm(v, axis=-1, keepdims=True), eps)
  return jnp.sum((u - v) ** 2, -1)


def margin(cls_a: jax.Array, cls_b: jax.Array, base: float = 0.2, per_class: float = 0.2) -> jax.Array:
  return jnp.abs(cls_a.astype(jnp.float32) - cls_b.astype(jnp.float32)) * per_class + base


def triplet_loss(er, ea, eb, a_closer, cls_a, cls_b, hp: Hparams = Hparams()) -> jax.Array:
  """Per-triple context-based triplet loss max(margin - L_diff, 0) (n,)."""
  y = jnp.where(a_closer, -1.0, 1.0)
  l_diff = (sq_dist(er, ea, hp.normalize) - sq_dist(er, eb, hp.normalize)) * y
  return jnp.maximum(margin(cls_a, cls_b, hp.margin_base, hp.margin_per_class) - l_diff, 0.0)


def per_triple_loss(params: dict, feats: jax.Array, batch: Batch, hp: Hparams) -> jax.Array:
  """CE of the ranking block + triplet_weight x triplet loss, per triple (n,)."""
  er, ea, eb = (embed(params, feats[i]) for i in (batch.ref, batch.a, batch.b))
  ce = optax.softmax_cross_entropy_with_integer_labels(rank_logits(params, er, ea, eb),
                                                       jnp.where(batch.a_closer, 0, 1))
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


def train(hp: Hparams, feats: jax.Array, sets: Batch) -> tuple[State, jax.Array]:
  """Trains one model per set; sets has leading axes (K, n_max) (padded, mask). Returns (state, loss (K, steps)).

  Pure and jittable (hp static). Model k uses key fold_in(PRNGKey(seed), k).
  """
  opt = optimizer(hp)
  n_max = sets.ref.shape[1]

  def one(k, s: Batch):
    key = jax.random.fold_in(jax.random.PRNGKey(hp.seed), k)
    params = init(jax.random.fold_in(key, 0), feats.shape[1], hp)
    st = State(params, opt.init(params))

    def step(st: State, t):
      kb, ks = jax.random.split(jax.random.fold_in(key, t + 1))
      if hp.batch_size > 0:
        p = s.mask / jnp.maximum(s.mask.sum(), 1.0)
        idx = jax.random.choice(kb, n_max, (hp.batch_size,), p=p)
        b = jax.tree.map(lambda x: x[idx], s)
      else:
        b = s
      if hp.swap:
        b = swap_ab(ks, b)
      loss, grads = jax.value_and_grad(loss_fn)(st.params, feats, b, hp)
      updates, opt_state = opt.update(grads, st.opt_state, st.params)
      return State(optax.apply_updates(st.params, updates), opt_state), loss

    return jax.lax.scan(step, st, jnp.arange(hp.steps))

  return jax.vmap(one)(jnp.arange(sets.ref.shape[0]), sets)


def predict(params: dict, feats: jax.Array, ref, a, b, normalize: bool = True, chunk: int | None = None):
  """(embedding votes, ranking-block votes), each (n,) int8 in {+1: A closer, -1: B closer, 0: tie}.

  The feature table is embedded once, and the ranking block's first layer applied once per image (it is
  linear in the concatenation: [e_R, e_A, e_B] W1 = e_R W1_R + e_A W1_A + e_B W1_B); the triples then gather
  rows, `chunk` triples at a time (bounded memory for millions of triples).
  """
  e = embed(params, feats)
  en = e / jnp.maximum(jnp.linalg.norm(e, axis=-1, keepdims=True), 1e-12) if normalize else e
  p = params['rank']
  d = e.shape[1]
  pr, pa, pb = e @ p['w1'][:d], e @ p['w1'][d:2 * d], e @ p['w1'][2 * d:]

  def one(t):
    r, x, y = t
    emb = jnp.sign(sq_dist(en[r], en[y], False) - sq_dist(en[r], en[x], False)).astype(jnp.int8)
    logits = jax.nn.relu(pr[r] + pa[x] + pb[y] + p['b1']) @ p['w2'] + p['b2']
    return emb, jnp.sign(logits[..., 0] - logits[..., 1]).astype(jnp.int8)

  chunk = chunk or (1024 if jax.default_backend() == 'cpu' else 16384)
  return jax.lax.map(one, (jnp.asarray(ref), jnp.asarray(a), jnp.asarray(b)), batch_size=chunk)


def predict_all(params: dict, feats: jax.Array, ref, a, b, normalize: bool = True):
  """predict() of K stacked models: ((K, n), (K, n))."""
  return jax.vmap(lambda p: predict(p, feats, ref, a, b, normalize))(params)


def pad_sets(sets: list[tuple[np.ndarray, ...]]) -> Batch:
  """Stacks K sets of (ref, a, b, a_closer, cls_a, cls_b) numpy rows, padded to the longest, with masks."""
  n = max(len(s[0]) for s in sets)
  cols = []
  for j, dtype in enumerate((np.int32, np.int32, np.int32, bool, np.int32, np.int32)):
    cols.append(np.stack([np.pad(np.asarray(s[j], dtype), (0, n - len(s[j]))) for s in sets]))
  mask = np.stack([np.pad(np.ones(len(s[0]), np.float32), (0, n - len(s[0]))) for s in sets])
  return Batch(*(jnp.asarray(c) for c in cols), jnp.asarray(mask))


def split_rows(lines: np.ndarray, train_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
  """(train, held-out) triple indices of one set, split by annotation row (a row's three triples share its
  candidates, so they stay on one side): a seeded permutation of the rows, the first round(f * R) train."""
  rows, inv = np.unique(lines, return_inverse=True)
  perm = np.random.RandomState(seed).permutation(len(rows))
  n_train = int(round(train_fraction * len(rows)))
  is_train = np.zeros(len(rows), bool)
  is_train[perm[:n_train]] = True
  t = is_train[inv.reshape(-1)]
  return np.flatnonzero(t), np.flatnonzero(~t)
