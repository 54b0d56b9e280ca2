r"""Histogram metrics of a representation (paper 003: Wu et al., "Beyond Accuracy"): overlap, aSTD, kNN.

  python -m visim_jax.main --config=configs/histograms.py --workdir=workdirs/histograms
  python -m visim_jax.main --config=configs/histograms.py:local --workdir=/tmp/hist_local

Measured on the 2-core CPU box from empty caches (features extracted, programs compiled), load ~1.5, `python benchmarks/config_times.py`, 2026-11-25: `:local` 24 s, overlap 0.0877, aSTD inter 0.0724, kNN accuracy 0.9427.

The default runs offline: the embedded demo set's classes (both sides of each pair are samples of its source
photo), EfficientNet-Lite0 features from the feature cache, and a small built-in class tree. Other sources:

  # one sub-folder per class
  ... --config.dataset=folder --config.data_dir=/path/to/images --config.class_tree=''
  # a prepared TFDS dataset (tfds.data_source), e.g. ImageNet with the WordNet tree (parent child lines)
  ... --config.dataset=tfds --config.tfds.name=imagenet2012 --config.tfds.split=validation \
      --config.class_tree=/path/to/wordnet.is_a.txt --config.backbone=dinov2_s14
  # precomputed features: an .npz with features (N, D), labels (N,), optional class_names
  ... --config.dataset=features --config.features=feats.npz --config.class_tree=''

Documentation (every field, the fidelity table): docs/histograms.md. `:local` is a smaller, faster mode
(fewer demo pairs, fewer random pairs, 3 standard-error replicates).
"""
import ml_collections

from visim_jax.experiments import config_fields


def get_config(arg=None):
  c = ml_collections.ConfigDict()
  c.experiment = 'histograms'
  c.dataset = 'demo'           # 'demo' | 'folder' | 'tfds' | 'features'
  c.data_dir = ''              # dataset=folder: root/<class>/<images>
  c.features = ''              # dataset=features: .npz with features, labels[, class_names]
  c.tfds = ml_collections.ConfigDict({'name': '', 'split': 'validation', 'data_dir': '', 'image_key': 'image',
                                      'label_key': 'label', 'max_examples': 0})  # 0 = the whole split
  c.demo = ml_collections.ConfigDict({'root': '', 'n_pairs': 192, 'seed': 0})

  # features (image sources)
  # backbone, backbone_kwargs.{weights,random_init,tiny}, layers ('' = its default pooled stages),
  # image_batch_size, dtype ('float32' | 'bfloat16'), cache_dir ('' = ~/.cache/visim_jax/features)
  config_fields.add_fields(c)

  # method (paper Sec. 3, 4.1, 9.1)
  c.normalization = 'target'   # 'none' | 'target' (this set's mean/std, the paper's default) | 'source'
  c.source_stats = ''          # normalization=source: .npz with `mean` and `std` (D,)
  c.bins = 100
  c.min_class_size = 10        # Sec. 4.1: classes with fewer images are omitted
  c.sample_fraction = 1.0      # Tables 5, 10: evaluate a random fraction of the samples (seeded by `seed`)
  c.pairs = ml_collections.ConfigDict({
      'mode': 'auto',          # 'auto' (exhaustive when it fits, else random; one estimator per run) | 'random'
                               # | 'exhaustive' (every pair, blocked exact pass; refused with an estimate if too big)
      'n_intra': 10_000,       # random: intra pairs per class
      'n_inter': 10_000,       # random: inter pairs per class
      'exhaustive_max': 50_000_000,  # auto: exhaustive when the run has at most this many pairs
      'max_seconds': 86_400.0,  # exhaustive: refuse when the time estimate is larger
      'tile': 0,               # exhaustive: block size (0 = 256 on CPU, 1024 on accelerators)
      'chunk_elems': 0,        # random: floats gathered per side per round (0 = 2^19 on CPU, 2^26 else)
  })
  c.se_replicates = 5          # standard errors: bootstrap replicates (exhaustive) / extra seeds (random); 0 = none
  c.pairwise_max_classes = 256  # pairwise maximal overlap ((C, C, bins) counts) for at most this many classes
  c.knn = ml_collections.ConfigDict({'k': 10, 'queries': 10_000})  # k=0: no kNN; queries=0: every sample
  c.seed = 0
  c.shard = True               # shard the sample axis over all devices when there are several

  # hierarchy (paper Sec. 4): '' = none, 'demo' = the built-in tree of the demo set, or a parent->children file
  c.class_tree = 'demo'
  c.tree_min_children = 3      # Sec. 4.1: nodes with more than 2 children (holding samples)

  # outputs
  c.plots = True
  c.plot_classes = ''          # comma-separated class names for the Fig. 1 plot; '' = lowest/median/highest overlap

  if arg == 'local':
    c.demo.n_pairs = 96
    c.pairs.n_intra = c.pairs.n_inter = 2_000
    c.se_replicates = 3
    c.knn.queries = 0
  elif arg:
    raise ValueError(f'configs/histograms.py: unknown argument {arg!r} (known: local)')
  return c
