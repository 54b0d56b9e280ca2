"""SigLIP checkpoints in the other published layouts, renamed to the Hugging Face names siglip.py loads.

npz_to_hf: big_vision's .npz (models/proj/image_text/two_towers.py; python-loop or scanned encoder blocks).
timm_to_hf: open_clip's `visual.trunk.*` / timm's `vit_*_siglip_*` state dicts.
"""
from __future__ import annotations

import re

import numpy as np

from visim_jax.core.errors import UserError


_NPZ_BLOCK = {'LayerNorm_0': 'layer_norm1', 'LayerNorm_1': 'layer_norm2', 'MlpBlock_0/Dense_0': 'mlp.fc1',
              'MlpBlock_0/Dense_1': 'mlp.fc2', 'MultiHeadDotProductAttention_0/query': 'self_attn.q_proj',
              'MultiHeadDotProductAttention_0/key': 'self_attn.k_proj',
              'MultiHeadDotProductAttention_0/value': 'self_attn.v_proj',
              'MultiHeadDotProductAttention_0/out': 'self_attn.out_proj'}
_NPZ_HEAD = {'LayerNorm_0': 'layernorm', 'MlpBlock_0/Dense_0': 'mlp.fc1', 'MlpBlock_0/Dense_1': 'mlp.fc2',
             'MultiHeadDotProductAttention_0/out': 'attention.out_proj',
             'MultiHeadDotProductAttention_0/query': 'attention.q', 'MultiHeadDotProductAttention_0/key': 'attention.k',
             'MultiHeadDotProductAttention_0/value': 'attention.v'}  # q, k, v: stacked into in_proj below
_NPZ_TOP = {'embedding': 'embeddings.patch_embedding', 'Transformer/encoder_norm': 'post_layernorm'}


def _torch_layout(module: str, kind: str, v: np.ndarray) -> np.ndarray:
  """A flax leaf -> the torch one: conv HWIO -> OIHW; Dense (in, out) -> (out, in); attention query/key/value
  kernels (C, H, D) -> (H*D, C) and biases (H, D) -> (H*D,); the attention out kernel (H, D, C) -> (C, H*D)."""
  if kind == 'kernel':
    if v.ndim == 4:
      return np.ascontiguousarray(v.transpose(3, 2, 0, 1))
    if v.ndim == 3:
      v = v.reshape(-1, v.shape[-1]) if module.endswith('/out') else v.reshape(v.shape[0], -1)
    return np.ascontiguousarray(v.T)
  return v.reshape(-1) if kind == 'bias' else v


def npz_to_hf(tensors: dict, where: str) -> dict:
  """A big_vision SigLIP / SigLIP 2 checkpoint ({'params/img/...': array}: flattened '/' paths of the two-tower
  params; the text tower, t and b ignored) -> the image tower in HF names and torch layouts, as transformers'
  SigLIP conversion maps them (_torch_layout; LayerNorm scale -> weight; the MAP head's query/key/value stacked
  into in_proj). Scanned checkpoints (`Transformer/encoderblock/...`, a leading depth axis) are split per block."""
  img = {}
  for k, v in tensors.items():
    k = k[len('params/'):] if k.startswith('params/') else k
    if k.startswith('img/'):
      img[k[len('img/'):]] = np.asarray(v, np.float32)
  if not img:
    raise UserError(f'{where}: no image tower (keys params/img/...) in this .npz; expected a big_vision SigLIP '
                    'checkpoint (gs://big_vision/siglip/*.npz or gs://big_vision/siglip2/*.npz)')
  for k in [k for k in img if k.startswith('Transformer/encoderblock/')]:  # scan layout -> one entry per block
    stacked = img.pop(k)
    for i in range(stacked.shape[0]):
      img[k.replace('encoderblock/', f'encoderblock_{i}/', 1)] = stacked[i]
  out = {}
  for k, v in sorted(img.items()):
    if k == 'pos_embedding':
      out['embeddings.position_embedding.weight'] = v.reshape(-1, v.shape[-1])
      continue
    if k == 'MAPHead_0/probe':
      out['head.probe'] = v
      continue
    module, kind = k.rsplit('/', 1)
    m = re.match(r'Transformer/encoderblock_(\d+)/(.+)$', module)
    if m:
      target = _NPZ_BLOCK.get(m.group(2))
      target = target and f'encoder.layers.{m.group(1)}.{target}'
    elif module.startswith('MAPHead_0/'):
      target = _NPZ_HEAD.get(module[len('MAPHead_0/'):])
      target = target and f'head.{target}'
    elif module == 'head':
      continue  # a classifier / projection head: not part of the image embedding
    else:
      target = _NPZ_TOP.get(module)
    if target is None or kind not in ('kernel', 'bias', 'scale'):
      raise UserError(f'{where}: unexpected entry img/{k} for a SigLIP image tower')
    out[f'{target}.{"bias" if kind == "bias" else "weight"}'] = _torch_layout(module, kind, v)
  for leaf in ('weight', 'bias'):
    parts = [out.pop(f'head.attention.{p}.{leaf}', None) for p in 'qkv']
    if all(p is not None for p in parts):
      out[f'head.attention.in_proj_{leaf}'] = np.concatenate(parts, axis=0)
  return out


