r"""XLA's CPU convolutions, YNNPACK (jaxlib's default) vs Eigen (ours) vs PyTorch; and the box's SGEMM rate.

  python benchmarks/cpu_kernels.py            # VGG16's 3x3 convolutions at 64 px (batch 32) and five SGEMM shapes
  python benchmarks/cpu_kernels.py --small    # batch 8, fewer rounds (seconds)
  python benchmarks/cpu_kernels.py --convs=alex224 --batch=10   # AlexNet's five convolutions at 224 px (LPIPS-alex)

Why visim_jax/core/cpu_kernels.py compiles our programs with Eigen convolutions: the same jax.jit of one
convolution (NHWC / HWIO), compiled twice in one process (XLA's default options, and ours), against
torch.nn.functional.conv2d on the same arrays (NCHW contiguous; torch's threads = the box's cores), interleaved
(benchmarks/interleaved.py), median of the alternations; and one matmul (ours = XLA's default program: dots keep
YNNPACK) against torch.matmul, the SGEMM rate other rows' rooflines refer to. Outputs are checked equal
(relative 1e-4). Prints one JSON object: GFLOP/s per shape and side, and ours / XLA default, ours / torch; its
`rows` (run_all's table) give, per kind, the median over the shapes of ours / torch and ours / XLA's default, the
spread being the smallest and largest shape's ratio: the box's conv and SGEMM rates measured in the same run.
"""
from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from interleaved import emit, interleaved, load_average  # noqa: E402
from visim_jax.core import cpu_kernels  # noqa: E402

# (H, Cin, Cout, kernel, stride, padding) of VGG16's 3x3 layers at 64 px: one per block, the first one's wide map
# included; and of torchvision AlexNet's five convolutions at 224 px (LPIPS-alex's trunk)
CONV_SETS = {
    'vgg64': ('VGG16 3x3 convolutions at 64 px',
              ((64, 64, 64, 3, 1, 1), (32, 128, 128, 3, 1, 1), (16, 256, 256, 3, 1, 1), (8, 512, 512, 3, 1, 1),
               (4, 512, 512, 3, 1, 1))),
    'alex224': ('AlexNet convolutions at 224 px',
                ((224, 3, 64, 11, 4, 2), (27, 64, 192, 5, 1, 2), (13, 192, 384, 3, 1, 1), (13, 384, 256, 3, 1, 1),
                 (13, 256, 256, 3, 1, 1))),
}
GEMMS = ((2048, 2048, 2048), (8192, 4608, 512), (1536, 768, 1024), (64, 256, 20000), (1024, 512, 512))


def _conv_fn(stride: int, pad: int):
  return lambda x, w: jax.lax.conv_general_dilated(x, w, (stride, stride), [(pad, pad)] * 2,
                                                   dimension_numbers=('NHWC', 'HWIO', 'NHWC'))


