"""SimNet: a non-metric similarity network on pairs of image vectors (paper 002, Garcia & Vogiatzis).

Model (Sec. 3.2): s_ij = g([x_i, x_j]), an MLP on the *concatenated* pair (order matters: g is not symmetric),
ReLU after every fully connected layer but the last, one scalar out. Table 1's architectures are ARCHITECTURES
(hidden widths; the final FC-1 is implied): A (1024, 1024), B (4096, 4096; the paper's default), C (8192, 8192),
D (4096, 4096, 4096).

Loss (Eq. 2): L = | s_ij - l_ij (sim(x_i, x_j) + delta) - (1 - l_ij)(sim(x_i, x_j) - delta) |, sim = cosine,
l_ij = 1 for a similar pair (Eq. 3). Averaged over the batch. delta = 0 is the warm-up (imitate cosine).

Warm-up (Sec. 4.2-4.3): random pairs of vectors whose cosine is spread uniformly over [-1, 1]
(`random_pairs`), delta = 0; measured by MSE and Pearson rho between g and cosine (Table 1). The authors'
imdb_random_vectors.m draws x uniformly in the cube [-1, 1]^D then normalises it (x_dist='cube', the default),
not uniformly on the sphere (x_dist='sphere').

Optimiser (Sec. 4.2): SGD, lr 1e-3, momentum 0.9, weight decay 5e-4 (added to the gradient before momentum, as
MatConvNet's cnn_train / torch.optim.SGD do: optax.add_decayed_weights then optax.sgd), batch 100. Weight decay
applies to the weights only, not the biases (the authors' init_simnet_simplenn.m: weightDecay [1 0]; an optax
mask); `decay_biases=True` decays both.

Difficult pairs (SimNet*, Sec. 3.3): `hard_pair_mask` marks pairs where the network does worse than the metric:
s < cos for a match, s > cos for a non-match.

All-pairs scoring (`score_matrix`, `top_k`): the first layer is split per image, W1 = [W1a; W1b] (W1a acts on
x_i, W1b on x_j), so h1 = relu(x_i W1a + x_j W1b + b1): each query and database vector is projected once per
tile and the (Q, D, 2K) concatenation is never formed. The Q x D grid is cut into (q_tile x d_tile) tiles so
the live activations are q_tile * d_tile * H whatever Q and D; `top_k` keeps a running top-k per query over the
database tiles (visim_jax.core.ops.running_topk, the package's one running top-k), so its memory is O(Q k) besides one
tile.
`compute_dtype='bfloat16'` runs the hidden layers in bfloat16 (float32 accumulation is left to XLA's defaults).

Initialisation (not stated in the paper): init='he' (default): He-normal weights (fan-in, for ReLU), zero biases,
the last layer LeCun-normal; init='normal': every weight N(0, init_std^2) with init_std = 0.01, zero biases (the
authors' init_simnet_simplenn.m, f = 1/100; what `:paper` uses).
"""
from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import optax

from visim_jax.core import cpu_kernels
from visim_jax.core import ops

ARCHITECTURES: dict[str, tuple[int, ...]] = {
    'A': (1024, 1024),
    'B': (4096, 4096),
    'C': (8192, 8192),
    'D': (4096, 4096, 4096),
}

Params = dict  # {'layer_00': {'w': (in, out), 'b': (out,)}, ...}


def hidden_sizes(architecture: str | Sequence[int]) -> tuple[int, ...]:
  """Table 1 letter -> hidden widths; a sequence of ints is taken as the widths themselves."""
  if isinstance(architecture, str):
    if architecture.upper() not in ARCHITECTURES:
      raise ValueError(f'config.architecture: unknown {architecture!r}; known: {", ".join(ARCHITECTURES)} '
                       'or a comma-separated list of widths')
    return ARCHITECTURES[architecture.upper()]
  sizes = tuple(int(h) for h in architecture)
  if not sizes or min(sizes) < 1:
    raise ValueError(f'config.architecture: widths must be positive, got {sizes}')
  return sizes


def layer_names(params: Params) -> list[str]:
  return sorted(params)


INITS = ('he', 'normal')


