"""The reliability plot of a calibration (zoo/calibrated.py): mean predicted vs mean observed probability per bin,
the diagonal for reference, marker area by the bin's weight. Writes a PNG."""
from __future__ import annotations

import os

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def reliability(rows: dict, path: str, title: str = '') -> None:
  fig, ax = plt.subplots(figsize=(4, 4))
  ax.plot([0, 1], [0, 1], color='0.6', lw=1, ls='--')
  w = np.asarray(rows['weight'], float)
  size = 20 + 200 * w / w.max() if w.size else []
  ax.scatter(rows['predicted'], rows['observed'], s=size, zorder=3)
  ax.plot(rows['predicted'], rows['observed'], lw=1)
  ax.set(xlim=(0, 1), ylim=(0, 1), xlabel='predicted probability', ylabel='observed fraction', title=title)
  ax.title.set_fontsize(8)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=100)
  plt.close(fig)
