"""Tuning the tower itself on images: the pure training step of DreamSim's LoRA and AligNet's full fine-tuning.

One step: images (B, 3, H, W, C) as the backbone's preprocess loads them (uint8, or float32 on the 0..255 scale) ->
the tower's embedding e (B, 3, D) -> the loss of losses/ -> gradient of the trainable tree -> optimiser. What trains
(`Hparams.tune`): 'lora' the LoRA tree of models/lora.py on the kernels `lora.targets` selects (DreamSim), 'full' every
`params` leaf of the backbone (AligNet; other collections such as BatchNorm statistics stay as they are), 'frozen'
nothing of the tower (only the head, if any). A head of models/heads.py on the tower's feature trains with it in every
mode ('affine' = AligNet's `triplet_head`, Dense(1024) on the ViT's pre-logits; 'identity' = none: DreamSim).

Losses (`Hparams.loss`, losses/odd_one_out.per_triplet on the pair similarities [s_01, s_02, s_12]):
- 'hinge' (DreamSim, 2AFC: images (ref, p0, p1), target j = the fraction of humans preferring p1): d = 1 - cosine of
  the tower's features (DreamSim's training PerceptualModel has normalize_embeds=False: no centring; the released
  `dreamsim()` centres), logit = d0 - d1, y = 2 round(j) - 1 (round half to even: 0.5 -> -1, torch.round),
  mean of max(0, margin - logit y); train accuracy DreamSim's ((j >= 0.5) == (d1 < d0)).
  DreamSim embeds the reference twice per step (model(ref, p0), model(ref, p1)): with LoRA dropout on, the two
  passes draw independent masks; `hinge_ref='per_pair'` (default) does the same (4 images per triplet, only when
  dropout is on; otherwise 3, the same numbers), 'shared' embeds it once.
- 'jsd' / 'kl' / 'hard' (AligNet: triplets with teacher similarities (B, 3) or the odd index (B,)), with
  `similarity` 'dot' (AligNet normalize=False) or 'cosine' and temperatures tau / target_tau.

Optimiser: Adam(lr, b1, b2, eps) -> [decay towards the initial weights, weight_decay (training/head_step.py's
decay_to_init: AligNet's kauldron chain)] -> learning rate schedule (head_step.schedule: 'constant' after a linear
warm-up, or warm-up + cosine). DreamSim: lr 3e-4, betas (0.5, 0.999), no decay, constant. AligNet: Adam defaults
(0.9, 0.999), decay_to_init 1.0, warm-up 5k + cosine to 100k, peak 3e-5.
`adam_updates`: DreamSim's configure_optimizers lists every LoRA tensor twice in one torch param group, so torch's Adam
updates it twice per step with the same gradient. 'single' (default: the Adam the paper states; torch warns that the
duplicate listing "will cause an error"), 'twice' (torch's for-loop Adam, its CPU default: two sequential updates,
the step count advancing by one each), 'twice_foreach' (torch's foreach Adam, its CUDA default and so what a GPU run
of DreamSim's code does: count += 2; m = b1^2 m + (1 - b1^2) g; v = b2^2 v + 2 (1 - b2) g^2; the parameter moves
twice by lr mhat / (sqrt(vhat) + eps) with the bias corrections at the new count; measured on torch 2.13 CPU with
foreach=True).

Options: `compute_dtype='bfloat16'` runs the forward in bfloat16 (float parameters cast inside the differentiated
function, so the master weights, gradients and optimiser state stay float32; features and loss in float32);
`remat=True` rematerialises every block (backbones/base.remat_blocks: flax nn.remat around each block of the ViT and
CNN families); `accum_steps=k` splits the batch into k equal micro-batches whose mean gradient makes one update (equal
to the whole batch up to float sums; with dropout each micro-batch draws its own masks).

Sharding: `step_program(hp, tower, mesh)` with core/sharding.train_mesh(fsdp=...): the batch axis over every device
of every host (('data', 'fsdp')), the trainable tree, the optimiser state and the frozen weights sharded on the fsdp
axis (core/sharding.param_sharding: each leaf's largest dimension that the fsdp size divides); XLA inserts the
gathers and the gradient reductions. A step's numbers depend on (state, batch) only: 1 device, 8 devices or 2
processes give the same parameters up to the order of float sums (tests/test_tower_sharding.py).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from visim_jax.backbones import base as backbone_base
from visim_jax.core import cpu_kernels
from visim_jax.core import ops
from visim_jax.core import sharding as sharding_lib
from visim_jax.core.errors import UserError
from visim_jax.losses import odd_one_out
from visim_jax.metrics import attacks
from visim_jax.models import heads
from visim_jax.models import lora as lora_lib
from visim_jax.training import head_step

TUNES = ('frozen', 'lora', 'full')
ADAM_UPDATES = ('single', 'twice', 'twice_foreach')
DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}
HINGE_REF = ('per_pair', 'shared')


@dataclasses.dataclass(frozen=True)
class Hparams:
  tune: str = 'lora'                         # TUNES
  lora: lora_lib.Config = lora_lib.Config()  # r, alpha, dropout, targets (DreamSim ensemble: 16, 8, 0.3, ('qkv',))
  loss: str = 'hinge'                        # odd_one_out.LOSSES
  similarity: str = 'cosine'                 # odd_one_out.SIMILARITIES ('hinge' needs 'cosine': d = 1 - cos)
  tau: float = 1.0
  target_tau: float = 1.0
  margin: float = 0.05
  lr: float = 3e-4
  b1: float = 0.5
  b2: float = 0.999
  eps: float = 1e-8
  adam_updates: str = 'single'               # ADAM_UPDATES
  weight_decay: float = 0.0                  # towards the initial (pretrained) weights; AligNet 1.0
  schedule: str = 'constant'                 # head_step.SCHEDULES
  warmup_steps: int = 0
  steps: int = 1000
  compute_dtype: str = 'float32'             # DTYPES
  remat: bool = False
  accum_steps: int = 1
  hinge_ref: str = 'per_pair'                # HINGE_REF
  seed: int = 0
  adv_norm: str = 'linf'                     # adversarial references (hinge only; docs/robustness.md): 'linf' | 'l2'
  adv_eps: float = 0.0                       # their budget on [0, 1] pixels; 0: clean training
  adv_steps: int = 10                        # APGD steps per training step

  @property
  def two_refs(self) -> bool:
    """Whether the reference goes through the tower once per pair (4 images a triplet): DreamSim's hinge with
    LoRA dropout on draws two masks for it (`hinge_ref='per_pair'`); otherwise 3 images, the same numbers."""
    return self.loss == 'hinge' and self.hinge_ref == 'per_pair' and self.tune == 'lora' and self.lora.dropout > 0

  def check(self) -> 'Hparams':
    """Refuses what the step cannot do, naming the field."""
    for field, allowed in (('tune', TUNES), ('adam_updates', ADAM_UPDATES), ('compute_dtype', tuple(DTYPES)),
                           ('hinge_ref', HINGE_REF), ('loss', odd_one_out.LOSSES),
                           ('similarity', odd_one_out.SIMILARITIES), ('schedule', head_step.SCHEDULES)):
      if getattr(self, field) not in allowed:
        raise UserError(f'{field}: {getattr(self, field)!r}; expected one of {allowed}')
    if self.loss == 'hinge' and self.similarity != 'cosine':
      raise UserError("similarity: 'hinge' trains on DreamSim's distance 1 - cosine; set similarity='cosine'")
    if self.accum_steps < 1:
      raise UserError(f'accum_steps: {self.accum_steps}; expected >= 1')
    if self.adv_eps and self.loss != 'hinge':
      raise UserError(f"adv_eps: {self.adv_eps}; adversarial references need the 2AFC hinge (loss='hinge')")
    return self


@dataclasses.dataclass(frozen=True)
class Tower:
  """What the step embeds with: a backbone's pure apply_fn and input normalisation, the stage read as the feature,
  and the head trained on it. A stage of shape (N, T, C) gives its token 0 (the CLS token: DreamSim's 'cls' is the
  last block's token 0, before the final LayerNorm: dreamsim.py's 'concat' stage), (N, H, W, C) its spatial mean;
  several stages are concatenated in their order (no per-stage normalisation)."""
  apply_fn: Callable
  normalise: Callable
  feature: str | tuple[str, ...] = 'final'   # stage name(s), or 'final' (apply_fn's first output)
  head: str = 'identity'     # heads.KINDS
  head_size: int = 0


def tower(backbone, feature: str | None = None, head: str = 'identity', head_size: int = 0) -> Tower:
  """The Tower of a backbones.base.Backbone: its apply_fn and preprocess; feature default: its default layers."""
  if feature is None:
    feature = tuple(backbone.layers)
  if not isinstance(feature, str):
    feature = tuple(feature)
    feature = feature[0] if len(feature) == 1 else feature
  if head not in heads.KINDS:
    raise UserError(f'head: {head!r}; expected one of {heads.KINDS}')
  return Tower(backbone.apply_fn, backbone.preprocess.normalise, feature, head, head_size)


class State(NamedTuple):
  trainable: dict        # {'lora': ..., 'tower': backbone params ('full'), 'head': ...}: what the optimiser moves
  opt_state: Any
  step: jax.Array        # int32 scalar


class Batch(NamedTuple):
  images: jax.Array      # (B, 3, H, W, C): (ref, p0, p1) for 'hinge', a triplet otherwise
  target: jax.Array      # (B,) judge for 'hinge' / odd index for 'hard'; (B, 3) teacher similarities


# ------------------------------------------------------------------------------------------------ the optimiser

class _ForeachTwiceState(NamedTuple):
  count: jax.Array
  mu: optax.Updates
  nu: optax.Updates


def _scale_by_adam_twice_foreach(b1: float, b2: float, eps: float) -> optax.GradientTransformation:
  """torch's foreach Adam on a tensor listed twice in its param group (module docstring); the output is the sum of
  its two (identical) moves, to be scaled by the learning rate."""
  def init_fn(params):
    z = jax.tree.map(lambda p: jnp.zeros_like(p, jnp.float32), params)
    return _ForeachTwiceState(jnp.zeros([], jnp.int32), z, jax.tree.map(jnp.zeros_like, z))

  def update_fn(updates, state, params=None):
    del params
    count = state.count + 2
    mu = jax.tree.map(lambda m, g: b1 * b1 * m + (1.0 - b1 * b1) * g, state.mu, updates)
    nu = jax.tree.map(lambda v, g: b2 * b2 * v + 2.0 * (1.0 - b2) * g * g, state.nu, updates)
    c1 = 1.0 - b1 ** count.astype(jnp.float32)
    c2 = 1.0 - b2 ** count.astype(jnp.float32)
    out = jax.tree.map(lambda m, v: 2.0 * (m / c1) / (jnp.sqrt(v / c2) + eps), mu, nu)
    return out, _ForeachTwiceState(count, mu, nu)
  return optax.GradientTransformation(init_fn, update_fn)


def _repeated(opt: optax.GradientTransformation, n: int) -> optax.GradientTransformation:
  """`opt` applied n times per step to the same gradient, each time at the parameters the previous one left
  (torch's for-loop optimiser on a tensor listed n times); returns the summed update."""
  def update_fn(grads, state, params):
    total, p = None, params
    for _ in range(n):
      u, state = opt.update(grads, state, p)
      p = optax.apply_updates(p, u)
      total = u if total is None else jax.tree.map(jnp.add, total, u)
    return total, state
  return optax.GradientTransformation(opt.init, update_fn)


def optimizer(hp: Hparams) -> optax.GradientTransformation:
  adam = (_scale_by_adam_twice_foreach(hp.b1, hp.b2, hp.eps) if hp.adam_updates == 'twice_foreach'
          else optax.scale_by_adam(hp.b1, hp.b2, hp.eps))
  parts = [adam]
  if hp.weight_decay:
    parts.append(head_step.decay_to_init(hp.weight_decay))
  parts.append(optax.scale_by_learning_rate(head_step.schedule(hp)))
  opt = optax.chain(*parts)
  return _repeated(opt, 2) if hp.adam_updates == 'twice' else opt


# ------------------------------------------------------------------------------------------------ the model

def _cast(tree, dtype):
  return jax.tree.map(lambda v: v.astype(dtype) if jnp.issubdtype(v.dtype, jnp.floating) else v, tree)


def _variables(hp: Hparams, trainable: dict, frozen: dict) -> dict:
  if hp.tune == 'full':
    return {**frozen, 'params': trainable['tower']}
  return frozen


def _pooled(f: jax.Array) -> jax.Array:
  if f.ndim == 3:
    f = f[:, 0]
  elif f.ndim == 4:
    f = f.mean(axis=(1, 2))
  return f.astype(jnp.float32)


def _feature(tower_: Tower, out) -> jax.Array:
  final, stages = out
  names = (tower_.feature,) if isinstance(tower_.feature, str) else tower_.feature
  missing = [n for n in names if n != 'final' and n not in stages]
  if missing:
    raise UserError(f'tower feature: {missing} not among the stages {sorted(stages)}')
  parts = [_pooled(final if n == 'final' else stages[n]) for n in names]
  return parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=-1)


