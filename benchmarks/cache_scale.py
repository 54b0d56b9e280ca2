r"""Host memory of histogram and search runs over ImageNet-size features read from a memory-mapped cache.

  python benchmarks/cache_scale.py                          # 1,281,167 x 768 float32 (3.9 GB) in --dir
  python benchmarks/cache_scale.py --samples=200000 --before   # also the previous code paths (several copies)

Writes synthetic L2-normalised features (1,000 classes) block by block to an .npy in --dir, then runs each case in
its own process on `np.load(path, mmap_mode='r')` and reports that process's peak anonymous resident memory
(RssAnon sampled every 20 ms: the memory-mapped file's pages are page cache, reclaimable, and not counted) in
bytes and in copies of the feature array:
  search       search.index.build_index(memmap) + search.index.search of --queries queries, top 10
  histograms   device_rows.put_rows(memmap) (the features on the device, here the host) + metrics.histograms
               evaluate, random pairs (--n_pairs intra + inter per class, no replicates)
  exact_input  what exact_histograms holds before its blocked pass: put_rows of the memmap rows
--before adds the previous paths: build_index as it was (np.asarray, isfinite, a padded copy, l2_normalize in JAX,
jnp.asarray) and `jnp.asarray(np.load(path))` + evaluate. Prints one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)


def rss_anon() -> int:
  with open('/proc/self/status') as f:
    for line in f:
      if line.startswith('RssAnon:'):
        return int(line.split()[1]) * 1024
  return 0


class Peak:
  """Peak RssAnon of this process, sampled on a thread."""

  def __init__(self):
    self.peak, self._stop = rss_anon(), False
    self._t = threading.Thread(target=self._run, daemon=True)
    self._t.start()

  def _run(self):
    while not self._stop:
      self.peak = max(self.peak, rss_anon())
      time.sleep(0.02)

  def stop(self) -> int:
    self._stop = True
    self._t.join()
    return max(self.peak, rss_anon())


def write_features(path: str, n: int, dim: int, classes: int, block: int = 65536):
  import numpy as np
  m = np.lib.format.open_memmap(path + '.tmp.npy', 'w+', np.float32, (n, dim))
  rng = np.random.default_rng(0)
  centres = rng.standard_normal((classes, dim)).astype(np.float32)
  labels = rng.integers(0, classes, n)
  for s in range(0, n, block):
    x = centres[labels[s:s + block]] + 2 * rng.standard_normal((min(block, n - s), dim), dtype=np.float32)
    m[s:s + block] = x / np.linalg.norm(x, axis=1, keepdims=True)
  m.flush()
  del m
  os.replace(path + '.tmp.npy', path)
  np.save(path[:-4] + '-labels.npy', labels)


def case(name: str, path: str, queries: int, n_pairs: int) -> dict:
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import NamedSharding, PartitionSpec as P
  from visim_jax.core import device_rows, ops
  from visim_jax.metrics import histograms as H
  from visim_jax.search import index as index_lib
  x = np.load(path, mmap_mode='r')
  labels = np.load(path[:-4] + '-labels.npy')
  q = np.array(x[:queries])
  base = rss_anon()
  peak = Peak()
  t = time.perf_counter()
  if name == 'search':
    idx = index_lib.build_index(x)
    index_lib.search(idx, q, 10)
  elif name == 'search_before':  # build_index at 526d7af
    v = np.asarray(x, np.float32)
    assert np.isfinite(v).all()
    n = len(v)
    xp = np.zeros((n, v.shape[1]), np.float32)
    xp[:n] = ops.l2_normalize(v)
    jax.block_until_ready(jnp.asarray(xp, jnp.float32))
  elif name in ('histograms', 'histograms_before'):
    if name == 'histograms':
      mesh = jax.sharding.Mesh(np.array(jax.devices()), ('i',))
      xd = device_rows.put_rows(x, len(x), NamedSharding(mesh, P()))
    else:
      xd = jnp.asarray(np.load(path))
    H.evaluate(xd, labels, int(labels.max()) + 1,
               H.Options(mode='random', n_intra=n_pairs, n_inter=n_pairs, se_replicates=0), estimator='random')
  elif name == 'exact_input':
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ('i',))
    jax.block_until_ready(device_rows.put_rows(x, len(x), NamedSharding(mesh, P()), rows=np.arange(len(x))))
  seconds = time.perf_counter() - t
  top = peak.stop()
  return {'case': name, 'seconds': round(seconds, 2), 'peak_rss_anon_bytes': top,
          'rss_anon_before_bytes': base, 'array_bytes': int(x.nbytes),
          'copies': round((top - base) / x.nbytes, 2)}


def main():
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--samples', type=int, default=1_281_167)
  ap.add_argument('--dim', type=int, default=768)
  ap.add_argument('--classes', type=int, default=1000)
  ap.add_argument('--queries', type=int, default=64)
  ap.add_argument('--n_pairs', type=int, default=1000)
  ap.add_argument('--dir', default='/tmp/visim_cache_scale')
  ap.add_argument('--cases', default='search,histograms,exact_input')
  ap.add_argument('--before', action='store_true', help='also the previous code paths')
  ap.add_argument('--_case', default='', help=argparse.SUPPRESS)
  ap.add_argument('--_path', default='', help=argparse.SUPPRESS)
  a = ap.parse_args()
  if a._case:
    print(json.dumps(case(a._case, a._path, a.queries, a.n_pairs)))
    return
  import interleaved  # pylint: disable=g-import-not-at-top
  os.makedirs(a.dir, exist_ok=True)
  path = os.path.join(a.dir, f'features-{a.samples}x{a.dim}.npy')
  if not os.path.exists(path):
    print(f'[cache_scale] writing {path}', file=sys.stderr, flush=True)
    write_features(path, a.samples, a.dim, a.classes)
  cases = [c for c in a.cases.split(',') if c] + (['search_before', 'histograms_before'] if a.before else [])
  out = {'benchmark': 'cache_scale', 'samples': a.samples, 'dim': a.dim, 'classes': a.classes, 'path': path,
         'cases': []}
  for c in cases:
    print(f'[cache_scale] {c} (load {interleaved.load_average()})', file=sys.stderr, flush=True)
    p = subprocess.run([sys.executable, __file__, f'--_case={c}', f'--_path={path}', f'--queries={a.queries}',
                        f'--n_pairs={a.n_pairs}'], capture_output=True, text=True,
                       env={**os.environ, 'PYTHONPATH': ROOT})
    r = json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else {
        'case': c, 'status': f'failed (exit {p.returncode})', 'stderr_tail': p.stderr[-1500:]}
    r['load_average'] = interleaved.load_average()
    out['cases'].append(r)
    print(json.dumps(r), file=sys.stderr, flush=True)
  print(json.dumps(out, indent=1))


if __name__ == '__main__':
  main()
