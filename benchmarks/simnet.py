r"""All-pairs SimNet scoring: split first layer + tiles (+ streaming top-k) vs naive concatenation, pairs/s.

  python benchmarks/simnet.py                      # sizes by backend: GPU/TPU preset, or the CPU preset on CPU
  python benchmarks/simnet.py --preset=gpu         # issue sizes: architecture B, 512-d, 2,048 x 65,536 pairs
  python benchmarks/simnet.py --preset=cpu --arch=A --queries=64 --database=2048

Methods, on the same random weights and vectors, in one run:
  split      simnet.score_matrix: h1 = relu(x_i W1a + x_j W1b + b1) per tile, never forming [x_i, x_j]
  topk       simnet.top_k: the same, streaming a running top-k over database tiles (no Q x D matrix kept)
  naive      simnet.score_matrix_naive: builds [x_i, x_j] for every pair of a tile and applies the MLP
             (the batched-concatenation code one writes without the split), jitted, same tiles
  reference  (--reference) the PyTorch MLP a user writes on the same pairs: per block of q_tile queries, every
             concatenated pair [x_i, x_j] through nn.Sequential under inference_mode; timed interleaved with
             split float32 (benchmarks/interleaved.py: max(3, repeats) alternations, median, spread) -> `rows`;
             its products have q_tile x database rows: --d_tile=<database> gives ours the same (at 8 x 128 on the
             2-core box, d_tile 64 instead of 128 made our 4096 x 4096 layer's products 28% slower)
Each jitted method is compiled (timed apart) and then run --repeats times; the median wall time gives pairs/s.
Results agree to a printed max |difference| (bfloat16 runs compare against float32 split scores).
Prints one JSON object (devices, sizes, compile and run times, pairs/s, speed-ups).
Goal (issue): >= 1e7 pairs/s for architecture B on an H100 (paper: 1.25 ms per pair on a GTX 1080).

  python benchmarks/simnet.py --rmac                 # R-MAC extraction, images/s: ours vs PyTorch, same weights
  python benchmarks/simnet.py --rmac --rmac_images=64 --rmac_size=1024x768 --rmac_batch=8   # the paper's size (GPU)

--rmac times VGG16 conv5_3 + R-MAC (3 levels, PCA-whitening, 512-d) on random uint8 images of one shape (one
bucket): ours (rmac.make_regions_fn jitted, then rmac.aggregate) against a PyTorch VGG16 + R-MAC written here with
the same random weights, the same region grid and the same whitening; prints images/s of both and the max
|difference| of the descriptors. CPU preset: 4 images of 256x192, batch 2 (full-width VGG16, random weights).
"""
from __future__ import annotations

import argparse
import json
import platform
import time

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import interleaved  # noqa: E402
import precision  # noqa: E402
from visim_jax.core import cpu_kernels  # noqa: E402
from visim_jax.models import simnet  # noqa: E402

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


def torch_mlp(params, q, d, q_tile):
  """The PyTorch MLP a user writes on the same pairs: for each block of q_tile queries, the concatenated
  [x_i, x_j] of every (query, database) pair through nn.Sequential (Linear/ReLU), under inference_mode.
  Returns (run() -> (Q, D) scores, library)."""
  import torch
  dev = 'cuda' if torch.cuda.is_available() else 'cpu'
  names = sorted(params)
  layers = []
  for i, n in enumerate(names):
    w, b = np.array(params[n]['w'], np.float32), np.array(params[n]['b'], np.float32)
    lin = torch.nn.Linear(w.shape[0], w.shape[1])
    lin.weight.data, lin.bias.data = torch.from_numpy(w.T.copy()), torch.from_numpy(b)
    layers += [lin] + ([torch.nn.ReLU()] if i < len(names) - 1 else [])
  net = torch.nn.Sequential(*layers).to(dev).eval()
  tq, td = torch.from_numpy(q).to(dev), torch.from_numpy(d).to(dev)

  def run():
    with torch.inference_mode():
      out = []
      for i in range(0, len(tq), q_tile):
        qb = tq[i:i + q_tile]
        pairs = torch.cat([qb[:, None].expand(-1, len(td), -1), td[None].expand(len(qb), -1, -1)], dim=-1)
        out.append(net(pairs.reshape(-1, pairs.shape[-1])).view(len(qb), len(td)))
      s = torch.cat(out)
      if dev == 'cuda':
        torch.cuda.synchronize()
      return s.cpu().numpy()
  return run, f'torch {torch.__version__} ({dev}, {torch.get_num_threads()} threads)'


RMAC_PRESETS = {'cpu': dict(images=4, size='256x192', batch=2), 'gpu': dict(images=64, size='1024x768', batch=8)}


