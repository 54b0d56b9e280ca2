r"""Look-alike search: index a folder of images, answer query images with their top-k look-alikes.

  python -m visim_jax.search --folder=photos/ --query=me.jpg --k=8 --out=search_out
  python -m visim_jax.search --folder=photos/ --query=a.jpg b.jpg --adapter=workdirs/demo/adapter.npz
  python -m visim_jax.search --folder=TLL/ --query=all --adapter=W/adapter.npz     # pairs folder: evaluate

Similarity is the cosine of the pooled backbone features (paper 001, Sec. 3) or, with --adapter, of the adapted
vectors relu(((x - mean) @ components * scale) @ w) (visim_jax/export.py). A folder holding left/ and right/
(the TLL layout, e.g. the demo pairs) is a *pairs folder*: right/ is indexed and `--query=all` asks every
left image for its look-alikes and reports where its partner (the same file name in right/) ranks; its
features share the adaptation experiment's cache entries (same tags and names, same --cache_dir). In a
plain folder `--query=all` asks every indexed image for its look-alikes among the others (itself excluded).

The math (pure, jitted): the index is the L2-normalised (N, D) matrix, split along N into one shard per
local device (a Mesh over jax.local_devices(), NamedSharding on the database axis; padded rows are masked).
Each device scans its shard in blocks of `block` rows keeping a running exact top-k per query (lax.top_k of
[running k | block scores], so memory is O(Q (k + block)) whatever N), then the S x k shard candidates are
merged by one more top_k. Ties go to the lower index (lax.top_k is stable and candidates stay in index
order), i.e. exactly a stable argsort of -score. Partner ranks are pessimistic on ties, as in
visim_jax/metrics/retrieval.py: rank = 1 + #{j != partner : s_j >= s_partner}.
Queries are processed in fixed-size chunks (one compilation).

Outputs in --out: results.json (schema in docs/search.md), topk.npz (scores, indices, names), sheet.png
(contact sheet: each query and its top results, the partner framed in green) and sheet.html (the same with
relative image paths, open it beside the images).
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import html
import json
import os
import time
import urllib.parse
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from visim_jax import export
from visim_jax import sharding as sharding_lib

AXIS = 'db'


# ------------------------------------------------------------------------------------------ pure math

def normalise(x: jax.Array, eps: float = 1e-12) -> jax.Array:
  x = x.astype(jnp.float32)
  return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), eps)


def _scores(q: jax.Array, d: jax.Array) -> jax.Array:
  precision = jax.lax.Precision.HIGHEST if d.dtype == jnp.float32 else None
  return jnp.einsum('qd,nd->qn', q.astype(d.dtype), d, precision=precision, preferred_element_type=jnp.float32)


def block_topk(queries: jax.Array, database: jax.Array, valid: jax.Array, exclude: jax.Array, k: int,
               block: int, offset: jax.Array | int = 0) -> tuple[jax.Array, jax.Array]:
  """Exact top-k of queries (Q, D) against database (n, D) (n a multiple of block), scanned in blocks.

  valid (n,) masks padded rows; exclude (Q,) is a global index each query must not return (-1: none);
  offset is the global index of database row 0. Returns (scores (Q, k) descending, global indices (Q, k);
  -inf / -1 where fewer than k rows qualify).
  """
  n, dim = database.shape
  q = queries.shape[0]
  nb = n // block
  blocks = (database.reshape(nb, block, dim), valid.reshape(nb, block), jnp.arange(nb))

  def step(carry, xs):
    top_s, top_i = carry
    d, v, b = xs
    idx = offset + b * block + jnp.arange(block, dtype=jnp.int32)
    s = _scores(queries, d)
    s = jnp.where(v[None, :] & (idx[None, :] != exclude[:, None]), s, -jnp.inf)
    cand_s = jnp.concatenate([top_s, s], axis=1)  # running candidates first: they have the lower indices
    cand_i = jnp.concatenate([top_i, jnp.broadcast_to(idx, (q, block))], axis=1)
    top_s, pos = jax.lax.top_k(cand_s, k)
    return (top_s, jnp.take_along_axis(cand_i, pos, axis=1)), None

  init = (jnp.full((q, k), -jnp.inf, jnp.float32), jnp.full((q, k), -1, jnp.int32))
  (top_s, top_i), _ = jax.lax.scan(step, init, blocks)
  return top_s, jnp.where(jnp.isfinite(top_s), top_i, -1)


def block_partner_score(queries, database, valid, partner, block, offset=0) -> jax.Array:
  """s(query, database[partner]) computed by the same blocked matmul as the ranking (0 if not in this shard)."""
  n, dim = database.shape
  nb = n // block

  def step(acc, xs):
    d, b = xs
    idx = offset + b * block + jnp.arange(block, dtype=jnp.int32)
    s = _scores(queries, d)
    return acc + jnp.sum(jnp.where(idx[None, :] == partner[:, None], s, 0.0), axis=1), None

  acc, _ = jax.lax.scan(step, jnp.zeros(queries.shape[:1], jnp.float32),
                        (database.reshape(nb, block, dim), jnp.arange(nb)))
  return acc


def block_count_at_least(queries, database, valid, threshold, skip, exclude, block, offset=0) -> jax.Array:
  """#{valid j, j != skip, j != exclude : s(query, j) >= threshold} per query (Q,)."""
  n, dim = database.shape
  nb = n // block

  def step(acc, xs):
    d, v, b = xs
    idx = offset + b * block + jnp.arange(block, dtype=jnp.int32)
    s = _scores(queries, d)
    keep = v[None, :] & (idx[None, :] != skip[:, None]) & (idx[None, :] != exclude[:, None])
    return acc + jnp.sum(keep & (s >= threshold[:, None]), axis=1, dtype=jnp.int32), None

  acc, _ = jax.lax.scan(step, jnp.zeros(queries.shape[:1], jnp.int32),
                        (database.reshape(nb, block, dim), valid.reshape(nb, block), jnp.arange(nb)))
  return acc


