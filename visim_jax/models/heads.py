"""Trainable heads on frozen features: e = head(x), one pure init / apply pair for every kind.

  'adapter'  paper 001's adaptation e = ReLU(x W), W: D -> out_dim, no bias, torch.nn.Linear's uniform init
             (adaptation.init / adaptation.adapt; here on the features themselves, without paper 001's PCA)
  'embed'    paper 004's embedding head e = x W, W: D -> out_dim, semi-orthogonal init (context.init / embed)
  'affine'   AligNet's triplet head (bv_wrapper.TripletWrapper: flax nn.Dense(out_features=1024) on the ViT's
             pre-logits): e = x W + b, flax's default init (lecun_normal W, zero b)
  'mlp'      DreamSim's MLP head (dreamsim/model.py MLP): e = fc2(ReLU(fc1(x))) + x, fc1: D -> hidden, fc2:
             hidden -> D, both with bias, torch.nn.Linear's init (U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for W and b)
  'identity' no parameters: the frozen features (the 'before' of every run)

`init(kind, key, in_dim, out_dim)` -> params (a dict of float32 arrays); `apply(kind, params, x)` -> (..., E).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from visim_jax.models import adaptation, context

KINDS = ('adapter', 'embed', 'affine', 'mlp', 'identity')


def _torch_linear(key: jax.Array, fan_in: int, fan_out: int) -> dict:
  kw, kb = jax.random.split(key)
  bound = 1.0 / jnp.sqrt(fan_in)
  return {'w': jax.random.uniform(kw, (fan_in, fan_out), jnp.float32, -bound, bound),
          'b': jax.random.uniform(kb, (fan_out,), jnp.float32, -bound, bound)}


def init(kind: str, key: jax.Array, in_dim: int, out_dim: int) -> dict:
  """Parameters of a head; out_dim is the embedding size ('adapter', 'embed', 'affine') or the hidden size
  ('mlp', whose output has in_dim); 'identity' has none."""
  if kind == 'adapter':
    return adaptation.init(key, in_dim, out_dim)
  if kind == 'embed':
    hp = context.Hparams(embed_dim=out_dim)
    return {'w': context.init(key, in_dim, hp)['embed']['w']}
  if kind == 'affine':
    return {'w': jax.nn.initializers.lecun_normal()(key, (in_dim, out_dim), jnp.float32),
            'b': jnp.zeros((out_dim,), jnp.float32)}
  if kind == 'mlp':
    k1, k2 = jax.random.split(key)
    return {'fc1': _torch_linear(k1, in_dim, out_dim), 'fc2': _torch_linear(k2, out_dim, in_dim)}
  if kind == 'identity':
    return {}
  raise ValueError(f'head: expected one of {KINDS}, got {kind!r}')


def apply(kind: str, params: dict, x: jax.Array) -> jax.Array:
  """The head on the last axis of x (..., in_dim) -> (..., out): every leading axis goes through as one axis of
  rows, so a weight's gradient contracts one axis (with (B, 3, D) triplet rows it contracted two, and XLA:CPU
  transposed the output gradient for it: the step at AligNet's sizes ran ~10% longer)."""
  lead = jnp.shape(x)[:-1]
  out = _apply_rows(kind, params, jnp.reshape(x, (-1, jnp.shape(x)[-1])).astype(jnp.float32))
  return out.reshape(lead + out.shape[-1:])


def _apply_rows(kind: str, params: dict, x: jax.Array) -> jax.Array:
  if kind == 'adapter':
    return adaptation.adapt(params, x)
  if kind == 'embed':
    return context.embed({'embed': params}, x)
  if kind == 'affine':
    return x @ params['w'] + params['b']
  if kind == 'mlp':
    h = jax.nn.relu(x @ params['fc1']['w'] + params['fc1']['b'])
    return h @ params['fc2']['w'] + params['fc2']['b'] + x
  if kind == 'identity':
    return x
  raise ValueError(f'head: expected one of {KINDS}, got {kind!r}')


def out_dim(kind: str, in_dim: int, size: int) -> int:
  """The embedding size of a head built with init(kind, key, in_dim, size)."""
  return in_dim if kind in ('mlp', 'identity') else size
