"""Figure of the Table 1 sweep (paper 001): aR@1 of every backbone before (raw, PCA) and after adaptation at
each sigma, mean ± 1 std over runs (Table 1's spread), with the paper's numbers as markers where published."""
from __future__ import annotations

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from visim_jax.data import paper_data  # noqa: E402
from visim_jax.core import report

_PAPER = {'concatenated': 'concatenated_score', 'pca': 'pca_score', 'sigma=1': 'ar1_sigma1', 'sigma=15': 'ar1_sigma15'}


def summary(rows: list[dict], path: str) -> None:
  """One horizontal group of bars per backbone (rows of experiments.table1.row)."""
  cols = ['concatenated', 'pca'] + [k for k in rows[0] if k.startswith('sigma=') and ' ' not in k]
  paper = paper_data.table1()
  n, h = len(rows), 0.8 / len(cols)
  fig, ax = plt.subplots(figsize=(7, 1.0 + 0.45 * n * max(1, len(cols) / 3)))
  for j, c in enumerate(cols):
    y = np.arange(n) + j * h
    mean = [r[c]['mean'] for r in rows]
    std = [r[c].get('std', 0.0) for r in rows]
    ax.barh(y, mean, h, xerr=std, label=f'{c} (ours)' if c.startswith('sigma') else f'{c} (before)', alpha=0.8)
    py = [(yy, paper[r['model']][_PAPER[c]]) for yy, r in zip(y, rows) if r['model'] in paper and c in _PAPER]
    if py:
      ax.plot([v for _, v in py], [yy for yy, _ in py], 'k|', ms=9, label='paper' if j == 0 else None)
  ax.set_yticks(np.arange(n) + 0.4 - h / 2)
  ax.set_yticklabels([r['model'] for r in rows], fontsize=8)
  ax.invert_yaxis()
  ax.set_xlabel(f'aR@1 (test pairs; adapted at the {rows[0]["rule"]}-selected epoch), mean ± 1 std over runs')
  ax.grid(axis='x', alpha=0.3)
  ax.legend(fontsize=7, loc='lower right')
  report.save_figure(fig, path)
