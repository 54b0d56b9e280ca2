"""Heads learned from 2AFC human judgements over frozen features (nights_adapt), with DreamSim's hinge loss (losses/hinge.py).

DreamSim (training/train.py, util/train_utils.py HingeLoss), for a batch of triplets (ref, p0, p1) with target
j = the fraction of humans preferring p1 (NIGHTS right_vote):
  logit = d0 - d1,   y = 2 round(j) - 1   (round half to even, as torch.round)
  L     = sum_i max(0, margin - logit_i y_i) / batch            margin 0.05 (configs/*.yaml; argparse: 0.01)
  d     = 1 - cos(e(ref), e(p))                                  (PerceptualModel.forward: cosine distance)
  Adam(lr 3e-4, betas (0.5, 0.999), weight_decay 0 as an L2 term added to the gradient), batch 512, 20 epochs.

The heads trained with it (e = embedding of one image's frozen pooled features x):
  'adapter'  paper 001: e = ReLU(W PCA(x)) (adaptation.adapt over pca.transform; PCA fit on the train images);
             exported as adapter.npz, the format training/adapter_file.py / search / `adapter:<workdir>` read.
  'triplet'  paper 004's embedding head: e = x W (context.embed, semi-orthogonal init); its ranking block and
             CE + triplet loss are not used here (the 2AFC answer is the cosine-distance one, as in
             context.predict).
DreamSim trains an MLP with a residual connection on ViT features (or LoRA); these heads are ours.

train_chunk() advances S seeds by n epochs in one jitted program (vmapped over seeds, a lax.scan over epochs
and, inside, over minibatches of a seeded permutation: fold_in(fold_in(PRNGKey(seed), s), epoch)). After each
epoch it scores NIGHTS val and test (metrics.human.twoafc_score) and keeps the parameters of the epoch chosen
by `select` ('val_score': best val 2AFC score, earliest on ties; 'val_loss': lowest val hinge loss, DreamSim's
checkpoint monitor; 'last'), so a chunked (resumed) run equals one long call.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from visim_jax.core import cpu_kernels
from visim_jax.models import adaptation, context
from visim_jax.metrics.human import twoafc_score
from visim_jax.core.ops import l2_normalize
from visim_jax.losses.hinge import hinge_loss

MODELS = ('adapter', 'triplet')
SELECT = ('val_score', 'val_loss', 'last')


@dataclasses.dataclass(frozen=True)
class Hparams:
  model: str = 'adapter'
  adapt_dim: int = 1024       # 'adapter': W's output size
  embed_dim: int = 256        # 'triplet': W's output size
  margin: float = 0.05
  lr: float = 3e-4
  b1: float = 0.5
  b2: float = 0.999
  weight_decay: float = 0.0
  batch_size: int = 512
  epochs: int = 20
  seeds: int = 3
  seed: int = 0
  select: str = 'val_score'


class Split(NamedTuple):
  """Triplets as rows of the input table: ref, p0, p1 (int32) and judge (float32)."""
  ref: jax.Array
  p0: jax.Array
  p1: jax.Array
  judge: jax.Array


class State(NamedTuple):
  params: dict
  opt_state: optax.OptState
  best: dict                  # the parameters of the selected epoch so far
  best_value: jax.Array       # its criterion (higher is better: val score, or -val loss)
  best_epoch: jax.Array       # int32, 0 = before training


def init(key: jax.Array, hp: Hparams, in_dim: int) -> dict:
  if hp.model == 'adapter':
    return adaptation.init(key, in_dim, hp.adapt_dim)
  return context.init(key, in_dim, dataclasses.replace(context.Hparams(), embed_dim=hp.embed_dim))['embed']


def embed(hp: Hparams, params: dict, x: jax.Array) -> jax.Array:
  if hp.model == 'adapter':
    return adaptation.adapt(params, x)
  return context.embed({'embed': params}, x)


def distances(hp: Hparams, params: dict, x: jax.Array, s: Split) -> tuple[jax.Array, jax.Array]:
  """(d(ref, p0), d(ref, p1)): cosine distances of the embeddings, every image embedded once."""
  e = l2_normalize(embed(hp, params, x))
  return 1.0 - jnp.sum(e[s.ref] * e[s.p0], -1), 1.0 - jnp.sum(e[s.ref] * e[s.p1], -1)


def optimizer(hp: Hparams):
  """torch.optim.Adam(lr, betas, weight_decay): the decay is an L2 term added to the gradient."""
  return optax.chain(optax.add_decayed_weights(hp.weight_decay), optax.adam(hp.lr, hp.b1, hp.b2, eps=1e-8))


def _key(hp: Hparams, s) -> jax.Array:
  return jax.random.fold_in(jax.random.PRNGKey(hp.seed), s)


@functools.partial(cpu_kernels.jit, static_argnums=(0, 1))
def init_state(hp: Hparams, in_dim: int) -> State:
  """The S seeds' initial State (stacked); seed s starts from fold_in(fold_in(PRNGKey(seed), s), 0)."""
  if hp.model not in MODELS:
    raise ValueError(f'config.model: expected one of {MODELS}, got {hp.model!r}')
  if hp.select not in SELECT:
    raise ValueError(f'config.select_epoch: expected one of {SELECT}, got {hp.select!r}')

  def one(s):
    params = init(jax.random.fold_in(_key(hp, s), 0), hp, in_dim)
    return State(params, optimizer(hp).init(params), params, jnp.float32(-jnp.inf), jnp.int32(0))
  return jax.vmap(one)(jnp.arange(hp.seeds))


