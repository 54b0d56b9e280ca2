"""EfficientNet B0-B3 (gen-efficientnet / timm layout) in Flax vs a minimal PyTorch EfficientNet written here.

The reference is written for this test from Tan & Le 2019 (Table 1: the B0 stages; MBConv = 1x1 expansion, depthwise
conv, squeeze-excite, 1x1 projection, residual when shapes allow; Swish) with gen-efficientnet's conventions:
symmetric k // 2 padding, BatchNorm eps 1e-5, SE reduced to in_chs / 4 with Swish, the first stage a
depthwise-separable block. Module names follow the geffnet / timm state dicts (`blocks.1.0.conv_pw.weight`).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from torch_init import assert_stages_close, randomise, run_both
from visim_jax.backbones import efficientnet as effnet
from visim_jax.backbones import convert, get_backbone, registry
from visim_jax.backbones.efficientnet_lite import depthwise_conv
from visim_jax.core.errors import UserError

torch = pytest.importorskip('torch')
nn = torch.nn
F = torch.nn.functional


class RefSE(nn.Module):

  def __init__(self, chs, reduced):
    super().__init__()
    self.conv_reduce, self.conv_expand = nn.Conv2d(chs, reduced, 1), nn.Conv2d(reduced, chs, 1)

  def forward(self, x):
    s = self.conv_expand(F.silu(self.conv_reduce(x.mean((2, 3), keepdim=True))))
    return x * torch.sigmoid(s)


def _dw(chs, k, stride):
  return nn.Conv2d(chs, chs, k, stride, padding=k // 2, groups=chs, bias=False)


class RefDS(nn.Module):

  def __init__(self, b):
    super().__init__()
    self.b = b
    self.conv_dw, self.bn1 = _dw(b.in_chs, b.kernel, b.stride), nn.BatchNorm2d(b.in_chs)
    self.se = RefSE(b.in_chs, b.se_chs)
    self.conv_pw, self.bn2 = nn.Conv2d(b.in_chs, b.out_chs, 1, bias=False), nn.BatchNorm2d(b.out_chs)

  def forward(self, x):
    y = self.bn2(self.conv_pw(self.se(F.silu(self.bn1(self.conv_dw(x))))))
    return y + x if self.b.stride == 1 and self.b.in_chs == self.b.out_chs else y


class RefIR(nn.Module):

  def __init__(self, b):
    super().__init__()
    self.b = b
    self.conv_pw, self.bn1 = nn.Conv2d(b.in_chs, b.mid_chs, 1, bias=False), nn.BatchNorm2d(b.mid_chs)
    self.conv_dw, self.bn2 = _dw(b.mid_chs, b.kernel, b.stride), nn.BatchNorm2d(b.mid_chs)
    self.se = RefSE(b.mid_chs, b.se_chs)
    self.conv_pwl, self.bn3 = nn.Conv2d(b.mid_chs, b.out_chs, 1, bias=False), nn.BatchNorm2d(b.out_chs)

  def forward(self, x):
    y = F.silu(self.bn1(self.conv_pw(x)))
    y = self.bn3(self.conv_pwl(self.se(F.silu(self.bn2(self.conv_dw(y))))))
    return y + x if self.b.stride == 1 and self.b.in_chs == self.b.out_chs else y


class RefEfficientNet(nn.Module):

  def __init__(self, arch):
    super().__init__()
    stem, head = effnet.stem_channels(arch), effnet.head_channels(arch)
    self.conv_stem, self.bn1 = nn.Conv2d(3, stem, 3, 2, padding=1, bias=False), nn.BatchNorm2d(stem)
    specs = effnet.block_specs(arch)
    self.blocks = nn.Sequential(*[nn.Sequential(*[(RefDS if b.kind == 'ds' else RefIR)(b) for b in stage])
                                  for stage in specs])
    self.conv_head = nn.Conv2d(specs[-1][-1].out_chs, head, 1, bias=False)
    self.bn2 = nn.BatchNorm2d(head)
    self.global_pool = nn.AdaptiveAvgPool2d(1)
    self.classifier = nn.Linear(head, 10)  # the ImageNet classifier (the converter drops it)

  def forward(self, x):
    x = F.silu(self.bn1(self.conv_stem(x)))
    stages = {'stem': x}
    for i, stage in enumerate(self.blocks):
      x = stage(x)
      stages[f'block{i + 1}'] = x
    stages['head'] = F.silu(self.bn2(self.conv_head(x)))
    return self.classifier(self.global_pool(stages['head']).flatten(1)), stages


def test_parity_with_pytorch_reference_through_the_converter(tmp_path):
  ref = randomise(RefEfficientNet(effnet.TINY), 0)
  torch.save({f'module.{k}': v for k, v in ref.state_dict().items()}, tmp_path / 'tiny.pth')
  info = convert.convert('efficientnet_b2', str(tmp_path / 'tiny.pth'), str(tmp_path / 'tiny.safetensors'), tiny=True)
  assert info['num_tensors'] == sum(1 for k in ref.state_dict()
                                    if not k.startswith('classifier.') and not k.endswith('num_batches_tracked'))
  backbone = get_backbone('efficientnet_b2', weights=str(tmp_path / 'tiny.safetensors'), tiny=True)
  assert backbone.layers == ('head',) and backbone.weights_id == info['sha256']
  final, stages, want = run_both(backbone, lambda x: ref(x)[1], 32)
  assert_stages_close(stages, want)
  np.testing.assert_allclose(final, want['head'].mean((1, 2)), atol=1e-4, rtol=1e-4)


def test_depthwise_symmetric_padding_both_implementations():
  rng = np.random.RandomState(0)
  for k, s, h in ((3, 2, 8), (5, 2, 9)):
    x = rng.randn(2, h, h + 1, 4).astype(np.float32)
    w = rng.randn(k, k, 1, 4).astype(np.float32)
    pad = ((k // 2, k // 2), (k // 2, k // 2))
    a = depthwise_conv(jnp.asarray(x), jnp.asarray(w), s, 'conv', pad)
    b = depthwise_conv(jnp.asarray(x), jnp.asarray(w), s, 'shifted', pad)
    with torch.no_grad():
      want = F.conv2d(torch.from_numpy(x.transpose(0, 3, 1, 2)), torch.from_numpy(w.transpose(3, 2, 0, 1)),
                      stride=s, padding=k // 2, groups=4).numpy().transpose(0, 2, 3, 1)
    np.testing.assert_allclose(np.asarray(a), want, atol=1e-5)
    np.testing.assert_allclose(np.asarray(b), want, atol=1e-5)


def test_converter_keys_and_refusals(tmp_path):
  sd = RefEfficientNet(effnet.TINY).state_dict()
  tensors, _ = effnet.prepare_state_dict('efficientnet_b0', {k: v.numpy() for k, v in sd.items()}, 'x', tiny=True)
  variables = effnet.to_flax(tensors)
  p, stats = variables['params'], variables['batch_stats']
  np.testing.assert_array_equal(p['blocks_3_1']['conv_dw']['kernel'],
                                sd['blocks.3.1.conv_dw.weight'].numpy().transpose(2, 3, 1, 0))
  np.testing.assert_array_equal(p['blocks_0_0']['se']['conv_reduce']['bias'],
                                sd['blocks.0.0.se.conv_reduce.bias'].numpy())
  np.testing.assert_array_equal(stats['bn2']['var'], sd['bn2.running_var'].numpy())
  assert 'classifier' not in p
  torch.save({**sd, 'head.fc.weight': torch.zeros(2, 2)}, tmp_path / 'x.pth')
  with pytest.raises(UserError, match='x.pth: unexpected module .head.fc'):
    convert.convert('efficientnet_b0', str(tmp_path / 'x.pth'), str(tmp_path / 'o.safetensors'), tiny=True)
  # the tiny checkpoint for the full-size B3: the shape check names the file; nothing is written
  torch.save(sd, tmp_path / 't.pth')
  with pytest.raises(UserError, match='t.pth: the weights do not fit efficientnet_b3'):
    convert.convert('efficientnet_b3', str(tmp_path / 't.pth'), str(tmp_path / 'o.safetensors'))
  assert not (tmp_path / 'o.safetensors').exists()


def test_full_size_members_match_table1():
  """Paper 001 Table 1 'Concatenated Size' (head) by shape inference (abstract=True); parameter counts + the
  classifier = timm's / geffnet's (5,288,548, 7,794,184, 9,109,994, 12,233,232)."""
  for name, dims, n_params in (('efficientnet_b0', 1280, 5_288_548), ('efficientnet_b1', 1280, 7_794_184),
                               ('efficientnet_b2', 1408, 9_109_994), ('efficientnet_b3', 1536, 12_233_232)):
    assert registry.pooled_dim(name) == dims, name
    shapes = effnet.variable_shapes(effnet.ARCHS[name])
    n = sum(int(np.prod(s.shape)) for s in jax.tree.leaves(shapes['params']))
    assert n + dims * 1000 + 1000 == n_params, name
    pre = get_backbone(name, abstract=True).preprocess
    assert (pre.size, pre.resize, pre.interpolation) == (224, 'squash', 'torch_bilinear'), name
  native = get_backbone('efficientnet_b3', abstract=True, preprocessing='native').preprocess
  assert (native.size, native.resize_to, native.interpolation) == (300, 331, 'bicubic')
