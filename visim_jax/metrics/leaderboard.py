"""The leaderboard table: models x (protocol, subset) scores, the best of each column marked, published numbers.

build(results, models, protocols) -> Board: columns in protocol order then subset order, one row per model,
the best score of each column (every benchmark score is higher-is-better: 2AFC agreement, JND AP, odd-one-out
accuracy, aR@k; ties all marked), each cell's rank within its column (1 = best; used by the rank heatmap), and
the published scores (paper_data.human_judgements) of the same column: beside ours when the row's `spec` is one
of our models, else listed under "published". A degenerate cell (metrics/degenerate.py: all distances tied or
non-finite, labels that make every model score the same) is `degenerate: <reason>`: no number, never bold,
never ranked.
write(workdir, board): leaderboard.md (score and [ci_low, ci_high], best in bold) and leaderboard.csv (one
column per score / bound / n / degenerate reason); returns the markdown of our rows and one line per degenerate
cell (what the console shows).
"""
from __future__ import annotations

import csv
import dataclasses
import io
import os

import numpy as np

from visim_jax.core import ops
from visim_jax.data import paper_data
from visim_jax.metrics import degenerate


@dataclasses.dataclass
class Board:
  models: list[str]
  columns: list[tuple[str, str]]          # (protocol, subset)
  cells: dict                             # (model, column) -> {score, ci_low, ci_high, n}
  best: dict                              # column -> best score
  ranks: np.ndarray                       # (models, columns) float, NaN where no score
  published: list[dict]                   # rows of paper_data.human_judgements in these columns


def score_of(cell) -> float:
  """A cell's score as a number to rank: NaN for a missing or degenerate cell."""
  if cell is None or degenerate.reason_of(cell):
    return float('nan')
  return float(cell['score'])


def build(results: dict, models: list[str], protocols: list[str]) -> Board:
  columns = []
  for p in protocols:
    for m in models:
      for sub in results.get(m, {}).get(p, {}):
        if (p, sub) not in columns:
          columns.append((p, sub))
  cells = {(m, c): results[m][c[0]][c[1]] for m in models for c in columns
           if c[1] in results.get(m, {}).get(c[0], {})}
  best, ranks = {}, np.full((len(models), len(columns)), np.nan)
  for j, c in enumerate(columns):
    vals = np.array([score_of(cells.get((m, c))) for m in models], float)
    ok = np.isfinite(vals)
    if ok.any():
      best[c] = float(vals[ok].max())
      for i in np.nonzero(ok)[0]:
        ranks[i, j] = 1 + np.sum(vals[ok] > vals[i])
  pub = [r for r in paper_data.human_judgements() if (r['protocol'], r['subset']) in columns]
  return Board(models, columns, cells, best, ranks, pub)


def is_best(board: Board, m: str, c) -> bool:
  """The cell holds its column's best score (ties: every one of them); never a degenerate cell."""
  v = score_of(board.cells.get((m, c)))
  return bool(np.isfinite(v) and board.best.get(c) == v)


def degenerate_lines(board: Board) -> list[str]:
  """One line per degenerate cell: `degenerate: <model> / <protocol> <subset>: <reason>`."""
  return [f'degenerate: {m} / {c[0]} {c[1]}: {degenerate.reason_of(board.cells[(m, c)])}'
          for m in board.models for c in board.columns if degenerate.reason_of(board.cells.get((m, c)))]


def cell_text(cell, digits: int = 3) -> str:
  """`score [low, high]`, `degenerate: <reason>` or '-' (every console and table that prints a scored cell)."""
  if cell is None:
    return '-'
  if degenerate.reason_of(cell):
    return f'degenerate: {degenerate.reason_of(cell)}'
  s = f"{cell['score']:.{digits}f}"
  if np.isfinite(cell.get('ci_low', np.nan)):
    s += f" [{cell['ci_low']:.3f}, {cell['ci_high']:.3f}]"
  return s


def markdown(board: Board, published: bool = True, note: str = '') -> str:
  """The table (ours, with published numbers beside ours); published=True adds the other published rows; `note`
  (the toy-data caveat of the demo sets) heads the table and the published rows."""
  head = ['model'] + [f'{p} {s}' for p, s in board.columns]
  fmt = lambda xs: '| ' + ' | '.join(xs) + ' |'
  lines = ([f'**Toy data.** {note}', ''] if note else []) + [fmt(head), fmt(['---'] * len(head))]
  for m in board.models:
    row = [f'`{m}`']
    for c in board.columns:
      cell = board.cells.get((m, c))
      text = cell_text(cell)
      if is_best(board, m, c):
        text = f'**{text}**'
      pub = [r for r in board.published if r['spec'] == m and (r['protocol'], r['subset']) == c]
      if pub:
        text += f" (published {pub[0]['score']:.3f})"
      row.append(text)
    lines.append(fmt(row))
  ns = {c: next((board.cells[(m, c)]['n'] for m in board.models if (m, c) in board.cells), '') for c in board.columns}
  lines += ['', 'n (items scored): ' + ', '.join(f'{p} {s}: {ns[(p, s)]}' for p, s in board.columns), '',
            'Score [95% bootstrap interval]; the best of each column in bold. 2AFC: agreement with the human '
            'fraction (LPIPS / DreamSim rule); JND: average precision; THINGS: odd-one-out accuracy; TLL: aR@k; '
            'CoSIS: 2AFC accuracy. `degenerate: <reason>`: no score (all distances tied or not finite, or labels '
            'that give every model the same score); never bold, never ranked.']
  others = [r for r in board.published if r['spec'] not in board.models]
  if others and published:
    lines += ['', 'Published on the same columns (models not in this run' + ('; real data, NOT comparable with the '
                                                                         'toy scores above' if note else '') + '):', '',
              fmt(['model', 'column', 'score', 'source']), fmt(['---'] * 4)]
    lines += [fmt([r['model'], f"{r['protocol']} {r['subset']}", f"{r['score']:.3f}", r['source']]) for r in others]
  return '\n'.join(lines) + '\n'


def write(workdir: str, board: Board, note: str = '') -> str:
  """leaderboard.csv and .md (both carry `note`, the demo sets' toy-data caveat: a `data` column in the CSV); the
  console text."""
  header = ['model'] + (['data'] if note else [])
  for p, s in board.columns:
    header += [f'{p}/{s}', f'{p}/{s} ci_low', f'{p}/{s} ci_high', f'{p}/{s} n', f'{p}/{s} best',
               f'{p}/{s} published', f'{p}/{s} degenerate']
  rows = []
  for m in board.models:
    row = [m] + (['toy demo sets, not comparable with published numbers'] if note else [])
    for c in board.columns:
      cell = board.cells.get((m, c))
      pub = [r['score'] for r in board.published if r['spec'] == m and (r['protocol'], r['subset']) == c]
      why = degenerate.reason_of(cell)
      if cell is None or why:
        row += ['', '', '', cell['n'] if why else '', 0 if why else '', pub[0] if pub else '', why or '']
      else:
        row += [cell['score'], cell['ci_low'], cell['ci_high'], cell['n'], int(is_best(board, m, c)),
                pub[0] if pub else '', '']
    rows.append(row)
  buf = io.StringIO()
  csv.writer(buf, lineterminator='\n').writerows([header] + rows)
  ops.atomic_write_text(os.path.join(workdir, 'leaderboard.csv'), buf.getvalue())
  ops.atomic_write_text(os.path.join(workdir, 'leaderboard.md'), markdown(board, note=note))
  lines = degenerate_lines(board)
  return markdown(board, published=False, note=note) + ''.join(line + '\n' for line in lines)
