"""The one timing rule of every benchmark here: both sides interleaved, repeated, median and spread.

  times = interleaved({'ours': run_ours, 'reference': run_ref}, alternations=3)
  stats = compare(times['ours'], times['reference'], work=n_items, unit='images')
  result['rows'] = [row('extraction, EfficientNet-Lite0', stats, 'ours: jitted Flax', 'PyTorch eager', 'images')]

`interleaved` runs each side once per alternation, the order flipping every time (A B, B A, A B, ...), so a
change of machine load during the run hits both sides alike; each callable must block until its result is
computed (jax.block_until_ready / a NumPy result). Each timed call starts after a pause (PAUSE_S), so the worker
threads of the side before have gone idle: OpenBLAS's spin for about 0.1 s after a call (measured: a jitted search
timed right after NumPy's matmul took 1.3x the CPU time it took after a pause), OpenMP's for a while too. A
side whose call is short is timed over back-to-back calls (MIN_TIME_S, the same count on every side): one call of
~10-60 ms timed alone after the pause measured this VM's wake-up too (an XLA convolution took ~2 ms longer after
it than back to back, torch's did not), which is not the throughput a user's loop gets.
`compare` reports each side's median seconds (and items per second when `work` is given), the ratio reference /
ours of the medians (> 1: ours is faster), and the spread: the smallest and largest ratio of the alternations' pairs. `load_average()` is the machine's 1, 5 and
15 minute load average (os.getloadavg) at the moment it is called: print it with every result. `row` makes
the line benchmarks/run_all.py puts in its table (capability, ours, reference, ratio, spread, load average).
"""
from __future__ import annotations

import json
import os
import time
from typing import Any, Callable

import numpy as np


def load_average() -> list[float]:
  try:
    return [round(x, 2) for x in os.getloadavg()]
  except OSError:
    return []


PAUSE_S = 0.25
MIN_TIME_S = 0.2


def interleaved(sides: dict[str, Callable[[], Any]], alternations: int = 3, warmup: bool = True,
                pause: float = PAUSE_S, min_time: float = MIN_TIME_S) -> dict:
  """{name: [seconds of one call, per alternation]}; one untimed warm-up call of each side first (compile,
  caches); `pause` seconds of idle before each timed call (not timed).

  min_time > 0: each alternation times `reps` back-to-back calls of a side and records their mean, reps the same
  for every side and chosen from untimed calls of each (up to 3) so that the fastest side's reps last >= min_time
  (a call of ~0.1 ms timed alone after the pause measures the thread pools' wake-up, not the work: PSNR of 8 pairs
  of 64 px took 81 us a call back to back and ~0.5 ms timed alone)."""
  names = list(sides)
  if warmup:
    for n in names:
      sides[n]()
  reps = 1
  if min_time > 0:
    one = []
    for n in names:
      for _ in range(3):   # back to back (the first may still pay the wake-up); a long call needs no second
        t = time.perf_counter()
        sides[n]()
        one.append(time.perf_counter() - t)
        if one[-1] >= min_time:
          break
    reps = max(1, int(np.ceil(min_time / max(min(one), 1e-9))))
  times = {n: [] for n in names}
  for i in range(alternations):
    for n in (names if i % 2 == 0 else names[::-1]):
      if pause:
        time.sleep(pause)
      t = time.perf_counter()
      for _ in range(reps):
        sides[n]()
      times[n].append((time.perf_counter() - t) / reps)
  return times


def compare(ours: list[float], ref: list[float], work: float | None = None, unit: str = 'items') -> dict:
  """Medians, the ratio ref/ours of the medians (> 1: ours faster) and its spread over the alternations."""
  ours, ref = np.asarray(ours, float), np.asarray(ref, float)
  pair = ref / ours
  out = {'ours_s': float(np.median(ours)), 'reference_s': float(np.median(ref)),
         'ours_all_s': [round(float(t), 4) for t in ours], 'reference_all_s': [round(float(t), 4) for t in ref],
         'ratio': float(np.median(ref) / np.median(ours)),
         'spread': [float(pair.min()), float(pair.max())], 'alternations': int(len(ours)),
         'load_average': load_average()}
  if work:
    out[f'ours_{unit}_per_s'] = float(work / np.median(ours))
    out[f'reference_{unit}_per_s'] = float(work / np.median(ref))
  return out


def sgemm_gflops(m: int, k: int, n: int, alternations: int = 3) -> dict:
  """This box's float32 matmul rate now for an (m, k) x (k, n) product, GFLOP/s: {'xla': our programs' dot (jitted
  jnp.matmul), 'numpy': NumPy's BLAS, 'torch': PyTorch's (when installed), 'best': the largest}; interleaved,
  each round's calls back to back for >= MIN_TIME_S. The roofline of a row whose both sides are matrix products. On an
  accelerator only 'xla' is measured (on the device, the row's rate; a host BLAS is not that device's roofline):
  pass the row's own shape there (a small product leaves a GPU idle and would understate its rate)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from visim_jax.core import cpu_kernels  # pylint: disable=g-import-not-at-top
  on_cpu = jax.default_backend() == 'cpu'
  flops = 2.0 * m * k * n
  if on_cpu:
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
    ja, jb = jnp.asarray(a), jnp.asarray(b)
  else:   # drawn on the device (a host copy of a large operand would only cost time)
    ka, kb = jax.random.split(jax.random.key(0))
    ja, jb = jax.random.normal(ka, (m, k), jnp.float32), jax.random.normal(kb, (k, n), jnp.float32)
  mm = cpu_kernels.jit(jnp.matmul)
  sides = {'xla': lambda: jax.block_until_ready(mm(ja, jb))}
  if on_cpu:
    sides['numpy'] = lambda: a @ b
    try:
      import torch  # pylint: disable=g-import-not-at-top
      ta, tb = torch.from_numpy(a), torch.from_numpy(b)
      sides['torch'] = lambda: ta @ tb
    except ImportError:
      pass
  times = interleaved(sides, alternations)
  out = {k_: flops / float(np.median(v)) / 1e9 for k_, v in times.items()}
  out['best'] = max(out.values())
  out['shape'] = [m, k, n]
  out['backend'] = jax.default_backend()
  return out


def roofline_percent(flops: float, seconds: float, gflops: float) -> float:
  """The share (%) of a rate of `gflops` GFLOP/s that `flops` done in `seconds` reach."""
  return 100.0 * flops / seconds / 1e9 / gflops


def row(capability: str, stats: dict, ours: str, reference: str, unit: str | None = None) -> dict:
  """One line of run_all's table from `compare`'s stats: each side named with its rate (or median seconds)."""
  def side(name, key):
    rate = stats.get(f'{key}_{unit}_per_s') if unit else None
    return f'{name}: {rate:.4g} {unit}/s' if rate is not None else f'{name}: {stats[key + "_s"]:.4g} s'
  return {'capability': capability, 'ours': side(ours, 'ours'), 'reference': side(reference, 'reference'),
          'ratio': stats['ratio'], 'spread': stats['spread'], 'alternations': stats['alternations'],
          'load_average': stats['load_average']}


def emit(out: dict, path: str | None = None) -> dict:
  """Prints a benchmark's JSON (the line run_all reads) and writes it to `path` too when given."""
  text = json.dumps(out, indent=2)
  print(text)
  if path:
    with open(path, 'w') as f:
      f.write(text + '\n')
  return out