def torch_rmac_reference(variables, white, images, grid, batch):
  """PyTorch VGG16 conv part (weights copied from the Flax variables) + R-MAC on the same grid and whitening:
  (descriptors, seconds, library)."""
  import torch
  import torch.nn.functional as F
  from visim_jax.backbones import vgg
  from visim_jax.data.preprocess import IMAGENET_MEAN, IMAGENET_STD
  dev = 'cuda' if torch.cuda.is_available() else 'cpu'
  layers, idx = [], iter(vgg.CONV_INDICES)
  for block in vgg.BLOCKS:
    for width in block:
      p = variables['params'][f'features_{next(idx)}']
      conv = torch.nn.Conv2d(p['kernel'].shape[2], width, 3, padding=1)
      conv.weight.data = torch.from_numpy(np.ascontiguousarray(np.transpose(np.asarray(p['kernel']), (3, 2, 0, 1))))
      conv.bias.data = torch.from_numpy(np.asarray(p['bias']).copy())
      layers += [conv, torch.nn.ReLU(inplace=True)]
    layers.append(torch.nn.MaxPool2d(2, 2))
  net = torch.nn.Sequential(*layers[:-1]).to(dev).eval()                  # up to relu5_3
  mean = torch.tensor(IMAGENET_MEAN, device=dev).view(1, 3, 1, 1)
  std = torch.tensor(IMAGENET_STD, device=dev).view(1, 3, 1, 1)
  wm, wc, ws = (torch.from_numpy(np.asarray(a).copy()).to(dev) for a in white)

  def run():
    out = []
    with torch.no_grad():
      for i in range(0, len(images), batch):
        x = torch.from_numpy(images[i:i + batch]).to(dev).permute(0, 3, 1, 2).float()
        fmap = net((x - mean) / std)
        regs = torch.stack([fmap[:, :, t:t + sz, l:l + sz].amax(dim=(2, 3)) for _, t, l, sz in grid], 1)
        regs = F.normalize(regs, dim=-1, eps=1e-12)
        regs = F.normalize(((regs - wm) @ wc) * ws, dim=-1, eps=1e-12)
        out.append(F.normalize(regs.sum(1), dim=-1, eps=1e-12))
      if dev == 'cuda':
        torch.cuda.synchronize()
    return torch.cat(out).cpu().numpy()
  run()  # warm-up
  t = time.perf_counter()
  d = run()
  return d, time.perf_counter() - t, f'torch {torch.__version__} ({dev}, {torch.get_num_threads()} threads)'