def embed(hp: Hparams, tower_: Tower, trainable: dict, frozen: dict, images: jax.Array,
          key: jax.Array | None = None) -> jax.Array:
  """(N, D) float32 embeddings of images (N, H, W, C) (the head applied); key: LoRA dropout on (training)."""
  dtype = DTYPES[hp.compute_dtype]
  variables = _cast(_variables(hp, trainable, frozen), dtype)
  lora = _cast(trainable.get('lora'), dtype) if hp.tune == 'lora' else None
  x = tower_.normalise(images, dtype)
  with backbone_base.remat_blocks(hp.remat):
    out = lora_lib.forward(tower_.apply_fn, variables, lora, hp.lora, x, key)
  f = _feature(tower_, out)
  return heads.apply(tower_.head, trainable.get('head', {}), f)


def _cos(a, b):
  return jnp.sum(ops.l2_normalize(a) * ops.l2_normalize(b), -1)


def pixel_distance(hp: Hparams, tower_: Tower, frozen: dict) -> Callable:
  """d(trainable, x0, x1) = 1 - cos of the tower's features (no dropout) of float images in [0, 1] (the attack's
  space: the backbone's preprocessed pixels / 255)."""
  def dist(t, x0, x1):
    return 1.0 - _cos(embed(hp, tower_, t, frozen, x0 * 255.0), embed(hp, tower_, t, frozen, x1 * 255.0))
  return dist


