"""The Python API: a similarity model in one call, for researchers who import rather than configure.

    import visim_jax as vj
    model = vj.load('dreamsim_ensemble')        # any config.models spec: 'lpips:alex', 'cosine:efficientnet_lite0',
    d = model.distance(img0, img1)              # 'adapter:workdirs/tll', ...; smaller = more similar
    e = model.embed(images)                     # (N, D) for embedding models

`load(spec)` takes every spec `config.models` takes (visim_jax/zoo/similarity.py builds the model: the same weights,
layers and distance as the command line) plus three short forms: a bare backbone name (`'dreamsim_ensemble'` =
`'cosine:dreamsim_ensemble'`), `'dreamsim'` (the ensemble) and `'lpips'` / `'lpips_alex'` / `'lpips_vgg'`. When the
backbone's converted weights are not on this machine and visim_jax/hub/sources.py names their public checkpoint, they
are downloaded, checked and converted once (visim_jax/fetch.py); offline (VISIM_OFFLINE=1 or HF_HUB_OFFLINE=1) the
error names the command to run where the network is allowed.

Images (`distance`, `embed`): a path, a PIL image, an (H, W, 3) array, an (N, H, W, 3) array or a list of any of
these. Arrays are uint8 0..255 or float in [0, 1]; a float array outside [0, 1] (a [-1, 1] or 0..255 float image) is
refused in one line, never silently rescaled. Embedding models read every image through the command line's path
(data/images.py: RGB, the backbone's resize and crop; features.extract: the same jitted program, batch size and
padding), so `embed` equals the cached feature of the same image (float [0, 1] arrays are rounded to uint8 first,
as data/images.from_array does). LPIPS compares the images at the size given (both of a pair the same size),
floats in [0, 1] as they are.

The functional form, for JAX code (jit, vmap, grad; e.g. LPIPS or DreamSim as a training loss):

    params = model.params                            # a pytree
    f = model.apply(params, x)                       # x: float NHWC in [0, 1], traced or concrete
    d = model.apply_distance(params, x0, x1)         # (N,), pure: sim.distance(apply(x0), apply(x1))

    x = model.preprocess(images)                     # exactly the float [0, 1] array distance / embed feed the model

For embedding models x must already have the model's input size (`model.image_size`, e.g. 224): `model.preprocess`
gives it (the command line's decode, resize and crop), so `apply_distance(params, preprocess(a), preprocess(b))`
equals `distance(a, b)`; `apply` returns the rows `distance` compares ((N, D)). For LPIPS x may be any size >= 31 px
(alex) and `apply` returns LPIPS's five normalised maps; `model.distance_map(a, b)` is LPIPS's per-pixel map (the
reference's `spatial=True`). A concrete float x outside [0, 1] is refused as above; a traced
x cannot be checked: the rule is [0, 1].

Beyond one number (docs/library.md; zoo/library.py, zoo/spatial.py, models/spatial.py): `distance_map(a, b)` for
every kind that has a map, `distance(a, b, mask=m)`, `resize='shorter' | 'HxW'` for models that compare same-size
images, `load(spec, image_size=N)` for ViT towers (position embeddings interpolated), `load(spec,
input_range='-1,1')` for LPIPS's [-1, 1] convention (`model.input_spec` says what a model reads), and
`calibrate(model, judgements)` -> probabilities people would give (zoo/calibrated.py).
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np

from visim_jax.core.errors import UserError
# how the library reads images (zoo/inputs.py); maps, masks, resize=, image_size=, input_range= are zoo/library.py's
from visim_jax.zoo.inputs import _as_items, _check_array, _load_items, _lpips_batch  # pylint: disable=protected-access

WHERE = 'visim_jax.load'
SHORT = {'dreamsim': 'cosine:dreamsim_ensemble', 'lpips': 'lpips:alex', 'lpips_alex': 'lpips:alex',
         'lpips_vgg': 'lpips:vgg', **{m: m for m in ('psnr', 'ssim', 'ms_ssim', 'l1', 'l2', 'dists')}}


def resolve_spec(spec: str) -> str:
  """A short form (module docstring) -> the full spec; a full spec is returned as it is."""
  spec = str(spec).strip()
  if spec in SHORT:
    return SHORT[spec]
  from visim_jax.zoo.interface import METRIC_KINDS  # pylint: disable=g-import-not-at-top
  if spec in METRIC_KINDS:   # the full-reference metrics by name ('fsim', 'gmsd', ...: models/iqa's registry)
    return spec
  if ':' not in spec:
    from visim_jax.backbones import registry  # pylint: disable=g-import-not-at-top
    try:
      return 'cosine:' + registry.canonical(spec)
    except ValueError:
      raise UserError(f'{WHERE}: {spec!r}: not a backbone name nor a spec; give a name from `python -m '
                      'visim_jax.main --list_backbones` or a spec such as cosine:efficientnet_lite0, lpips:alex, '
                      'adapter:WORKDIR') from None
  return spec


def _backbone_of(spec: str) -> str | None:
  """The weights name (fetch.py) a cosine spec (with real weights) or DISTS (its alpha / beta) reads, else None."""
  kind, _, rest = spec.partition(':')
  name, _, variant = rest.partition('@')[0].partition(':')
  if kind == 'dists':
    return 'dists' if not variant else None
  return name if kind == 'cosine' and not variant else None


@dataclasses.dataclass
class Model:
  """A loaded similarity model (see the module docstring). `similarity` is the command line's model object."""
  spec: str
  similarity: Any
  batch_size: int = 32
  dtype: str = 'float32'
  progress: bool = False
  input_range: str = '0,1'

  @property
  def kind(self) -> str:
    return self.similarity.kind

  @property
  def is_embedding(self) -> bool:
    return self.similarity.backbone is not None

  @property
  def image_size(self) -> int | None:
    """The input size `apply` expects (embedding models); None for LPIPS (any size)."""
    return self.similarity.preprocess.size if self.is_embedding else None

  @property
  def params(self):
    """The pytree `apply` and `apply_distance` take: {'backbone': the network's variables, 'head': the trained
    head's parameters (SimNet, context models; None otherwise)}, or the LPIPS parameters."""
    sim = self.similarity
    if self.is_embedding:
      return {'backbone': sim.backbone.variables, 'head': sim.params}
    return getattr(sim.params, 'params', sim.params)   # LPIPS / DISTS parameters; None for the pixel metrics

  def __repr__(self) -> str:
    return f'visim_jax.Model({self.spec!r}, kind={self.kind!r})'

  # ------------------------------------------------------------------------------------------ host API

  def embed(self, images) -> np.ndarray:
    """(N, D) float32: the rows `distance` compares (cosine / adapter: the vectors whose 1 - cos is the distance)."""
    if not self.is_embedding:
      raise UserError(f'{WHERE}: {self.spec!r} is not an embedding model (LPIPS compares two images through the '
                      'network): use model.distance(img0, img1)')
    from visim_jax.backbones import features  # pylint: disable=g-import-not-at-top
    sim = self.similarity
    items, _ = _as_items(self._input_range(images), 'images')
    feats = features.extract(sim.backbone, items, sim.layers, batch_size=self.batch_size, dtype=self.dtype,
                             progress=self.progress, desc='embed', loader=_load_items)
    return feats if sim.transform is None else np.asarray(sim.transform(feats))

  def distance(self, img0, img1, *, mask=None, resize: str = 'none'):
    """Distances between img0[i] and img1[i] (smaller = more similar): (N,) float32, or a float when both are
    single images. SimNet is not symmetric: img0 is the reference. mask: (H, W) or (N, H, W) boolean at img0's
    size, the distance over the locations it marks (docs/library.md "Masks"). resize: models that compare
    same-size images ('none': refuse different sizes; 'shorter'; 'HxW'; docs/library.md "Any resolution")."""
    from visim_jax.zoo import scoring  # pylint: disable=g-import-not-at-top
    if self.input_range != '0,1':   # converted once here, then read as [0, 1]
      return self._plain().distance(self._input_range(img0), self._input_range(img1), mask=mask, resize=resize)
    sim = self.similarity
    _, single0 = _as_items(img0, 'img0')
    _, single1 = _as_items(img1, 'img1')
    if mask is not None or resize != 'none':
      from visim_jax.zoo import library as api_spatial  # pylint: disable=g-import-not-at-top
      return api_spatial.masked_distance(self, img0, img1, mask, resize, single0 and single1)
    if self.is_embedding:
      f0, f1 = self.embed(img0), self.embed(img1)
      if len(f0) != len(f1):
        raise UserError(f'{WHERE}: img0 has {len(f0)} images, img1 {len(f1)}: give pairs')
      d = np.asarray(scoring._jitted(sim.distance)(sim.params, f0, f1))  # pylint: disable=protected-access
    else:
      from visim_jax.models import lpips  # pylint: disable=g-import-not-at-top
      x0, x1 = _lpips_batch(self._input_range(img0), 'img0'), _lpips_batch(self._input_range(img1), 'img1')
      if len(x0) != len(x1):
        raise UserError(f'{WHERE}: img0 has {len(x0)} images, img1 {len(x1)}: give pairs')
      if x0.shape != x1.shape:
        raise UserError(f'{WHERE}: img0 {x0.shape} and img1 {x1.shape} differ: {self.kind} compares same-size images '
                        "(pass resize='shorter' or resize='HxW', or resize them first)")
      fn = ((lambda a, b: lpips.lpips_distance(sim.params, a, b)) if self.kind == 'lpips' else  # metrics (docs/metrics.md)
            (lambda a, b: scoring._jitted(sim.distance)(sim.params, a, b)))  # pylint: disable=protected-access
      d = np.concatenate([np.asarray(fn(x0[s:s + self.batch_size], x1[s:s + self.batch_size]))
                          for s in range(0, len(x0), self.batch_size)]) if len(x0) else np.zeros(0, np.float32)
    return float(d[0]) if single0 and single1 else d

  def preprocess(self, images) -> np.ndarray:
    """The float32 NHWC array in [0, 1] that `distance` / `embed` feed the network for these images: embedding
    models decode, resize and crop to `image_size` exactly as the command line does (data/images.py), LPIPS takes
    the images at their own size. So `apply_distance(params, preprocess(a), preprocess(b))` equals `distance(a, b)`
    (to float32 rounding) and `apply(params, preprocess(x))` equals `embed(x)`."""
    images = self._input_range(images)
    if self.is_embedding:
      items, _ = _as_items(images, 'images')
      if not items:
        size = self.image_size
        return np.zeros((0, size, size, 3), np.float32)
      # the command line's loader: the 0..255 scale, uint8 or (torch_bilinear resizing: ViTs, DreamSim) float32
      return np.asarray(_load_items(items, self.similarity.preprocess), np.float32) / np.float32(255.0)
    x = np.asarray(_lpips_batch(images, 'images'))
    return x.astype(np.float32) / np.float32(255.0) if x.dtype == np.uint8 else x.astype(np.float32)

  def distance_map(self, img0, img1, *, resize: str = 'none'):
    """Where the images differ: (N, H, W) float32, or (H, W) for two single images; larger = more different. Every
    kind has its own map (docs/library.md "Maps"; visim_jax/models/spatial.py): LPIPS's per-pixel map (the
    reference's `spatial=True`), 1 - the SSIM map, per-pixel L1 / L2 / squared error, DISTS per location, and for
    embedding models the model's distance between per-location features at the network's input size
    (`model.image_size`: the map is on `model.preprocess(img)`). A model with no map says so in one line."""
    from visim_jax.zoo import library as api_spatial  # pylint: disable=g-import-not-at-top
    from visim_jax.zoo import spatial as zoo_spatial  # pylint: disable=g-import-not-at-top
    if self.input_range != '0,1':
      return self._plain().distance_map(self._input_range(img0), self._input_range(img1), resize=resize)
    fn = zoo_spatial.map_fn(self.similarity)
    _, single0 = _as_items(img0, 'img0')
    _, single1 = _as_items(img1, 'img1')
    x0, x1, _ = api_spatial.pair_inputs(self, img0, img1, resize)
    jf = api_spatial.cached_jit(self.similarity, 'map', fn)
    params = self.params
    size = tuple(x0.shape[1:3])
    m = np.concatenate([np.asarray(jf(params, x0[s:s + self.batch_size], x1[s:s + self.batch_size]))
                        for s in range(0, len(x0), self.batch_size)]) if len(x0) else np.zeros((0,) + size, np.float32)
    same = np.all(x0 == x1, axis=(1, 2, 3)) if len(x0) else np.zeros(0, bool)
    m = np.where(same[:, None, None], np.float32(0), m)   # identical images: exactly 0, as the zoo's distances
    return m[0] if single0 and single1 else m

  @property
  def input_spec(self) -> str:
    """What `distance`, `embed`, `distance_map` and `apply` read, in one line (docs/library.md "Input ranges")."""
    rng = ('float in [-1, 1] (LPIPS\'s convention, input_range=\'-1,1\'), uint8 0..255' if self.input_range == '-1,1'
           else 'float in [0, 1] or uint8 0..255')
    size = (f'resized and cropped to {self.image_size}x{self.image_size} as the command line does'
            if self.is_embedding else 'at their own size, both of a pair the same (resize= to change that)')
    return f'{self.spec}: RGB NHWC images, {rng}; {size}'

  def _plain(self) -> 'Model':
    return dataclasses.replace(self, input_range='0,1')

  def _input_range(self, images):
    """input_range='-1,1': float arrays in [-1, 1] -> [0, 1] ((x + 1) / 2), checked; anything else as it is."""
    if self.input_range != '-1,1':
      return images
    from visim_jax.zoo import library as api_spatial  # pylint: disable=g-import-not-at-top
    return api_spatial.from_minus_one(images)

  # ------------------------------------------------------------------------------------- functional API

  def apply(self, params, x):
    """Pure: float NHWC x in [0, 1] -> the rows `distance` compares (embedding models, x at image_size) or
    LPIPS's five normalised maps. Jittable, vmappable, differentiable in params and x."""
    from visim_jax.models import lpips  # pylint: disable=g-import-not-at-top
    sim = self.similarity
    x = lpips.as_unit_range(x, 'x', WHERE)
    if not self.is_embedding:
      return lpips.embed(params, x) if self.kind == 'lpips' else x   # the metrics compare the images themselves
    from visim_jax.backbones import features  # pylint: disable=g-import-not-at-top
    size = sim.preprocess.size
    if tuple(x.shape[1:3]) != (size, size):
      raise UserError(f'{WHERE}: apply takes images of the model\'s input size {size}x{size} (model.image_size), '
                      f'got {x.shape[1]}x{x.shape[2]}: resize them first, or use model.embed / model.distance')
    x = sim.preprocess.normalise(x * 255.0)
    _, stages = sim.backbone.apply_fn(params['backbone'], x)
    f = features.pool(stages, sim.layers)
    return f if sim.transform is None else sim.transform(f)

  def apply_distance(self, params, x0, x1):
    """Pure: (N,) distances between float NHWC batches in [0, 1] (see `apply`); a training loss."""
    from visim_jax.models import lpips  # pylint: disable=g-import-not-at-top
    if not self.is_embedding:
      if self.kind != 'lpips':   # psnr, ssim, ms_ssim, l1, l2, dists
        return self.similarity.distance(params, self.apply(params, x0), self.apply(params, x1))
      return lpips.distance(params, self.apply(params, x0), self.apply(params, x1))
    return self.similarity.distance(params['head'], self.apply(params, x0), self.apply(params, x1))