def rmac_benchmark(preset, args):
  from visim_jax.backbones import rmac
  from visim_jax.backbones import vgg
  cfg = dict(RMAC_PRESETS[preset])
  cfg.update({k: v for k, v in (('images', args.rmac_images), ('size', args.rmac_size), ('batch', args.rmac_batch))
              if v is not None})
  w, h = (int(v) for v in cfg['size'].split('x'))
  b = vgg.vgg16(random_init=0)
  rng = np.random.RandomState(0)
  images = rng.randint(0, 256, (cfg['images'], h, w, 3), np.uint8)
  fn = rmac.make_regions_fn(b, 'conv5_3', 3)
  white = rmac.learn_whitening(jnp.asarray(rng.rand(2048, 512).astype(np.float32)))
  variables = jax.device_put(b.variables)
  aggregate = cpu_kernels.jit(rmac.aggregate)

  def ours():  # host numpy images in, device descriptors out (numpy conversion outside the timing)
    return jnp.concatenate([aggregate(fn(variables, images[i:i + cfg['batch']]), white)
                            for i in range(0, len(images), cfg['batch'])])
  d, c, t = timed(ours, 1)
  d = np.asarray(d)
  fh, fw = h // 16, w // 16
  grid = rmac.region_grid(fh, fw)
  result = {'benchmark': 'simnet_rmac_extraction', 'preset': preset, 'devices': [str(x) for x in jax.devices()],
            'backend': jax.default_backend(), 'jax': jax.__version__,
            'sizes': {**cfg, 'conv5_3': [fh, fw, 512], 'regions': len(grid), 'weights': 'random (seed 0), full VGG16'},
            'ours': {'compile_plus_first_s': c, 'run_s': t, 'images_per_s': cfg['images'] / t}}
  try:
    dr, tr, lib = torch_rmac_reference(b.variables, white, images, grid, cfg['batch'])
    result['pytorch'] = {'library': lib, 'run_s': tr, 'images_per_s': cfg['images'] / tr,
                         'max_abs_diff_descriptors': float(np.abs(dr - d).max())}
    result['speedup_ours_vs_pytorch'] = tr / t
  except ImportError:
    result['pytorch'] = 'torch not installed'
  print(json.dumps(result, indent=2))


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument('--preset', choices=('auto', 'gpu', 'cpu'), default='auto')
  for name, typ in (('arch', str), ('dim', int), ('queries', int), ('database', int), ('q_tile', int),
                    ('d_tile', int), ('k', int), ('dtypes', str), ('repeats', int)):
    ap.add_argument(f'--{name}', type=typ, default=None)
  ap.add_argument('--skip_naive', action='store_true', help='do not run the naive concatenation (slow on CPU)')
  ap.add_argument('--reference', action='store_true', help='also time the PyTorch MLP on the same pairs')
  ap.add_argument('--rmac', action='store_true', help='time R-MAC extraction (VGG16) instead of all-pairs scoring')
  ap.add_argument('--rmac_images', type=int, default=None)
  ap.add_argument('--rmac_size', type=str, default=None, help='WIDTHxHEIGHT of the (one-bucket) images')
  ap.add_argument('--rmac_batch', type=int, default=None)
  args = ap.parse_args()
  preset = args.preset if args.preset != 'auto' else ('cpu' if jax.default_backend() == 'cpu' else 'gpu')
  prec = precision.apply(torch_side=args.reference)
  print(f'[simnet] preset {preset}, precision {prec["name"]}', file=sys.stderr, flush=True)
  if args.rmac:
    return rmac_benchmark(preset, args)
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

  result = {'precision': prec, 'benchmark': 'simnet_all_pairs', 'preset': preset, 'devices': [str(x) for x in jax.devices()],
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
  if args.reference:   # ours (split, float32) and the PyTorch MLP, interleaved on every pair
    run_ref, lib = torch_mlp(params, q, d, cfg['q_tile'])
    ours_fn = lambda: np.asarray(simnet.score_matrix(params, qj, dj, compute_dtype='float32', **tiles))
    times = interleaved.interleaved({'ours': ours_fn, 'reference': run_ref}, max(3, cfg['repeats']))
    stats = interleaved.compare(times['ours'], times['reference'], work=n_pairs, unit='pairs')
    result['methods']['reference_pytorch_mlp'] = {'library': lib, **stats,
                                                  'max_abs_diff_vs_split_f32': float(np.abs(run_ref() - base).max())}
    result['rows'] = [interleaved.row(f'SimNet all-pairs scores, arch. {cfg["arch"]}, {cfg["queries"]} x '
                                      f'{cfg["database"]} pairs of {cfg["dim"]}-d', stats, 'ours (split first layer)',
                                      'PyTorch MLP on concatenated pairs', 'pairs')]
    # the roofline: each side's own FLOPs (ours: the first layer once per image, the rest per pair; the reference:
    # every layer per concatenated pair) against this box's SGEMM rate at the per-pair layers' shape
    rest = 2 * sum(a * b for a, b in zip(hidden, (*hidden[1:], 1)))
    ours_flops = (cfg['queries'] + cfg['database']) * 2 * cfg['dim'] * hidden[0] + n_pairs * rest
    sg = interleaved.sgemm_gflops(min(n_pairs, 4096), hidden[0], hidden[1] if len(hidden) > 1 else 1)
    pct = {'ours': interleaved.roofline_percent(ours_flops, stats['ours_s'], sg['best']),
           'ours_of_xla_dot': interleaved.roofline_percent(ours_flops, stats['ours_s'], sg['xla']),
           'reference': interleaved.roofline_percent(n_pairs * flops_per_pair, stats['reference_s'], sg['best'])}
    result['sgemm_gflops'], result['roofline_percent'] = sg, pct
    result['rows'][0]['ours'] += (f" ({pct['ours']:.0f}% of the box's SGEMM rate, {sg['best']:.0f} GFLOP/s; "
                                  f"{pct['ours_of_xla_dot']:.0f}% of XLA's own, {sg['xla']:.0f})")
    result['rows'][0]['reference'] += f" ({pct['reference']:.0f}%)"
  m = result['methods']
  if 'naive_concat_float32' in m:
    result['split_f32_vs_naive_jitted'] = m['split_float32']['pairs_per_s'] / m['naive_concat_float32']['pairs_per_s']
  best = max(v['pairs_per_s'] for k, v in m.items() if k.startswith(('split', 'topk')))
  result['goal'] = {'pairs_per_s': 1e7, 'architecture': 'B', 'device': 'H100', 'best_here': best,
                    'paper_gtx1080_pairs_per_s': 1 / 1.25e-3}
  print(json.dumps(result, indent=2))


if __name__ == '__main__':
  main()
