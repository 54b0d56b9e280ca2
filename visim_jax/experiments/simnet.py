"""The SimNet experiment (paper 002, Garcia & Vogiatzis): warm-up, Eq. 2 training, SimNet* refinement, retrieval.

config.mode:
  'warmup'  : train g to imitate cosine on random vector pairs (cosine spread over [-1, 1], delta = 0) and report
              held-out MSE and Pearson rho (Table 1), with the number of training pairs seen.
  'classes' : a class-labelled set (same class = similar). config.dataset: 'demo' (both sides of the offline demo
              pairs, labelled by source photo), 'folder' (config.data_dir/<class>/<image>), 'features' (an .npz
              with `features` (N, D) and `labels` (N,), optional `names`). Images are split into train / test
              (config.split: 'images' stratified per class, or 'classes' held out); test retrieval is
              leave-one-out among test images (the query itself ignored), mAP / mP@k / recall@k for SimNet and
              cosine. Optional Oxford/Paris evaluation: config.retrieval.gt (classic gt_files folder or revisited
              .pkl) + config.retrieval.features (.npz with `database` (N, D), `queries` (Q, D), optional
              `imlist`).
  'pairs'   : a pairs dataset (TLL: left_i ~ right_i similar, left_i vs right_j dissimilar). config.dataset:
              'tll' (data_dir with left/ right/, optional subset list), 'demo', 'features' (.npz with left/right/
              names). A random train_fraction of the pairs trains; on the rest, aR@k and R@k of the N x N SimNet
              score matrix g([left_i, right_j]) beside cosine.

Phases (one global step counter, one Orbax CheckpointManager of params + optimiser state + loss history):
  warm-up (config.warmup_steps; in 'classes'/'pairs' optional, on random pairs of the feature dimension),
  stage 1 (config.steps of balanced batches: half similar, half dissimilar pairs, sampled afresh each step),
  stage 2 = SimNet* (config.refine_steps > 0): a fresh random set of config.hard_set_size training images
  (pairs) is scored all-against-all; pairs where g is worse than cosine (lower for a match, higher for a
  non-match) form the difficult pool (saved to hard_pairs.npz); each stage-2 batch takes config.hard_fraction of
  its pairs from that pool (half matches, half non-matches when both exist) and the rest as in stage 1. The
  optimiser state is reset when stage 1 starts (warm-up momentum is not carried into training).
  Our reading of the paper's 'train until convergence': fixed step budgets.

Features are L2-normalised (config.normalize) after an optional PCA fitted on training vectors (config.pca_dim),
so warm-up's random unit vectors live on the same sphere as the data.

Outputs (workdir): config.json, metrics.json (schema in docs/simnet.md), curves.npz, TensorBoard scalars,
plots/training_curve.png, plots/warmup_scatter.png (when there was a warm-up), plots/score_vs_cosine.png
(classes / pairs), hard_pairs.npz (SimNet*), checkpoints/ (resumed when present and the fingerprint matches).
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging
from tqdm.auto import tqdm

from visim_jax import report, simnet
from visim_jax.backbones import config as backbone_config
from visim_jax.data import npz
from visim_jax.metrics import map as map_lib
from visim_jax.metrics import retrieval as retrieval_metrics

MODES = ('warmup', 'classes', 'pairs')
DATASETS = {'warmup': ('random',), 'classes': ('demo', 'folder', 'features'), 'pairs': ('tll', 'demo', 'features')}


def default_config() -> ml_collections.ConfigDict:
  """Every field the experiment reads (configs/simnet_*.py start from this)."""
  c = ml_collections.ConfigDict()
  c.experiment = 'simnet'
  c.mode = 'classes'           # 'warmup' | 'classes' | 'pairs'
  c.dataset = 'demo'           # classes: demo | folder | features; pairs: tll | demo | features; warmup: random
  c.data_dir = ''
  c.subset = ''
  c.features = ''
  c.demo = ml_collections.ConfigDict({'root': '', 'n_pairs': 192, 'seed': 0})
  # features
  backbone_config.add_fields(c)
  c.pca_dim = 0                # 0: no PCA; else PCA fitted on the training vectors
  c.normalize = True           # L2-normalise vectors before SimNet (after PCA)
  # model + loss
  c.architecture = 'B'         # Table 1: A | B | C | D, or comma-separated widths '512,512'
  c.delta = 0.4                # Eq. 2 margin (paper: 0.2 .. 0.8)
  # optimisation (Sec. 4.2)
  c.optimizer = 'sgd'          # 'sgd' (paper) | 'adam'
  c.lr = 1e-3
  c.momentum = 0.9
  c.weight_decay = 5e-4
  c.batch_size = 100
  c.warmup_steps = 0           # random-pair warm-up steps (mode warmup: the whole run)
  c.warmup_dim = 512           # mode warmup only: vector size (RMAC: 512)
  c.warmup_eval_pairs = 10000  # held-out random pairs for MSE / rho
  c.init_from = ''             # checkpoints/ folder of a previous run whose latest params start this one
  c.steps = 10000              # stage 1 (balanced random pairs, Eq. 2)
  c.refine_steps = 0           # stage 2 (SimNet*); 0 = plain SimNet
  c.hard_set_size = 500        # images (classes) or pairs (pairs) in the fresh random set scored all-vs-all
  c.hard_fraction = 0.5        # share of each stage-2 batch taken from the difficult pool
  # protocol
  c.split = 'images'           # classes mode: 'images' (stratified) | 'classes' (held-out classes)
  c.test_fraction = 0.25       # classes mode
  c.train_fraction = 0.75      # pairs mode
  c.ks = (1, 5, 10)
  c.seed = 0
  c.retrieval = ml_collections.ConfigDict({'gt': '', 'features': ''})
  # scoring
  c.q_tile = 256
  c.d_tile = 256
  c.score_dtype = 'float32'    # 'float32' | 'bfloat16'
  # outputs
  c.log_every = 100            # steps per jitted chunk (a loss point, an eval point in warm-up)
  c.checkpoint = True
  c.checkpoint_every = 1000
  c.plots = True
  c.debug_stop_after_step = 0  # >0: stop (as if killed) after the checkpoint at this step; for resume tests
  return c


def validate_config(config) -> None:
  def need(cond, field, msg):
    if not cond:
      raise ValueError(f'config.{field}: {msg} (got {config.get(field)!r})')
  need(config.mode in MODES, 'mode', f'one of {MODES}')
  need(config.mode == 'warmup' or config.dataset in DATASETS[config.mode], 'dataset',
       f'one of {DATASETS.get(config.mode)} for mode={config.mode!r}')
  simnet.hidden_sizes(_arch(config.architecture))
  need(config.optimizer in ('sgd', 'adam'), 'optimizer', "'sgd' or 'adam'")
  need(config.lr > 0, 'lr', 'must be > 0')
  need(0 <= config.momentum < 1, 'momentum', 'must be in [0, 1)')
  need(config.weight_decay >= 0, 'weight_decay', 'must be >= 0')
  need(config.batch_size >= 2, 'batch_size', 'must be >= 2')
  need(config.delta >= 0, 'delta', 'must be >= 0')
  for f in ('warmup_steps', 'steps', 'refine_steps'):
    need(config[f] >= 0, f, 'must be >= 0')
  need(config.log_every >= 1, 'log_every', 'must be >= 1')
  need(config.checkpoint_every >= 1, 'checkpoint_every', 'must be >= 1')
  need(config.warmup_eval_pairs >= 10, 'warmup_eval_pairs', 'must be >= 10')
  need(config.pca_dim >= 0, 'pca_dim', 'must be >= 0')
  need(0.0 <= config.hard_fraction <= 1.0, 'hard_fraction', 'must be in [0, 1]')
  need(config.hard_set_size >= 2, 'hard_set_size', 'must be >= 2')
  need(config.q_tile >= 1 and config.d_tile >= 1, 'q_tile', 'tiles must be >= 1')
  need(config.score_dtype in ('float32', 'bfloat16'), 'score_dtype', "'float32' or 'bfloat16'")
  need(len(config.ks) >= 1 and all(int(k) >= 1 for k in config.ks), 'ks', 'positive integers')
  if config.mode == 'warmup':
    need(config.warmup_steps >= 1, 'warmup_steps', 'mode=warmup needs warm-up steps')
    need(config.warmup_dim >= 2, 'warmup_dim', 'must be >= 2')
  else:
    need(config.steps >= 1, 'steps', 'must be >= 1')
    need(config.split in ('images', 'classes'), 'split', "'images' or 'classes'")
    need(0.0 < config.test_fraction < 1.0, 'test_fraction', 'must be in (0, 1)')
    need(0.0 < config.train_fraction < 1.0, 'train_fraction', 'must be in (0, 1)')
    if config.dataset in ('tll', 'folder'):
      need(bool(config.data_dir), 'data_dir', f'a folder is required for dataset={config.dataset}')
    if config.dataset == 'features':
      need(bool(config.features), 'features', 'an .npz path is required for dataset=features')
  if bool(config.retrieval.gt) != bool(config.retrieval.features):
    raise ValueError('config.retrieval: gt and features go together (ground truth + an .npz with database/queries)')
  if config.retrieval.gt and config.mode != 'classes':
    raise ValueError('config.retrieval: Oxford/Paris evaluation is run in mode=classes')
  if config.init_from and not os.path.isdir(config.init_from):
    raise FileNotFoundError(f'config.init_from: {config.init_from} is not a checkpoints folder')


_optimizer = functools.lru_cache(maxsize=16)(simnet.optimizer)


def _arch(a):
  return a if (isinstance(a, str) and ',' not in a) else [int(x) for x in str(a).split(',') if x.strip()]


# ------------------------------------------------------------------------------------------------ data

def _backbone_features(config, groups, progress):
  """groups: [(paths, names, tag)] -> list of (N, D) arrays from the feature cache; plus a description."""
  backbone, layers = backbone_config.build(config)
  out = [backbone_config.features_of(config, backbone, layers, paths, names, tag, progress=progress)
         for paths, names, tag in groups]
  return out, {'backbone': backbone.name, 'weights_sha256': backbone.weights_id, 'layers': list(layers)}


def _check_finite(x, source):
  bad = ~np.isfinite(x).all(axis=1)
  if bad.any():
    raise ValueError(f'{source}: NaN/Inf in {int(bad.sum())} row(s), first row {int(np.argmax(bad))}')


def load_classes(config, progress=True):
  """(features (N, D) float32, labels (N,) int, class names, description)."""
  from visim_jax.data.images import IMAGE_EXTENSIONS
  if config.dataset == 'features':
    z = npz.read_arrays(config.features, ('features', 'labels'))
    x, raw = z['features'].astype(np.float32), z['labels']
    if x.ndim != 2 or raw.shape != (len(x),):
      raise ValueError(f'config.features: {config.features}: features {x.shape} and labels {raw.shape} mismatch')
    _check_finite(x, config.features)
    desc = {'source': os.path.abspath(config.features)}
  else:
    if config.dataset == 'demo':
      from visim_jax.data import demo as demo_lib
      from visim_jax.data import pairs as pairs_lib
      root = demo_lib.demo_pairs(config.demo.root or None, config.demo.n_pairs, config.demo.seed)
      pairs = pairs_lib.load_pairs(root)
      cls = demo_lib.demo_classes(root)
      (left, right), desc = _backbone_features(
          config, [(pairs.left, pairs.names, 'left'), (pairs.right, pairs.names, 'right')], progress)
      x = np.concatenate([left, right])
      raw = np.asarray([cls[n] for n in pairs.names] * 2)
      desc['root'] = root
    else:
      root = config.data_dir
      if not os.path.isdir(root):
        raise FileNotFoundError(f'config.data_dir: {root} not found (expected one sub-folder per class)')
      paths, labels = [], []
      for c in sorted(os.listdir(root)):
        d = os.path.join(root, c)
        if os.path.isdir(d) and not c.startswith('.'):
          files = sorted(f for f in os.listdir(d) if f.lower().endswith(IMAGE_EXTENSIONS))
          paths += [os.path.join(d, f) for f in files]
          labels += [c] * len(files)
      if not paths:
        raise ValueError(f'config.data_dir: {root} has no <class>/<image> files')
      (x,), desc = _backbone_features(config, [(paths, [os.path.relpath(p, root) for p in paths], 'classes')],
                                      progress)
      raw = np.asarray(labels)
      desc['root'] = os.path.abspath(root)
  names, labels = np.unique(raw, return_inverse=True)
  if len(names) < 2:
    raise ValueError(f'config.dataset={config.dataset}: need at least 2 classes, found {len(names)}')
  return x, labels.astype(np.int32), [str(n) for n in names], desc


def load_pair_features(config, progress=True):
  """(left, right, names, description)."""
  from visim_jax.data import pairs as pairs_lib
  if config.dataset == 'features':
    left, right, names = pairs_lib.load_feature_pairs(config.features)
    return left, right, names, {'source': os.path.abspath(config.features)}
  pairs, root = pairs_lib.from_config(config)
  (left, right), desc = _backbone_features(
      config, [(pairs.left, pairs.names, 'left'), (pairs.right, pairs.names, 'right')], progress)
  pairs_lib.check_feature_pairs(left, right, pairs.names, source=f'{config.backbone} features')
  desc['root'] = os.path.abspath(root)
  return left, right, pairs.names, desc


def split_classes(labels, config, rng):
  """(train_idx, test_idx) of a labelled set."""
  n_cls = labels.max() + 1
  if config.split == 'classes':
    perm = rng.permutation(n_cls)
    n_test = max(1, int(round(config.test_fraction * n_cls)))
    test_cls = np.zeros(n_cls, bool)
    test_cls[perm[:n_test]] = True
    test = test_cls[labels]
  else:
    test = np.zeros(len(labels), bool)
    for c in range(n_cls):
      idx = rng.permutation(np.nonzero(labels == c)[0])
      test[idx[:int(round(config.test_fraction * len(idx)))]] = True
  train_idx, test_idx = np.nonzero(~test)[0], np.nonzero(test)[0]
  counts = np.bincount(labels[train_idx], minlength=n_cls)
  if (counts >= 2).sum() < 1 or (counts > 0).sum() < 2:
    raise ValueError(f'config.test_fraction={config.test_fraction}: the training split needs 2 classes, one '
                     f'with 2+ images (class counts {counts.tolist()})')
  if len(test_idx) < 2:
    raise ValueError(f'config.test_fraction={config.test_fraction}: the test split has {len(test_idx)} images')
  return train_idx, test_idx


def preprocess(config, fit_rows, *arrays):
  """Optional PCA (fitted on fit_rows) then L2 normalisation; returns the transformed arrays."""
  if config.pca_dim:
    from visim_jax import pca as pca_lib
    dim = fit_rows.shape[1]
    if config.pca_dim > min(dim, len(fit_rows)):
      raise ValueError(f'config.pca_dim={config.pca_dim} exceeds min(feature dim {dim}, training vectors '
                       f'{len(fit_rows)})')
    p = pca_lib.fit(jnp.asarray(fit_rows), config.pca_dim)
    arrays = [np.asarray(pca_lib.transform(p, jnp.asarray(a))) for a in arrays]
  if config.normalize:
    arrays = [a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12) for a in arrays]
  return [np.asarray(a, np.float32) for a in arrays]


# ------------------------------------------------------------------------------------- pair samplers (pure)

def class_index(labels: np.ndarray) -> dict:
  """Device arrays for sampling pairs from a labelled set: images sorted by class, class blocks, anchors."""
  n_cls = int(labels.max()) + 1
  order = np.argsort(labels, kind='stable').astype(np.int32)
  count = np.bincount(labels, minlength=n_cls).astype(np.int32)
  start = (np.cumsum(count) - count).astype(np.int32)
  pos_in_class = np.empty(len(labels), np.int32)
  pos_in_class[order] = np.arange(len(labels)) - start[labels[order]]
  anchors = np.nonzero(count[labels] >= 2)[0].astype(np.int32)
  return {'labels': labels.astype(np.int32), 'order': order, 'start': start, 'count': count,
          'pos_in_class': pos_in_class, 'anchors': anchors}


def sample_class_pairs(key, idx: dict, n: int):
  """n pairs (i, j, similar): the first n // 2 same-class (j != i), the rest different-class."""
  ka, kp, kn = jax.random.split(key, 3)
  half = n // 2
  a = idx['anchors'][jax.random.randint(ka, (n,), 0, idx['anchors'].shape[0])]
  c = idx['labels'][a]
  cnt, st = idx['count'][c], idx['start'][c]
  p = jax.random.randint(kp, (half,), 0, cnt[:half] - 1)
  p = jnp.where(p >= idx['pos_in_class'][a[:half]], p + 1, p)
  pos_j = idx['order'][st[:half] + p]
  total = idx['labels'].shape[0]
  q = jax.random.randint(kn, (n - half,), 0, total - cnt[half:])
  q = jnp.where(q >= st[half:], q + cnt[half:], q)
  neg_j = idx['order'][q]
  similar = jnp.arange(n) < half
  return a, jnp.concatenate([pos_j, neg_j]), similar


