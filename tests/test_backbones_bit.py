"""BiT-M ResNetV2 in Flax vs a minimal PyTorch reference written here (timm 0.4.5's layout and names), through the
converter from a timm-named state dict and from Google's original .npz naming."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from torch_init import randomise, run_both
from visim_jax.backbones import bit, convert, get_backbone, registry

torch = pytest.importorskip('torch')
nn = torch.nn
F = torch.nn.functional


class RefStdConv(nn.Conv2d):
  """Weight standardisation as timm 0.4.5's StdConv2d: (w - mean) / (std + 1e-5), biased std per out channel."""

  def forward(self, x):
    std, mean = torch.std_mean(self.weight, dim=[1, 2, 3], keepdim=True, unbiased=False)
    return F.conv2d(x, (self.weight - mean) / (std + 1e-5), None, self.stride, self.padding)


class RefGNAct(nn.GroupNorm):

  def forward(self, x):
    return F.relu(super().forward(x))


class RefDown(nn.Module):

  def __init__(self, cin, cout, stride):
    super().__init__()
    self.conv = RefStdConv(cin, cout, 1, stride, bias=False)


class RefBlock(nn.Module):

  def __init__(self, cin, cout, stride, project, groups):
    super().__init__()
    mid = cout // 4
    self.downsample = RefDown(cin, cout, stride) if project else None
    self.norm1, self.conv1 = RefGNAct(groups, cin, eps=1e-5), RefStdConv(cin, mid, 1, bias=False)
    self.norm2, self.conv2 = RefGNAct(groups, mid, eps=1e-5), RefStdConv(mid, mid, 3, stride, 1, bias=False)
    self.norm3, self.conv3 = RefGNAct(groups, mid, eps=1e-5), RefStdConv(mid, cout, 1, bias=False)

  def forward(self, x):
    xp = self.norm1(x)
    shortcut = x if self.downsample is None else self.downsample.conv(xp)
    return self.conv3(self.norm3(self.conv2(self.norm2(self.conv1(xp))))) + shortcut


class RefStage(nn.Module):

  def __init__(self, blocks):
    super().__init__()
    self.blocks = nn.Sequential(*blocks)

  def forward(self, x):
    return self.blocks(x)


class RefResNetV2(nn.Module):

  def __init__(self, arch, classes=11):
    super().__init__()
    stem = arch.base * arch.width
    self.stem = nn.Module()
    self.stem.conv = RefStdConv(3, stem, 7, 2, 3, bias=False)
    stages, cin = [], stem
    for i, n in enumerate(arch.layers):
      cout = arch.chans(i)
      stages.append(RefStage([RefBlock(cin if j == 0 else cout, cout, (1 if i == 0 else 2) if j == 0 else 1, j == 0,
                                       arch.gn_groups) for j in range(n)]))
      cin = cout
    self.stages = nn.Sequential(*stages)
    self.norm = RefGNAct(arch.gn_groups, cin, eps=1e-5)
    self.head = nn.Module()
    self.head.fc = nn.Conv2d(cin, classes, 1)

  def forward(self, x):
    out = {}
    x = F.max_pool2d(F.pad(self.stem.conv(x), (1, 1, 1, 1)), 3, 2)
    out['stem'] = x
    for i, stage in enumerate(self.stages):
      x = stage(x)
      out[f'stage{i + 1}'] = x
    out['norm'] = self.norm(x)
    out['pooled'] = out['norm'].mean(dim=(2, 3))
    return out


def _to_big_transfer_npz(sd):
  """timm names -> Google's BiT .npz names and TF layouts (HWIO): the inverse of timm's load_pretrained."""
  out = {}
  for k, v in sd.items():
    v = v.numpy()
    v = v.transpose(2, 3, 1, 0) if v.ndim == 4 else v
    if k == 'stem.conv.weight':
      out['resnet/root_block/standardized_conv2d/kernel'] = v
    elif k in ('norm.weight', 'norm.bias'):
      out[f'resnet/group_norm/{"gamma" if k.endswith("weight") else "beta"}'] = v
    elif k.startswith('head.fc.'):
      out[f'resnet/head/conv2d/{"kernel" if k.endswith("weight") else "bias"}'] = v
    else:
      _, s, _, b, *rest = k.split('.')
      unit = f'resnet/block{int(s) + 1}/unit{int(b) + 1:02d}/'
      if rest[0] == 'downsample':
        out[unit + 'a/proj/standardized_conv2d/kernel'] = v
      else:
        part = 'abc'[int(rest[0][-1]) - 1]
        what = ('standardized_conv2d/kernel' if rest[0].startswith('conv') else
                'group_norm/gamma' if rest[1] == 'weight' else 'group_norm/beta')
        out[unit + f'{part}/{what}'] = v
  return out