@functools.partial(jax.jit, static_argnames=('k', 'block', 'mesh'))
def sharded_topk(queries, shards, valid, exclude, *, k: int, block: int, mesh):
  """Top-k over a database split along its rows across `mesh` (shards (S * n_local, D), valid (S * n_local,))."""
  n_local = shards.shape[0] // mesh.devices.size

  def local(q, d, v, ex):
    off = jax.lax.axis_index(AXIS) * n_local
    s, i = block_topk(q, d, v, ex, k, block, off)
    return s[None], i[None]

  s, i = jax.shard_map(local, mesh=mesh, in_specs=(P(), P(AXIS), P(AXIS), P()), out_specs=(P(AXIS), P(AXIS)),
                     check_vma=False)(
      queries, shards, valid, exclude)
  nq = queries.shape[0]
  s = jnp.transpose(s, (1, 0, 2)).reshape(nq, -1)  # shard order = index order: ties still go to lower indices
  i = jnp.transpose(i, (1, 0, 2)).reshape(nq, -1)
  top_s, pos = jax.lax.top_k(s, k)
  return top_s, jnp.take_along_axis(i, pos, axis=1)


@functools.partial(jax.jit, static_argnames=('block', 'mesh'))
def sharded_partner_ranks(queries, shards, valid, partner, exclude, *, block: int, mesh):
  """1 + #{j != partner : s_j >= s_partner} (pessimistic ties) over the whole sharded database."""
  n_local = shards.shape[0] // mesh.devices.size
  spec = dict(mesh=mesh, in_specs=(P(), P(AXIS), P(AXIS), P(), P()), out_specs=P(AXIS), check_vma=False)

  def score(q, d, v, p, ex):
    return block_partner_score(q, d, v, p, block, jax.lax.axis_index(AXIS) * n_local)[None]

  sp = jax.shard_map(score, **spec)(queries, shards, valid, partner, exclude).sum(0)

  def count(q, d, v, p, ex, t):
    return block_count_at_least(q, d, v, t, p, ex, block, jax.lax.axis_index(AXIS) * n_local)[None]

  spec['in_specs'] = spec['in_specs'] + (P(),)
  return 1 + jax.shard_map(count, **spec)(queries, shards, valid, partner, exclude, sp).sum(0)


# ------------------------------------------------------------------------------------------- the index

@dataclasses.dataclass
class Index:
  """L2-normalised vectors split across the local devices (rows padded to S x n_local, masked by `valid`)."""
  vectors: jax.Array   # (S * n_local, D), NamedSharding P('db')
  valid: jax.Array     # (S * n_local,) bool
  n: int
  block: int
  mesh: jax.sharding.Mesh

  @property
  def dim(self) -> int:
    return int(self.vectors.shape[1])


