"""Classical full-reference metrics: PSNR, SSIM, MS-SSIM and pixel L1 / L2, pure and jittable (differentiable in
both images wherever the metric is: everything but the relu of MS-SSIM at exactly 0).

Every function takes two NHWC batches of the same shape, float in [0, 1] (`prepare` turns uint8 0..255 into that and
refuses a float batch clearly outside it, as LPIPS does), and returns (N,) float32: one score per pair, computed
from that pair alone (no batch statistic: a pair scores the same alone or in any batch). Direction:

  psnr     dB, HIGHER = more similar   (identical images: 80 dB, the 1e-8 floor of piq)
  ssim     in [-1, 1], HIGHER = more similar (1: identical)
  ms_ssim  in [0, 1],  HIGHER = more similar (1: identical)
  l1, l2   mean |x - y| / mean (x - y)^2 over pixels and channels of [0, 1] images, LOWER = more similar
HIGHER_IS_MORE_SIMILAR names them; `distance(name, opts)` gives the zoo's distance (smaller = more similar):
1 - ssim, 1 - ms_ssim, -psnr, l1, l2.

Definitions (Wang, Bovik, Sheikh & Simoncelli 2004; Wang, Simoncelli & Bovik 2003 for MS-SSIM), per channel c of
images x, y with dynamic range L (1 here; 100 on Lab's L axis):
  mu = w * x (a normalised window w, 'valid' positions only), sigma_x^2 = w * x^2 - mu_x^2, sigma_xy = w * xy - mu_x mu_y
  (times N / (N - 1) with sample_covariance), C1 = (K1 L)^2, C2 = (K2 L)^2,
  cs = (2 sigma_xy + C2) / (sigma_x^2 + sigma_y^2 + C2), ssim_map = (2 mu_x mu_y + C1) / (mu_x^2 + mu_y^2 + C1) cs,
  SSIM = mean over channels of the mean of ssim_map.
  MS-SSIM = mean over channels of prod_j relu(cs_j)^w_j (j < M) * relu(ssim_M)^w_M, halving between scales.
The choices the reference implementations differ on are options (`SSIMOptions`), with one preset per reference
(`SSIM_PRESETS`); docs/metrics.md tabulates them against the papers and codes:
  pytorch_msssim (default)  Gaussian 11 / sigma 1.5 (separable), RGB channels, no prior downsampling; MS-SSIM halves
                            with avg_pool2d(2, padding = side % 2) counting the zero padding (VainF/pytorch-msssim)
                            = skimage's gaussian_weights=True, use_sample_covariance=False ("to match Wang et al.")
  piq                       the same window; SSIM first average-pools by f = max(1, round(min(H, W) / 256)) (Wang's
                            ssim.m rule); MS-SSIM halves after replicate-padding top/left by max(H % 2, W % 2)
  skimage                   uniform 7x7 window, sample covariance (N / (N - 1)): structural_similarity's defaults
  lpips_lab                 the LPIPS paper's SSIM baseline: skimage's compare_ssim defaults (uniform 7, sample
                            covariance) on CIE Lab (sRGB, D65) with data_range 100 (PerceptualSimilarity's DSSIM is
                            (1 - that) / 2: the same order)
Colour (`colour`): 'rgb' (each channel, averaged), 'grey' (0.299 R + 0.587 G + 0.114 B: piq's
convert_to_greyscale, MATLAB rgb2gray), 'y' (BT.601 luma of MATLAB rgb2ycbcr, (16 + 65.481 R + 128.553 G +
24.966 B) / 255, the SR literature's "Y channel"), 'lab' (skimage.color.rgb2lab: sRGB -> linear -> XYZ (sRGB matrix)
-> Lab with the D65 2-degree white; L = 100 range).
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from visim_jax.core import cpu_kernels
from visim_jax.core.errors import UserError

COLOURS = ('rgb', 'grey', 'y', 'lab')
WINDOWS = ('gaussian', 'uniform')
DOWNSAMPLE = ('none', 'wang')
POOLS = ('zero_pad', 'replicate')
MS_WEIGHTS = (0.0448, 0.2856, 0.3001, 0.2363, 0.1333)      # Wang et al. 2003, Table 1 (both references)
PSNR_EPS = 1e-8                                            # piq's floor inside the log: identical images = 80 dB
HIGHER_IS_MORE_SIMILAR = {'psnr': True, 'ssim': True, 'ms_ssim': True, 'l1': False, 'l2': False}
# sRGB -> XYZ and the D65 (2 degree) white, as skimage.color (rgb2xyz / xyz2lab)
_XYZ_FROM_RGB = np.array([[0.412453, 0.357580, 0.180423], [0.212671, 0.715160, 0.072169],
                          [0.019334, 0.119193, 0.950227]])
_D65 = np.array([0.95047, 1.0, 1.08883])


@dataclasses.dataclass(frozen=True)
class SSIMOptions:
  """How SSIM / MS-SSIM are computed (module docstring); the defaults are pytorch_msssim's (= Wang's window)."""
  window: str = 'gaussian'            # 'gaussian' (size, sigma) | 'uniform' (size x size box)
  size: int = 11
  sigma: float = 1.5
  k1: float = 0.01
  k2: float = 0.03
  sample_covariance: bool = False     # skimage's default True: variances and covariance times N / (N - 1)
  colour: str = 'rgb'
  downsample: str = 'none'            # SSIM only: 'wang' = average-pool by max(1, round(min(H, W) / 256)) first
  pool: str = 'zero_pad'              # MS-SSIM's halving: 'zero_pad' (pytorch_msssim) | 'replicate' (piq)
  weights: tuple = MS_WEIGHTS         # MS-SSIM's scale exponents (finest first)

  def check(self, where: str = 'ssim') -> 'SSIMOptions':
    for field, value, allowed in (('window', self.window, WINDOWS), ('colour', self.colour, COLOURS),
                                  ('downsample', self.downsample, DOWNSAMPLE), ('pool', self.pool, POOLS)):
      if value not in allowed:
        raise UserError(f'{where}: {field}={value!r}; one of {", ".join(allowed)}')
    if int(self.size) != self.size or self.size < 1 or self.size % 2 == 0:
      raise UserError(f'{where}: size={self.size!r}: the window side must be an odd positive integer')
    if self.sigma <= 0 or self.k1 < 0 or self.k2 < 0:
      raise UserError(f'{where}: sigma > 0 and k1, k2 >= 0 are needed (got {self.sigma}, {self.k1}, {self.k2})')
    if not self.weights or any(w < 0 for w in self.weights):
      raise UserError(f'{where}: weights must be non-negative, one per scale (got {self.weights})')
    return self


SSIM_PRESETS = {
    'pytorch_msssim': SSIMOptions(),
    'piq': SSIMOptions(downsample='wang', pool='replicate'),
    'skimage': SSIMOptions(window='uniform', size=7, sample_covariance=True),
    'lpips_lab': SSIMOptions(window='uniform', size=7, sample_covariance=True, colour='lab'),
}


@dataclasses.dataclass(frozen=True)
class PixelOptions:
  """PSNR / L1 / L2: the colour space the difference is taken in (L2 'lab' is the LPIPS paper's L2 baseline:
  0.5 mean((Lab0 - Lab1) / 100)^2)."""
  colour: str = 'rgb'

  def check(self, where: str = 'psnr') -> 'PixelOptions':
    if self.colour not in COLOURS:
      raise UserError(f'{where}: colour={self.colour!r}; one of {", ".join(COLOURS)}')
    return self


# ------------------------------------------------------------------------------------------------ inputs

def prepare(images, what: str = 'images', where: str = 'classical') -> jax.Array:
  """float32 NHWC in [0, 1]: uint8 / 255; a concrete float batch clearly outside [0, 1] is refused (one line)."""
  from visim_jax.models import lpips  # pylint: disable=g-import-not-at-top  (the house's one range guard)
  return lpips.as_unit_range(images, what, where)


def to_colour(x: jax.Array, colour: str) -> tuple[jax.Array, float]:
  """[0, 1] RGB NHWC -> (the channels compared, their data range L)."""
  if colour == 'rgb':
    return x, 1.0
  if colour == 'grey':
    return jnp.tensordot(x, jnp.asarray([0.299, 0.587, 0.114], x.dtype), axes=([-1], [0]))[..., None], 1.0
  if colour == 'y':
    y = (16.0 + jnp.tensordot(x, jnp.asarray([65.481, 128.553, 24.966], x.dtype), axes=([-1], [0]))) / 255.0
    return y[..., None], 1.0
  if colour == 'lab':
    return rgb_to_lab(x), 100.0
  raise ValueError(f'colour: one of {COLOURS}, got {colour!r}')


def rgb_to_lab(x: jax.Array) -> jax.Array:
  """skimage.color.rgb2lab of [0, 1] sRGB (D65, 2 degrees): L in [0, 100], a, b roughly [-128, 127]."""
  lin = jnp.where(x > 0.04045, jnp.power((jnp.maximum(x, 0.04045) + 0.055) / 1.055, 2.4), x / 12.92)
  xyz = jnp.tensordot(lin, jnp.asarray(_XYZ_FROM_RGB.T / _D65[None, :], x.dtype), axes=([-1], [0]))
  f = jnp.where(xyz > 0.008856, jnp.cbrt(jnp.maximum(xyz, 0.008856)), 7.787 * xyz + 16.0 / 116.0)
  fx, fy, fz = f[..., 0], f[..., 1], f[..., 2]
  return jnp.stack([116.0 * fy - 16.0, 500.0 * (fx - fy), 200.0 * (fy - fz)], axis=-1)


# ------------------------------------------------------------------------------------------------ pixels

def _pixel_mean(x):
  return jnp.mean(x, axis=tuple(range(1, x.ndim)))


@functools.partial(cpu_kernels.jit, static_argnums=2)
def l1(x, y, opts: PixelOptions = PixelOptions()) -> jax.Array:
  """(N,) mean |x - y| over pixels and channels (LOWER = more similar)."""
  a, _ = to_colour(jnp.asarray(x, jnp.float32), opts.colour)
  b, _ = to_colour(jnp.asarray(y, jnp.float32), opts.colour)
  return _pixel_mean(jnp.abs(a - b))


@functools.partial(cpu_kernels.jit, static_argnums=2)
def l2(x, y, opts: PixelOptions = PixelOptions()) -> jax.Array:
  """(N,) mean squared error over pixels and channels (LOWER = more similar); colour='lab': the LPIPS paper's L2
  baseline, 0.5 mean(((Lab_x - Lab_y) / 100)^2)."""
  a, rng = to_colour(jnp.asarray(x, jnp.float32), opts.colour)
  b, _ = to_colour(jnp.asarray(y, jnp.float32), opts.colour)
  mse = _pixel_mean(jnp.square((a - b) / rng))
  return 0.5 * mse if opts.colour == 'lab' else mse


@functools.partial(cpu_kernels.jit, static_argnums=2)
def psnr(x, y, opts: PixelOptions = PixelOptions()) -> jax.Array:
  """(N,) -10 log10(MSE / L^2 + 1e-8) in dB (piq's psnr; HIGHER = more similar; identical images: 80 dB)."""
  a, rng = to_colour(jnp.asarray(x, jnp.float32), opts.colour)
  b, _ = to_colour(jnp.asarray(y, jnp.float32), opts.colour)
  return -10.0 * jnp.log10(_pixel_mean(jnp.square((a - b) / rng)) + PSNR_EPS)


# ------------------------------------------------------------------------------------------------ SSIM

def window_1d(opts: SSIMOptions) -> np.ndarray:
  """The separable window (sums to 1): exp(-(i - size // 2)^2 / (2 sigma^2)) normalised, or a box."""
  if opts.window == 'uniform':
    return np.full(opts.size, 1.0 / opts.size)
  i = np.arange(opts.size, dtype=np.float64) - opts.size // 2
  g = np.exp(-(i ** 2) / (2.0 * opts.sigma ** 2))
  return g / g.sum()


def _filter(maps: jax.Array, w: np.ndarray) -> jax.Array:
  """'valid' separable filtering of (B, H, W, K) maps by the 1-D window w along H then W: a weighted sum of shifted
  slices (elementwise, so a pair's value never depends on the batch around it; XLA's CPU depthwise convolutions
  were 20-60x slower here)."""
  n, (h, wd) = len(w), maps.shape[1:3]
  out = sum(float(w[t]) * maps[:, t:t + h - n + 1] for t in range(n))
  return sum(float(w[t]) * out[:, :, t:t + wd - n + 1] for t in range(n))


def _ssim_cs(a: jax.Array, b: jax.Array, rng: float, opts: SSIMOptions) -> tuple[jax.Array, jax.Array]:
  """Per-channel means (N, C) of the SSIM map and of the contrast-structure map cs."""
  ssim_map, cs_map = ssim_cs_maps(a, b, rng, opts)
  per = lambda t: t.mean(axis=(-2, -1))
  return per(ssim_map), per(cs_map)


def ssim_cs_maps(a: jax.Array, b: jax.Array, rng: float, opts: SSIMOptions) -> tuple[jax.Array, jax.Array]:
  """The SSIM map and the contrast-structure map cs, (N, C, H - size + 1, W - size + 1) each: one value per 'valid'
  window centre and channel (models/spatial.py's maps and masks; `_ssim_cs` takes their means)."""
  n, h, w, c = a.shape
  if min(h, w) < opts.size:
    raise UserError(f'ssim: images of {h}x{w} px are smaller than the {opts.size}x{opts.size} window')
  # every channel alone: channels into the batch, the five moment maps as the filter's channels
  to_b = lambda t: jnp.transpose(t, (0, 3, 1, 2)).reshape(n * c, h, w)
  xa, xb = to_b(a), to_b(b)
  m = _filter(jnp.stack([xa, xb, xa * xa, xb * xb, xa * xb], axis=-1), window_1d(opts))
  mu_a, mu_b, e_aa, e_bb, e_ab = (m[..., i] for i in range(5))
  cov = (opts.size ** 2 / (opts.size ** 2 - 1.0)) if opts.sample_covariance else 1.0
  var_a, var_b = cov * (e_aa - mu_a * mu_a), cov * (e_bb - mu_b * mu_b)
  cov_ab = cov * (e_ab - mu_a * mu_b)
  c1, c2 = (opts.k1 * rng) ** 2, (opts.k2 * rng) ** 2
  cs_map = (2.0 * cov_ab + c2) / (var_a + var_b + c2)
  ssim_map = (2.0 * mu_a * mu_b + c1) / (mu_a * mu_a + mu_b * mu_b + c1) * cs_map
  per = lambda t: t.reshape((n, c) + t.shape[-2:])
  return per(ssim_map), per(cs_map)


def _avg_pool(x: jax.Array, f: int) -> jax.Array:
  """f x f average pooling, stride f, no padding (torch avg_pool2d(kernel_size=f)): (N, H // f, W // f, C)."""
  s = jax.lax.reduce_window(x, 0.0, jax.lax.add, (1, f, f, 1), (1, f, f, 1), 'VALID')
  return s / (f * f)


@functools.partial(cpu_kernels.jit, static_argnums=2)
def ssim(x, y, opts: SSIMOptions = SSIMOptions()) -> jax.Array:
  """(N,) SSIM (HIGHER = more similar) of float [0, 1] NHWC batches (module docstring)."""
  a, rng = to_colour(jnp.asarray(x, jnp.float32), opts.colour)
  b, _ = to_colour(jnp.asarray(y, jnp.float32), opts.colour)
  if opts.downsample == 'wang':
    f = max(1, round(min(a.shape[1:3]) / 256))
    if f > 1:
      a, b = _avg_pool(a, f), _avg_pool(b, f)
  s, _ = _ssim_cs(a, b, rng, opts)
  return s.mean(axis=-1)


def _halve(x: jax.Array, pool: str) -> jax.Array:
  """MS-SSIM's 2x downsampling between scales, as each reference does it."""
  h, w = x.shape[1:3]
  if pool == 'zero_pad':   # avg_pool2d(2, padding=(h % 2, w % 2)), count_include_pad=True: pads on both sides
    ph, pw = h % 2, w % 2
    x = jnp.pad(x, ((0, 0), (ph, ph), (pw, pw), (0, 0)))
  else:                    # piq: F.pad(replicate) by max(h % 2, w % 2) on the top and the left only
    p = max(h % 2, w % 2)
    x = jnp.pad(x, ((0, 0), (p, 0), (p, 0), (0, 0)), mode='edge')
  return _avg_pool(x, 2)


def ms_ssim_min_size(opts: SSIMOptions) -> int:
  """The smallest side MS-SSIM accepts: (size - 1) * 2^(scales - 1) + 1 (161 for 11 px and 5 scales)."""
  return (opts.size - 1) * 2 ** (len(opts.weights) - 1) + 1


@functools.partial(cpu_kernels.jit, static_argnums=2)
def ms_ssim(x, y, opts: SSIMOptions = SSIMOptions()) -> jax.Array:
  """(N,) MS-SSIM (HIGHER = more similar) of float [0, 1] NHWC batches of sides >= ms_ssim_min_size(opts)."""
  a, rng = to_colour(jnp.asarray(x, jnp.float32), opts.colour)
  b, _ = to_colour(jnp.asarray(y, jnp.float32), opts.colour)
  if min(a.shape[1:3]) < ms_ssim_min_size(opts):
    raise UserError(f'ms_ssim: images of {a.shape[1]}x{a.shape[2]} px; MS-SSIM with {len(opts.weights)} scales and '
                    f'a {opts.size} px window needs sides of at least {ms_ssim_min_size(opts)} px')
  levels = []
  for j in range(len(opts.weights)):
    if j:
      a, b = _halve(a, opts.pool), _halve(b, opts.pool)
    s, cs = _ssim_cs(a, b, rng, opts)
    levels.append(cs if j < len(opts.weights) - 1 else s)
  v = jax.nn.relu(jnp.stack(levels))                         # (scales, N, C)
  w = jnp.asarray(opts.weights, v.dtype)[:, None, None]
  return jnp.prod(v ** w, axis=0).mean(axis=-1)


# ------------------------------------------------------------------------------------------------ the zoo

METRICS = {'psnr': psnr, 'ssim': ssim, 'ms_ssim': ms_ssim, 'l1': l1, 'l2': l2}


def _unit(x) -> jax.Array:
  x = jnp.asarray(x)
  return x.astype(jnp.float32) / 255.0 if x.dtype == jnp.uint8 else x.astype(jnp.float32)


def distance(name: str, opts) -> callable:
  """The zoo's distance of a metric (smaller = more similar): 1 - ssim, 1 - ms_ssim, -psnr, l1, l2, as a pure
  function (x, y) -> (N,) of float [0, 1] or uint8 NHWC batches (uint8 divided by 255 inside). A pair of identical
  images gets exactly the value of identity (0; -80 dB for psnr): in one XLA program 2 mu_x mu_y and
  mu_x^2 + mu_y^2 may round differently (a fused multiply-add), which would break the exact ties JND ranks."""
  fn = METRICS[name]

  def d(x, y):
    x, y = _unit(x), _unit(y)
    v = fn(x, y, opts)
    v = 1.0 - v if name in ('ssim', 'ms_ssim') else -v if name == 'psnr' else v
    same = jnp.all(x == y, axis=tuple(range(1, x.ndim)))
    ident = -10.0 * np.log10(PSNR_EPS) if name == 'psnr' else 0.0
    return jnp.where(same, jnp.asarray(-ident if name == 'psnr' else ident, v.dtype), v)
  return d
