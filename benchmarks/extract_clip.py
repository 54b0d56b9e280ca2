r"""CLIP ViT-B/32 feature extraction: our jitted path vs the HF PyTorch model in the same run, at equal precision.

  python benchmarks/extract_clip.py                                   # CPU-sized (a minute)
  python benchmarks/extract_clip.py --batch=256 --batches=20 --files=2048   # a GPU (H100: goal >= 1.5x PyTorch)
  python benchmarks/extract_clip.py --dtype=float32                  # one precision only

Weights: random, of the real ViT-B/32 config (timing does not depend on their values). The PyTorch model
(transformers.CLIPVisionModel, sdpa attention, `torch.inference_mode`) is saved with save_pretrained and loaded
into ours through the offline loader, so both run the same weights; the float32 outputs are compared (max |diff|
of the pooled token). Each --dtype (default float32 and bfloat16; run_all on a CPU: float32) is one row: ours and
PyTorch both at that dtype, from the same uint8 batch with the normalisation inside both timed calls, --batches
batches per call, timed interleaved (benchmarks/interleaved.py). Ours: `features.make_extract_fn` (uint8 in,
normalise + network + pooling, one jitted program). Inputs already on the device; compile time apart. Host side: decode-only throughput (PIL decode +
bicubic shorter-side resize + centre crop of JPEGs, one thread and a pool), and the end-to-end `features.extract`.
Prints one JSON object.
"""
from __future__ import annotations

import concurrent.futures
import copy
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

import interleaved  # noqa: E402
import precision  # noqa: E402
from visim_jax.backbones import features  # noqa: E402
from visim_jax.backbones import get_backbone, hf  # noqa: E402
from visim_jax.data import images  # noqa: E402

_BATCH = flags.DEFINE_integer('batch', 8, 'Images per batch (GPU: 256).')
_BATCHES = flags.DEFINE_integer('batches', 3, 'Timed batches (GPU: 20).')
_DTYPE = flags.DEFINE_multi_enum('dtype', ['float32', 'bfloat16'], ['float32', 'bfloat16'],
                                 'Compute dtypes, each compared with PyTorch at the same dtype.')
_ALT = flags.DEFINE_integer('alternations', 3, 'Interleaved (ours, PyTorch) alternations.')
_FILES = flags.DEFINE_integer('files', 64, 'JPEG files for the decode-only and end-to-end numbers (GPU: 2048).')
_THREADS = flags.DEFINE_integer('threads', 8, 'Decode threads for the pooled decode number.')
_MODEL = flags.DEFINE_string('model', 'clip_vit_b32', 'A clip_vit_* name.')
precision.define_flag()


def write_jpegs(folder, n, rng):
  """n JPEGs of 640x480 (smooth random content, so they compress like photos)."""
  from PIL import Image
  paths = []
  for i in range(n):
    small = rng.integers(0, 256, (15, 20, 3), dtype=np.uint8)
    im = Image.fromarray(small).resize((640, 480), Image.Resampling.BICUBIC)
    path = os.path.join(folder, f'{i:05d}.jpg')
    im.save(path, quality=90)
    paths.append(path)
  return paths


