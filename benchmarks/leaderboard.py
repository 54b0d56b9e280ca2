r"""The leaderboard's scoring time for one cell (a model on a 2AFC protocol, features cached): ours vs NumPy.

  python benchmarks/leaderboard.py            # 20,000 triplets over 30,000 images x 1,280-D (BAPPS-val sized)
  python benchmarks/leaderboard.py --small    # 2,000 triplets (NIGHTS-test sized)

Same work on the same random feature table, judgements and bootstrap size, interleaved A B B A ... (>= 3
alternations), median and spread (min, max) per path:
  ours   visim_jax.zoo.scoring.pair_distances (jitted cosine distance in fixed batches) for d(ref, p0), d(ref, p1),
         then visim_jax.metrics.human.twoafc_interval (the 2AFC score + a vmapped 1,000-resample bootstrap)
  numpy  what a user would write: row-normalise, einsum the pairs, the LPIPS/DreamSim rule, a NumPy bootstrap
         (an (n_boot, T) index matrix, the rule's mean per resample), np.quantile
The scores are checked equal (the point estimate exactly, the intervals within bootstrap noise). The first call
(compilation) is reported apart. Prints one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import precision  # noqa: E402
from visim_jax.zoo import similarity  # noqa: E402
from visim_jax.zoo import interface
from visim_jax.zoo import scoring
from visim_jax.metrics import human  # noqa: E402


def ours(sim, feats, ref, p0, p1, judge, n_boot):
  d0 = scoring.pair_distances(sim, feats, ref, feats, p0, 4096)
  d1 = scoring.pair_distances(sim, feats, ref, feats, p1, 4096)
  return human.twoafc_interval(d0, d1, judge, n_resamples=n_boot)


def numpy_path(feats, ref, p0, p1, judge, n_boot, seed=0):
  f = feats / np.linalg.norm(feats, axis=1, keepdims=True)
  d0 = 1.0 - np.einsum('ij,ij->i', f[ref], f[p0])
  d1 = 1.0 - np.einsum('ij,ij->i', f[ref], f[p1])
  s = (d0 < d1) * (1 - judge) + (d1 < d0) * judge + 0.5 * (d0 == d1)
  idx = np.random.default_rng(seed).integers(0, len(s), (n_boot, len(s)))
  boot = s[idx].mean(1)
  lo, hi = np.quantile(boot, [0.025, 0.975])
  return {'score': float(s.mean()), 'ci_low': float(lo), 'ci_high': float(hi), 'n': len(s)}


def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--n_triplets', type=int, default=20_000)
  p.add_argument('--dim', type=int, default=1280)
  p.add_argument('--n_boot', type=int, default=1000)
  p.add_argument('--alternations', type=int, default=3)
  p.add_argument('--small', action='store_true', help='2,000 triplets')
  a = p.parse_args()
  t = 2000 if a.small else a.n_triplets
  prec = precision.apply(torch_side=False)
  print(f'[leaderboard] {t:,} triplets x {a.dim}', file=sys.stderr, flush=True)
  rng = np.random.default_rng(0)
  n_img = int(1.5 * t)
  feats = rng.standard_normal((n_img, a.dim)).astype(np.float32)
  ref, p0, p1 = (rng.integers(0, n_img, t) for _ in range(3))
  judge = rng.choice([0.0, 0.2, 0.4, 0.6, 0.8, 1.0], t).astype(np.float32)
  sim = interface.Similarity('cosine:random', 'cosine', interface.cosine_distance, None, None, {})

  t0 = time.perf_counter()
  first = ours(sim, feats, ref, p0, p1, judge, a.n_boot)
  first_s = time.perf_counter() - t0
  times = {'ours': [], 'numpy': []}
  results = {}
  order = []
  for i in range(a.alternations):
    order += ['ours', 'numpy'] if i % 2 == 0 else ['numpy', 'ours']
  for name in order:
    t0 = time.perf_counter()
    results[name] = (ours(sim, feats, ref, p0, p1, judge, a.n_boot) if name == 'ours'
                     else numpy_path(feats, ref, p0, p1, judge, a.n_boot))
    times[name].append(time.perf_counter() - t0)
  assert abs(results['ours']['score'] - results['numpy']['score']) < 1e-6, results
  assert abs(results['ours']['ci_low'] - results['numpy']['ci_low']) < 0.02, results
  stats = {k: {'median_s': float(np.median(v)), 'min_s': float(min(v)), 'max_s': float(max(v)), 'runs': len(v),
               'triplets_per_s': t / float(np.median(v))} for k, v in times.items()}
  out = {'precision': prec, 'benchmark': 'leaderboard_cell_scoring', 'n_triplets': t, 'n_images': n_img, 'dim': a.dim,
         'n_boot': a.n_boot, 'order': order, 'ours_first_call_s': first_s, 'paths': stats,
         'speedup': stats['numpy']['median_s'] / stats['ours']['median_s'], 'score': first['score'],
         'device': jax.devices()[0].device_kind, 'cpus': os.cpu_count(), 'machine': platform.machine(),
         'load_average': os.getloadavg(), 'command': 'python benchmarks/leaderboard.py' + (' --small' * a.small)}
  print(json.dumps(out, indent=1))


if __name__ == '__main__':
  main()
