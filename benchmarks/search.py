r"""Look-alike search: our jitted blocked exact top-k (database sharded over the local devices) vs NumPy.

  python benchmarks/search.py                               # CPU-sized: 100k x 256 index, 128 queries
  python benchmarks/search.py --preset=gpu                  # 4M x 1024 index (adapted dim), 1,024 queries
  python benchmarks/search.py --n=1000000 --dim=1024 --queries=512 --index_dtype=bfloat16

Ours: visim_jax.search (build_index + search: each device scans its shard with visim_jax.core.ops.running_topk, the
package's one running top-k, then the shard candidates are merged). Reference: what a user writes with NumPy: normalise, one matmul per query chunk, np.argpartition + argsort
of the top k (float32, all CPU threads), the normalisation of the database done once outside the timing as
ours is (build_index). Both sides answer every query, timed interleaved (benchmarks/interleaved.py: one warm-up
each, --repeats alternations, median, spread); the same top-k sets are reported. Our number excludes
compilation (reported apart) and the one-off index upload. When `faiss` is installed (`pip install faiss-cpu`),
a second row compares ours with its exact flat inner-product index (faiss.IndexFlatIP over the same unit vectors,
all CPU threads; what a user reaches for), timed the same way; when PyTorch is installed, a third row compares
with a PyTorch matmul + torch.topk per 256-query chunk on its GPU when it has one (on a GPU the fair reference:
NumPy runs on the host), else on the CPU. Prints one JSON object.
"""
from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

import interleaved  # noqa: E402
import precision  # noqa: E402
from visim_jax import search  # noqa: E402

PRESETS = {'cpu': dict(n=100_000, dim=256, queries=128), 'gpu': dict(n=4_000_000, dim=1024, queries=1024)}
_PRESET = flags.DEFINE_enum('preset', 'cpu', list(PRESETS), 'Sizes: cpu (small) or gpu (millions of images).')
_N = flags.DEFINE_integer('n', 0, 'Index size (0: the preset).')
_DIM = flags.DEFINE_integer('dim', 0, 'Vector dimension (0: the preset).')
_Q = flags.DEFINE_integer('queries', 0, 'Queries (0: the preset).')
_K = flags.DEFINE_integer('k', 10, 'Look-alikes per query.')
_BLOCK = flags.DEFINE_integer('block', 0, 'Database rows per index block on each device (0: build_index\'s default).')
_QBLOCK = flags.DEFINE_integer('query_block', 256, 'Queries per device call.')
_DTYPE = flags.DEFINE_enum('index_dtype', 'float32', ['float32', 'bfloat16'], 'Stored index dtype.')
_REPEATS = flags.DEFINE_integer('repeats', 3, 'Interleaved alternations (ours, NumPy, NumPy, ours, ...).')


def numpy_topk(db_n: np.ndarray, q_n: np.ndarray, k: int, chunk: int = 256) -> np.ndarray:
  out = np.empty((len(q_n), k), np.int64)
  for s in range(0, len(q_n), chunk):
    sc = q_n[s:s + chunk] @ db_n.T
    part = np.argpartition(-sc, k - 1, axis=1)[:, :k]
    order = np.argsort(-np.take_along_axis(sc, part, 1), axis=1, kind='stable')
    out[s:s + chunk] = np.take_along_axis(part, order, 1)
  return out


