r"""The extraction input pipeline (visim_jax/data/pipeline.py): decode rates, model rate, end-to-end, before vs after.

  python benchmarks/pipeline.py                       # CPU-sized: 192 JPEGs, EfficientNet-Lite0, batch 32
  python benchmarks/pipeline.py --backbone=alexnet --tiny    # a tiny random AlexNet: decode-bound on a CPU
  python benchmarks/pipeline.py --files=2048 --batch=256 --backbone=clip_vit_b32 --dtype=bfloat16   # a GPU

Writes --files synthetic photo-like JPEGs (500 x 375, quality 90: ImageNet's typical size) and measures, each
as images per second (median of --repeats, with the load average):
  decode_1_thread      images.load_image one after the other (what one core does)
  decode_threads       pipeline.host_batches, one thread per host core (what the extraction loop reads): grain
  decode_grain_vs_thread_pool   host_batches through grain against the per-image thread pool it replaced (the
                       same workers, `prefetch` batches ahead), interleaved (benchmarks/interleaved.py)
  decode_processes     a process pool (forkserver, started before timing) over the same per-image function
                       (chunked map; pixels pickled back)
  decode_old_loop      the previous loop's host side: load_batch per batch on a 4-thread pool, 2 batches ahead
  decode_cached        pipeline.host_batches reading the decoded-image cache (a second model, same images)
  model_only           the jitted extraction program on a device-resident batch (no host work)
  end_to_end           features.extract (the pipeline) and the previous loop, interleaved (benchmarks/interleaved.py)
  end_to_end_cached    features.extract with the decoded-image cache warm
The target: end_to_end >= 0.8 x min(decode_threads, model_only). On a CPU the model and the decoding share the
same cores, so there the bound is rather 1 / (1 / decode + 1 / model); both are printed. tf.data is measured when
tensorflow imports (it is an optional extra; TFDS reads prepared data without it). Prints one JSON object.
"""
from __future__ import annotations

import concurrent.futures
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
from PIL import Image  # noqa: E402

import interleaved  # noqa: E402
from visim_jax.backbones import features  # noqa: E402
from visim_jax.core import sharding
from visim_jax.backbones import get_backbone  # noqa: E402
from visim_jax.data import images, pipeline  # noqa: E402

_FILES = flags.DEFINE_integer('files', 192, 'Synthetic JPEG files.')
_BATCH = flags.DEFINE_integer('batch', 32, 'Images per batch.')
_BACKBONE = flags.DEFINE_string('backbone', 'efficientnet_lite0', 'Backbone registry name.')
_RANDOM = flags.DEFINE_bool('random_init', False, 'Random weights (backbones whose weights are not local).')
_TINY = flags.DEFINE_bool('tiny', False, 'The family\'s tiny random configuration (a decode-bound model on a CPU).')
_DTYPE = flags.DEFINE_enum('dtype', 'float32', ['float32', 'bfloat16'], 'Our compute dtype.')
_SINGLE = flags.DEFINE_integer('single_files', 64, 'Files of the one-thread decode rate.')
_REPEATS = flags.DEFINE_integer('repeats', 3, 'Timed repeats of each decode measurement.')
_ALT = flags.DEFINE_integer('alternations', 3, 'Interleaved end-to-end alternations.')
_DECODE_ONLY = flags.DEFINE_bool('decode_only', False, 'Only decode_threads and decode_grain_vs_thread_pool.')


def say(msg):
  print(f'[pipeline] {msg} (load {interleaved.load_average()})', file=sys.stderr, flush=True)