# -------------------------------------------------------------------------------------------------- load

def load(spec: str, *, fetch: bool = True, batch_size: int = 32, dtype: str = 'float32',
         progress: bool = False, image_size: int | None = None, input_range: str = '0,1') -> Model:
  """The model SPEC names (module docstring), its weights fetched and converted once when missing (fetch=False:
  never download; the error names the command). image_size: a ViT tower at another input size, its position
  embeddings interpolated (backbones/resolution.py; default: the paper's, e.g. 224). input_range: '0,1' (float
  arrays in [0, 1], the default) or '-1,1' (LPIPS's convention: float arrays in [-1, 1])."""
  if input_range not in ('0,1', '-1,1'):
    raise UserError(f"{WHERE}: input_range={input_range!r}; '0,1' (the default) or '-1,1' (LPIPS's convention)")
  from visim_jax.zoo import interface, similarity  # pylint: disable=g-import-not-at-top
  try:
    spec = resolve_spec(spec)
  except UserError as e:
    raise UserError(_library_words(str(e))) from None
  kind, _, rest = spec.partition(':')
  target = rest.partition('@')[0]
  if kind in ('adapter', 'simnet', 'context', 'triplets', 'tuned') and target and not os.path.exists(target):
    raise UserError(f'{WHERE}: {spec!r}: {target}: not found (relative to {os.getcwd()}); give the workdir of a '
                    'finished run or its file')
  name = _backbone_of(spec)
  if fetch and name is not None:
    from visim_jax import fetch as fetch_lib  # pylint: disable=g-import-not-at-top
    fetch_lib.ensure_weights(name, progress=True)
  if dtype not in ('float32', 'bfloat16'):
    raise UserError(f"{WHERE}: dtype={dtype!r}; 'float32' or 'bfloat16'")
  if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= 2**16:
    raise UserError(f'{WHERE}: batch_size={batch_size!r}; an integer in 1..65536 (images per forward pass)')
  try:
    sim = similarity.build(spec, interface.Options(cache_dir=None, batch_size=batch_size, dtype=dtype,
                                                    progress=progress))
  except UserError as e:   # the zoo speaks of config.models (the command line); here the argument is the spec
    raise UserError(_library_words(str(e))) from None
  if image_size is not None:
    from visim_jax.zoo import library as api_spatial  # pylint: disable=g-import-not-at-top
    sim = api_spatial.at_image_size(spec, sim, image_size, interface.Options(
        cache_dir=None, batch_size=batch_size, dtype=dtype, progress=progress))
  return Model(spec, sim, batch_size, dtype, progress, input_range)


