r"""One PGD step on 2AFC items through LPIPS-alex: ours (metrics/attacks.py, jitted, vmapped) vs the same attack in PyTorch.

  python benchmarks/attack.py                                   # 8 items at 64 px, Linf 8/255
  python benchmarks/attack.py --size=224 --items=16 --alternations=5 --out=attack.json
  python benchmarks/attack.py --size=224 --items=64 --alternations=3   # run_all.py --gpu's entry (torch on cuda)

Both sides run the same attack (docs/robustness.md) on the same items (benchmarks/lpips.py's `pairs_of`: photo crops
as references, img0 a light and img1 a heavy distortion of them; target img0) from the same start (no random start):
the gradient of the cross-entropy of (-d(ref, img0), -d(ref, img1)) at the reference, one signed step of --step,
the projection onto the Linf ball of --eps and [0, 1], then the forward + backward at the new point (which tells
whether the answer flipped): two forward + backward passes of LPIPS through 2 pairs per item.
  ours   attacks.make(lpips distance, AttackOptions(method='pgd', steps=1, random_start=False, step_size=--step))
  torch  richzhang's lpips.LPIPS('alex', version='0.1') with the same weights (tests/torch_init.py), fed 2 x - 1,
         torch.autograd.grad, the same projection, torch's default threads (--torch_threads: that many; on the
         shared 2-core box at load ~7 its two OpenMP threads ran LPIPS ~20x slower than one thread did); on CUDA
         where torch has it (synchronised before the clock stops), the float32 precision of both sides set and
         recorded by benchmarks/precision.py ($VISIM_BENCH_PRECISION, default fp32)
Timed by benchmarks/interleaved.py (one warm-up call each, then alternating rounds); the images agree where the
gradients' signs do (`same_pixels`: the fraction of pixels of x_adv equal to 1e-6, and `same_success`). One JSON
object with `rows` for benchmarks/run_all.py (and --out). Needs `pip install --no-deps lpips==0.1.4`.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]   # not to shadow the lpips package
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, 'tests'))  # torch_init: the parity tests' reference

import jax  # noqa: E402
import numpy as np  # noqa: E402


def _local(name):
  import importlib.util  # pylint: disable=g-import-not-at-top
  spec = importlib.util.spec_from_file_location(f'_bench_{name}', os.path.join(HERE, f'{name}.py'))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def items(size: int, n: int, seed: int = 0):
  """(ref, img0, img1) float [0, 1] NHWC: photo crops, a light and a heavy Gaussian distortion of each."""
  x0, _ = _local('lpips').pairs_of(size, n, seed)
  ref = x0[:n].astype(np.float32) / 255.0
  rng = np.random.default_rng(seed)
  light = np.clip(ref + rng.normal(0, 0.03, ref.shape), 0, 1).astype(np.float32)
  heavy = np.clip(ref + rng.normal(0, 0.15, ref.shape), 0, 1).astype(np.float32)
  return ref, light, heavy


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument('--size', type=int, default=64)
  ap.add_argument('--items', type=int, default=8)
  ap.add_argument('--eps', type=float, default=8 / 255)
  ap.add_argument('--step', type=float, default=8 / 255)
  ap.add_argument('--alternations', type=int, default=3)
  ap.add_argument('--min_time', type=float, default=0.5)
  ap.add_argument('--torch_threads', type=int, default=0,
                  help="0: torch's default; on a loaded box (load > cores) its OpenMP threads can spin ~20x slower")
  ap.add_argument('--out', default=None)
  a = ap.parse_args(argv)

  import torch
  if a.torch_threads:
    torch.set_num_threads(a.torch_threads)
  prec = _local('precision').apply()
  tdev = 'cuda' if torch.cuda.is_available() else 'cpu'
  print(f'[attack] {a.items} items at {a.size} px, torch on {tdev}, precision {prec["name"]}', file=sys.stderr,
        flush=True)
  import torch.nn.functional as F
  import torch_init
  from visim_jax.backbones import weights as weights_lib
  from visim_jax.metrics import attacks
  from visim_jax.models import lpips
  interleaved = _local('interleaved')
  ref_lpips = torch_init.import_lpips_package()
  if ref_lpips is None:
    raise SystemExit('benchmarks/attack.py: needs the lpips package: pip install --no-deps lpips==0.1.4')
  model = lpips.load_lpips('alex')
  trunk_file = weights_lib.default_location(lpips.BACKBONE[model.net]) + '.safetensors'
  tref = torch_init.lpips_reference(ref_lpips, model.net, trunk_file).to(tdev)

  ref, img0, img1 = items(a.size, a.items)
  target = np.zeros(a.items)
  dist = lambda p, x0, x1: lpips.distance(p, lpips.embed(p, x0), lpips.embed(p, x1))   # noqa: E731
  opts = attacks.AttackOptions('linf', a.eps, steps=1, method='pgd', random_start=False, step_size=a.step)
  ours_fn = attacks.make(dist, opts)
  key = jax.random.PRNGKey(0)

  def run_ours():
    return jax.block_until_ready(ours_fn(model.params, ref, img0, img1, target, key))

  tx, ta, tb = (torch.from_numpy(v.transpose(0, 3, 1, 2).copy()).to(tdev) for v in (ref, img0, img1))
  ty = torch.zeros(a.items, dtype=torch.long, device=tdev)

  def t_logits_grad(z):
    z = z.clone().requires_grad_(True)
    logits = torch.stack([-tref(2 * z - 1, 2 * ta - 1).flatten(), -tref(2 * z - 1, 2 * tb - 1).flatten()], 1)
    loss = F.cross_entropy(logits, ty, reduction='sum')
    return logits.detach(), torch.autograd.grad(loss, z)[0]

  def run_torch():
    _, g = t_logits_grad(tx)
    z = torch.clamp(torch.min(torch.max(tx + a.step * torch.sign(g), tx - a.eps), tx + a.eps), 0.0, 1.0)
    logits, _ = t_logits_grad(z)
    wrong = logits.argmax(1) != ty
    out = torch.where(wrong[:, None, None, None], z, tx), wrong
    if tdev == 'cuda':
      torch.cuda.synchronize()
    return out

  t = time.perf_counter()
  x_ours, s_ours = run_ours()
  compile_s = time.perf_counter() - t
  x_t, s_t = run_torch()
  x_t, s_t = x_t.cpu().numpy().transpose(0, 2, 3, 1), s_t.cpu()
  times = interleaved.interleaved({'ours': run_ours, 'torch': run_torch}, a.alternations, min_time=a.min_time)
  stats = interleaved.compare(times['ours'], times['torch'], work=a.items, unit='items')
  out = {'benchmark': 'attack', 'command': 'python benchmarks/attack.py ' + ' '.join(argv or sys.argv[1:]),
         'machine': {'jax_device': jax.devices()[0].device_kind, 'cpus': os.cpu_count(), 'torch': torch.__version__,
                     'torch_threads': torch.get_num_threads(), 'jax': jax.__version__,
                     'platform': platform.platform()}, 'precision': prec, 'torch_device': tdev,
         'size': a.size, 'items': a.items, 'eps': a.eps, 'step': a.step, 'ours_compile_and_first_s': compile_s,
         'same_pixels': float(np.mean(np.abs(np.asarray(x_ours) - x_t) <= 1e-6)),
         'same_success': float(np.mean(np.asarray(s_ours) == s_t.numpy())),
         'flipped': {'ours': int(np.sum(s_ours)), 'torch': int(s_t.sum())}, **stats}
  out['rows'] = [interleaved.row(f'one PGD step (2 forward + backward) on 2AFC items through LPIPS-alex, {a.size} px, '
                                 f'{a.items} items, Linf', stats, 'ours (jitted, vmapped)', 'PyTorch lpips', 'items')]
  return interleaved.emit(out, a.out)


if __name__ == '__main__':
  main()
