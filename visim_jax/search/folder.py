"""Searching a folder of images: file lists, features through the cache, the adapter, bad images, outputs.

A folder holding left/ and right/ (the TLL layout, e.g. the demo pairs) is a *pairs folder*: right/ is indexed
and `query=['all']` asks every left image for its look-alikes and reports where its partner (the same file
name in right/) ranks; its features share the adaptation experiment's cache entries (same tags and names,
same cache_dir). In a plain folder `query=['all']` asks every indexed image for its look-alikes among the
others (itself excluded).

An image that cannot be decoded is skipped and listed (count + names on the console and in results.json,
`skipped`); in a pairs folder a query whose partner was skipped is dropped with it. strict=True aborts on
the first bad image instead (one-line error naming it). Nothing is decoded twice when every image is good:
the file list is only scanned after an extraction failed.
"""
from __future__ import annotations

import os
import time
from typing import Sequence

import numpy as np

from visim_jax.core import errors, memory, ops, report
from visim_jax.training import adapter_file
from visim_jax.training import runtime
from visim_jax.data import images as images_lib
from visim_jax.core.errors import UserError
from visim_jax.search import index as index_lib
from visim_jax.search import sheets

FORMATS = ('png', 'html')
FLAGS = {'config.backbone': '--backbone', 'config.layers': '--layers', 'config.batch_size': '--batch_size'}


def cache_dir_of(value: str | None) -> str | None:
  """'' / None -> the default feature cache; 'none' -> no cache."""
  if value is None or value == '':
    return os.path.join(os.path.expanduser('~'), '.cache', 'visim_jax', 'features')
  return None if value.lower() == 'none' else value


def _reason(skipped: dict) -> str:
  """The why of a skipped image, without its path (e.g. 'too large to decode safely, a decompression bomb ...')."""
  reason = skipped['reason'].removeprefix(f"{skipped['path']}: ")
  return reason if len(reason) <= 120 else reason[:117] + '...'


def _is_pairs_folder(folder: str) -> bool:
  return os.path.isdir(os.path.join(folder, 'left')) and os.path.isdir(os.path.join(folder, 'right'))


def features_of(backbone, paths: Sequence[str], root: str | None, cache_dir: str | None, layers=None,
                tag: str = 'search', batch_size: int = 32, dtype: str = 'float32', progress: bool = True,
                strict: bool = True, skipped: list | None = None) -> tuple[np.ndarray, list[str]]:
  """(features, kept paths) of `paths` through the feature cache (names relative to `root`; None: the paths).

  strict=False: undecodable images are left out and appended to `skipped` as {'path', 'reason'}.
  """
  from visim_jax.backbones import features as features_lib
  paths = list(paths)

  def extract(ps):
    names = [os.path.relpath(p, root) for p in ps] if root is not None else None
    return features_lib.cached_features(backbone, ps, cache_dir_of(cache_dir), layers=layers, names=names,
                                        tag=tag, batch_size=batch_size, dtype=dtype, progress=progress)

  try:
    return extract(paths), paths
  except images_lib.ImageError as e:
    if strict:
      raise
    first = e
  bad = images_lib.check_images(paths)
  if not bad:
    raise first  # a failure that a second decode does not reproduce: not ours to hide
  if skipped is not None:
    skipped.extend({'path': p, 'reason': r} for p, r in bad)
  bad_paths = {p for p, _ in bad}
  kept = [p for p in paths if p not in bad_paths]
  if not kept:
    raise UserError(f'{bad[0][0]}: none of the {len(paths)} images ({tag}) can be decoded: {bad[0][1]}')
  return extract(kept), kept


def _expand_queries(items: Sequence[str]) -> list[str]:
  out = []
  for q in items:
    if os.path.isdir(q):
      out.extend(images_lib.list_images(q))
    elif not os.path.exists(q):
      raise UserError(f'--query: {q}: image file not found')
    else:
      out.append(q)
  return out


def _check_args(folder, query, k, formats, **counts):
  """Every flag's range, before anything is read (errors name the flag as typed)."""
  if not os.path.isdir(folder):
    raise UserError(f'--folder: {folder}: not a folder (give the folder of images to index)')
  if not query:
    raise UserError("--query: give image files / folders, or 'all'")
  for flag, value in (('k', k), *counts.items()):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
      raise UserError(f'--{flag}: must be >= 1, got {value!r}')
  bad = [f for f in formats if f not in FORMATS]
  if bad:
    raise UserError(f'--format: unknown {bad} (known: {", ".join(FORMATS)})')