def main(_):
  import torch
  import transformers
  torch.set_num_threads(os.cpu_count())
  prec = precision.apply()
  spec = hf.SPECS[_MODEL.value]
  if spec.family != 'clip':
    raise app.UsageError(f'--model: a clip_vit_* name, got {_MODEL.value}')
  cuda = torch.cuda.is_available()
  tdev = 'cuda' if cuda else 'cpu'
  b = _BATCH.value
  result = {'benchmark': 'extract_clip', 'model': _MODEL.value, 'devices': [str(d) for d in jax.devices()],
            'device_kind': jax.devices()[0].device_kind, 'platform': jax.default_backend(), 'batch': b,
            'batches': _BATCHES.value, 'dtypes': list(_DTYPE.value), 'host_cpus': os.cpu_count(),
            'precision': prec}

  with tempfile.TemporaryDirectory() as tmp:
    torch.manual_seed(0)
    ref = transformers.CLIPVisionModel(transformers.CLIPVisionConfig(**spec.config)).eval()
    ref.save_pretrained(os.path.join(tmp, 'w'), safe_serialization=True)
    bb = get_backbone(_MODEL.value, weights=os.path.join(tmp, 'w'))
    size = bb.preprocess.size
    result['image_size'] = size
    x = np.random.default_rng(0).integers(0, 256, (b, size, size, 3), dtype=np.uint8)

    # ours and PyTorch (HF, same weights) at the same precision, from the same uint8 batch, normalisation
    # included on both sides, timed interleaved (--batches batches per call)
    dev_x = jax.device_put(x)
    variables = jax.device_put(bb.variables)
    xt_u8 = torch.from_numpy(x).to(tdev)
    mean = torch.tensor(bb.preprocess.mean, device=tdev).view(1, 3, 1, 1)
    std = torch.tensor(bb.preprocess.std, device=tdev).view(1, 3, 1, 1)
    result['rows'], result['by_dtype'] = [], {}
    for dt in _DTYPE.value:
      print(f'[extract_clip] {dt} (float32 matmuls: {prec["name"]})', file=sys.stderr, flush=True)
      tdtype = {'float32': torch.float32, 'bfloat16': torch.bfloat16}[dt]
      fn = features.make_extract_fn(bb, ('pooled',), jnp.dtype(dt))
      t0 = time.perf_counter()
      jax.block_until_ready(fn(variables, dev_x))
      compile_s = time.perf_counter() - t0
      model = copy.deepcopy(ref).to(tdev, tdtype)  # ref itself stays float32

      def run_ours(fn=fn):
        for _ in range(_BATCHES.value):
          out = fn(variables, dev_x)
        return jax.block_until_ready(out)

      def run_torch(model=model, tdtype=tdtype):
        with torch.inference_mode():
          for _ in range(_BATCHES.value):
            xn = ((xt_u8.permute(0, 3, 1, 2).float() - mean) / std).to(tdtype)
            out = model(pixel_values=xn).pooler_output
        if cuda:
          torch.cuda.synchronize()
        return out
      times = interleaved.interleaved({'ours': run_ours, 'reference': run_torch}, _ALT.value)
      stats = interleaved.compare(times['ours'], times['reference'], work=b * _BATCHES.value, unit='images')
      result['by_dtype'][dt] = {'ours_compile_s': compile_s, **stats}
      result['rows'].append(interleaved.row(f'extraction, CLIP {_MODEL.value} pooled, batch {b}, {dt} both sides'
                                            f'{" (" + prec["name"] + ")" if dt == "float32" else ""}, '
                                            'uint8 in', stats, 'ours (jitted Flax)', 'HF PyTorch', 'images'))
      if dt == 'float32' and not cuda:   # the roofline: XLA's FLOP count of our program, the box's SGEMM rate
        cost = fn.lower(variables, dev_x).compile().cost_analysis()
        cost = cost[0] if isinstance(cost, (list, tuple)) else cost
        flops = float((cost or {}).get('flops', 0.0)) * _BATCHES.value
        if flops > 0:
          sg = interleaved.sgemm_gflops(b * 50, 768, 3072)   # a ViT-B MLP product at this batch
          pct = {k: interleaved.roofline_percent(flops, stats[f'{k}_s'], sg['best']) for k in ('ours', 'reference')}
          result['by_dtype'][dt].update(sgemm_gflops=sg, roofline_percent=pct, flops_per_call=flops)
          result['rows'][-1]['ours'] += f" ({pct['ours']:.0f}% of the box's SGEMM rate, {sg['best']:.0f} GFLOP/s)"
          result['rows'][-1]['reference'] += f" ({pct['reference']:.0f}%)"
    result['reference'] = (f'transformers {transformers.__version__} CLIPVisionModel on PyTorch {torch.__version__} '
                           f'({tdev}, attn {ref.config._attn_implementation}, inference_mode), same dtype as ours')

    # correctness at float32, on a few images
    ref32 = ref.to(tdev, torch.float32)
    with torch.inference_mode():
      xn = np.asarray(bb.preprocess.normalise(x[:2])).transpose(0, 3, 1, 2).copy()
      want = ref32(pixel_values=torch.from_numpy(xn).to(tdev)).pooler_output.float().cpu().numpy()
    got, _ = jax.jit(bb.__call__)(x[:2])
    result['max_abs_diff_pooled_fp32'] = float(np.abs(np.asarray(got) - want).max())

    # host side
    print('[extract_clip] host pipeline', file=sys.stderr, flush=True)
    paths = write_jpegs(tmp, _FILES.value, np.random.default_rng(1))
    t0 = time.perf_counter()
    images.load_batch(paths, bb.preprocess)
    result['decode_only_images_per_s_1_thread'] = len(paths) / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(_THREADS.value) as ex:
      list(ex.map(lambda p: images.load_image(p, bb.preprocess), paths))
    result[f'decode_only_images_per_s_{_THREADS.value}_threads'] = len(paths) / (time.perf_counter() - t0)
    result['jpeg'] = '640x480, quality 90, decode + bicubic resize (shorter side 224) + centre crop'
    # features.extract (data/pipeline.py: one decode thread per core); its program is the one compiled above
    t0 = time.perf_counter()
    features.extract(bb, paths, batch_size=b, progress=False, dtype=_DTYPE.value[0], layers=('pooled',))
    result['end_to_end_images_per_s'] = len(paths) / (time.perf_counter() - t0)
  print(json.dumps(result, indent=1))


if __name__ == '__main__':
  from visim_jax.core import errors  # pylint: disable=g-import-not-at-top
  app.run(main, flags_parser=errors.flags_parser)   # one-line flag errors; --help exits 0
