"""The adaptation training program: every run at every temperature in one jitted, vmapped program.

Per run r (vmapped over R runs, key r = fold_in(seed key, r)):
  split:  a seeded permutation; the first floor(train_fraction * N) pairs are the training split, the rest
          test. With select_epoch='val' the last floor(val_fraction * n_train) pairs of the training split
          are held out as the run's validation pairs (they pick the epoch) and the model trains on the rest.
  PCA:    fit on the run's fitting vectors (left + right of the pairs it trains on), or, with pca_fit='all',
          on every vector the reference fits on (left, right and their mirrored views, test included).
  init:   W ~ U(+-1/sqrt(pca_dim)); Adam(lr) state. The same W for every sigma of a run (paired comparison).
  epochs: lax.scan of full-batch steps (one step per epoch, loss averaged over the views: the pairs and,
          with flip augmentation, the pairs' mirrored images); after each step the test (and validation)
          pairs are ranked (best partner rank over both directions, the input of aR@k).
Each run is vmapped over the temperatures hp.sigmas (inner axis S) and the runs are vmapped (outer axis R,
the one sharded over devices): state leaves are (R, S, ...), the training outputs (R, S, E, ...).
The epoch rule (select_epochs) and the statistics (summarise) are plain NumPy on the host.
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from visim_jax.core import cpu_kernels
from visim_jax.models import adaptation
from visim_jax.losses import symmetric_ce
from visim_jax.core import pca as pca_lib
from visim_jax.metrics import retrieval

SELECT_EPOCH = ('val', 'test', 'last')
PCA_FIT = ('train', 'all')


@dataclasses.dataclass(frozen=True)
class Hparams:
  runs: int = 20
  train_fraction: float = 0.75
  select_epoch: str = 'val'  # 'val' (held-out part of each training split) | 'test' (optimistic) | 'last'
  val_fraction: float = 0.1  # share of each run's training split held out when select_epoch == 'val'
  min_val_pairs: int = 50    # fewer validation pairs per run than this: the headline falls back to 'last'
  pca_dim: int = 256
  pca_fit: str = 'train'     # 'train' (each run's fitting pairs) | 'all' (reference: every vector, test included)
  pca_whiten: bool = False
  adapt_dim: int = 1024
  sigmas: tuple[float, ...] = (15.0,)  # temperatures of Eq. 1, all trained in one program (Table 1: (1, 15))
  lr: float = 1e-3
  epochs: int = 150
  seed: int = 0
  dtype: str = 'float32'     # matmul inputs of the training step: 'float32' | 'bfloat16' (f32 accumulation)

  def __post_init__(self):
    object.__setattr__(self, 'sigmas', tuple(float(s) for s in self.sigmas))

  def n_train(self, n: int) -> int:
    """Pairs in the training split (fitting + validation); the rest are test pairs."""
    return int(np.floor(self.train_fraction * n))

  def n_val(self, n: int) -> int:
    return int(np.floor(self.val_fraction * self.n_train(n))) if self.select_epoch == 'val' else 0

  def headline_rule(self, n_val: int) -> str:
    """The rule the headline reports: select_epoch, except 'val' on fewer than min_val_pairs validation pairs
    per run, where the epoch would rest on a handful of pairs (aR@1 moves in steps of 1/n_val): then 'last'."""
    return 'last' if self.select_epoch == 'val' and n_val < self.min_val_pairs else self.select_epoch

  def n_fit(self, n: int) -> int:
    """Pairs the adaptation (and the 'train' PCA) is fit on."""
    return self.n_train(n) - self.n_val(n)


class Features(NamedTuple):
  left: jax.Array                 # (N, D) pooled features
  right: jax.Array
  left_flip: jax.Array | None = None   # features of the mirrored images (augmentation)
  right_flip: jax.Array | None = None


class Splits(NamedTuple):
  train: jax.Array              # (R, n_fit) pairs the model (and the 'train' PCA) is fit on
  test: jax.Array               # (R, n_test)
  val: jax.Array | None = None  # (R, n_val) held-out part of the training split (select_epoch='val')


class RunData(NamedTuple):
  """One run's projected data (leading axis R when batched)."""
  train_views: jax.Array          # (V, 2, n_fit, pca_dim): views x (left, right)
  test: jax.Array                 # (2, n_test, pca_dim)
  val: jax.Array | None = None    # (2, n_val, pca_dim)


class State(NamedTuple):
  params: Any
  opt_state: Any


class Outputs(NamedTuple):
  """What each epoch of each (run, sigma) produces; stacked to (R, S, E, ...) by train_chunk."""
  loss: jax.Array
  test_ranks: jax.Array           # best-partner ranks of the test pairs (n_test,)
  val_ranks: jax.Array | None     # same for the validation pairs (n_val,), None without validation


