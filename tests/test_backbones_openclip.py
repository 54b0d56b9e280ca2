"""OpenCLIP ViTs (openclip.py on vit.py's module) vs a PyTorch reference written here in open_clip's structure.

open_clip itself imports torchvision at package import, which does not import beside torch 2.13 here, so the
reference is written for this test from open_clip's `transformer.py` VisionTransformer (default path of the ViT-B-32 /
ViT-B-16 / ViT-L-14 configs): conv1 without bias, class_embedding / positional_embedding, ln_pre, resblocks
(ln_1 -> fused in_proj attention -> out_proj; ln_2 -> c_fc -> nn.GELU -> c_proj), ln_post on all tokens, CLS
(`pool_type='tok'`), `@ proj`; its parameter names are open_clip's (`visual.transformer.resblocks.0.attn.in_proj_weight`, ...),
saved in a full CLIP state dict (text tower included) as `open_clip_pytorch_model.bin` / `open_clip_model.safetensors`.
"""
import collections

import jax
import numpy as np
import pytest

from torch_init import assert_stages_close, randomise, run_both
from visim_jax.backbones import convert, get_backbone, openclip, vit
from visim_jax.core.errors import UserError

torch = pytest.importorskip('torch')
nn = torch.nn
F = torch.nn.functional


class RefBlock(nn.Module):

  def __init__(self, d, heads):
    super().__init__()
    self.heads = heads
    self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)  # open_clip's LayerNorm: eps 1e-5
    self.attn = nn.MultiheadAttention(d, heads, batch_first=True)  # in_proj_weight / in_proj_bias / out_proj
    self.mlp = nn.Sequential(collections.OrderedDict(
        [('c_fc', nn.Linear(d, 4 * d)), ('gelu', nn.GELU()), ('c_proj', nn.Linear(4 * d, d))]))

  def forward(self, x):
    h = self.ln_1(x)
    x = x + self.attn(h, h, h, need_weights=False)[0]
    return x + self.mlp(self.ln_2(x))


class RefTransformer(nn.Module):

  def __init__(self, d, layers, heads):
    super().__init__()
    self.resblocks = nn.ModuleList([RefBlock(d, heads) for _ in range(layers)])


class RefVisual(nn.Module):

  def __init__(self, arch):
    super().__init__()
    d, grid = arch.width, arch.image_size // arch.patch
    self.conv1 = nn.Conv2d(3, d, arch.patch, stride=arch.patch, bias=False)
    self.class_embedding = nn.Parameter(torch.zeros(d))
    self.positional_embedding = nn.Parameter(torch.zeros(grid * grid + 1, d))
    self.ln_pre, self.ln_post = nn.LayerNorm(d), nn.LayerNorm(d)
    self.transformer = RefTransformer(d, arch.depth, arch.heads)
    self.proj = nn.Parameter(torch.zeros(d, arch.proj_dim))

  def forward(self, x):
    x = self.conv1(x).flatten(2).transpose(1, 2)
    x = torch.cat([self.class_embedding.expand(x.shape[0], 1, -1), x], dim=1) + self.positional_embedding
    x = self.ln_pre(x)
    stages = {'embeddings': x}
    for i, blk in enumerate(self.transformer.resblocks):
      x = blk(x)
      stages[f'block{i + 1}'] = x
    x = self.ln_post(x)
    stages['pooled'], stages['patch_mean'] = x[:, 0], x[:, 1:].mean(1)
    stages['projection'] = stages['pooled'] @ self.proj
    return stages


class RefCLIP(nn.Module):
  """The image tower plus a stand-in text tower: a full open_clip checkpoint holds both."""

  def __init__(self, arch):
    super().__init__()
    self.visual = RefVisual(arch)
    self.token_embedding = nn.Embedding(10, 8)
    self.logit_scale = nn.Parameter(torch.ones([]))


@pytest.fixture(scope='module')
def ref():
  return randomise(RefCLIP(openclip.TINY), 0, small=('class_embedding', 'positional_embedding'))


@pytest.mark.parametrize('fmt', ['bin', 'safetensors'])
def test_parity_through_the_converter(ref, tmp_path, fmt):
  """Every stage to 1e-5 (atol) of the reference, from the .bin (safe_pickle) and the .safetensors download."""
  name = 'openclip_vit_b16_laion2b'
  ckpt = tmp_path / f'open_clip_model.{fmt}'
  if fmt == 'bin':
    torch.save(ref.state_dict(), ckpt)
  else:
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(ckpt))
  out = tmp_path / f'{name}.safetensors'
  info = convert.convert(name, str(ckpt), str(out), tiny=True)
  assert info['num_tensors'] == sum(1 for k in ref.state_dict() if k.startswith('visual.'))
  backbone = get_backbone(name, weights=str(out), tiny=True)
  assert backbone.weights_id == info['sha256'] and backbone.layers == ('projection',)
  final, stages, want = run_both(backbone, ref.visual, openclip.TINY.image_size)
  assert_stages_close(stages, want, atol=1e-5, rtol=1e-4, name=name)
  np.testing.assert_allclose(final, want['pooled'], atol=1e-5, rtol=1e-4)


def test_converter_refusals(ref, tmp_path):
  sd = dict(ref.state_dict())
  torch.save({**sd, 'visual.attn_pool.query': torch.zeros(4, 32)}, tmp_path / 'coca.bin')
  with pytest.raises(UserError, match=r'coca.bin: unexpected image-tower entry visual.attn_pool.query'):
    convert.convert('openclip_vit_b32_laion2b', str(tmp_path / 'coca.bin'), str(tmp_path / 'o.safetensors'), tiny=True)
  torch.save({k: v for k, v in sd.items() if not k.startswith('visual.')}, tmp_path / 'text.bin')
  with pytest.raises(UserError, match='text.bin: no `visual.'):
    convert.convert('openclip_vit_b32_laion2b', str(tmp_path / 'text.bin'), str(tmp_path / 'o.safetensors'), tiny=True)
  torch.save(sd, tmp_path / 'tiny.bin')  # a tiny tower is not a ViT-L/14: nothing written, the file named
  with pytest.raises(UserError, match='tiny.bin: the weights do not fit openclip_vit_l14_laion2b'):
    convert.convert('openclip_vit_l14_laion2b', str(tmp_path / 'tiny.bin'), str(tmp_path / 'o.safetensors'))
  assert not (tmp_path / 'o.safetensors').exists()


def test_full_size_members():
  """Image-tower parameter counts of open_clip's ViT-B-32 / B-16 / L-14 (87,849,216 /
  86,192,640 / 303,966,208: open_clip's model profile), by shape inference; each tag's preprocessing."""
  for name, n, std in (('openclip_vit_b32_laion2b', 87_849_216, 0.26862954),
                       ('openclip_vit_b16_laion2b', 86_192_640, 0.26862954),
                       ('openclip_vit_l14_laion2b', 303_966_208, 0.5)):
    shapes = vit.variable_shapes(openclip.ARCHS[name])
    assert sum(int(np.prod(s.shape)) for s in jax.tree.leaves(shapes)) == n, name
    pre = get_backbone(name, abstract=True).preprocess
    assert (pre.size, pre.resize, pre.resize_to, pre.interpolation) == (224, 'shorter_crop', 224, 'bicubic')
    np.testing.assert_allclose(pre.std[0] / 255, std)
  b = get_backbone('openclip_vit_b32_laion2b', abstract=True, layers='pooled,patch_mean,projection')
  assert b.layer_dims() == {'pooled': 768, 'patch_mean': 768, 'projection': 512}  # (sizes: tests/test_registry.py)
