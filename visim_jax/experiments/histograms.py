"""Histogram metrics of a representation (paper 003, Wu et al.): config -> labelled data -> features -> metrics.

Wiring only. Data: visim_jax.data.classes (demo | folder | tfds | features file); image features through
visim_jax.backbones.features (cache, batching, sharding); math: visim_jax.metrics.{histograms, knn, tree}; figures:
visim_jax.plots.histograms. Outputs (schema in docs/histograms.md): config.json, metrics.json, classes.csv,
histograms.npz, plots/, and with a class tree nodes.csv + levels.csv (the paper's Tables 1 and 8 per level).
"""
from __future__ import annotations

import csv
import io
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from visim_jax.backbones import features as features_lib
from visim_jax.core import ops, report
from visim_jax.training import runtime
from visim_jax.data import classes as classes_lib
from visim_jax.core.errors import UserError
from visim_jax.experiments.histograms_parse import validate_config  # noqa: F401 (the gate)
from visim_jax.metrics import histograms as H
from visim_jax.metrics import knn as knn_lib
from visim_jax.metrics import tree as tree_lib
from visim_jax.experiments import config_fields

SCALARS = H.SCALARS
NODE_KEYS = ('node', 'level', 'clusters', 'samples') + SCALARS


def load_data(config, progress: bool = True):
  """(features (N, D) float32, labels (N,) int64, class names, description dict)."""
  if config.dataset == 'features':
    feats, labels, names = classes_lib.load_feature_file(config.features)
    return feats, labels, names, {'features': os.path.abspath(config.features)}
  fo = config_fields.options(config)
  backbone, layers = features_lib.build(fo)
  desc = features_lib.describe(backbone, layers)
  if config.dataset == 'tfds':
    t = config.tfds
    data = classes_lib.TfdsImages(t.name, t.split, t.data_dir or None, t.image_key, t.label_key, t.max_examples)
    feats = features_lib.features_of(fo, backbone, layers, data.items, tag=data.tag, progress=progress,
                                     loader=data.load_batch, source_id=data.source_id)
    return feats, data.labels(fo.cache_dir), data.class_names, dict(desc, **data.source_id)
  if config.dataset == 'demo':
    data, tag = classes_lib.demo_labelled(config.demo.root or None, config.demo.n_pairs, config.demo.seed,
                                          config.get('cache_dir') or None), 'demo-classes'
  else:
    data = classes_lib.image_folder(config.data_dir)
    tag = 'classes-' + os.path.basename(os.path.normpath(config.data_dir))
  feats = features_lib.features_of(fo, backbone, layers, data.paths, tag=tag, progress=progress)
  root = os.path.abspath(config.data_dir) if config.dataset == 'folder' else os.path.dirname(data.paths[0])
  return feats, data.labels, data.class_names, dict(desc, images=len(data.paths), root=root,
                                                    empty_class_folders=data.empty_classes)


def tree_nodes(config, tree, names, labels) -> list:
  """[(node, level, children, cluster labels)] of the nodes with config.tree_min_children+ children."""
  try:
    nodes = list(tree_lib.node_clusters(tree, names, labels, config.tree_min_children))
  except ValueError as e:
    raise UserError(f'config.class_tree: {e}') from e
  if not nodes:
    raise UserError(f'config.class_tree: no node has {config.tree_min_children}+ children holding samples '
                    '(do the tree names match the class names? see config.tree_min_children)')
  return nodes


def _csv(rows, header) -> str:
  buf = io.StringIO()
  w = csv.writer(buf)
  w.writerow(header)
  for r in rows:
    w.writerow(['' if v is None or (isinstance(v, float) and np.isnan(v)) else
                (f'{v:.6f}' if isinstance(v, float) else v) for v in r])
  return buf.getvalue()


