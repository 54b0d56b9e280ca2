r"""Where LPIPS's CPU time goes: the trunk convolutions alone (XLA's CPU convs vs torch's oneDNN), same shapes.

  python benchmarks/lpips_convs.py --net=alex --size=64 --n=64            # both sides on their default threads
  ONE_THREAD=1 XLA_FLAGS='--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1' \
      python benchmarks/lpips_convs.py --net=vgg --size=64 --n=16         # one core each: fair on a contended box

Times, interleaved (order reversed every round, median over --reps after one warm-up call each), in ms:
  ours      cpu_kernels.jit(uint8 pair -> lpips.embed x 2 -> lpips.distance)  (what benchmarks/lpips.py times)
  ours_cat  the same with both images of a pair as one 2N batch through the trunk (one conv call of 2N)
  torch     the lpips package's forward (its trunk twice + normalise / diff / lin)
  trunk     ours: the five tapped maps of 2N images (lpips.trunk_maps), torch: lpips.pretrained_networks' net(2N)
XLA_FLAGS is read as usual, so CPU flags can be compared (e.g. --xla_cpu_use_onednn=true
--xla_cpu_experimental_onednn_fusion_type=individual_convolution). Prints one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]  # lpips.py here shadows the package
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, 'tests'))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from visim_jax.core import cpu_kernels  # noqa: E402


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument('--net', default='alex')
  ap.add_argument('--size', type=int, default=64)
  ap.add_argument('--n', type=int, default=64, help='pairs (the trunk sees 2n images)')
  ap.add_argument('--reps', type=int, default=5)
  a = ap.parse_args(argv)
  import torch
  if os.environ.get('ONE_THREAD'):
    torch.set_num_threads(1)
  import torch_init
  from visim_jax.models import lpips
  from visim_jax.backbones import weights as weights_lib
  net, n = a.net, a.n
  m = lpips.load_lpips(net)
  ref = torch_init.lpips_reference(torch_init.import_lpips_package(), net,
                                   weights_lib.default_location(lpips.BACKBONE[net]) + '.safetensors')
  rng = np.random.default_rng(0)
  u0, u1 = (rng.integers(0, 256, (n, a.size, a.size, 3), dtype=np.uint8) for _ in range(2))
  sep = cpu_kernels.jit(lambda p, x, y: lpips.distance(p, lpips.embed(p, x.astype(jnp.float32) / 255.),
                                                lpips.embed(p, y.astype(jnp.float32) / 255.)))

  def cat(p, x, y):
    f = lpips.embed(p, jnp.concatenate([x, y]).astype(jnp.float32) / 255.)
    return lpips.distance(p, tuple(g[:n] for g in f), tuple(g[n:] for g in f))

  cat = cpu_kernels.jit(cat)
  trunk = cpu_kernels.jit(lambda t, x: lpips.trunk_maps(net, m.arch, t, x))
  xs = jnp.asarray(rng.standard_normal((2 * n, a.size, a.size, 3)), jnp.float32)
  t0, t1 = (torch.from_numpy(u.transpose(0, 3, 1, 2).astype(np.float32) / 127.5 - 1) for u in (u0, u1))
  tx = torch.cat([t0, t1])

  def torch_full():
    with torch.no_grad():
      return ref(t0, t1).numpy().ravel()

  def torch_trunk():
    with torch.no_grad():
      return ref.net(tx)

  fns = {'ours': lambda: np.asarray(sep(m, u0, u1)), 'ours_cat': lambda: np.asarray(cat(m, u0, u1)),
         'torch': torch_full, 'ours_trunk': lambda: jax.block_until_ready(trunk(m.params['trunk'], xs)),
         'torch_trunk': torch_trunk}
  diff = {'ours_vs_cat': float(np.abs(fns['ours']() - fns['ours_cat']()).max()),
          'ours_vs_torch': float(np.abs(fns['ours']() - torch_full()).max())}
  for f in fns.values():
    f()
  times = {k: [] for k in fns}
  for r in range(a.reps):
    for k in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
      t = time.perf_counter()
      fns[k]()
      times[k].append(time.perf_counter() - t)
  out = {'benchmark': 'lpips_convs', 'net': net, 'size': a.size, 'pairs': n,
         'ms_median': {k: round(float(np.median(v)) * 1e3, 1) for k, v in times.items()},
         'ms_min_max': {k: [round(min(v) * 1e3, 1), round(max(v) * 1e3, 1)] for k, v in times.items()},
         'max_abs_diff': diff, 'torch_threads': torch.get_num_threads(), 'xla_flags': os.environ.get('XLA_FLAGS', ''),
         'load_average': [round(x, 2) for x in os.getloadavg()], 'jax': jax.__version__, 'torch': torch.__version__}
  print(json.dumps(out))
  return out


if __name__ == '__main__':
  main()