def sample_pair_pairs(key, n_pairs: int, n: int):
  """n (i, j, similar) over a pairs set of n_pairs: half (i, i), half (i, j != i)."""
  ki, kj = jax.random.split(key)
  half = n // 2
  i = jax.random.randint(ki, (n,), 0, n_pairs)
  off = jax.random.randint(kj, (n,), 1, n_pairs)
  similar = jnp.arange(n) < half
  return i, jnp.where(similar, i, (i + off) % n_pairs), similar


def sample_from_pool(key, pool_pos, pool_neg, n):
  """n (i, j, similar) from the difficult pool: half matches, half non-matches (one side alone if the other is
  empty; static shapes decide)."""
  kp, kn = jax.random.split(key)
  if pool_pos.shape[0] and pool_neg.shape[0]:
    n_pos = n // 2
  else:
    n_pos = n if pool_pos.shape[0] else 0
  parts = []
  if n_pos:
    parts.append((pool_pos[jax.random.randint(kp, (n_pos,), 0, pool_pos.shape[0])], jnp.ones((n_pos,), bool)))
  if n - n_pos:
    parts.append((pool_neg[jax.random.randint(kn, (n - n_pos,), 0, pool_neg.shape[0])],
                  jnp.zeros((n - n_pos,), bool)))
  ij = jnp.concatenate([p[0] for p in parts])
  return ij[:, 0], ij[:, 1], jnp.concatenate([p[1] for p in parts])