def photo_like(rng, h=375, w=500) -> np.ndarray:
  """Smooth colour fields + edges + mild noise: JPEG sizes and decode costs of photographs, not of white noise."""
  small = rng.integers(0, 256, (h // 25 + 2, w // 25 + 2, 3), dtype=np.uint8)
  im = np.asarray(Image.fromarray(small).resize((w, h), Image.Resampling.BICUBIC), np.int16)
  yy, xx = np.mgrid[:h, :w]
  im += (40 * ((xx // rng.integers(20, 80) + yy // rng.integers(20, 80)) % 2))[..., None].astype(np.int16)
  im += rng.integers(-12, 13, im.shape, dtype=np.int16)
  return np.clip(im, 0, 255).astype(np.uint8)


def make_files(folder: str, n: int) -> list[str]:
  """n JPEGs written on a thread pool (PIL's encoder releases the GIL); image i depends on i only."""
  def one(i):
    p = os.path.join(folder, f'{i:05d}.jpg')
    Image.fromarray(photo_like(np.random.default_rng(i))).save(p, quality=90)
    return p
  with concurrent.futures.ThreadPoolExecutor(pipeline.default_workers()) as ex:
    return list(ex.map(one, range(n)))


def rate(n, f, repeats):
  ts = []
  for _ in range(repeats):
    t = time.perf_counter()
    f()
    ts.append(time.perf_counter() - t)
  return {'images_per_s': n / float(np.median(ts)), 'seconds_all': [round(t, 4) for t in ts],
          'load_average': interleaved.load_average()}


def old_loop(bb, paths, batch_size, dtype, num_threads=4):
  """The extraction loop as it was before data/pipeline.py (features.extract at 526d7af): load_batch per batch on
  a thread pool, two batches in flight, the device result read back before the next batch is dispatched."""
  fn = features.make_extract_fn(bb, bb.layers, jnp.dtype(dtype))
  mesh = sharding.make_mesh('batch', jax.local_devices())
  variables = jax.device_put(bb.variables, sharding.replicated(mesh))
  out = np.empty((len(paths), sum(bb.layer_dims(bb.layers).values())), np.float32)
  batches = [list(paths[i:i + batch_size]) for i in range(0, len(paths), batch_size)]

  def load(batch):
    x = images.load_batch(batch, bb.preprocess)
    if len(batch) < batch_size:
      x = np.concatenate([x, np.zeros((batch_size - len(batch),) + x.shape[1:], x.dtype)])
    return x

  with concurrent.futures.ThreadPoolExecutor(num_threads) as ex:
    futures = [ex.submit(load, b) for b in batches[:2]]
    for i, batch in enumerate(batches):
      x = futures[i].result()
      if i + 2 < len(batches):
        futures.append(ex.submit(load, batches[i + 2]))
      x = jax.device_put(x, sharding.split(mesh))
      out[i * batch_size:i * batch_size + len(batch)] = np.asarray(fn(variables, x))[:len(batch)]
  return out


def old_decode(paths, pre, batch_size, num_threads=4):
  batches = [list(paths[i:i + batch_size]) for i in range(0, len(paths), batch_size)]
  with concurrent.futures.ThreadPoolExecutor(num_threads) as ex:
    futures = [ex.submit(images.load_batch, b, pre) for b in batches[:2]]
    for i in range(len(batches)):
      futures[i].result()
      if i + 2 < len(batches):
        futures.append(ex.submit(images.load_batch, batches[i + 2], pre))


def thread_pool_decode(paths, pre, batch_size, workers, prefetch=4):
  """pipeline.host_batches's decode loop before grain (up to 0df7b0e): one future per image on a thread pool,
  max(prefetch * batch_size, 2 * workers) images ahead, batches filled in order."""
  import collections  # pylint: disable=g-import-not-at-top
  n_total = len(paths)
  with concurrent.futures.ThreadPoolExecutor(workers) as ex:
    window, submitted, ahead = collections.deque(), 0, max(prefetch * batch_size, 2 * workers)

    def top_up():
      nonlocal submitted
      while submitted < n_total and len(window) < ahead:
        window.append(ex.submit(images.load_image, paths[submitted], pre))
        submitted += 1
    top_up()
    for start in range(0, n_total, batch_size):
      n = min(batch_size, n_total - start)
      x = np.zeros((batch_size, pre.size, pre.size, 3), pipeline.pixel_dtype(pre))
      for j in range(n):
        x[j] = window.popleft().result()
        top_up()


def tf_data_decode(paths, pre, batch_size):
  """tf.data over the same per-image PIL function (tf.numpy_function, AUTOTUNE parallelism, prefetch); None
  without tensorflow."""
  try:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  dtype = pipeline.pixel_dtype(pre)

  def one(p):
    return images.load_image(p.decode(), pre)
  ds = tf.data.Dataset.from_tensor_slices(paths).map(
      lambda p: tf.numpy_function(one, [p], tf.as_dtype(dtype)), num_parallel_calls=tf.data.AUTOTUNE)
  ds = ds.batch(batch_size).prefetch(tf.data.AUTOTUNE)
  return lambda: [b.numpy() for b in ds]


def main(_):
  cores = pipeline.default_workers()
  kw = {'random_init': 0} if _RANDOM.value or _TINY.value else {}
  bb = get_backbone(_BACKBONE.value, **kw, **({'tiny': True} if _TINY.value else {}))
  pre, b = bb.preprocess, _BATCH.value
  result = {'benchmark': 'pipeline', 'backbone': bb.name + (' (tiny, random)' if _TINY.value else ''),
            'device': str(jax.devices()[0].device_kind),
            'platform': jax.default_backend(), 'host_cores': cores, 'batch': b, 'dtype': _DTYPE.value,
            'image_size': pre.size, 'interpolation': pre.interpolation, 'files': _FILES.value,
            'file_size': '500x375 JPEG q90 (synthetic, photo-like)', 'matmul_precision': 'default'}
  with tempfile.TemporaryDirectory() as tmp:
    say(f'writing {_FILES.value} JPEGs')
    paths = make_files(tmp, _FILES.value)
    n, r = len(paths), _REPEATS.value
    drain = lambda **kw: [None for _ in pipeline.host_batches(paths, pre, b, **kw)]
    say('decode rates')
    one = paths[:_SINGLE.value]
    result['decode_1_thread'] = rate(len(one), lambda: [images.load_image(p, pre) for p in one], r)
    result['decode_1_thread']['files'] = len(one)
    result['decode_threads'] = rate(n, lambda: drain(workers=cores), r)
    result['decode_threads']['workers'] = cores
    times = interleaved.interleaved({'ours': lambda: drain(workers=cores),
                                     'reference': lambda: thread_pool_decode(paths, pre, b, cores)}, _ALT.value)
    result['decode_grain_vs_thread_pool'] = interleaved.compare(times['ours'], times['reference'], work=n,
                                                                unit='images')
    if _DECODE_ONLY.value:
      result['rows'] = [interleaved.row(f'decode {n} JPEGs 500x375 -> {pre.size} px, batch {b}, {cores} threads',
                                        result['decode_grain_vs_thread_pool'], 'grain (data/grain_data.py)',
                                        'thread pool (host_batches before)', 'images')]
      print(json.dumps(result, indent=1), flush=True)
      return

    import multiprocessing  # pylint: disable=g-import-not-at-top
    with concurrent.futures.ProcessPoolExecutor(cores, mp_context=multiprocessing.get_context('forkserver')) as ex:
      procs = lambda: list(ex.map(images.load_image, paths, [pre] * n, chunksize=8))
      procs()  # starts the workers (not timed)
      result['decode_processes'] = rate(n, procs, r)
    result['decode_processes']['workers'] = cores
    result['decode_old_loop'] = rate(n, lambda: old_decode(paths, pre, b), r)
    tfd = tf_data_decode(paths, pre, b)
    result['decode_tf_data'] = rate(n, tfd, r) if tfd else 'not measured: tensorflow is not installed'
    cache = os.path.join(tmp, 'imgcache')
    drain(image_cache=cache)
    result['decode_cached'] = rate(n, lambda: drain(image_cache=cache), r)

    say('model only (compiles first)')
    fn = features.make_extract_fn(bb, bb.layers, jnp.dtype(_DTYPE.value))
    x = jax.device_put(np.stack([images.load_image(paths[i % n], pre) for i in range(b)]))
    t0 = time.perf_counter()
    jax.block_until_ready(fn(bb.variables, x))
    result['compile_s'] = time.perf_counter() - t0
    reps = max(1, n // b)
    result['model_only'] = rate(reps * b, lambda: [np.asarray(fn(bb.variables, x)) for _ in range(reps)], r)

    say('end to end, interleaved with the previous loop')
    new = features.extract(bb, paths, batch_size=b, dtype=_DTYPE.value, progress=False)
    old = old_loop(bb, paths, b, _DTYPE.value)
    result['max_abs_diff_new_vs_old'] = float(np.abs(new - old).max())
    assert np.array_equal(new, old), 'the pipeline changed the features'
    times = interleaved.interleaved(
        {'ours': lambda: features.extract(bb, paths, batch_size=b, dtype=_DTYPE.value, progress=False),
         'reference': lambda: old_loop(bb, paths, b, _DTYPE.value)}, _ALT.value, warmup=False)
    stats = interleaved.compare(times['ours'], times['reference'], work=n, unit='images')
    result['end_to_end'] = stats
    features.extract(bb, paths, batch_size=b, dtype=_DTYPE.value, progress=False, image_cache=cache)
    result['end_to_end_cached'] = rate(n, lambda: features.extract(bb, paths, batch_size=b, dtype=_DTYPE.value,
                                                                   progress=False, image_cache=cache), r)
  dec, mod = result['decode_threads']['images_per_s'], result['model_only']['images_per_s']
  e2e = stats['ours_images_per_s']
  result['target_images_per_s'] = 0.8 * min(dec, mod)
  result['shared_cores_bound_images_per_s'] = 1 / (1 / dec + 1 / mod)
  result['end_to_end_over_min_decode_model'] = e2e / min(dec, mod)
  result['end_to_end_over_shared_cores_bound'] = e2e / result['shared_cores_bound_images_per_s']
  cap = f'end-to-end extraction, {bb.name}, {n} JPEGs 500x375, batch {b}, {_DTYPE.value}'
  result['rows'] = [interleaved.row(cap, stats, 'ours (data/pipeline.py)', 'previous loop (load_batch, 2 ahead)',
                                    'images')]
  print(json.dumps(result, indent=1), flush=True)


if __name__ == '__main__':
  from visim_jax.core import errors  # pylint: disable=g-import-not-at-top
  app.run(main, flags_parser=errors.flags_parser)   # one-line flag errors; --help exits 0
