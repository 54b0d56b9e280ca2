"""Writing results: JSON files and config.json (atomic, through ops), a console table, TensorBoard scalars, figures.

Only process 0 writes (multi-host runs call these on every host; the others return at once).
"""
from __future__ import annotations

import io
import json
import math
import os
import sys
from typing import Any, Mapping, Sequence

import jax
import numpy as np

from visim_jax.core import ops


def is_writer() -> bool:
  return jax.process_index() == 0


def _default(o):
  if isinstance(o, (np.floating, np.integer, np.bool_)):
    return o.item()
  if isinstance(o, (np.ndarray, jax.Array)):
    return np.asarray(o).tolist()
  if hasattr(o, 'to_dict'):
    return o.to_dict()
  return str(o)


def write_json(path: str, obj: Any) -> None:
  if is_writer():
    ops.atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=_default, allow_nan=True) + '\n')


def write_config(workdir: str, record: dict) -> None:
  """config.json: the run's config as a plain dict (experiments pass config.to_dict())."""
  write_json(os.path.join(workdir, 'config.json'), record)


def save_figure(fig, path: str) -> None:
  """Saves a matplotlib figure atomically (PNG, process 0) and closes it."""
  import matplotlib.pyplot as plt
  if is_writer():
    buf = io.BytesIO()
    fig.savefig(buf, format='png', dpi=110, bbox_inches='tight')
    ops.atomic_write_bytes(path, buf.getvalue())
  plt.close(fig)


def table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
  """A plain fixed-width text table (floats with 4 decimals)."""
  def fmt(v):
    if isinstance(v, float):
      return 'nan' if math.isnan(v) else f'{v:.4f}'
    return str(v)
  cells = [[fmt(v) for v in r] for r in rows]
  widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(header)]
  line = lambda r: '  '.join(c.rjust(w) for c, w in zip(r, widths))
  return '\n'.join([line(header), line(['-' * w for w in widths])] + [line(r) for r in cells])


def _summary_writer():
  """tensorboardX's SummaryWriter, imported without torch: its writer module tries `import torch` (only to accept
  torch tensors; ~5 s on a CPU box) and we write floats, so torch, when nothing imported it yet, is hidden for that
  one import (tensorboardX then takes NumPy arrays, as on a machine without torch)."""
  if 'torch' in sys.modules:
    from tensorboardX import SummaryWriter
    return SummaryWriter
  sys.modules['torch'] = None   # `import torch` raises ImportError while this is set
  try:
    from tensorboardX import SummaryWriter
  finally:
    if sys.modules.get('torch', 0) is None:
      del sys.modules['torch']
  return SummaryWriter


class ScalarWriter:
  """TensorBoard scalars under `logdir` (tensorboardX event files; write_scalars / flush / close).

  On processes other than 0 it writes nothing.
  """

  def __init__(self, logdir: str):
    self._writer = None
    if is_writer():
      self._writer = _summary_writer()(logdir)

  def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
    if self._writer is not None:
      for k, v in scalars.items():
        self._writer.add_scalar(k, float(v), int(step))

  def flush(self):
    if self._writer is not None:
      self._writer.flush()

  def close(self):
    if self._writer is not None:
      self._writer.close()


def metric_writer(workdir: str) -> ScalarWriter:
  return ScalarWriter(os.path.join(workdir, 'tensorboard'))
