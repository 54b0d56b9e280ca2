"""The zoo's interface: a `Similarity` (what every protocol, the library and the search call) and the spec grammar.

See zoo/similarity.py for what each spec kind builds; here are the pieces every builder shares: `Options`,
`Similarity`, `parse` / `split_specs` (the form of a spec, checked before anything is read), the cosine distance,
the pooled-feature featurizer and the backbone a spec (or a trained head's meta) names.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from visim_jax.core import ops
from visim_jax.core.errors import UserError
from visim_jax.data.preprocess import Preprocess
from visim_jax.models import iqa as _iqa


KINDS = ('cosine', 'adapter', 'simnet', 'context', 'lpips', 'triplets', 'tuned')
# full-reference metrics (models/classical.py, models/dists.py; docs/metrics.md): a bare name is the default variant
METRIC_KINDS = {'psnr': 'rgb', 'ssim': 'pytorch_msssim', 'ms_ssim': 'pytorch_msssim', 'l1': 'rgb', 'l2': 'rgb',
                'dists': 'vgg'}
# the IQA metrics of models/iqa (issue 47): its registry METRICS names them (one line there adds a spec here, a
# `vj.load` name and a leaderboard model); a bare name is the first variant (piq's choices)
IQA_KINDS = tuple(_iqa.METRICS)
METRIC_KINDS.update({k: next(iter(m.variants)) for k, m in _iqa.METRICS.items()})
KINDS = KINDS + tuple(METRIC_KINDS)
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


def bad(entry: str, why: str) -> UserError:
  return UserError(f'{FIELD}: {entry!r}: {why}')


def run_file(spec: str, kind: str, target: str, option: str, filename: str) -> str:
  """The file a spec backed by a run names: `target` itself, or `filename` inside the workdir `target`; a run's
  file takes no @option (refused, naming the spec). Whether it exists is the caller's check (its own advice)."""
  if option:
    raise bad(spec, f'{kind}: takes no @option')
  return os.path.join(target, filename) if os.path.isdir(target) else target


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
  if not sep and kind in METRIC_KINDS:   # 'ssim' = 'ssim:pytorch_msssim', ...
    sep, rest = ':', METRIC_KINDS[kind]
  if not sep or kind not in KINDS:
    raise bad(spec, f'expected <kind>:<target> with kind one of {", ".join(KINDS)} '
                     '(e.g. cosine:dinov2_b14, adapter:workdirs/tll, lpips:alex)')
  target, at, option = rest.partition('@')
  if not target:
    raise bad(spec, f'nothing after {kind}:')
  if at and not option:
    raise bad(spec, 'nothing after @ (drop it, or name the layers: @block2+block5)')
  if kind == 'cosine' and option:
    layers = option.split('+')
    if '' in layers:
      raise bad(spec, "an empty layer name in @...: layers are joined by single '+' (e.g. @block2+block5)")
    dup = sorted({l for l in layers if layers.count(l) > 1})
    if dup:
      raise bad(spec, f'layer {dup[0]!r} is listed twice')
  if kind == 'lpips' and (target.partition(':')[0] not in LPIPS_NETS or target.partition(':')[2] not in ('', 'tiny')
                          or option):
    raise bad(spec, f'LPIPS nets are {", ".join("lpips:" + n for n in LPIPS_NETS)} (+ ":tiny": random weights)')
  return kind, target, option


def cosine_distance(params, f0, f1):
  """1 - cos(f0, f1) row-wise (params unused)."""
  del params
  f0, f1 = f0.astype(jnp.float32), f1.astype(jnp.float32)
  return 1.0 - jnp.sum(ops.l2_normalize(f0) * ops.l2_normalize(f1), -1)


def pooled_featurizer(backbone, layers, opts: Options, transform=None):
  from visim_jax.backbones import features

  def featurize(paths, tag, _pre):
    x = features.cached_features(backbone, paths, opts.cache_dir, layers=layers, tag=tag,
                                 batch_size=opts.batch_size, dtype=opts.dtype, progress=opts.progress)
    return x if transform is None else np.asarray(transform(x))
  return featurize


def backbone_from(spec: str, name: str, layers=None, weights_sha256: str | None = None, tiny: bool = False):
  """(backbone, layers) for a registry name; the weights must be the ones a trained head was fitted on."""
  from visim_jax.backbones import registry
  if not isinstance(name, str) or name not in registry.list_backbones():
    raise bad(spec, f'unknown backbone {name!r}; `python -m visim_jax.main --list_backbones` lists them')
  kwargs = {'tiny': True} if tiny else {}
  w = str(weights_sha256 or '')
  if w.startswith('random:'):   # random weights: 'random:<seed>' (random_init) or 'random:<seed>:tiny'
    seed, _, rest = w[len('random:'):].partition(':')
    kwargs = {'tiny': True} if rest == 'tiny' else {'random_init': int(seed)}
  try:
    backbone = registry.get_backbone(name, **kwargs)
  except UserError as e:   # e.g. no converted weights: the file and the command that writes it
    raise bad(spec, str(e)) from None
  layers = tuple(layers or backbone.layers)
  try:
    backbone.layer_dims(layers)
  except UserError as e:
    raise bad(spec, str(e).replace('config.layers: ', '')) from None
  if w and w != backbone.weights_id:
    raise bad(spec, f'the head was trained on {name} weights {w[:16]}..., the weights found here are '
                     f'{str(backbone.weights_id)[:16]}... (convert or point at the same weights)')
  return backbone, layers


def backbone_identity(backbone, layers) -> dict:
  return {'backbone': backbone.name, 'weights_sha256': backbone.weights_id, 'layers': list(layers),
          'preprocessing': backbone.preprocess.describe()}


def file_sha(path: str) -> str:
  h = hashlib.sha256()
  with open(path, 'rb') as f:
    for block in iter(lambda: f.read(1 << 20), b''):
      h.update(block)
  return h.hexdigest()
