r"""Learning from human judgements: a head on frozen features trained on NIGHTS with DreamSim's hinge loss.

  python -m visim_jax.main --config=configs/nights_adapt.py --workdir=workdirs/nights_adapt \
      --config.nights_dir=/path/to/nights --config.backbone=dinov2_b14
  python -m visim_jax.main --config=configs/nights_adapt.py:local --workdir=/tmp/nights_local \
      --config.nights_dir=/path/to/nights                               # the same data, 2 seeds x 5 epochs
  python -m visim_jax.main --config=configs/nights_adapt.py:demo --workdir=workdirs/nights_demo   # offline

Measured on the 2-core CPU box from empty caches (features extracted, programs compiled), load ~1.5, `python benchmarks/config_times.py`, 2026-11-25: `:demo` 21 s on the earlier mini set; on today's
graded one (load ~10, cold cache) 2 min 25 s, NIGHTS test 0.875 frozen, 0.8125 PCA, 0.8125 trained (24 training
triplets: the demo checks the wiring).

`nights_dir` holds data.csv, ref/ and distort/ (DreamSim's download). `model`: 'adapter' (paper 001's W + ReLU
over a PCA, exported as adapter.npz for `adapter:<workdir>`) or 'triplet' (paper 004's embedding head).
`:local` is a small quick mode (2 seeds x 5 epochs); `:demo` runs offline on the mini NIGHTS set of
visim_jax/data/human_demo.py with EfficientNet-Lite0's packaged weights.
"""
import ml_collections

from visim_jax.experiments import config_fields


def get_config(arg=None):
  c = ml_collections.ConfigDict()
  c.experiment = 'nights_adapt'
  c.dataset = 'nights'         # 'nights' | 'demo'
  c.nights_dir = ''            # the NIGHTS folder (data.csv, ref/, distort/)
  c.min_votes = 6              # DreamSim's filter: votes >= 6
  c.demo = ml_collections.ConfigDict({'root': '', 'seed': 0})

  # features (backbone, backbone_kwargs, layers, image_batch_size, dtype, cache_dir, pooling)
  config_fields.add_fields(c)

  # the head
  c.model = 'adapter'          # 'adapter' (paper 001: ReLU(W PCA(x))) | 'triplet' (paper 004: x W)
  c.pca_dim = 256              # 'adapter': PCA fit on the train images' features
  c.adapt_dim = 1024           # 'adapter': W's output size
  c.embed_dim = 256            # 'triplet': W's output size

  # training (DreamSim's MLP configs: margin 0.05, Adam lr 3e-4 betas (0.5, 0.999), batch 512, 20 epochs)
  c.margin = 0.05
  c.lr = 3e-4
  c.weight_decay = 0.0
  c.batch_size = 512
  c.epochs = 20
  c.seeds = 5                  # trained together (vmapped)
  c.seed = 0
  c.select_epoch = 'val_score'  # 'val_score' (best NIGHTS val 2AFC) | 'val_loss' (DreamSim's monitor) | 'last'

  # outputs
  c.n_boot = 1000              # bootstrap resamples of the 95% intervals
  c.checkpoint = True
  c.checkpoint_every = 5

  if arg == 'local':
    c.seeds, c.epochs, c.checkpoint_every, c.n_boot = 2, 5, 5, 200
  elif arg == 'demo':
    c.dataset = 'demo'
    c.pca_dim, c.adapt_dim, c.embed_dim = 32, 64, 32   # 24 train triplets = 72 train images
    c.batch_size, c.lr, c.epochs, c.seeds, c.checkpoint_every, c.n_boot = 8, 1e-3, 10, 3, 5, 200
  elif arg:
    raise ValueError(f'configs/nights_adapt.py: unknown argument {arg!r} (known: local, demo)')
  return c
