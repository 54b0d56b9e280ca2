r"""Feature extraction throughput: our jitted EfficientNet-Lite0 path vs a reference in the same run.

  python benchmarks/extract.py                       # CPU-sized
  python benchmarks/extract.py --batch=128 --batches=20 --dtype=bfloat16   # a GPU

Reference: the same network in PyTorch (written here, same weights, eager) when torch is installed,
otherwise our Flax network run op by op without jit. Also reports the host pipeline alone (PIL decode +
resize of the demo PNGs) and the end-to-end `features.extract` over those files. Prints one JSON object.
"""
from __future__ import annotations

import glob
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
from visim_jax.backbones import efficientnet_lite, get_backbone  # noqa: E402
from visim_jax.data import demo, images  # noqa: E402

_BATCH = flags.DEFINE_integer('batch', 16, 'Images per batch.')
_BATCHES = flags.DEFINE_integer('batches', 4, 'Timed batches.')
_DTYPE = flags.DEFINE_enum('dtype', 'float32', ['float32', 'bfloat16'], 'Our compute dtype.')
_FILES = flags.DEFINE_integer('files', 64, 'Demo image files for the decode and end-to-end numbers.')


def timed(fn, repeats):
  fn()  # warm-up / compile
  t = time.perf_counter()
  for _ in range(repeats):
    out = fn()
  jax.block_until_ready(out) if not hasattr(out, 'numpy') else None
  return (time.perf_counter() - t) / repeats


def torch_reference(sd):
  """EfficientNet-Lite0 as a PyTorch user would write it (TF-SAME padding), with our loaded weights."""
  import torch
  import torch.nn.functional as F

  t = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sd.items()}

  def same_conv(x, w, stride, groups=1):
    k = w.shape[-1]
    ih, iw = x.shape[-2:]
    ph = max((-(-ih // stride) - 1) * stride + k - ih, 0)
    pw = max((-(-iw // stride) - 1) * stride + k - iw, 0)
    x = F.pad(x, [pw // 2, pw - pw // 2, ph // 2, ph - ph // 2])
    return F.conv2d(x, w, stride=stride, groups=groups)

  def bn(x, p):
    return F.batch_norm(x, t[p + 'running_mean'], t[p + 'running_var'], t[p + 'weight'], t[p + 'bias'], False, 0.0, 1e-3)

  @torch.no_grad()
  def forward(x):  # x: float NCHW, already normalised
    x = F.relu6(bn(same_conv(x, t['_conv_stem.weight'], 2), '_bn0.'))
    i = 0
    for repeats, k, s, e, _, out in efficientnet_lite.BLOCKS:
      for r in range(repeats):
        p = f'_blocks.{i}.'
        inp = x
        if e != 1:
          x = F.relu6(bn(F.conv2d(x, t[p + '_expand_conv.weight']), p + '_bn0.'))
        x = F.relu6(bn(same_conv(x, t[p + '_depthwise_conv.weight'], s if r == 0 else 1, groups=x.shape[1]),
                       p + '_bn1.'))
        x = bn(F.conv2d(x, t[p + '_project_conv.weight']), p + '_bn2.')
        if (s if r == 0 else 1) == 1 and inp.shape[1] == out:
          x = x + inp
        i += 1
    x = F.relu6(bn(F.conv2d(x, t['_conv_head.weight']), '_bn1.'))
    return F.linear(x.mean((2, 3)), t['_fc.weight'], t['_fc.bias'])
  return forward


def main(_):
  bb = get_backbone('efficientnet_lite0')
  b, size = _BATCH.value, bb.preprocess.size
  rng = np.random.RandomState(0)
  x = rng.randint(0, 256, (b, size, size, 3)).astype(np.uint8)
  result = {'benchmark': 'extract', 'backbone': bb.name, 'device': str(jax.devices()[0].device_kind),
            'platform': jax.default_backend(), 'batch': b, 'image_size': size, 'dtype': _DTYPE.value}

  fn = features.make_extract_fn(bb, bb.layers, jnp.dtype(_DTYPE.value))
  t0 = time.perf_counter()
  jax.block_until_ready(fn(bb.variables, x))
  result['ours_compile_s'] = time.perf_counter() - t0
  dev_x = jax.device_put(x)
  t = timed(lambda: jax.block_until_ready(fn(bb.variables, dev_x)), _BATCHES.value)
  result['ours_images_per_s'] = b / t

  try:
    import torch
    torch.set_num_threads(os.cpu_count())
    from visim_jax import safe_pickle
    fwd = torch_reference(safe_pickle.load_torch_state_dict(efficientnet_lite.weights_path()))
    xt = torch.from_numpy(((x.astype(np.float32) - 127.0) / 128.0).transpose(0, 3, 1, 2).copy())
    t = timed(lambda: fwd(xt), _BATCHES.value)
    ours_logits, _ = jax.jit(bb.__call__)(x)
    result['reference'] = f'PyTorch {torch.__version__} eager (same network and weights), float32'
    result['reference_images_per_s'] = b / t
    result['max_abs_logit_diff_vs_reference'] = float(np.abs(np.asarray(ours_logits) - fwd(xt).numpy()).max())
  except ImportError:
    with jax.disable_jit():
      t = timed(lambda: jax.block_until_ready(bb(x[:2])[0]), 1)
    result['reference'] = 'our Flax network without jit (op-by-op dispatch), float32'
    result['reference_images_per_s'] = 2 / t
  result['speedup'] = result['ours_images_per_s'] / result['reference_images_per_s']

  with tempfile.TemporaryDirectory() as tmp:
    folder = demo.demo_pairs(tmp, n_pairs=max(8, _FILES.value), seed=0)
    paths = sorted(glob.glob(os.path.join(folder, 'left', '*.png')))[:_FILES.value]
    t0 = time.perf_counter()
    images.load_batch(paths, bb.preprocess)
    result['decode_only_images_per_s'] = len(paths) / (time.perf_counter() - t0)
    features.extract(bb, paths[:b], batch_size=b, progress=False, dtype=_DTYPE.value)  # compile
    t0 = time.perf_counter()
    features.extract(bb, paths, batch_size=b, progress=False, dtype=_DTYPE.value)
    result['end_to_end_images_per_s'] = len(paths) / (time.perf_counter() - t0)
  print(json.dumps(result, indent=1))


if __name__ == '__main__':
  app.run(main)
