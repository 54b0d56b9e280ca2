r"""2AFC evaluation throughput (triplets/s): our jitted path vs the NumPy code a user would otherwise write.

  python benchmarks/twoafc.py                 # GPU sizes: 100k images x 2048-D, 10M triplets
  python benchmarks/twoafc.py --small         # CPU sizes (< 2 min): 20k images x 512-D, 200k triplets

Paths timed in the same run, on the same random feature table and triples:
  jax_cosine      visim_jax.metrics.twoafc.cosine_scores: normalise the table once, gather, per-triple score
  jax_cs_models   visim_jax.triplets.predict_all: K context models (embed the table, cosine distances +
                  the antisymmetric ranking block)
  numpy_vector    the same cosine 2AFC in vectorised NumPy
  python_loop     a per-triple Python loop with np.dot (run on --loop_triplets triples, rate extrapolated)
Compile time is reported apart (first call minus a steady call). Prints one JSON object.
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
from visim_jax import triplets as cs
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
  p.add_argument('--repeats', type=int, default=3)
  p.add_argument('--small', action='store_true', help='CPU sizes: 20k x 512-D, 200k triplets, 20k loop')
  p.add_argument('--seed', type=int, default=0)
  a = p.parse_args()
  if a.small:
    a.n_images, a.dim, a.n_triplets, a.loop_triplets = 20_000, 512, 200_000, 20_000

  rng = np.random.default_rng(a.seed)
  feats = rng.standard_normal((a.n_images, a.dim), dtype=np.float32)
  ref, ia, ib = (rng.integers(0, a.n_images, a.n_triplets, dtype=np.int32) for _ in range(3))
  lab = rng.random(a.n_triplets) < 0.5
  dev = [jnp.asarray(x) for x in (feats, ref, ia, ib, lab)]
  res = {'devices': [str(d) for d in jax.devices()], 'platform': jax.devices()[0].platform,
         'device_kind': jax.devices()[0].device_kind, 'sizes': {k: getattr(a, k) for k in (
             'n_images', 'dim', 'n_triplets', 'loop_triplets', 'models', 'embed_dim')}, 'paths': {}}

  acc = lambda: float(twoafc.cosine_scores(*dev).mean())   # float() waits for the device
  jax_acc, first, steady = _timeit(acc, a.repeats)
  res['paths']['jax_cosine'] = {'seconds': steady, 'compile_s': max(first - steady, 0.0),
                                'triplets_per_s': a.n_triplets / steady, 'accuracy': jax_acc}

  def numpy_vector():
    f = feats / np.linalg.norm(feats, axis=1, keepdims=True)
    r = f[ref]
    d = np.einsum('ij,ij->i', r, f[ia]) - np.einsum('ij,ij->i', r, f[ib])
    return float(np.mean(0.5 * (1 + np.sign(d) * np.where(lab, 1.0, -1.0))))
  np_acc, _, steady = _timeit(numpy_vector, max(1, a.repeats - 2))
  res['paths']['numpy_vector'] = {'seconds': steady, 'triplets_per_s': a.n_triplets / steady, 'accuracy': np_acc}

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
    pred = jax.jit(cs.predict_all)
    run = lambda: jax.block_until_ready(pred(params, *dev[:4]))
    _, first, steady = _timeit(run, a.repeats)
    res['paths']['jax_cs_models'] = {'seconds': steady, 'compile_s': max(first - steady, 0.0),
                                     'model_triplets_per_s': a.models * a.n_triplets / steady,
                                     'triplets_per_s_all_models': a.n_triplets / steady}

  base = res['paths']
  res['speedup_jax_vs_numpy_vector'] = base['numpy_vector']['seconds'] / base['jax_cosine']['seconds']
  res['speedup_jax_vs_python_loop'] = base['jax_cosine']['triplets_per_s'] / base['python_loop']['triplets_per_s']
  res['same_accuracy'] = bool(abs(jax_acc - np_acc) < 1e-4 and abs(loop_acc - sub) < 1e-4)
  print(json.dumps(res, indent=2))


if __name__ == '__main__':
  main()
