r"""CLIP ViT-B/32 feature extraction: our jitted (bf16) path vs the HF PyTorch model in the same run.

  python benchmarks/extract_clip.py                                   # CPU-sized (a minute)
  python benchmarks/extract_clip.py --batch=256 --batches=20 --files=2048   # a GPU (H100: goal >= 1.5x PyTorch)

Weights: random, of the real ViT-B/32 config (timing does not depend on their values). The PyTorch model
(transformers.CLIPVisionModel, sdpa attention, `torch.inference_mode`, bf16 on CUDA / float32 on CPU unless
--torch_dtype says otherwise) is saved with save_pretrained and loaded into ours through the offline loader, so both
run the same weights; the float32 outputs are compared (max |diff| of the pooled token).
Ours: `features.make_extract_fn` (uint8 in, normalise + network + pooling, one jitted program). Both are timed on
inputs already on the device; compile time is reported apart. Host side: decode-only throughput (PIL decode +
bicubic shorter-side resize + centre crop of JPEGs, one thread and a pool), and the end-to-end `features.extract`.
Prints one JSON object.
"""
from __future__ import annotations

import concurrent.futures
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from visim_jax import features  # noqa: E402
from visim_jax.backbones import get_backbone, hf  # noqa: E402
from visim_jax.data import images  # noqa: E402

_BATCH = flags.DEFINE_integer('batch', 8, 'Images per batch (GPU: 256).')
_BATCHES = flags.DEFINE_integer('batches', 3, 'Timed batches (GPU: 20).')
_DTYPE = flags.DEFINE_enum('dtype', 'bfloat16', ['float32', 'bfloat16'], 'Our compute dtype.')
_TORCH_DTYPE = flags.DEFINE_enum('torch_dtype', 'auto', ['auto', 'float32', 'bfloat16', 'float16'],
                                 'PyTorch dtype; auto = bfloat16 on CUDA, float32 on CPU.')
_FILES = flags.DEFINE_integer('files', 64, 'JPEG files for the decode-only and end-to-end numbers (GPU: 2048).')
_THREADS = flags.DEFINE_integer('threads', 8, 'Decode threads for the pooled decode number.')
_MODEL = flags.DEFINE_string('model', 'clip_vit_b32', 'A clip_vit_* name.')


def timed(fn, repeats):
  fn()  # warm-up
  t = time.perf_counter()
  for _ in range(repeats):
    fn()
  return (time.perf_counter() - t) / repeats


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
  spec = hf.SPECS[_MODEL.value]
  if spec.family != 'clip':
    raise app.UsageError(f'--model: a clip_vit_* name, got {_MODEL.value}')
  cuda = torch.cuda.is_available()
  tdev = 'cuda' if cuda else 'cpu'
  tdtype = {'auto': torch.bfloat16 if cuda else torch.float32, 'float32': torch.float32,
            'bfloat16': torch.bfloat16, 'float16': torch.float16}[_TORCH_DTYPE.value]
  b = _BATCH.value
  result = {'benchmark': 'extract_clip', 'model': _MODEL.value, 'devices': [str(d) for d in jax.devices()],
            'device_kind': jax.devices()[0].device_kind, 'platform': jax.default_backend(), 'batch': b,
            'batches': _BATCHES.value, 'dtype': _DTYPE.value, 'host_cpus': os.cpu_count()}

  with tempfile.TemporaryDirectory() as tmp:
    torch.manual_seed(0)
    ref = transformers.CLIPVisionModel(transformers.CLIPVisionConfig(**spec.config)).eval()
    ref.save_pretrained(os.path.join(tmp, 'w'), safe_serialization=True)
    bb = get_backbone(_MODEL.value, weights=os.path.join(tmp, 'w'))
    size = bb.preprocess.size
    result['image_size'] = size
    x = np.random.default_rng(0).integers(0, 256, (b, size, size, 3), dtype=np.uint8)

    # ours
    fn = features.make_extract_fn(bb, ('pooled',), jnp.dtype(_DTYPE.value))
    variables = jax.device_put(bb.variables)
    dev_x = jax.device_put(x)
    t0 = time.perf_counter()
    jax.block_until_ready(fn(variables, dev_x))
    result['ours_compile_s'] = time.perf_counter() - t0
    t = timed(lambda: jax.block_until_ready(fn(variables, dev_x)), _BATCHES.value)
    result['ours_images_per_s'] = b / t

    # PyTorch (HF), same weights
    xn = np.asarray(bb.preprocess.normalise(x)).transpose(0, 3, 1, 2).copy()
    ref = ref.to(tdev, tdtype)
    xt = torch.from_numpy(xn).to(tdev, tdtype)

    def run_torch():
      with torch.inference_mode():
        out = ref(pixel_values=xt).pooler_output
      if cuda:
        torch.cuda.synchronize()
      return out

    t = timed(run_torch, _BATCHES.value)
    result['reference'] = (f'transformers {transformers.__version__} CLIPVisionModel on PyTorch {torch.__version__} '
                           f'({tdev}, {str(tdtype).replace("torch.", "")}, attn {ref.config._attn_implementation})')
    result['reference_images_per_s'] = b / t
    result['speedup'] = result['ours_images_per_s'] / result['reference_images_per_s']

    # correctness at float32, on a few images
    ref32 = ref.to(tdev, torch.float32)
    with torch.inference_mode():
      want = ref32(pixel_values=torch.from_numpy(xn[:2]).to(tdev)).pooler_output.float().cpu().numpy()
    got, _ = jax.jit(bb.__call__)(x[:2])
    result['max_abs_diff_pooled_fp32'] = float(np.abs(np.asarray(got) - want).max())

    # host side
    paths = write_jpegs(tmp, _FILES.value, np.random.default_rng(1))
    t0 = time.perf_counter()
    images.load_batch(paths, bb.preprocess)
    result['decode_only_images_per_s_1_thread'] = len(paths) / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(_THREADS.value) as ex:
      list(ex.map(lambda p: images.load_image(p, bb.preprocess), paths))
    result[f'decode_only_images_per_s_{_THREADS.value}_threads'] = len(paths) / (time.perf_counter() - t0)
    result['jpeg'] = '640x480, quality 90, decode + bicubic resize (shorter side 224) + centre crop'
    # features.extract builds (and compiles) its jitted function on every call: the number includes one compile
    t0 = time.perf_counter()
    features.extract(bb, paths, batch_size=b, progress=False, dtype=_DTYPE.value, layers=('pooled',))
    result['end_to_end_images_per_s_incl_compile'] = len(paths) / (time.perf_counter() - t0)
  print(json.dumps(result, indent=1))


if __name__ == '__main__':
  app.run(main)
