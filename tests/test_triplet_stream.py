"""triplet_stream.py (index files, their checks, seeded batches, memory estimate) and teacher_triplets.py (k-means,
within / between / border sampling, labels)."""
import numpy as np
import pytest

from visim_jax.data import teacher_labels
from visim_jax.data import triplet_index as ts
from visim_jax.core.errors import UserError


def test_stream_is_a_function_of_seed_and_step():
  s = ts.Stream(103, 10, seed=7)
  assert s.steps_per_epoch == 10
  whole = s.rows(0, 35)
  # chunked reads, in any order and from a fresh object (a resumed run), give the same batches
  again = ts.Stream(103, 10, seed=7)
  parts = np.concatenate([again.rows(20, 15), again.rows(0, 7), again.rows(7, 13)])
  np.testing.assert_array_equal(parts, np.concatenate([whole[20:], whole[:20]]))
  # every epoch is a permutation: its 10 batches are distinct rows; epochs differ; another seed differs
  for e in range(3):
    ep = whole[10 * e:10 * e + 10].ravel()
    assert len(np.unique(ep)) == 100 and ep.max() < 103
  assert not np.array_equal(whole[:10], whole[10:20])
  assert not np.array_equal(ts.Stream(103, 10, seed=8).rows(0, 1), whole[:1])
  np.testing.assert_array_equal(whole[10:20].ravel(), ts.epoch_permutation(7, 1, 103)[:100])
  with pytest.raises(ValueError):
    ts.Stream(5, 10, 0)


def _set(n=20, m=10, kind='similarities'):
  rng = np.random.RandomState(0)
  t = np.stack([rng.choice(m, 3, replace=False) for _ in range(n)]).astype(np.int32)
  y = {'similarities': rng.randn(n, 3).astype(np.float32), 'odd': rng.randint(0, 3, n).astype(np.int32),
       'judge': rng.rand(n).astype(np.float32)}[kind]
  return ts.TripletSet(t, kind, y, [f'img{i}.png' for i in range(m)], {'who': 'test'})


@pytest.mark.parametrize('kind', ts.TARGETS)
def test_index_file_round_trip(tmp_path, kind):
  s = _set(kind=kind)
  ts.save(str(tmp_path / 'a.npz'), s)
  r = ts.load(str(tmp_path / 'a.npz'))
  np.testing.assert_array_equal(r.triplets, s.triplets)
  np.testing.assert_array_equal(r.target, s.target)
  assert r.target_kind == kind and r.images == s.images and r.meta['who'] == 'test'


def test_index_file_refusals_name_the_file(tmp_path):
  p = str(tmp_path / 'bad.npz')
  good = _set()
  cases = [
      (dict(triplets=np.array([[0, 1, 12]]), similarities=np.zeros((1, 3)), images=np.array(good.images)),
       r'bad.npz: triplet 0 has index \[0, 1, 12\] outside 0..9'),
      (dict(triplets=np.array([[0, -1, 2]]), odd=np.array([0]), images=np.array(good.images)), 'outside 0..9'),
      (dict(triplets=np.array([[0, 1, 1]]), odd=np.array([0]), images=np.array(good.images)), 'repeats an image'),
      (dict(triplets=np.array([[0, 1, 2]]), odd=np.array([3]), images=np.array(good.images)), 'odd must be 0, 1 or 2'),
      (dict(triplets=np.array([[0, 1, 2]]), judge=np.array([1.5]), images=np.array(good.images)), r'judge must be in'),
      (dict(triplets=np.array([[0, 1, 2]]), similarities=np.array([[0, np.nan, 1]]), images=np.array(good.images)),
       'non-finite'),
      (dict(triplets=np.array([[0, 1, 2]]), images=np.array(good.images)), 'exactly one of'),
      (dict(triplets=np.array([0, 1, 2]), odd=np.array([0]), images=np.array(good.images)), r'\(N, 3\) integer'),
      (dict(triplets=np.array([[0, 1, 2]]), similarities=np.zeros((2, 3)), images=np.array(good.images)),
       'similarities must have shape'),
  ]
  for arrays, match in cases:
    np.savez(p, **arrays)
    with pytest.raises(UserError, match=match) as e:
      ts.load(p)
    assert str(e.value).startswith(p) and '\n' not in str(e.value)
  with open(p, 'wb') as f:
    f.write(b'not a zip')
  with pytest.raises(UserError, match='not a readable triplet index file'):
    ts.load(p)
  with pytest.raises(UserError, match='not found'):
    ts.load(str(tmp_path / 'missing.npz'))
  # bounds against the feature table's rows when it is smaller than the image list
  ts.save(p, good)
  with pytest.raises(UserError, match='outside 0..2'):
    ts.load(p, n_rows=3)


