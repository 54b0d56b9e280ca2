"""FaceNet Inception-ResNet-v1 in Flax vs a minimal PyTorch Inception-ResNet-v1 written here, and its weights.

The reference is written for this test from Szegedy et al. 2017 (Sec. 3.2 and its figures: the Inception-ResNet-v1
stem, Inception-ResNet-A/B/C blocks with scaled residuals 0.17 / 0.10 / 0.20, reductions A and B), with BatchNorm
eps 1e-3 and the 512-d bottleneck + L2 of FaceNet; module names follow facenet-pytorch's state dict
(`repeat_1.0.branch1.1.conv.weight`, `mixed_7a.branch0.0.bn.running_var`, `block8.conv2d.bias`, `last_bn.*`).
Channel counts are divided by `Arch.div` (8 in the tiny config).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from torch_init import assert_stages_close, randomise, run_both
from visim_jax.backbones import convert, get_backbone, registry
from visim_jax.backbones import inception_resnet_v1 as irv1
from visim_jax.core.errors import UserError

torch = pytest.importorskip('torch')
nn = torch.nn
F = torch.nn.functional


class Conv(nn.Module):
  """conv (no bias) + BN (eps 1e-3) + ReLU, as facenet-pytorch's BasicConv2d (`.conv`, `.bn`)."""

  def __init__(self, cin, cout, k, stride=1, padding=0):
    super().__init__()
    self.conv = nn.Conv2d(cin, cout, k, stride, padding, bias=False)
    self.bn = nn.BatchNorm2d(cout, eps=1e-3)

  def forward(self, x):
    return F.relu(self.bn(self.conv(x)))


def _seq(*mods):
  return nn.Sequential(*mods)


class Residual(nn.Module):
  """Inception-ResNet block: branches concatenated, 1x1 conv (bias) back to `chs`, x + scale * that, ReLU."""

  def __init__(self, chs, branches, mixed, scale, relu=True):
    super().__init__()
    for i, b in enumerate(branches):
      setattr(self, f'branch{i}', b)
    self.n, self.scale, self.relu = len(branches), scale, relu
    self.conv2d = nn.Conv2d(mixed, chs, 1)

  def forward(self, x):
    out = self.conv2d(torch.cat([getattr(self, f'branch{i}')(x) for i in range(self.n)], 1)) * self.scale + x
    return F.relu(out) if self.relu else out


