"""Where two images differ, and distances over part of them: the pure map and mask math of every model kind
(docs/library.md "Maps" and "Masks"; visim_jax/api.py's `distance_map` and `distance(mask=)` call it).

Maps, (N, H, W) float32, larger = more different; each comes with the rule that ties it to the model's distance:

  l1 / l2 / psnr   per pixel: mean over the compared channels of |x - y| (l1) or ((x - y) / L)^2 (l2, psnr; 0.5x on
                   Lab for l2, as the distance). Mean of the map = l1 / l2 exactly; psnr's distance is
                   -10 log10(mean of the map + 1e-8)
  ssim             1 - the SSIM map (mean over channels) at every 'valid' window centre, edge-padded by size // 2 px
                   to the input size (piq's downsampling: each pooled pixel repeated f x f first). Mean of the
                   centre crop = the SSIM distance
  ms_ssim          1 - prod_j relu(m_j)^w_j with m_j the scale-j contrast-structure map (the SSIM map at the
                   coarsest scale), each edge-padded then brought to the input size bilinearly: a local MS-SSIM whose
                   mean is close to, not equal to, the distance
  dists            DISTS decomposed per location: the structure term 1 - S2 = mean_p ((x_p - m_x) - (y_p - m_y))^2 /
                   (v_x + v_y + c2) exactly, the texture term 1 - S1 (global means) spread evenly; each stage's map
                   weighted by alpha / beta as the score, upsampled bilinearly and summed over stages (mean at each
                   stage's own grid = DISTS exactly; after upsampling close to it)
  lpips            models/lpips.distance_map (the reference's spatial=True)
  embeddings       the model's own distance (1 - cos for cosine / adapter / tuned / DreamSim) between per-location
                   rows: each chosen layer's map or patch tokens (leading CLS / register tokens dropped) L2-normalised
                   per location as features.pool normalises per layer, layers brought to the finest grid and
                   concatenated, the head's transform applied per row; a pooled layer (CLS, projection, DreamSim's
                   embedding) maps through the tokens it is pooled from (`token_source`). Upsampled bilinearly to
                   the network's input size.

Masks: a weight per location w in [0, 1] (the boolean mask brought to each grid by antialiased linear resizing: the
share of a cell the mask covers). A masked distance replaces every spatial mean of the model by the w-weighted
mean (pixel metrics, SSIM / MS-SSIM at every scale (a window centre weighted by the share of its window the mask
covers), LPIPS per layer, DISTS' means, variances and covariances per
stage, the pooled features of embedding models: patch tokens weighted, leading tokens weight 1; in ViT towers the
attention too: vit.key_weights); so w = 1 everywhere is the unmasked formula.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from visim_jax.core import ops
from visim_jax.models import classical

MAX_LEADING_TOKENS = 8            # CLS + registers before the patch grid of a token sequence


# ------------------------------------------------------------------------------------------------ helpers

def to_size(m: jax.Array, size: Sequence[int]) -> jax.Array:
  """(N, h, w) -> (N, H, W), bilinear with half-pixel centres (torch's align_corners=False, no antialias)."""
  size = tuple(int(s) for s in size)
  if tuple(m.shape[1:3]) == size:
    return m
  return jax.image.resize(m, m.shape[:1] + size, 'bilinear', antialias=False)


def edge_pad_to(m: jax.Array, size: Sequence[int]) -> jax.Array:
  """(N, h, w) centred in (N, H, W), the border filled with the nearest value (floor on the top / left)."""
  dh, dw = size[0] - m.shape[1], size[1] - m.shape[2]
  return jnp.pad(m, ((0, 0), (dh // 2, dh - dh // 2), (dw // 2, dw - dw // 2)), mode='edge')


def weights_at(w: jax.Array, size: Sequence[int]) -> jax.Array:
  """(N, H, W) mask weights in [0, 1] -> (N, h, w): the covered share of each cell (antialiased linear resize)."""
  size = tuple(int(s) for s in size)
  if tuple(w.shape[1:3]) == size:
    return w
  return jnp.clip(jax.image.resize(w, w.shape[:1] + size, 'linear', antialias=True), 0.0, 1.0)


def window_weights(w: jax.Array, size: int) -> jax.Array:
  """(N, H, W) weights -> (N, H - size + 1, W - size + 1): each 'valid' window centre weighted by the share of its
  size x size window the mask covers (so a small mask still reaches MS-SSIM's coarse scales; all ones -> ones)."""
  return classical._filter(w[..., None], np.full(size, 1.0 / size))[..., 0]  # pylint: disable=protected-access


def wmean(v: jax.Array, w: jax.Array, axes=(-2, -1)) -> jax.Array:
  """sum(w v) / sum(w) over `axes` (w broadcast against v)."""
  w = jnp.broadcast_to(w, v.shape)
  return jnp.sum(w * v, axis=axes) / jnp.sum(w, axis=axes)


# ------------------------------------------------------------------------------------------------ pixels

def _colours(x, y, colour):
  a, rng = classical.to_colour(classical._unit(x), colour)  # pylint: disable=protected-access
  b, _ = classical.to_colour(classical._unit(y), colour)   # pylint: disable=protected-access
  return a, b, rng


def pixel_map(name: str, x, y, opts) -> jax.Array:
  """(N, H, W): |x - y| (l1) or ((x - y) / L)^2 (l2, psnr) averaged over the compared channels (module docstring)."""
  a, b, rng = _colours(x, y, opts.colour)
  if name == 'l1':
    return jnp.mean(jnp.abs(a - b), -1)
  m = jnp.mean(jnp.square((a - b) / rng), -1)
  return 0.5 * m if name == 'l2' and opts.colour == 'lab' else m


def pixel_masked(name: str, x, y, w, opts) -> jax.Array:
  """(N,) the zoo's distance of l1 / l2 / psnr over the w-weighted pixels."""
  m = wmean(pixel_map(name, x, y, opts), w)
  return -(-10.0 * jnp.log10(m + classical.PSNR_EPS)) if name == 'psnr' else m


# ------------------------------------------------------------------------------------------------ SSIM

def _ssim_prep(x, y, opts):
  a, b, rng = _colours(x, y, opts.colour)
  f = max(1, round(min(a.shape[1:3]) / 256)) if opts.downsample == 'wang' else 1
  if f > 1:
    a, b = classical._avg_pool(a, f), classical._avg_pool(b, f)  # pylint: disable=protected-access
  return a, b, rng, f


def ssim_map(x, y, opts) -> jax.Array:
  """(N, H, W) 1 - SSIM map, edge-padded (and repeated f x f under piq's downsampling) to the input size."""
  size = x.shape[1:3]
  a, b, rng, f = _ssim_prep(x, y, opts)
  s, _ = classical.ssim_cs_maps(a, b, rng, opts)
  m = edge_pad_to(1.0 - s.mean(axis=1), a.shape[1:3])
  if f > 1:
    m = jnp.repeat(jnp.repeat(m, f, axis=1), f, axis=2)
  return edge_pad_to(m, size)


def ssim_masked(x, y, w, opts) -> jax.Array:
  """(N,) 1 - SSIM averaged over the window centres under the mask (w at the compared resolution, centre crop)."""
  a, b, rng, _ = _ssim_prep(x, y, opts)
  s, _ = classical.ssim_cs_maps(a, b, rng, opts)
  wc = window_weights(weights_at(w, a.shape[1:3]), opts.size)[:, None]
  return 1.0 - wmean(s, wc).mean(axis=-1)


def _ms_levels(x, y, opts):
  a, b, rng = _colours(x, y, opts.colour)
  if min(a.shape[1:3]) < classical.ms_ssim_min_size(opts):
    from visim_jax.core.errors import UserError  # pylint: disable=g-import-not-at-top
    raise UserError(f'ms_ssim: images of {a.shape[1]}x{a.shape[2]} px; MS-SSIM with {len(opts.weights)} scales and a '
                    f'{opts.size} px window needs sides of at least {classical.ms_ssim_min_size(opts)} px '
                    "(resize='HxW' enlarges them)")
  levels = []
  for j in range(len(opts.weights)):
    if j:
      a, b = classical._halve(a, opts.pool), classical._halve(b, opts.pool)  # pylint: disable=protected-access
    s, cs = classical.ssim_cs_maps(a, b, rng, opts)
    levels.append((cs if j < len(opts.weights) - 1 else s, a.shape[1:3]))
  return levels


def ms_ssim_map(x, y, opts) -> jax.Array:
  """(N, H, W) 1 - a local MS-SSIM (module docstring)."""
  size = x.shape[1:3]
  out = 1.0
  for (m, at), wt in zip(_ms_levels(x, y, opts), opts.weights):
    v = to_size(edge_pad_to(m.mean(axis=1), at), size)
    out = out * jax.nn.relu(v) ** wt
  return 1.0 - out


def ms_ssim_masked(x, y, w, opts) -> jax.Array:
  """(N,) 1 - MS-SSIM with every scale's mean taken over the mask (brought to that scale, centre crop)."""
  vals = [wmean(m, window_weights(weights_at(w, at), opts.size)[:, None]) for m, at in _ms_levels(x, y, opts)]
  v = jax.nn.relu(jnp.stack(vals))
  wt = jnp.asarray(opts.weights, v.dtype)[:, None, None]
  return 1.0 - jnp.prod(v ** wt, axis=0).mean(axis=-1)


# ------------------------------------------------------------------------------------------------ DISTS

def _dists_terms(params, f0, f1, w=None):
  """Per stage: (alpha_k / W, beta_k / W, S1, (x - m_x) - (y - m_y), v_x + v_y + c2, weights) with every mean
  w-weighted (w None: plain means)."""
  from visim_jax.models import dists as dists_lib  # pylint: disable=g-import-not-at-top
  alpha, beta = params['alpha'], params['beta']
  w_sum = alpha.sum() + beta.sum()
  cuts = np.cumsum([f.shape[-1] for f in f0])[:-1]
  out = []
  for a, b, x, y in zip(jnp.split(alpha / w_sum, cuts), jnp.split(beta / w_sum, cuts), f0, f1):
    wk = jnp.ones(x.shape[:3], x.dtype) if w is None else weights_at(w, x.shape[1:3])
    wk4 = wk[..., None]
    mean = lambda t: wmean(t, wk4, axes=(1, 2))   # noqa: E731
    mx, my = mean(x), mean(y)
    dx, dy = x - mx[:, None, None], y - my[:, None, None]
    s1 = (2 * mx * my + dists_lib.C1) / (mx * mx + my * my + dists_lib.C1)
    vsum = mean(jnp.square(dx)) + mean(jnp.square(dy)) + dists_lib.C2
    out.append((a, b, s1, dx - dy, vsum, wk))
  return out


def dists_map(params, f0, f1, size) -> jax.Array:
  """(N, H, W): DISTS per location (module docstring)."""
  total = 0.0
  for a, b, s1, diff, vsum, _ in _dists_terms(params, f0, f1):
    texture = jnp.sum(a * (1.0 - s1), -1)                                   # (N,)
    structure = jnp.einsum('nhwc,c->nhw', jnp.square(diff) / vsum[:, None, None], b)
    total = total + to_size(structure + texture[:, None, None], size)
  return total


def dists_masked(params, f0, f1, w) -> jax.Array:
  """(N,) DISTS with each stage's means, variances and covariance w-weighted."""
  total = 0.0
  for a, b, s1, diff, vsum, wk in _dists_terms(params, f0, f1, w):
    s2 = 1.0 - wmean(jnp.square(diff), wk[..., None], axes=(1, 2)) / vsum
    total = total + (s1 * a).sum(-1) + (s2 * b).sum(-1)
  return 1.0 - total


# ------------------------------------------------------------------------------------------------ LPIPS

def lpips_masked(lins, f0, f1, w) -> jax.Array:
  """(N,) LPIPS with each layer's spatial mean w-weighted (lins: the learned per-channel weights)."""
  total = 0.0
  for lw, a, b in zip(lins, f0, f1):
    d = jnp.einsum('nhwc,c->nhw', jnp.square(a - b), lw.astype(a.dtype))
    total = total + wmean(d, weights_at(w, d.shape[1:3]))
  return total


# ------------------------------------------------------------------------------------------------ embeddings

def token_grid(t: jax.Array) -> tuple[int, int] | None:
  """(leading tokens, grid side) of a (N, T, C) sequence whose last g*g tokens are a square patch grid, else None."""
  g = math.isqrt(t.shape[1])
  lead = t.shape[1] - g * g
  return (lead, g) if g > 0 and lead <= MAX_LEADING_TOKENS else None


def is_local(s) -> bool:
  """Whether a stage has locations: an NHWC map or a token sequence ending in a square patch grid."""
  return s.ndim == 4 or (s.ndim == 3 and token_grid(s) is not None)


def token_source(stages: Mapping[str, jax.Array], layer: str) -> list[str]:
  """The local stages a layer's rows come from: itself when it has locations; for a pooled layer the tokens it is
  pooled from (DreamSim: `<member>_tokens`, every member's for `embedding` / `concat`; otherwise the last local
  stage before it). [] when there is none."""
  if is_local(stages[layer]):
    return [layer]
  tokens = [k for k in stages if k.endswith('_tokens')]
  if tokens:
    own = [k for k in tokens if layer == k[:-len('_tokens')] or layer.startswith(k[:-len('_tokens')] + '_')]
    return own or tokens
  names = list(stages)
  before = [k for k in names[:names.index(layer)] if is_local(stages[k])]
  return before[-1:]


def _as_grid(s: jax.Array) -> jax.Array:
  if s.ndim == 4:
    return s
  lead, g = token_grid(s)
  return s[:, lead:].reshape(s.shape[0], g, g, s.shape[-1])


def location_rows(stages: Mapping[str, jax.Array], layers: Sequence[str], dreamsim_norm: bool = False) -> jax.Array:
  """(N, h, w, D): per location, each layer's row L2-normalised (DreamSim's pooled embedding: its members' tokens
  concatenated and normalised as normalize_embedding), layers on the finest grid, concatenated."""
  parts = []
  for layer in layers:
    src = token_source(stages, layer)
    grids = [_as_grid(stages[k]).astype(jnp.float32) for k in src]
    if dreamsim_norm and not is_local(stages[layer]):
      h, w = max(g.shape[1] for g in grids), max(g.shape[2] for g in grids)
      cat = jnp.concatenate([_resize_rows(g, (h, w)) for g in grids], -1)
      cat = cat - cat.mean(-1, keepdims=True)
      parts.append(cat / jnp.linalg.norm(cat, axis=-1, keepdims=True))
    else:
      parts += [ops.l2_normalize(g) for g in grids]
  h, w = max(p.shape[1] for p in parts), max(p.shape[2] for p in parts)
  return jnp.concatenate([_resize_rows(p, (h, w)) for p in parts], -1)


def _resize_rows(p: jax.Array, size) -> jax.Array:
  if tuple(p.shape[1:3]) == tuple(size):
    return p
  return jax.image.resize(p, p.shape[:1] + tuple(size) + p.shape[-1:], 'bilinear', antialias=False)


def masked_pool(stages: Mapping[str, jax.Array], layers: Sequence[str], w: jax.Array) -> jax.Array:
  """features.pool with each layer's mean w-weighted: NHWC maps by w at their grid; token sequences by w at the
  patch grid, leading (CLS / register) tokens weight 1 (features.pool means over every token)."""
  out = []
  for layer in layers:
    s = stages[layer].astype(jnp.float32)
    if s.ndim == 2:     # a pooled vector (CLS, embedding): masked upstream, by the attention (vit.key_weights)
      v = s
    elif s.ndim == 4:
      v = wmean(s, weights_at(w, s.shape[1:3])[..., None], axes=(1, 2))
    else:
      lead, g = token_grid(s)
      wt = jnp.concatenate([jnp.ones((s.shape[0], lead), s.dtype), weights_at(w, (g, g)).reshape(s.shape[0], -1)], 1)
      v = wmean(s, wt[..., None], axes=(1,))
    out.append(ops.l2_normalize(v))
  return jnp.concatenate(out, -1)