class EpochLog(NamedTuple):
  train_loss: jax.Array   # (S, n) mean minibatch loss of each epoch
  val_score: jax.Array    # (S, n) NIGHTS val 2AFC score after each epoch
  val_loss: jax.Array
  test_score: jax.Array


@functools.partial(cpu_kernels.jit, static_argnums=(0, 7))
def train_chunk(hp: Hparams, x: jax.Array, train: Split, val: Split, test: Split, state: State, e0,
                n: int) -> tuple[State, EpochLog]:
  """Epochs e0+1 .. e0+n of the S seeds (jitted; hp and n static: one compilation per chunk length)."""
  opt = optimizer(hp)
  t = train.ref.shape[0]
  bs = max(1, min(hp.batch_size, t))
  nb = -(-t // bs)

  def one(s, st: State):
    def epoch(st: State, e):
      perm = jax.random.permutation(jax.random.fold_in(_key(hp, s), e + 1), t)
      idx = jnp.pad(perm, (0, nb * bs - t)).reshape(nb, bs)
      mask = (jnp.arange(nb * bs) < t).reshape(nb, bs)

      def step(carry, b):
        params, opt_state = carry
        i, m = b
        batch = Split(*(a[i] for a in train))

        def loss_fn(p):
          d0, d1 = distances(hp, p, x, batch)
          return hinge_loss(d0, d1, batch.judge, hp.margin, m)
        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), loss

      (params, opt_state), losses = jax.lax.scan(step, (st.params, st.opt_state), (idx, mask))
      vd0, vd1 = distances(hp, params, x, val)
      v_score, v_loss = twoafc_score(vd0, vd1, val.judge), hinge_loss(vd0, vd1, val.judge, hp.margin)
      td0, td1 = distances(hp, params, x, test)
      value = {'val_score': v_score, 'val_loss': -v_loss, 'last': jnp.float32(0.0)}[hp.select]
      better = (value > st.best_value) | (hp.select == 'last')
      best = jax.tree.map(lambda a, b: jnp.where(better, a, b), params, st.best)
      new = State(params, opt_state, best, jnp.where(better, value, st.best_value),
                  jnp.where(better, e + 1, st.best_epoch).astype(jnp.int32))
      return new, (losses.mean(), v_score, v_loss, twoafc_score(td0, td1, test.judge))

    return jax.lax.scan(epoch, st, e0 + jnp.arange(n))

  state, logs = jax.vmap(one)(jnp.arange(hp.seeds), state)
  return state, EpochLog(*logs)


def train(hp: Hparams, x, train_split: Split, val: Split, test: Split) -> tuple[State, EpochLog]:
  """All hp.epochs epochs in one call; equals chained train_chunk calls."""
  return train_chunk(hp, x, train_split, val, test, init_state(hp, x.shape[1]), 0, hp.epochs)
