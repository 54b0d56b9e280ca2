"""The config fields every experiment shares, parsed once at the boundary: config -> typed options.

Below experiments/ nothing reads an ml_collections config: features take `features.FeatureOptions`, data loaders
take paths and numbers. Here: the backbone fields (`add_fields` for configs/, `check_fields`, `options(config)` ->
FeatureOptions), the data source (`select_source`, `recorded_config`, `pairs(config)` -> the image pairs a config
names), and `matmul_precision`.
"""
from __future__ import annotations

from visim_jax.backbones.features import FeatureOptions, cache_dir
from visim_jax.core import precision
from visim_jax.core.errors import UserError
from visim_jax.experiments import checks



BACKBONE_FIELDS = ('backbone', 'backbone_kwargs', 'layers', 'image_batch_size', 'dtype', 'cache_dir', 'pooling',
                   'rmac')


def add_fields(c):
  """Adds the backbone fields (see the module docstring) to an ml_collections ConfigDict."""
  import ml_collections
  c.backbone = 'efficientnet_lite0'
  c.backbone_kwargs = ml_collections.ConfigDict({'weights': '', 'random_init': -1, 'tiny': False})
  c.layers = ''
  c.image_batch_size = 32
  c.dtype = 'float32'
  c.cache_dir = ''
  c.image_cache = False    # keep decoded, resized pixels (memory-mapped, <cache_dir>/images): a second model with
                           # the same preprocessing over the same images skips decoding (data/pipeline.py)
  c.pooling = 'mean'       # 'mean' (multi-layer, paper 001) | 'rmac' (R-MAC of config.rmac.layer, paper 002)
  from visim_jax.backbones import rmac  # pylint: disable=g-import-not-at-top
  c.rmac = ml_collections.ConfigDict(rmac.Options().describe())
  c.matmul_precision = 'default'  # 'default' | 'high' | 'highest': 'default' | 'high' | 'highest'
  return c


def check_fields(config) -> None:
  """The numeric fields add_fields adds (config.image_batch_size, backbone_kwargs.random_init, rmac.*), checked
  before anything runs (experiments/checks.py), whether or not this run uses them."""
  checks.integer(config, 'image_batch_size', 1, 2**16)
  checks.integer(config, 'backbone_kwargs.random_init', -1, checks.SEED_MAX, note=' (-1: off)')
  if 'image_cache' in config:
    checks.flag(config, 'image_cache')
  if 'matmul_precision' in config:
    checks.choice(config, 'matmul_precision', precision.MATMUL_PRECISIONS)
  if 'rmac' in config:
    checks.integer(config, 'rmac.levels', 1, 16)
    checks.integer(config, 'rmac.max_side', 32, 2**15)
    checks.integer(config, 'rmac.whiten_dim', 0, 2**16, note=' (0: as many as channels)')


def options(config) -> FeatureOptions:
  """config's backbone fields -> FeatureOptions; every check here, naming the field (nothing is built)."""
  from visim_jax.backbones import rmac
  check_fields(config)
  checks.choice(config, 'dtype', ('float32', 'bfloat16'))
  pooling = config.get('pooling', 'mean')
  if pooling not in ('mean', 'rmac'):
    raise UserError(f"config.pooling: 'mean' or 'rmac', got {pooling!r}")
  kwargs = tuple((k, v) for k, v in config.backbone_kwargs.items()
                 if not (v is None or v == '' or (isinstance(v, bool) and not v) or (k == 'random_init' and v < 0)))
  rmac_opts = rmac.Options(**config.rmac.to_dict()) if pooling == 'rmac' else None
  return FeatureOptions(config.backbone, kwargs, tuple(l.strip() for l in config.layers.split(',') if l.strip()),
                        config.image_batch_size, config.dtype, cache_dir(config.get('cache_dir', '')), pooling,
                        rmac_opts, bool(config.get('image_cache', False)))


def select_source(config):
  """A non-empty config.features alone selects the precomputed-features source (dataset='features')."""
  if config.get('features') and config.get('dataset') not in ('features', None):
    config = config.copy_and_resolve_references()
    config.dataset = 'features'
  return config


IMAGE_SOURCE_FIELDS = ('data_dir', 'subset', 'demo')


def recorded_config(config, uses_backbone: bool) -> dict:
  """The config as a run records it: without the backbone and image-source fields when the source is
  precomputed features (or random vectors): options that do not apply are not recorded as if used."""
  d = config.to_dict()
  if not uses_backbone:
    for k in BACKBONE_FIELDS + IMAGE_SOURCE_FIELDS:
      d.pop(k, None)
  return d


def demo_root(config) -> str:
  """The embedded demo pairs a config names (config.demo.{root, n_pairs, seed}, config.cache_dir), written once."""
  from visim_jax.data import demo  # pylint: disable=g-import-not-at-top
  return demo.demo_pairs(config.demo.root or None, config.demo.n_pairs, config.demo.seed,
                         cache_dir=config.get('cache_dir') or None)


def pairs(config):
  """(pairs, root) a config names: dataset 'demo' (the embedded set, written once under config.demo.root or
  config.cache_dir) or else data_dir + subset."""
  from visim_jax.data import pairs as pairs_lib  # pylint: disable=g-import-not-at-top
  if config.dataset == 'demo':
    root = demo_root(config)
    return pairs_lib.load_pairs(root), root
  return pairs_lib.load_pairs(config.data_dir, config.subset or None), config.data_dir
