"""Figures of the adaptation experiment (paper 001): aR@k against k (paper Fig. 3), training curves, retrieval sheet (Fig. 4)."""
from __future__ import annotations

import os

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from visim_jax.models import adaptation  # noqa: E402
from visim_jax.core import pca as pca_lib, report
from visim_jax.training import adaptation_runs
from visim_jax.data import images as images_lib  # noqa: E402
from visim_jax.data.preprocess import Preprocess  # noqa: E402
from visim_jax.metrics import retrieval  # noqa: E402


def _band(ax, x, runs, label, style='-', color=None):
  """Mean over runs (axis 0) as a line, mean +- 2 std as a band (paper Fig. 3); returns the band's lowest point."""
  m, s = runs.mean(0), runs.std(0)
  line, = ax.plot(x, m, style, label=label, color=color)
  ax.fill_between(x, m - 2 * s, m + 2 * s, alpha=0.15, color=line.get_color())
  return float(np.min(m - 2 * s))


def recall_at_k(out: dict, path: str, chosen: int, max_k: int = 50, rule: str = 'test', sigma: str = '') -> None:
  """aR@k for k = 1..max_k (log axis: the gain is at small k): raw and PCA (dashed, before) vs adapted at the
  chosen epoch and at the last; mean +- 2 std over runs; the y axis starts under the lowest band."""
  ks = np.arange(1, max_k + 1)
  fig, ax = plt.subplots(figsize=(6, 4))
  low = min(_band(ax, ks, adaptation_runs.recall_from_ranks(out['raw'], ks), 'raw features (before)', '--'),
            _band(ax, ks, adaptation_runs.recall_from_ranks(out['pca'], ks), 'PCA features (before)', '--'),
            _band(ax, ks, adaptation_runs.recall_from_ranks(out['ranks'][:, chosen], ks),
                  f'adapted, epoch {chosen + 1} ({rule} rule)'),
            _band(ax, ks, adaptation_runs.recall_from_ranks(out['ranks'][:, -1], ks), 'adapted, last epoch', ':'))
  ax.set_xscale('log')
  ax.set_xlim(1, max_k)
  ax.set_xlabel('k (log scale)')
  ax.set_ylabel('Asymmetric Recall aR@k')
  ax.set_ylim(max(0.0, np.floor(low * 10) / 10), 1.02)
  ax.grid(alpha=0.3, which='both')
  ax.legend(loc='lower right', fontsize=8)
  ax.set_title(f'aR@k on the test pairs{", " + sigma if sigma else ""}: mean ± 2 std over '
               f'{out["ranks"].shape[0]} runs (band)', fontsize=9)
  report.save_figure(fig, path)


def training_curves(loss: np.ndarray, curve: np.ndarray, ks, chosen_epoch: int, path: str, rule: str = 'test',
                    sigma: str = '', val_curve: np.ndarray | None = None) -> None:
  """Training loss and test (and validation) aR@k per epoch, mean ± 2 std over runs; the chosen epoch marked.
  loss (R, E); curve and val_curve (R, E, K)."""
  epochs = np.arange(1, loss.shape[1] + 1)
  fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.8))
  _band(a1, epochs, loss, 'train loss')
  a1.set_xlabel('epoch')
  a1.set_ylabel('symmetric cross-entropy')
  a1.grid(alpha=0.3)
  a1.legend(fontsize=8)
  low = min(_band(a2, epochs, curve[:, :, j], f'test aR@{k}') for j, k in enumerate(ks))
  if val_curve is not None:
    low = min(low, _band(a2, epochs, val_curve[:, :, 0], f'validation aR@{ks[0]} (picks the val epoch)', '--',
                         color='k'))
  a2.axvline(chosen_epoch, color='k', lw=0.8, ls=':', label=f'headline epoch ({rule} rule): {chosen_epoch}')
  a2.set_xlabel('epoch')
  a2.set_ylabel('aR@k')
  a2.set_ylim(max(0.0, np.floor(low * 10) / 10), 1.02)  # curves at 1.0 stay visible above the frame's edge
  a2.grid(alpha=0.3)
  a2.legend(fontsize=7)
  fig.suptitle(f'Training{" at " + sigma if sigma else ""}: mean over {loss.shape[0]} runs, band = ± 2 std over runs',
               fontsize=9)
  report.save_figure(fig, path)


def retrieval_sheet(feats, out: dict, names, paths, path: str, n_queries: int = 6, top: int = 5,
                    thumb: int = 96, label: str = 'run 0, last epoch') -> None:
  """Run 0: test queries (left), their ground truth (right), top-5 rights before (raw cosine) and after
  (the adaptation of `out['params']`: the last epoch; `label` says which model that is)."""
  test = out['test_idx'][0]
  left_paths, right_paths = paths
  p0 = pca_lib.PCA(*(np.asarray(a)[0] for a in out['pcas']))
  w0 = {'w': np.asarray(out['params']['w'])[0]}
  lt, rt = feats.left[test], feats.right[test]
  raw = np.asarray(retrieval.cosine_matrix(lt, rt))
  adapted = np.asarray(retrieval.cosine_matrix(adaptation.adapt(w0, pca_lib.transform(p0, lt)),
                                               adaptation.adapt(w0, pca_lib.transform(p0, rt))))
  queries = np.linspace(0, len(test) - 1, min(n_queries, len(test))).astype(int)
  pre = Preprocess(size=thumb, resize='shorter_crop')
  cols = 2 + 2 * top
  fig, axes = plt.subplots(len(queries), cols, figsize=(cols * 1.1, len(queries) * 1.25))
  axes = np.atleast_2d(axes)
  for row, q in enumerate(queries):
    cells = [(left_paths[test[q]], 'query'), (right_paths[test[q]], 'truth')]
    for label, sim in (('before', raw), ('after', adapted)):
      for rank, j in enumerate(np.argsort(-sim[q])[:top]):
        cells.append((right_paths[test[j]], f'{label} {rank + 1}' + (' ✓' if j == q else '')))
    for c, (p, title) in enumerate(cells):
      ax = axes[row, c]
      ax.imshow(images_lib.load_image(p, pre))
      ax.set_xticks([]), ax.set_yticks([])
      ax.set_title(title, fontsize=6, color='green' if '✓' in title else 'black')
  fig.suptitle(f'Retrieval ({label}): query, ground truth, top-5 before | after adaptation', fontsize=8)
  report.save_figure(fig, path)


def all_figures(out: dict, summary: dict, metrics: dict, folder: str) -> None:
  """recall_at_k[_sigma=S].png and training_curves[_sigma=S].png for every sigma, at the primary rule's epoch."""
  sigmas, rule = metrics['sigmas'], metrics['epoch_rule']['primary']
  val = summary.get('val_curves')
  for s, sigma in enumerate(sigmas):
    one, key = adaptation_runs.select_sigma(out, s), adaptation_runs.sigma_key(sigma)
    tag = '' if len(sigmas) == 1 else f'_{key}'
    chosen = summary['epochs'][key][rule]
    recall_at_k(one, os.path.join(folder, f'recall_at_k{tag}.png'), chosen - 1, max_k=min(50, metrics['n_test']),
                rule=rule, sigma=key)
    training_curves(one['loss'], summary['curves'][:, s], metrics['ks'], chosen,
                    os.path.join(folder, f'training_curves{tag}.png'), rule=rule, sigma=key,
                    val_curve=None if val is None else val[:, s])
