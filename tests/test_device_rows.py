"""device_rows.put_rows: the rows of a (memory-mapped) host array on the devices, block by block, equal to the
one-shot put; exact histograms and the search index read NumPy / memmap features the same as jax arrays."""
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from visim_jax.core import device_rows, ops
from visim_jax.metrics import blocked_histograms as B
from visim_jax.search import index as index_lib


def memmap(tmp_path, x):
  m = np.lib.format.open_memmap(str(tmp_path / 'x.npy'), 'w+', x.dtype, x.shape)
  m[:] = x
  m.flush()
  return np.load(str(tmp_path / 'x.npy'), mmap_mode='r')


def test_put_rows_blocks_rows_transform_and_padding(tmp_path):
  x = np.random.default_rng(0).standard_normal((37, 5)).astype(np.float32)
  mm = memmap(tmp_path, x)
  mesh = Mesh(np.array(jax.devices()), ('i',))
  for sharding in (NamedSharding(mesh, P('i')), NamedSharding(mesh, P())):
    y = device_rows.put_rows(mm, 40, sharding, block=8, transform=ops.l2_normalize)
    np.testing.assert_array_equal(np.asarray(y)[:37], np.asarray(ops.l2_normalize(jnp.asarray(x))))
    assert (np.asarray(y)[37:] == 0).all() and y.sharding == sharding
  rows = np.array([5, 0, 36, 2])
  y = device_rows.put_rows(mm, 6, NamedSharding(mesh, P()), jnp.bfloat16, rows=rows, block=3)
  np.testing.assert_array_equal(np.asarray(y)[:4], x[rows].astype(jnp.bfloat16))
  assert device_rows.all_finite(mm, block=7)
  x[30, 1] = np.nan
  assert not device_rows.all_finite(x, block=7)


def test_exact_histograms_and_index_from_memmap(tmp_path):
  rng = np.random.default_rng(1)
  x = np.asarray(ops.l2_normalize(jnp.asarray(rng.standard_normal((50, 8)).astype(np.float32))))
  lab = rng.integers(-1, 4, 50)
  mm = memmap(tmp_path, x)
  want = B.exact_histograms(jnp.asarray(x), lab, 4, tile=16, pairwise=True)
  got = B.exact_histograms(mm, lab, 4, tile=16, pairwise=True)
  for g, w in zip(got, want):
    np.testing.assert_array_equal(g, w)
  a, b = index_lib.build_index(x, block=16), index_lib.build_index(mm, block=16)
  np.testing.assert_array_equal(np.asarray(a.vectors), np.asarray(b.vectors))
  q = x[:5]
  for u, v in zip(index_lib.search(a, q, 3), index_lib.search(b, q, 3)):
    np.testing.assert_array_equal(u, v)