def init_params(key: jax.Array, dim: int, hidden: Sequence[int], init: str = 'he',
                init_std: float = 0.01) -> Params:
  """Parameters of g for image vectors of size `dim` (input 2 * dim); init 'he' or 'normal' (N(0, init_std^2))."""
  if init not in INITS:
    raise ValueError(f'config.init: one of {INITS}, got {init!r}')
  sizes = (2 * dim, *hidden, 1)
  keys = jax.random.split(key, len(sizes) - 1)
  params = {}
  for i, (k, n_in, n_out) in enumerate(zip(keys, sizes[:-1], sizes[1:])):
    last = i == len(sizes) - 2
    std = init_std if init == 'normal' else (1.0 if last else 2.0) ** 0.5 / n_in ** 0.5
    params[f'layer_{i:02d}'] = {'w': std * jax.random.normal(k, (n_in, n_out), jnp.float32),
                                'b': jnp.zeros((n_out,), jnp.float32)}
  return params


def num_params(params: Params) -> int:
  return int(sum(x.size for x in jax.tree.leaves(params)))


def _mlp_tail(params: Params, h: jax.Array, dtype=jnp.float32) -> jax.Array:
  """Layers 2..L on first-layer pre-activations h (..., H1): relu, then FC+relu, ..., last FC -> (...)."""
  names = layer_names(params)
  h = jax.nn.relu(h.astype(dtype))
  for name in names[1:-1]:
    h = jax.nn.relu(h @ params[name]['w'].astype(dtype) + params[name]['b'].astype(dtype))
  last = params[names[-1]]
  out = h @ last['w'].astype(dtype) + last['b'].astype(dtype)
  return out[..., 0].astype(jnp.float32)


def apply(params: Params, xi: jax.Array, xj: jax.Array) -> jax.Array:
  """s = g([x_i, x_j]) for aligned batches (B, K), (B, K) -> (B,): the literal concatenation."""
  first = params[layer_names(params)[0]]
  x = jnp.concatenate([xi, xj], axis=-1)
  return _mlp_tail(params, x @ first['w'] + first['b'])


def cosine(xi: jax.Array, xj: jax.Array, eps: float = 1e-12) -> jax.Array:
  """Row-wise cosine similarity of aligned batches: (B, K), (B, K) -> (B,)."""
  num = jnp.sum(xi * xj, axis=-1)
  return num / jnp.maximum(jnp.linalg.norm(xi, axis=-1) * jnp.linalg.norm(xj, axis=-1), eps)


def targets(cos: jax.Array, similar: jax.Array, delta: float | jax.Array) -> jax.Array:
  """Eq. 2's regression target: cos + delta for a similar pair, cos - delta otherwise."""
  similar = similar.astype(cos.dtype)
  return similar * (cos + delta) + (1.0 - similar) * (cos - delta)


def loss_fn(params: Params, xi: jax.Array, xj: jax.Array, similar: jax.Array,
            delta: float | jax.Array) -> jax.Array:
  """Mean over the batch of Eq. 2: |s_ij - target_ij|."""
  s = apply(params, xi, xj)
  return jnp.mean(jnp.abs(s - targets(cosine(xi, xj), similar, delta)))


def warmup_loss_fn(params: Params, xi: jax.Array, xj: jax.Array) -> jax.Array:
  """Eq. 2 with delta = 0 (the label no longer matters): mean |s - cos|."""
  return jnp.mean(jnp.abs(apply(params, xi, xj) - cosine(xi, xj)))


def hard_pair_mask(scores: jax.Array, cos: jax.Array, similar: jax.Array) -> jax.Array:
  """SimNet* difficult pairs: the network is worse than the metric (lower for a match, higher for a non-match)."""
  return jnp.where(similar, scores < cos, scores > cos)


def decay_mask(params: Params) -> Params:
  """False for the biases (leaves named 'b'), True for everything else (the authors' weightDecay [1 0])."""
  return jax.tree_util.tree_map_with_path(lambda path, _: getattr(path[-1], 'key', None) != 'b', params)


