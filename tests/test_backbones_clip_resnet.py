"""CLIP ModifiedResNet in Flax vs a minimal PyTorch reference written here, and the checkpoint converter.

The reference below is written for this test from the architecture described in the CLIP paper (Radford et al.
2021, Sec. 2.4) and OpenAI's model card: three-conv stem + average pool, bottlenecks whose stride is an average
pool before the last 1x1 conv (shortcut: avgpool, 1x1 conv, BN), attention pooling with the mean token as query
(torch's own multi-head attention with separate q/k/v projections). Parameter names follow OpenAI's state dicts.
"""
import collections
import json
import os

import numpy as np
import pytest

from torch_init import assert_stages_close, randomise, run_both
from visim_jax.backbones import features
from visim_jax.backbones import clip_resnet, convert_clip, get_backbone

torch = pytest.importorskip('torch')
pytestmark = pytest.mark.filterwarnings('ignore::torch.jit.TracerWarning')
nn = torch.nn
F = torch.nn.functional


class RefBottleneck(nn.Module):

  def __init__(self, inplanes, planes, stride):
    super().__init__()
    self.conv1, self.bn1 = nn.Conv2d(inplanes, planes, 1, bias=False), nn.BatchNorm2d(planes)
    self.conv2, self.bn2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False), nn.BatchNorm2d(planes)
    self.pool = nn.AvgPool2d(stride) if stride > 1 else nn.Identity()
    self.conv3, self.bn3 = nn.Conv2d(planes, planes * 4, 1, bias=False), nn.BatchNorm2d(planes * 4)
    self.downsample = None
    if stride > 1 or inplanes != planes * 4:
      self.downsample = nn.Sequential(collections.OrderedDict([
          ('-1', nn.AvgPool2d(stride)), ('0', nn.Conv2d(inplanes, planes * 4, 1, bias=False)),
          ('1', nn.BatchNorm2d(planes * 4))]))

  def forward(self, x):
    out = F.relu(self.bn1(self.conv1(x)))
    out = F.relu(self.bn2(self.conv2(out)))
    out = self.bn3(self.conv3(self.pool(out)))
    return F.relu(out + (x if self.downsample is None else self.downsample(x)))


class RefAttentionPool(nn.Module):

  def __init__(self, grid, dim, heads, output_dim):
    super().__init__()
    self.positional_embedding = nn.Parameter(torch.randn(grid * grid + 1, dim) / dim ** 0.5)
    self.q_proj, self.k_proj, self.v_proj = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
    self.c_proj = nn.Linear(dim, output_dim)
    self.heads = heads

  def forward(self, x):
    x = x.flatten(start_dim=2).permute(2, 0, 1)  # (HW, N, C)
    x = torch.cat([x.mean(dim=0, keepdim=True), x], dim=0) + self.positional_embedding[:, None, :]
    out, _ = F.multi_head_attention_forward(
        query=x[:1], key=x, value=x, embed_dim_to_check=x.shape[-1], num_heads=self.heads,
        q_proj_weight=self.q_proj.weight, k_proj_weight=self.k_proj.weight, v_proj_weight=self.v_proj.weight,
        in_proj_weight=None, in_proj_bias=torch.cat([self.q_proj.bias, self.k_proj.bias, self.v_proj.bias]),
        bias_k=None, bias_v=None, add_zero_attn=False, dropout_p=0.0, out_proj_weight=self.c_proj.weight,
        out_proj_bias=self.c_proj.bias, use_separate_proj_weight=True, training=False, need_weights=False)
    return out[0]


