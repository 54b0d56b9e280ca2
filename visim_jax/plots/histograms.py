"""Figures of the histogram metrics (paper 003): intra vs inter distributions (Fig. 1 step 3), per-class overlaps
(Fig. 5), per-level means over tree nodes (Tables 1 and 8 as curves)."""
from __future__ import annotations

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from visim_jax.core import report  # noqa: E402
from visim_jax.core.errors import UserError  # noqa: E402
from visim_jax.metrics.bins import bin_centers  # noqa: E402

LEVEL_CURVES = (('overlap', 'o-'), ('max_overlap', 's--'), ('astd_inter', '^-'), ('astd_intra', 'v:'))


def _probabilities(h):
  h = np.asarray(h, np.float64)
  return h / max(h.sum(), 1.0)


def choose_classes(m: dict, names, wanted: str = '') -> list[int]:
  """Classes for `class_histograms`: the comma-separated names in `wanted` (config.plot_classes), else the
  lowest, median and highest overlap among the evaluated classes."""
  if wanted:
    wanted = [c.strip() for c in wanted.split(',') if c.strip()]
    unknown = [c for c in wanted if c not in names]
    if unknown:
      raise UserError(f'config.plot_classes: unknown class(es) {unknown}; known: {list(names)[:20]}')
    return [list(names).index(c) for c in wanted]
  order = np.flatnonzero(m['valid'])[np.argsort(m['class_overlap'][m['valid']], kind='stable')]
  picks = [order[0], order[len(order) // 2], order[-1]] if len(order) >= 3 else list(order)
  return list(dict.fromkeys(int(p) for p in picks))


def class_histograms(m: dict, names, chosen, path: str, bins: int) -> None:
  """Intra (red) and inter (green) similarity distributions of the chosen classes, their overlap shaded."""
  centers, width = bin_centers(bins), 2.0 / bins
  cols = min(3, len(chosen))
  rows = -(-len(chosen) // cols)
  fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
  for ax, c in zip(axes.ravel(), chosen):
    p_in, p_out = _probabilities(m['hist_intra'][c]), _probabilities(m['hist_inter'][c])
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


def overlap_distribution(m: dict, path: str) -> None:
  """Histogram of the per-class overlaps (paper Fig. 5), mean and maxima marked."""
  ov = m['class_overlap'][m['valid']]
  fig, ax = plt.subplots(figsize=(5.5, 3.5))
  ax.hist(ov, bins=np.linspace(0, 1, 41), color='tab:blue', alpha=0.8)
  ax.axvline(float(m['overlap']), color='k', ls='--', label=f'mean {float(m["overlap"]):.3f}')
  ax.axvline(float(m['max_class_overlap']), color='tab:red', ls=':',
             label=f'max per class {float(m["max_class_overlap"]):.3f}')
  if np.isfinite(m['max_overlap']):
    ax.axvline(float(m['max_overlap']), color='tab:purple', ls='-.',
               label=f'max over class pairs {float(m["max_overlap"]):.3f}')
  ax.set_xlabel('per-class overlap')
  ax.set_ylabel('classes')
  ax.set_xlim(0, 1)
  ax.legend(fontsize=8)
  ax.set_title(f'overlap of {len(ov)} classes')
  report.save_figure(fig, path)


def levels(level_rows, path: str) -> None:
  """Per-level means over the tree's nodes of overlap, maximal overlap and aSTD."""
  lv = [r['level'] for r in level_rows]
  fig, ax = plt.subplots(figsize=(6, 3.5))
  for key, style in LEVEL_CURVES:
    ax.plot(lv, [r[key] for r in level_rows], style, label=key)
  ax.set_xlabel('node level (0 = root)')
  ax.set_xticks(lv)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  ax.set_title('per-level means over tree nodes')
  report.save_figure(fig, path)
