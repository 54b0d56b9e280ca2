r"""Histogram metrics (overlap, aSTD): our jitted estimators vs the NumPy per-class loops a user would write.

  python benchmarks/histograms.py                                   # issue sizes: 1.28M x 768, 1,000 classes
  python benchmarks/histograms.py --samples=100000 --dim=256 --classes=100 --n_pairs=2000
  python benchmarks/histograms.py --mode=exact --samples=20000 --dim=256 --classes=100   # the blocked exact pass

Synthetic features (class centres + noise, drawn on the device), the paper's target standardisation, then for
every class `n_pairs` random intra and `n_pairs` random inter pairs -> 100-bin histograms -> overlap, maximal
overlap, aSTD. Ours: visim_jax.metrics.histograms (vmapped per-class segment sums in a chunked lax.scan).
Reference: a Python loop over classes with NumPy (random pairs, row gathers, dot products, np.histogram) on
every class. Both timed interleaved (benchmarks/interleaved.py: --repeats alternations, median, spread). Prints
JSON: devices, sizes, compile time apart from the steady-state time, both overlaps, `rows` for run_all.

--mode=exact times the exhaustive estimator instead (visim_jax.metrics.blocked_histograms: every unordered pair,
tile x tile blocks of the similarity matrix, segment sums on the device, blocks split over all devices) against
a NumPy reference that computes the same exact per-class counts (per class: a (n_y, N) matmul, np.histogram of
the intra upper triangle and of the inter block) on every class, interleaved; the counts are compared bin for
bin (`max_abs_count_diff`: bin-edge rounding only).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import interleaved  # noqa: E402
import precision  # noqa: E402
from visim_jax.metrics import blocked_histograms as B  # noqa: E402
from visim_jax.metrics import histograms as H  # noqa: E402
from visim_jax.metrics import knn  # noqa: E402
from visim_jax.metrics import pair_sampling as S  # noqa: E402
from visim_jax.metrics.bins import bin_centers  # noqa: E402


def synthetic(samples, dim, classes, seed, dtype):
  k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
  labels = jax.random.randint(k1, (samples,), 0, classes)
  centres = jax.random.normal(k2, (classes, dim))
  noise = jax.random.normal(k3, (samples, dim)) * 2.0
  return (centres[labels] + noise).astype(dtype), labels


def ours(x_raw, index, num_classes, n_pairs, chunk_elems, seed):
  x = H.prepare(x_raw, 'target')
  rs = S.per_round(len(index.counts), x.shape[1], n_pairs, chunk_elems)
  key = jax.random.key(seed)
  h_in = S.random_pair_histograms(x, index, jax.random.fold_in(key, 0), n_pairs=n_pairs, kind='intra', round_size=rs)
  h_out = S.random_pair_histograms(x, index, jax.random.fold_in(key, 1), n_pairs=n_pairs, kind='inter', round_size=rs)
  valid = jnp.arange(h_in.shape[0]) < num_classes
  return H.histogram_metrics(h_in, h_out, valid)


def reference(x, labels, classes, n_pairs, seed):
  """The per-class NumPy loop (standardise, L2, then for each class: random pairs, dots, np.histogram)."""
  rng = np.random.default_rng(seed)
  x = (x - x.mean(0)) / np.maximum(x.std(0), 1e-6)
  x /= np.linalg.norm(x, axis=1, keepdims=True)
  overlaps, means = [], []
  for c in classes:
    members = np.flatnonzero(labels == c)
    others = np.flatnonzero(labels != c)
    a = rng.choice(members, n_pairs)
    b = rng.choice(members, n_pairs)
    keep = a != b
    s_in = np.einsum('nd,nd->n', x[a[keep]], x[b[keep]])
    s_out = np.einsum('nd,nd->n', x[rng.choice(members, n_pairs)], x[rng.choice(others, n_pairs)])
    p_in = np.histogram(s_in, 100, (-1, 1))[0] / len(s_in)
    p_out = np.histogram(s_out, 100, (-1, 1))[0] / len(s_out)
    overlaps.append(np.minimum(p_in, p_out).sum())
    means.append(p_out @ bin_centers())
  return float(np.mean(overlaps)), float(np.std(means))


def exact_reference(x, labels, classes):
  """Exact per-class counts with NumPy: x is prepared (standardised, unit rows); every pair of each class."""
  h_in, h_out = [], []
  for c in classes:
    m = labels == c
    s = x[m] @ x.T  # (n_c, N)
    h_in.append(np.histogram(s[:, m][np.triu_indices(int(m.sum()), 1)], 100, (-1, 1))[0])
    h_out.append(np.histogram(s[:, ~m], 100, (-1, 1))[0])
  return np.stack(h_in), np.stack(h_out)


def run_exact(args, x, labels_np, out):
  xp = H.prepare(x, 'target')
  plan = B.make_plan(args.samples, args.dim, args.classes, tile=args.tile)
  out['exact_plan'] = {k: v for k, v in plan._asdict().items()}
  t = time.perf_counter()
  h = B.exact_histograms(xp, labels_np, args.classes, tile=args.tile)
  first = time.perf_counter() - t
  cls = np.arange(args.classes)
  xs = np.asarray(xp, np.float32)
  got = {}

  def ours_fn():
    got['h'] = jax.block_until_ready(B.exact_histograms(xp, labels_np, args.classes, tile=args.tile))

  def ref_fn():
    got['ref'] = exact_reference(xs, labels_np, cls)
  sides = {'ours': ours_fn} if args.no_reference else {'ours': ours_fn, 'reference': ref_fn}
  times = interleaved.interleaved(sides, args.repeats, warmup=False)
  h = got['h']
  steady = float(np.median(times['ours']))
  m = H.histogram_metrics(h[0][0], h[1][0], np.ones(args.classes, bool))
  out['ours_exact'] = {'steady_s': round(steady, 4), 'first_call_s': round(first, 4),
                       'compile_s_approx': round(max(first - steady, 0.0), 4),
                       'runs_s': [round(v, 4) for v in times['ours']],
                       'pairs_per_s': round(plan.pairs / steady), 'overlap': float(m['overlap']),
                       'astd_inter': float(m['astd_inter']), 'astd_intra': float(m['astd_intra'])}
  if not args.no_reference:
    r_in, r_out = got['ref']
    stats = interleaved.compare(times['ours'], times['reference'], work=plan.pairs, unit='pairs')
    out['numpy_exact_reference'] = {
        **stats, 'max_abs_count_diff': int(max(np.abs(h[0][0] - r_in).max(), np.abs(h[1][0] - r_out).max())),
        'total_count_diff': int(np.abs(h[0][0] - r_in).sum() + np.abs(h[1][0] - r_out).sum()),
        'pairs_compared': int(r_in.sum() + r_out.sum())}
    out['rows'] = [interleaved.row(f'histogram metrics, every pair: {args.samples:,} x {args.dim}, {args.classes} '
                                   'classes', stats, 'ours (blocked pass)', 'NumPy per-class matmul + histogram',
                                   'pairs')]


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument('--samples', type=int, default=1_281_167)
  ap.add_argument('--dim', type=int, default=768)
  ap.add_argument('--classes', type=int, default=1000)
  ap.add_argument('--n_pairs', type=int, default=10_000, help='random intra and inter pairs per class')
  ap.add_argument('--chunk_elems', type=int, default=0,
                  help='floats gathered per side per round (0: 2^19 on CPU, 2^26 on accelerators)')
  ap.add_argument('--dtype', default='float32', choices=('float32', 'bfloat16'), help='stored feature dtype')
  ap.add_argument('--repeats', type=int, default=3, help='interleaved alternations (ours, NumPy, NumPy, ours...)')
  ap.add_argument('--no_reference', action='store_true', help='skip the NumPy reference (it runs every class)')
  ap.add_argument('--knn_queries', type=int, default=0, help='also time leave-one-out kNN (k=10) for this many queries')
  ap.add_argument('--seed', type=int, default=0)
  ap.add_argument('--mode', default='random', choices=('random', 'exact'),
                  help='random: n_pairs per class (sampling); exact: every pair (blocked pass)')
  ap.add_argument('--tile', type=int, default=0, help='exact: block size (0: 256 on CPU, 1024 on accelerators)')
  args = ap.parse_args()
  prec = precision.apply(torch_side=False)
  print(f'[histograms] {args.samples:,} x {args.dim}, {args.classes} classes: synthetic features', file=sys.stderr,
        flush=True)

  out = {'benchmark': 'histograms', 'precision': prec, 'devices': [str(d) for d in jax.devices()],
         'device_kind': jax.devices()[0].device_kind, 'backend': jax.default_backend(),
         'sizes': {'samples': args.samples, 'dim': args.dim, 'classes': args.classes, 'n_pairs_per_class': args.n_pairs,
                   'pairs_total': 2 * args.classes * args.n_pairs, 'bins': 100, 'dtype': args.dtype,
                   'chunk_elems': args.chunk_elems or S.default_chunk_elems()}}
  x, labels = synthetic(args.samples, args.dim, args.classes, args.seed, jnp.dtype(args.dtype))
  jax.block_until_ready(x)
  labels_np = np.asarray(labels)
  if args.mode == 'exact':
    out['sizes'].update(mode='exact', pairs_total=args.samples * (args.samples - 1) // 2)
    run_exact(args, x, labels_np, out)
    print(json.dumps(out, indent=2))
    return

  t = time.perf_counter()
  index = S.group_by_class(labels_np, args.classes)
  out['grouping_host_s'] = round(time.perf_counter() - t, 4)
  index = S.ClassIndex(*(jnp.asarray(a) for a in index))

  t = time.perf_counter()
  m = ours(x, index, args.classes, args.n_pairs, args.chunk_elems, args.seed)
  jax.block_until_ready(m)
  first = time.perf_counter() - t
  xs = np.asarray(x, np.float32)
  cls = np.arange(args.classes)
  got = {}

  def ours_fn():
    got['m'] = jax.block_until_ready(ours(x, index, args.classes, args.n_pairs, args.chunk_elems, args.seed))

  def ref_fn():
    got['ref'] = reference(xs, labels_np, cls, args.n_pairs, args.seed)
  sides = {'ours': ours_fn} if args.no_reference else {'ours': ours_fn, 'reference': ref_fn}
  times = interleaved.interleaved(sides, args.repeats, warmup=False)
  m = got['m']
  steady = float(np.median(times['ours']))
  out['ours'] = {'steady_s': round(steady, 4), 'first_call_s': round(first, 4),
                 'compile_s_approx': round(max(first - steady, 0.0), 4), 'runs_s': [round(v, 4) for v in times['ours']],
                 'pairs_per_s': round(2 * args.classes * args.n_pairs / steady),
                 'overlap': float(m['overlap']), 'max_class_overlap': float(m['max_class_overlap']),
                 'astd_inter': float(m['astd_inter']), 'astd_intra': float(m['astd_intra'])}
  if not args.no_reference:
    stats = interleaved.compare(times['ours'], times['reference'], work=2 * args.classes * args.n_pairs, unit='pairs')
    out['numpy_reference'] = {**stats, 'overlap': got['ref'][0], 'ours_overlap': float(np.mean(np.asarray(m['class_overlap'])))}
    out['rows'] = [interleaved.row(f'histogram metrics, random pairs: {args.samples:,} x {args.dim}, {args.classes} '
                                   f'classes, {args.n_pairs:,} intra + inter pairs each', stats, 'ours (jitted)',
                                   'NumPy loop over classes', 'pairs')]

  if args.knn_queries:
    xp = H.prepare(x, 'target')
    t = time.perf_counter()
    acc, _ = knn.knn_accuracy(xp, labels_np, args.classes, 10, args.knn_queries, args.seed)
    out['knn'] = {'queries': args.knn_queries, 'k': 10, 'accuracy': acc,
                  'time_s_with_compile': round(time.perf_counter() - t, 3)}
  print(json.dumps(out, indent=2))


if __name__ == '__main__':
  main()