def write_outputs(workdir, config, m, names, knn_pc, node_rows, level_rows, chosen) -> list[str]:
  """classes.csv, histograms.npz, nodes.csv + levels.csv (with a tree), plots: the files of metrics.json."""
  valid, nan = m['valid'], float('nan')
  per_class = lambda key, c: float(m[key][c]) if valid[c] else nan
  class_rows = [[c, names[c], int(m['class_counts'][c]), int(valid[c]), per_class('class_overlap', c),
                 per_class('class_mean_intra', c), per_class('class_std_intra', c), per_class('class_mean_inter', c),
                 per_class('class_std_inter', c), int(m['hist_intra'][c].sum()), int(m['hist_inter'][c].sum()),
                 float(knn_pc[c])] for c in range(len(names))]
  files = ['config.json', 'fingerprint.json', 'metrics.json', 'classes.csv', 'histograms.npz']
  if report.is_writer():
    ops.atomic_write_text(os.path.join(workdir, 'classes.csv'), _csv(class_rows, [
        'label', 'class', 'samples', 'evaluated', 'overlap', 'mean_intra', 'std_intra', 'mean_inter',
        'std_inter', 'intra_pairs', 'inter_pairs', 'knn_accuracy']))
    ops.save_npz_atomic(os.path.join(workdir, 'histograms.npz'), hist_intra=m['hist_intra'],
                        hist_inter=m['hist_inter'], class_names=np.asarray(names), valid=valid,
                        bin_edges=np.linspace(-1, 1, config.bins + 1).astype(np.float32))
    if node_rows:
      lkeys = ('level', 'nodes') + SCALARS
      ops.atomic_write_text(os.path.join(workdir, 'nodes.csv'),
                            _csv([[r[k] for k in NODE_KEYS] for r in node_rows], NODE_KEYS))
      ops.atomic_write_text(os.path.join(workdir, 'levels.csv'), _csv([[r[k] for k in lkeys] for r in level_rows], lkeys))
      files += ['nodes.csv', 'levels.csv']
  if config.plots:
    from visim_jax.plots import histograms as plots  # matplotlib only when plotting
    plots.class_histograms(m, names, chosen, os.path.join(workdir, 'plots', 'class_histograms.png'), config.bins)
    plots.overlap_distribution(m, os.path.join(workdir, 'plots', 'overlap_distribution.png'))
    files += ['plots/class_histograms.png', 'plots/overlap_distribution.png']
    if level_rows:
      plots.levels(level_rows, os.path.join(workdir, 'plots', 'levels.png'))
      files.append('plots/levels.png')
  return files