def build_index(vectors, block: int = 4096, devices=None, dtype: str = 'float32') -> Index:
  """Index of (N, D) vectors (normalised here); block is shrunk to the shard size for small N."""
  vectors = np.asarray(vectors, np.float32)
  if vectors.ndim != 2 or len(vectors) == 0:
    raise ValueError(f'build_index: expected a non-empty (N, D) array, got shape {vectors.shape}')
  if not np.isfinite(vectors).all():
    raise ValueError('build_index: NaN/Inf in the vectors')
  if block < 1:
    raise ValueError(f'--block: must be >= 1, got {block}')
  mesh = sharding_lib.make_mesh(AXIS, devices if devices is not None else jax.local_devices())
  s = mesh.devices.size
  n = len(vectors)
  per = -(-n // s)
  block = min(block, per)
  n_local = -(-per // block) * block
  total = s * n_local
  x = np.zeros((total, vectors.shape[1]), np.float32)
  x[:n] = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
  valid = np.zeros((total,), bool)
  valid[:n] = True
  split = NamedSharding(mesh, P(AXIS))
  return Index(jax.device_put(jnp.asarray(x, jnp.dtype(dtype)), split), jax.device_put(valid, split), n, block,
               mesh)


def _query_chunks(queries: np.ndarray, extra: Sequence[np.ndarray], query_block: int):
  """Yields (start, count, padded queries, padded extras) in fixed-size chunks (one compilation)."""
  nq = len(queries)
  qb = max(1, min(query_block, nq))
  for start in range(0, nq, qb):
    q = queries[start:start + qb]
    c = len(q)
    pad = qb - c
    q = np.concatenate([q, np.zeros((pad, q.shape[1]), np.float32)]) if pad else q
    ex = [np.concatenate([e[start:start + qb], np.full((pad,), -1, np.int32)]) if pad else e[start:start + qb]
          for e in extra]
    yield start, c, q, ex


def search(index: Index, queries, k: int, exclude=None, query_block: int = 256) -> tuple[np.ndarray, np.ndarray]:
  """(scores (Q, k), indices (Q, k)) of the k most cosine-similar index rows for each query row."""
  queries = np.asarray(queries, np.float32)
  if queries.ndim != 2 or queries.shape[1] != index.dim:
    raise ValueError(f'search: queries of shape {queries.shape}, the index holds {index.dim}-d vectors')
  limit = index.n - (1 if exclude is not None else 0)
  if not 1 <= k <= max(limit, 0):
    raise ValueError(f'--k={k}: must be in [1, {limit}] (the index holds {index.n} images'
                     f'{", one excluded per query" if exclude is not None else ""})')
  exclude = np.full((len(queries),), -1, np.int32) if exclude is None else np.asarray(exclude, np.int32)
  qn = np.asarray(normalise(queries))
  rep = NamedSharding(index.mesh, P())
  out_s = np.empty((len(queries), k), np.float32)
  out_i = np.empty((len(queries), k), np.int32)
  for start, c, q, (ex,) in _query_chunks(qn, [exclude], query_block):
    s, i = sharded_topk(jax.device_put(q, rep), index.vectors, index.valid, jax.device_put(ex, rep),
                        k=k, block=index.block, mesh=index.mesh)
    out_s[start:start + c], out_i[start:start + c] = np.asarray(s)[:c], np.asarray(i)[:c]
  return out_s, out_i


def partner_ranks(index: Index, queries, partner, exclude=None, query_block: int = 256) -> np.ndarray:
  """1-based rank of index row partner[q] for each query (pessimistic ties), over the whole index."""
  queries = np.asarray(queries, np.float32)
  partner = np.asarray(partner, np.int32)
  if partner.shape != (len(queries),) or (partner < 0).any() or (partner >= index.n).any():
    raise ValueError(f'partner_ranks: partner must be (Q,) indices into the {index.n} index rows')
  exclude = np.full((len(queries),), -1, np.int32) if exclude is None else np.asarray(exclude, np.int32)
  qn = np.asarray(normalise(queries))
  rep = NamedSharding(index.mesh, P())
  out = np.empty((len(queries),), np.int64)
  for start, c, q, (p, ex) in _query_chunks(qn, [partner, exclude], query_block):
    p = np.where(p < 0, 0, p).astype(np.int32)
    r = sharded_partner_ranks(jax.device_put(q, rep), index.vectors, index.valid, jax.device_put(p, rep),
                              jax.device_put(ex, rep), block=index.block, mesh=index.mesh)
    out[start:start + c] = np.asarray(r)[:c]
  return out


def rank_metrics(ranks: np.ndarray, ks=(1, 5, 10)) -> dict:
  ranks = np.asarray(ranks, np.float64)
  out = {'mean_rank': float(ranks.mean()), 'median_rank': float(np.median(ranks)),
         'mrr': float((1.0 / ranks).mean())}
  out.update({f'recall@{k}': float((ranks <= k).mean()) for k in ks})
  return out


# --------------------------------------------------------------------------- features and the adapter

def _cache_dir(value: str | None) -> str | None:
  if value is None or value == '':
    return os.path.join(os.path.expanduser('~'), '.cache', 'visim_jax', 'features')
  return None if value.lower() == 'none' else value


def features_of(backbone, paths: Sequence[str], root: str, cache_dir: str | None, layers=None, tag: str = 'search',
                batch_size: int = 32, dtype: str = 'float32', progress: bool = True) -> np.ndarray:
  """Pooled features of `paths` (names relative to `root`), through the feature cache."""
  from visim_jax import features as features_lib
  names = [os.path.relpath(p, root) for p in paths]
  return features_lib.cached_features(backbone, list(paths), _cache_dir(cache_dir), layers=layers, names=names,
                                      tag=tag, batch_size=batch_size, dtype=dtype, progress=progress)


def is_pairs_folder(folder: str) -> bool:
  return os.path.isdir(os.path.join(folder, 'left')) and os.path.isdir(os.path.join(folder, 'right'))


def pairs_features(backbone, folder: str, cache_dir: str | None, layers=None, batch_size: int = 32,
                   dtype: str = 'float32', progress: bool = True):
  """(left (N, D), right (N, D), names, left paths, right paths) of a pairs folder, as the CLI computes them."""
  from visim_jax.data import pairs as pairs_lib
  pairs = pairs_lib.load_pairs(folder)
  kw = dict(cache_dir=cache_dir, layers=layers, batch_size=batch_size, dtype=dtype, progress=progress)
  right = features_of(backbone, pairs.right, os.path.join(folder, 'right'), tag='right', **kw)
  left = features_of(backbone, pairs.left, os.path.join(folder, 'left'), tag='left', **kw)
  return left, right, list(pairs.names), list(pairs.left), list(pairs.right)


def check_adapter(adapter: export.Adapter, backbone, layers, source: str) -> None:
  """The adapter was trained on these features: same backbone, weights, layers and preprocessing."""
  meta = adapter.meta
  if meta.get('backbone') is None:
    return  # trained on a features file: nothing to compare but the dimension (checked when applied)
  ours = json.loads(json.dumps(export.backbone_meta(backbone, layers)))  # tuples -> lists, as stored
  for key in export.META_KEYS:
    if meta.get(key) is not None and meta[key] != ours[key]:
      raise ValueError(f'{source}: meta.{key} = {meta[key]!r} but the search uses {ours[key]!r} '
                       f'(index with the backbone and layers the adapter was trained on)')


# ----------------------------------------------------------------------------------------- the sheets

def _thumb(path: str, size: int = 128) -> np.ndarray:
  from visim_jax.data import images as images_lib
  im = images_lib.open_rgb(path)
  im.thumbnail((size, size))
  return np.asarray(im)


def contact_sheet_png(rows: list[dict], path: str, title: str = '') -> None:
  """rows: [{'query': path, 'partner': path or None, 'results': [{'path', 'name', 'score'}]}]."""
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  from visim_jax import report
  ncol = 1 + max(len(r['results']) for r in rows)
  fig, axes = plt.subplots(len(rows), ncol, figsize=(1.7 * ncol, 1.95 * len(rows)), squeeze=False)
  for ax in axes.flat:
    ax.axis('off')
  for r, row in enumerate(rows):
    ax = axes[r, 0]
    ax.imshow(_thumb(row['query']))
    label = os.path.basename(row['query'])
    if row.get('partner_rank') is not None:
      label += f'\npartner rank {row["partner_rank"]}'
    ax.set_title(f'query\n{label}', fontsize=7, color='navy')
    for c, res in enumerate(row['results'], start=1):
      ax = axes[r, c]
      ax.imshow(_thumb(res['path']))
      hit = row.get('partner') is not None and os.path.abspath(res['path']) == os.path.abspath(row['partner'])
      ax.set_title(f'{c}. {os.path.basename(res["name"])}\n{res["score"]:.3f}', fontsize=7,
                   color='green' if hit else 'black')
      if hit:
        ax.axis('on')
        ax.set_xticks([]), ax.set_yticks([])
        for spine in ax.spines.values():
          spine.set_edgecolor('green'), spine.set_linewidth(3)
  fig.tight_layout()
  if title:  # after tight_layout, above the first row's titles
    fig.suptitle(title, fontsize=9, y=1.0, va='bottom')
  report.save_figure(fig, path)


def contact_sheet_html(rows: list[dict], path: str, title: str = '') -> None:
  from visim_jax import report
  folder = os.path.dirname(os.path.abspath(path))
  src = lambda p: urllib.parse.quote(os.path.relpath(os.path.abspath(p), folder).replace(os.sep, '/'))
  esc = html.escape
  out = ['<!doctype html><html><head><meta charset="utf-8"><title>look-alikes</title><style>',
         'body{font-family:sans-serif;font-size:12px} td{vertical-align:top;text-align:center;padding:4px}',
         'img{width:128px;height:128px;object-fit:contain;border:3px solid transparent}',
         '.q img{border-color:navy} .hit img{border-color:green}</style></head><body>',
         f'<h3>{esc(title)}</h3><table>']
  for row in rows:
    cells = [f'<td class="q"><img src="{src(row["query"])}"><br>query<br>{esc(os.path.basename(row["query"]))}'
             + (f'<br>partner rank {row["partner_rank"]}' if row.get('partner_rank') is not None else '') + '</td>']
    for c, res in enumerate(row['results'], start=1):
      hit = row.get('partner') is not None and os.path.abspath(res['path']) == os.path.abspath(row['partner'])
      cells.append(f'<td class="{"hit" if hit else ""}"><img src="{src(res["path"])}"><br>{c}. '
                   f'{esc(res["name"])}<br>{res["score"]:.3f}</td>')
    out.append('<tr>' + ''.join(cells) + '</tr>')
  out.append('</table></body></html>')
  if report.is_writer():
    report.atomic_write_text(path, '\n'.join(out) + '\n')


# ---------------------------------------------------------------------------------------------- the CLI

def _expand_queries(items: Sequence[str]) -> list[str]:
  from visim_jax.data import images as images_lib
  out = []
  for q in items:
    if os.path.isdir(q):
      out.extend(images_lib.list_images(q))
    elif not os.path.exists(q):
      raise FileNotFoundError(f'--query: {q}: image file not found')
    else:
      out.append(q)
  return out


def run(folder: str, query: Sequence[str], adapter: str | None = None, backbone: str | None = None,
        layers: str | None = None, k: int = 10, out: str = 'search_out', cache_dir: str | None = None,
        batch_size: int = 32, dtype: str = 'float32', index_dtype: str = 'float32', block: int = 4096,
        query_block: int = 256, sheet_queries: int = 12, sheet_k: int = 8, formats=('png', 'html'),
        progress: bool = True, verbose: bool = True) -> dict:
  """Indexes `folder`, answers `query` (paths, or ['all']); writes results.json, topk.npz and sheets in `out`."""
  from visim_jax import report
  from visim_jax.backbones import get_backbone
  from visim_jax.data import images as images_lib
  t0 = time.time()
  if not os.path.isdir(folder):
    raise FileNotFoundError(f'--folder: {folder}: not a folder')
  query = list(query or [])
  if not query:
    raise ValueError("--query: give image files / folders, or 'all'")
  if k < 1:
    raise ValueError(f'--k: must be >= 1, got {k}')
  bad = [f for f in formats if f not in ('png', 'html')]
  if bad:
    raise ValueError(f'--format: unknown {bad} (png, html)')
  ad = export.load_adapter(adapter) if adapter else None
  name = backbone or (ad.meta.get('backbone') if ad else None) or 'efficientnet_lite0'
  bb = get_backbone(name)
  layer_list = (tuple(l.strip() for l in layers.split(',') if l.strip()) if layers
                else tuple(ad.meta['layers']) if ad and ad.meta.get('layers') else bb.layers)
  from visim_jax import features as features_lib
  features_lib.layer_dims(bb, layer_list)  # unknown layer names fail before any extraction
  if ad is not None:
    check_adapter(ad, bb, layer_list, adapter)
  pairs_mode = is_pairs_folder(folder)
  all_mode = query == ['all']
  fkw = dict(cache_dir=cache_dir, layers=layer_list, batch_size=batch_size, dtype=dtype, progress=progress)

  partner = None
  if pairs_mode:
    from visim_jax.data import pairs as pairs_lib
    pairs = pairs_lib.load_pairs(folder)
    index_paths, index_root = list(pairs.right), os.path.join(folder, 'right')
  else:
    index_paths, index_root = images_lib.list_images(folder), folder
  index_names = [os.path.relpath(p, index_root) for p in index_paths]
  query_paths = None if all_mode else _expand_queries(query)
  # pairs folders use the adaptation experiment's cache tags and names: searching after training is free
  index_feats = features_of(bb, index_paths, index_root, tag='right' if pairs_mode else 'search-index', **fkw)
  exclude = None
  if all_mode and pairs_mode:
    query_paths = list(pairs.left)
    query_feats = features_of(bb, query_paths, os.path.join(folder, 'left'), tag='left', **fkw)
    partner = np.arange(len(query_paths), dtype=np.int32)  # load_pairs keeps left[i] <-> right[i]
  elif all_mode:
    query_paths, query_feats = index_paths, index_feats
    exclude = np.arange(len(index_paths), dtype=np.int32)
  else:
    query_feats = features_lib.cached_features(bb, query_paths, _cache_dir(cache_dir), layers=layer_list,
                                               tag='search-query', batch_size=batch_size, dtype=dtype,
                                               progress=progress)
    where = {os.path.abspath(p): i for i, p in enumerate(index_paths)}
    exclude = np.asarray([where.get(os.path.abspath(p), -1) for p in query_paths], np.int32)  # not itself
    if pairs_mode:  # a left image of the pairs folder given by path: its partner is known too
      left_of = {os.path.abspath(p): i for i, p in enumerate(pairs.left)}
      part = [left_of.get(os.path.abspath(p), -1) for p in query_paths]
      if all(i >= 0 for i in part):
        partner = np.asarray(part, np.int32)
    if (exclude < 0).all():
      exclude = None
  t1 = time.time()
  if ad is not None:
    index_vecs, query_vecs = np.asarray(export.apply_adapter(ad, index_feats)), np.asarray(export.apply_adapter(ad, query_feats))
  else:
    index_vecs, query_vecs = index_feats, query_feats
  index = build_index(index_vecs, block=block, dtype=index_dtype)
  kk = min(k, index.n - (1 if exclude is not None else 0))
  scores, idx = search(index, query_vecs, kk, exclude, query_block)
  ranks = partner_ranks(index, query_vecs, partner, exclude, query_block) if partner is not None else None
  t2 = time.time()

  os.makedirs(out, exist_ok=True)
  queries_json = []
  for q in range(len(query_paths)):
    entry = {'query': query_paths[q],
             'results': [{'rank': j + 1, 'name': index_names[i], 'path': index_paths[i], 'score': float(s)}
                         for j, (s, i) in enumerate(zip(scores[q], idx[q]))]}
    if ranks is not None:
      entry['partner'] = index_paths[partner[q]]
      entry['partner_rank'] = int(ranks[q])
    queries_json.append(entry)
  summary = {
      'folder': os.path.abspath(folder), 'mode': 'pairs' if pairs_mode else 'folder',
      'query': 'all' if all_mode else 'files', 'backbone': bb.name, 'weights_sha256': bb.weights_id,
      'layers': list(layer_list), 'adapter': os.path.abspath(adapter) if adapter else None,
      'similarity': 'cosine of adapted features' if ad is not None else 'cosine of pooled backbone features',
      'feature_dim': int(index_feats.shape[1]), 'vector_dim': int(index.dim), 'k': kk, 'n_index': index.n,
      'n_queries': len(query_paths), 'devices': int(index.mesh.devices.size),
      'metrics': rank_metrics(ranks) if ranks is not None else None,
      'timing_s': {'features': t1 - t0, 'search': t2 - t1},
      'queries': queries_json if len(queries_json) <= 10000 else None,
  }
  if report.is_writer():
    from visim_jax.features import save_npz_atomic
    arrays = dict(scores=scores, indices=idx, index_names=np.asarray(index_names),
                  query_paths=np.asarray(query_paths))
    if ranks is not None:
      arrays['partner_ranks'] = ranks
    save_npz_atomic(os.path.join(out, 'topk.npz'), **arrays)
  report.write_json(os.path.join(out, 'results.json'), summary)
  rows = [dict(q, results=q['results'][:sheet_k]) for q in queries_json[:sheet_queries]]
  title = (f'{bb.name}{" + adapter" if ad is not None else ""}: top {min(kk, sheet_k)} of {index.n} '
           f'in {os.path.basename(os.path.abspath(folder))}')
  if rows and 'png' in formats:
    contact_sheet_png(rows, os.path.join(out, 'sheet.png'), title)
  if rows and 'html' in formats:
    contact_sheet_html(rows, os.path.join(out, 'sheet.html'), title)
  if verbose:
    shown = min(kk, 3)
    header = ['query'] + ['1st', '2nd', '3rd'][:shown] + (['partner rank'] if ranks is not None else [])
    table = [[os.path.basename(q['query'])] + [f'{r["name"]} ({r["score"]:.3f})' for r in q['results'][:shown]]
             + ([q['partner_rank']] if ranks is not None else []) for q in queries_json[:sheet_queries]]
    print(report.table(table, header))
    if ranks is not None:
      m = summary['metrics']
      print(report.table([[f'{m["mean_rank"]:.2f}', m['median_rank'], m['mrr'], m['recall@1'], m['recall@5'],
                           m['recall@10']]], ['mean rank', 'median', 'MRR', 'R@1', 'R@5', 'R@10']))
    print(f'{len(query_paths)} queries against {index.n} images ({summary["similarity"]}); '
          f'results in {os.path.abspath(out)}')
  return summary


def main(argv=None):
  p = argparse.ArgumentParser(prog='python -m visim_jax.search', description='Look-alike search over a folder.',
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  p.add_argument('--folder', required=True, help='image folder to index, or a pairs folder (left/, right/)')
  p.add_argument('--query', nargs='+', required=True, help="query image files or folders, or 'all'")
  p.add_argument('--adapter', default=None, help='adapter.npz of a trained adaptation (visim_jax/export.py)')
  p.add_argument('--backbone', default=None, help="default: the adapter's backbone, else efficientnet_lite0")
  p.add_argument('--layers', default=None, help="comma-separated stages (default: the adapter's / backbone's)")
  p.add_argument('--k', type=int, default=10, help='look-alikes per query')
  p.add_argument('--out', default='search_out', help='output folder')
  p.add_argument('--cache_dir', default=None, help="feature cache (default ~/.cache/visim_jax/features; 'none')")
  p.add_argument('--batch_size', type=int, default=32, help='images per extraction batch')
  p.add_argument('--dtype', default='float32', choices=('float32', 'bfloat16'), help='backbone compute dtype')
  p.add_argument('--index_dtype', default='float32', choices=('float32', 'bfloat16'), help='stored index dtype')
  p.add_argument('--block', type=int, default=4096, help='database rows scored per step on each device')
  p.add_argument('--query_block', type=int, default=256, help='queries per device call')
  p.add_argument('--sheet_queries', type=int, default=12, help='queries shown in the contact sheets')
  p.add_argument('--sheet_k', type=int, default=8, help='results shown per query in the sheets')
  p.add_argument('--format', default='png,html', help='contact sheet formats: png, html or both')
  p.add_argument('--no_progress', action='store_true', help='no progress bars')
  a = p.parse_args(argv)
  return run(a.folder, a.query, a.adapter, a.backbone, a.layers, a.k, a.out, a.cache_dir, a.batch_size, a.dtype,
             a.index_dtype, a.block, a.query_block, a.sheet_queries, a.sheet_k,
             tuple(f.strip() for f in a.format.split(',') if f.strip()), not a.no_progress)


if __name__ == '__main__':
  main()
