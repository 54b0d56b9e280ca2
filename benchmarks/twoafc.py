r"""2AFC evaluation throughput (triplets/s): our jitted path vs the NumPy code a user would otherwise write.

  python benchmarks/twoafc.py                 # GPU sizes: 100k images x 2048-D, 10M triplets
  python benchmarks/twoafc.py --small         # CPU sizes (< 2 min): 20k images x 512-D, 200k triplets, sweep 10k

Paths timed in the same run, on the same random feature table and triples:
  jax_cosine      visim_jax.metrics.twoafc.cosine_scores: normalise the table once, gather, per-triple score;
                  headline against numpy_vector, the same cosine 2AFC in vectorised NumPy (what a user writes),
                  timed interleaved with it (benchmarks/interleaved.py: --repeats alternations, median, spread)
  python_loop     a per-triple Python loop with np.dot (--loop_triplets triples; a detail, not a headline)
  jax_cs_models   visim_jax.models.context.predict_all: K context models (embed the table, cosine distances +
                  the antisymmetric ranking block); throughput only (no reference)
  jax_subset_sweep visim_jax.models.ensembles.subset_sweep: majority / PCA / MLP ensembles of all 2^K - 1 subsets of K
                  models in one program, interleaved with a NumPy loop over the subsets vectorised over the
                  triplets (same accuracies checked)
Compile time is reported apart (first call minus a steady call). Prints one JSON object; its `rows` are the
lines of benchmarks/run_all.py's table.
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

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import interleaved  # noqa: E402
import precision  # noqa: E402
from visim_jax.core import cpu_kernels  # noqa: E402
from visim_jax.models import ensembles, context as cs
from visim_jax.metrics import twoafc


def _timeit(fn, repeats):
  t = time.perf_counter()
  out = fn()
  first = time.perf_counter() - t
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    out = fn()
    times.append(time.perf_counter() - t)
  return out, first, float(np.median(times))


def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--n_images', type=int, default=100_000)
  p.add_argument('--dim', type=int, default=2048)
  p.add_argument('--n_triplets', type=int, default=10_000_000)
  p.add_argument('--loop_triplets', type=int, default=50_000)
  p.add_argument('--models', type=int, default=8, help='context models for jax_cs_models (0: skip)')
  p.add_argument('--embed_dim', type=int, default=256)
  p.add_argument('--sweep_triplets', type=int, default=100_000, help='triplets of the subset sweep (0: skip)')
  p.add_argument('--repeats', type=int, default=3)
  p.add_argument('--small', action='store_true', help='CPU sizes: 20k x 512-D, 200k triplets, 20k loop')
  p.add_argument('--seed', type=int, default=0)
  a = p.parse_args()
  if a.small:
    a.n_images, a.dim, a.n_triplets, a.loop_triplets, a.sweep_triplets = 20_000, 512, 200_000, 20_000, 10_000
  prec = precision.apply(torch_side=False)
  print(f'[twoafc] {a.n_triplets:,} triplets of {a.n_images:,} x {a.dim}', file=sys.stderr, flush=True)

  rng = np.random.default_rng(a.seed)
  feats = rng.standard_normal((a.n_images, a.dim), dtype=np.float32)
  ref, ia, ib = (rng.integers(0, a.n_images, a.n_triplets, dtype=np.int32) for _ in range(3))
  lab = rng.random(a.n_triplets) < 0.5
  dev = [jnp.asarray(x) for x in (feats, ref, ia, ib, lab)]
  res = {'precision': prec, 'devices': [str(d) for d in jax.devices()], 'platform': jax.devices()[0].platform,
         'device_kind': jax.devices()[0].device_kind, 'sizes': {k: getattr(a, k) for k in (
             'n_images', 'dim', 'n_triplets', 'loop_triplets', 'models', 'embed_dim')}, 'paths': {}}

  acc = lambda: float(twoafc.cosine_scores(*dev).mean())   # float() waits for the device
  jax_acc, first, steady = _timeit(acc, 1)

  def numpy_vector():
    f = feats / np.linalg.norm(feats, axis=1, keepdims=True)
    r = f[ref]
    d = np.einsum('ij,ij->i', r, f[ia]) - np.einsum('ij,ij->i', r, f[ib])
    return float(np.mean(0.5 * (1 + np.sign(d) * np.where(lab, 1.0, -1.0))))
  np_acc = numpy_vector()
  stats = interleaved.compare(*interleaved.interleaved({'o': acc, 'r': numpy_vector}, a.repeats, False).values(),
                              work=a.n_triplets, unit='triplets')
  res['paths']['jax_cosine'] = {'seconds': stats['ours_s'], 'compile_s': max(first - stats['ours_s'], 0.0),
                                'triplets_per_s': stats['ours_triplets_per_s'], 'accuracy': jax_acc}
  res['paths']['numpy_vector'] = {'seconds': stats['reference_s'], 'triplets_per_s': stats['reference_triplets_per_s'],
                                  'accuracy': np_acc}
  res['rows'] = [interleaved.row(f'2AFC cosine scores, {a.n_triplets:,} triplets of {a.n_images:,} x {a.dim}',
                                 stats, 'ours (jitted)', 'vectorised NumPy', 'triplets')]
  res['cosine_vs_numpy_vector'] = stats

  n = min(a.loop_triplets, a.n_triplets)
  def loop():
    s = 0.0
    for r, x, y, l in zip(ref[:n], ia[:n], ib[:n], lab[:n]):
      fr, fa, fb = feats[r], feats[x], feats[y]
      nr = np.sqrt(np.dot(fr, fr))
      sa = np.dot(fr, fa) / (nr * np.sqrt(np.dot(fa, fa)))
      sb = np.dot(fr, fb) / (nr * np.sqrt(np.dot(fb, fb)))
      s += 0.5 if sa == sb else float((sa > sb) == l)
    return s / n
  t = time.perf_counter()
  loop_acc = loop()
  sec = time.perf_counter() - t
  sub = float(twoafc.cosine_scores(dev[0], dev[1][:n], dev[2][:n], dev[3][:n], dev[4][:n]).mean())
  res['paths']['python_loop'] = {'seconds_for_loop_triplets': sec, 'triplets_per_s': n / sec,
                                 'accuracy_on_subset': loop_acc, 'jax_accuracy_on_subset': sub}

  if a.models > 0:
    hp = cs.Hparams(embed_dim=a.embed_dim, hidden=a.embed_dim)
    params = jax.vmap(lambda k: cs.init(k, a.dim, hp))(jax.random.split(jax.random.PRNGKey(0), a.models))
    pred = cpu_kernels.jit(cs.predict_all)
    run = lambda: jax.block_until_ready(pred(params, *dev[:4]))
    _, first, steady = _timeit(run, a.repeats)
    res['paths']['jax_cs_models'] = {'seconds': steady, 'compile_s': max(first - steady, 0.0),
                                     'model_triplets_per_s': a.models * a.n_triplets / steady,
                                     'triplets_per_s_all_models': a.n_triplets / steady}

  if a.sweep_triplets > 0:   # Fig. 8: every subset of K models, majority / PCA weights / MLP weights
    k, t, r = a.models or 8, a.sweep_triplets, max(1, a.sweep_triplets // 10)
    d_a, d_b = rng.random((k, t), dtype=np.float32), rng.random((k, t), dtype=np.float32)
    truth, groups = rng.random(t) < 0.5, np.sort(rng.integers(0, r, t)).astype(np.int32)
    cred, count = rng.random((k, r), dtype=np.float32), np.full(r, 3.0, np.float32)
    mlp_pred = rng.random((3, k, r), dtype=np.float32)
    masks = ensembles.subset_masks(k)
    args = [jnp.asarray(x) for x in (masks, d_a, d_b, truth, groups, cred, count, mlp_pred)]
    sweep = lambda: jax.block_until_ready(ensembles.subset_sweep(*args, 0.75))
    out, first, steady = _timeit(sweep, 1)

    def numpy_sweep():   # the loop over subsets a user would write, vectorised over triples
      res_np = {'majority': [], 'pca': [], 'mlp': []}
      sgn = np.where(truth, 1.0, -1.0)
      acc = lambda dec: float(np.mean(0.5 * (1 + dec * sgn)))
      for m in masks:
        idx = np.flatnonzero(m)
        res_np['majority'].append(acc(np.sign(np.sign(d_b[idx] - d_a[idx]).sum(0))))
        c = cred[idx]
        w = np.where(c > 0.75, c, 0.0)
        w = np.where(w.sum(0) == 0, np.eye(len(idx))[:, np.argmax(c, 0)], w)
        w = (w / w.sum(0))[:, groups]
        res_np['pca'].append(acc(np.sign((w * (d_b[idx] - d_a[idx])).sum(0))))
        res_np['mlp'].append([acc(np.sign(((p[idx] / p[idx].sum(0))[:, groups] * (d_b[idx] - d_a[idx])).sum(0)))
                              for p in mlp_pred])
      return res_np
    ref = numpy_sweep()
    sw = interleaved.compare(*interleaved.interleaved({'o': sweep, 'r': numpy_sweep}, a.repeats, False).values())
    res['rows'].append(interleaved.row(f'2AFC ensembles of every subset of {k} models, {t:,} triplets', sw,
                                       'ours (one program)', 'NumPy loop over subsets'))
    res['paths']['jax_subset_sweep'] = {'seconds': sw['ours_s'], 'compile_s': max(first - sw['ours_s'], 0.0),
                                        'subsets': int(len(masks)), 'triplets': t, 'numpy_loop_seconds': sw['reference_s'],
                                        'timing': sw,
                                        'same_accuracies': bool(all(np.allclose(np.asarray(out[x]), ref[x], atol=1e-6)
                                                                    for x in ref))}

  base = res['paths']
  res['python_loop_rate_vs_ours'] = base['python_loop']['triplets_per_s'] / base['jax_cosine']['triplets_per_s']
  res['same_accuracy'] = bool(abs(jax_acc - np_acc) < 1e-4 and abs(loop_acc - sub) < 1e-4)
  print(json.dumps(res, indent=2))


if __name__ == '__main__':
  main()
