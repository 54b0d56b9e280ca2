"""The leaderboard's figure: models x protocol columns, each cell coloured by its rank GROUP in the column on a
discrete scale (metrics/leaderboard.py: 1 + the number of models significantly better in a paired test; models
that cannot be separated share a group and a colour, marked '='), annotated with the score and its bootstrap
interval; a column's significant best framed in black; degenerate cells (metrics/degenerate.py) grey, hatched and
labelled with their kind, never ranked; missing cells blank. Models ordered by their mean rank."""
from __future__ import annotations

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import BoundaryNorm, ListedColormap  # noqa: E402
from matplotlib.patches import Patch, Rectangle  # noqa: E402

from visim_jax.core import report  # noqa: E402
from visim_jax.metrics import degenerate  # noqa: E402

GREY = '#d9d9d9'


def _cell_text(cell, rank: float, tied: bool) -> str:
  text = f"{cell['score']:.3f}"
  if np.isfinite(cell.get('ci_low', np.nan)):
    text += f"\n[{cell['ci_low']:.3f}, {cell['ci_high']:.3f}]"
  return text + f"\nrank {'=' if tied else ''}{int(rank)}"


def rank_heatmap(board, path: str) -> None:
  ranks = board.ranks
  n_m, n_c = ranks.shape
  order = np.argsort(np.nanmean(np.where(np.isfinite(ranks), ranks, n_m + 1), axis=1), kind='stable')
  n_ranks = int(np.nanmax(ranks)) if np.isfinite(ranks).any() else 1
  colours = plt.get_cmap('viridis_r')(np.linspace(0.05, 0.95, max(n_ranks, 2)))[:n_ranks]
  cmap = ListedColormap(colours)
  norm = BoundaryNorm(np.arange(0.5, n_ranks + 1.5), cmap.N)
  fig, ax = plt.subplots(figsize=(2.6 + 1.35 * n_c, 1.4 + 0.62 * n_m))
  ax.imshow(np.ma.masked_invalid(ranks[order]), cmap=cmap, norm=norm, aspect='auto')
  any_degenerate = False
  for i, m in enumerate(order):
    for j, c in enumerate(board.columns):
      cell = board.cells.get((board.models[m], c))
      if cell is None:
        continue
      why = degenerate.reason_of(cell)
      if why:
        any_degenerate = True
        ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor=GREY, edgecolor='grey', hatch='///', lw=0))
        ax.text(j, i, f'degenerate\n{degenerate.kind(why)}', ha='center', va='center', fontsize=6.5,
                color='black', bbox=dict(facecolor=GREY, edgecolor='none', pad=1))
        continue
      r = ranks[m, j]
      tied = int(np.sum(ranks[:, j] == r)) > 1
      dark = (r - 1) / max(n_ranks - 1, 1) > 0.5
      ax.text(j, i, _cell_text(cell, r, tied), ha='center', va='center', fontsize=6.5,
              color='white' if dark else 'black', fontweight='bold' if board.best.get(c) == board.models[m] else None)
      if board.best.get(c) == board.models[m]:
        ax.add_patch(Rectangle((j - 0.47, i - 0.47), 0.94, 0.94, fill=False, edgecolor='black', lw=1.6))
  ax.set_xticks(range(n_c))
  ax.set_xticklabels([f'{p}\n{s}' for p, s in board.columns], fontsize=7, rotation=45, ha='right')
  ax.set_yticks(range(n_m))
  ax.set_yticklabels([board.models[m] for m in order], fontsize=7)
  ax.set_xticks(np.arange(-0.5, n_c), minor=True)
  ax.set_yticks(np.arange(-0.5, n_m), minor=True)
  ax.grid(which='minor', color='white', lw=1.5)
  ax.tick_params(which='minor', length=0)
  handles = [Patch(facecolor=colours[k], label=f'rank {k + 1}' + (' (best)' if k == 0 else ''))
             for k in range(n_ranks)]
  if any_degenerate:
    handles.append(Patch(facecolor=GREY, hatch='///', edgecolor='grey', label='degenerate (not ranked)'))
  handles.append(Patch(facecolor='white', edgecolor='black', lw=1.6, label='significantly best'))
  test = getattr(board, 'test', 'none')
  ax.legend(handles=handles, loc='upper left', bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False,
            title='rank group in column' if test != 'none' else 'rank in column', title_fontsize=7)
  ax.set_title('Leaderboard: score [95% interval] and rank group per column (= : not separable; '
               f'{"paired " + test if test != "none" else "no test"})', fontsize=9)
  report.save_figure(fig, path)