def main(_):
  p = dict(PRESETS[_PRESET.value])
  p.update({k: v for k, v in (('n', _N.value), ('dim', _DIM.value), ('queries', _Q.value)) if v})
  n, dim, nq, k = p['n'], p['dim'], p['queries'], _K.value
  rng = np.random.default_rng(0)
  # vectors with some structure (clusters), generated in chunks to bound host memory
  centres = rng.standard_normal((256, dim), dtype=np.float32)
  db = np.empty((n, dim), np.float32)
  for s in range(0, n, 1 << 18):
    e = min(n, s + (1 << 18))
    db[s:e] = centres[rng.integers(0, 256, e - s)] + rng.standard_normal((e - s, dim), dtype=np.float32)
  q = centres[rng.integers(0, 256, nq)] + rng.standard_normal((nq, dim), dtype=np.float32)
  prec = precision.apply(torch_side=False)
  print(f'[search] {p}', file=sys.stderr, flush=True)
  result = {'precision': prec, 'devices': [str(d) for d in jax.local_devices()], 'device_kind': jax.devices()[0].device_kind,
            'n_index': n, 'dim': dim, 'queries': nq, 'k': k, 'index_dtype': _DTYPE.value, 'cpu_count': os.cpu_count()}

  t0 = time.perf_counter()
  index = search.build_index(db, dtype=_DTYPE.value, **({'block': _BLOCK.value} if _BLOCK.value else {}))
  jax.block_until_ready(index.vectors)
  result['index_build_s'] = time.perf_counter() - t0
  result['block'] = index.block
  result['scan_rows_per_step'] = index.scan(min(nq, _QBLOCK.value))
  t0 = time.perf_counter()
  search.search(index, q[:min(nq, _QBLOCK.value)], k, query_block=_QBLOCK.value)  # compile
  result['ours_compile_s'] = time.perf_counter() - t0
  db_n = db / np.linalg.norm(db, axis=1, keepdims=True)
  q_n = q / np.linalg.norm(q, axis=1, keepdims=True)
  got = {}

  def ours_fn():
    got['ours'] = search.search(index, q, k, query_block=_QBLOCK.value)[1]

  def ref_fn():
    got['ref'] = numpy_topk(db_n, q_n, k)
  times = interleaved.interleaved({'ours': ours_fn, 'reference': ref_fn}, _REPEATS.value)
  stats = interleaved.compare(times['ours'], times['reference'], work=nq, unit='queries')
  result.update(stats)
  result['reference'] = f'NumPy {np.__version__}: matmul per 256-query chunk + argpartition + argsort (float32)'
  ours, ref = got['ours'], got['ref']
  result['same_top1_fraction'] = float((ref[:, 0] == ours[:, 0]).mean())
  result['same_topk_sets_fraction'] = float(np.mean([set(a) == set(b) for a, b in zip(ref, ours)]))
  capability = f'look-alike search, {nq} queries x {n:,} x {dim}, top-{k}'
  result['rows'] = [interleaved.row(capability, stats, 'ours (blocked scan)', 'NumPy matmul + argpartition',
                                    'queries')]
  # the roofline: both sides are one (queries x dim) x (dim x n) product plus a top-k
  flops = 2.0 * nq * n * dim
  on_cpu = jax.default_backend() == 'cpu'   # a GPU's rate is the one of the row's whole product
  sg = (interleaved.sgemm_gflops(min(nq, _QBLOCK.value), dim, min(n, 20000)) if on_cpu else
        interleaved.sgemm_gflops(nq, dim, n))
  result['sgemm_gflops'] = sg
  result['roofline_percent'] = {'ours': interleaved.roofline_percent(flops, stats['ours_s'], sg['best']),
                                'reference': interleaved.roofline_percent(flops, stats['reference_s'], sg['best'])}
  r = result['roofline_percent']
  where = "the box's" if on_cpu else f"the device's ({sg['backend']})"
  result['rows'][0]['ours'] += f" ({r['ours']:.0f}% of {where} SGEMM rate, {sg['best']:.0f} GFLOP/s)"
  result['rows'][0]['reference'] += f" ({r['reference']:.0f}%)" if on_cpu else ' (on the host CPU)'
  try:
    import faiss  # pylint: disable=g-import-not-at-top
  except ImportError:
    result['faiss'] = 'not installed (pip install faiss-cpu)'
  else:
    flat = faiss.IndexFlatIP(dim)
    flat.add(np.ascontiguousarray(db_n))

    def faiss_fn():
      got['faiss'] = flat.search(np.ascontiguousarray(q_n), k)[1]
    times = interleaved.interleaved({'ours': ours_fn, 'reference': faiss_fn}, _REPEATS.value)
    fstats = interleaved.compare(times['ours'], times['reference'], work=nq, unit='queries')
    result['faiss'] = {**fstats, 'version': faiss.__version__, 'threads': faiss.omp_get_max_threads(),
                       'same_topk_sets_fraction': float(np.mean([set(a) == set(b)
                                                                 for a, b in zip(got['faiss'], got['ours'])]))}
    result['rows'].append(interleaved.row(capability, fstats, 'ours (blocked scan)',
                                          f'FAISS {faiss.__version__} IndexFlatIP (exact)', 'queries'))
  torch_row(result, capability, ours_fn, got, db_n, q_n, k)
  print(json.dumps(result, indent=1))


def torch_row(result, capability, ours_fn, got, db_n, q_n, k, chunk: int = 256):
  """A third row when PyTorch is installed: what a PyTorch user writes, on its GPU when it has one (the fair
  reference there: NumPy runs on the host): the database on the device once (as our index), then per chunk of
  queries one matmul and torch.topk."""
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    result['torch'] = 'not installed'
    return
  dev = 'cuda' if torch.cuda.is_available() else 'cpu'
  tdb = torch.from_numpy(np.ascontiguousarray(db_n)).to(dev)

  def torch_fn():
    out = []
    for s in range(0, len(q_n), chunk):
      tq = torch.from_numpy(np.ascontiguousarray(q_n[s:s + chunk])).to(dev)
      out.append(torch.topk(tq @ tdb.T, k, dim=1).indices.cpu().numpy())
    got['torch'] = np.concatenate(out)
  times = interleaved.interleaved({'ours': ours_fn, 'reference': torch_fn}, _REPEATS.value)
  tstats = interleaved.compare(times['ours'], times['reference'], work=len(q_n), unit='queries')
  result['torch'] = {**tstats, 'version': torch.__version__, 'device': dev, 'threads': torch.get_num_threads(),
                     'same_topk_sets_fraction': float(np.mean([set(a) == set(b)
                                                               for a, b in zip(got['torch'], got['ours'])]))}
  result['rows'].append(interleaved.row(capability, tstats, 'ours (blocked scan)',
                                        f'PyTorch {torch.__version__} matmul + topk ({dev})', 'queries'))


if __name__ == '__main__':
  from visim_jax.core import errors  # pylint: disable=g-import-not-at-top
  app.run(main, flags_parser=errors.flags_parser)   # one-line flag errors; --help exits 0
