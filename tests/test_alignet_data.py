"""AligNet's released triplet files (data/alignet.py) and the grain batches of data/grain_data.py: the layout is
read as published, a bad file is one line naming the file and the key, two processes' shares make one process's
batch, and an iterator restored from its state reads on as the uninterrupted one."""
import os

import numpy as np
import pytest

from test_tune import write_alignet
from visim_jax.core.errors import UserError
from visim_jax.data import alignet, grain_data


def test_reads_the_released_layout(tmp_path):
  write_alignet(tmp_path, n_train=20, n_val=5, transform='uncertainty_distillation', sampling='within_class')
  p = alignet.path(str(tmp_path), 'uncertainty_distillation', 'val', 'within_class')
  assert p == os.path.join(tmp_path, 'uncertainty_distillation', 'val_within_class.npz')
  s = alignet.load(p, 40)
  z = np.load(p)
  np.testing.assert_array_equal(s.triplets, z['indices'])
  np.testing.assert_allclose(s.target, z['similarities'], rtol=1e-7)   # [s01, s02, s12]: our column order
  assert s.target_kind == 'similarities' and s.triplets.dtype == np.int32 and len(s) == 5


def _write(path, **arrays):
  np.savez(path, **arrays)
  return str(path)


@pytest.mark.parametrize('change, match', [
    (dict(indices=None), r"key 'indices' missing"),
    (dict(similarities=None), r"key 'similarities' missing"),
    (dict(indices=np.zeros((4, 2), np.int64)), r"key 'indices' must be a non-empty \(N, 3\) array of integers"),
    (dict(indices=np.ones((4, 3)) * 0.5), r"key 'indices' must be .* integers"),
    (dict(similarities=np.zeros((3, 3))), r"key 'similarities' must be .* with N as in indices"),
    (dict(filenames=np.zeros((4, 3))), r"key 'filenames' must be .* strings"),
    (dict(indices=np.array([[0, 1, 2]] * 3 + [[0, 1, 40]])), r"key 'indices' row 3 holds \[0, 1, 40\], outside 0\.\.39"),
    (dict(indices=np.array([[0, 1, 2]] * 3 + [[5, 5, 2]])), r"key 'indices' row 3 repeats an image"),
    (dict(similarities=np.array([[1., 0, 0]] * 3 + [[np.nan, 0, 0]])), r"key 'similarities' row 3 holds non-finite"),
])
def test_a_bad_file_is_one_line_naming_file_and_key(tmp_path, change, match):
  arrays = dict(indices=np.array([[0, 1, 2]] * 4), similarities=np.array([[0.9, 0.5, 0.1]] * 4),
                filenames=np.array([['a', 'b', 'c']] * 4))
  arrays.update(change)
  p = _write(tmp_path / 'train_x.npz', **{k: v for k, v in arrays.items() if v is not None})
  with pytest.raises(UserError, match=match) as e:
    alignet.load(p, 40)
  assert str(e.value).startswith(p) and '\n' not in str(e.value)
  with pytest.raises(UserError, match='not found'):
    alignet.load(str(tmp_path / 'nope.npz'))
  (tmp_path / 'garbled.npz').write_bytes(b'PK\x03\x04 not a zip')
  with pytest.raises(UserError, match='garbled.npz: not a readable .npz file'):
    alignet.load(str(tmp_path / 'garbled.npz'))


def test_grain_batches_shares_and_state():
  """Step s's batch depends on (seed, s): each epoch a fresh permutation (seed + epoch), batches run across an
  epoch's end; rows lo:hi are a process's share; set_state(get_state()) reads on as the uninterrupted iterator."""
  table = np.arange(10 * 2 * 2 * 3, dtype=np.uint8).reshape(10, 2, 2, 3)
  tri = np.random.RandomState(0).randint(0, 10, (11, 3))
  tgt = np.arange(11, dtype=np.float32)
  one = list(grain_data.triplet_batches(tri, tgt, grain_data.TableImages(table), 4, 3, 8, threads=0))
  assert len(one) == 8 and one[0][0].shape == (4, 3, 2, 2, 3)
  rows = np.concatenate([t for _, t in one]).astype(int)   # the targets are the triplet rows
  for e in range(2):   # every row once an epoch (11 rows: the first 22 reads), two different permutations
    assert sorted(rows[11 * e:11 * (e + 1)]) == list(range(11))
  assert list(rows[:11]) != list(rows[11:22])
  np.testing.assert_array_equal(one[5][0], table[tri[rows[20:24]]])
  halves = [list(grain_data.triplet_batches(tri, tgt, grain_data.TableImages(table), 4, 3, 8, lo, lo + 2, threads=0))
            for lo in (0, 2)]
  for s in range(8):
    np.testing.assert_array_equal(np.concatenate([halves[0][s][0], halves[1][s][0]]), one[s][0])
  it = grain_data.triplet_batches(tri, tgt, grain_data.TableImages(table), 4, 3, 8, threads=2)
  for _ in range(3):
    next(it)
  again = grain_data.triplet_batches(tri, tgt, grain_data.TableImages(table), 4, 3, 8, threads=2)
  again.set_state(it.get_state())
  np.testing.assert_array_equal(np.stack([t for _, t in again]), np.stack([t for _, t in one[3:]]))


