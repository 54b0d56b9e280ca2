"""The one converter CLI (backbones/convert.py): every family's public checkpoint -> safetensors + sha256 sidecar in
the offline weights folder, through the restricted unpickler; CLIP through the same command; clear refusals."""
import json
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

from visim_jax.backbones import alexnet, convert, get_backbone, registry, weights
from visim_jax.core.errors import UserError

torch = pytest.importorskip('torch')


def _alexnet_sd(seed=0):
  """A full-size torchvision AlexNet state dict (public key names) with random values, classifier included."""
  g = np.random.default_rng(seed)
  sd, cin = {}, 3
  for i, (c, k, _, _, _) in zip(alexnet.TORCH_INDEX, alexnet.CONVS):
    sd[f'features.{i}.weight'] = torch.from_numpy((g.standard_normal((c, cin, k, k)) / k / np.sqrt(cin)).astype(np.float32))
    sd[f'features.{i}.bias'] = torch.from_numpy(0.1 * g.standard_normal(c, dtype=np.float32))
    cin = c
  for i, (o, n) in zip((1, 4, 6), ((64, 9216), (64, 64), (10, 64))):  # a shrunken classifier: dropped anyway
    sd[f'classifier.{i}.weight'], sd[f'classifier.{i}.bias'] = torch.zeros(o, n), torch.zeros(o)
  return sd


def test_cli_writes_the_default_location_and_the_backbone_loads_it(tmp_path):
  torch.save(_alexnet_sd(), tmp_path / 'alexnet-owt-7be5be79.pth')
  env = dict(os.environ, VISIM_JAX_WEIGHTS=str(tmp_path / 'w'), JAX_PLATFORMS='cpu')
  r = subprocess.run([sys.executable, '-m', 'visim_jax.backbones.convert', '--backbone=alexnet',
                      f'--checkpoint={tmp_path / "alexnet-owt-7be5be79.pth"}'], env=env, capture_output=True, text=True)
  assert r.returncode == 0, r.stderr[-2000:]
  out = tmp_path / 'w' / 'alexnet.safetensors'
  info = json.loads((tmp_path / 'w' / 'alexnet.safetensors.json').read_text())
  assert json.loads(r.stdout) == info
  assert info['backbone'] == 'alexnet' and info['num_tensors'] == 10 and info['source_format'] == 'state_dict'
  assert info['sha256'] == weights.check_sidecar(str(out))
  b = get_backbone('alexnet', weights=str(out))
  assert b.weights_id == info['sha256']
  np.testing.assert_array_equal(b.variables['params']['conv4']['kernel'],
                                _alexnet_sd()['features.8.weight'].numpy().transpose(2, 3, 1, 0))

  # one-line errors, nothing written: a name without a converter, a missing file
  r = subprocess.run([sys.executable, '-m', 'visim_jax.backbones.convert', '--backbone=resnet50',
                      f'--checkpoint={tmp_path / "missing.pth"}'], env=env, capture_output=True, text=True)
  assert r.returncode == 1 and r.stderr.strip().splitlines()[-1].startswith('error: --checkpoint')
  assert not (tmp_path / 'w' / 'resnet50.safetensors').exists()


def test_dispatch_table_and_refusals(tmp_path):
  for name in ('resnet50', 'barlow', 'bit_m_r152x4', 'alexnet', 'clip_rn50'):
    assert registry.target(name).split(':')[0] in convert.FAMILIES
  with pytest.raises(UserError, match='has no converter'):
    convert.convert('dinov2_s14', str(tmp_path / 'x.pth'))

  class Evil:
    def __reduce__(self):
      return (os.system, ('echo pwned',))
  with open(tmp_path / 'evil.pth', 'wb') as f:
    pickle.dump({'features.0.weight': Evil()}, f)
  with pytest.raises(UserError, match='restricted unpickler'):
    convert.convert('alexnet', str(tmp_path / 'evil.pth'), str(tmp_path / 'o.safetensors'))
  with pytest.raises(UserError, match='must end with .safetensors'):
    torch.save(_alexnet_sd(), tmp_path / 'a.pth')
    convert.convert('alexnet', str(tmp_path / 'a.pth'), str(tmp_path / 'o.bin'))
  assert not any(p.name.startswith('o.') for p in tmp_path.iterdir())

  # a training checkpoint that wraps the state dict once more ({'model': ..., 'epoch': ...}) converts too
  torch.save({'model': _alexnet_sd(), 'epoch': 3}, tmp_path / 'wrapped.pth')
  assert convert.convert('alexnet', str(tmp_path / 'wrapped.pth'), str(tmp_path / 'wr.safetensors'))['num_tensors'] == 10

  # a corrupted converted file is refused at load (sidecar sha256)
  convert.convert('alexnet', str(tmp_path / 'a.pth'), str(tmp_path / 'a.safetensors'))
  with open(tmp_path / 'a.safetensors', 'r+b') as f:
    f.seek(-4, os.SEEK_END)
    f.write(b'\0\0\0\1')
  with pytest.raises(UserError, match='sha256'):
    get_backbone('alexnet', weights=str(tmp_path / 'a.safetensors'))


def test_clip_converts_through_the_same_command(tmp_path):
  """A CLIP ResNet state dict (OpenAI `visual.` names) goes through convert.py and loads as before."""
  from test_backbones_clip_resnet import RefCLIP  # the PyTorch ModifiedResNet written for the CLIP parity test
  from visim_jax.backbones import clip_resnet
  arch = clip_resnet.TINY
  sd = RefCLIP(arch).state_dict()
  torch.save(sd, tmp_path / 'tiny.pt')
  info = convert.convert('clip_rn50', str(tmp_path / 'tiny.pt'), str(tmp_path / 'c.safetensors'), tiny=True)
  assert info['architecture']['width'] == arch.width and info['backbone'] == 'clip_rn50'
  loaded = get_backbone('clip_rn50', weights=str(tmp_path / 'c.safetensors'), tiny=True)
  assert loaded.weights_id == info['sha256']
  np.testing.assert_array_equal(loaded.variables['params']['attnpool']['q_proj']['kernel'],
                                sd['visual.attnpool.q_proj.weight'].numpy().T)
  with pytest.raises(UserError, match='not clip_rn101'):
    convert.convert('clip_rn101', str(tmp_path / 'tiny.pt'), str(tmp_path / 'd.safetensors'))


def test_vgg16_converts_through_the_same_command(tmp_path):
  from visim_jax.backbones import vgg
  sd, cin, i = {}, 3, 0
  for block in vgg.TINY_BLOCKS:  # torchvision's features.* indices: conv, relu per layer, a max pool per block
    for c in block:
      sd[f'features.{i}.weight'], sd[f'features.{i}.bias'] = torch.randn(c, cin, 3, 3), torch.randn(c)
      cin, i = c, i + 2
    i += 1
  sd['classifier.0.weight'] = torch.zeros(4, 4)
  torch.save(sd, tmp_path / 'vgg.pth')
  info = convert.convert('vgg16', str(tmp_path / 'vgg.pth'), str(tmp_path / 'v.safetensors'), tiny=True)
  assert info['num_tensors'] == 26
  b = get_backbone('vgg16', weights=str(tmp_path / 'v.safetensors'), tiny=True)
  np.testing.assert_array_equal(b.variables['params']['features_28']['kernel'],
                                sd['features.28.weight'].numpy().transpose(2, 3, 1, 0))
  with pytest.raises(UserError, match='do not fit vgg16'):
    convert.convert('vgg16', str(tmp_path / 'vgg.pth'), str(tmp_path / 'w.safetensors'))  # tiny file, full name
