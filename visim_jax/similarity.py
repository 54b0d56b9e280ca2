"""One interface for "a model that says how similar two images are", used by every benchmark protocol.

A `Similarity` is two functions and what feeds them:

  features = sim.featurize(paths, tag)        host: one feature row (or pytree of rows) per image, computed once
                                               per image set (pooled backbone features go through features.py's
                                               on-disk cache; the others are kept in memory for the run)
  d = sim.distance(sim.params, f0, f1)         pure, jittable, vmappable: (B, ...) x (B, ...) -> (B,) float32;
                                               SMALLER = MORE SIMILAR (cosine: 1 - cos; SimNet: -g([x0, x1]))
  pair_distances(sim, feats0, i, feats1, j)    the jitted boundary: d for rows i of feats0 against rows j of feats1,
                                               in fixed-size batches (one compilation for any count)
  distance_matrix(sim, feats0, feats1)          (N0, N1), row blocks vmapped (retrieval protocols: aR@k)

A spec string names one model (`config.models` is a comma-separated list of them):

  cosine:<backbone>[:tiny][@<layer>+<layer>...]   a registered backbone (`--list_backbones`), its pooled
                                                  multi-layer vector (features.py: spatial mean, L2 per layer,
                                                  concatenated; default layers as everywhere else), 1 - cosine.
                                                  ':tiny' = the family's tiny random member (tests, demos)
  adapter:<adapter.npz | paper-001 workdir>        paper 001's PCA + ReLU(W .) on the backbone features its meta
                                                  names (export.load_adapter), 1 - cosine of the adapted vectors
  simnet:<paper-002 workdir>                       SimNet g([x0, x1]) on the workdir's backbone features (L2 when
                                                  the run normalised them); distance -g. Not symmetric: the
                                                  protocols pass (reference, candidate) in that order
  context:<paper-004 workdir>[@<model>|@mean]      a CoSIS context-sensitive embedding head e(x) = x W on the
                                                  workdir's backbone features, 1 - cos(e(x0), e(x1)); @global (the
                                                  default when trained), @<context> (indoor, city, ...), or @mean:
                                                  the equal-weight fused distance of the 8 context models (the
                                                  ensembles' weighted rule with w_k = 1/K)
  triplets:<learn_triplets workdir | head.npz>   the head a `learn_triplets` run trained (its head.npz) on the
                                                  backbone features its meta names; 1 - cos of the head's
                                                  embeddings, or -<e0, e1> when it was trained on dot products
  lpips:alex | lpips:vgg [:tiny]                  LPIPS v0.1 (visim_jax/lpips.py): the images themselves are the
                                                  features (uint8 at the protocol's resolution: BAPPS 64x64 native,
                                                  224 elsewhere), the network runs inside `distance` (its spatial
                                                  maps would cost ~2 MB an image at 224)

Reading a spec never decodes an image; a bad spec is one line naming config.models and the entry.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from visim_jax import ops
from visim_jax.errors import UserError
from visim_jax.preprocess import Preprocess

KINDS = ('cosine', 'adapter', 'simnet', 'context', 'lpips', 'triplets')
LPIPS_NETS = ('alex', 'vgg')
FIELD = 'config.models'


@dataclasses.dataclass(frozen=True)
class Options:
  """How features are computed (from the config, parsed once at the boundary)."""
  cache_dir: str | None = None      # features.py's cache folder; None: nothing written
  batch_size: int = 32
  dtype: str = 'float32'
  progress: bool = True


@dataclasses.dataclass
class Similarity:
  spec: str                                    # as written in config.models
  kind: str
  distance: Callable[[Any, Any, Any], jax.Array]  # pure (params, f0, f1) -> (B,), smaller = more similar
  params: Any
  featurizer: Callable[[Sequence[str], str, Preprocess | None], Any]  # (paths, tag, protocol preprocess) -> rows
  identity: dict                               # what the scores depend on (weights hashes, files): fingerprinted
  preprocess: Preprocess | None = None         # None: the protocol's resolution (LPIPS)
  feature_key: tuple = ()                      # models with the same key share one featurize() per image set
  symmetric: bool = True
  backbone: Any = None                         # pooled-feature kinds: the Backbone, its layers and the row
  layers: tuple = ()                           # transform after pooling (adapter, SimNet's L2), for the
  transform: Callable | None = None            # Python API (visim_jax/api.py): images -> the rows `distance` takes

  def featurize(self, paths: Sequence[str], tag: str = 'images', protocol_preprocess: Preprocess | None = None):
    return self.featurizer(list(paths), tag, protocol_preprocess)


def _bad(entry: str, why: str) -> UserError:
  return UserError(f'{FIELD}: {entry!r}: {why}')


def split_specs(models: str) -> list[str]:
  """config.models -> a list of specs (every one checked for its form; duplicates refused)."""
  specs = [s.strip() for s in str(models).split(',') if s.strip()]
  if not specs:
    raise UserError(f'{FIELD}: empty; give comma-separated specs such as cosine:efficientnet_lite0,lpips:alex')
  for s in specs:
    parse(s)
  dup = sorted({s for s in specs if specs.count(s) > 1})
  if dup:
    raise UserError(f'{FIELD}: {dup[0]!r} is listed twice')
  return specs


def parse(spec: str) -> tuple[str, str, str]:
  """'kind:target@option' -> (kind, target, option); the form only (files and names are checked by build)."""
  kind, sep, rest = spec.partition(':')
  if not sep or kind not in KINDS:
    raise _bad(spec, f'expected <kind>:<target> with kind one of {", ".join(KINDS)} '
                     '(e.g. cosine:dinov2_b14, adapter:workdirs/tll, lpips:alex)')
  target, at, option = rest.partition('@')
  if not target:
    raise _bad(spec, f'nothing after {kind}:')
  if at and not option:
    raise _bad(spec, 'nothing after @ (drop it, or name the layers: @block2+block5)')
  if kind == 'cosine' and option:
    layers = option.split('+')
    if '' in layers:
      raise _bad(spec, "an empty layer name in @...: layers are joined by single '+' (e.g. @block2+block5)")
    dup = sorted({l for l in layers if layers.count(l) > 1})
    if dup:
      raise _bad(spec, f'layer {dup[0]!r} is listed twice')
  if kind == 'lpips' and (target.partition(':')[0] not in LPIPS_NETS or target.partition(':')[2] not in ('', 'tiny')
                          or option):
    raise _bad(spec, f'LPIPS nets are {", ".join("lpips:" + n for n in LPIPS_NETS)} (+ ":tiny": random weights)')
  return kind, target, option


def build(spec: str, opts: Options = Options()) -> Similarity:
  """The model a spec names (weights and files read now: a missing one fails here, naming the entry)."""
  kind, target, option = parse(spec)
  return {'cosine': _cosine, 'adapter': _adapter, 'simnet': _simnet, 'context': _context,
          'lpips': _lpips, 'triplets': _triplets}[kind](spec, target, option, opts)


# ----------------------------------------------------------------------------------------- distances

def cosine_distance(params, f0, f1):
  """1 - cos(f0, f1) row-wise (params unused)."""
  del params
  f0, f1 = f0.astype(jnp.float32), f1.astype(jnp.float32)
  return 1.0 - jnp.sum(ops.l2_normalize(f0) * ops.l2_normalize(f1), -1)


def _simnet_distance(params, f0, f1):
  from visim_jax import simnet
  return -simnet.apply(params, f0.astype(jnp.float32), f1.astype(jnp.float32))


def _context_distance(params, f0, f1):
  """Mean over the stacked heads W (K, D, E) of 1 - cos(f0 W_k, f1 W_k) (K = 1 for one model)."""
  def one(w):
    return cosine_distance(None, f0.astype(jnp.float32) @ w, f1.astype(jnp.float32) @ w)
  return jax.vmap(one)(params['w']).mean(0)


# ----------------------------------------------------------------------------------- pooled features

def _pooled_featurizer(backbone, layers, opts: Options, transform=None):
  from visim_jax import features

  def featurize(paths, tag, _pre):
    x = features.cached_features(backbone, paths, opts.cache_dir, layers=layers, tag=tag,
                                 batch_size=opts.batch_size, dtype=opts.dtype, progress=opts.progress)
    return x if transform is None else np.asarray(transform(x))
  return featurize


def _backbone_from(spec: str, name: str, layers=None, weights_sha256: str | None = None, tiny: bool = False):
  """(backbone, layers) for a registry name; the weights must be the ones a trained head was fitted on."""
  from visim_jax.backbones import registry
  if not isinstance(name, str) or name not in registry.list_backbones():
    raise _bad(spec, f'unknown backbone {name!r}; `python -m visim_jax.main --list_backbones` lists them')
  kwargs = {'tiny': True} if tiny else {}
  w = str(weights_sha256 or '')
  if w.startswith('random:'):   # random weights: 'random:<seed>' (random_init) or 'random:<seed>:tiny'
    seed, _, rest = w[len('random:'):].partition(':')
    kwargs = {'tiny': True} if rest == 'tiny' else {'random_init': int(seed)}
  try:
    backbone = registry.get_backbone(name, **kwargs)
  except UserError as e:   # e.g. no converted weights: the file and the command that writes it
    raise _bad(spec, str(e)) from None
  layers = tuple(layers or backbone.layers)
  try:
    backbone.layer_dims(layers)
  except UserError as e:
    raise _bad(spec, str(e).replace('config.layers: ', '')) from None
  if w and w != backbone.weights_id:
    raise _bad(spec, f'the head was trained on {name} weights {w[:16]}..., the weights found here are '
                     f'{str(backbone.weights_id)[:16]}... (convert or point at the same weights)')
  return backbone, layers


def _backbone_identity(backbone, layers) -> dict:
  return {'backbone': backbone.name, 'weights_sha256': backbone.weights_id, 'layers': list(layers),
          'preprocessing': backbone.preprocess.describe()}


def _file_sha(path: str) -> str:
  h = hashlib.sha256()
  with open(path, 'rb') as f:
    for block in iter(lambda: f.read(1 << 20), b''):
      h.update(block)
  return h.hexdigest()


def _cosine(spec, target, option, opts):
  name, _, variant = target.partition(':')
  if variant not in ('', 'tiny'):
    raise _bad(spec, "the only variant after the backbone name is ':tiny'")
  layers = tuple(l for l in option.split('+') if l) if option else None
  backbone, layers = _backbone_from(spec, name, layers, tiny=variant == 'tiny')
  ident = _backbone_identity(backbone, layers)
  return Similarity(spec, 'cosine', cosine_distance, None, _pooled_featurizer(backbone, layers, opts), ident,
                    backbone.preprocess, ('pooled', json.dumps(ident, sort_keys=True)), backbone=backbone,
                    layers=layers)


def _adapter(spec, target, option, opts):
  from visim_jax import export
  if option:
    raise _bad(spec, 'adapter: takes no @option')
  path = os.path.join(target, 'adapter.npz') if os.path.isdir(target) else target
  if not os.path.isfile(path):
    from visim_jax import workdir
    kind = workdir.recorded_experiment(target) if os.path.isdir(target) else None
    if kind == 'adapt':
      advice = f'write it from its checkpoints with `python -m visim_jax.export --workdir={target}`'
    elif kind == 'nights_adapt':
      advice = ('a nights_adapt run writes it when it ends (config.model=adapter): rerun that command to finish it; '
                'a triplet head is not an adapter')
    else:
      advice = 'give an adaptation workdir or an adapter.npz file'
    raise _bad(spec, f'{path}: no adapter.npz; {advice}')
  try:
    ad = export.load_adapter(path)
  except UserError as e:
    raise _bad(spec, str(e)) from None
  meta = ad.meta
  if not meta.get('backbone'):
    raise _bad(spec, f'{path}: the adapter was trained on a features file (meta.backbone is empty): it cannot '
                     'describe images')
  backbone, layers = _backbone_from(spec, meta['backbone'], meta.get('layers'), meta.get('weights_sha256'))
  export.check_backbone(ad, backbone, layers, f'{FIELD}: {spec!r}')
  transform = jax.jit(functools.partial(export.adapt_arrays, ad.mean, ad.components, ad.scale, ad.w))
  ident = {**_backbone_identity(backbone, layers), 'adapter_sha256': _file_sha(path)}
  return Similarity(spec, 'adapter', cosine_distance, None, _pooled_featurizer(backbone, layers, opts, transform),
                    ident, backbone.preprocess, ('adapter', path, ident['adapter_sha256']), backbone=backbone,
                    layers=layers, transform=transform)


def _read_metrics(spec: str, workdir: str) -> dict:
  path = os.path.join(workdir, 'metrics.json')
  if not os.path.isfile(path):
    raise _bad(spec, f'{path}: not found (give a finished run\'s workdir)')
  try:
    with open(path, encoding='utf-8') as f:
      m = json.load(f)
  except (ValueError, UnicodeDecodeError) as e:
    raise _bad(spec, f'{path}: unreadable ({" ".join(str(e).split())[:120]})') from None
  if not isinstance(m, dict):
    raise _bad(spec, f'{path}: not a run\'s metrics (a JSON object expected, got {type(m).__name__})')
  return m


def _restored(spec: str, what: str, fn):
  """fn() reading a trained model's files; a missing, truncated or mismatched file ends as one line naming
  the spec and `what` (the folder), never a traceback."""
  try:
    return fn()
  except UserError as e:
    raise _bad(spec, str(e)) from None
  except Exception as e:  # pylint: disable=broad-except  (Orbax / tensorstore / shape errors of a bad file)
    raise _bad(spec, f'{what}: cannot be restored ({type(e).__name__}: {" ".join(str(e).split())[:160]}); '
                     'give the workdir of a finished run') from None


def _simnet(spec, target, option, opts):
  from visim_jax import runtime
  if option:
    raise _bad(spec, 'simnet: takes no @option')
  m = _read_metrics(spec, target)
  cfg = m.get('config', {})
  if m.get('experiment') != 'simnet' or m.get('mode') == 'warmup':
    raise _bad(spec, f'{target}: not a SimNet run on images (experiment {m.get("experiment")!r}, mode '
                     f'{m.get("mode")!r})')
  if not m.get('backbone'):
    raise _bad(spec, f'{target}: SimNet was trained on a features file: it cannot describe images')
  if cfg.get('pca_dim', 0) or cfg.get('pooling', 'mean') != 'mean':
    raise _bad(spec, f'{target}: SimNet on PCA-reduced or R-MAC vectors is not supported here (the run keeps no '
                     'PCA); train with pca_dim=0 and pooling=mean')
  backbone, layers = _backbone_from(spec, m['backbone'], m.get('layers'), m.get('weights_sha256'))
  ckpt = os.path.join(target, 'checkpoints')
  params = jax.tree.map(jnp.asarray, _restored(spec, ckpt, lambda: runtime.latest_params(ckpt)))
  if not isinstance(params, dict) or not jax.tree.leaves(params):
    raise _bad(spec, f'{ckpt}: holds no SimNet parameters')
  normalize = bool(cfg.get('normalize', True))
  transform = ops.l2_normalize if normalize else None
  ident = {**_backbone_identity(backbone, layers), 'simnet_workdir': os.path.abspath(target),
           'params_sha256': _tree_sha(params), 'normalize': normalize}
  return Similarity(spec, 'simnet', _simnet_distance, params, _pooled_featurizer(backbone, layers, opts, transform),
                    ident, backbone.preprocess, ('pooled', json.dumps(_backbone_identity(backbone, layers),
                                                                      sort_keys=True), normalize), symmetric=False,
                    backbone=backbone, layers=layers, transform=transform)


def _tree_sha(tree) -> str:
  h = hashlib.sha256()
  for leaf in jax.tree.leaves(tree):
    h.update(np.ascontiguousarray(np.asarray(leaf)).tobytes())
  return h.hexdigest()


def _context(spec, target, option, opts):
  import orbax.checkpoint as ocp
  from visim_jax import triplets as cs
  m = _read_metrics(spec, target)
  if m.get('experiment') != 'twoafc':
    raise _bad(spec, f'{target}: not a CoSIS 2AFC (paper 004) workdir')
  feat, cm = m.get('features'), m.get('context_models')
  if not isinstance(feat, dict) or not isinstance(cm, dict) or not all(
      k in cm for k in ('models', 'contexts', 'hparams')) or 'dim' not in feat:
    raise _bad(spec, f'{target}/metrics.json: not a finished CoSIS run (features / context_models missing)')
  if feat.get('kind') != 'images':
    raise _bad(spec, f'{target}: its models were trained on {feat.get("kind")} features, not on a backbone\'s: '
                     'they cannot describe images (train with config.image_dir)')
  models, names = list(cm['models']), list(cm['contexts'])
  choice = option or ('global' if 'global' in models else 'mean')
  if choice != 'mean' and choice not in models:
    raise _bad(spec, f'no model {choice!r} in {target}; known: {", ".join(map(str, models))}, mean')
  backbone, layers = _backbone_from(spec, feat.get('backbone'), feat.get('layers'), feat.get('weights_sha256'))
  ckpt = os.path.join(os.path.abspath(target), 'checkpoints')

  def restore():
    hp = cs.Hparams(**{k: v for k, v in cm['hparams'].items() if k in cs.Hparams.__dataclass_fields__})
    template = {'state': jax.device_get(cs.init_state(hp, int(feat['dim']), len(models))),
                'loss': np.zeros((len(models), hp.steps), np.float32)}
    with ocp.CheckpointManager(ckpt, options=ocp.CheckpointManagerOptions(read_only=True)) as mngr:
      step = mngr.latest_step()
      if step is None:
        raise UserError(f'{ckpt}: no checkpoint')
      return mngr.restore(step, args=ocp.args.StandardRestore(template))['state']
  state = _restored(spec, ckpt, restore)
  w = np.asarray(state.params['embed']['w'])      # (K, D, E)
  rows = list(range(len(names))) if choice == 'mean' else [models.index(choice)]
  params = {'w': jnp.asarray(w[rows])}
  ident = {**_backbone_identity(backbone, layers), 'context_workdir': os.path.abspath(target), 'model': choice,
           'params_sha256': _tree_sha(params)}
  return Similarity(spec, 'context', _context_distance, params, _pooled_featurizer(backbone, layers, opts), ident,
                    backbone.preprocess, ('pooled', json.dumps(_backbone_identity(backbone, layers), sort_keys=True)),
                    backbone=backbone, layers=layers)


def _dot_distance(params, f0, f1):
  """-<f0, f1> row-wise (a head trained on raw dot products; params unused)."""
  del params
  return -jnp.sum(f0.astype(jnp.float32) * f1.astype(jnp.float32), -1)


def _triplets(spec, target, option, opts):
  from visim_jax import heads
  from visim_jax.experiments import learn_triplets
  if option:
    raise _bad(spec, 'triplets: takes no @option')
  path = os.path.join(target, 'head.npz') if os.path.isdir(target) else target
  if not os.path.isfile(path):
    raise _bad(spec, f'{path}: no head.npz (give a finished learn_triplets workdir)')
  params, meta = learn_triplets.load_head(path)
  if not meta.get('backbone'):
    raise _bad(spec, f'{path}: the head was trained on synthetic features: it cannot describe images')
  backbone, layers = _backbone_from(spec, meta['backbone'], meta.get('layers'), meta.get('weights_sha256'))
  transform = jax.jit(functools.partial(heads.apply, meta['head'], params))
  ident = {**_backbone_identity(backbone, layers), 'head_sha256': _file_sha(path)}
  dist = _dot_distance if meta.get('similarity') == 'dot' else cosine_distance
  return Similarity(spec, 'triplets', dist, None, _pooled_featurizer(backbone, layers, opts, transform), ident,
                    backbone.preprocess, ('triplets', path, ident['head_sha256']))


def _lpips(spec, target, option, opts):
  try:
    from visim_jax import lpips
  except ImportError as e:
    raise _bad(spec, f'LPIPS is not available ({e})') from None
  net, _, variant = target.partition(':')
  model = lpips.load_lpips(net, tiny=variant == 'tiny')
  net_id = getattr(model, 'weights_id', None) or target

  def distance(params, u0, u1):   # uint8 images (embed divides by 255: its [0, 1] input, then LPIPS's scaling)
    return lpips.pair_distance(params, u0, u1)   # identical images: exactly 0, as the reference

  def featurize(paths, tag, pre):
    if pre is None:
      raise ValueError('lpips needs the protocol resolution')
    return ImageTable(tuple(paths), pre)
  return Similarity(spec, 'lpips', distance, model, featurize, {'lpips': target, 'version': '0.1',
                                                                'weights': str(net_id)}, None, ('images',))


@dataclasses.dataclass(frozen=True)
class ImageTable:
  """LPIPS's features: the images, decoded and resized (uint8) when a batch of rows is taken (a table of
  full-resolution images would not fit in memory on NIGHTS)."""
  paths: tuple
  preprocess: Preprocess

  def __len__(self) -> int:
    return len(self.paths)

  def take(self, idx) -> np.ndarray:
    from visim_jax.data import images
    x = images.load_batch([self.paths[i] for i in np.asarray(idx).tolist()], self.preprocess)
    return x if x.dtype == np.uint8 else np.clip(np.rint(x), 0, 255).astype(np.uint8)


# --------------------------------------------------------------------------------- the jitted boundary

def take_rows(feats, idx):
  """Rows `idx` of a feature table (an array, a pytree of arrays, or an ImageTable)."""
  if isinstance(feats, ImageTable):
    return feats.take(idx)
  return jax.tree.map(lambda a: a[idx], feats)


def _num_rows(feats) -> int:
  return len(feats) if isinstance(feats, ImageTable) else int(jax.tree.leaves(feats)[0].shape[0])


def pair_distances(sim: Similarity, feats0, i, feats1=None, j=None, batch_size: int = 256,
                   progress: bool = False, desc: str = 'pairs') -> np.ndarray:
  """d(feats0[i[t]], feats1[j[t]]) for every t, float32 (T,), in fixed-size batches gathered on the host (a
  progress bar with progress=True: the protocols show one where the network runs per pair, LPIPS)."""
  feats1 = feats0 if feats1 is None else feats1
  i, j = np.asarray(i, np.int64), np.asarray(j, np.int64)
  t = len(i)
  out = np.empty(t, np.float32)
  if t == 0:
    return out
  bs = max(1, min(batch_size, 1 << (t - 1).bit_length()))   # a power of two: few compilations across sets
  fn = _jitted(sim.distance)
  from tqdm.auto import tqdm
  with tqdm(total=t, desc=desc, unit='pair', disable=not progress, leave=False) as bar:
    for s in range(0, t, bs):
      n = min(bs, t - s)
      ii = np.pad(i[s:s + n], (0, bs - n))
      jj = np.pad(j[s:s + n], (0, bs - n))
      out[s:s + n] = np.asarray(fn(sim.params, take_rows(feats0, ii), take_rows(feats1, jj)))[:n]
      bar.update(n)
  return out


def distance_matrix(sim: Similarity, feats0, feats1, row_block: int = 8) -> np.ndarray:
  """(N0, N1) distances: rows of feats0 in blocks, each against every row of feats1 (vmapped)."""
  n0, n1 = _num_rows(feats0), _num_rows(feats1)
  out = np.empty((n0, n1), np.float32)
  fn = _jitted_rows(sim.distance)
  f1 = take_rows(feats1, np.arange(n1)) if isinstance(feats1, ImageTable) else feats1
  f1 = jax.tree.map(jnp.asarray, f1)
  for s in range(0, n0, row_block):
    n = min(row_block, n0 - s)
    idx = np.pad(np.arange(s, s + n), (0, row_block - n))
    out[s:s + n] = np.asarray(fn(sim.params, take_rows(feats0, idx), f1))[:n]
  return out


@functools.lru_cache(maxsize=64)
def _jitted(distance):
  return jax.jit(distance)


@functools.lru_cache(maxsize=64)
def _jitted_rows(distance):
  def rows(params, a, b):
    n1 = _num_rows(b)
    return jax.vmap(lambda x: distance(params, jax.tree.map(lambda v: jnp.broadcast_to(v, (n1,) + v.shape), x),
                                       b))(a)
  return jax.jit(rows)