def _cv2_cubic_loop(a, out_w, out_h):
  """OpenCV's INTER_CUBIC on uint8 written as plain loops (imgproc/resize.cpp: float32 source coordinates, Keys' cubic
  A = -0.75, weights rounded to 11 bits, edge-clamped taps, the integer row pass, then the column pass as its
  vectorised float32 multiply-add chain from the last tap, rounded half to even and saturated)."""
  def taps(n_in, n_out, d):
    fx = np.float32((d + 0.5) * (1.0 / (n_out / n_in)) - 0.5)
    sx = int(np.floor(fx))
    x = np.float32(fx - np.float32(sx))
    A, one = np.float32(-0.75), np.float32(1)
    c = [((A * (x + one) - 5 * A) * (x + one) + 8 * A) * (x + one) - 4 * A,
         ((A + 2) * x - (A + 3)) * x * x + one, ((A + 2) * (one - x) - (A + 3)) * (one - x) * (one - x) + one]
    c.append(one - c[0] - c[1] - c[2])
    return [min(max(sx - 1 + k, 0), n_in - 1) for k in range(4)], [int(np.rint(np.float32(v) * np.float32(2048)))
                                                                    for v in c]
  h, w, ch = a.shape
  rows = np.zeros((h, out_w, ch), np.int64)
  for y in range(h):
    for d in range(out_w):
      ix, wx = taps(w, out_w, d)
      for c in range(ch):
        rows[y, d, c] = sum(int(a[y, ix[k], c]) * wx[k] for k in range(4))
  out = np.zeros((out_h, out_w, ch), np.uint8)
  for d in range(out_h):
    iy, wy = taps(h, out_h, d)
    b = [np.float32(np.float32(v) * np.float32(2.0 ** -22)) for v in wy]
    for x in range(out_w):
      for c in range(ch):
        acc = np.float32(np.float64(rows[iy[3], x, c]) * np.float64(b[3]))
        for k in (2, 1, 0):
          acc = np.float32(np.float64(rows[iy[k], x, c]) * np.float64(b[k]) + np.float64(acc))
        out[d, x, c] = min(max(int(np.rint(acc)), 0), 255)
  return out


@pytest.mark.parametrize('shape, size', [((23, 31, 3), 12), ((9, 7, 3), 16), ((40, 13, 3), 21)])
def test_cv2_cubic_resize_equals_the_plain_loop(shape, size):
  """AligNet's pixels: `alignet_preprocess` resizes as cv2.resize(INTER_CUBIC) (shrinking without antialiasing,
  enlarging), then [0, 1] on the device."""
  import dataclasses
  from visim_jax.data import images
  from visim_jax.data.image_batches import alignet_preprocess
  a = np.random.RandomState(sum(shape)).randint(0, 256, shape).astype(np.uint8)
  a[::3] = 255   # hard edges: the kernel's negative lobes overshoot and saturate
  pre = dataclasses.replace(alignet_preprocess(224), size=size)
  np.testing.assert_array_equal(images.resize(images.from_array(a), pre), _cv2_cubic_loop(a, size, size))
  x = np.asarray(pre.normalise(np.full((1, size, size, 3), 255, np.uint8)))
  assert pre.interpolation == 'cv2_cubic' and np.allclose(x, 1.0)


def test_worker_processes_read_the_batches_threads_read():
  """worker_count > 0 (grain's mp_prefetch, each worker a whole batch): the same batches in the same order as the
  threads, and a state taken mid-run resumes there."""
  table = np.arange(10 * 2 * 2 * 3, dtype=np.uint8).reshape(10, 2, 2, 3)
  tri = np.random.RandomState(1).randint(0, 10, (11, 3))
  tgt = np.arange(11, dtype=np.float32)
  make = lambda **kw: grain_data.triplet_batches(tri, tgt, grain_data.TableImages(table), 4, 5, 6, 1, 3, **kw)
  want = list(make(threads=0))
  it = make(worker_count=2)
  got = [next(it) for _ in range(2)]
  again = make(worker_count=2)
  again.set_state(it.get_state())
  got += list(again)
  assert len(got) == 6
  for (x, t), (y, u) in zip(got, want):
    np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(t, u)