def optimizer(hp: Hparams):
  return optax.adam(hp.lr)


def best_ranks(left: jax.Array, right: jax.Array) -> jax.Array:
  """min(rank left->right, rank right->left) of each pair under cosine similarity (pessimistic ties)."""
  lr, rl = retrieval.partner_ranks(retrieval.cosine_matrix(left, right))
  return jnp.minimum(lr, rl).astype(jnp.int32)


def run_keys(hp: Hparams) -> jax.Array:
  base = jax.random.PRNGKey(hp.seed)
  return jax.vmap(lambda r: jax.random.fold_in(base, r))(jnp.arange(hp.runs))


def splits(hp: Hparams, n: int) -> Splits:
  """Each run's seeded permutation: [fit | val | test]; the test part does not depend on select_epoch."""
  perms = jax.vmap(lambda k: jax.random.permutation(jax.random.fold_in(k, 0), n))(run_keys(hp))
  nt, nf = hp.n_train(n), hp.n_fit(n)
  return Splits(perms[:, :nf], perms[:, nt:], perms[:, nf:nt] if nf < nt else None)


def _fit_rows(hp: Hparams, feats: Features) -> jax.Array:
  """The rows a PCA is fit on: left + right, and with pca_fit='all' also the mirrored views when present."""
  views = [feats.left, feats.right]
  if hp.pca_fit == 'all' and feats.left_flip is not None:
    views += [feats.left_flip, feats.right_flip]
  return jnp.concatenate(views)