def run(config, workdir: str, progress: bool = True) -> dict:
  config = config_fields.select_source(config)  # --config.features=x.npz alone selects dataset=features
  opts = validate_config(config)
  tree, notes = None, []
  if config.class_tree == 'demo' and config.dataset != 'demo':
    notes.append(f"config.class_tree='demo' is the demo set's tree: no hierarchy for dataset={config.dataset} "
                 "(give a tree file, or '' to silence this)")
    runtime.say(notes[-1])
  elif config.class_tree:
    tree = classes_lib.DEMO_TREE if config.class_tree == 'demo' else classes_lib.read_class_tree(config.class_tree)

  t0 = time.time()
  feats, labels, names, desc = load_data(config, progress)
  source = config.features if config.dataset == 'features' else f'{config.dataset} features'
  feats, labels = H.check_inputs(feats, labels, source)
  n_loaded = len(labels)
  if config.sample_fraction < 1.0:  # Tables 5 and 10: the metrics on a random n% of the samples
    keep = np.sort(np.random.default_rng(config.seed).choice(n_loaded, round(config.sample_fraction * n_loaded), False))
    feats, labels = feats[keep], labels[keep]
  if len(labels) and labels.max() >= len(names):
    raise UserError(f'{source}: label {int(labels.max())} but only {len(names)} class names')
  num_classes = len(names)
  mean_std = ((None, None) if config.normalization != 'source'
              else classes_lib.load_source_stats(config.source_stats, feats.shape[1]))
  t_feat, t0 = time.time() - t0, time.time()

  x = H.prepare(jnp.asarray(feats), config.normalization, *mean_std)
  if config.shard and jax.device_count() > 1:
    from jax.sharding import Mesh
    x = H.shard_samples(x, Mesh(np.array(jax.devices()), ('data',)))
  kept_labels, _, _ = H.keep_classes(labels, num_classes, opts.min_class_size)
  nodes = tree_nodes(config, tree, names, kept_labels) if tree else []
  n_kept = int((kept_labels >= 0).sum())
  extra = sum(int((cl >= 0).sum()) ** 2 // 2 for *_, cl in nodes)  # the tree's pairs: one estimator for all
  estimator = H.choose_estimator(n_kept, feats.shape[1], num_classes, opts, extra_pairs=extra)
  runtime.say(f'{n_kept} samples of {int((np.bincount(kept_labels[kept_labels >= 0]) > 0).sum())} classes, '
              f'{len(nodes)} tree nodes: estimator {estimator} (' + ('every pair)' if estimator == 'exhaustive' else
              f'{opts.n_intra} intra + {opts.n_inter} inter random pairs per class)'))
  try:
    m = H.evaluate(x, labels, num_classes, opts, estimator=estimator)
  except H.TooFewClasses as e:
    raise UserError(f'{source}: {e} (config.min_class_size={opts.min_class_size})') from e
  if config.knn.k:
    k = min(config.knn.k, n_kept - 1)
    acc, knn_pc = knn_lib.knn_accuracy(x, kept_labels, num_classes, k, config.knn.queries, config.seed)
  else:
    k, acc, knn_pc = 0, None, np.full(num_classes, np.nan)
  n_queries = min(config.knn.queries or n_kept, n_kept)
  knn_se = None if acc is None else float(np.sqrt(acc * (1 - acc) / n_queries))  # binomial, over the queries
  t_metrics, t0 = time.time() - t0, time.time()

  node_rows, level_rows, skipped_nodes, tree_avg = [], [], 0, {}
  if tree is not None:
    node_rows, skipped_nodes = tree_lib.evaluate_nodes(
        x, nodes, opts, estimator, lambda it: tqdm(it, desc='tree nodes', unit='node', disable=not progress))
    level_rows, overall = tree_lib.level_means(node_rows, SCALARS)
    tree_avg = {f'{k}_avg': v for k, v in overall.items()}
  t_tree = time.time() - t0

  valid = m['valid']
  order = np.flatnonzero(valid)[np.argsort(m['class_overlap'][valid], kind='stable')]
  pair = m.get('max_overlap_pair') if m['pairwise'] else None
  metrics = {
      'experiment': 'histograms',
      'paper': 'Wu et al., Beyond Accuracy (overlap Eq. 3, aSTD Eq. 4, maximal overlap Sec. 9.2)',
      'data': {'dataset': config.dataset, **desc, 'samples': int(len(labels)), 'samples_loaded': n_loaded,
               'sample_fraction': config.sample_fraction, 'dim': int(feats.shape[1]),
               'classes': num_classes, 'evaluated_classes': int(valid.sum()), 'min_class_size': opts.min_class_size,
               'omitted_classes': int(m['omitted_classes']),
               'omitted_class_names': [names[c] for c in range(num_classes)
                                       if m['class_counts'][c] > 0 and not valid[c]][:50],
               'empty_classes': int((m['class_counts'] == 0).sum())},
      'normalization': config.normalization, 'bins': config.bins,
      'estimator': {'name': estimator, 'pairs_mode': config.pairs.mode, 'intra_pairs': m['intra_pairs'],
                    'inter_pairs': m['inter_pairs'], 'seed': config.seed,
                    'se_method': f'{m["se_method"]}; knn_accuracy: binomial sqrt(p (1 - p) / queries)',
                    **({'n_intra_per_class': opts.n_intra, 'n_inter_per_class': opts.n_inter}
                       if estimator == 'random' else {})},
      'metrics': {**H.scalars(m), 'knn_accuracy': acc},
      'degenerate': m.get('degenerate'),   # metrics/degenerate.py: then no metric is a number
      'standard_errors': {**m['se'], 'knn_accuracy': knn_se},
      'max_overlap_pair': [names[pair[0]], names[pair[1]]] if pair else None,
      'pairwise_min_pairs': m.get('pairwise_min_pairs') if pair else None,
      'knn_k': k, 'knn_queries': config.knn.queries,
      'hardest_classes': [{'class': names[c], 'overlap': float(m['class_overlap'][c])} for c in order[::-1][:10]],
      'easiest_classes': [{'class': names[c], 'overlap': float(m['class_overlap'][c])} for c in order[:10]],
      'timing_s': {'features': round(t_feat, 3), 'metrics': round(t_metrics, 3), 'tree': round(t_tree, 3)},
      'devices': [str(d) for d in jax.devices()], 'notes': notes,
  }
  if m.get('degenerate'):
    metrics['metrics'] = {k: None for k in metrics['metrics']}
  if tree is not None:
    metrics['hierarchy'] = {'tree': config.class_tree, 'min_children': config.tree_min_children,
                            'nodes': len(node_rows), 'skipped_nodes': skipped_nodes, 'levels': level_rows, **tree_avg}
  chosen = []
  if config.plots:
    from visim_jax.plots import histograms as plots
    chosen = plots.choose_classes(m, names, config.plot_classes)

  # ---- write (everything above has succeeded): under the workdir lock, config.json and metrics.json by the runtime
  recorded = config_fields.recorded_config(config, uses_backbone=config.dataset != 'features')
  with runtime.Run(workdir, recorded, runtime.fingerprint(recorded, {'features': feats, 'labels': labels}), checkpoint=False,
                   progress=progress) as rt:
    metrics['files'] = write_outputs(rt.workdir, config, m, names, knn_pc, node_rows, level_rows, chosen)
    metrics = rt.write_metrics(metrics)

  nan = lambda v: float('nan') if v is None else v
  if report.is_writer():
    if m.get('degenerate'):
      print(f"degenerate: {m['degenerate']}: no metric is reported (metrics.json holds null)")
    se = metrics['standard_errors']
    print(report.table([[k, nan(v), '-' if se.get(k) is None else se[k]] for k, v in metrics['metrics'].items()],
                       ['metric', 'value', 'standard error']))
    print(f'{int(valid.sum())} classes evaluated, {m["omitted_classes"]} omitted (< {opts.min_class_size} samples); '
          f'estimator {estimator}: intra {m["intra_pairs"]} pairs, inter {m["inter_pairs"]}; se: {m["se_method"]}')
    if level_rows:
      print(report.table([[r['level'], r['nodes']] + [nan(r[k]) for k in SCALARS[:5]] for r in level_rows],
                         ['level', 'nodes', *SCALARS[:5]]))
    print(f'outputs in {os.path.abspath(workdir)}')
  return metrics