def test_memory_estimate_refuses_before_allocating():
  parts = ts.memory_bytes(10_000_000, 10_000, 1_000_000, 768, 1024, 512, 1000, 3, devices=8)
  assert parts['host'] > 10_000_000 * 6 * 4 and parts['device'] > 1_000_000 * 768 * 4
  ts.check_memory(parts, 2**40, 2**40)
  with pytest.raises(UserError, match=r'config.batch_size: this run needs at least .* GiB of device memory'):
    ts.check_memory(parts, 2**30, 2**40)
  # the fields that drive each side, largest first (learn_triplets' refusal): here the held-out triplets' count
  from visim_jax.core import memory
  est = lambda v: ts.memory_bytes(v['n_train'], v['n_val'], 1000, 64, 64, v['batch'], 100, 3)
  sizes = {'n_train': 1000, 'n_val': 10**9, 'batch': 64}
  with pytest.raises(UserError, match=r'^n_val: this run needs .* of host memory.*; lower n_val \([\d,.]+ GiB of '
                     r'it\)$'):
    ts.check_memory(est(sizes), 2**40, 2**30, {w: memory.drivers(lambda v, w=w: {w: est(v)[w]}, sizes)
                                                for w in ('host', 'device')})


def test_sampling_kinds():
  labels = np.repeat(np.arange(6), [5, 4, 3, 2, 1, 10])
  rng = np.random.default_rng(0)
  w = teacher_labels.sample(labels, 2000, 'within', rng)
  assert (labels[w[:, 0]] == labels[w[:, 1]]).all() and (labels[w[:, 1]] == labels[w[:, 2]]).all()
  assert set(np.unique(labels[w[:, 0]])) == {0, 1, 2, 5}          # clusters with >= 3 images, all used
  b = teacher_labels.sample(labels, 2000, 'between', rng)
  lb = labels[b]
  assert (lb[:, 0] != lb[:, 1]).all() and (lb[:, 0] != lb[:, 2]).all() and (lb[:, 1] != lb[:, 2]).all()
  c = teacher_labels.sample(labels, 2000, 'border', rng)
  lc = labels[c]
  assert (lc[:, 0] == lc[:, 1]).all() and (lc[:, 2] != lc[:, 0]).all()
  assert set(np.unique(lc[:, 2])) == set(range(6))                # every other cluster can be the odd one
  for t in (w, b, c, teacher_labels.sample(labels, 99, 'mixed', rng)):
    assert (t[:, 0] != t[:, 1]).all() and (t[:, 0] != t[:, 2]).all() and (t[:, 1] != t[:, 2]).all()
  with pytest.raises(ValueError, match='between needs 3'):
    teacher_labels.sample(np.zeros(5, int), 3, 'between', rng)


def test_labels_put_the_odd_one_last_and_kmeans_finds_clusters():
  rng = np.random.RandomState(0)
  centres = rng.randn(4, 8) * 5
  x = (centres[np.repeat(np.arange(4), 25)] + rng.randn(100, 8) * 0.1).astype(np.float32)
  _, lab = teacher_labels.kmeans(x, 4, 10, seed=0)
  truth = np.repeat(np.arange(4), 25)
  # each found cluster is one true cluster (a relabelling)
  assert all(len(np.unique(lab[truth == k])) == 1 for k in range(4)) and len(np.unique(lab)) == 4
  t = rng.randint(0, 100, (50, 3))
  t = t[(t[:, 0] != t[:, 1]) & (t[:, 0] != t[:, 2]) & (t[:, 1] != t[:, 2])]
  tri, s = teacher_labels.label(t, x, 'cosine')
  assert (s[:, 0] >= s[:, 1]).all() and (s[:, 0] >= s[:, 2]).all()   # the most similar pair is (0, 1)
  np.testing.assert_allclose(s, teacher_labels.pair_sims(x, tri, 'cosine'), rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(np.sort(tri, 1), np.sort(t, 1))      # the same images, reordered
  train, val = teacher_labels.generate(x, [str(i) for i in range(100)], 200, 40, clusters=4, seed=3)
  vi, ti = set(np.unique(val.triplets)), set(np.unique(train.triplets))
  assert not vi & ti and len(vi) <= 20                                 # held-out triplets: unseen images only
  again, _ = teacher_labels.generate(x, [str(i) for i in range(100)], 200, 40, clusters=4, seed=3)
  np.testing.assert_array_equal(again.triplets, train.triplets)
