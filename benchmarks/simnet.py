r"""All-pairs SimNet scoring: split first layer + tiles (+ streaming top-k) vs naive concatenation, pairs/s.

  python benchmarks/simnet.py                      # sizes by backend: GPU/TPU preset, or the CPU preset on CPU
  python benchmarks/simnet.py --preset=gpu         # issue sizes: architecture B, 512-d, 2,048 x 65,536 pairs
  python benchmarks/simnet.py --preset=cpu --arch=A --queries=64 --database=2048

Methods, on the same random weights and vectors, in one run:
  split      simnet.score_matrix: h1 = relu(x_i W1a + x_j W1b + b1) per tile, never forming [x_i, x_j]
  topk       simnet.top_k: the same, streaming a running top-k over database tiles (no Q x D matrix kept)
  naive      simnet.score_matrix_naive: builds [x_i, x_j] for every pair of a tile and applies the MLP
             (the batched-concatenation code one writes without the split), jitted, same tiles
  reference  (optional, --reference) the same concatenation MLP in PyTorch if importable, else NumPy, on at most
             --ref_pairs pairs
Each jitted method is compiled (timed apart) and then run --repeats times; the median wall time gives pairs/s.
Results agree to a printed max |difference| (bfloat16 runs compare against float32 split scores).
Prints one JSON object (devices, sizes, compile and run times, pairs/s, speed-ups).
Goal (issue): >= 1e7 pairs/s for architecture B on an H100 (paper: 1.25 ms per pair on a GTX 1080).
"""
from __future__ import annotations

import argparse
import json
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np

from visim_jax import simnet

PRESETS = {
    'gpu': dict(arch='B', dim=512, queries=2048, database=65536, q_tile=512, d_tile=512, k=100,
                dtypes='float32,bfloat16', repeats=3),
    'cpu': dict(arch='B', dim=512, queries=32, database=256, q_tile=32, d_tile=64, k=10, dtypes='float32',
                repeats=1),
}


def _block(x):
  return jax.tree.map(lambda a: a.block_until_ready(), x)


def timed(fn, repeats):
  t = time.perf_counter()
  out = _block(fn())
  compile_and_first = time.perf_counter() - t
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    out = _block(fn())
    times.append(time.perf_counter() - t)
  return out, compile_and_first, float(np.median(times))