def adversarial_refs(hp: Hparams, tower_: Tower, trainable: dict, frozen: dict, batch: Batch,
                     key: jax.Array) -> jax.Array:
  """The batch's images with each reference replaced by its APGD example (metrics/attacks.py, keep='max_loss': the
  iterate of the highest cross-entropy of (-d0, -d1) at the human majority) within hp.adv_eps of it, through the
  current tower (no dropout, no gradient into the parameters): adversarial training on 2AFC votes as R-LPIPS trains
  (Croce et al. instead tune clean on NIGHTS from towers made robust on ImageNet: docs/robustness.md)."""
  images = batch.images.astype(jnp.float32)
  params = jax.lax.stop_gradient(trainable)
  opts = attacks.AttackOptions(hp.adv_norm, hp.adv_eps, hp.adv_steps, 'apgd', keep='max_loss')
  x = images / 255.0
  ref, _ = attacks.attack_fn(pixel_distance(hp, tower_, frozen), opts)(params, x[:, 0], x[:, 1], x[:, 2],
                                                                         batch.target, key)
  return images.at[:, 0].set(jax.lax.stop_gradient(ref) * 255.0)


def attacked_correct(hp: Hparams, tower_: Tower, steps: int, trainable: dict, frozen: dict, batch: Batch,
                     key: jax.Array) -> jax.Array:
  """(B,) whether the tower still answers each held-out 2AFC item as the humans did once its reference is attacked:
  Croce et al.'s evaluation (metrics/attacks.py: APGD of `steps` iterations at hp.adv_norm / hp.adv_eps on the
  reference, from a random start), through the tower as it stands. The attack returns the authors' x_best_adv (the
  last wrong iterate, else the start, where the answer was right), so the answer there is right exactly where the
  attack did not succeed: `~success`, with no further pass (a tie answers img0, as the authors' max)."""
  images = batch.images.astype(jnp.float32) / 255.0
  opts = attacks.AttackOptions(hp.adv_norm, hp.adv_eps, steps, 'apgd')
  _, success = attacks.attack_fn(pixel_distance(hp, tower_, frozen), opts)(
      trainable, images[:, 0], images[:, 1], images[:, 2], batch.target, key)
  return ~success


