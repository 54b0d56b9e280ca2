"""data/pipeline.py: the same pixels in the same order as images.load_batch, for every thread count; the
decoded-image cache skips decoding on a hit and misses when the preprocessing or a file changes."""
import os

import numpy as np
import pytest
from PIL import Image

from visim_jax.data import images, pipeline
from visim_jax.data.preprocess import Preprocess
from visim_jax.experiments import config_fields

PRE = Preprocess(size=16, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))


@pytest.fixture(scope='module')
def files(tmp_path_factory):
  d = tmp_path_factory.mktemp('imgs')
  rng = np.random.default_rng(0)
  out = []
  for i in range(11):  # sizes and formats vary: JPEG and PNG, portrait and landscape
    h, w = 20 + 3 * i, 30 - i
    p = str(d / f'{i:02d}.{"jpg" if i % 2 else "png"}')
    Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(p)
    out.append(p)
  return out


def sequential(paths, pre, batch_size, flip=False):
  """The extraction loop's host side before the pipeline: load_batch, flip, zero padding."""
  for s in range(0, len(paths), batch_size):
    b = paths[s:s + batch_size]
    x = images.load_batch(b, pre)
    if flip:
      x = np.ascontiguousarray(x[:, :, ::-1])
    x = np.concatenate([x, np.zeros((batch_size - len(b),) + x.shape[1:], x.dtype)])
    yield s, len(b), x


@pytest.mark.parametrize('workers', [1, 2, 5])
@pytest.mark.parametrize('flip', [False, True])
def test_same_pixels_and_order_as_load_batch(files, workers, flip):
  want = list(sequential(files, PRE, 4, flip))
  got = list(pipeline.host_batches(files, PRE, 4, flip=flip, workers=workers, prefetch=2))
  assert [(s, n) for s, n, _ in got] == [(s, n) for s, n, _ in want]
  for (_, _, g), (_, _, w) in zip(got, want):
    assert g.dtype == w.dtype == np.uint8
    np.testing.assert_array_equal(g, w)


def test_float_pixels_of_torch_bilinear(files):
  pre = Preprocess(size=16, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), interpolation='torch_bilinear')
  for (_, _, g), (_, _, w) in zip(pipeline.host_batches(files, pre, 3, workers=3), sequential(files, pre, 3)):
    assert g.dtype == np.float32
    np.testing.assert_array_equal(g, w)


def test_loader_batches_in_order(files):
  calls = []

  def loader(items, pre):
    calls.append(list(items))
    return np.stack([np.full((pre.size, pre.size, 3), int(i), np.uint8) for i in items])

  got = list(pipeline.host_batches([str(i) for i in range(7)], PRE, 3, loader=loader, workers=2, prefetch=3))
  assert [(s, n) for s, n, _ in got] == [(0, 3), (3, 3), (6, 1)]
  np.testing.assert_array_equal(np.concatenate([x[:n, 0, 0, 0] for _, n, x in got]), np.arange(7))
  assert (got[-1][2][1:] == 0).all()


def counting():
  count = [0]

  def load(p, pre):
    count[0] += 1
    return images.load_image(p, pre)
  return count, load


def test_image_cache_hit_skips_decoding_and_preprocessing_change_misses(files, tmp_path):
  cache = str(tmp_path / 'imgcache')
  want = np.concatenate([x[:n] for _, n, x in sequential(files, PRE, 4)])
  count, load = counting()
  first = np.concatenate([x[:n] for _, n, x in pipeline.host_batches(files, PRE, 4, image_cache=cache,
                                                                     load_image=load)])
  assert count[0] == len(files)
  np.testing.assert_array_equal(first, want)
  assert [f for f in os.listdir(cache) if 'tmp' in f] == []
  count, load = counting()
  again = list(pipeline.host_batches(files, PRE, 4, flip=True, image_cache=cache, load_image=load))
  assert count[0] == 0  # read from the memory-mapped cache
  for (_, _, g), (_, _, w) in zip(again, sequential(files, PRE, 4, flip=True)):
    np.testing.assert_array_equal(g, w)
  other = Preprocess(size=16, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), interpolation='bicubic')
  count, load = counting()
  list(pipeline.host_batches(files, other, 4, image_cache=cache, load_image=load))
  assert count[0] == len(files)  # another preprocessing: decoded again, its own cache file
  assert len([f for f in os.listdir(cache) if f.endswith('.npy')]) == 2


def test_image_cache_not_published_when_decoding_fails(files, tmp_path):
  cache = str(tmp_path / 'c')
  bad = tmp_path / 'bad.jpg'
  bad.write_bytes(b'not a jpeg')
  with pytest.raises(images.ImageError, match='bad.jpg'):
    list(pipeline.host_batches(files + [str(bad)], PRE, 4, image_cache=cache))
  assert os.listdir(cache) == []
  with pytest.raises(images.ImageError, match='missing.jpg'):
    list(pipeline.host_batches(files + [str(tmp_path / 'missing.jpg')], PRE, 4, image_cache=cache))


def test_corrupt_image_cache_is_rebuilt(files, tmp_path):
  cache = str(tmp_path / 'c')
  list(pipeline.host_batches(files, PRE, 4, image_cache=cache))
  npy = [os.path.join(cache, f) for f in os.listdir(cache) if f.endswith('.npy')][0]
  with open(npy, 'r+b') as f:
    f.truncate(100)
  count, load = counting()
  got = np.concatenate([x[:n] for _, n, x in pipeline.host_batches(files, PRE, 4, image_cache=cache,
                                                                   load_image=load)])
  assert count[0] == len(files)
  np.testing.assert_array_equal(got, np.concatenate([x[:n] for _, n, x in sequential(files, PRE, 4)]))


def test_device_batches_keep_order():
  puts = []
  src = ((i, 1, np.full(2, i)) for i in range(4))
  got = [s for s, _, _ in pipeline.device_batches(src, lambda a: puts.append(int(a[0])) or a)]
  assert got == [0, 1, 2, 3] and puts == [0, 1, 2, 3]


def test_config_image_cache_keeps_pixels_for_a_second_run(files, tmp_path):
  # config.image_cache: the decoded pixels land under <cache_dir>/images; the features are the same either way
  import ml_collections
  from visim_jax.backbones import features
  c = config_fields.add_fields(ml_collections.ConfigDict())
  c.backbone, c.backbone_kwargs.tiny, c.backbone_kwargs.random_init = 'alexnet', True, 0
  c.cache_dir, c.image_batch_size = str(tmp_path / 'cache'), 4
  plain = config_fields.options(c)
  c.image_cache = True
  cached = config_fields.options(c)
  assert cached.image_cache and not plain.image_cache
  backbone, layers = features.build(cached)
  a = features.features_of(plain, backbone, layers, files, tag='a', progress=False)
  assert not (tmp_path / 'cache' / 'images').exists()
  b = features.features_of(cached, backbone, layers, files, tag='b', progress=False)
  assert any((tmp_path / 'cache' / 'images').iterdir())
  np.testing.assert_array_equal(a, b)