def optimizer(lr: float = 1e-3, momentum: float = 0.9, weight_decay: float = 5e-4,
              kind: str = 'sgd', decay_biases: bool = False) -> optax.GradientTransformation:
  """The paper's SGD (weight decay added to the gradient, then momentum; biases not decayed unless
  decay_biases); 'adam' for quick local runs."""
  decay = optax.add_decayed_weights(weight_decay, mask=None if decay_biases else decay_mask)
  if kind == 'sgd':
    return optax.chain(decay, optax.sgd(lr, momentum=momentum or None))
  if kind == 'adam':
    return optax.chain(decay, optax.adam(lr))
  raise ValueError(f"config.optimizer: 'sgd' or 'adam', got {kind!r}")


def train_step(tx: optax.GradientTransformation, params: Params, opt_state, xi, xj, similar, delta):
  """One optimiser step on Eq. 2; returns (params, opt_state, loss). Jit with tx static (or closed over)."""
  loss, grads = jax.value_and_grad(loss_fn)(params, xi, xj, similar, delta)
  updates, opt_state = tx.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state, loss


# ------------------------------------------------------------------------------------------- warm-up data

X_DISTS = ('cube', 'sphere')


def random_pairs(key: jax.Array, n: int, dim: int, norm: float = 1.0,
                 x_dist: str = 'cube') -> tuple[jax.Array, jax.Array, jax.Array]:
  """n random pairs (x, y) of `dim`-vectors of length `norm` whose cosine c ~ U(-1, 1); returns (x, y, c).

  x: x_dist='cube' draws U(-1, 1)^dim and normalises (the authors' imdb_random_vectors.m: x = 2 rand(D,1) - 1);
  'sphere' a uniform direction (Gaussian, normalised). y = c x + sqrt(1 - c^2) u, u = the normalised part of a
  Gaussian w orthogonal to x (as the authors').
  """
  if x_dist not in X_DISTS:
    raise ValueError(f'config.warmup_x_dist: one of {X_DISTS}, got {x_dist!r}')
  kx, ku, kc = jax.random.split(key, 3)
  if x_dist == 'cube':
    x = jax.random.uniform(kx, (n, dim), minval=-1.0, maxval=1.0)
  else:
    x = jax.random.normal(kx, (n, dim))
  x = ops.l2_normalize(x)
  u = jax.random.normal(ku, (n, dim))
  u = ops.l2_normalize(u - jnp.sum(u * x, axis=-1, keepdims=True) * x)
  c = jax.random.uniform(kc, (n,), minval=-1.0, maxval=1.0)
  y = c[:, None] * x + jnp.sqrt(jnp.maximum(1.0 - c ** 2, 0.0))[:, None] * u
  return norm * x, norm * y, c


def regression_stats(pred: jax.Array, target: jax.Array) -> dict[str, jax.Array]:
  """MSE and Pearson correlation rho between predictions and targets (Table 1's two columns)."""
  pred, target = pred.astype(jnp.float32), target.astype(jnp.float32)
  mse = jnp.mean((pred - target) ** 2)
  pc, tc = pred - pred.mean(), target - target.mean()
  rho = jnp.sum(pc * tc) / jnp.maximum(jnp.sqrt(jnp.sum(pc ** 2) * jnp.sum(tc ** 2)), 1e-12)
  return {'mse': mse, 'rho': rho}


# ------------------------------------------------------------------------------------- all-pairs scoring

