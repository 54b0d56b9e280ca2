"""The gate for checkpoints (issue 28 items 2, 7 and 8): every malformed checkpoint the converter, the DreamSim folder
conversion and the weight loaders can meet ends as one user-error line naming the file; a shard index cannot lead
outside its folder (the import graph: tests/test_house.py). Fixtures are made in tmp_path.
"""
import json
import os
import pickle
import struct
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from visim_jax.core import readers, safe_pickle
from visim_jax.backbones import convert, dreamsim, packaged, weights
from visim_jax.core.errors import UserError
from user_errors import refused

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _safetensors(path, tensors):
  from safetensors.numpy import save_file
  save_file(tensors, str(path))
  return str(path)


def _legacy_pth(path, legacy=True):
  """torch.save of {'w': arange(4)} (the legacy format, or the zip one)."""
  torch = pytest.importorskip('torch')
  torch.save({'w': torch.arange(4, dtype=torch.float32)}, str(path), _use_new_zipfile_serialization=not legacy)
  return str(path)


# ------------------------------------------------------------------------------------------ checkpoint readers

def test_malformed_checkpoints_each_end_in_one_line(tmp_path):
  good = _legacy_pth(tmp_path / 'good.pth')
  assert list(convert.read_checkpoint(good)[0]['w']) == [0, 1, 2, 3]
  data = open(good, 'rb').read()
  cases = {
      'truncated.pth': data[:len(data) // 2], 'tail.pth': data[:-6], 'empty.pth': b'',
      'random.pth': np.random.default_rng(0).bytes(4096), 'text.pth': b'not a checkpoint\n' * 20,
      'bad.safetensors': b'\xff' * 64, 'huge_header.safetensors': struct.pack('<Q', 2**60) + b'{}',
      'short.safetensors': struct.pack('<Q', 64) + b'{"w":{"dtype":"F32","shape":[1000],"data_offsets":[0,4000]}}    ',
      'text.npz': b'PK not really\n',
  }
  for name, raw in cases.items():
    p = tmp_path / name
    p.write_bytes(raw)
    refused(lambda: convert.read_checkpoint(str(p)), str(p))
  np.savez(tmp_path / 'objects.npz', w=np.array([{'a': 1}], dtype=object))       # pickled objects: refused
  refused(lambda: convert.read_checkpoint(str(tmp_path / 'objects.npz')), 'objects.npz', 'Python objects')
  with zipfile.ZipFile(tmp_path / 'nodata.pth', 'w') as z:                       # zip, no data.pkl
    z.writestr('archive/version', '3')
  refused(lambda: convert.read_checkpoint(str(tmp_path / 'nodata.pth')), 'nodata.pth', 'data.pkl')
  with zipfile.ZipFile(_legacy_pth(tmp_path / 'new.pth', legacy=False)) as z, \
       zipfile.ZipFile(tmp_path / 'nostorage.pth', 'w') as out:                  # data.pkl naming a missing storage
    for n in z.namelist():
      if '/data/' not in n:
        out.writestr(n, z.read(n))
  refused(lambda: convert.read_checkpoint(str(tmp_path / 'nostorage.pth')), 'nostorage.pth')


def test_torchscript_lookalike_zip_is_one_line(tmp_path):
  pytest.importorskip('torch')
  p = tmp_path / 'RN50.pt'
  with zipfile.ZipFile(p, 'w') as z:                                              # looks like TorchScript, is not
    z.writestr('RN50/code/__torch__.py', 'def f(x):\n  return x\n')
    z.writestr('RN50/constants.pkl', b'\x80\x02}.')
  refused(lambda: convert.read_checkpoint(str(p)), str(p), 'TorchScript')


def test_shard_index_stays_in_its_folder(tmp_path):
  d = tmp_path / 'model'
  d.mkdir()
  _safetensors(d / 'model-1.safetensors', {'a': np.ones(2, np.float32)})
  _safetensors(tmp_path / 'other.safetensors', {'b': np.ones(2, np.float32)})
  index = d / 'model.safetensors.index.json'
  index.write_text(json.dumps({'weight_map': {'a': 'model-1.safetensors'}}))
  assert list(convert.read_checkpoint(str(index))[0]) == ['a']
  for shard in ('../other.safetensors', '../../../other.safetensors', str(tmp_path / 'other.safetensors')):
    index.write_text(json.dumps({'weight_map': {'a': 'model-1.safetensors', 'b': shard}}))
    refused(lambda: convert.read_checkpoint(str(index)), f"{index}: weight_map['b']: shard", 'outside')
  os.symlink(tmp_path / 'other.safetensors', d / 'model-2.safetensors')           # a link out
  index.write_text(json.dumps({'weight_map': {'b': 'model-2.safetensors'}}))
  refused(lambda: convert.read_checkpoint(str(index)), 'symbolic link')
  for bad, what in (([1, 2], 'JSON list'), ({'weight_map': ['x']}, 'no weight_map'),
                    ({'weight_map': {'a': 3}}, 'shard file name')):
    index.write_text(json.dumps(bad))
    refused(lambda: convert.read_checkpoint(str(index)), str(index), what)
  index.write_text('{"weight_map": ')
  refused(lambda: convert.read_checkpoint(str(index)), f'{index}:line 1', 'not valid JSON')
  # a Hugging Face cache snapshot: its files are links into the model's blobs/, which is fine
  repo = tmp_path / 'hub' / 'models--org--m'
  (repo / 'blobs').mkdir(parents=True)
  snap = repo / 'snapshots' / 'abc123'
  snap.mkdir(parents=True)
  _safetensors(repo / 'blobs' / 'h1', {'a': np.ones(2, np.float32)})
  (repo / 'blobs' / 'h2').write_text(json.dumps({'weight_map': {'a': 'model-1.safetensors'}}))
  os.symlink('../../blobs/h1', snap / 'model-1.safetensors')
  os.symlink('../../blobs/h2', snap / 'model.safetensors.index.json')
  assert list(convert.read_checkpoint(str(snap / 'model.safetensors.index.json'))[0]) == ['a']


def test_sidecars_configs_and_safe_pickle(tmp_path):
  w = _safetensors(tmp_path / 'w.safetensors', {'a': np.ones(2, np.float32)})
  (tmp_path / 'w.safetensors.json').write_text('["sha256"]')
  refused(lambda: weights.check_sidecar(w), 'w.safetensors.json', 'JSON list')
  cfg = tmp_path / 'adapter_config.json'
  cfg.write_text('[{"r": 16}]')
  refused(lambda: dreamsim.read_lora_config(str(cfg)), str(cfg), 'JSON list')
  cfg.write_bytes(b'{"r": 16, \xff}')
  refused(lambda: dreamsim.read_lora_config(str(cfg)), str(cfg), 'not UTF-8')
  p = tmp_path / 'x.pkl'
  p.write_bytes(pickle.dumps({'a': [1, 2]})[:-3])
  refused(lambda: safe_pickle.load_data_pickle(str(p)), str(p), 'not a readable pickle')
  p.write_bytes(b'\x80\x09junk')                                                  # an unknown protocol
  refused(lambda: safe_pickle.load_data_pickle(str(p)), str(p))
  refused(lambda: safe_pickle.load_torch_state_dict(str(p)), str(p))
  assert issubclass(safe_pickle.UnsafePickleError, UserError)
  assert readers.read_safetensors(w)['a'].tolist() == [1.0, 1.0]


def test_dreamsim_folder_with_bad_or_escaping_files(tmp_path):
  folder = tmp_path / 'cache'
  lora = folder / 'dino_vitb16_single_lora'
  lora.mkdir(parents=True)
  (lora / 'adapter_config.json').write_text(json.dumps({'r': 4, 'lora_alpha': 8, 'target_modules': ['qkv']}))
  (lora / 'adapter_model.safetensors').write_bytes(b'\x00' * 16)
  refused(lambda: dreamsim.prepare_folder('dreamsim_dino_vitb16', str(folder), tiny=True),
           'adapter_model.safetensors', 'not a readable .safetensors')
  os.remove(lora / 'adapter_model.safetensors')
  _safetensors(tmp_path / 'outside.safetensors', {'a': np.ones(1, np.float32)})
  os.symlink(tmp_path / 'outside.safetensors', lora / 'adapter_model.safetensors')
  refused(lambda: dreamsim.prepare_folder('dreamsim_dino_vitb16', str(folder), tiny=True),
           'adapter_model.safetensors', 'outside')


def test_weights_of_another_architecture(tmp_path):
  p = _safetensors(tmp_path / 'other.safetensors', {'blocks.0.attn.weight': np.ones((2, 2, 2), np.float32)})
  refused(lambda: convert.convert('resnet18', p, str(tmp_path / 'out.safetensors'), tiny=True), p, 'unexpected entry')
  assert not (tmp_path / 'out.safetensors').exists()


# ------------------------------------------------------------------------------------------------ the CLIs

def _tree(path):
  return sorted((os.path.relpath(os.path.join(d, f), path), os.path.getsize(os.path.join(d, f)))
                for d, _, fs in os.walk(path) for f in fs)


def test_converter_cli_refuses_in_one_line_and_writes_nothing(tmp_path):
  out = tmp_path / 'w'
  out.mkdir()
  _safetensors(out / 'keep.safetensors', {'a': np.ones(1, np.float32)})
  before = _tree(out)
  (tmp_path / 'cut.pth').write_bytes(open(_legacy_pth(tmp_path / 'g.pth'), 'rb').read()[:-10])
  index = tmp_path / 'model.safetensors.index.json'
  index.write_text(json.dumps({'weight_map': {'a': '../../../etc/passwd'}}))
  env = dict(os.environ, VISIM_JAX_WEIGHTS=str(out), JAX_PLATFORMS='cpu', PYTHONPATH=ROOT)
  r = subprocess.run([sys.executable, '-m', 'visim_jax.backbones.convert', '--backbone=resnet18',
                      f'--checkpoint={index}'], env=env, capture_output=True, text=True, cwd=str(tmp_path))
  lines = r.stderr.strip().splitlines()
  assert r.returncode == 1 and len(lines) == 1 and 'Traceback' not in r.stderr, r.stderr[-2000:]
  assert lines[0].startswith(f"error: {index}: weight_map['a']: shard '../../../etc/passwd' leads outside"), lines
  assert _tree(out) == before
  from visim_jax.backbones import convert_clip                                  # the older CLI: one line too
  assert convert_clip.main(['--input', str(tmp_path / 'cut.pth'), '--output', str(out / 'x.safetensors')]) == 1
  assert _tree(out) == before


# --------------------------------------------------------------------------------------------- import graph

def test_lpips_channels_are_the_trunks_widths():
  from visim_jax.backbones import alexnet, vgg
  assert packaged.lin_channels('lpips_alex') == tuple(c[0] for c in alexnet.CONVS)
  assert packaged.lin_channels('lpips_vgg') == tuple(b[-1] for b in vgg.BLOCKS)
