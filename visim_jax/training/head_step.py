"""Training a head on frozen features from triplets: the optimiser, the sharded step program, the evaluation.

One step (all on the devices): rows (B,) of the triplet table -> triplets (B, 3) -> features (B, 3, D) -> head ->
embeddings (B, 3, E) -> pair similarities [s_01, s_02, s_12] -> odd_one_out loss (mean over the batch) -> gradient ->
optimiser. `chunk_program(mesh)` returns a jitted program running n such steps (lax.scan) whose batch axis is split
over every device of the 1-D mesh (NamedSharding P(None, 'batch') on the (n, B) rows); the feature table, the triplet
table, its targets and the parameters are replicated, so the only cross-device traffic is the gradient's all-reduce
that XLA inserts for the batch mean. A step's batch depends on (seed, step) only (data/triplet_index.Stream), hence 1 and 8
devices, or a resumed and an uninterrupted run, compute the same numbers (up to the order of float sums).

Optimiser (`optimizer(hp)`): AligNet's configs/siglip.py chain, scale_by_adam -> decay_to_init(weight_decay) ->
scale_by_learning_rate(warm-up + cosine decay): the update is -lr_t (adam_t + weight_decay (params - params_0)),
i.e. weights decayed towards their initial values, not towards zero. schedule='constant' keeps lr after the warm-up.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from visim_jax.core import cpu_kernels
from visim_jax.models import heads
from visim_jax.losses import odd_one_out

SCHEDULES = ('cosine', 'constant')


@dataclasses.dataclass(frozen=True)
class Hparams:
  head: str = 'affine'
  size: int = 1024            # embedding size ('adapter', 'embed', 'affine') or hidden size ('mlp')
  loss: str = 'jsd'           # odd_one_out.LOSSES
  similarity: str = 'dot'     # odd_one_out.SIMILARITIES
  tau: float = 100.0          # student temperature: q = softmax(s / tau)
  target_tau: float = 1.0     # teacher temperature: p = softmax(t / target_tau)
  margin: float = 0.05        # 'hinge'
  lr: float = 3e-5
  warmup_steps: int = 5000
  schedule: str = 'cosine'
  steps: int = 100_000
  weight_decay: float = 1.0   # towards the initial weights
  b1: float = 0.9
  b2: float = 0.999
  batch_size: int = 512
  seed: int = 0
  ties: str = 'lt'            # accuracy: a tie is wrong (AligNet's TripletAccuracy)


class DecayToInitState(NamedTuple):
  init: optax.Params


def decay_to_init(weight_decay: float) -> optax.GradientTransformation:
  """updates + weight_decay (params - params_at_init) (kauldron's decay_to_init)."""
  def init_fn(params):
    return DecayToInitState(jax.tree.map(jnp.asarray, params))

  def update_fn(updates, state, params):
    if weight_decay == 0.0:
      return updates, state
    return jax.tree.map(lambda u, p, p0: u + weight_decay * (p - p0), updates, params, state.init), state
  return optax.GradientTransformation(init_fn, update_fn)


def schedule(hp: Hparams):
  if hp.schedule == 'cosine':
    return optax.warmup_cosine_decay_schedule(0.0, hp.lr, hp.warmup_steps, max(hp.steps, hp.warmup_steps + 1))
  return optax.join_schedules([optax.linear_schedule(0.0, hp.lr, max(hp.warmup_steps, 1)),
                               optax.constant_schedule(hp.lr)], [hp.warmup_steps])


def optimizer(hp: Hparams) -> optax.GradientTransformation:
  return optax.chain(optax.scale_by_adam(hp.b1, hp.b2), decay_to_init(hp.weight_decay),
                     optax.scale_by_learning_rate(schedule(hp)))


class State(NamedTuple):
  params: dict
  opt_state: optax.OptState


def init_state(hp: Hparams, in_dim: int) -> State:
  params = heads.init(hp.head, jax.random.fold_in(jax.random.PRNGKey(hp.seed), 0), in_dim, hp.size)
  return State(params, optimizer(hp).init(params))


class Data(NamedTuple):
  """What the step program reads: the feature table (M, D), the triplet table (N, 3) and its targets."""
  feats: jax.Array
  triplets: jax.Array
  target: jax.Array


def batch_loss(hp: Hparams, params: dict, feats, tri, y) -> jax.Array:
  e = heads.apply(hp.head, params, feats[tri])
  s = odd_one_out.pair_similarities(e, hp.similarity)
  return odd_one_out.per_triplet(hp.loss, s, y, hp.tau, hp.target_tau, hp.margin).mean()


def chunk(hp: Hparams, state: State, data: Data, rows: jax.Array, batch_sharding=None) -> tuple[State, jax.Array]:
  """len(rows) steps; rows (n, B) int32 triplet rows; returns (state, loss (n,))."""
  opt = optimizer(hp)

  def step(st: State, r):
    if batch_sharding is not None:
      r = jax.lax.with_sharding_constraint(r, batch_sharding)
    loss, grads = jax.value_and_grad(lambda p: batch_loss(hp, p, data.feats, data.triplets[r], data.target[r]))(
        st.params)
    updates, opt_state = opt.update(grads, st.opt_state, st.params)
    return State(optax.apply_updates(st.params, updates), opt_state), loss
  return jax.lax.scan(step, state, rows)


@functools.lru_cache(maxsize=8)
def chunk_program(hp: Hparams, mesh: Mesh | None = None):
  """chunk(hp, ...) jitted; with a mesh the batch axis of rows is split over its devices, the rest replicated.
  Cached by (hp, mesh): a resumed or repeated run in one process reuses the compiled program."""
  if mesh is None:
    return cpu_kernels.jit(functools.partial(chunk, hp))
  axis = mesh.axis_names[0]
  rep = NamedSharding(mesh, P())
  return cpu_kernels.jit(functools.partial(chunk, hp, batch_sharding=NamedSharding(mesh, P(axis))),
                 out_shardings=(rep, rep))


def rows_sharding(mesh: Mesh) -> NamedSharding:
  """The (n, B) rows of a chunk: B split over the mesh."""
  return NamedSharding(mesh, P(None, mesh.axis_names[0]))


@functools.partial(cpu_kernels.jit, static_argnums=(0, 1))
def evaluate(hp: Hparams, head: str, params: dict, feats, triplets, target) -> dict:
  """Held-out numbers of one head ('identity' = the frozen features): odd-one-out accuracy (against the odd column:
  the teacher's argmax for similarities, the given odd, column 2 vs 1 by the judge for 2AFC) and the loss. Every
  image is embedded once; the triplets then gather rows."""
  e = heads.apply(head, params, feats)
  s = odd_one_out.pair_similarities(e[triplets], hp.similarity)
  if hp.loss == 'hinge':
    acc = odd_one_out.twoafc_correct(s, target).mean()
  else:
    odd = odd_one_out.teacher_odd(target) if target.ndim == 2 else target
    acc = odd_one_out.correct(s, odd, hp.ties).mean()
  loss = odd_one_out.per_triplet(hp.loss, s, target, hp.tau, hp.target_tau, hp.margin).mean()
  return {'accuracy': acc, 'loss': loss}