def calibrate(model: Model, judgements, **kwargs):
  """A logistic map from the model's distance to the probability people answer "same" (JND judgements) or prefer
  one image (2AFC), with a bootstrap interval: visim_jax/zoo/calibrated.py (docs/library.md "Calibrated answers")."""
  from visim_jax.zoo import calibrated  # pylint: disable=g-import-not-at-top
  return calibrated.calibrate(model, judgements, **kwargs)


def load_calibration(path: str, model: Model | None = None):
  """A calibration `Calibration.save` wrote, attached to `model` (the spec it was fitted for)."""
  from visim_jax.zoo import calibrated  # pylint: disable=g-import-not-at-top
  return calibrated.load_calibration(path, model)


def plot_calibration(cal, path: str) -> None:
  """The reliability plot of a calibration (plots/calibration.py): predicted vs observed per bin, as a PNG."""
  from visim_jax.plots import calibration as plot_lib  # pylint: disable=g-import-not-at-top
  plot_lib.reliability(cal.reliability, path, f'{cal.spec} ({cal.kind}; ECE {cal.calibration_error:.3f})')


def _library_words(msg: str) -> str:
  """A zoo error in the library's words: `visim_jax.load: <spec>: ...` instead of `config.models: <spec>: ...`."""
  from visim_jax.zoo import interface  # pylint: disable=g-import-not-at-top
  head = f'{interface.FIELD}: '
  return f'{WHERE}: ' + msg[len(head):] if msg.startswith(head) else msg


