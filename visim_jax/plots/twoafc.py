"""Figures of the CoSIS 2AFC experiment (paper 004): per-context accuracy, Table 8 matrix, credibility maps
(Fig. 5), the Table 6 rows and the ensemble-size sweep (Fig. 8). Reads metrics.json's dict; writes PNGs."""
from __future__ import annotations

import os

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from visim_jax.core import report  # noqa: E402


def write_all(workdir: str, metrics: dict, extra: dict, stand_in: bool) -> None:
  tag = ' (stand-in features)' if stand_in else ''
  out = lambda name: os.path.join(workdir, 'plots', f'{name}.png')
  cm = metrics['context_models']
  accuracy_per_context(cm['contexts'], cm['per_context'], out('accuracy_per_context'), tag)
  cross_context(cm['models'], cm['contexts'], cm['cross_context_held_out'], out('cross_context'), tag)
  credibility_maps(extra, out('credibility_maps'), tag)
  table6(metrics['table6'], out('ensembles'), tag)
  if 'subset_sweep' in metrics['ensembles']:
    subset_sweep(metrics['ensembles']['subset_sweep'], out('ensemble_size'), tag)


def accuracy_per_context(names, per_context, path, tag=''):
  x = np.arange(len(names))
  fig, ax = plt.subplots(figsize=(8, 3.6))
  for i, (key, lab) in enumerate((('cosine_held_out', 'cosine (not fine-tuned)'),
                                  ('own_model_embedding_held_out', 'CS model: embedding'),
                                  ('own_model_ranking_block_held_out', 'CS model: ranking block'))):
    v = [per_context[n][key] for n in names]
    ax.bar(x + (i - 1) * 0.27, [a['accuracy'] for a in v], 0.27, label=lab,
           yerr=np.abs(np.array([[a['accuracy'] - a['ci_low'], a['ci_high'] - a['accuracy']] for a in v]).T))
  ax.axhline(0.5, color='k', lw=0.6, ls=':')
  ax.set_xticks(x, names)
  ax.set_ylim(0, 1)
  ax.set_ylabel('2AFC accuracy, held-out part')
  ax.legend(fontsize=7, loc='lower right')
  ax.set_title('Accuracy per context (95% bootstrap over rows)' + tag, fontsize=9)
  report.save_figure(fig, path)


def cross_context(models, names, cross, path, tag=''):
  fig, axes = plt.subplots(1, 2, figsize=(11, 4.6))
  for ax, kind in zip(axes, ('embedding', 'ranking_block')):
    m = np.asarray(cross[kind])
    im = ax.imshow(m, vmin=0.3, vmax=1.0, cmap='viridis')
    for i in range(m.shape[0]):
      for j in range(m.shape[1]):
        ax.text(j, i, f'{100 * m[i, j]:.0f}', ha='center', va='center', fontsize=6, color='w')
    ax.set_xticks(np.arange(len(names)), names, rotation=45, fontsize=7)
    ax.set_yticks(np.arange(len(models)), models, fontsize=7)
    ax.set_xlabel('context set (held-out part)')
    ax.set_ylabel('model')
    ax.set_title(f'{kind} answers', fontsize=8)
  fig.colorbar(im, ax=axes, shrink=0.8)
  fig.suptitle('Model x context accuracy on held-out parts (Table 8)' + tag, fontsize=9)
  report.save_figure(fig, path)


def credibility_maps(extra, path, tag=''):
  cm, xy, names = extra['credibility'], extra['xy_val'], extra['names']
  edges = np.asarray(cm.edges)
  ext = (edges[0, 0], edges[0, -1], edges[1, 0], edges[1, -1])
  cols = 4
  rows = (len(names) + cols - 1) // cols
  fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.0 * rows), squeeze=False)
  for i, n in enumerate(names):
    ax = axes[i // cols, i % cols]
    im = ax.imshow(np.asarray(cm.maps[i]).T, origin='lower', extent=ext, vmin=0.3, vmax=1.0, cmap='RdYlBu',
                   aspect='auto')
    ax.scatter(xy[:, 0], xy[:, 1], c=extra['acc_val'][i], s=3, cmap='RdYlBu', vmin=0.3, vmax=1.0,
               edgecolors='k', linewidths=0.1)
    ax.set_title(n, fontsize=8)
    ax.set_xticks([]), ax.set_yticks([])
  for j in range(len(names), rows * cols):
    axes[j // cols, j % cols].axis('off')
  fig.colorbar(im, ax=axes, shrink=0.7, label='credibility (window mean per-reference correctness)')
  fig.suptitle('Credibility maps on the 2-D PCA of mulref_val reference features (Fig. 5)' + tag, fontsize=9)
  report.save_figure(fig, path)


def table6(rows, path, tag=''):
  fig, ax = plt.subplots(figsize=(8, 3.6))
  y = np.arange(len(rows))
  ax.barh(y + 0.2, [r['val']['accuracy'] for r in rows], 0.4, label='mulref_val (fit set: in-sample)')
  ax.barh(y - 0.2, [r['test']['accuracy'] for r in rows], 0.4, label='mulref_test')
  ax.set_yticks(y, [r['description'][:52] for r in rows], fontsize=7)
  ax.set_xlim(0, 1)
  ax.axvline(0.5, color='k', lw=0.6, ls=':')
  ax.invert_yaxis()
  ax.legend(fontsize=7)
  ax.set_xlabel('2AFC accuracy')
  ax.set_title('Table 6 rows' + tag, fontsize=9)
  report.save_figure(fig, path)


def subset_sweep(sw, path, tag=''):
  """Fig. 8: accuracy on mulref_test against the number r of models, every subset (MLP: every seed)."""
  size = np.asarray(sw['size'])
  rs = np.unique(size)
  fig, ax = plt.subplots(figsize=(8, 3.8))
  for i, (key, lab) in enumerate((('majority', 'majority vote'), ('pca', 'PCA credibility'), ('mlp', 'MLP'))):
    vals = np.asarray(sw[key])
    data = [vals[size == r].reshape(-1) for r in rs]
    parts = ax.violinplot(data, rs + (i - 1) * 0.27, widths=0.25, showmedians=True)
    for b in parts['bodies']:
      b.set_alpha(0.5)
    ax.plot([], [], color=parts['bodies'][0].get_facecolor()[0], label=lab, lw=6)
  ax.set_xticks(rs)
  ax.set_xlabel('number of CS models r (all C(8, r) subsets)')
  ax.set_ylabel('2AFC accuracy, mulref_test')
  ax.legend(fontsize=7)
  ax.set_title('Ensemble size (Fig. 8)' + tag, fontsize=9)
  report.save_figure(fig, path)