# ---------------------------------------------------------------------------------------- training chunks

@functools.partial(jax.jit, static_argnames=('tx', 'n_steps', 'batch', 'dim'))
def warmup_chunk(tx, params, opt_state, key, step0, n_steps: int, batch: int, dim: int):
  """n_steps of warm-up (delta = 0 on random pairs). Keys fold in the global step: resuming is exact."""
  def body(carry, step):
    p, s = carry
    x, y, _ = simnet.random_pairs(jax.random.fold_in(key, step), batch, dim)
    loss, g = jax.value_and_grad(simnet.warmup_loss_fn)(p, x, y)
    u, s = tx.update(g, s, p)
    return (optax.apply_updates(p, u), s), loss
  (params, opt_state), losses = jax.lax.scan(body, (params, opt_state), step0 + jnp.arange(n_steps))
  return params, opt_state, losses


@functools.partial(jax.jit, static_argnames=('tx', 'n_steps', 'batch', 'kind', 'n_hard'))
def train_chunk(tx, params, opt_state, key, step0, data, delta, n_steps: int, batch: int, kind: str,
                n_hard: int = 0):
  """n_steps of Eq. 2 on balanced pairs; data = {'a': (Na, D), 'b': (Nb, D), sampler arrays, 'pool_pos',
  'pool_neg'}; kind = 'classes' (a = b = the images) or 'pairs' (a = left, b = right); n_hard of each batch
  from the difficult pool."""
  def sample(k):
    k1, k2 = jax.random.split(k)
    n_rand = batch - n_hard
    if kind == 'classes':
      i, j, sim = sample_class_pairs(k1, data['index'], n_rand)
    else:
      i, j, sim = sample_pair_pairs(k1, data['a'].shape[0], n_rand)
    if n_hard:
      hi, hj, hs = sample_from_pool(k2, data['pool_pos'], data['pool_neg'], n_hard)
      i, j, sim = jnp.concatenate([i, hi]), jnp.concatenate([j, hj]), jnp.concatenate([sim, hs])
    return data['a'][i], data['b'][j], sim

  def body(carry, step):
    p, s = carry
    xi, xj, sim = sample(jax.random.fold_in(key, step))
    loss, g = jax.value_and_grad(simnet.loss_fn)(p, xi, xj, sim, delta)
    u, s = tx.update(g, s, p)
    return (optax.apply_updates(p, u), s), loss
  (params, opt_state), losses = jax.lax.scan(body, (params, opt_state), step0 + jnp.arange(n_steps))
  return params, opt_state, losses


