r"""SimNet / SimNet* on a class-labelled set (paper 002: same class = similar), retrieval mAP vs cosine.

  python -m visim_jax.main --config=configs/simnet_classes.py --workdir=workdirs/simnet_classes
  python -m visim_jax.main --config=configs/simnet_classes.py:paper --workdir=DIR \
      --config.dataset=folder --config.data_dir=/path/to/landmarks   # <class>/<image> folders
  python -m visim_jax.main --config=configs/simnet_classes.py:local --workdir=/tmp/simnet_classes \
      --config.dataset=features --config.features=feats.npz          # features (N, D) + labels (N,)

Default (offline, CPU, 1-2 min on a fresh machine including feature extraction): both sides of the embedded demo
pairs as a labelled set (18 source photos = classes), EfficientNet-Lite0 features, PCA 128, architecture A, a
short warm-up, 1,000 steps of Eq. 2 (delta 0.4), then 500 SimNet* steps with difficult pairs. Optimiser: Adam
1e-3 for this small budget. `:paper` is the paper's recipe: architecture B, SGD lr 1e-3 momentum 0.9 weight
decay 5e-4 batch 100, warm-up on 22.5M random pairs, ~1M training pairs, SimNet* refinement, delta 0.8.
Oxford/Paris evaluation: --config.retrieval.gt=gnd_roxford5k.pkl (or the classic gt_files folder)
--config.retrieval.features=oxford_feats.npz (database, queries, optional imlist).
"""
from visim_jax.experiments.simnet import default_config


def get_config(arg=None):
  c = default_config()
  c.mode = 'classes'
  c.dataset = 'demo'
  c.architecture = 'A'
  c.pca_dim = 128
  c.delta = 0.4
  c.optimizer = 'adam'
  c.lr = 1e-3
  c.warmup_steps = 300
  c.steps = 1000
  c.refine_steps = 500
  c.hard_set_size = 200
  c.log_every = 100
  c.checkpoint_every = 500
  c.warmup_eval_pairs = 5000
  c.ks = (1, 5, 10)
  if arg == 'paper':
    c.dataset = 'folder'
    c.architecture = 'B'
    c.pca_dim = 0
    c.optimizer = 'sgd'
    c.lr = 1e-3
    c.delta = 0.8
    c.warmup_steps = 225_000
    c.steps = 10_000
    c.refine_steps = 10_000
    c.hard_set_size = 2000
    c.log_every = 1000
    c.checkpoint_every = 10_000
    c.warmup_eval_pairs = 100_000
  elif arg == 'local':
    c.architecture = '64,64'
    c.pca_dim = 0
    c.warmup_steps = 20
    c.steps = 60
    c.refine_steps = 40
    c.hard_set_size = 40
    c.log_every = 20
    c.checkpoint_every = 40
    c.warmup_eval_pairs = 200
    c.q_tile = c.d_tile = 16
    c.ks = (1, 3)
  elif arg:
    raise ValueError(f'configs/simnet_classes.py: unknown argument {arg!r} (known: paper, local)')
  return c
