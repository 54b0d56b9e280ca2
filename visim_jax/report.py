"""Writing results: atomic JSON files, config.json, a console table, TensorBoard scalars, figures.

Only process 0 writes (multi-host runs call these on every host; the others return at once).
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from typing import Any, Mapping, Sequence

import jax
import numpy as np


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


def atomic_write_text(path: str, text: str) -> None:
  folder = os.path.dirname(os.path.abspath(path))
  os.makedirs(folder, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=folder, prefix='.tmp-')
  try:
    with os.fdopen(fd, 'w') as f:
      f.write(text)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def write_json(path: str, obj: Any) -> None:
  if is_writer():
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=_default, allow_nan=True) + '\n')


def write_config(workdir: str, config) -> None:
  write_json(os.path.join(workdir, 'config.json'), config.to_dict() if hasattr(config, 'to_dict') else config)


def save_figure(fig, path: str) -> None:
  """Saves a matplotlib figure atomically (PNG) and closes it."""
  import matplotlib.pyplot as plt
  if is_writer():
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix='.tmp-', suffix='.png')
    os.close(fd)
    try:
      fig.savefig(tmp, dpi=110, bbox_inches='tight')
      os.replace(tmp, path)
    finally:
      if os.path.exists(tmp):
        os.remove(tmp)
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


class ScalarWriter:
  """TensorBoard scalars under `logdir` with the clu writer interface (write_scalars / flush / close).

  clu's TensorBoard writer needs TensorFlow (an optional extra here), so the event files are written with
  tensorboardX; on processes other than 0 it writes nothing.
  """

  def __init__(self, logdir: str):
    self._writer = None
    if is_writer():
      from tensorboardX import SummaryWriter
      self._writer = SummaryWriter(logdir)

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


def write_scalars_series(workdir: str, series: Mapping[str, Sequence[float]], step0: int = 1) -> None:
  """Writes {name: values over steps} as TensorBoard scalars (one event per step)."""
  writer = metric_writer(workdir)
  n = max((len(v) for v in series.values()), default=0)
  for t in range(n):
    writer.write_scalars(step0 + t, {k: float(v[t]) for k, v in series.items() if t < len(v)})
  writer.close()