class RefModifiedResNet(nn.Module):

  def __init__(self, layers, width, output_dim, image_size):
    super().__init__()
    self.conv1, self.bn1 = nn.Conv2d(3, width // 2, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(width // 2)
    self.conv2, self.bn2 = nn.Conv2d(width // 2, width // 2, 3, padding=1, bias=False), nn.BatchNorm2d(width // 2)
    self.conv3, self.bn3 = nn.Conv2d(width // 2, width, 3, padding=1, bias=False), nn.BatchNorm2d(width)
    inplanes = width
    for i, n in enumerate(layers):
      planes = width * 2 ** i
      blocks = []
      for j in range(n):
        blocks.append(RefBottleneck(inplanes, planes, (1 if i == 0 else 2) if j == 0 else 1))
        inplanes = planes * 4
      setattr(self, f'layer{i + 1}', nn.Sequential(*blocks))
    self.attnpool = RefAttentionPool(image_size // 32, width * 32, width * 32 // 64, output_dim)

  def forward(self, x):
    stages = {}
    x = F.relu(self.bn1(self.conv1(x)))
    x = F.relu(self.bn2(self.conv2(x)))
    x = F.avg_pool2d(F.relu(self.bn3(self.conv3(x))), 2)
    stages['stem'] = x
    for i in range(1, 5):
      x = getattr(self, f'layer{i}')(x)
      stages[f'stage{i}'] = x
    stages['attnpool'] = self.attnpool(x)
    return stages


class RefCLIP(nn.Module):
  """Holds the image tower as `visual` (and a text-side parameter), like OpenAI's CLIP state dicts."""

  def __init__(self, arch):
    super().__init__()
    self.visual = RefModifiedResNet(arch.layers, arch.width, arch.output_dim, arch.image_size)
    self.logit_scale = nn.Parameter(torch.ones([]))

  def forward(self, x):
    return self.visual(x)['attnpool']


def test_parity_with_pytorch_reference(tmp_path):
  arch = clip_resnet.TINY
  ref = randomise(RefCLIP(arch), 0, small=('positional',))
  ckpt = tmp_path / 'tiny.pt'
  torch.save(ref.state_dict(), ckpt)
  info = convert_clip.convert(str(ckpt), str(tmp_path / 'tiny.safetensors'))
  assert info['architecture']['layers'] == list(arch.layers) and info['name'] is None

  backbone = get_backbone('clip_rn50', weights=str(tmp_path / 'tiny.safetensors'), tiny=True)
  final, stages, want = run_both(backbone, ref.visual, arch.image_size)
  assert_stages_close(stages, want)
  np.testing.assert_allclose(final, want['attnpool'], atol=1e-4, rtol=1e-4)

  # the same weights from a TorchScript archive (the format of OpenAI's downloads)
  traced = torch.jit.trace(ref, torch.zeros(1, 3, arch.image_size, arch.image_size))
  traced.save(str(tmp_path / 'tiny_jit.pt'))
  info2 = convert_clip.convert(str(tmp_path / 'tiny_jit.pt'), str(tmp_path / 'tiny_jit.safetensors'))
  assert info2['source_format'] == 'torchscript'
  a = clip_resnet.read_weights(str(tmp_path / 'tiny.safetensors'))
  b = clip_resnet.read_weights(str(tmp_path / 'tiny_jit.safetensors'))
  assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)


def test_converter_round_trips_openai_rn50(tmp_path):
  arch = clip_resnet.ARCHS['clip_rn50']
  ref = RefCLIP(arch).half()  # OpenAI's checkpoints hold fp16 weights
  sd = ref.state_dict()
  assert all(k.startswith('visual.') for k in sd if k != 'logit_scale')
  torch.save(sd, tmp_path / 'RN50.pt')
  out = tmp_path / 'weights' / 'clip_rn50.safetensors'
  assert convert_clip.main(['--input', str(tmp_path / 'RN50.pt'), '--output', str(out), '--name', 'clip_rn50']) == 0
  info = json.loads((tmp_path / 'weights' / 'clip_rn50.safetensors.json').read_text())
  assert info['name'] == 'clip_rn50' and info['architecture']['heads'] == 32 and len(info['sha256']) == 64

  backbone = get_backbone('clip_rn50', weights=str(out))
  assert backbone.weights_id == info['sha256']
  params, stats = backbone.variables['params'], backbone.variables['batch_stats']
  conv = sd['visual.layer3.5.conv2.weight'].float().numpy()
  np.testing.assert_array_equal(params['layer3_5']['conv2']['kernel'], conv.transpose(2, 3, 1, 0))
  np.testing.assert_array_equal(params['layer2_0']['downsample_bn']['scale'],
                                sd['visual.layer2.0.downsample.1.weight'].float().numpy())
  np.testing.assert_array_equal(stats['layer4_0']['downsample_bn']['var'],
                                sd['visual.layer4.0.downsample.1.running_var'].float().numpy())
  np.testing.assert_array_equal(params['attnpool']['q_proj']['kernel'], sd['visual.attnpool.q_proj.weight'].float().numpy().T)
  np.testing.assert_array_equal(params['attnpool']['positional_embedding'],
                                sd['visual.attnpool.positional_embedding'].float().numpy())
  assert sum(features.layer_dims(backbone, backbone.layers).values()) == 4864  # paper 001 Table 1

  # wrong architecture and corrupted files fail loudly
  with pytest.raises(ValueError, match='different CLIP ResNet'):
    get_backbone('clip_rn101', weights=str(out))
  with open(out, 'r+b') as f:
    f.seek(-8, os.SEEK_END)
    f.write(b'\0' * 8)
  with pytest.raises(ValueError, match='sha256'):
    get_backbone('clip_rn50', weights=str(out))
