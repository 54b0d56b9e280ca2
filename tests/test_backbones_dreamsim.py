"""DreamSim (dreamsim.py): LoRA merged at conversion vs an UNMERGED PyTorch forward pass written here.

The reference follows DreamSim's code (ssundaram21/dreamsim `feature_extraction/vision_transformer.py` VisionTransformer
in the layout `load_clip_as_dino` / `load_open_clip_as_dino` make: `pos_drop` a LayerNorm for CLIP towers, eps 1e-5,
QuickGELU for OpenAI CLIP; `extractor.py`: 'cls' = CLS of the last block's output hooked before the final norm,
'embedding' = model(x) @ proj; `model.py`: per-branch Normalize, concatenation, `normalize_embedding`,
1 - cosine_similarity), with peft's LoRA Linear kept apart: qkv(x) + scaling * lora_B(lora_A(x)), scaling =
lora_alpha / r. The files are written in the layout a user's DreamSim cache_dir has (base checkpoints + `<tag>_lora/`
adapter_config.json + adapter_model.safetensors|bin with peft's key names).
"""
import json

import jax
import numpy as np
import pytest

from torch_init import randomise, run_both
from visim_jax.backbones import features
from visim_jax.backbones import convert, dreamsim, get_backbone, registry
from visim_jax.core.errors import UserError

torch = pytest.importorskip('torch')
nn = torch.nn
F = torch.nn.functional


class QuickGELU(nn.Module):

  def forward(self, x):
    return x * torch.sigmoid(1.702 * x)