_TIMM = {'patch_embed.proj': 'embeddings.patch_embedding', 'norm': 'post_layernorm', 'attn_pool.proj':
         'head.attention.out_proj', 'attn_pool.norm': 'head.layernorm', 'attn_pool.mlp.fc1': 'head.mlp.fc1',
         'attn_pool.mlp.fc2': 'head.mlp.fc2'}
_TIMM_BLOCK = {'norm1': 'layer_norm1', 'norm2': 'layer_norm2', 'attn.proj': 'self_attn.out_proj', 'mlp.fc1': 'mlp.fc1',
               'mlp.fc2': 'mlp.fc2'}


def timm_to_hf(sd: dict, where: str) -> dict:
  """An open_clip SigLIP checkpoint (`visual.trunk.*`: timm's VisionTransformer with global_pool='map', e.g.
  hf-hub timm/ViT-B-16-SigLIP2 open_clip_model.safetensors; the text tower dropped) or timm's own
  `vit_*_siglip_*` state dict -> the HF names: each block's fused qkv split into q/k/v (rows q, k, v as timm's
  reshape(3, heads, head_dim)); the attention pool's latent -> probe, q and kv (rows k, v) -> in_proj."""
  trunk = 'visual.trunk.' if any(k.startswith('visual.trunk.') for k in sd) else ''
  out = {}
  for k, v in sd.items():
    if not k.startswith(trunk):
      continue  # open_clip's text tower, logit_scale, logit_bias
    k, v = k[len(trunk):], np.ascontiguousarray(np.asarray(v, np.float32))
    module, _, leaf = k.rpartition('.')
    m = re.match(r'blocks\.(\d+)\.(.+)$', module)
    if k == 'pos_embed':
      out['embeddings.position_embedding.weight'] = v.reshape(-1, v.shape[-1])
    elif k == 'attn_pool.latent':
      out['head.probe'] = v
    elif module in ('attn_pool.q', 'attn_pool.kv'):
      out[f'head.attention.{module[len("attn_pool."):]}.{leaf}'] = v  # stacked below
    elif m and m.group(2) == 'attn.qkv':
      for p, part in zip('qkv', np.split(v, 3, axis=0)):
        out[f'encoder.layers.{m.group(1)}.self_attn.{p}_proj.{leaf}'] = part
    elif m and m.group(2) in _TIMM_BLOCK:
      out[f'encoder.layers.{m.group(1)}.{_TIMM_BLOCK[m.group(2)]}.{leaf}'] = v
    elif module in _TIMM:
      out[f'{_TIMM[module]}.{leaf}'] = v
    elif module in ('head', 'fc_norm'):
      continue  # a classifier head / its norm: not part of the image embedding
    else:
      raise UserError(f'{where}: unexpected entry {trunk}{k} for a timm / open_clip SigLIP image tower')
  for leaf in ('weight', 'bias'):
    q, kv = out.pop(f'head.attention.q.{leaf}', None), out.pop(f'head.attention.kv.{leaf}', None)
    if q is not None and kv is not None:
      out[f'head.attention.in_proj_{leaf}'] = np.concatenate([q, kv], axis=0)
  return out