def _fit_mask(n: int, rows: int, idx: jax.Array) -> jax.Array:
  mask = jnp.zeros((n,), bool).at[idx].set(True)
  return jnp.tile(mask, rows // n)


def fit_pcas(hp: Hparams, feats: Features, train_idx: jax.Array) -> pca_lib.PCA:
  """One PCA per run (leading axis R): on the run's fitting pairs, or one fit on every vector ('all')."""
  n = feats.left.shape[0]
  x = _fit_rows(hp, feats)
  if hp.pca_fit == 'all':
    p = pca_lib.fit(x, hp.pca_dim, whiten=hp.pca_whiten)
    return jax.tree.map(lambda a: jnp.broadcast_to(a, (train_idx.shape[0],) + a.shape), p)
  return jax.lax.map(lambda tr: pca_lib.fit(x, hp.pca_dim, _fit_mask(n, x.shape[0], tr), whiten=hp.pca_whiten),
                     train_idx)  # sequential over runs: bounded memory for large D


def explained_variance(hp: Hparams, feats: Features, pcas: pca_lib.PCA, train_idx: jax.Array) -> jax.Array:
  """(R,) share of the variance of the vectors each PCA was fit on that its components keep: the paper's
  'PCA Variance Sum' (sklearn's explained_variance_ratio_.sum() on the reference's fit vectors)."""
  n = feats.left.shape[0]
  x = _fit_rows(hp, feats)
  if hp.pca_fit == 'all':  # one fit shared by every run: computed once
    ratio = pca_lib.explained_variance_ratio(jax.tree.map(lambda a: a[0], pcas), x)
    return jnp.broadcast_to(ratio, pcas.mean.shape[:1])
  return jax.vmap(lambda p, tr: pca_lib.explained_variance_ratio(p, x, _fit_mask(n, x.shape[0], tr)))(
      pcas, train_idx)


def project(feats: Features, pcas: pca_lib.PCA, sp: Splits) -> RunData:
  def pair(t, idx):
    return jnp.stack([t(feats.left[idx]), t(feats.right[idx])])

  def one(p, tr, te, va):
    t = lambda x: pca_lib.transform(p, x)
    views = [pair(t, tr)]
    if feats.left_flip is not None:
      views.append(jnp.stack([t(feats.left_flip[tr]), t(feats.right_flip[tr])]))
    return RunData(jnp.stack(views), pair(t, te), None if va is None else pair(t, va))
  return jax.vmap(one)(pcas, sp.train, sp.test, sp.val)


def baselines(feats: Features, data: RunData, test_idx) -> dict[str, jax.Array]:
  """Best-partner ranks (R, n_test) of the raw concatenated features and of the PCA features."""
  raw = jax.vmap(lambda te: best_ranks(feats.left[te], feats.right[te]))(test_idx)
  pca = jax.vmap(lambda d: best_ranks(d[0], d[1]))(data.test)
  return {'raw': raw, 'pca': pca}


def init_state(hp: Hparams) -> State:
  """(R, S, ...) leaves: each run's W and Adam state, the same for each of its sigmas."""
  def one(k):
    params = adaptation.init(jax.random.fold_in(k, 1), hp.pca_dim, hp.adapt_dim)
    st = State(params, optimizer(hp).init(params))
    return jax.tree.map(lambda a: jnp.broadcast_to(a, (len(hp.sigmas),) + a.shape), st)
  return jax.vmap(one)(run_keys(hp))


def view_loss(params, train_views: jax.Array, sigma, dtype=jnp.float32) -> jax.Array:
  """Mean over the views of Eq. 1; train_views (V, 2, N, P).

  Every view's and side's rows go through W as one (V * 2 * N, P) product: its gradient dW = X^T G then has one
  contracting axis. Vmapped over the views, dW contracted (view, row), and XLA:CPU laid G out transposed for it
  in a strided loop fusion that took a quarter of the program (benchmarks/adapt.py --preset=small: 3.36 s a
  call against 2.05 s this way, same losses and ranks)."""
  v, two, n, p = train_views.shape
  a = adaptation.adapt(params, train_views.reshape(v * two * n, p), dtype).reshape(v, two, n, -1)
  logits = jax.vmap(lambda av: adaptation.cosine_logits(av[0], av[1], sigma, dtype=dtype))(a)
  return jax.vmap(symmetric_ce.symmetric_ce)(logits).mean()


def epoch_step(hp: Hparams, st: State, d: RunData, sigma) -> tuple[State, Outputs]:
  """One full-batch step of one (run, sigma), then the ranks of its test (and validation) pairs."""
  loss, grads = jax.value_and_grad(view_loss)(st.params, d.train_views, sigma, jnp.dtype(hp.dtype))
  updates, opt_state = optimizer(hp).update(grads, st.opt_state, st.params)
  params = optax.apply_updates(st.params, updates)
  ranks = lambda pair: best_ranks(adaptation.adapt(params, pair[0]), adaptation.adapt(params, pair[1]))
  return State(params, opt_state), Outputs(loss, ranks(d.test), None if d.val is None else ranks(d.val))


def train_chunk(hp: Hparams, state: State, data: RunData, n_epochs: int) -> tuple[State, Outputs]:
  """n_epochs steps of every (run, sigma): state (R, S, ...) -> state, Outputs with leaves (R, S, E, ...)."""
  sigmas = jnp.asarray(hp.sigmas, jnp.float32)

  def one_run(st_s: State, d: RunData):
    # the run's data is given each sigma explicitly: with an unbatched operand XLA would fuse the S matmuls into
    # one of another blocking, and Adam amplifies those last-bit differences; batched, each sigma's program is
    # the single-sigma program (tests: equal to separate runs)
    d_s = jax.tree.map(lambda a: jnp.broadcast_to(a, (len(hp.sigmas),) + a.shape), d)

    def one_sigma(st: State, d1: RunData, sigma):
      return jax.lax.scan(lambda s, _: epoch_step(hp, s, d1, sigma), st, None, length=n_epochs)
    return jax.vmap(one_sigma)(st_s, d_s, sigmas)
  return jax.vmap(one_run)(state, data)


# XLA:CPU compiles dots through YNNPACK by default; on the adaptation program's shapes the whole program ran
# 1.48x longer with it than with XLA's Eigen dots (benchmarks/adapt.py --pairs=1500,500, interleaved with the
# same PyTorch reference, same numbers), so on a CPU the program is compiled with that fusion off. Other
# backends ignore the option; nothing else changes.
CPU_COMPILER_OPTIONS = {'xla_cpu_experimental_ynn_fusion_type': ''}


def chunk_program(out_shardings=None):
  """train_chunk jitted (hp and n_epochs static) with the compiler options of the default backend."""
  opts = CPU_COMPILER_OPTIONS if jax.default_backend() == 'cpu' else None
  kw = {} if out_shardings is None else {'out_shardings': out_shardings}
  return cpu_kernels.jit(train_chunk, static_argnums=(0, 3), compiler_options=opts, **kw)


# ------------------------------------------------------------------------------ host side: the epoch rule

def recall_from_ranks(ranks: jax.Array | np.ndarray, ks: Sequence[int]) -> np.ndarray:
  """aR@k for each k from best-partner ranks (..., n) -> (..., len(ks))."""
  ranks = np.asarray(ranks)
  return np.stack([(ranks <= k).mean(axis=-1) for k in ks], axis=-1)


def select_epochs(test_ranks: np.ndarray, val_ranks: np.ndarray | None, k: int) -> dict[str, np.ndarray]:
  """0-based epoch per sigma, from ranks (R, S, E, n), by each rule:
  'val':  first argmax over epochs of the run-averaged validation aR@k (absent without validation pairs);
  'test': the same on the test pairs: what Table 1's scripts did (optimistic: the test split picks);
  'last': the last epoch (the fixed budget of 150 epochs)."""
  out = {'test': np.argmax(recall_from_ranks(test_ranks, [k])[..., 0].mean(axis=0), axis=-1),
         'last': np.full(test_ranks.shape[1], test_ranks.shape[2] - 1)}
  if val_ranks is not None:
    out['val'] = np.argmax(recall_from_ranks(val_ranks, [k])[..., 0].mean(axis=0), axis=-1)
  return out


def stats(values) -> dict:
  """Over runs: mean, std (ddof 0, as the reference's np.std; Table 1's +-) and 2 std (Fig. 3's band)."""
  values = np.asarray(values, np.float64)
  std = float(values.std(ddof=0))
  return {'mean': float(values.mean()), 'std': std, 'two_std': 2 * std, 'runs': values.tolist()}


def summarise(hp: Hparams, out: dict, ks: Sequence[int]) -> dict:
  """Per-sigma aR@k statistics at each rule's epoch, from train outputs on the host:
  out['ranks'] (R, S, E, n_test), out['val_ranks'] (R, S, E, n_val) or None, out['raw'] / out['pca'] (R, n_test).
  Returns {'primary': rule, 'epochs': {sigma: {rule: 1-based epoch}}, 'baselines': {aR@k: {raw, pca}},
  'adapted': {sigma: {aR@k: {rule: stats}}}, 'curves': (R, S, E, K) test aR@k, 'val_curves' or None}."""
  ks = [int(k) for k in ks]
  curves = recall_from_ranks(out['ranks'], ks)
  val = out.get('val_ranks')
  chosen = select_epochs(out['ranks'], val, ks[0])
  rules = [r for r in SELECT_EPOCH if r in chosen]
  res = {'primary': hp.headline_rule(0 if val is None else val.shape[-1]), 'epochs': {}, 'adapted': {},
         'baselines': {f'aR@{k}': {c: stats(recall_from_ranks(out[c], [k])[:, 0]) for c in ('raw', 'pca')}
                       for k in ks},
         'curves': curves, 'val_curves': None if val is None else recall_from_ranks(val, ks)}
  for s, sigma in enumerate(hp.sigmas):
    key = sigma_key(sigma)
    res['epochs'][key] = {r: int(chosen[r][s]) + 1 for r in rules}
    res['adapted'][key] = {f'aR@{k}': {r: stats(curves[:, s, chosen[r][s], j]) for r in rules}
                           for j, k in enumerate(ks)}
  return res


def sigma_key(sigma: float) -> str:
  """'sigma=15' / 'sigma=0.5': the key of one temperature's results."""
  return f'sigma={float(sigma):g}'


def select_sigma(out: dict, s: int) -> dict:
  """One temperature's slice of train outputs (params/ranks/loss lose their S axis), for the per-run
  consumers (plots, adapter export) that see one sigma at a time."""
  per_sigma = ('loss', 'ranks', 'val_ranks', 'params')
  return {k: (jax.tree.map(lambda a: np.asarray(a)[:, s], v) if k in per_sigma and v is not None else v)
          for k, v in out.items()}


def describe_epoch_rules(hp: Hparams, n: int, k: int) -> dict:
  """metrics.json's epoch_rule: the primary rule and what each rule means for this run."""
  rules = {'test': f'first argmax over epochs of the run-averaged test aR@{k}: optimistic (the test pairs pick '
                   'their own epoch); how Table 1\'s numbers were picked (the authors\' calc_stds.py)',
           'last': f'epoch {hp.epochs}: the fixed budget'}
  if hp.n_val(n):
    rules['val'] = (f'first argmax over epochs of the run-averaged aR@{k} of each run\'s {hp.n_val(n)} held-out '
                    f'validation pairs (val_fraction {hp.val_fraction} of its training split; trained on the other '
                    f'{hp.n_fit(n)})')
  primary = hp.headline_rule(hp.n_val(n))
  if primary != hp.select_epoch:
    rules['fallback'] = (f'the headline is the last epoch: {hp.n_val(n)} validation pairs per run are fewer than '
                         f'min_val_pairs={hp.min_val_pairs}, too few to pick an epoch on; the val- and test-selected '
                         'epochs are in metrics.json, not in the console table (an argmax over epochs of so few pairs '
                         'moves with float rounding: those digits would differ between CPUs)')
  return {'primary': primary, **rules}
