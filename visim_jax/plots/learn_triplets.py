"""Figure of the triplet-learning experiment: training loss per step and held-out odd-one-out accuracy per
evaluation, with the frozen features' and the untrained head's accuracy as reference lines."""
from __future__ import annotations

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from visim_jax.core import report  # noqa: E402


def curves(tree: dict, frozen: dict, untrained: dict, hp, path: str) -> None:
  loss = np.asarray(tree['loss'])
  steps = np.arange(1, len(loss) + 1)
  fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.8))
  a1.plot(steps, loss, lw=0.6, alpha=0.4, label='per step')
  w = max(1, len(loss) // 50)
  if len(loss) >= w > 1:
    a1.plot(steps[w - 1:], np.convolve(loss, np.ones(w) / w, mode='valid'), label=f'mean of {w} steps')
  a1.set_xlabel('step')
  a1.set_ylabel(f'{hp.loss} loss (train batches)')
  a1.grid(alpha=0.3)
  a1.legend(fontsize=8)
  vs, va = np.asarray(tree['val_step']), np.asarray(tree['val_accuracy'])
  a2.plot(np.concatenate([[0], vs]), np.concatenate([[untrained['accuracy']], va]), 'o-', ms=3, label='head')
  a2.axhline(frozen['accuracy'], ls='--', color='gray', label=f"frozen features {frozen['accuracy']:.3f}")
  a2.axhline(1 / 3, ls=':', color='k', lw=0.8, label='chance 1/3')
  a2.set_xlabel('step')
  a2.set_ylabel('held-out odd-one-out accuracy')
  a2.grid(alpha=0.3)
  a2.legend(fontsize=8, loc='lower right')
  fig.suptitle(f'head {hp.head}, loss {hp.loss} (tau {hp.tau:g}), {hp.similarity} similarity', fontsize=9)
  report.save_figure(fig, path)
