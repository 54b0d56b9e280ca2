"""timm / DINO ViTs in Flax vs a minimal PyTorch ViT written here, the weight loading, and Table 1's sizes.

The reference is written for this test from Dosovitskiy et al. 2021, Sec. 3.1, eq. 1-4 (patch embedding by a
p x p stride-p convolution, class token, learned positions, pre-norm blocks x + MSA(LN(x)), x + MLP(LN(x)) with
exact GELU, final LN, CLS token), with LayerNorm eps 1e-6 and qkv bias as timm's and DINO's ViTs; parameter names
follow their state dicts (`blocks.0.attn.qkv.weight`, `patch_embed.proj.weight`, `head.weight`, ...).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from torch_init import assert_stages_close, randomise, run_both
from visim_jax.backbones import convert, get_backbone, registry, vit
from visim_jax.core.errors import UserError

torch = pytest.importorskip('torch')
nn = torch.nn
F = torch.nn.functional


class RefAttention(nn.Module):

  def __init__(self, dim, heads):
    super().__init__()
    self.heads = heads
    self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

  def forward(self, x):
    n, t, c = x.shape
    hd = c // self.heads
    q, k, v = self.qkv(x).reshape(n, t, 3, self.heads, hd).permute(2, 0, 3, 1, 4)
    attn = torch.softmax(q @ k.transpose(-2, -1) / hd ** 0.5, dim=-1)
    return self.proj((attn @ v).transpose(1, 2).reshape(n, t, c))


class RefMlp(nn.Module):

  def __init__(self, dim, hidden):
    super().__init__()
    self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

  def forward(self, x):
    return self.fc2(F.gelu(self.fc1(x)))


class RefBlock(nn.Module):

  def __init__(self, dim, heads):
    super().__init__()
    self.norm1, self.norm2 = nn.LayerNorm(dim, eps=1e-6), nn.LayerNorm(dim, eps=1e-6)
    self.attn, self.mlp = RefAttention(dim, heads), RefMlp(dim, 4 * dim)

  def forward(self, x):
    x = x + self.attn(self.norm1(x))
    return x + self.mlp(self.norm2(x))


class RefPatchEmbed(nn.Module):

  def __init__(self, patch, dim):
    super().__init__()
    self.proj = nn.Conv2d(3, dim, patch, stride=patch)

  def forward(self, x):
    return self.proj(x).flatten(2).transpose(1, 2)


class RefViT(nn.Module):

  def __init__(self, arch, num_classes=0):
    super().__init__()
    grid = arch.image_size // arch.patch
    self.patch_embed = RefPatchEmbed(arch.patch, arch.width)
    self.cls_token = nn.Parameter(torch.zeros(1, 1, arch.width))
    self.pos_embed = nn.Parameter(torch.zeros(1, grid * grid + 1, arch.width))
    self.blocks = nn.ModuleList([RefBlock(arch.width, arch.heads) for _ in range(arch.depth)])
    self.norm = nn.LayerNorm(arch.width, eps=1e-6)
    # timm's ImageNet head (the converter drops it), or DINO's Identity: the module the seed code hooks
    self.head = nn.Linear(arch.width, num_classes) if num_classes else nn.Identity()

  def forward(self, x):
    x = self.patch_embed(x)
    x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
    stages = {'embeddings': x}
    for i, blk in enumerate(self.blocks):
      x = blk(x)
      stages[f'block{i + 1}'] = x
    stages['pooled'] = self.norm(x)[:, 0]
    stages['patch_mean'] = self.norm(x)[:, 1:].mean(1)
    self.head(stages['pooled'])
    return stages


def _parity(name, tmp_path, prefix=''):
  arch = vit.TINY
  ref = randomise(RefViT(arch, num_classes=10 if name == 'vit' else 0), 0, small=('cls_token', 'pos_embed'))
  ckpt = tmp_path / f'{name}.pth'
  torch.save({prefix + k: v for k, v in ref.state_dict().items()}, ckpt)
  out = tmp_path / f'{name}.safetensors'
  info = convert.convert(name, str(ckpt), str(out), tiny=True)
  assert info['num_tensors'] == sum(1 for k in ref.state_dict() if not k.startswith('head.'))
  backbone = get_backbone(name, weights=str(out), tiny=True)
  assert backbone.weights_id == info['sha256'] and backbone.layers == ('pooled',)
  final, stages, want = run_both(backbone, ref, arch.image_size)
  assert_stages_close(stages, want)
  np.testing.assert_allclose(final, want['pooled'], atol=1e-4, rtol=1e-4)
  return backbone, final


def test_parity_with_pytorch_reference_through_the_converter(tmp_path):
  """timm layout (with its ImageNet head, dropped by the converter) and a DINO training-style 'backbone.' save."""
  _parity('vit', tmp_path)
  backbone, f32 = _parity('dino_vitb8', tmp_path, prefix='backbone.')
  images = np.random.default_rng(1).integers(0, 256, (2, backbone.preprocess.size, backbone.preprocess.size, 3), dtype=np.uint8)
  bf16, _ = jax.jit(lambda x: backbone(x, jnp.bfloat16))(images)  # bf16 weights and activations, f32 softmax
  assert bf16.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(bf16, np.float32), f32, atol=0.1, rtol=0.05)


def test_converter_keys_and_refusals(tmp_path, monkeypatch):
  sd = RefViT(vit.TINY).state_dict()
  variables = vit.to_flax({k: v.numpy() for k, v in sd.items()})
  p = variables['params']
  np.testing.assert_array_equal(p['blocks_1']['attn']['qkv']['kernel'], sd['blocks.1.attn.qkv.weight'].numpy().T)
  np.testing.assert_array_equal(p['blocks_0']['fc2']['bias'], sd['blocks.0.mlp.fc2.bias'].numpy())
  np.testing.assert_array_equal(p['blocks_0']['norm2']['scale'], sd['blocks.0.norm2.weight'].numpy())
  np.testing.assert_array_equal(p['patch_embed']['kernel'],
                                sd['patch_embed.proj.weight'].numpy().transpose(2, 3, 1, 0))
  np.testing.assert_array_equal(p['pos_embed'], sd['pos_embed'].numpy())
  torch.save({**sd, 'pre_logits.fc.weight': torch.zeros(32, 32)}, tmp_path / 'in21k.pth')
  with pytest.raises(UserError, match='in21k.pth: unexpected module .pre_logits'):
    convert.convert('vit', str(tmp_path / 'in21k.pth'), str(tmp_path / 'o.safetensors'), tiny=True)
  # a ViT-S/16 checkpoint is not a ViT-B/16: nothing is written, the error names the file
  torch.save(sd, tmp_path / 'tiny.pth')
  with pytest.raises(UserError, match='tiny.pth: the weights do not fit dino_vitb16'):
    convert.convert('dino_vitb16', str(tmp_path / 'tiny.pth'), str(tmp_path / 'o.safetensors'))
  assert not (tmp_path / 'o.safetensors').exists()
  # no converted file: the error names the file to create and the command
  monkeypatch.setenv('VISIM_JAX_WEIGHTS', str(tmp_path / 'w'))
  with pytest.raises(UserError, match=r'deits16.safetensors.*convert --backbone=deits16'):
    get_backbone('deits16')


def test_full_size_members_match_table1():
  """Paper 001 Table 1 'Concatenated Size' by shape inference (abstract=True: no weights made); parameter counts
  of timm's ViT-B/16 without its head (86,567,656 - 769,000), DINO's ViT-S/16 (21.67M), ..."""
  for name, dims, n in (('vit', 768, 85_798_656), ('deits16', 384, 21_665_664), ('deits8', 384, 21_670_272),
                        ('dino_vitb16', 768, 85_798_656), ('dino_vitb8', 768, 85_807_872)):
    assert registry.pooled_dim(name) == dims, name
    b = get_backbone(name, abstract=True)
    pre = b.preprocess
    assert (pre.size, pre.resize, pre.interpolation) == (224, 'squash', 'torch_bilinear'), name
    np.testing.assert_allclose(np.array(pre.std) / 255, (0.229, 0.224, 0.225))
    shapes = vit.variable_shapes(vit.ARCHS[name])
    assert sum(int(np.prod(s.shape)) for s in jax.tree.leaves(shapes)) == n, name
  native = get_backbone('vit', abstract=True, preprocessing='native').preprocess
  assert (native.resize_to, native.mean, native.interpolation) == (248, (127.5,) * 3, 'bicubic')
