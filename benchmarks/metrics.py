r"""Pairs/s of our classical and DISTS metrics (jitted JAX) against the PyTorch package a user would otherwise call.

  python benchmarks/metrics.py                          # psnr, ssim, ms_ssim, dists; CPU sizes
  python benchmarks/metrics.py --metrics=ssim,dists --size=256 --pairs=256 --batch=64 --alternations=5 --out=m.json

Same inputs on both sides: uint8 NHWC pairs of the packaged photos (benchmarks/lpips.py's `pairs_of`: random crops
vs another photo, a blur, a shift) at --size (MS-SSIM at max(--size, 161): it needs 161 px), in batches of --batch
pairs, put on each side's device before timing (ours: the uint8 arrays, turned into [0, 1] floats inside the timed
program; the reference: [0, 1] float tensors made before timing), scores brought back to the host:
  psnr     ours: models/classical.psnr            reference: piq.psnr(data_range=1, reduction='none') (piq 0.8.0)
  fsim, gmsd, ms_gmsd, vif_p, haarpsi, mdsi, vsi, srsim, dss, iw_ssim (--metrics=iqa: all ten)
           ours: models/iqa (piq's defaults)     reference: piq 0.8.0's function (reduction='none'); IW-SSIM at
           max(--size, 161); SR-SIM's values are checked one pair a call (piq normalises over its batch), timed in
           batches on both sides
  ssim     ours: models/classical.ssim            reference: pytorch_msssim.ssim(data_range=1, size_average=False)
  ms_ssim  ours: models/classical.ms_ssim         reference: pytorch_msssim.ms_ssim(...)  (pytorch-msssim 1.0.0)
  dists    ours: models/dists.dists (real weights) reference: DISTS_pytorch.DISTS_pt.DISTS with the same VGG16 conv
           weights and the package's alpha / beta (torchvision imported as the parity tests' stub)
Timed by benchmarks/interleaved.py (one warm-up call each, then A B / B A ... alternations, each timing as many
back-to-back runs as fill --min_time on the faster side, the same count on both: a 1 ms run timed alone after the
pause measured the thread pools' wake-up); the largest |difference|
of the scores is measured and must stay below each metric's tolerance (the values are checked equal). One JSON
object with `rows` for benchmarks/run_all.py (and --out).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, 'tests'))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from visim_jax.core import cpu_kernels  # noqa: E402

TOLERANCE = {'psnr': 1e-3, 'ssim': 1e-4, 'ms_ssim': 1e-4, 'dists': 1e-5}
# the ten IQA metrics of models/iqa against piq 0.8.0's functions (module, function); uint8 -> [0, 1] on both sides
PIQ_IQA = {'fsim': ('fsim', 'fsim'), 'gmsd': ('gmsd', 'gmsd'), 'ms_gmsd': ('gmsd', 'multi_scale_gmsd'),
           'vif_p': ('vif', 'vif_p'), 'haarpsi': ('haarpsi', 'haarpsi'), 'mdsi': ('mdsi', 'mdsi'),
           'vsi': ('vsi', 'vsi'), 'srsim': ('srsim', 'srsim'), 'dss': ('dss', 'dss'),
           'iw_ssim': ('iw_ssim', 'information_weighted_ssim')}
TOLERANCE.update({m: 1e-4 for m in PIQ_IQA})
MIN_SIDE = {'ms_ssim': 161, 'iw_ssim': 161}


def _local(name):
  import importlib.util  # pylint: disable=g-import-not-at-top
  spec = importlib.util.spec_from_file_location(f'_bench_{name}', os.path.join(HERE, f'{name}.py'))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def piq_fn(module: str = 'psnr', name: str = 'psnr'):
  """A piq function without piq/__init__ (it imports torchvision for other metrics)."""
  import importlib  # pylint: disable=g-import-not-at-top
  import importlib.util  # pylint: disable=g-import-not-at-top
  spec = importlib.util.find_spec('piq')
  if spec is None:
    raise SystemExit(f'benchmarks/metrics.py: {name} needs piq: pip install --no-deps piq==0.8.0')
  pkg = types.ModuleType('piq')
  pkg.__path__ = list(spec.submodule_search_locations)
  saved = sys.modules.get('piq')
  sys.modules['piq'] = pkg
  try:
    return getattr(importlib.import_module(f'piq.{module}'), name)
  finally:
    if saved is None:
      sys.modules.pop('piq', None)


def piq_psnr():
  return piq_fn('psnr', 'psnr')


def dists_reference(model, torch):
  """The authors' DISTS module with our VGG16 conv weights and the package's alpha / beta."""
  import torch_init  # pylint: disable=g-import-not-at-top
  from visim_jax.models import dists as D  # pylint: disable=g-import-not-at-top
  tv = torch_init.torchvision_stub()
  tv.transforms = types.ModuleType('torchvision.transforms')
  sys.modules.update({'torchvision': tv, 'torchvision.models': tv.models, 'torchvision.transforms': tv.transforms})
  from DISTS_pytorch import DISTS_pt  # pylint: disable=g-import-not-at-top
  ref = DISTS_pt.DISTS(load_weights=False)
  alpha, beta, _ = D.read_alpha_beta(D.package_weights())
  ref.alpha.data = torch.from_numpy(alpha.reshape(1, -1, 1, 1))
  ref.beta.data = torch.from_numpy(beta.reshape(1, -1, 1, 1))
  p = model.params['trunk']['params']
  for stage in (ref.stage1, ref.stage2, ref.stage3, ref.stage4, ref.stage5):
    for name, mod in stage._modules.items():
      if isinstance(mod, torch.nn.Conv2d):
        mod.weight.data = torch.from_numpy(np.asarray(p[f'features_{name}']['kernel']).transpose(3, 2, 0, 1).copy())
        mod.bias.data = torch.from_numpy(np.asarray(p[f'features_{name}']['bias']).copy())
  return ref.eval()


def random_pairs(size: int, n: int, seed: int = 0):
  """n uint8 pairs: smooth random images (bilinearly upsampled noise) and noisy copies."""
  rng = np.random.default_rng(seed)
  base = rng.integers(0, 256, (n, size // 8 + 1, size // 8 + 1, 3)).astype(np.float32)
  a = np.asarray(jax.image.resize(base, (n, size, size, 3), 'bilinear'))
  b = a + rng.normal(0, 12, a.shape)
  return np.clip(a, 0, 255).astype(np.uint8), np.clip(b, 0, 255).astype(np.uint8)


def sides(metric: str, tdev: str, torch):
  """(ours(u0, u1) -> np (B,), reference(t0, t1) -> np (B,)) for one metric; u uint8 NHWC, t float NCHW [0, 1]."""
  from visim_jax.models import classical as C  # pylint: disable=g-import-not-at-top
  if metric in PIQ_IQA:   # ours(distorted, reference) as piq's (x, y); the pairs' second image is the distorted one
    from visim_jax.models import iqa  # pylint: disable=g-import-not-at-top
    m = iqa.METRICS[metric]
    opts = next(iter(m.variants.values()))
    ref_fn = piq_fn(*PIQ_IQA[metric])
    fn = cpu_kernels.jit(lambda u0, u1: m.fn(u1, u0, opts))
    return (lambda u0, u1: np.asarray(fn(u0, u1))), (lambda t0, t1: ref_fn(t1, t0, reduction='none'))
  if metric == 'dists':
    from visim_jax.models import dists as D  # pylint: disable=g-import-not-at-top
    model = D.load_dists()
    ref = dists_reference(model, torch).to(tdev)
    fn = cpu_kernels.jit(D.dists)
    return (lambda u0, u1: np.asarray(fn(model, u0, u1))), (lambda t0, t1: ref(t0, t1).reshape(-1))
  if metric == 'psnr':
    ref_psnr = piq_psnr()
    fn = cpu_kernels.jit(lambda u0, u1: C.psnr(u0.astype(jnp.float32) / 255.0, u1.astype(jnp.float32) / 255.0))
    return (lambda u0, u1: np.asarray(fn(u0, u1))), (lambda t0, t1: ref_psnr(t0, t1, data_range=1.0,
                                                                               reduction='none'))
  import pytorch_msssim  # pylint: disable=g-import-not-at-top
  ours_fn = {'ssim': C.ssim, 'ms_ssim': C.ms_ssim}[metric]
  ref_fn = {'ssim': pytorch_msssim.ssim, 'ms_ssim': pytorch_msssim.ms_ssim}[metric]
  fn = cpu_kernels.jit(lambda u0, u1: ours_fn(u0.astype(jnp.float32) / 255.0, u1.astype(jnp.float32) / 255.0))
  return (lambda u0, u1: np.asarray(fn(u0, u1))), (lambda t0, t1: ref_fn(t0, t1, data_range=1.0,
                                                                         size_average=False))


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument('--metrics', default='psnr,ssim,ms_ssim,dists')
  ap.add_argument('--size', type=int, default=128, help='side of the images (MS-SSIM: at least 161)')
  ap.add_argument('--pairs', type=int, default=64)
  ap.add_argument('--batch', type=int, default=32, help='pairs per call')
  ap.add_argument('--alternations', type=int, default=3)
  ap.add_argument('--min_time', type=float, default=0.2,
                  help='seconds of back-to-back runs per timed alternation (the same number of runs each side)')
  ap.add_argument('--out', default=None)
  a = ap.parse_args(argv)
  import torch  # pylint: disable=g-import-not-at-top
  inter = _local('interleaved')
  prec = _local('precision').apply()
  pairs_of = _local('lpips').pairs_of
  try:
    import skimage  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
    images = 'packaged photos (benchmarks/lpips.py pairs_of)'
  except ImportError:   # a bare GPU image: structured random pairs instead (same on both sides)
    images = 'random (scikit-image not installed)'
    pairs_of = random_pairs
  tdev = 'cuda' if torch.cuda.is_available() else 'cpu'
  print(f'[metrics] {a.metrics} at {a.size} px, torch on {tdev}, precision {prec["name"]}', file=sys.stderr,
        flush=True)
  from visim_jax.core.errors import UserError  # pylint: disable=g-import-not-at-top
  results, rows, skipped = [], [], {}
  names = [m.strip() for m in a.metrics.split(',') if m.strip()]
  names = [n for m in names for n in (PIQ_IQA if m == 'iqa' else (m,))]
  for metric in names:
    size = max(a.size, MIN_SIDE.get(metric, 0))
    x0, x1 = pairs_of(size, a.pairs)
    batches = [(x0[i:i + a.batch], x1[i:i + a.batch]) for i in range(0, a.pairs, a.batch)]
    to_t = lambda u: torch.from_numpy(np.ascontiguousarray(u.transpose(0, 3, 1, 2)).astype(np.float32) / 255.0)
    tb = [(to_t(b0).to(tdev), to_t(b1).to(tdev)) for b0, b1 in batches]
    try:
      ours, ref = sides(metric, tdev, torch)
    except UserError as e:   # weights not at hand (e.g. DISTS' VGG16 on a lent GPU machine: 59 MB, not carried)
      skipped[metric] = str(e).splitlines()[0]
      print(f'[metrics] {metric} skipped: {skipped[metric]}', file=sys.stderr, flush=True)
      continue

    # both sides start from arrays already on their device (torch's tb above): on a GPU, host-to-device copies of
    # the uint8 batches would otherwise be timed on our side only (PSNR read 0.11x piq on an H200 that way)
    jb = [(jax.device_put(b0), jax.device_put(b1)) for b0, b1 in batches]

    def run_ours():
      return np.concatenate([ours(b0, b1) for b0, b1 in jb])

    def run_ref():
      with torch.no_grad():
        return np.concatenate([ref(t0, t1).cpu().numpy() for t0, t1 in tb])

    t = time.perf_counter()
    d_ours = run_ours()
    compile_s = time.perf_counter() - t
    d_ref = run_ref()
    if metric == 'srsim':   # piq normalises SR-SIM's saliency over its whole batch: values checked one pair a call
      with torch.no_grad():
        d_ref = np.concatenate([ref(t0[i:i + 1], t1[i:i + 1]).cpu().numpy() for t0, t1 in tb
                                for i in range(len(t0))])
    diff = float(np.max(np.abs(d_ours - d_ref)))
    if not diff <= TOLERANCE[metric]:
      raise SystemExit(f'benchmarks/metrics.py: {metric}: ours and the reference differ by {diff:.3g} '
                       f'(> {TOLERANCE[metric]:g})')
    times = inter.interleaved({'ours': run_ours, 'reference': run_ref}, a.alternations, warmup=False,
                              min_time=a.min_time)
    stats = inter.compare(times['ours'], times['reference'], work=a.pairs, unit='pairs')
    refname = {**{m_: 'piq 0.8.0' for m_ in PIQ_IQA}, 'psnr': 'piq 0.8.0', 'ssim': 'pytorch-msssim 1.0.0', 'ms_ssim': 'pytorch-msssim 1.0.0',
               'dists': 'DISTS_pytorch 0.1'}[metric]
    res = {'metric': metric, 'size': size, 'pairs': a.pairs, 'batch': min(a.batch, a.pairs), 'max_abs_diff': diff,
           'ours_compile_and_first_s': compile_s, **stats}
    results.append(res)
    rows.append(inter.row(f'{metric}, {size} px, {a.pairs} pairs, batch {res["batch"]}, float32', stats,
                          'ours (jitted)', f'{refname} ({tdev})', 'pairs'))
    if metric == 'dists':   # the roofline: DISTS' trunk alone (VGG16's convolutions + L2 pooling) on the same images
      from visim_jax.models import dists as D  # pylint: disable=g-import-not-at-top
      model = D.load_dists()
      trunk = cpu_kernels.jit(lambda u: D.features(model.params, u.astype(jnp.float32) / 255.0, model.blocks))
      run_trunk = lambda: [jax.block_until_ready((trunk(b0), trunk(b1))) for b0, b1 in jb]  # noqa: E731
      tt = inter.interleaved({'trunk': run_trunk, 'ours': run_ours}, a.alternations)
      res['trunk_roofline_percent'] = 100.0 * float(np.median(tt['trunk'])) / float(np.median(tt['ours']))
      rows[-1]['ours'] += f" ({res['trunk_roofline_percent']:.0f}% of its trunk's rate)"
    print(json.dumps(res), file=sys.stderr, flush=True)
  out = {'benchmark': 'metrics', 'command': 'python benchmarks/metrics.py ' + ' '.join(argv or sys.argv[1:]),
         'machine': {'jax_device': jax.devices()[0].device_kind, 'cpus': os.cpu_count(), 'torch': torch.__version__,
                     'torch_threads': torch.get_num_threads(), 'jax': jax.__version__,
                     'platform': platform.platform(), 'load_average': inter.load_average()},
         'precision': prec, 'torch_device': tdev, 'images': images, 'results': results, 'skipped': skipped,
         'rows': rows}
  return inter.emit(out, a.out)


if __name__ == '__main__':
  main()