def _case(kind: str, shape: tuple, batch: int, alternations: int) -> dict:
  import torch  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  if kind == 'conv':
    h, c, o, k, st, pad = shape
    a = rng.standard_normal((batch, h, h, c), np.float32)
    b = rng.standard_normal((k, k, c, o), np.float32) * 0.05
    ho = (h + 2 * pad - k) // st + 1
    fn, flops = _conv_fn(st, pad), 2 * k * k * c * o * batch * ho * ho
    ta, tb = torch.from_numpy(a.transpose(0, 3, 1, 2).copy()), torch.from_numpy(b.transpose(3, 2, 0, 1).copy())
    ref_fn = lambda: torch.nn.functional.conv2d(ta, tb, stride=st, padding=pad)  # noqa: E731
    to_ours = lambda t: t.permute(0, 2, 3, 1).numpy()  # noqa: E731
  else:
    m, k, n = shape
    a, b = rng.standard_normal((m, k), np.float32), rng.standard_normal((k, n), np.float32)
    fn, flops = jnp.matmul, 2 * m * k * n
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    ref_fn = lambda: torch.matmul(ta, tb)  # noqa: E731
    to_ours = lambda t: t.numpy()  # noqa: E731
  ja, jb = jnp.asarray(a), jnp.asarray(b)
  ours = cpu_kernels.jit(fn)
  xla = jax.jit(fn) if kind == 'conv' else ours      # dots compile as XLA's default
  with torch.no_grad():
    want = to_ours(ref_fn())
  scale = float(np.abs(want).max())
  for f in (ours, xla):
    got = np.asarray(f(ja, jb))
    if float(np.abs(got - want).max()) > 1e-4 * scale:
      raise SystemExit(f'cpu_kernels: {kind} {shape}: outputs differ from torch')
  sides = {'ours': lambda: jax.block_until_ready(ours(ja, jb)), 'torch': ref_fn}
  if kind == 'conv':
    sides['xla_default'] = lambda: jax.block_until_ready(xla(ja, jb))
  with torch.no_grad():   # each round: back-to-back calls for >= 0.1 s (interleaved's min_time; ~10 ms a call here)
    times = interleaved(sides, alternations=alternations, min_time=0.1)
  rate = {k: round(flops / float(np.median(v)) / 1e9, 1) for k, v in times.items()}
  out = {'kind': kind, 'shape': list(shape), 'batch': batch if kind == 'conv' else None, 'gflops': rate,
         'ours_vs_torch': round(rate['ours'] / rate['torch'], 3)}
  if kind == 'conv':
    out['ours_vs_xla_default'] = round(rate['ours'] / rate['xla_default'], 3)
  return out


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument('--small', action='store_true', help='batch 8 and 3 alternations (seconds)')
  ap.add_argument('--batch', type=int, default=32, help='images per convolution call')
  ap.add_argument('--alternations', type=int, default=5)
  ap.add_argument('--convs', choices=sorted(CONV_SETS), default='vgg64', help='which convolutions')
  ap.add_argument('--json', default='', help='also write the JSON here')
  a = ap.parse_args(argv)
  import torch  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(os.cpu_count() or 1)
  batch, alts = (8, 3) if a.small else (a.batch, a.alternations)
  conv_what, convs = CONV_SETS[a.convs]
  cases = [_case('conv', s, batch, alts) for s in convs] + [_case('gemm', s, batch, alts) for s in GEMMS]
  cmd = 'python benchmarks/cpu_kernels.py' + ' '.join([''] + list(argv if argv is not None else sys.argv[1:]))
  rows = []
  torch_name = f'PyTorch {torch.__version__.split("+")[0]}'
  for kind, what, ours_name, refs in (
      ('conv', f'{conv_what}, batch {batch}, {len(convs)} shapes', 'ours (Eigen)',
       (('torch', f'{torch_name} conv2d'), ('xla_default', "XLA's default (YNNPACK)"))),
      ('gemm', f'float32 matmul (the SGEMM roofline), {len(GEMMS)} shapes', "ours (XLA's default dot)",
       (('torch', f'{torch_name} matmul'),))):
    cs = [c for c in cases if c['kind'] == kind]
    span = lambda k: f"{min(c['gflops'][k] for c in cs):.0f}-{max(c['gflops'][k] for c in cs):.0f} GFLOP/s"  # noqa
    for ref, name in refs:
      r = [c['gflops']['ours'] / c['gflops'][ref] for c in cs]
      rows.append({'capability': f"XLA CPU kernels: {what}", 'ours': f'{ours_name}: {span("ours")}',
                   'reference': f'{name}: {span(ref)}', 'ratio': float(np.median(r)),
                   'spread': [float(min(r)), float(max(r))], 'load_average': load_average()})
  out = {'benchmark': 'cpu_kernels', 'options': cpu_kernels.options(), 'cases': cases, 'rows': rows,
         'median_ours_vs_xla_default': float(np.median([c['ours_vs_xla_default'] for c in cases
                                                        if c['kind'] == 'conv'])),
         'median_ours_vs_torch': float(np.median([c['ours_vs_torch'] for c in cases])),
         'torch_threads': torch.get_num_threads(), 'load_average': load_average(), 'jax': jax.__version__,
         'torch': torch.__version__, 'command': cmd}
  return emit(out, a.json or None)


if __name__ == '__main__':
  main()
