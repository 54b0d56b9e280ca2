"""Figures of the SimNet experiment (paper 002): training curve (+ warm-up held-out rho / MSE), warm-up scatter
(g vs cosine on held-out random pairs), test pairs' SimNet score vs cosine."""
from __future__ import annotations

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from visim_jax.core import report  # noqa: E402


def training_curve(losses: np.ndarray, warm_curve: np.ndarray, phase_ends, every: int, path: str) -> None:
  """Eq. 2 loss per step (smoothed), phase boundaries dashed; beside it the warm-up's held-out rho and MSE."""
  W, S1 = phase_ends[:2]
  fig, ax = plt.subplots(1, 2 if len(warm_curve) else 1, figsize=(11 if len(warm_curve) else 6, 3.8), squeeze=False)
  ax = ax[0]
  steps = np.arange(1, len(losses) + 1)
  k = max(1, min(every, len(losses) // 50 or 1))
  smooth = np.convolve(np.nan_to_num(losses), np.ones(k) / k, mode='valid')
  ax[0].plot(steps[k - 1:], smooth, lw=1)
  for b, lab in ((W, 'end of warm-up'), (S1, 'SimNet* refinement')):
    if 0 < b < len(losses):
      ax[0].axvline(b, color='k', ls='--', lw=0.8, label=lab)
  ax[0].set_xlabel('step')
  ax[0].set_ylabel('Eq. 2 loss (batch mean |s - target|)')
  ax[0].grid(alpha=0.3)
  if W < len(losses) and W:
    ax[0].legend(fontsize=8)
  if len(warm_curve):
    ax[1].plot(warm_curve[:, 0], warm_curve[:, 2], label='held-out rho')
    ax[1].set_xlabel('warm-up step')
    ax[1].set_ylabel('Pearson rho (g vs cosine)')
    ax[1].grid(alpha=0.3)
    a2 = ax[1].twinx()
    a2.semilogy(warm_curve[:, 0], warm_curve[:, 1], color='C1', label='held-out MSE')
    a2.set_ylabel('MSE')
    ax[1].set_title('warm-up: imitating cosine')
  report.save_figure(fig, path)


def warmup_scatter(cos: np.ndarray, pred: np.ndarray, path: str) -> None:
  fig, ax = plt.subplots(figsize=(4.5, 4.5))
  n = min(len(pred), 5000)
  ax.scatter(np.asarray(cos)[:n], pred[:n], s=2, alpha=0.4)
  ax.plot([-1, 1], [-1, 1], 'k--', lw=0.8)
  ax.set_xlabel('cosine similarity')
  ax.set_ylabel('SimNet score')
  ax.set_title('warm-up, held-out random pairs')
  report.save_figure(fig, path)


def score_vs_cosine(cos: np.ndarray, s: np.ndarray, match: np.ndarray, path: str) -> None:
  """Test pairs (up to 4,000 of each kind, seeded): SimNet score against cosine, matches in red."""
  rng = np.random.RandomState(0)
  fig, ax = plt.subplots(figsize=(4.8, 4.5))
  for m, lab, col in ((False, 'non-match', 'C0'), (True, 'match', 'C3')):
    idx = np.nonzero(match == m)[0]
    idx = rng.choice(idx, min(len(idx), 4000), replace=False) if len(idx) else idx
    ax.scatter(cos[idx], s[idx], s=3, alpha=0.4, label=lab, color=col)
  lo, hi = float(min(cos.min(), s.min())), float(max(cos.max(), s.max()))
  ax.plot([lo, hi], [lo, hi], 'k--', lw=0.8)
  ax.set_xlabel('cosine similarity')
  ax.set_ylabel('SimNet score')
  ax.legend(fontsize=8)
  ax.set_title('test pairs: SimNet vs cosine')
  report.save_figure(fig, path)
