import collections
import os
import pickle

import numpy as np
import pytest

from visim_jax.core import safe_pickle
from visim_jax.backbones import efficientnet_lite


class _Evil:
  def __reduce__(self):
    return (os.system, ('echo pwned > /tmp/visim_pwned',))


def _legacy_header(f):
  for obj in (safe_pickle._LEGACY_MAGIC, 1001, {'protocol_version': 1001, 'little_endian': True}):
    pickle.dump(obj, f, protocol=2)


def test_refuses_malicious_legacy_checkpoint(tmp_path):
  path = tmp_path / 'evil.pth'
  with open(path, 'wb') as f:
    _legacy_header(f)
    pickle.dump(collections.OrderedDict(x=_Evil()), f, protocol=2)
  with pytest.raises(safe_pickle.UnsafePickleError, match='posix.system|os.system'):
    safe_pickle.load_torch_state_dict(path)
  assert not os.path.exists('/tmp/visim_pwned')


def test_refuses_malicious_data_pickle(tmp_path):
  path = tmp_path / 'evil.pkl'
  path.write_bytes(pickle.dumps({'gnd': _Evil()}))
  with pytest.raises(safe_pickle.UnsafePickleError, match=str(path)):
    safe_pickle.load_data_pickle(path)


def test_data_pickle_roundtrip(tmp_path):
  obj = {'imlist': ['a', 'b'], 'gnd': [{'easy': np.arange(3), 'junk': np.array([], np.int64)}], 'x': 1.5}
  path = tmp_path / 'ok.pkl'
  path.write_bytes(pickle.dumps(obj))
  got = safe_pickle.load_data_pickle(path)
  assert got['imlist'] == ['a', 'b'] and got['x'] == 1.5
  np.testing.assert_array_equal(got['gnd'][0]['easy'], np.arange(3))


def test_reads_real_legacy_weights():
  sd = safe_pickle.load_torch_state_dict(efficientnet_lite.weights_path())
  assert sd['_conv_stem.weight'].shape == (32, 3, 3, 3)
  assert sd['_fc.weight'].shape == (1000, 1280) and sd['_fc.weight'].dtype == np.float32
  assert np.isfinite(sd['_fc.weight']).all() and sd['_fc.weight'].std() > 0


def test_truncated_checkpoint_is_a_clear_error(tmp_path):
  data = open(efficientnet_lite.weights_path(), 'rb').read()
  path = tmp_path / 'cut.pth'
  path.write_bytes(data[:len(data) // 2])
  with pytest.raises(ValueError, match='truncated|not a readable'):
    safe_pickle.load_torch_state_dict(path)
  path.write_bytes(b'not a checkpoint at all')
  with pytest.raises(ValueError, match=str(path)):
    safe_pickle.load_torch_state_dict(path)


def test_zip_format_matches_torch_when_installed(tmp_path):
  torch = pytest.importorskip('torch')
  sd = collections.OrderedDict(a=torch.randn(3, 4), b=torch.arange(5), c=torch.randn(4, 6).t())
  path = tmp_path / 'new.pt'
  torch.save(sd, path)
  got = safe_pickle.load_torch_state_dict(path)
  for k, v in sd.items():
    np.testing.assert_array_equal(got[k], v.numpy())