def batch_loss(hp: Hparams, tower_: Tower, trainable: dict, frozen: dict, batch: Batch,
               key: jax.Array | None, adv_key: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """(mean loss, (B,) train correctness) of one (micro-)batch (hp.adv_eps > 0: on attacked references, adv_key
  their random starts)."""
  images = batch.images
  if hp.adv_eps:
    images = adversarial_refs(hp, tower_, trainable, frozen, batch,
                              jax.random.PRNGKey(hp.seed) if adv_key is None else adv_key)
  b = images.shape[0]
  two_refs = hp.two_refs
  if two_refs:  # DreamSim's model(ref, p0), model(ref, p1): the reference through the tower twice
    images = jnp.stack([images[:, 0], images[:, 1], images[:, 0], images[:, 2]], axis=1)
  k = images.shape[1]
  e = embed(hp, tower_, trainable, frozen, images.reshape((b * k,) + images.shape[2:]), key)
  e = e.reshape(b, k, -1)
  if two_refs:
    s = jnp.stack([_cos(e[:, 0], e[:, 1]), _cos(e[:, 2], e[:, 3]), _cos(e[:, 1], e[:, 3])], axis=-1)
  else:
    s = odd_one_out.pair_similarities(e, hp.similarity)
  loss = odd_one_out.per_triplet(hp.loss, s, batch.target, hp.tau, hp.target_tau, hp.margin).mean()
  if hp.loss == 'hinge':  # DreamSim's training accuracy: (target >= 0.5) == (d1 < d0)
    d0, d1 = 1.0 - s[:, 0], 1.0 - s[:, 1]
    correct = ((batch.target >= 0.5) == (d1 < d0)).astype(jnp.float32)
  else:
    odd = odd_one_out.teacher_odd(batch.target) if batch.target.ndim == 2 else batch.target
    correct = odd_one_out.correct(s, odd, 'lt')
  return loss, correct


def init_state(hp: Hparams, tower_: Tower, variables: dict, key: jax.Array | None = None,
               image_shape: tuple[int, int, int] | None = None) -> tuple[State, dict]:
  """(State, frozen variables) at step 0: LoRA from peft's init ('lora'), a copy of the backbone's params ('full'),
  a head (heads.init) on the feature, sized by shape inference on one image of `image_shape` (H, W, C): required
  when a head trains. `frozen` is what the step reads but does not train (the backbone's variables in 'lora' and
  'frozen'; its non-params collections in 'full')."""
  hp.check()
  key = jax.random.PRNGKey(hp.seed) if key is None else key
  trainable, frozen = {}, dict(variables)
  if hp.tune == 'lora':
    trainable['lora'] = lora_lib.init(jax.random.fold_in(key, 1), variables['params'], hp.lora)
  elif hp.tune == 'full':  # a copy: the step donates its state, the backbone keeps its own arrays
    trainable['tower'] = jax.tree.map(jnp.copy, variables['params'])
    frozen = {k: v for k, v in variables.items() if k != 'params'}
  if tower_.head != 'identity':
    if image_shape is None:
      raise UserError('init_state: image_shape (H, W, C) is needed to size the head')
    x = jax.ShapeDtypeStruct((1,) + tuple(image_shape), jnp.float32)
    no_head = dataclasses.replace(tower_, head='identity')
    dim = jax.eval_shape(lambda v, x: _feature(no_head, no_head.apply_fn(v, no_head.normalise(x))), variables, x)
    trainable['head'] = heads.init(tower_.head, jax.random.fold_in(key, 2), dim.shape[-1], tower_.head_size)
  if not trainable:
    raise UserError("tune='frozen' with head='identity' trains nothing; pick tune 'lora' or 'full', or a head")
  # copies: decay_to_init's reference would otherwise be the trainable arrays themselves (donated twice)
  opt_state = jax.tree.map(jnp.copy, optimizer(hp).init(trainable))
  return State(trainable, opt_state, jnp.zeros([], jnp.int32)), frozen


def step_key(hp: Hparams, step: jax.Array) -> jax.Array:
  """The dropout key of a step: a function of (seed, step) only, so a resumed run draws the same masks."""
  return jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(hp.seed), 0x10A), step)