def block35(d):
  c = 256 // d
  return Residual(c, [Conv(c, 32 // d, 1), _seq(Conv(c, 32 // d, 1), Conv(32 // d, 32 // d, 3, padding=1)),
                      _seq(Conv(c, 32 // d, 1), Conv(32 // d, 32 // d, 3, padding=1),
                           Conv(32 // d, 32 // d, 3, padding=1))], 96 // d, 0.17)


def block17(d):
  c, b = 896 // d, 128 // d
  return Residual(c, [Conv(c, b, 1), _seq(Conv(c, b, 1), Conv(b, b, (1, 7), padding=(0, 3)),
                                           Conv(b, b, (7, 1), padding=(3, 0)))], 256 // d, 0.10)


def block8(d, scale=0.20, relu=True):
  c, b = 1792 // d, 192 // d
  return Residual(c, [Conv(c, b, 1), _seq(Conv(c, b, 1), Conv(b, b, (1, 3), padding=(0, 1)),
                                           Conv(b, b, (3, 1), padding=(1, 0)))], 384 // d, scale, relu)


class Mixed(nn.Module):
  """Reduction block: strided branches and a 3x3/2 max pool, concatenated."""

  def __init__(self, branches):
    super().__init__()
    for i, b in enumerate(branches):
      setattr(self, f'branch{i}', b)
    self.n = len(branches)

  def forward(self, x):
    return torch.cat([getattr(self, f'branch{i}')(x) for i in range(self.n)] + [F.max_pool2d(x, 3, 2)], 1)


class RefInceptionResnetV1(nn.Module):

  def __init__(self, arch, classes=0):
    super().__init__()
    d = arch.div
    self.conv2d_1a, self.conv2d_2a = Conv(3, 32 // d, 3, 2), Conv(32 // d, 32 // d, 3)
    self.conv2d_2b = Conv(32 // d, 64 // d, 3, padding=1)
    self.conv2d_3b, self.conv2d_4a = Conv(64 // d, 80 // d, 1), Conv(80 // d, 192 // d, 3)
    self.conv2d_4b = Conv(192 // d, 256 // d, 3, 2)
    self.repeat_1 = _seq(*[block35(d) for _ in range(arch.repeats[0])])
    c = 256 // d
    self.mixed_6a = Mixed([Conv(c, 384 // d, 3, 2), _seq(Conv(c, 192 // d, 1), Conv(192 // d, 192 // d, 3, padding=1),
                                                         Conv(192 // d, 256 // d, 3, 2))])
    self.repeat_2 = _seq(*[block17(d) for _ in range(arch.repeats[1])])
    c = 896 // d
    self.mixed_7a = Mixed([_seq(Conv(c, 256 // d, 1), Conv(256 // d, 384 // d, 3, 2)),
                           _seq(Conv(c, 256 // d, 1), Conv(256 // d, 256 // d, 3, 2)),
                           _seq(Conv(c, 256 // d, 1), Conv(256 // d, 256 // d, 3, padding=1),
                                Conv(256 // d, 256 // d, 3, 2))])
    self.repeat_3 = _seq(*[block8(d) for _ in range(arch.repeats[2])])
    self.block8 = block8(d, 1.0, relu=False)
    self.last_linear = nn.Linear(1792 // d, arch.embedding, bias=False)
    self.last_bn = nn.BatchNorm1d(arch.embedding, eps=1e-3)
    if classes:
      self.logits = nn.Linear(arch.embedding, classes)

  def forward(self, x):
    for m in (self.conv2d_1a, self.conv2d_2a, self.conv2d_2b):
      x = m(x)
    x = F.max_pool2d(x, 3, 2)
    for m in (self.conv2d_3b, self.conv2d_4a, self.conv2d_4b):
      x = m(x)
    stages = {'conv2d_4b': x}
    for name in ('repeat_1', 'mixed_6a', 'repeat_2', 'mixed_7a', 'repeat_3', 'block8'):
      x = stages[name] = getattr(self, name)(x)
    e = self.last_bn(self.last_linear(x.mean((2, 3))))
    stages['embedding'] = F.normalize(e, dim=1)
    return stages


def test_parity_with_pytorch_reference_through_the_converter(tmp_path):
  arch = irv1.TINY
  ref = randomise(RefInceptionResnetV1(arch, classes=7), 0)
  torch.save(ref.state_dict(), tmp_path / 'tiny.pt')
  info = convert.convert('facenet', str(tmp_path / 'tiny.pt'), str(tmp_path / 'tiny.safetensors'), tiny=True)
  assert info['num_tensors'] == sum(1 for k in ref.state_dict()
                                    if not k.startswith('logits.') and not k.endswith('num_batches_tracked'))
  backbone = get_backbone('facenet', weights=str(tmp_path / 'tiny.safetensors'), tiny=True)
  assert backbone.layers == ('block8',) and backbone.preprocess.size == arch.image_size
  final, stages, want = run_both(backbone, ref, arch.image_size)
  assert stages['block8'].shape[1:3] == (2, 2)
  assert_stages_close(stages, want)
  np.testing.assert_allclose(final, want['embedding'], atol=1e-4, rtol=1e-4)


def test_converter_keys_and_refusals(tmp_path, monkeypatch):
  sd = RefInceptionResnetV1(irv1.TINY, classes=7).state_dict()
  tensors, _ = irv1.prepare_state_dict('facenet', {k: v.numpy() for k, v in sd.items()}, 'x', tiny=True)
  variables = irv1.to_flax(tensors)
  p, stats = variables['params'], variables['batch_stats']
  assert 'logits' not in p
  np.testing.assert_array_equal(p['repeat_1_0']['branch2_2']['conv']['kernel'],
                                sd['repeat_1.0.branch2.2.conv.weight'].numpy().transpose(2, 3, 1, 0))
  np.testing.assert_array_equal(stats['mixed_7a']['branch0_1']['bn']['var'],
                                sd['mixed_7a.branch0.1.bn.running_var'].numpy())
  np.testing.assert_array_equal(p['block8']['conv2d']['bias'], sd['block8.conv2d.bias'].numpy())
  np.testing.assert_array_equal(p['last_linear']['kernel'], sd['last_linear.weight'].numpy().T)
  # the tiny checkpoint for the full-size member: the shape check names the file; nothing is written
  torch.save(sd, tmp_path / 't.pt')
  with pytest.raises(UserError, match='t.pt: the weights do not fit facenet'):
    convert.convert('facenet', str(tmp_path / 't.pt'), str(tmp_path / 'o.safetensors'))
  assert not (tmp_path / 'o.safetensors').exists()
  monkeypatch.setenv('VISIM_JAX_WEIGHTS', str(tmp_path / 'w'))
  with pytest.raises(UserError, match=r'facenet.safetensors.*convert --backbone=facenet'):
    get_backbone('facenet')


def test_full_size_matches_table1_and_reference_parameters():
  """Paper 001 Table 1: 1792-d (abstract=True: no weights made); parameter count equal to the full-size reference
  without its classifier; block8 at 5 x 5 for the seed's 224 px, 3 x 3 for facenet's own 160 px."""
  assert registry.pooled_dim('facenet') == 1792
  pre = get_backbone('facenet', abstract=True).preprocess
  assert (pre.size, pre.resize, pre.interpolation) == (224, 'squash', 'torch_bilinear')
  np.testing.assert_allclose(np.array(pre.mean) / 255, (0.485, 0.456, 0.406))
  native = get_backbone('facenet', abstract=True, preprocessing='native').preprocess
  assert (native.size, native.mean, native.std) == (160, (127.5,) * 3, (128.0,) * 3)
  shapes = irv1.variable_shapes(irv1.FULL)
  ref = RefInceptionResnetV1(irv1.FULL)
  n_ref = sum(p.numel() for p in ref.parameters()) + sum(
      b.numel() for n, b in ref.named_buffers() if not n.endswith('num_batches_tracked'))
  assert sum(int(np.prod(s.shape)) for s in jax.tree.leaves(shapes)) == n_ref
  for size, grid in ((224, 5), (160, 3)):
    final, stages = jax.eval_shape(lambda v, x: irv1.apply_facenet(irv1.FULL, v, x), shapes,
                                   jax.ShapeDtypeStruct((1, size, size, 3), jnp.float32))
    assert stages['block8'].shape == (1, grid, grid, 1792) and final.shape == (1, 512)