@pytest.mark.parametrize('name', ['bit_m_r50x1', 'bit_m_r152x4'])
def test_parity_with_pytorch_reference(name, tmp_path):
  arch = bit.tiny_arch(bit.MEMBERS[name][0])
  ref = randomise(RefResNetV2(arch), 0)
  torch.save(ref.state_dict(), tmp_path / 'bit.pth')
  info = convert.convert(name, str(tmp_path / 'bit.pth'), str(tmp_path / 'a.safetensors'), tiny=True)
  assert info['timm_name'] == bit.MEMBERS[name][1]
  b = get_backbone(name, weights=str(tmp_path / 'a.safetensors'), tiny=True)
  final, stages, want = run_both(b, ref, arch.image_size)
  assert sorted(stages) == sorted(want)
  for k, v in want.items():
    # weight-standardised convs have unit-variance kernels, so the un-normalised residual stream grows to ~10-30
    # here (as in the real network): float32 rounding of both sides is ~1e-5 of the stage's scale
    scale = max(1.0, float(np.abs(v).max()))
    np.testing.assert_allclose(stages[k], v, atol=1e-5 * scale, rtol=1e-4, err_msg=f'{name} {k}')
  np.testing.assert_allclose(final, want['pooled'], atol=1e-4, rtol=1e-4)

  # the same network from Google's original .npz naming (what storage.googleapis.com/bit_models serves)
  np.savez(tmp_path / 'BiT.npz', **_to_big_transfer_npz(ref.state_dict()))
  convert.convert(name, str(tmp_path / 'BiT.npz'), str(tmp_path / 'b.safetensors'), tiny=True)
  b2 = get_backbone(name, weights=str(tmp_path / 'b.safetensors'), tiny=True)
  for u, v in zip(jax.tree.leaves(b.variables), jax.tree.leaves(b2.variables)):
    np.testing.assert_array_equal(u, v)


def test_weight_standardisation_matches_a_plain_loop():
  w = np.random.default_rng(0).standard_normal((3, 3, 5, 4)).astype(np.float32)
  for variant in bit.WS_VARIANTS:
    got = np.asarray(bit.standardize(jnp.asarray(w), variant))
    want = np.empty_like(w)
    for o in range(w.shape[-1]):
      v = w[..., o].astype(np.float64)
      m, var = v.mean(), ((v - v.mean()) ** 2).mean()
      want[..., o] = (v - m) / (np.sqrt(var) + 1e-5) if variant == 'timm0.4.5' else (
          (v - m) / np.sqrt(var + (1e-8 if variant == 'timm' else 1e-10)))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=variant)


TABLE1 = {'bit_m_r50x1': 3840, 'bit_m_r50x3': 11520, 'bit_m_r101x1': 3840, 'bit_m_r101x3': 11520,
          'bit_m_r152x2': 7680, 'bit_m_r152x4': 15360}


def test_full_size_members_have_table1_sizes():
  for name, size in TABLE1.items():
    assert registry.pooled_dim(name) == size, name
  b = get_backbone('bit_m_r152x4', abstract=True)
  assert b.layers == ('stage1', 'stage2', 'stage3', 'norm') and b.preprocess.resize == 'squash'
  assert get_backbone('bit_m_r50x1', abstract=True, preprocess='bit').preprocess.mean == (127.5,) * 3
  # BiT-M R50x1 without its head: ~23.5M parameters (timm: 25.5M with the 1000-class head)
  n = sum(int(np.prod(v.shape)) for v in jax.tree.leaves(bit.variable_shapes(bit.MEMBERS['bit_m_r50x1'][0])))
  assert 23.4e6 < n < 23.6e6, n
