r"""CoSIS 2AFC (paper 004: Liao & Chen, KDD 2024): context-sensitive models and their ensembles.

  python -m visim_jax.main --config=configs/twoafc.py --workdir=workdirs/twoafc
  python -m visim_jax.main --config=configs/twoafc.py:local --workdir=/tmp/twoafc      # quick
  python -m visim_jax.main --config=configs/twoafc.py --workdir=workdirs/cosis \
      --config.annotations=/path/to/cosis --config.image_dir=/path/to/BG-20k              # real features
  python -m visim_jax.main --config=configs/twoafc.py --workdir=workdirs/cosis --config.features=feats.npz

Measured on the 2-core CPU box from empty caches (features extracted, programs compiled), load ~1.5, `python benchmarks/config_times.py`, 2026-11-25: `:local` 33 s on the real CoSIS annotations (../shared/data/cosis)
with stand-in features: every accuracy at chance, e.g. mulref_test cosine 0.5052, as it should be.

Offline default: the real CoSIS annotation files from ../shared/data/cosis (a synthetic CoSIS-format set when
that folder is absent) with STAND-IN features (seeded random vectors keyed by image id). Those runs check the
pipeline: on the real annotations their out-of-sample accuracies are at chance (metrics.json says so under
`features`; docs/twoafc.md says which numbers are not, and why). Real numbers need config.image_dir (BG-20k: train/ and testval/) or config.features (.npz with
`features` (N, D) and `names`: ids such as `val/715` or BG-20k names). Docs: docs/twoafc.md.
"""
import ml_collections

from visim_jax.experiments import config_fields


def get_config(arg=None):
  c = ml_collections.ConfigDict()
  c.experiment = 'twoafc'
  c.annotations = ''           # CoSIS folder; '' = ../shared/data/cosis if present else synthetic; 'synthetic'
  c.features = ''              # .npz keyed by image id (features, names)
  c.image_dir = ''             # BG-20k folder: features extracted with config.backbone (cached)
  c.stand_in_dim = 128         # stand-in features (neither features nor image_dir)

  # backbone (image_dir only)
  # backbone, backbone_kwargs.{weights,random_init,tiny}, layers ('' = its default pooled stages),
  # image_batch_size, dtype ('float32' | 'bfloat16'), cache_dir ('' = ~/.cache/visim_jax/features)
  config_fields.add_fields(c)

  # context-sensitive models (one head per dist_<ref> set + the global model, one vmapped program)
  c.model = ml_collections.ConfigDict({
      'split': 'file_order',     # authors': last third of each file held out; 'random': seeded, by row
      'train_fraction': 2 / 3, 'embed_dim': 256, 'hidden': 256,   # hidden 0: linear ranking block
      'triplet_weight': 0.1, 'normalize': True, 'lr': 1e-3, 'weight_decay': 1e-4, 'steps': 1000,
      'batch_size': 64, 'swap': True, 'global_model': True, 'chunk_steps': 250})

  # ensembles (fitted on mulref_val, evaluated on mulref_test); authors' dist_cluster.py values
  c.ensemble = ml_collections.ConfigDict({
      'grid': 200, 'window': 10, 'threshold': 0.75,
      'pca_fit': 'val',          # PCA fitted on the mulref_val references; 'authors': 320 of them + the 8 contexts
      'mlp_dim': 64, 'mlp_hidden': 16, 'mlp_epochs': 200, 'mlp_lr': 1e-3, 'mlp_alpha': 1e-4, 'mlp_batch': 200,
      'mlp_seeds': 3, 'sweep': True})

  c.n_boot = 1000              # bootstrap resamples (references / annotation rows) for the intervals; 0: none
  c.ci_level = 0.95
  c.seed = 0
  c.plots = True

  if arg == 'local':
    c.stand_in_dim = 32
    c.model.embed_dim, c.model.hidden, c.model.steps, c.model.chunk_steps = 32, 32, 100, 50
    c.ensemble.mlp_epochs, c.ensemble.mlp_seeds = 50, 2
    c.n_boot = 100
  elif arg:
    raise ValueError(f'configs/twoafc.py: unknown argument {arg!r} (known: local)')
  return c