def step(hp: Hparams, tower_: Tower, state: State, frozen: dict, batch: Batch, mesh: Mesh | None = None
         ) -> tuple[State, dict]:
  """One optimiser update on `batch` (pure; jit via step_program). Returns (new state, {'loss', 'accuracy'})."""
  key = step_key(hp, state.step) if (hp.tune == 'lora' and hp.lora.dropout > 0) else None
  n = hp.accum_steps
  b = batch.images.shape[0]
  if b % n:
    raise UserError(f'batch size {b} is not a multiple of accum_steps={n}')
  adv_key = jax.random.fold_in(step_key(hp, state.step), 0xAD) if hp.adv_eps else None
  grad_fn = jax.value_and_grad(lambda t, mb, k, ak: batch_loss(hp, tower_, t, frozen, mb, k, ak), has_aux=True)

  def micro(i, mb):
    if mesh is not None:
      mb = jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, sharding_lib.batch_sharding(mesh, x.ndim)), mb)
    return grad_fn(state.trainable, mb, None if key is None else jax.random.fold_in(key, i),
                   None if adv_key is None else jax.random.fold_in(adv_key, i))

  if n == 1:
    (loss, correct), grads = micro(0, batch)
  else:
    mbs = jax.tree.map(lambda x: x.reshape((n, b // n) + x.shape[1:]), batch)

    def body(carry, xs):
      i, mb = xs
      (l, c), g = micro(i, mb)
      return jax.tree.map(jnp.add, carry, (l, g)), c
    zero = (jnp.zeros([], jnp.float32), jax.tree.map(jnp.zeros_like, state.trainable))
    (loss, grads), correct = jax.lax.scan(body, zero, (jnp.arange(n), mbs))
    loss, grads = loss / n, jax.tree.map(lambda g: g / n, grads)
    correct = correct.reshape(-1)
  updates, opt_state = optimizer(hp).update(grads, state.opt_state, state.trainable)
  new = State(optax.apply_updates(state.trainable, updates), opt_state, state.step + 1)
  if mesh is not None:
    new = sharding_lib.constrain_params(mesh, new)
  return new, {'loss': loss, 'accuracy': correct.mean()}


@functools.lru_cache(maxsize=16)
def step_program(hp: Hparams, tower_: Tower, mesh: Mesh | None = None):
  """step(hp, tower, ...) jitted: fn(state, frozen, batch) -> (state, metrics); with a mesh the batch is split over
  every device and the state keeps its fsdp shardings (place the inputs with `place`)."""
  hp.check()
  return cpu_kernels.jit(functools.partial(step, hp, tower_, mesh=mesh), donate_argnums=(0,))


def place(mesh: Mesh, state: State, frozen: dict, batch: Batch | None = None):
  """Host arrays (every process holding the full values) -> global arrays: state and frozen weights fsdp-sharded,
  the batch split over every device."""
  state = sharding_lib.place_params(mesh, state)
  frozen = sharding_lib.place_params(mesh, frozen)
  if batch is None:
    return state, frozen
  return state, frozen, jax.tree.map(lambda x: sharding_lib.to_global(x, sharding_lib.batch_sharding(mesh, x.ndim)),
                                     batch)


def merged_variables(hp: Hparams, state: State, frozen: dict) -> dict:
  """The tuned backbone's plain variables for inference and export: LoRA merged (W + scale a b), or the fully
  tuned params; the head is not part of them (state.trainable['head'])."""
  if hp.tune == 'lora':
    return lora_lib.merge_variables(frozen, state.trainable['lora'], hp.lora)
  return _variables(hp, state.trainable, frozen)