def reference_scores(params, q, d, max_pairs):
  """Naive concatenation MLP in PyTorch (or NumPy) on the first rows of q: (scores, seconds, pairs, library)."""
  n_q = max(1, min(len(q), max_pairs // len(d)))
  q = q[:n_q]
  names = sorted(params)
  ws = [(np.array(params[n]['w'], np.float32), np.array(params[n]['b'], np.float32)) for n in names]  # writable
  try:
    import torch
    dev = 'cuda' if torch.cuda.is_available() else 'cpu'
    tw = [(torch.from_numpy(w).to(dev), torch.from_numpy(b).to(dev)) for w, b in ws]
    tq, td = torch.from_numpy(q).to(dev), torch.from_numpy(d).to(dev)

    def run():
      with torch.no_grad():
        out = []
        for row in tq:  # one query against the database per batch: [x_i, x_j] materialised
          h = torch.cat([row.expand(len(td), -1), td], dim=1)
          for w, b in tw[:-1]:
            h = torch.relu(h @ w + b)
          out.append((h @ tw[-1][0] + tw[-1][1])[:, 0])
        s = torch.stack(out)
        if dev == 'cuda':
          torch.cuda.synchronize()
        return s.cpu().numpy()
    lib = f'torch {torch.__version__} ({dev})'
  except ImportError:
    def run():
      out = []
      for row in q:
        h = np.concatenate([np.broadcast_to(row, d.shape), d], axis=1)
        for w, b in ws[:-1]:
          h = np.maximum(h @ w + b, 0)
        out.append((h @ ws[-1][0] + ws[-1][1])[:, 0])
      return np.stack(out)
    lib = f'numpy {np.__version__}'
  run()  # warm-up
  t = time.perf_counter()
  s = run()
  return s, time.perf_counter() - t, n_q * len(d), lib


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument('--preset', choices=('auto', 'gpu', 'cpu'), default='auto')
  for name, typ in (('arch', str), ('dim', int), ('queries', int), ('database', int), ('q_tile', int),
                    ('d_tile', int), ('k', int), ('dtypes', str), ('repeats', int)):
    ap.add_argument(f'--{name}', type=typ, default=None)
  ap.add_argument('--skip_naive', action='store_true', help='do not run the naive concatenation (slow on CPU)')
  ap.add_argument('--reference', action='store_true', help='also time a PyTorch / NumPy concatenation MLP')
  ap.add_argument('--ref_pairs', type=int, default=16384)
  args = ap.parse_args()
  preset = args.preset if args.preset != 'auto' else ('cpu' if jax.default_backend() == 'cpu' else 'gpu')
  cfg = dict(PRESETS[preset])
  cfg.update({k: v for k, v in vars(args).items() if k in cfg and v is not None})

  hidden = simnet.hidden_sizes(cfg['arch'] if ',' not in cfg['arch'] else [int(h) for h in cfg['arch'].split(',')])
  params = simnet.init_params(jax.random.PRNGKey(0), cfg['dim'], hidden)
  rng = np.random.RandomState(0)
  q = rng.randn(cfg['queries'], cfg['dim']).astype(np.float32)
  d = rng.randn(cfg['database'], cfg['dim']).astype(np.float32)
  q /= np.linalg.norm(q, axis=1, keepdims=True)
  d /= np.linalg.norm(d, axis=1, keepdims=True)
  qj, dj = jnp.asarray(q), jnp.asarray(d)
  n_pairs = cfg['queries'] * cfg['database']
  tiles = dict(q_tile=cfg['q_tile'], d_tile=cfg['d_tile'])
  flops_per_pair = 2 * sum(a * b for a, b in zip((2 * cfg['dim'], *hidden), (*hidden, 1)))

  result = {'benchmark': 'simnet_all_pairs', 'preset': preset, 'devices': [str(x) for x in jax.devices()],
            'device_kind': jax.devices()[0].device_kind, 'backend': jax.default_backend(),
            'host': platform.processor() or platform.machine(), 'jax': jax.__version__,
            'sizes': {**cfg, 'hidden': list(hidden), 'pairs': n_pairs, 'num_params': simnet.num_params(params),
                      'naive_flops_per_pair': flops_per_pair},
            'methods': {}}
  base = None
  for dtype in cfg['dtypes'].split(','):
    s, c, t = timed(lambda: simnet.score_matrix(params, qj, dj, compute_dtype=dtype, **tiles), cfg['repeats'])
    s = np.asarray(s)
    if base is None:
      base = s
    result['methods'][f'split_{dtype}'] = {'compile_plus_first_s': c, 'run_s': t, 'pairs_per_s': n_pairs / t,
                                           'tflops_equiv': n_pairs * flops_per_pair / t / 1e12,
                                           'max_abs_diff_vs_split_f32': float(np.abs(s - base).max())}
    (ts, ti), c, t = timed(lambda: simnet.top_k(params, qj, dj, k=cfg['k'], compute_dtype=dtype, **tiles),
                           cfg['repeats'])
    want = -np.sort(-base, axis=1)[:, :cfg['k']]
    result['methods'][f'topk_{dtype}'] = {'compile_plus_first_s': c, 'run_s': t, 'pairs_per_s': n_pairs / t,
                                          'k': cfg['k'],
                                          'max_abs_diff_topk_scores': float(np.abs(np.asarray(ts) - want).max())}
  if not args.skip_naive:
    s, c, t = timed(lambda: simnet.score_matrix_naive(params, qj, dj, **tiles), cfg['repeats'])
    result['methods']['naive_concat_float32'] = {
        'compile_plus_first_s': c, 'run_s': t, 'pairs_per_s': n_pairs / t,
        'max_abs_diff_vs_split_f32': float(np.abs(np.asarray(s) - base).max())}
  if args.reference:
    s, t, n, lib = reference_scores(params, q, d, args.ref_pairs)
    result['methods']['reference_concat'] = {'library': lib, 'pairs': n, 'run_s': t, 'pairs_per_s': n / t,
                                             'max_abs_diff_vs_split_f32': float(np.abs(s - base[:len(s)]).max())}
  m = result['methods']
  if 'naive_concat_float32' in m:
    result['speedup_split_f32_vs_naive'] = m['split_float32']['pairs_per_s'] / m['naive_concat_float32']['pairs_per_s']
  if 'reference_concat' in m and 'split_float32' in m:
    result['speedup_split_f32_vs_reference'] = m['split_float32']['pairs_per_s'] / m['reference_concat']['pairs_per_s']
  best = max(v['pairs_per_s'] for k, v in m.items() if k.startswith(('split', 'topk')))
  result['goal'] = {'pairs_per_s': 1e7, 'architecture': 'B', 'device': 'H100', 'best_here': best,
                    'paper_gtx1080_pairs_per_s': 1 / 1.25e-3}
  print(json.dumps(result, indent=2))


if __name__ == '__main__':
  main()
