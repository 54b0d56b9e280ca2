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
decay 5e-4 (weights only) batch 100, N(0, 0.01^2) init, VGG16 conv5_3 R-MAC 512-d (max side 1024, PCA-whitening
on --config.rmac.whiten_on=<Paris6k jpg folder>), warm-up on 22.5M random pairs drawn as the authors do, 100
epochs of ~1M training pairs, SimNet* refinement, delta 0.8 (docs/simnet.md: the fidelity table). VGG16 weights:
`python -m visim_jax.backbones.convert --backbone=vgg16 --checkpoint=vgg16-397923af.pth`.
`:paper_demo` runs that recipe on the offline demo (a tiny random VGG16 when no weights are installed, said in
metrics.json) with CPU budgets.
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
  if arg in ('paper', 'paper_demo'):
    # paper 002 Sec. 4.1-4.3 + the authors' code where the paper is silent (docs/simnet.md, fidelity table)
    c.dataset = 'folder'                       # Landmarks(-Extra): data_dir/<class>/<image>
    c.backbone, c.pooling = 'vgg16', 'rmac'    # off-the-shelf VGG16 conv5_3 R-MAC, 512-d
    c.rmac.max_side, c.rmac.levels = 1024, 3
    c.rmac.whiten_on = ''                      # set: Paris6k images (the paper whitens every set with Paris)
    c.image_batch_size = 8
    c.architecture = 'B'
    c.init, c.init_std = 'normal', 0.01        # init_simnet_simplenn.m: f * randn, f = 1/100; zero biases
    c.pca_dim = 0
    c.optimizer, c.lr, c.momentum, c.weight_decay, c.batch_size = 'sgd', 1e-3, 0.9, 5e-4, 100
    c.decay_biases = False                     # weightDecay [1 0]
    c.warmup_x_dist = 'cube'                   # imdb_random_vectors.m
    c.delta = 0.8                              # the released SimNet* model (SimNetPlus_delta08)
    c.warmup_steps = 225_000                   # 22.5M random pairs (Sec. 4.3)
    c.warmup_eval_pairs = 100_000
    c.steps = 1_000_000                        # train.m: 100 epochs of ~1M image pairs, batch 100
    c.refine_steps = 1_000_000                 # SimNet*: "until convergence one more time": the same budget
    c.hard_set_size = 2000
    c.log_every = 1000
    c.checkpoint_every = 10_000
    if arg == 'paper_demo':
      # the same recipe on the offline demo set: a tiny random VGG16 stands in when no weights are installed
      # (metrics.json's weights_sha256 then reads random:0:tiny:no-weights-at:<path>); CPU budgets
      c.dataset = 'demo'
      c.backbone_kwargs.missing_weights = 'tiny_random'
      c.rmac.max_side = 256
      c.warmup_steps, c.warmup_eval_pairs = 200, 2000
      c.steps, c.refine_steps = 300, 200
      c.hard_set_size = 100
      c.log_every, c.checkpoint_every = 100, 100
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
    raise ValueError(f'configs/simnet_classes.py: unknown argument {arg!r} (known: paper, paper_demo, local)')
  return c