def check_vectors(vectors: np.ndarray, source: str) -> None:
  """The vectors searched must rank something: finite, and not all in one direction (then every score ties
  and the order would be the file order: an adapter with W = 0, or a folder of identical images)."""
  vectors = np.asarray(vectors, np.float32)
  bad = int((~np.isfinite(vectors).all(axis=1)).sum())
  if bad:
    raise UserError(f'{source}: {bad} of {len(vectors)} vectors hold NaN/Inf (an adapter with huge weights?); '
                    'nothing can be ranked')
  unit = ops.l2_normalize(vectors)
  if len(unit) > 1 and np.all(unit == unit[0]):
    what = 'the zero vector' if not unit[0].any() else 'one direction'
    raise UserError(f'{source}: every image maps to {what}, so every score ties and nothing can be ranked '
                    '(an adapter with W = 0? identical images?)')


def run(folder: str, query: Sequence[str], adapter: str | None = None, backbone: str | None = None,
        layers: str | None = None, k: int = 10, out: str = 'search_out', cache_dir: str | None = None,
        batch_size: int = 32, dtype: str = 'float32', index_dtype: str = 'float32', block: int = 4096,
        query_block: int = 256, sheet_queries: int = 12, sheet_k: int = 8, formats=FORMATS,
        progress: bool = True, verbose: bool = True, strict: bool = False, model: str | None = None) -> dict:
  """Indexes `folder`, answers `query` (paths, or ['all']); writes results.json, topk.npz and sheets in `out`
  (an `out` ending in .png is the sheet's file: see `output_files`). model: any embedding spec visim_jax.load
  takes (`model_rows`), instead of backbone / layers / adapter."""
  from visim_jax.backbones import get_backbone
  from visim_jax.core import paths  # pylint: disable=g-import-not-at-top
  folder, adapter, out, cache_dir = (paths.expand_path(v) for v in (folder, adapter, out, cache_dir))
  t0 = time.time()
  query = [query] if isinstance(query, str) else list(query or [])
  _check_args(folder, query, k, formats, batch_size=batch_size, block=block, query_block=query_block,
              sheet_queries=sheet_queries, sheet_k=sheet_k)
  all_mode = query == ['all']
  query_files = None if all_mode else _expand_queries(query)  # a missing query fails before any extraction
  ad = adapter_file.load_adapter(adapter) if adapter else None
  transform = None
  if model:
    if adapter or backbone or layers:
      raise UserError('--model: give --model alone, or --backbone / --layers / --adapter (not both)')
    bb, layer_list, transform = model_rows(model)
  else:
    name = backbone or (ad.meta.get('backbone') if ad else None) or 'efficientnet_lite0'
    with errors.as_flags(FLAGS if backbone or not ad else {'config.backbone': f'{adapter}: meta.backbone'}):
      bb = get_backbone(name)
    layer_list = (tuple(l.strip() for l in layers.split(',') if l.strip()) if layers
                  else tuple(ad.meta['layers']) if ad and ad.meta.get('layers') else bb.layers)
  with errors.as_flags(FLAGS):
    bb.layer_dims(layer_list)  # unknown layer names fail before any extraction
  if ad is not None:
    adapter_file.check_backbone(ad, bb, layer_list, adapter)
  outputs = output_files(out, formats)
  ops.check_writable_dir(os.path.dirname(os.path.abspath(outputs['results'])), 'output folder (--out)')  # before extracting
  pairs_mode = _is_pairs_folder(folder)
  skipped: list[dict] = []
  fkw = dict(cache_dir=cache_dir, layers=layer_list, batch_size=batch_size, dtype=dtype, progress=progress,
             strict=strict, skipped=skipped)

  partner = exclude = None
  if pairs_mode:
    from visim_jax.data import pairs as pairs_lib
    pairs = pairs_lib.load_pairs(folder)
    index_root = os.path.join(folder, 'right')
    # pairs folders use the adaptation experiment's cache tags and names: searching after training is free
    index_feats, index_paths = features_of(bb, pairs.right, index_root, tag='right', **fkw)
  else:
    index_root = folder
    index_feats, index_paths = features_of(bb, images_lib.list_images(folder), folder, tag='search-index', **fkw)
  index_names = [os.path.relpath(p, index_root) for p in index_paths]
  row_of = {os.path.abspath(p): i for i, p in enumerate(index_paths)}
  if all_mode and pairs_mode:
    right_of = {os.path.abspath(l): os.path.abspath(r) for l, r in zip(pairs.left, pairs.right)}
    lefts = [l for l in pairs.left if right_of[os.path.abspath(l)] in row_of]  # partner skipped: no query
    query_feats, query_paths = features_of(bb, lefts, os.path.join(folder, 'left'), tag='left', **fkw)
    partner = np.asarray([row_of[right_of[os.path.abspath(p)]] for p in query_paths], np.int32)
  elif all_mode:
    query_paths, query_feats = index_paths, index_feats
    exclude = np.arange(len(index_paths), dtype=np.int32)
  else:
    query_feats, query_paths = features_of(bb, query_files, None, tag='search-query', **fkw)
    exclude = np.asarray([row_of.get(os.path.abspath(p), -1) for p in query_paths], np.int32)  # not itself
    if pairs_mode:  # left images of the pairs folder given by path: their partners are known too
      right_of = {os.path.abspath(l): os.path.abspath(r) for l, r in zip(pairs.left, pairs.right)}
      part = [row_of.get(right_of.get(os.path.abspath(p), ''), -1) for p in query_paths]
      if all(i >= 0 for i in part):
        partner = np.asarray(part, np.int32)
    if (exclude < 0).all():
      exclude = None
  t1 = time.time()
  if ad is not None:
    index_vecs, query_vecs = (np.asarray(adapter_file.apply_adapter(ad, f)) for f in (index_feats, query_feats))
  elif transform is not None:
    index_vecs, query_vecs = (np.asarray(transform(f)) for f in (index_feats, query_feats))
  else:
    index_vecs, query_vecs = index_feats, query_feats
  source = (f'--adapter: {adapter}' if ad is not None else f'--model: {model}' if model else f'--folder: {folder}')
  check_vectors(index_vecs if all_mode and not pairs_mode else np.concatenate([index_vecs, query_vecs]), source)
  n, d = index_vecs.shape
  item = 2 if index_dtype == 'bfloat16' else 4
  parts = {'index': n * d * item, 'score blocks': 2 * query_block * block * 4, 'queries': len(query_vecs) * d * 4}
  drivers = {'--index_dtype=bfloat16': n * d * (item - 2), '--query_block': 2 * (query_block - 1) * block * 4,
             '--block': 2 * query_block * (block - 1) * 4}   # the bytes each saves at its least
  drivers = {f: b for f, b in sorted(drivers.items(), key=lambda fb: -fb[1]) if b > 0} or {'--folder': n * d * item}
  memory.check(parts, drivers, f'{n:,} x {d} index, {index_dtype}',
               what='the search index')   # before anything is put on the device (visim_jax/core/memory.py)
  index = index_lib.build_index(index_vecs, block=block, dtype=index_dtype)
  kk = min(k, index.n - (1 if exclude is not None else 0))
  if kk < 1:
    raise UserError(f'--folder: {folder}: only {index.n} usable image(s) in the index, nothing to search')
  scores, idx = index_lib.search(index, query_vecs, kk, exclude, query_block)
  ranks = index_lib.partner_ranks(index, query_vecs, partner, exclude, query_block) if partner is not None else None
  t2 = time.time()

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
      'layers': list(layer_list), 'adapter': os.path.abspath(adapter) if adapter else None, 'model': model,
      'similarity': ('cosine of adapted features' if ad is not None else f'cosine of {model}\'s embedding' if model
                     else 'cosine of pooled backbone features'),
      'feature_dim': int(index_feats.shape[1]), 'vector_dim': int(index.dim), 'k': kk, 'n_index': index.n,
      'n_queries': len(query_paths), 'devices': int(index.mesh.devices.size),
      'skipped': {'count': len(skipped), 'images': skipped},
      'metrics': index_lib.rank_metrics(ranks) if ranks is not None else None,
      'timing_s': {'features': t1 - t0, 'search': t2 - t1},
      'queries': queries_json if len(queries_json) <= 10000 else None,
  }
  try:
    _write(outputs, summary, scores, idx, index_names, query_paths, ranks, formats, sheet_queries, sheet_k,
           f'{model or bb.name}{" + adapter" if ad is not None else ""}: top {min(kk, sheet_k)} of {index.n} '
           f'in {os.path.basename(os.path.abspath(folder))}')
  except OSError as e:
    raise runtime.os_error(e, out, 'writing the search results') from e
  if verbose:
    _print(summary, ranks, sheet_queries, out)
  return summary