def warmup_eval(params, x, y, c):
  s = jax.jit(simnet.apply)(params, x, y)
  return {k: float(v) for k, v in simnet.regression_stats(s, c).items()}, np.asarray(s)


def mine_hard_pairs(params, a, b, similar, cfg) -> tuple[np.ndarray, np.ndarray, dict]:
  """SimNet*: score all pairs of (a_i, b_j) of a fresh random set; (hard matches (P, 2), hard non-matches (M, 2)
  as local indices, stats). `similar` (n_a, n_b) bool; pairs with similar = None-like (-1) are excluded."""
  s = np.asarray(simnet.score_matrix(params, jnp.asarray(a), jnp.asarray(b), q_tile=cfg.q_tile, d_tile=cfg.d_tile,
                                     compute_dtype=cfg.score_dtype))
  cos = np.asarray(retrieval_metrics.cosine_matrix(jnp.asarray(a), jnp.asarray(b)))
  valid = similar >= 0
  sim = similar == 1
  hard = np.asarray(simnet.hard_pair_mask(jnp.asarray(s), jnp.asarray(cos), jnp.asarray(sim))) & valid
  hp = np.argwhere(hard & sim).astype(np.int32)
  hn = np.argwhere(hard & ~sim & valid).astype(np.int32)
  stats = {'scored_pairs': int(valid.sum()), 'matches': int((sim & valid).sum()),
           'hard_matches': int(len(hp)), 'hard_non_matches': int(len(hn))}
  return hp, hn, stats


