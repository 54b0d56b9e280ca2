"""Histogram metrics of a representation (paper 003, Wu et al.): config -> labelled data -> features -> metrics.

Data sources (config.dataset):
  'demo'     : the embedded offline demo set (both sides of each pair are samples of its source photo, 18-19
               classes) with a small built-in class tree (config.class_tree='demo');
  'folder'   : config.data_dir with one sub-folder per class (visim_jax.data.classes.image_folder);
  'tfds'     : config.tfds.name / split through tfds.data_source (NumPy; features cached like image files);
  'features' : config.features, an .npz with `features` (N, D), `labels` (N,), optional `class_names`.
Image features come from config.backbone via the feature cache. The math is visim_jax/metrics/histograms.py.

Outputs in the workdir (schema in docs/histograms.md): config.json, metrics.json, classes.csv (one row per
class), histograms.npz (the per-class count histograms), plots/class_histograms.png (paper Fig. 1: intra vs
inter for chosen classes), plots/overlap_distribution.png (Fig. 5), and with a class tree: nodes.csv,
levels.csv, plots/levels.png (Tables 1 and 8: overlap, maximal overlap and aSTD per level).
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from tqdm.auto import tqdm

from visim_jax import features as features_lib
from visim_jax import report
from visim_jax.backbones import config as backbone_config
from visim_jax.data import classes as classes_lib
from visim_jax.metrics import histograms as H

DATASETS = ('demo', 'folder', 'tfds', 'features')

# A small tree over the demo set's source photos (skimage / sklearn names), so the offline default shows the
# hierarchy outputs too. Nodes absent from a given demo build are ignored.
DEMO_TREE = {
    'photo': ['scene', 'texture', 'science'],
    'scene': ['astronaut', 'chelsea', 'coffee', 'rocket', 'camera', 'motorcycle_left', 'china', 'flower'],
    'texture': ['brick', 'grass', 'gravel', 'page', 'colorwheel'],
    'science': ['microscopy', 'sky', 'coins'],
    'microscopy': ['immunohistochemistry', 'retina', 'cell'],
    'sky': ['hubble_deep_field', 'moon'],
}


def validate_config(config) -> None:
  def get(field):
    v = config
    for part in field.split('.'):
      v = v.get(part)
    return v

  def need(cond, field, msg):
    if not cond:
      raise ValueError(f'config.{field}: {msg} (got {get(field)!r})')
  need(config.dataset in DATASETS, 'dataset', f'one of {DATASETS}')
  need(config.normalization in H.NORMALIZATIONS, 'normalization', f'one of {H.NORMALIZATIONS}')
  if config.normalization == 'source':
    need(bool(config.source_stats), 'source_stats', "an .npz with `mean` and `std` is required for normalization='source'")
  need(config.pairs.mode in H.PAIR_MODES, 'pairs.mode', f'one of {H.PAIR_MODES}')
  need(config.pairs.n_intra >= 1 and config.pairs.n_inter >= 1, 'pairs.n_intra', 'pair counts must be >= 1')
  need(config.pairs.chunk_elems >= 0, 'pairs.chunk_elems', 'must be >= 0 (0: automatic)')
  need(config.bins >= 2, 'bins', 'must be >= 2')
  need(config.knn.k >= 0 and config.knn.queries >= 0, 'knn.k', 'k and queries must be >= 0')
  need(config.image_batch_size >= 1, 'image_batch_size', 'must be >= 1')
  need(config.dtype in ('float32', 'bfloat16'), 'dtype', "'float32' or 'bfloat16'")
  need(config.tree_min_children >= 2, 'tree_min_children', 'must be >= 2')
  if config.dataset == 'folder':
    need(bool(config.data_dir), 'data_dir', 'a folder with one sub-folder per class is required for dataset=folder')
  if config.dataset == 'features':
    need(bool(config.features), 'features', 'an .npz path is required for dataset=features')
  if config.dataset == 'tfds':
    need(bool(config.tfds.name), 'tfds.name', 'a TFDS dataset name is required for dataset=tfds')
  if config.class_tree == 'demo':
    need(config.dataset == 'demo', 'class_tree', "'demo' (the built-in tree) only goes with dataset=demo")
  if config.class_tree and config.class_tree != 'demo' and not os.path.exists(config.class_tree):
    raise FileNotFoundError(f'config.class_tree: {config.class_tree}: class tree file not found')


def options(config) -> H.Options:
  return H.Options(n_intra=config.pairs.n_intra, n_inter=config.pairs.n_inter, mode=config.pairs.mode,
                   exhaustive_max=config.pairs.exhaustive_max, seed=config.seed, bins=config.bins,
                   chunk_elems=config.pairs.chunk_elems, knn_k=config.knn.k, knn_queries=config.knn.queries)


# ------------------------------------------------------------------------------------------------ data

def _backbone(config):
  return backbone_config.build(config)




def tfds_features(config, progress: bool = True):
  """(features, labels, class names, description) of a TFDS split, through an .npz cache like image files."""
  t = config.tfds
  source, names = classes_lib.tfds_source(t.name, t.split, t.data_dir or None, t.label_key)
  n = len(source) if not t.max_examples else min(len(source), t.max_examples)
  if n < 2:
    raise ValueError(f'config.tfds: {t.name}/{t.split} has {n} example(s)')
  backbone, layers = _backbone(config)
  manifest = {'version': features_lib.CACHE_VERSION, 'source': 'tfds', 'name': t.name, 'split': t.split,
              'data_dir': os.path.abspath(t.data_dir) if t.data_dir else '', 'num_examples': n,
              'backbone': backbone.name, 'weights_sha256': backbone.weights_id, 'layers': list(layers),
              'preprocessing': backbone.preprocess.describe(), 'dtype': config.dtype,
              'image_key': t.image_key, 'label_key': t.label_key}
  path = features_lib.cache_path(backbone_config.cache_dir(config), f'tfds-{t.name.replace("/", "_")}-{t.split}', manifest)
  desc = {'tfds': t.name, 'split': t.split, 'backbone': backbone.name, 'layers': list(layers), 'cache': path}
  hit = features_lib.read_cache(path, manifest)
  if hit is not None:
    with np.load(path, allow_pickle=False) as z:
      if 'labels' in z.files and len(z['labels']) == len(hit[0]):
        logging.info('feature cache hit: %s', path)
        return hit[0], np.asarray(z['labels'], np.int64), names, desc
  fn = features_lib.make_extract_fn(backbone, layers, jnp.dtype(config.dtype))
  bs = config.image_batch_size
  feats, labels = [], []
  bar = tqdm(total=n, desc=f'{t.name} features', unit='img', disable=not progress)
  for imgs, labs in classes_lib.tfds_batches(source, backbone.preprocess, bs, range(n), t.image_key, t.label_key):
    m = len(imgs)
    if m < bs:  # one batch shape: one compilation
      imgs = np.concatenate([imgs, np.zeros((bs - m,) + imgs.shape[1:], imgs.dtype)])
    feats.append(np.asarray(fn(backbone.variables, imgs))[:m])
    labels.append(labs)
    bar.update(m)
  bar.close()
  feats, labels = np.concatenate(feats), np.concatenate(labels)
  if not np.isfinite(feats).all():
    raise FloatingPointError(f'{backbone.name}: non-finite features for {t.name}/{t.split}; nothing cached')
  stored = dict(manifest, features_sha256=hashlib.sha256(np.ascontiguousarray(feats).tobytes()).hexdigest())
  features_lib.save_npz_atomic(path, features=feats, names=np.asarray([str(i) for i in range(n)]), labels=labels,
                               manifest=np.asarray(json.dumps(stored, sort_keys=True)))
  return feats, labels, names, desc


def load_data(config, progress: bool = True):
  """(features (N, D) float32, labels (N,) int64, class names, description dict)."""
  if config.dataset == 'features':
    feats, labels, names = classes_lib.load_feature_file(config.features)
    return feats, labels, names, {'features': os.path.abspath(config.features)}
  if config.dataset == 'tfds':
    return tfds_features(config, progress)
  if config.dataset == 'demo':
    data = classes_lib.demo_labelled(config.demo.root or None, config.demo.n_pairs, config.demo.seed)
    tag = 'demo-classes'
  else:
    data = classes_lib.image_folder(config.data_dir)
    tag = 'classes-' + os.path.basename(os.path.normpath(config.data_dir))
  backbone, layers = _backbone(config)
  feats = features_lib.cached_features(backbone, data.paths, backbone_config.cache_dir(config), layers=layers, tag=tag,
                                       batch_size=config.image_batch_size, dtype=config.dtype, progress=progress)
  desc = {'images': len(data.paths), 'backbone': backbone.name, 'weights_sha256': backbone.weights_id,
          'layers': list(layers), 'empty_class_folders': data.empty_classes,
          'root': os.path.abspath(config.data_dir) if config.dataset == 'folder' else os.path.dirname(data.paths[0])}
  return feats, data.labels, data.class_names, desc


def load_source_stats(path: str, dim: int):
  if not os.path.exists(path):
    raise FileNotFoundError(f'config.source_stats: {path}: file not found')
  with np.load(path, allow_pickle=False) as z:
    if 'mean' not in z.files or 'std' not in z.files:
      raise ValueError(f'config.source_stats: {path}: needs arrays `mean` and `std` (has {z.files})')
    mean, std = np.asarray(z['mean'], np.float32), np.asarray(z['std'], np.float32)
  if mean.shape != (dim,) or std.shape != (dim,):
    raise ValueError(f'config.source_stats: {path}: mean/std shapes {mean.shape}/{std.shape}, features have dim {dim}')
  return mean, std


def load_tree(config):
  if not config.class_tree:
    return None
  if config.class_tree == 'demo':
    return DEMO_TREE
  return classes_lib.read_class_tree(config.class_tree)


# ---------------------------------------------------------------------------------------------- plots

def plot_class_histograms(m: dict, names, chosen, path: str, bins: int) -> None:
  """Paper Fig. 1 (step 3): intra (red) and inter (green) similarity distributions of chosen classes."""
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  centers = H.bin_centers(bins)
  width = 2.0 / bins
  cols = min(3, len(chosen))
  rows = -(-len(chosen) // cols)
  fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
  for ax, c in zip(axes.ravel(), chosen):
    p_in = np.asarray(H.to_probabilities(m['hist_intra'][c]))
    p_out = np.asarray(H.to_probabilities(m['hist_inter'][c]))
    ax.bar(centers, p_in, width, color='tab:red', alpha=0.5, label='intra (same class)')
    ax.bar(centers, p_out, width, color='tab:green', alpha=0.5, label='inter (other classes)')
    ax.fill_between(centers, np.minimum(p_in, p_out), step='mid', color='k', alpha=0.25, label='overlap')
    ax.set_title(f'{names[c]}: O={m["class_overlap"][c]:.3f}', fontsize=9)
    ax.set_xlim(-1, 1)
    ax.set_xlabel('cosine similarity', fontsize=8)
  for ax in axes.ravel()[len(chosen):]:
    ax.axis('off')
  axes[0, 0].legend(fontsize=7)
  fig.suptitle(f'intra vs inter similarity distributions (overlap {float(m["overlap"]):.3f})', fontsize=10, y=1.02)
  report.save_figure(fig, path)


def plot_overlap_distribution(m: dict, path: str) -> None:
  """Paper Fig. 5: histogram of the per-class overlaps."""
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  ov = m['class_overlap'][m['valid']]
  fig, ax = plt.subplots(figsize=(5.5, 3.5))
  ax.hist(ov, bins=np.linspace(0, 1, 41), color='tab:blue', alpha=0.8)
  ax.axvline(float(m['overlap']), color='k', ls='--', label=f'mean {float(m["overlap"]):.3f}')
  ax.axvline(float(m['max_overlap']), color='tab:red', ls=':', label=f'max {float(m["max_overlap"]):.3f}')
  ax.set_xlabel('per-class overlap')
  ax.set_ylabel('classes')
  ax.set_xlim(0, 1)
  ax.legend(fontsize=8)
  ax.set_title(f'overlap of {len(ov)} classes')
  report.save_figure(fig, path)


def plot_levels(level_rows, path: str) -> None:
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  lv = [r['level'] for r in level_rows]
  fig, ax = plt.subplots(figsize=(6, 3.5))
  for key, style in (('overlap', 'o-'), ('max_overlap', 's--'), ('astd_inter', '^-'), ('astd_intra', 'v:')):
    ax.plot(lv, [r[key] for r in level_rows], style, label=key)
  ax.set_xlabel('node level (0 = root)')
  ax.set_xticks(lv)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  ax.set_title('per-level means over tree nodes')
  report.save_figure(fig, path)


def _csv(rows, header) -> str:
  buf = io.StringIO()
  w = csv.writer(buf)
  w.writerow(header)
  for r in rows:
    w.writerow(['' if (isinstance(v, float) and np.isnan(v)) else (f'{v:.6f}' if isinstance(v, float) else v)
                for v in r])
  return buf.getvalue()


# ------------------------------------------------------------------------------------------ the program

def choose_plot_classes(config, m, names) -> list[int]:
  if config.plot_classes:
    wanted = [c.strip() for c in config.plot_classes.split(',') if c.strip()]
    unknown = [c for c in wanted if c not in names]
    if unknown:
      raise ValueError(f'config.plot_classes: unknown class(es) {unknown}')
    return [names.index(c) for c in wanted]
  valid = np.flatnonzero(m['valid'])
  order = valid[np.argsort(m['class_overlap'][valid], kind='stable')]
  picks = [order[0], order[len(order) // 2], order[-1]] if len(order) >= 3 else list(order)
  return list(dict.fromkeys(int(p) for p in picks))


def evaluate_tree(x, tree, names, labels, opts, min_children, progress=True):
  """Per node rows and per level rows (means over nodes) of the hierarchy."""
  node_opts = H.Options(**{**opts.__dict__, 'knn_k': 0})
  rows, skipped = [], 0
  nodes = list(H.node_clusters(tree, names, labels, min_children))
  for node, level, kids, cl in tqdm(nodes, desc='tree nodes', unit='node', disable=not progress):
    try:
      m = H.evaluate(x, cl, len(kids), node_opts)
    except ValueError:  # fewer than 2 children with 2+ samples
      skipped += 1
      continue
    rows.append({'node': node, 'level': level, 'clusters': int(m['valid'].sum()), 'samples': int((cl >= 0).sum()),
                 'overlap': float(m['overlap']), 'max_overlap': float(m['max_overlap']),
                 'astd_inter': float(m['astd_inter']), 'astd_intra': float(m['astd_intra'])})
  levels = []
  for lv in sorted({r['level'] for r in rows}):
    rs = [r for r in rows if r['level'] == lv]
    levels.append({'level': lv, 'nodes': len(rs), **{k: float(np.mean([r[k] for r in rs]))
                                                     for k in ('overlap', 'max_overlap', 'astd_inter', 'astd_intra')}})
  return rows, levels, skipped


def run(config, workdir: str, progress: bool = True) -> dict:
  validate_config(config)
  opts = options(config)
  opts.validate()
  tree = load_tree(config)  # bad tree files fail before any feature extraction

  t0 = time.time()
  feats, labels, names, desc = load_data(config, progress)
  source = config.features if config.dataset == 'features' else f'{config.dataset} features'
  feats, labels = H.check_inputs(feats, labels, source)
  if len(labels) and labels.max() >= len(names):
    raise ValueError(f'{source}: label {int(labels.max())} but only {len(names)} class names')
  num_classes = len(names)
  mean = std = None
  if config.normalization == 'source':
    mean, std = load_source_stats(config.source_stats, feats.shape[1])
  t_feat = time.time() - t0

  t0 = time.time()
  x = H.prepare(jnp.asarray(feats), config.normalization, mean, std)
  if config.shard and jax.device_count() > 1:
    from jax.sharding import Mesh
    x = H.shard_samples(x, Mesh(np.array(jax.devices()), ('data',)))
  m = H.evaluate(x, labels, num_classes, opts)
  jax.block_until_ready(m['overlap'])
  t_metrics = time.time() - t0
  chosen = choose_plot_classes(config, m, names) if config.plots else []

  t0 = time.time()
  node_rows, level_rows, skipped_nodes = [], [], 0
  if tree is not None:
    node_rows, level_rows, skipped_nodes = evaluate_tree(x, tree, names, labels, opts, config.tree_min_children,
                                                         progress)
    if not node_rows:
      raise ValueError(f'config.class_tree: no node of the tree has {config.tree_min_children}+ children with '
                       'samples (do the tree names match the class names?)')
  t_tree = time.time() - t0

  valid = m['valid']
  kept_names = [names[c] for c in np.flatnonzero(valid)]
  skipped_names = [names[c] for c in range(num_classes) if m['class_counts'][c] > 0 and not valid[c]]
  order = np.flatnonzero(valid)[np.argsort(m['class_overlap'][valid], kind='stable')]
  summary = {
      'overlap': float(m['overlap']), 'max_overlap': float(m['max_overlap']),
      'astd_inter': float(m['astd_inter']), 'astd_intra': float(m['astd_intra']),
      'pooled_std_inter': float(m['pooled_std_inter']), 'pooled_std_intra': float(m['pooled_std_intra']),
      'knn_accuracy': float(m['knn_accuracy']) if 'knn_accuracy' in m else None,
  }
  metrics = {
      'experiment': 'histograms',
      'paper': 'Wu et al., Beyond Accuracy (overlap Eq. 3, aSTD Eq. 4, maximal overlap Sec. 9.2)',
      'data': {'dataset': config.dataset, **desc, 'samples': int(len(labels)), 'dim': int(feats.shape[1]),
               'classes': num_classes, 'evaluated_classes': len(kept_names),
               'skipped_classes': int(m['skipped_classes']),
               'skipped_class_names': skipped_names[:50],
               'empty_classes': int((m['class_counts'] == 0).sum())},
      'normalization': config.normalization, 'bins': config.bins,
      'pairs': {'intra_mode': m['intra_mode'], 'intra_pairs': m['intra_pairs'],
                'inter_mode': m['inter_mode'], 'inter_pairs': m['inter_pairs'],
                'n_intra_per_class': config.pairs.n_intra, 'n_inter_per_class': config.pairs.n_inter,
                'seed': config.seed},
      'knn_k': int(m.get('knn_k', 0)), 'knn_queries': config.knn.queries,
      'metrics': summary,
      'hardest_classes': [{'class': names[c], 'overlap': float(m['class_overlap'][c])} for c in order[::-1][:10]],
      'easiest_classes': [{'class': names[c], 'overlap': float(m['class_overlap'][c])} for c in order[:10]],
      'timing_s': {'features': round(t_feat, 3), 'metrics': round(t_metrics, 3), 'tree': round(t_tree, 3)},
      'devices': [str(d) for d in jax.devices()],
  }
  if tree is not None:
    metrics['hierarchy'] = {'tree': config.class_tree, 'nodes': len(node_rows), 'skipped_nodes': skipped_nodes,
                            'levels': level_rows,
                            'overlap_avg': float(np.mean([r['overlap'] for r in node_rows])),
                            'max_overlap_avg': float(np.mean([r['max_overlap'] for r in node_rows])),
                            'astd_inter_avg': float(np.mean([r['astd_inter'] for r in node_rows]))}

  # ---- write (everything above has succeeded)
  os.makedirs(workdir, exist_ok=True)
  report.write_config(workdir, config)
  class_rows = []
  knn_pc = m.get('class_knn_accuracy', np.full(num_classes, np.nan))
  for c in range(num_classes):
    ok = bool(valid[c])
    class_rows.append([c, names[c], int(m['class_counts'][c]), int(ok),
                       float(m['class_overlap'][c]) if ok else float('nan'),
                       float(m['class_mean_intra'][c]) if ok else float('nan'),
                       float(m['class_std_intra'][c]) if ok else float('nan'),
                       float(m['class_mean_inter'][c]) if ok else float('nan'),
                       float(m['class_std_inter'][c]) if ok else float('nan'),
                       int(m['hist_intra'][c].sum()), int(m['hist_inter'][c].sum()), float(knn_pc[c])])
  files = ['config.json', 'metrics.json', 'classes.csv', 'histograms.npz']
  if report.is_writer():
    report.atomic_write_text(os.path.join(workdir, 'classes.csv'), _csv(class_rows, [
        'label', 'class', 'samples', 'evaluated', 'overlap', 'mean_intra', 'std_intra', 'mean_inter',
        'std_inter', 'intra_pairs', 'inter_pairs', 'knn_accuracy']))
    features_lib.save_npz_atomic(os.path.join(workdir, 'histograms.npz'), hist_intra=m['hist_intra'],
                                 hist_inter=m['hist_inter'], class_names=np.asarray(names), valid=valid,
                                 bin_edges=np.linspace(-1, 1, config.bins + 1).astype(np.float32))
    if tree is not None:
      keys = ['node', 'level', 'clusters', 'samples', 'overlap', 'max_overlap', 'astd_inter', 'astd_intra']
      report.atomic_write_text(os.path.join(workdir, 'nodes.csv'), _csv([[r[k] for k in keys] for r in node_rows], keys))
      lkeys = ['level', 'nodes', 'overlap', 'max_overlap', 'astd_inter', 'astd_intra']
      report.atomic_write_text(os.path.join(workdir, 'levels.csv'),
                               _csv([[r[k] for k in lkeys] for r in level_rows], lkeys))
      files += ['nodes.csv', 'levels.csv']
  if config.plots:
    plot_class_histograms(m, names, chosen, os.path.join(workdir, 'plots', 'class_histograms.png'), config.bins)
    plot_overlap_distribution(m, os.path.join(workdir, 'plots', 'overlap_distribution.png'))
    files += ['plots/class_histograms.png', 'plots/overlap_distribution.png']
    if level_rows:
      plot_levels(level_rows, os.path.join(workdir, 'plots', 'levels.png'))
      files.append('plots/levels.png')
  metrics['files'] = files
  report.write_json(os.path.join(workdir, 'metrics.json'), metrics)

  if report.is_writer():
    print(report.table([[k, v if v is not None else float('nan')] for k, v in summary.items()], ['metric', 'value']))
    print(f'{len(kept_names)} classes evaluated, {metrics["data"]["skipped_classes"]} skipped (< 2 samples); '
          f'pairs: intra {m["intra_pairs"]} ({m["intra_mode"]}), inter {m["inter_pairs"]} ({m["inter_mode"]})')
    if level_rows:
      print(report.table([[r['level'], r['nodes'], r['overlap'], r['max_overlap'], r['astd_inter'], r['astd_intra']]
                          for r in level_rows], ['level', 'nodes', 'overlap', 'max_overlap', 'aSTD inter', 'aSTD intra']))
    print(f'outputs in {os.path.abspath(workdir)}')
  return metrics
