"""The leaderboard table: models x (protocol, subset) scores, ranked by paired tests, published numbers beside ours.

build(results, models, protocols, opts) -> Board: columns in protocol order then subset order, one row per model.
Every benchmark score is higher-is-better (2AFC agreement, JND AP, odd-one-out accuracy, aR@k, mAP; the metrics of
models/classical.py enter as distances, smaller = more similar, so their columns read the same way). Within a
column the models were scored on the same items, so they are compared by a PAIRED test on those items
(metrics/paired.py; `RankOptions.test`): 'bootstrap' (default: the difference of the two scores on the same
resampled items, 95%), 'sign' (exact sign test / McNemar on per-item values; JND AP falls back to the bootstrap),
or 'none' (the plain order of the scores, as before issue 35). A cell's rank is its rank GROUP: 1 + the number of
models significantly better than it, so models that cannot be separated share a rank; a score is bold only when it
is significantly better than every other score of its column (a lone model, or a best that is not separable from
the next, is not bold). `RankOptions.twoafc_loglik` adds, for every 2AFC column, Hepburn et al.'s likelihood view
(`<subset> loglik`: the mean log-likelihood of the human fractions under the model's distances, metrics/paired.py).
Cells without per-item data (`items`: records written before issue 35) are never separated from any other.
The published scores (paper_data.human_judgements) of the same column sit beside ours when the row's `spec` is one
of our models, else are listed under "published". A degenerate cell (metrics/degenerate.py) is
`degenerate: <reason>`: no number, never bold, never ranked.
write(workdir, board): leaderboard.md and leaderboard.csv (score, bounds, n, rank group, significant best,
published, degenerate reason); returns the markdown of our rows and one line per degenerate cell.
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
from visim_jax.metrics import paired


@dataclasses.dataclass(frozen=True)
class RankOptions:
  test: str = 'bootstrap'          # 'bootstrap' | 'sign' | 'none'
  alpha: float = 0.05
  n_boot: int = 1000
  seed: int = 0
  twoafc_loglik: bool = False      # add Hepburn et al.'s likelihood column beside each 2AFC column
  bandwidth: float = 0.05          # its kernel width, on the empirical-CDF scale


@dataclasses.dataclass
class Board:
  models: list[str]
  columns: list[tuple[str, str]]          # (protocol, subset)
  cells: dict                             # (model, column) -> {score, ci_low, ci_high, n[, items]}
  best: dict                              # column -> the model that is significantly best (absent: none)
  ranks: np.ndarray                       # (models, columns) rank group, NaN where no score
  published: list[dict]                   # rows of paper_data.human_judgements in these columns
  pvalues: dict = dataclasses.field(default_factory=dict)   # column -> (models, models) paired p-values
  test: str = 'bootstrap'
  alpha: float = 0.05


def score_of(cell) -> float:
  """A cell's score as a number to rank: NaN for a missing or degenerate cell."""
  if cell is None or degenerate.reason_of(cell):
    return float('nan')
  return float(cell['score'])


def _loglik_cell(cell, opts: RankOptions) -> dict | None:
  """A 2AFC cell's likelihood twin: mean per-judgement log-likelihood, its bootstrap interval, per-item values."""
  items = cell.get('items') if isinstance(cell, dict) else None
  if not items or items.get('kind') != '2afc' or degenerate.reason_of(cell):
    return None
  from visim_jax.metrics import human  # pylint: disable=g-import-not-at-top
  ll = paired.twoafc_loglik(items['d0'], items['d1'], items['judge'], opts.bandwidth)
  out = human.mean_interval(ll, n_resamples=opts.n_boot, alpha=opts.alpha, seed=opts.seed)
  return {**out, 'items': {'kind': 'loglik', 'values': ll.tolist()}}


def build(results: dict, models: list[str], protocols: list[str], opts: RankOptions = RankOptions()) -> Board:
  if opts.test not in paired.TESTS:
    raise ValueError(f'test: one of {paired.TESTS}, got {opts.test!r}')
  columns = []
  for p in protocols:
    for m in models:
      for sub in results.get(m, {}).get(p, {}):
        if (p, sub) not in columns:
          columns.append((p, sub))
  cells = {(m, c): results[m][c[0]][c[1]] for m in models for c in columns
           if c[1] in results.get(m, {}).get(c[0], {})}
  if opts.twoafc_loglik:
    extended = []
    for c in columns:
      extended.append(c)
      twins = {m: _loglik_cell(cells.get((m, c)), opts) for m in models}
      if any(v is not None for v in twins.values()):
        extended.append((c[0], f'{c[1]} loglik'))
        cells.update({(m, extended[-1]): v for m, v in twins.items() if v is not None})
    columns = extended
  best, ranks, pvalues = {}, np.full((len(models), len(columns)), np.nan), {}
  for j, c in enumerate(columns):
    vals = np.array([score_of(cells.get((m, c))) for m in models], float)
    ok = np.isfinite(vals)
    if not ok.any():
      continue
    if opts.test == 'none':
      for i in np.nonzero(ok)[0]:
        ranks[i, j] = 1 + np.sum(vals[ok] > vals[i])
      top = np.nonzero(ok & (vals == vals[ok].max()))[0]
      if len(top) == 1 and ok.sum() > 1:
        best[c] = models[top[0]]
      continue
    items = [(cells.get((m, c)) or {}).get('items') if ok[i] else None for i, m in enumerate(models)]
    better, p = paired.compare(items, vals, opts.test, opts.n_boot, opts.alpha, opts.seed)
    ranks[:, j] = paired.rank_groups(better, ok)
    pvalues[c] = p
    for i in np.nonzero(ok)[0]:
      if paired.significant_best(better, i, ok):
        best[c] = models[i]
  pub = [r for r in paper_data.human_judgements() if (r['protocol'], r['subset']) in columns]
  return Board(models, columns, cells, best, ranks, pub, pvalues, opts.test, opts.alpha)


