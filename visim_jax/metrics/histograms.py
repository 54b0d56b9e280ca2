"""Histogram metrics of a representation: overlap, maximal overlap, aSTD (paper 003: Wu et al., "Beyond Accuracy").

Symbols (paper Sec. 3.1, 3.3, 9.2; the docs' fidelity table, docs/histograms.md, says which readings are ours):

* sim: cosine similarity in [-1, 1] of features standardised first (Sec. 3.2, 9.1: 'target' = this set's
  per-dimension mean/std, the paper's default; 'source' = given mean/std; 'none'); rows are then L2-normalised
  so that a similarity is a dot product.
* p+(b|y), p-(b|y): the fraction of the intra pairs (two distinct samples of class y, Eq. 1) and of the inter
  pairs (a sample of y with a sample of another class, Eq. 1) whose similarity falls in bin b; bins b are 100
  equal bins on [-1, 1] (metrics/bins.py).
* degenerate: every similarity in one bin (identical or blank features): `evaluate` adds {'degenerate': reason}
  (metrics/degenerate.py), the overlap of 1 it implies says nothing about the representation.
* N: the number of evaluated classes (those with >= min_class_size samples and at least one pair of each kind).
* overlap (Eq. 3): O = 1/N sum_y sum_b min(p+(b|y), p-(b|y)); per class O_y = sum_b min(p+(b|y), p-(b|y)).
* aSTD (Eq. 4, as printed): p(b) = 1/N sum_y p(b|y) (the class-averaged distribution), MEAN(b) the bin centre,
  mu = sum_b p(b) MEAN(b), aSTD = sqrt(sum_b p(b) (MEAN(b) - mu)^2): `astd_inter` from p-, the default (Sec.
  3.4), `astd_intra` from p+.
* class_mean_spread_{inter,intra}: the spread of the class means mu_y = sum_b p(b|y) MEAN(b) across classes,
  sqrt(1/N sum_y (mu_y - mean_y mu_y)^2): what this project reported as aSTD before (issue 12 item 5); kept,
  renamed, as an extra measure of consistency that is 0 when every class has the same distribution.
* maximal overlap (Sec. 9.2), pairwise reading (`max_overlap`, the default): max over ordered class pairs
  y != y' of sum_b min(p+(b|y), q(b|y,y')), q the histogram of the pairs between y and y' only;
  `max_class_overlap` = max_y O_y beside it.

Two estimators of the histograms, one per run (the caller picks with `choose_estimator`):
'exhaustive' (every pair, exact: blocked_histograms.py) and 'random' (n pairs per class: pair_sampling.py).
Standard errors: bootstrap over samples for 'exhaustive', independent seeds for 'random' (`se_replicates`).
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from visim_jax.core import cpu_kernels
from visim_jax.core import memory, ops
from visim_jax.core.errors import UserError
from visim_jax.metrics import blocked_histograms as blocked
from visim_jax.metrics import degenerate
from visim_jax.metrics import pair_sampling as sampling
from visim_jax.metrics.bins import NUM_BINS, bin_centers

NORMALIZATIONS = ('none', 'target', 'source')
PAIR_MODES = ('auto', 'random', 'exhaustive')
SCALARS = ('overlap', 'max_overlap', 'max_class_overlap', 'astd_inter', 'astd_intra', 'class_mean_spread_inter',
           'class_mean_spread_intra')  # the scalar metrics a run reports (metrics.json, nodes.csv, levels.csv)
SE_KEYS = SCALARS  # every scalar gets a standard error from the same replicates


class TooFewClasses(ValueError):
  """Fewer than two classes can be evaluated (the caller names the data source)."""


# ------------------------------------------------------------------------------------------ features

def standardize(x: jax.Array, mode: str = 'target', mean=None, std=None, eps: float = 1e-6) -> jax.Array:
  """Sec. 9.1: 'none' | 'target' (this set's per-dimension mean/std) | 'source' (the given mean/std)."""
  x = jnp.asarray(x, jnp.float32)
  if mode == 'none':
    return x
  if mode == 'target':
    mean, std = x.mean(0), x.std(0)
  elif mode == 'source':
    if mean is None or std is None:
      raise ValueError("normalization='source' needs the source mean and std")
    mean, std = jnp.asarray(mean, jnp.float32), jnp.asarray(std, jnp.float32)
    if mean.shape != x.shape[1:] or std.shape != x.shape[1:]:
      raise ValueError(f'source mean/std shapes {mean.shape}/{std.shape} do not match feature dim {x.shape[1:]}')
  else:
    raise ValueError(f'normalization: {mode!r} is not one of {NORMALIZATIONS}')
  return (x - mean) / jnp.maximum(std, eps)


@functools.partial(cpu_kernels.jit, static_argnames=('mode',))
def prepare(x, mode: str = 'target', mean=None, std=None):
  """Standardise then L2-normalise: rows whose dot products are the cosine similarities of the paper."""
  return ops.l2_normalize(standardize(x, mode, mean, std))


# -------------------------------------------------------------------------------------- the metrics

def to_probabilities(hist: jax.Array) -> jax.Array:
  hist = jnp.asarray(hist, jnp.float32)
  return hist / jnp.maximum(hist.sum(-1, keepdims=True), 1.0)


def class_overlap(p_intra: jax.Array, p_inter: jax.Array) -> jax.Array:
  """Eq. 3 inner sum: sum_b min(p+(b|y), p-(b|y)); (..., B) -> (...)."""
  return jnp.minimum(p_intra, p_inter).sum(-1)


def class_moments(p: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Eq. 4's mu and sigma of a distribution over the bins (bin centres as values): (..., B) -> (mean, std)."""
  c = jnp.asarray(bin_centers(p.shape[-1]))
  mu = (p * c).sum(-1)
  return mu, jnp.sqrt(jnp.maximum((p * (c - mu[..., None]) ** 2).sum(-1), 0.0))


def _class_weights(valid):
  return valid.astype(jnp.float32) / jnp.maximum(valid.sum(), 1)


def astd(p: jax.Array, valid: jax.Array) -> jax.Array:
  """Eq. 4 as printed: sigma of p(s) = 1/N sum_y p(s|y) over the N valid classes; p: (C, B)."""
  return class_moments((_class_weights(valid)[:, None] * p).sum(0))[1]


def class_mean_spread(p: jax.Array, valid: jax.Array) -> jax.Array:
  """Spread across the valid classes of their mean similarity mu_y (the pre-issue-12 'aSTD')."""
  w = _class_weights(valid)
  mu_y, _ = class_moments(p)
  mu = (w * mu_y).sum()
  return jnp.sqrt((w * (mu_y - mu) ** 2).sum())


def pair_overlaps(p_intra: jax.Array, pair_hist: jax.Array, valid: jax.Array) -> jax.Array:
  """(C, C) sum_b min(p+(b|y), q(b|y,y')) for y != y' both valid with pairs between them; -inf elsewhere."""
  ov = jnp.minimum(p_intra[:, None, :], to_probabilities(pair_hist)).sum(-1)
  c = valid.shape[0]
  ok = valid[:, None] & valid[None, :] & ~jnp.eye(c, dtype=bool) & (pair_hist.sum(-1) > 0)
  return jnp.where(ok, ov, -jnp.inf)


def _metrics(hist_intra, hist_inter, valid, pair_hist=None):
  p_in, p_out = to_probabilities(hist_intra), to_probabilities(hist_inter)
  ov = class_overlap(p_in, p_out)
  mi, si = class_moments(p_in)
  mo, so = class_moments(p_out)
  out = {
      'class_overlap': ov, 'class_mean_intra': mi, 'class_std_intra': si, 'class_mean_inter': mo,
      'class_std_inter': so,
      'overlap': jnp.where(valid, ov, 0.0).sum() / jnp.maximum(valid.sum(), 1),
      'max_class_overlap': jnp.where(valid, ov, -jnp.inf).max(),
      'astd_inter': astd(p_out, valid), 'astd_intra': astd(p_in, valid),
      'class_mean_spread_inter': class_mean_spread(p_out, valid),
      'class_mean_spread_intra': class_mean_spread(p_in, valid),
  }
  if pair_hist is not None:
    po = pair_overlaps(p_in, pair_hist, valid)
    out['max_overlap'] = po.max()
    out['max_overlap_pair'] = jnp.argmax(po.ravel())
    counts = jnp.where(jnp.isfinite(po), pair_hist.sum(-1), jnp.iinfo(jnp.int32).max)
    out['pairwise_min_pairs'] = counts.min()
  return out


histogram_metrics = cpu_kernels.jit(_metrics)
histogram_metrics.__doc__ = """Every metric from (C, B) count histograms of the classes marked valid ((C,) bool).

Per class: `class_overlap`, `class_mean_intra`, `class_std_intra`, `class_mean_inter`, `class_std_inter`;
scalars: `overlap` (Eq. 3), `max_class_overlap`, `astd_inter`, `astd_intra` (Eq. 4), `class_mean_spread_*`;
with the (C, C, B) pair histograms also `max_overlap` (pairwise, Sec. 9.2), `max_overlap_pair` (flat index
y * C + y'), `pairwise_min_pairs` (fewest pairs behind one evaluated class pair)."""
_replicate_metrics = cpu_kernels.jit(jax.vmap(_metrics))


# ----------------------------------------------------------------------------------- the evaluation

@dataclasses.dataclass(frozen=True)
class Options:
  """How the histograms are estimated (see configs/histograms.py for the matching config fields)."""
  mode: str = 'auto'               # 'auto' | 'random' | 'exhaustive'
  n_intra: int = 10_000            # random: intra pairs per class
  n_inter: int = 10_000            # random: inter pairs per class
  exhaustive_max: int = 50_000_000  # auto: exhaustive when the n (n - 1) / 2 pairs are at most this many
  max_seconds: float = 86_400.0    # exhaustive: refuse when the time estimate is larger
  tile: int = 0                    # exhaustive: block size (0: 256 on CPU, 1024 on accelerators)
  chunk_elems: int = 0             # random: floats gathered per side per round (0: default_chunk_elems())
  seed: int = 0
  bins: int = NUM_BINS
  min_class_size: int = 10         # Sec. 4.1: classes with fewer samples are omitted
  se_replicates: int = 5           # standard errors: bootstrap replicates / extra seeds (0: none)
  pairwise_max_classes: int = 256  # pairwise maximal overlap for at most this many classes ((C, C, B) counts)

  def validate(self):
    if self.mode not in PAIR_MODES:
      raise UserError(f'config.pairs.mode: {self.mode!r} is not one of {PAIR_MODES}')
    for f in ('pairs.n_intra', 'pairs.n_inter', 'bins', 'pairs.exhaustive_max', 'pairs.max_seconds'):
      if getattr(self, f.split('.')[-1]) <= 0:
        raise UserError(f'config.{f}: must be > 0, got {getattr(self, f.split(".")[-1])}')
    for f in ('pairs.chunk_elems', 'pairs.tile', 'se_replicates', 'pairwise_max_classes'):
      if getattr(self, f.split('.')[-1]) < 0:
        raise UserError(f'config.{f}: must be >= 0, got {getattr(self, f.split(".")[-1])}')
    if self.min_class_size < 2:
      raise UserError(f'config.min_class_size: must be >= 2 (an intra pair needs 2 samples), got '
                      f'{self.min_class_size}')
    if self.se_replicates == 1:
      raise UserError('config.se_replicates: a standard error needs 0 (none) or >= 2 replicates, got 1')


def check_inputs(features, labels, source: str = 'features') -> tuple[np.ndarray, np.ndarray]:
  """Shapes, NaN and label checks with messages that name the source."""
  labels = np.asarray(labels)
  if getattr(features, 'ndim', None) != 2:
    raise UserError(f'{source}: features must be a 2-D (samples, dim) array, got shape {np.shape(features)}')
  if labels.ndim != 1:
    raise UserError(f'{source}: labels must be 1-D, got shape {labels.shape}')
  if features.shape[0] != labels.shape[0]:
    raise UserError(f'{source}: {features.shape[0]} feature rows but {labels.shape[0]} labels; they must match')
  if not np.issubdtype(labels.dtype, np.integer):
    raise UserError(f'{source}: labels must be integers, got dtype {labels.dtype}')
  bad = np.flatnonzero(~np.isfinite(np.asarray(features, np.float32)).all(1))
  if len(bad):
    raise UserError(f'{source}: {len(bad)} feature rows hold NaN/Inf (first rows: {bad[:5].tolist()})')
  return np.asarray(features), labels.astype(np.int64)


def keep_classes(labels: np.ndarray, num_classes: int, min_samples: int = 10):
  """Labels with classes of fewer than min_samples set to -1: (labels, kept mask (C,), omitted count)."""
  counts = np.bincount(labels[labels >= 0], minlength=num_classes)[:num_classes]
  kept = counts >= min_samples
  out = np.where((labels >= 0) & kept[np.clip(labels, 0, num_classes - 1)], labels, -1)
  return out, kept, int(((counts > 0) & ~kept).sum())


def choose_estimator(n_samples: int, dim: int, num_classes: int, opts: Options, extra_pairs: int = 0) -> str:
  """The one estimator of a run: 'exhaustive' | 'random' (auto: exhaustive when it is small enough).

  extra_pairs: pairs of further passes of the same run (tree nodes), added to the time estimate.
  mode='exhaustive' raises UserError with the memory/time estimate when the exact pass would not fit."""
  if opts.mode == 'random':
    return 'random'
  pairwise = num_classes <= opts.pairwise_max_classes
  plan = blocked.make_plan(n_samples, dim, num_classes, opts.bins, opts.tile, 1 + opts.se_replicates, pairwise)
  if extra_pairs:
    plan = plan._replace(pairs=plan.pairs + extra_pairs,
                         seconds=plan.seconds * (plan.pairs + extra_pairs) / max(plan.pairs, 1))
  if opts.mode == 'exhaustive':
    blocked.check_plan(plan, opts.max_seconds)
    return 'exhaustive'
  fits = plan.bytes_per_device <= 0.5 * memory.limit_bytes() and plan.seconds <= opts.max_seconds
  return 'exhaustive' if plan.pairs <= opts.exhaustive_max and fits else 'random'


def _random_histograms(x, labels, num_classes, opts, replicates, pairwise):
  index = sampling.group_by_class(labels, num_classes)
  base = jax.random.key(opts.seed)
  h_in, h_out, pair = [], [], []
  for r in range(1 + replicates):
    key = base if r == 0 else jax.random.fold_in(base, 1000 + r)
    rs = sampling.per_round(len(index.counts), x.shape[1], opts.n_intra, opts.chunk_elems)
    h_in.append(sampling.random_pair_histograms(x, index, jax.random.fold_in(key, 0), n_pairs=opts.n_intra,
                                                kind='intra', bins=opts.bins, round_size=rs))
    rs = sampling.per_round(len(index.counts), x.shape[1], opts.n_inter, opts.chunk_elems)
    out = sampling.random_pair_histograms(x, index, jax.random.fold_in(key, 1), n_pairs=opts.n_inter,
                                          kind='inter', bins=opts.bins, round_size=rs, pairwise=pairwise)
    if pairwise:
      out, p = out
      p = np.asarray(p, np.int64)[:num_classes, :num_classes]
      pair.append(p + p.transpose(1, 0, 2))  # y's draws with partner y' and y''s draws with partner y
    h_out.append(out)
  cut = lambda hs: np.stack([np.asarray(h, np.int64)[:num_classes] for h in hs])
  return cut(h_in), cut(h_out), (np.stack(pair) if pairwise else None)


def evaluate(x: jax.Array, labels: np.ndarray, num_classes: int, opts: Options = Options(),
             estimator: str | None = None, replicates: int | None = None, progress=None) -> dict:
  """All histogram metrics of prepared features x (see `prepare`) for labels in [0, num_classes) (-1: left out).

  Classes with fewer than opts.min_class_size samples are omitted (counted in `omitted_classes`); raises
  TooFewClasses when fewer than 2 remain. estimator: 'exhaustive' | 'random' (None: choose_estimator);
  replicates: for the standard errors (None: opts.se_replicates). Returns NumPy values: the histogram_metrics
  dict of the main estimate, `hist_intra`, `hist_inter` (C, B) int64, `valid`, `class_counts`, `estimator`,
  `intra_pairs`, `inter_pairs`, `se` (dict over SE_KEYS, std of the replicates), `se_method`.
  """
  opts.validate()
  labels = np.asarray(labels)
  class_counts = np.bincount(labels[labels >= 0], minlength=num_classes)[:num_classes]
  labels, kept, omitted = keep_classes(labels, num_classes, opts.min_class_size)
  if kept.sum() < 2:
    raise TooFewClasses(f'only {int(kept.sum())} class(es) with at least {opts.min_class_size} samples '
                        f'({omitted} omitted): overlap needs at least 2 classes')
  n_kept = int((labels >= 0).sum())
  estimator = estimator or choose_estimator(n_kept, x.shape[1], num_classes, opts)
  replicates = opts.se_replicates if replicates is None else replicates
  pairwise = num_classes <= opts.pairwise_max_classes
  if estimator == 'exhaustive':
    rng = np.random.default_rng(opts.seed)
    w = np.zeros((1 + replicates, len(labels)), np.int32)
    w[0, labels >= 0] = 1
    for r in range(replicates):  # bootstrap over samples: a multinomial draw of n from the n kept samples
      w[1 + r, labels >= 0] = rng.multinomial(n_kept, np.full(n_kept, 1.0 / n_kept))
    h_in, h_out, pair = blocked.exact_histograms(x, labels, num_classes, bins=opts.bins, tile=opts.tile,
                                                 weights=w, pairwise=pairwise, progress=progress)
    se_method = f'bootstrap over samples ({replicates} replicates)'
  elif estimator == 'random':
    h_in, h_out, pair = _random_histograms(x, labels, num_classes, opts, replicates, pairwise)
    se_method = f'independent pair draws ({replicates} extra seeds)'
  else:
    raise ValueError(f'estimator: {estimator!r}')
  valid = kept[None] & (h_in.sum(-1) > 0) & (h_out.sum(-1) > 0)  # (1 + R, C)
  f32 = lambda a: jnp.asarray(a, jnp.float32)  # counts beyond 2^31 stay exact enough as probabilities
  reps = _replicate_metrics(f32(h_in), f32(h_out), jnp.asarray(valid), None if pair is None else f32(pair))
  reps = {k: np.asarray(v) for k, v in reps.items()}
  m = {k: v[0] for k, v in reps.items()}

  def se(k):  # over the replicates where the value exists (a bootstrap draw may leave a class without pairs)
    v = reps[k][1:][np.isfinite(reps[k][1:])] if k in reps else []
    return float(np.std(v, ddof=1)) if len(v) >= 2 else None

  m['se'] = {k: se(k) for k in SE_KEYS}
  m['se_method'] = se_method if replicates >= 2 else 'none'
  if not pairwise:
    m['max_overlap'] = np.float32(np.nan)
  else:
    y, y2 = divmod(int(m['max_overlap_pair']), num_classes)
    m['max_overlap_pair'] = (y, y2)
    m['pairwise_min_pairs'] = int(m['pairwise_min_pairs'])
  m.update(hist_intra=h_in[0], hist_inter=h_out[0], valid=valid[0], omitted_classes=omitted,
           class_counts=class_counts, estimator=estimator, replicates=replicates, pairwise=pairwise,
           intra_pairs=int(h_in[0].sum()), inter_pairs=int(h_out[0].sum()))
  why = degenerate.histograms(h_in[0], h_out[0])
  if why:   # e.g. identical features: overlap 1 for any representation (metrics/degenerate.py)
    m['degenerate'] = why
  return m


def scalars(m: dict, keys=SCALARS) -> dict:
  """{key: float, or None where the metric is not defined (NaN / -inf)} of an `evaluate` result."""
  return {k: (float(m[k]) if np.isfinite(m[k]) else None) for k in keys}


def shard_samples(x: jax.Array, mesh: jax.sharding.Mesh, axis: str = 'data') -> jax.Array:
  """x laid out along its sample axis over mesh axis `axis` (rows padded with zeros to a multiple of it)."""
  from jax.sharding import NamedSharding, PartitionSpec as P
  d = mesh.shape[axis]
  n = x.shape[0]
  if n % d:
    x = jnp.concatenate([jnp.asarray(x), jnp.zeros((d - n % d,) + x.shape[1:], x.dtype)])
  return jax.device_put(x, NamedSharding(mesh, P(axis, None)))