# ---------------------------------------------------------------------------------------------- the run

def fingerprint(config, arrays) -> str:
  keep = {k: v for k, v in config.to_dict().items()
          if k not in ('plots', 'checkpoint', 'checkpoint_every', 'debug_stop_after_step', 'log_every',
                       'q_tile', 'd_tile', 'score_dtype', 'retrieval', 'ks')}
  h = hashlib.sha256(json.dumps(keep, sort_keys=True, default=str).encode())
  for a in arrays:
    h.update(np.ascontiguousarray(a).tobytes())
  return h.hexdigest()[:20]


def _restore_params(ckpt_dir):
  import orbax.checkpoint as ocp
  mngr = ocp.CheckpointManager(os.path.abspath(ckpt_dir))
  step = mngr.latest_step()
  if step is None:
    raise FileNotFoundError(f'config.init_from: no checkpoint in {ckpt_dir}')
  saved = mngr.restore(step)
  mngr.close()
  return jax.tree.map(jnp.asarray, saved['params'])


def run(config, workdir: str, progress: bool = True) -> dict:
  import orbax.checkpoint as ocp
  validate_config(config)
  ks = [int(k) for k in config.ks]
  rng = np.random.RandomState(config.seed)
  t0 = time.time()
  desc, extra = {}, {}

  # ------------------------------------------------------------------ data -> (train arrays, test arrays)
  if config.mode == 'warmup':
    dim = int(config.warmup_dim)
    arrays_for_fp = []
  elif config.mode == 'classes':
    x, labels, class_names, desc = load_classes(config, progress)
    train_idx, test_idx = split_classes(labels, config, rng)
    x_train, x_test = preprocess(config, x[train_idx], x[train_idx], x[test_idx])
    retrieval_arrays = None
    if config.retrieval.gt:
      retrieval_arrays = load_retrieval_eval(config, x.shape[1])
      retrieval_arrays = dict(zip(('database', 'queries'), preprocess(
          config, x[train_idx], retrieval_arrays['database'], retrieval_arrays['queries'])), gt=retrieval_arrays['gt'])
    dim = x_train.shape[1]
    arrays_for_fp = [x, labels, train_idx]
    extra = {'n_images': int(len(x)), 'n_classes': len(class_names), 'n_train': int(len(train_idx)),
             'n_test': int(len(test_idx)), 'split': config.split}
  else:
    left, right, names, desc = load_pair_features(config, progress)
    n = len(names)
    perm = rng.permutation(n)
    n_train = int(round(config.train_fraction * n))
    if n_train < 2 or n - n_train < max(ks):
      raise ValueError(f'config.train_fraction={config.train_fraction}: {n} pairs give {n_train} train / '
                       f'{n - n_train} test pairs (need 2+ and at least max(ks) = {max(ks)})')
    train_idx, test_idx = np.sort(perm[:n_train]), np.sort(perm[n_train:])
    fit = np.concatenate([left[train_idx], right[train_idx]])
    l_tr, r_tr, l_te, r_te = preprocess(config, fit, left[train_idx], right[train_idx], left[test_idx],
                                        right[test_idx])
    dim = l_tr.shape[1]
    arrays_for_fp = [left, right, train_idx]
    extra = {'n_pairs': n, 'n_train': int(n_train), 'n_test': int(n - n_train)}

  os.makedirs(workdir, exist_ok=True)
  report.write_config(workdir, config)
  hidden = simnet.hidden_sizes(_arch(config.architecture))
  # one optimiser object per setting: it is a static argument of the jitted chunks (no recompiles across runs)
  tx = _optimizer(config.lr, config.momentum, config.weight_decay, config.optimizer)
  key = jax.random.PRNGKey(config.seed)
  k_init, k_warm, k_eval, k_train, k_refine, k_hard = jax.random.split(key, 6)
  params = simnet.init_params(k_init, dim, hidden)
  if config.init_from:
    loaded = _restore_params(config.init_from)
    if jax.tree.map(jnp.shape, loaded) != jax.tree.map(jnp.shape, params):
      raise ValueError(f'config.init_from: {config.init_from} holds parameters of another shape '
                       f'(architecture or feature dimension differ)')
    params = loaded
  opt_state = tx.init(params)

  W = config.warmup_steps
  S1 = W + (config.steps if config.mode != 'warmup' else 0)
  S2 = S1 + (config.refine_steps if config.mode != 'warmup' else 0)
  losses = np.full((S2,), np.nan, np.float32)
  warm_curve = np.full((S2 // config.log_every + 2, 3), np.nan, np.float32)  # (step, mse, rho)

  # ------------------------------------------------------------------ checkpoints + resume
  step, mngr = 0, None
  ckpt_dir = os.path.join(workdir, 'checkpoints')
  if config.checkpoint:
    fp = fingerprint(config, arrays_for_fp)
    fp_file = os.path.join(workdir, 'checkpoints.fingerprint')
    if os.path.isdir(ckpt_dir) and os.listdir(ckpt_dir):
      old = open(fp_file).read().strip() if os.path.exists(fp_file) else None
      if old != fp:
        raise ValueError(f'{ckpt_dir}: checkpoints of a different config or data; use a new --workdir or delete it')
    if report.is_writer():
      report.atomic_write_text(fp_file, fp + '\n')
    mngr = ocp.CheckpointManager(os.path.abspath(ckpt_dir), options=ocp.CheckpointManagerOptions(max_to_keep=2))
    if mngr.latest_step() is not None:
      step = int(mngr.latest_step())
      target = {'params': params, 'opt_state': opt_state, 'losses': losses, 'warm_curve': warm_curve}
      saved = mngr.restore(step, args=ocp.args.StandardRestore(jax.tree.map(np.asarray, target)))
      params, opt_state = jax.tree.map(jnp.asarray, saved['params']), jax.tree.map(jnp.asarray, saved['opt_state'])
      losses, warm_curve = np.array(saved['losses']), np.array(saved['warm_curve'])
      logging.info('resuming %s at step %d', ckpt_dir, step)

  def save(at):
    if mngr is not None and report.is_writer():
      mngr.save(at, args=ocp.args.StandardSave(jax.tree.map(np.asarray, {
          'params': params, 'opt_state': opt_state, 'losses': losses, 'warm_curve': warm_curve})))
      mngr.wait_until_finished()
    if config.debug_stop_after_step and at >= config.debug_stop_after_step and at < S2:
      raise KeyboardInterrupt(f'stopped after step {at} (simulated kill)')

  # held-out warm-up pairs (fixed)
  wx, wy, wc = simnet.random_pairs(k_eval, int(config.warmup_eval_pairs), dim)

  bar = tqdm(total=S2, initial=step, desc=f'simnet {config.mode}', unit='step', disable=not progress)

  def advance(n_steps, run_chunk):
    nonlocal params, opt_state, step
    params, opt_state, l = run_chunk(step, n_steps)
    l = np.asarray(l)
    if not np.isfinite(l).all():
      raise FloatingPointError(f'training loss is NaN/Inf at steps {step + 1}..{step + n_steps} '
                               '(try a smaller config.lr)')
    losses[step:step + n_steps] = l
    step += n_steps
    bar.update(n_steps)
    bar.set_postfix(loss=f'{l.mean():.4f}')

  def chunks(end):
    while step < end:
      n_steps = min(config.log_every - step % config.log_every, end - step)
      yield n_steps
      at_ckpt = step % config.checkpoint_every == 0 or step == end
      if at_ckpt:
        save(step)

  # ------------------------------------------------------------------ warm-up
  t1 = time.time()
  for n_steps in chunks(W):
    advance(n_steps, lambda s0, n: warmup_chunk(tx, params, opt_state, k_warm, s0, n, config.batch_size, dim))
    stats, _ = warmup_eval(params, wx, wy, wc)
    warm_curve[step // config.log_every + (step % config.log_every > 0)] = (step, stats['mse'], stats['rho'])
  warm_stats, warm_pred = warmup_eval(params, wx, wy, wc) if W or config.mode == 'warmup' else (None, None)

  # ------------------------------------------------------------------ stages 1 and 2
  hard_stats = None
  if config.mode != 'warmup':
    if config.mode == 'classes':
      data = {'a': jnp.asarray(x_train), 'b': jnp.asarray(x_train), 'index': jax.tree.map(jnp.asarray,
              class_index(labels[train_idx]))}
    else:
      data = {'a': jnp.asarray(l_tr), 'b': jnp.asarray(r_tr)}
    if step == W:
      opt_state = tx.init(params)   # a fresh optimiser for training proper
    for n_steps in chunks(S1):
      advance(n_steps, lambda s0, n: train_chunk(tx, params, opt_state, k_train, s0, data, config.delta, n,
                                                 config.batch_size, config.mode))
    if config.refine_steps:
      pool_file = os.path.join(workdir, 'hard_pairs.npz')
      if step == S1 or not os.path.exists(pool_file):
        hp, hn, hard_stats = mine(config, params, data, labels[train_idx] if config.mode == 'classes' else None,
                                  k_hard)
        if report.is_writer():
          from visim_jax.features import save_npz_atomic
          save_npz_atomic(pool_file, pos=hp, neg=hn, stats=json.dumps(hard_stats))
      else:
        with np.load(pool_file, allow_pickle=False) as z:
          hp, hn, hard_stats = z['pos'], z['neg'], json.loads(str(z['stats']))
      n_hard = int(round(config.hard_fraction * config.batch_size)) if (len(hp) or len(hn)) else 0
      data = dict(data, pool_pos=jnp.asarray(hp.reshape(-1, 2)), pool_neg=jnp.asarray(hn.reshape(-1, 2)))
      for n_steps in chunks(S2):
        advance(n_steps, lambda s0, n: train_chunk(tx, params, opt_state, k_refine, s0, data, config.delta, n,
                                                   config.batch_size, config.mode, n_hard))
  bar.close()
  if mngr is not None:
    mngr.close()
  t2 = time.time()

  # ------------------------------------------------------------------ evaluation
  metrics = {'experiment': 'simnet', 'mode': config.mode, 'dataset': config.dataset if config.mode != 'warmup'
             else 'random', **desc, **extra, 'feature_dim': int(dim), 'architecture': str(config.architecture),
             'hidden': list(hidden), 'num_params': simnet.num_params(params), 'delta': config.delta,
             'steps': {'warmup': W, 'stage1': S1 - W, 'stage2_simnet_star': S2 - S1,
                       'batch_size': config.batch_size},
             'pairs_seen': {'warmup': W * config.batch_size, 'training': (S2 - W) * config.batch_size}}
  if warm_stats is not None:
    metrics['warmup'] = {'heldout_pairs': int(config.warmup_eval_pairs), 'train_pairs': W * config.batch_size,
                         'mse': warm_stats['mse'], 'rho': warm_stats['rho'],
                         'paper_table1_rho': {'A': 0.909, 'B': 0.965, 'C': 0.974, 'D': 0.964},
                         'paper_train_pairs': 22_500_000}
  if hard_stats is not None:
    metrics['simnet_star'] = hard_stats
  score_kw = dict(q_tile=config.q_tile, d_tile=config.d_tile, compute_dtype=config.score_dtype)
  scatter = None
  if config.mode == 'classes':
    s = np.asarray(simnet.score_matrix(params, jnp.asarray(x_test), jnp.asarray(x_test), **score_kw))
    cos = np.asarray(retrieval_metrics.cosine_matrix(jnp.asarray(x_test), jnp.asarray(x_test)))
    pos, junk = map_lib.label_masks(labels[test_idx], labels[test_idx], np.arange(len(test_idx)))
    res = {'cosine': map_lib.summarise(cos, pos, junk, ks), 'simnet': map_lib.summarise(s, pos, junk, ks)}
    metrics['results'] = {m: {k: v for k, v in r.items() if k != 'ap'} for m, r in res.items()}
    metrics['protocol'] = 'leave-one-out retrieval among test images; same class = relevant; the query ignored'
    scatter = (cos[~junk], s[~junk], pos[~junk])
    if config.retrieval.gt:
      metrics['oxford_paris'] = evaluate_oxford_paris(params, retrieval_arrays, ks, score_kw)
  elif config.mode == 'pairs':
    s = simnet.score_matrix(params, jnp.asarray(l_te), jnp.asarray(r_te), **score_kw)
    cos = retrieval_metrics.cosine_matrix(jnp.asarray(l_te), jnp.asarray(r_te))
    metrics['results'] = {}
    for name, m in (('cosine', cos), ('simnet', s)):
      ar = np.asarray(retrieval_metrics.asymmetric_recall(m, ks))
      r = np.asarray(retrieval_metrics.recall(m, ks))
      metrics['results'][name] = {**{f'aR@{k}': float(v) for k, v in zip(ks, ar)},
                                  **{f'R@{k}': float(v) for k, v in zip(ks, r)}}
    metrics['protocol'] = ('test split pairs; sim[i, j] = g([left_i, right_j]); aR@k: partner within k in either '
                           'direction (pessimistic ties); R@k: left -> right')
    s, cos = np.asarray(s), np.asarray(cos)
    eye = np.eye(len(s), dtype=bool)
    scatter = (cos.ravel(), s.ravel(), eye.ravel())
  metrics['timing_s'] = {'data_and_features': t1 - t0, 'training': t2 - t1, 'evaluation': time.time() - t2}
  metrics['config'] = config.to_dict()
  report.write_json(os.path.join(workdir, 'metrics.json'), metrics)
  _write_curves_and_plots(config, workdir, losses, warm_curve, W, S1, warm_pred, wc, scatter)
  _print_summary(metrics, ks)
  return metrics


def mine(config, params, data, train_labels, key):
  """Draw the fresh random set (of training images or pairs) and return its difficult pairs as global indices."""
  n = data['a'].shape[0]
  m = min(config.hard_set_size, n)
  sel = np.sort(np.asarray(jax.random.choice(key, n, (m,), replace=False)))
  a, b = np.asarray(data['a'])[sel], np.asarray(data['b'])[sel]
  if train_labels is not None:
    lab = train_labels[sel]
    similar = (lab[:, None] == lab[None, :]).astype(np.int8)
    np.fill_diagonal(similar, -1)    # an image with itself is not a pair
  else:
    similar = np.eye(m, dtype=np.int8)
  hp, hn, stats = mine_hard_pairs(params, a, b, similar, config)
  stats['set_size'] = int(m)
  return sel[hp].astype(np.int32), sel[hn].astype(np.int32), stats


# --------------------------------------------------------------------------- Oxford / Paris evaluation

def load_retrieval_eval(config, dim):
  from visim_jax.data import retrieval as retrieval_data
  path = config.retrieval.features
  z = npz.read_arrays(path, ('database', 'queries'), ('imlist',), field='config.retrieval.features')
  db, q = z['database'].astype(np.float32), z['queries'].astype(np.float32)
  imlist = [str(n) for n in z['imlist']] if 'imlist' in z else None
  for name, a in (('database', db), ('queries', q)):
    if a.ndim != 2 or a.shape[1] != dim:
      raise ValueError(f'config.retrieval.features: {path}: {name} is {a.shape}, expected (N, {dim}) like the '
                       'training features')
    _check_finite(a, f'{path} ({name})')
  gt = retrieval_data.load_gt(config.retrieval.gt, imlist)
  if len(gt.imlist) != len(db) or len(gt) != len(q):
    raise ValueError(f'config.retrieval: ground truth has {len(gt.imlist)} images / {len(gt)} queries, features '
                     f'{len(db)} / {len(q)}')
  return {'database': db, 'queries': q, 'gt': gt}


def evaluate_oxford_paris(params, arrays, ks, score_kw):
  gt = arrays['gt']
  q, db = jnp.asarray(arrays['queries']), jnp.asarray(arrays['database'])
  out = {'protocol': gt.protocol, 'n_queries': len(gt), 'n_database': len(gt.imlist)}
  for name, s in (('cosine', retrieval_metrics.cosine_matrix(q, db)),
                  ('simnet', simnet.score_matrix(params, q, db, **score_kw))):
    s = np.asarray(s)
    if gt.protocol == 'revisited':
      r = map_lib.evaluate_revisited(s, gt.gnd, ks)
      out[name] = {setting: {k: v for k, v in r[setting].items() if k != 'ap'} for setting in r}
    else:
      out[name] = {k: v for k, v in map_lib.evaluate_classic(s, gt.gnd, ks).items() if k != 'ap'}
  return out


# ---------------------------------------------------------------------------------------------- report

def _write_curves_and_plots(config, workdir, losses, warm_curve, W, S1, warm_pred, wc, scatter):
  if not report.is_writer():
    return
  from visim_jax.features import save_npz_atomic
  wcv = warm_curve[~np.isnan(warm_curve[:, 0])]
  save_npz_atomic(os.path.join(workdir, 'curves.npz'), loss=losses, warmup_eval=wcv,
                  phase_ends=np.asarray([W, S1, len(losses)]))
  writer = report.metric_writer(workdir)
  every = config.log_every
  for end in range(every, len(losses) + every, every):
    chunk = losses[end - every:min(end, len(losses))]
    if len(chunk) and np.isfinite(chunk).any():
      writer.write_scalars(min(end, len(losses)), {'train/loss': float(np.nanmean(chunk))})
  for st, mse, rho in wcv:
    writer.write_scalars(int(st), {'warmup/heldout_mse': float(mse), 'warmup/heldout_rho': float(rho)})
  writer.flush()
  writer.close()
  if not config.plots:
    return
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(1, 2 if len(wcv) else 1, figsize=(11 if len(wcv) else 6, 3.8), squeeze=False)
  ax = ax[0]
  steps = np.arange(1, len(losses) + 1)
  k = max(1, min(every, len(losses) // 50 or 1))
  smooth = np.convolve(np.nan_to_num(losses), np.ones(k) / k, mode='valid')
  ax[0].plot(steps[k - 1:], smooth, lw=1)
  for b, lab in ((W, 'end of warm-up'), (S1, 'SimNet* refinement')):
    if 0 < b < len(losses):
      ax[0].axvline(b, color='k', ls='--', lw=0.8, label=lab)
  ax[0].set_xlabel('step')
  ax[0].set_ylabel('Eq. 2 loss (batch mean |s - target|)')
  ax[0].grid(alpha=0.3)
  if W < len(losses) and W:
    ax[0].legend(fontsize=8)
  if len(wcv):
    ax[1].plot(wcv[:, 0], wcv[:, 2], label='held-out rho')
    ax[1].set_xlabel('warm-up step')
    ax[1].set_ylabel('Pearson rho (g vs cosine)')
    ax[1].grid(alpha=0.3)
    a2 = ax[1].twinx()
    a2.semilogy(wcv[:, 0], wcv[:, 1], color='C1', label='held-out MSE')
    a2.set_ylabel('MSE')
    ax[1].set_title('warm-up: imitating cosine')
  report.save_figure(fig, os.path.join(workdir, 'plots', 'training_curve.png'))
  if warm_pred is not None:
    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    n = min(len(warm_pred), 5000)
    ax.scatter(np.asarray(wc)[:n], warm_pred[:n], s=2, alpha=0.4)
    ax.plot([-1, 1], [-1, 1], 'k--', lw=0.8)
    ax.set_xlabel('cosine similarity')
    ax.set_ylabel('SimNet score')
    ax.set_title('warm-up, held-out random pairs')
    report.save_figure(fig, os.path.join(workdir, 'plots', 'warmup_scatter.png'))
  if scatter is not None:
    cos, s, match = scatter
    rng = np.random.RandomState(0)
    fig, ax = plt.subplots(figsize=(4.8, 4.5))
    for m, lab, col in ((False, 'non-match', 'C0'), (True, 'match', 'C3')):
      idx = np.nonzero(match == m)[0]
      idx = rng.choice(idx, min(len(idx), 4000), replace=False) if len(idx) else idx
      ax.scatter(cos[idx], s[idx], s=3, alpha=0.4, label=lab, color=col)
    lo, hi = float(min(cos.min(), s.min())), float(max(cos.max(), s.max()))
    ax.plot([lo, hi], [lo, hi], 'k--', lw=0.8)
    ax.set_xlabel('cosine similarity')
    ax.set_ylabel('SimNet score')
    ax.legend(fontsize=8)
    ax.set_title('test pairs: SimNet vs cosine')
    report.save_figure(fig, os.path.join(workdir, 'plots', 'score_vs_cosine.png'))


def _print_summary(metrics, ks):
  print(f"\nSimNet {metrics['mode']} ({metrics['dataset']}), architecture {metrics['architecture']} "
        f"({metrics['num_params']:,} params), feature dim {metrics['feature_dim']}")
  if 'warmup' in metrics:
    w = metrics['warmup']
    print(report.table([[w['train_pairs'], w['heldout_pairs'], w['mse'], w['rho']]],
                       ['warm-up train pairs', 'held-out pairs', 'MSE', 'rho']))
  if 'results' in metrics:
    names = [k for k in metrics['results']['cosine'] if '@' in k or k == 'mAP']
    rows = [[m] + [metrics['results'][m][k] for k in names] for m in ('cosine', 'simnet')]
    print(report.table(rows, ['similarity'] + names))
  if 'oxford_paris' in metrics:
    o = metrics['oxford_paris']
    if o['protocol'] == 'revisited':
      rows = [[m] + [o[m][s]['mAP'] for s in map_lib.REVISITED_SETTINGS] for m in ('cosine', 'simnet')]
      print(report.table(rows, ['similarity', 'mAP easy', 'mAP medium', 'mAP hard']))
    else:
      print(report.table([[m, o[m]['mAP']] for m in ('cosine', 'simnet')], ['similarity', 'mAP (classic)']))