def model_rows(spec: str):
  """(backbone, layers, transform) of an embedding spec visim_jax.load takes (a backbone name, dreamsim,
  cosine:, adapter:, triplets:, ...): the rows its `distance` compares are transform(pooled features) and the
  distance is their cosine, which is what the index ranks. Missing weights are fetched as vj.load fetches them."""
  from visim_jax import api  # pylint: disable=g-import-not-at-top
  from visim_jax.zoo import interface  # pylint: disable=g-import-not-at-top
  try:
    m = api.load(spec)
  except UserError as e:
    raise UserError(f'--model: {e}') from None
  sim = m.similarity
  if not m.is_embedding:
    raise UserError(f'--model: {spec}: {sim.kind} compares two images through its network and has no embedding to '
                    'index; give an embedding model (a backbone name, dreamsim, cosine:, adapter:, triplets:, ...)')
  if sim.distance is not interface.cosine_distance:
    raise UserError(f'--model: {spec}: its distance is not the cosine of one embedding per image ({sim.kind}), which '
                    'is what the index ranks; give cosine:, adapter:, triplets: (cosine) or a backbone name')
  return sim.backbone, tuple(sim.layers), sim.transform


def output_files(out: str, formats=FORMATS) -> dict[str, str]:
  """{'results', 'topk', 'png', 'html'} paths: in the folder `out` (results.json, topk.npz, sheet.png, sheet.html),
  or, for an `out` ending in .png, that file and its siblings STEM.json, STEM.npz, STEM.html."""
  if out.lower().endswith('.png'):
    stem = os.path.splitext(out)[0]
    return {'results': stem + '.json', 'topk': stem + '.npz', 'png': out, 'html': stem + '.html'}
  return {'results': os.path.join(out, 'results.json'), 'topk': os.path.join(out, 'topk.npz'),
          'png': os.path.join(out, 'sheet.png'), 'html': os.path.join(out, 'sheet.html')}


