"""visim_jax.export: one run's adapter in one .npz; apply_adapter = PCA transform then ReLU(W d)."""
import os

import numpy as np
import pytest

from visim_jax.models import adaptation
from visim_jax.training import adapter_file
from visim_jax.core import pca
from visim_jax.training import adaptation_runs
from visim_jax.core.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
META = {'backbone': 'efficientnet_lite0', 'layers': ['a', 'b'], 'weights_sha256': 'abc',
        'preprocessing': {'size': 224}}


def arrays(d=12, p=5, a=7, seed=0):
  rng = np.random.RandomState(seed)
  return dict(pca_mean=rng.randn(d), pca_components=rng.randn(d, p), pca_scale=rng.rand(p) + 0.5,
              w=rng.randn(p, a))


def test_round_trip_and_apply(tmp_path):
  arr = arrays()
  path = adapter_file.save_adapter(str(tmp_path / 'a.npz'), **arr, meta={**META, 'note': 'x'})
  ad = adapter_file.load_adapter(path)
  assert ad.meta['backbone'] == 'efficientnet_lite0' and ad.meta['note'] == 'x' and ad.meta['layers'] == ['a', 'b']
  assert (ad.in_dim, ad.out_dim) == (12, 7)
  np.testing.assert_array_equal(ad.w, arr['w'].astype(np.float32))
  x = np.random.RandomState(1).randn(9, 12).astype(np.float32)
  p = pca.PCA(*(np.float32(arr[k]) for k in ('pca_mean', 'pca_components', 'pca_scale')))
  want = adaptation.adapt({'w': np.float32(arr['w'])}, pca.transform(p, x))
  np.testing.assert_allclose(adapter_file.apply_adapter(ad, x), want, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(adapter_file.apply_adapter(ad, x),
                             np.maximum(((x - ad.mean) @ ad.components * ad.scale) @ ad.w, 0), rtol=1e-4, atol=1e-4)
  with pytest.raises(ValueError, match='features have dim 11'):
    adapter_file.apply_adapter(ad, x[:, :11])


def test_bad_adapters(tmp_path):
  arr = arrays()
  with pytest.raises(ValueError, match="meta lacks \\['weights_sha256'"):
    adapter_file.save_adapter(str(tmp_path / 'a.npz'), **arr, meta={k: v for k, v in META.items() if k != 'weights_sha256'})
  with pytest.raises(ValueError, match='w .* does not match'):
    adapter_file.save_adapter(str(tmp_path / 'a.npz'), **{**arr, 'w': arr['w'][:4]}, meta=META)
  with pytest.raises(ValueError, match='pca_components must have 2 dims'):
    adapter_file.save_adapter(str(tmp_path / 'a.npz'), **{**arr, 'pca_components': arr['pca_components'][None]}, meta=META)
  bad = dict(arr, pca_scale=arr['pca_scale'].copy())
  bad['pca_scale'][0] = np.nan
  with pytest.raises(ValueError, match='pca_scale has NaN'):
    adapter_file.save_adapter(str(tmp_path / 'a.npz'), **bad, meta=META)
  assert not (tmp_path / 'a.npz').exists()
  np.savez(tmp_path / 'other.npz', x=np.zeros(3))
  with pytest.raises(ValueError, match='other.npz: not an adapter file'):
    adapter_file.load_adapter(str(tmp_path / 'other.npz'))
  (tmp_path / 'trunc.npz').write_bytes(b'PK\x03\x04garbage')
  with pytest.raises(ValueError, match='trunc.npz: unreadable adapter file'):
    adapter_file.load_adapter(str(tmp_path / 'trunc.npz'))
  with pytest.raises(UserError, match='nope.npz: adapter file not found'):
    adapter_file.load_adapter(str(tmp_path / 'nope.npz'))


def test_from_training_output_and_checkpoint(tmp_path):
  """run_arrays(train_all output) and the checkpoint converter give the same adapter for each run."""
  from visim_jax.training import runtime
  from visim_jax.experiments import adapt
  rng = np.random.RandomState(0)
  z = rng.randn(40, 16).astype(np.float32)
  feats = adaptation_runs.Features(z + 0.2 * rng.randn(40, 16).astype(np.float32), z + 0.2 * rng.randn(40, 16).astype(np.float32))
  hp = adaptation_runs.Hparams(runs=2, pca_dim=6, adapt_dim=10, epochs=4, seed=1)
  fp = runtime.fingerprint(hp.__dict__, feats)
  with runtime.Run(str(tmp_path / 'wd'), {'hparams': hp.__dict__}, fp, progress=False) as run:  # wd/checkpoints
    out = adapt.train_all(hp, feats, run, checkpoint_every=2, progress=False)
  for run in (0, 1):
    path = adapter_file.from_workdir(str(tmp_path / 'wd'), run=run, out=str(tmp_path / f'r{run}.npz'))
    ad = adapter_file.load_adapter(path)
    want = adapter_file.run_arrays(out, run)
    np.testing.assert_array_equal(ad.w, want['w'])
    np.testing.assert_array_equal(ad.mean, want['pca_mean'])
    np.testing.assert_array_equal(ad.components, want['pca_components'])
    assert ad.meta['backbone'] is None and ad.meta['source']['epoch'] == 4  # no metrics.json: meta unknown
  # the adapted test vectors rank like the experiment's last epoch
  ad = adapter_file.load_adapter(str(tmp_path / 'r1.npz'))
  te = out['test_idx'][1]
  ranks = adaptation_runs.best_ranks(adapter_file.apply_adapter(ad, feats.left[te]), adapter_file.apply_adapter(ad, feats.right[te]))
  np.testing.assert_array_equal(np.asarray(ranks), out['ranks'][1, 0, -1])  # (R, S, E, n): the one sigma
  with pytest.raises(UserError, match='--run=2'):
    adapter_file.run_arrays(out, 2)