# ------------------------------------------------------------------------------------------------ attack

def attack(model: Model, ref, img0, img1, target, *, norm: str = 'linf', eps: float = 4 / 255, steps: int = 100,
           method: str = 'apgd', loss: str = 'ce', restarts: int = 1, random_start: bool = True,
           step_size: float = 0.0, seed: int = 0, return_success: bool = False):
  """The references of 2AFC items perturbed to flip the model's answer (docs/robustness.md; metrics/attacks.py):
  ref, img0, img1 float NHWC in [0, 1] (embedding models at `model.image_size`: see `model.preprocess`), target
  (N,) 1 where the humans chose img1 (a human fraction: > 0.5 is img1). Returns x_adv (N, H, W, 3) float32, each
  within `eps` of ref in `norm` ('linf' | 'l2') and inside [0, 1] (and the (N,) bool of flipped decisions with
  return_success=True). `method` 'apgd' (Croce & Hein's step-size schedule and momentum) or 'pgd'."""
  import jax  # pylint: disable=g-import-not-at-top
  from visim_jax.metrics import attacks  # pylint: disable=g-import-not-at-top
  if not isinstance(model, Model):
    raise UserError(f'visim_jax.attack: model must be a visim_jax.load(...) model, got {type(model).__name__}')
  x = [np.asarray(v) for v in (ref, img0, img1)]
  for what, a in zip(('ref', 'img0', 'img1'), x):
    if a.ndim != 4 or a.shape[-1] != 3 or a.shape != x[0].shape:
      raise UserError(f'visim_jax.attack: {what} has shape {a.shape}; ref, img0 and img1 are (N, H, W, 3) batches '
                      'of one shape')
    _check_array(a.astype(np.float32) / 255.0 if a.dtype == np.uint8 else a, what)
  x = [a.astype(np.float32) / np.float32(255.0) if a.dtype == np.uint8 else a.astype(np.float32) for a in x]
  t = np.asarray(target, np.float32).reshape(-1)
  if t.shape[0] != x[0].shape[0]:
    raise UserError(f'visim_jax.attack: target has {t.shape[0]} values for {x[0].shape[0]} items')
  opts = attacks.AttackOptions(str(norm).lower(), float(eps), steps, method, loss, restarts, bool(random_start),
                               float(step_size)).check('visim_jax.attack')
  fn = attacks.make(model.apply_distance, opts)
  x_adv, success = fn(model.params, *x, t, jax.random.PRNGKey(seed))
  x_adv, success = np.asarray(x_adv), np.asarray(success)
  return (x_adv, success) if return_success else x_adv