def _write(outputs, summary, scores, idx, index_names, query_paths, ranks, formats, sheet_queries, sheet_k, title):
  if report.is_writer():
    arrays = dict(scores=scores, indices=idx, index_names=np.asarray(index_names),
                  query_paths=np.asarray(query_paths))
    if ranks is not None:
      arrays['partner_ranks'] = ranks
    ops.save_npz_atomic(outputs['topk'], **arrays)
  report.write_json(outputs['results'], summary)
  rows = [dict(q, results=q['results'][:sheet_k]) for q in (summary['queries'] or [])[:sheet_queries]]
  if rows and 'png' in formats:
    sheets.contact_sheet_png(rows, outputs['png'], title)
  if rows and 'html' in formats:
    sheets.contact_sheet_html(rows, outputs['html'], title)


def _print(summary, ranks, sheet_queries, out):
  """Every result of the first `sheet_queries` queries (one row each: rank, match, cosine score)."""
  queries = summary['queries'] or []
  table = []
  for q in queries[:sheet_queries]:
    for r in q['results']:
      first = r['rank'] == 1
      table.append([os.path.basename(q['query']) if first else '', r['rank'], r['name'], f'{r["score"]:.3f}']
                   + ([q['partner_rank'] if first else ''] if ranks is not None else []))
  print(report.table(table, ['query', 'rank', 'look-alike', 'score'] + (['partner rank'] if ranks is not None
                                                                        else [])))
  if len(queries) > sheet_queries:
    print(f'(the first {sheet_queries} of {len(queries)} queries; every query\'s {summary["k"]} results are in '
          'results.json; --sheet_queries shows more)')
  if ranks is not None:
    m = summary['metrics']
    print(report.table([[f'{m["mean_rank"]:.2f}', m['median_rank'], m['mrr'], m['recall@1'], m['recall@5'],
                         m['recall@10']]], ['mean rank', 'median', 'MRR', 'R@1', 'R@5', 'R@10']))
  skipped = summary['skipped']
  if skipped['count']:
    names = ', '.join(f"{os.path.basename(s['path'])} ({_reason(s)})" for s in skipped['images'][:10])
    more = f' and {skipped["count"] - 10} more' if skipped['count'] > 10 else ''
    print(f'skipped {skipped["count"]} image(s) that cannot be decoded: {names}{more} '
          f'(reasons in results.json; --strict aborts instead)')
  print(f'{summary["n_queries"]} queries against {summary["n_index"]} images ({summary["similarity"]}); '
        f'results in {os.path.abspath(out)}')