def split_first_layer(params: Params) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(W1a, W1b, b1): W1 = [W1a; W1b], so [x_i, x_j] W1 = x_i W1a + x_j W1b."""
  first = params[layer_names(params)[0]]
  k = first['w'].shape[0] // 2
  return first['w'][:k], first['w'][k:], first['b']


def _pad_rows(x: jax.Array, multiple: int) -> jax.Array:
  pad = (-x.shape[0]) % multiple
  return jnp.pad(x, ((0, pad), (0, 0))) if pad else x


def _tile_scores(params: Params, qa: jax.Array, db_tile: jax.Array, w1b: jax.Array, dtype) -> jax.Array:
  """Scores of query projections qa (q, H) (b1 included) against raw database vectors (d, K) -> (q, d)."""
  db = db_tile.astype(dtype) @ w1b.astype(dtype)           # (d, H)
  h = qa.astype(dtype)[:, None, :] + db[None, :, :]        # (q, d, H): never (q, d, 2K)
  return _mlp_tail(params, h, dtype)


def _tiles(q_tile: int, d_tile: int, n_q: int, n_d: int) -> tuple[int, int]:
  return max(1, min(q_tile, n_q)), max(1, min(d_tile, n_d))


@functools.partial(cpu_kernels.jit, static_argnames=('q_tile', 'd_tile', 'compute_dtype'))
def score_matrix(params: Params, queries: jax.Array, database: jax.Array, q_tile: int = 256,
                 d_tile: int = 256, compute_dtype: str = 'float32') -> jax.Array:
  """S[a, b] = g([queries[a], database[b]]) for every pair: (Q, K), (D, K) -> (Q, D) float32, tile by tile."""
  dtype = jnp.dtype(compute_dtype)
  n_q, n_d = queries.shape[0], database.shape[0]
  q_tile, d_tile = _tiles(q_tile, d_tile, n_q, n_d)
  w1a, w1b, b1 = split_first_layer(params)
  qs = _pad_rows(queries, q_tile).reshape(-1, q_tile, queries.shape[1])
  ds = _pad_rows(database, d_tile).reshape(-1, d_tile, database.shape[1])

  def per_query_tile(q):
    qa = q.astype(dtype) @ w1a.astype(dtype) + b1.astype(dtype)
    return jax.lax.map(lambda d: _tile_scores(params, qa, d, w1b, dtype), ds)   # (nd, q, d)

  out = jax.lax.map(per_query_tile, qs)                    # (nq, nd, q_tile, d_tile)
  out = out.transpose(0, 2, 1, 3).reshape(qs.shape[0] * q_tile, ds.shape[0] * d_tile)
  return out[:n_q, :n_d]


@functools.partial(cpu_kernels.jit, static_argnames=('k', 'q_tile', 'd_tile', 'compute_dtype'))
def top_k(params: Params, queries: jax.Array, database: jax.Array, k: int, q_tile: int = 256,
          d_tile: int = 256, compute_dtype: str = 'float32') -> tuple[jax.Array, jax.Array]:
  """The k best database items per query by g([q, x]): (scores (Q, k) descending, indices (Q, k) int32).

  Streams over database tiles keeping a running top-k (never the full (Q, D) matrix). Ties keep the lower
  database index first. Requires k <= D.
  """
  dtype = jnp.dtype(compute_dtype)
  n_q, n_d = queries.shape[0], database.shape[0]
  if not 1 <= k <= n_d:
    raise ValueError(f'top_k: k={k} must be in [1, {n_d}] (the database size)')
  q_tile, d_tile = _tiles(q_tile, d_tile, n_q, n_d)
  w1a, w1b, b1 = split_first_layer(params)
  qs = _pad_rows(queries, q_tile).reshape(-1, q_tile, queries.shape[1])
  ds = _pad_rows(database, d_tile).reshape(-1, d_tile, database.shape[1])

  def per_query_tile(q):
    qa = q.astype(dtype) @ w1a.astype(dtype) + b1.astype(dtype)
    return ops.running_topk(lambda d, _: _tile_scores(params, qa, d, w1b, dtype), ds, k, q_tile, n_valid=n_d)

  s, i = jax.lax.map(per_query_tile, qs)
  return s.reshape(-1, k)[:n_q], i.reshape(-1, k)[:n_q]


@functools.partial(cpu_kernels.jit, static_argnames=('q_tile', 'd_tile'))
def score_matrix_naive(params: Params, queries: jax.Array, database: jax.Array, q_tile: int = 64,
                       d_tile: int = 256) -> jax.Array:
  """Reference: forms [x_i, x_j] for every pair of a tile and applies g (what one writes without the split)."""
  n_q, n_d, kdim = queries.shape[0], database.shape[0], queries.shape[1]
  q_tile, d_tile = _tiles(q_tile, d_tile, n_q, n_d)
  qs = _pad_rows(queries, q_tile).reshape(-1, q_tile, kdim)
  ds = _pad_rows(database, d_tile).reshape(-1, d_tile, kdim)

  def tile(q, d):
    xi = jnp.broadcast_to(q[:, None, :], (q_tile, d_tile, kdim)).reshape(-1, kdim)
    xj = jnp.broadcast_to(d[None, :, :], (q_tile, d_tile, kdim)).reshape(-1, kdim)
    return apply(params, xi, xj).reshape(q_tile, d_tile)

  out = jax.lax.map(lambda q: jax.lax.map(lambda d: tile(q, d), ds), qs)
  out = out.transpose(0, 2, 1, 3).reshape(qs.shape[0] * q_tile, ds.shape[0] * d_tile)
  return out[:n_q, :n_d]


# ------------------------------------------------------------------------------ pair samplers (pure, jittable)

def class_index(labels) -> dict:
  """Host arrays for sampling pairs from a labelled set: images sorted by class, class blocks, anchors."""
  import numpy as np
  labels = np.asarray(labels)
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


# ---------------------------------------------------------------------------- training chunks (jitted)

@functools.partial(cpu_kernels.jit, static_argnames=('tx', 'n_steps', 'batch', 'dim', 'x_dist'))
def warmup_chunk(tx, params, opt_state, key, step0, n_steps: int, batch: int, dim: int, x_dist: str = 'cube'):
  """n_steps of warm-up (delta = 0 on random pairs). Keys fold in the global step: resuming is exact."""
  def body(carry, step):
    p, s = carry
    x, y, _ = random_pairs(jax.random.fold_in(key, step), batch, dim, x_dist=x_dist)
    loss, g = jax.value_and_grad(warmup_loss_fn)(p, x, y)
    u, s = tx.update(g, s, p)
    return (optax.apply_updates(p, u), s), loss
  (params, opt_state), losses = jax.lax.scan(body, (params, opt_state), step0 + jnp.arange(n_steps))
  return params, opt_state, losses


@functools.partial(cpu_kernels.jit, static_argnames=('tx', 'n_steps', 'batch', 'kind', 'n_hard'))
def train_chunk(tx, params, opt_state, key, step0, data, delta, n_steps: int, batch: int, kind: str,
                n_hard: int = 0):
  """n_steps of Eq. 2 on balanced pairs; data = {'a': (Na, D), 'b': (Nb, D), 'index' (class_index arrays),
  'pool_pos', 'pool_neg'}; kind = 'classes' (a = b = the images) or 'pairs' (a = left, b = right); n_hard of
  each batch from the difficult pool."""
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
    loss, g = jax.value_and_grad(loss_fn)(p, xi, xj, sim, delta)
    u, s = tx.update(g, s, p)
    return (optax.apply_updates(p, u), s), loss
  (params, opt_state), losses = jax.lax.scan(body, (params, opt_state), step0 + jnp.arange(n_steps))
  return params, opt_state, losses


def hard_pairs(params: Params, a, b, similar, q_tile: int = 256, d_tile: int = 256, compute_dtype: str = 'float32'):
  """SimNet*: score all pairs (a_i, b_j) of a fresh random set; returns (hard matches (P, 2), hard non-matches
  (M, 2) as local indices, stats). `similar` (n_a, n_b) int: 1 match, 0 non-match, -1 excluded (i with i)."""
  import numpy as np
  from visim_jax.metrics import retrieval
  s = score_matrix(params, jnp.asarray(a), jnp.asarray(b), q_tile=q_tile, d_tile=d_tile, compute_dtype=compute_dtype)
  cos = retrieval.cosine_matrix(jnp.asarray(a), jnp.asarray(b))
  valid = similar >= 0
  sim = similar == 1
  hard = np.asarray(hard_pair_mask(s, cos, jnp.asarray(sim))) & valid
  hp = np.argwhere(hard & sim).astype(np.int32)
  hn = np.argwhere(hard & ~sim & valid).astype(np.int32)
  stats = {'scored_pairs': int(valid.sum()), 'matches': int((sim & valid).sum()),
           'hard_matches': int(len(hp)), 'hard_non_matches': int(len(hn))}
  return hp, hn, stats