def is_best(board: Board, m: str, c) -> bool:
  """The cell is its column's significant best (paired test; test='none': the unique highest score)."""
  return board.best.get(c) == m and np.isfinite(score_of(board.cells.get((m, c))))


def rank_of(board: Board, m: str, c) -> float:
  return float(board.ranks[board.models.index(m), board.columns.index(c)])


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


def _rank_text(board: Board, m: str, c) -> str:
  r = rank_of(board, m, c)
  if not np.isfinite(r):
    return ''
  j = board.columns.index(c)
  shared = int(np.sum(board.ranks[:, j] == r)) > 1
  return f" ({int(r)}{'=' if shared else ''})"


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
      text += _rank_text(board, m, c)
      pub = [r for r in board.published if r['spec'] == m and (r['protocol'], r['subset']) == c]
      if pub:
        text += f" (published {pub[0]['score']:.3f})"
      row.append(text)
    lines.append(fmt(row))
  ns = {c: next((board.cells[(m, c)]['n'] for m in board.models if (m, c) in board.cells), '') for c in board.columns}
  test = {'bootstrap': f'a paired bootstrap of the score difference on the same items ({100 * (1 - board.alpha):g}%)',
          'sign': f'an exact sign test (McNemar for 0/1 items) on the same items, p < {board.alpha:g} (JND: paired '
                  'bootstrap)',
          'none': 'no test: the plain order of the scores'}[board.test]
  lines += ['', 'n (items scored): ' + ', '.join(f'{p} {s}: {ns[(p, s)]}' for p, s in board.columns), '',
            'Score [95% bootstrap interval] (rank group). Ranks come from ' + test + ': a model\'s rank is 1 + the '
            'number of models significantly better than it, so models that cannot be separated share a rank (=); '
            'bold: significantly better than every other model of its column. 2AFC: agreement with the human '
            'fraction (LPIPS / DreamSim rule); loglik: mean log-likelihood of the human fractions given the '
            'model\'s distances (Hepburn et al.); JND: average precision; THINGS: odd-one-out accuracy; TLL: aR@k; '
            'CoSIS: 2AFC accuracy; quality sets (kadid, tid2013, pipal, live, csiq, pieapp): Spearman / Kendall / '
            'Pearson (after the five-parameter logistic) correlation of -distance with the opinion scores '
            '(pieapp_2afc: the 2AFC rule on PieAPP\'s pairs). `degenerate: <reason>`: no score (all distances tied or '
            'not finite, or labels '
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
    header += [f'{p}/{s}', f'{p}/{s} ci_low', f'{p}/{s} ci_high', f'{p}/{s} n', f'{p}/{s} rank', f'{p}/{s} best',
               f'{p}/{s} published', f'{p}/{s} degenerate']
  rows = []
  for m in board.models:
    row = [m] + (['toy demo sets, not comparable with published numbers'] if note else [])
    for c in board.columns:
      cell = board.cells.get((m, c))
      pub = [r['score'] for r in board.published if r['spec'] == m and (r['protocol'], r['subset']) == c]
      why = degenerate.reason_of(cell)
      if cell is None or why:
        row += ['', '', '', cell['n'] if why else '', '', 0 if why else '', pub[0] if pub else '', why or '']
      else:
        r = rank_of(board, m, c)
        row += [cell['score'], cell['ci_low'], cell['ci_high'], cell['n'], int(r) if np.isfinite(r) else '',
                int(is_best(board, m, c)), pub[0] if pub else '', '']
    rows.append(row)
  buf = io.StringIO()
  csv.writer(buf, lineterminator='\n').writerows([header] + rows)
  ops.atomic_write_text(os.path.join(workdir, 'leaderboard.csv'), buf.getvalue())
  ops.atomic_write_text(os.path.join(workdir, 'leaderboard.md'), markdown(board, note=note))
  lines = degenerate_lines(board)
  return markdown(board, published=False, note=note) + ''.join(line + '\n' for line in lines)


def without_items(results: dict) -> dict:
  """results[model][protocol][subset] with every cell's per-item data left out (leaderboard.json stays small; the
  items live in the records)."""
  return {m: {p: {s: {k: v for k, v in cell.items() if k != 'items'} for s, cell in subs.items()}
              for p, subs in prots.items()} for m, prots in results.items()}