class RefAttention(nn.Module):

  def __init__(self, dim, heads, r, scaling):
    super().__init__()
    self.heads, self.scaling = heads, scaling
    self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
    self.lora_A, self.lora_B = nn.Linear(dim, r, bias=False), nn.Linear(r, 3 * dim, bias=False)

  def forward(self, x):
    n, t, c = x.shape
    qkv = self.qkv(x) + self.lora_B(self.lora_A(x)) * self.scaling  # peft's unmerged LoRA Linear (eval)
    q, k, v = qkv.reshape(n, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
    attn = ((q @ k.transpose(-2, -1)) * (c // self.heads) ** -0.5).softmax(dim=-1)
    return self.proj((attn @ v).transpose(1, 2).reshape(n, t, c))


class RefMlp(nn.Module):

  def __init__(self, dim, act):
    super().__init__()
    self.fc1, self.act, self.fc2 = nn.Linear(dim, 4 * dim), act, nn.Linear(4 * dim, dim)

  def forward(self, x):
    return self.fc2(self.act(self.fc1(x)))


class LayerScale(nn.Module):  # DINOv2's layers/layer_scale.py

  def __init__(self, dim):
    super().__init__()
    self.gamma = nn.Parameter(torch.ones(dim))

  def forward(self, x):
    return x * self.gamma


class RefBlock(nn.Module):

  def __init__(self, arch, r, scaling):
    super().__init__()
    self.norm1, self.norm2 = nn.LayerNorm(arch.width, eps=arch.ln_eps), nn.LayerNorm(arch.width, eps=arch.ln_eps)
    self.attn = RefAttention(arch.width, arch.heads, r, scaling)
    self.mlp = RefMlp(arch.width, QuickGELU() if arch.act == 'quick_gelu' else nn.GELU())
    self.ls1, self.ls2 = ((LayerScale(arch.width), LayerScale(arch.width)) if arch.layer_scale
                          else (nn.Identity(), nn.Identity()))

  def forward(self, x):
    x = x + self.ls1(self.attn(self.norm1(x)))
    return x + self.ls2(self.mlp(self.norm2(x)))


class RefPatchEmbed(nn.Module):

  def __init__(self, arch):
    super().__init__()
    self.proj = nn.Conv2d(3, arch.width, arch.patch, stride=arch.patch)

  def forward(self, x):
    return self.proj(x).flatten(2).transpose(1, 2)


class RefBranch(nn.Module):
  """One DreamSim extractor: the DINO-layout ViT, its Normalize, and its feature."""

  def __init__(self, branch, r, scaling, tiny=True):
    super().__init__()
    arch, self.branch = branch.tiny if tiny else branch.arch, branch
    self.grid = grid = arch.image_size // arch.patch
    self.source_grid = (518 // 14 if not tiny else 6) if branch.pos_offset else grid  # DINOv2: 37 x 37 stored
    self.patch_embed = RefPatchEmbed(arch)
    self.cls_token = nn.Parameter(torch.zeros(1, 1, arch.width))
    self.pos_embed = nn.Parameter(torch.zeros(1, self.source_grid ** 2 + 1, arch.width))
    if branch.pos_offset:
      self.mask_token = nn.Parameter(torch.zeros(1, arch.width))  # in the hub file, unused at inference
    self.pos_drop = nn.LayerNorm(arch.width, eps=arch.ln_eps) if arch.ln_pre else nn.Identity()
    self.blocks = nn.ModuleList([RefBlock(arch, r, scaling) for _ in range(arch.depth)])
    self.norm = nn.LayerNorm(arch.width, eps=arch.ln_eps)
    if arch.proj_dim:
      self.proj = nn.Parameter(torch.zeros(arch.width, arch.proj_dim))

  def forward(self, x01):
    mean, std = (torch.tensor(v, device=x01.device, dtype=x01.dtype).reshape(1, 3, 1, 1) for v in self.branch.norm)
    x = self.patch_embed((x01 - mean) / std)
    x = self.pos_drop(torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.positions())
    for blk in self.blocks:
      x = blk(x)
    if self.branch.feat == 'cls_patch':
      return x  # extract_descriptors: every token of blocks[-1]'s output
    if self.branch.feat == 'cls':
      return x[:, 0]  # the hook on blocks[-1]: before the final norm
    return self.norm(x)[:, 0] @ self.proj

  def positions(self):
    """DINOv2's interpolate_pos_encoding (scale_factor (g + 0.1) / M, bicubic); the others' as stored."""
    if self.source_grid == self.grid:
      return self.pos_embed
    m, c = self.source_grid, self.pos_embed.shape[-1]
    s = (self.grid + self.branch.pos_offset) / m
    patches = F.interpolate(self.pos_embed[:, 1:].reshape(1, m, m, c).permute(0, 3, 1, 2), mode='bicubic',
                            antialias=False, scale_factor=(s, s))
    assert patches.shape[-2:] == (self.grid, self.grid)
    return torch.cat([self.pos_embed[:, :1], patches.permute(0, 2, 3, 1).reshape(1, -1, c)], dim=1)

  def base_state_dict(self):
    return {k: v for k, v in self.state_dict().items() if 'lora_' not in k}

  def adapter(self, index):
    return {f'base_model.model.extractor_list.{index}.model.blocks.{j}.attn.qkv.lora_{ab}.weight':
            getattr(blk.attn, f'lora_{ab}').weight.detach().clone()
            for j, blk in enumerate(self.blocks) for ab in 'AB'}


class RefDreamSim(nn.Module):

  def __init__(self, name, r, scaling, seed, tiny=True):
    super().__init__()
    self.branches = nn.ModuleList([RefBranch(b, r, scaling, tiny) for b in dreamsim.MODELS[name][1]])
    for i, b in enumerate(self.branches):
      randomise(b, seed + i, small=('cls_token', 'pos_embed'))
      with torch.no_grad():  # trained LoRA: B is not zero; large enough that an unmerged-vs-base mix-up shows
        for blk in b.blocks:
          blk.attn.lora_B.weight.mul_(3.0)

  def forward(self, x01):
    feats = torch.cat([b(x01) for b in self.branches], dim=-1)
    if self.branches[0].branch.feat == 'cls_patch':  # normalize_embedding_patch, then forward's cls + pooled patch
      embed = (feats.mT - torch.mean(feats, dim=2).unsqueeze(1)).mT
      embed = (embed.mT / torch.norm(embed, dim=2).unsqueeze(1)).mT
      n, s = embed.shape[0], int((embed.shape[1] - 1) ** 0.5)
      pooled = F.adaptive_avg_pool2d(embed[:, 1:].reshape(n, s, s, -1).permute(0, 3, 1, 2), (1, 1)).reshape(n, -1)
      return {'embedding': torch.cat((embed[:, 0], pooled), dim=-1)}
    embed = (feats.T - torch.mean(feats, dim=1)).T  # DreamSim's normalize_embedding
    return {'embedding': (embed.T / torch.norm(embed, dim=1)).T, 'concat': feats}

  def write_cache_dir(self, folder, name, lora_alpha, r, adapter_format, extra_config=None):
    tag, branches = dreamsim.MODELS[name]
    for i, (ref, b) in enumerate(zip(self.branches, branches)):
      path = folder / dreamsim.BASE_FILES[b.model_type][0]
      path.parent.mkdir(parents=True, exist_ok=True)
      sd = ref.base_state_dict()
      torch.save(sd if b.key in ('dino', 'dinov2') else {'state_dict': sd}, path)  # hub file / DreamSim's
    lora_dir = folder / f'{tag}_lora'
    lora_dir.mkdir()
    cfg = {'peft_type': 'LORA', 'r': r, 'lora_alpha': lora_alpha, 'lora_dropout': 0.3, 'bias': 'none',
           'target_modules': ['qkv'], 'fan_in_fan_out': False, 'modules_to_save': None, 'inference_mode': True,
           **(extra_config or {})}
    (lora_dir / 'adapter_config.json').write_text(json.dumps(cfg))
    adapter = {k: v for i, ref in enumerate(self.branches) for k, v in ref.adapter(i).items()}
    if adapter_format == 'safetensors':
      from safetensors.torch import save_file
      save_file(adapter, str(lora_dir / 'adapter_model.safetensors'))
    else:
      torch.save(adapter, lora_dir / 'adapter_model.bin')


def _check(tmp_path, name, r, lora_alpha, adapter_format, extra_config=None, scaling=None):
  scaling = lora_alpha / r if scaling is None else scaling
  ref = RefDreamSim(name, r, scaling, seed=3).eval()
  folder = tmp_path / name
  ref.write_cache_dir(folder, name, lora_alpha, r, adapter_format, extra_config)
  out = tmp_path / f'{name}.safetensors'
  info = convert.convert(name, str(folder), str(out), tiny=True)
  assert info['lora']['scale'] == pytest.approx(scaling) and len(info['source_files']) == len(ref.branches) + 2
  backbone = get_backbone(name, weights=str(out), tiny=True)
  assert backbone.layers == ('embedding',) and backbone.weights_id == info['sha256']
  final, stages, want = run_both(backbone, ref, dreamsim.TINY_SIZE, n=3)
  np.testing.assert_allclose(stages['embedding'], want['embedding'], atol=1e-5)
  patch = dreamsim.MODELS[name][1][0].feat == 'cls_patch'
  if not patch:
    np.testing.assert_allclose(np.linalg.norm(final, axis=-1), 1.0, atol=1e-6)
  # DreamSim's distance 1 - cosine_similarity(embed_a, embed_b) == 1 - the cosine of our pooled features
  t = torch.from_numpy(want['embedding'])
  distance = (1 - F.cosine_similarity(t[:1], t[1:], dim=-1)).numpy()
  pooled = np.asarray(features.pool(stages, backbone.layers))
  np.testing.assert_allclose(1 - pooled[1:] @ pooled[0], distance, atol=1e-5)
  # the merge matters: the same files without the adapter give other embeddings
  with torch.no_grad():
    for b in ref.branches:
      for blk in b.blocks:
        blk.attn.lora_B.weight.zero_()
  images = np.random.default_rng(1).integers(0, 256, (3, dreamsim.TINY_SIZE, dreamsim.TINY_SIZE, 3), dtype=np.uint8)
  with torch.no_grad():  # the images run_both used
    base = ref(torch.from_numpy(np.asarray(backbone.preprocess.normalise(images)).transpose(0, 3, 1, 2).copy()))
  assert np.abs(base['embedding'].numpy() - want['embedding']).max() > 1e-2
  return backbone, stages


def test_ensemble_lora_merge_matches_unmerged_forward(tmp_path):
  """DINO cls + CLIP (QuickGELU) embedding + OpenCLIP (GELU) embedding; peft's safetensors adapter, scale alpha / r."""
  backbone, stages = _check(tmp_path, 'dreamsim_ensemble', r=4, lora_alpha=8, adapter_format='safetensors')
  assert {k: v.shape[-1] for k, v in stages.items() if k in ('dino', 'clip', 'open_clip', 'concat')} == {
      'dino': 32, 'clip': 16, 'open_clip': 16, 'concat': 64}
  np.testing.assert_allclose(stages['embedding'], np.asarray(dreamsim.normalize_embedding(stages['concat'])),
                             atol=1e-6)


def test_single_branch_bin_adapter_and_rslora(tmp_path):
  """The torch-pickled adapter_model.bin (read through safe_pickle); use_rslora: scale alpha / sqrt(r)."""
  _check(tmp_path, 'dreamsim_clip_vitb32', r=4, lora_alpha=2, adapter_format='bin',
         extra_config={'use_rslora': True}, scaling=2 / np.sqrt(4))


def test_dinov2_branch_layer_scale_and_position_resize(tmp_path):
  """torch hub DINOv2 (LayerScale, mask_token dropped, 6 x 6 stored positions resized to 4 x 4 with scale_factor
  (4 + 0.1) / 6 as interpolate_pos_encoding does: here once at conversion)."""
  _check(tmp_path, 'dreamsim_dinov2_vitb14', r=4, lora_alpha=4, adapter_format='safetensors')


def test_patch_model_cls_and_pooled_patch_tokens(tmp_path):
  """use_patch_model=True (feat_type 'cls_patch'): per-token normalize_embedding_patch, CLS + mean patch token."""
  _check(tmp_path, 'dreamsim_dino_vitb16_patch', r=2, lora_alpha=4, adapter_format='safetensors')


def test_pretrained_members_are_the_base_files_without_lora(tmp_path):
  """DreamSim's starting points: the cache_dir's base files (the adapter beside them is not read), default stage
  'concat' = PerceptualModel(normalize_embeds=False)'s features = the reference with its LoRA off; the single DINO
  model from torch hub's file alone; DreamSim's bicubic squash."""
  ref = RefDreamSim('dreamsim_ensemble', 4, 2.0, seed=3).eval()
  folder = tmp_path / 'cache_dir'
  ref.write_cache_dir(folder, 'dreamsim_ensemble', 8, 4, 'safetensors')
  with torch.no_grad():
    for b in ref.branches:
      for blk in b.blocks:
        blk.attn.lora_B.weight.zero_()
  for name, n_branches in (('dreamsim_ensemble_pretrained', 3), ('dreamsim_dino_vitb16_pretrained', 1)):
    if n_branches == 1:
      ref.branches = ref.branches[:1]
      for p in folder.glob('*.pth.tar'):
        p.unlink()
    info = convert.convert(name, str(folder), str(tmp_path / f'{name}.safetensors'), tiny=True)
    assert info['lora'] is None and len(info['source_files']) == n_branches
    backbone = get_backbone(name, weights=info['out'], tiny=True)
    assert backbone.layers == ('concat',) and backbone.preprocess.interpolation == 'bicubic'
    _, stages, want = run_both(backbone, ref, dreamsim.TINY_SIZE, n=2)
    np.testing.assert_allclose(stages['concat'], want['concat'], atol=1e-5, err_msg=name)
    np.testing.assert_allclose(stages['embedding'], want['embedding'], atol=1e-5, err_msg=name)


def test_merge_is_w_plus_scale_b_a():
  rng = np.random.default_rng(0)
  w, a, b = rng.normal(size=(6, 4)), rng.normal(size=(2, 4)), rng.normal(size=(6, 2))
  want = np.array([[w[i, j] + 0.5 * sum(b[i, k] * a[k, j] for k in range(2)) for j in range(4)] for i in range(6)])
  np.testing.assert_allclose(dreamsim.merge_lora(w, a, b, 0.5), want, rtol=1e-6)


def test_refusals(tmp_path):
  name = 'dreamsim_dino_vitb16'
  ref = RefDreamSim(name, 2, 1.0, seed=0)
  ref.write_cache_dir(tmp_path / 'dora', name, 2, 2, 'safetensors', {'use_dora': True})
  with pytest.raises(UserError, match=r'adapter_config.json: use_dora=True is not supported'):
    convert.convert(name, str(tmp_path / 'dora'), str(tmp_path / 'o.safetensors'), tiny=True)
  ref.write_cache_dir(tmp_path / 'mlp', name, 2, 2, 'safetensors', {'target_modules': ['qkv', 'fc1']})
  with pytest.raises(UserError, match=r"target_modules \['qkv', 'fc1'\]"):
    convert.convert(name, str(tmp_path / 'mlp'), str(tmp_path / 'o.safetensors'), tiny=True)
  ref.write_cache_dir(tmp_path / 'nobase', name, 2, 2, 'safetensors')
  (tmp_path / 'nobase' / 'checkpoints' / 'dino_vitbase16_pretrain.pth').unlink()
  with pytest.raises(UserError, match=r'nobase: no dino_vitb16 base weights .*checkpoints/dino_vitbase16_pretrain'):
    convert.convert(name, str(tmp_path / 'nobase'), str(tmp_path / 'o.safetensors'), tiny=True)
  with pytest.raises(UserError, match='converts from a folder'):
    convert.convert(name, str(tmp_path / 'dora' / 'dino_vitb16_single_lora' / 'adapter_config.json'),
                    str(tmp_path / 'o.safetensors'), tiny=True)
  assert not (tmp_path / 'o.safetensors').exists()


def test_full_size_members():
  """Other pooling stages by shape inference (the default sizes: tests/test_registry.py), DreamSim's preprocessing,
  the parameter count of a CLIP ViT-B/32 branch."""
  assert [registry.pooled_dim(n) for n in dreamsim.MODELS] == [768 + 512 + 512, 768, 512, 512, 768, 768, 1536, 1536,
                                                                 768 + 512 + 512, 768]
  b = get_backbone('dreamsim_ensemble', abstract=True, layers='dino_patch_mean,clip_pooled,open_clip')
  assert b.layer_dims() == {'dino_patch_mean': 768, 'clip_pooled': 768, 'open_clip': 512}
  pre = b.preprocess
  assert (pre.size, pre.resize, pre.interpolation, pre.mean, pre.std) == (224, 'squash', 'bicubic', (0.0,) * 3,
                                                                           (255.0,) * 3)
  shapes = jax.tree.leaves(dreamsim.variable_shapes(dreamsim.MODELS['dreamsim_clip_vitb32'][1], tiny=False))
  assert sum(int(np.prod(s.shape)) for s in shapes) == 87_849_216 + 768  # OpenAI ViT-B/32 tower + the patch bias
