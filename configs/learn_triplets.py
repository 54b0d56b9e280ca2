r"""Learning similarity from odd-one-out triplets (AligNet's recipe) or 2AFC votes, on frozen features, on every device.

  python -m visim_jax.main --config=configs/learn_triplets.py:local --workdir=/tmp/lt_local   # synthetic, seconds
  python -m visim_jax.main --config=configs/learn_triplets.py:demo --workdir=workdirs/lt_demo  # offline, real weights
  python -m visim_jax.main --config=configs/learn_triplets.py --workdir=workdirs/lt \
      --config.source=folder --config.image_dir=/data/images --config.teacher.backbone=vgg16 \
      --config.backbone=efficientnet_lite0
  python -m visim_jax.main --config=configs/learn_triplets.py --workdir=workdirs/lt_files \
      --config.source=files --config.train_file=T.npz --config.val_file=V.npz
  python -m visim_jax.main --config=configs/learn_triplets.py --workdir=workdirs/lt_index \
      --config.source=folder --config.image_dir=/data/images --config.teacher.backbone=vgg16 \
      --config.generate_only=True                                       # the index files only

Defaults are AligNet's code (configs/siglip.py, losses.py) where our features allow: JSD on soft targets, an affine
1024-d head, Adam 3e-5 with 5k warm-up steps and cosine decay over 100k steps, weights decayed towards their initial
values (1.0), batch 512, triplets drawn across cluster borders of 500 k-means clusters. The temperatures are ours:
the student's pooled features are L2-normalised and the teacher gives cosines, so both sides are cosines at
temperature 0.05 (AligNet's tau = 100 divides raw dot products of unnormalised ViT outputs, and its stored teacher
similarities are logits; cosine with tau = 100 learns nothing and is refused: docs/learn_triplets.md, Fidelity).
`:local`: synthetic features (512 images x 32 dims, a random non-linear teacher), 300 steps. `:demo`: the embedded
demo photos (data/demo.py, 192 images), AlexNet (packaged weights) as teacher, EfficientNet-Lite0 as student.
Measured on the 2-core box shared with other sessions (load 15-18), 2026-11-25: `:local` 39 s, held-out accuracy
0.550 frozen -> 0.896 trained; `:demo` 2 min 23 s from empty caches, 0.822 frozen Lite0 -> 0.898 trained.
docs/learn_triplets.md has the fidelity table.
"""
import ml_collections

from visim_jax.experiments import config_fields


def get_config(arg=None):
  c = ml_collections.ConfigDict()
  c.experiment = 'learn_triplets'
  c.source = 'demo'            # 'demo' | 'folder' | 'files' | 'synthetic' | 'things' | 'nights' | 'alignet'
  c.image_dir = ''             # 'folder': the image set the teacher labels
  c.train_file = ''            # 'files': index files (visim_jax/data/triplet_index.py format)
  c.val_file = ''
  c.things_dir = ''            # 'things': the THINGS images and a triplet file (data/things.py forms)
  c.things_file = ''
  c.nights_dir = ''            # 'nights': data.csv, ref/, distort/ (train and val splits)
  c.min_votes = 6              # 'nights': DreamSim's filter
  # 'alignet': AligNet's release, <alignet_dir>/<transform>/{train,val}_<sampling>.npz over TFDS imagenet2012 train
  c.alignet_dir = ''
  c.transform = 'untransformed'  # 'untransformed' | 'uncertainty_distillation'
  c.sampling = 'cluster_border_500'
  c.val_sampling = ''          # '' = sampling
  c.tfds_data_dir = ''         # '' = TFDS's default
  c.demo = ml_collections.ConfigDict({'root': '', 'n_pairs': 96, 'seed': 0})
  c.synthetic = ml_collections.ConfigDict({'n_images': 512, 'dim': 32, 'teacher_dim': 16, 'seed': 0})
  c.teacher = ml_collections.ConfigDict({'backbone': 'vgg16', 'layers': '', 'similarity': 'cosine'})
  c.triplets = ml_collections.ConfigDict({'n_train': 10_000_000, 'n_val': 10_000, 'clusters': 500,
                                          'sampling': 'border', 'val_fraction': 0.2, 'kmeans_iters': 10})

  # the student's features (backbone, layers, image_batch_size, dtype, cache_dir, ...)
  config_fields.add_fields(c)

  # the head and the loss
  c.head = 'affine'            # 'affine' (AligNet) | 'mlp' (DreamSim) | 'adapter' (paper 001) | 'embed' (paper 004)
  c.size = 1024                # embedding size (hidden size for 'mlp')
  c.loss = 'jsd'               # 'jsd' | 'kl' (soft targets) | 'hard' (odd-one-out choices) | 'hinge' (2AFC)
  c.similarity = 'cosine'      # 'cosine' | 'dot' (AligNet: normalize=False, raw dots of unnormalised ViT outputs)
  c.tau = 0.05                 # student temperature: softmax(s / tau); cosines span [-1, 1] (AligNet: 100 on dots)
  c.target_tau = 0.05          # teacher temperature: softmax(t / target_tau) of the teacher's cosines (AligNet: its
                               # stored similarities are logits already, 1)
  c.margin = 0.05              # 'hinge' (DreamSim)
  c.ties = 'lt'                # accuracy: a tie is wrong (AligNet's TripletAccuracy); 'le' DreamSim's THINGS rule

  # optimisation (AligNet: Adam, decay to init 1.0, warm-up 5k + cosine, 3e-5, batch 512, 100k steps)
  c.lr = 3e-5
  c.warmup = 5000              # steps of linear lr warm-up (AligNet: 5k)
  c.schedule = 'cosine'        # 'cosine' | 'constant'
  c.steps = 100_000
  c.weight_decay = 1.0
  c.b1 = 0.9
  c.b2 = 0.999
  c.batch_size = 512
  c.seed = 0

  # outputs
  c.eval_every = 1000
  c.checkpoint = True
  c.checkpoint_every = 5000
  c.plots = True
  c.generate_only = False      # 'demo' / 'folder': write the teacher's triplets_{train,val}.npz and stop

  if arg == 'local':
    c.source = 'synthetic'
    c.triplets.update({'n_train': 20_000, 'n_val': 2_000, 'clusters': 16})
    c.head, c.size, c.similarity, c.tau, c.target_tau = 'affine', 32, 'cosine', 0.05, 0.05
    c.lr, c.warmup, c.steps, c.weight_decay, c.batch_size = 1e-2, 20, 300, 0.0, 128
    c.eval_every, c.checkpoint_every = 50, 100
  elif arg == 'demo':
    c.source = 'demo'
    c.backbone, c.teacher.backbone = 'efficientnet_lite0', 'alexnet'
    c.triplets.update({'n_train': 20_000, 'n_val': 2_000, 'clusters': 12})
    c.head, c.size, c.similarity, c.tau, c.target_tau = 'affine', 256, 'cosine', 0.05, 0.05
    c.lr, c.warmup, c.steps, c.weight_decay, c.batch_size = 3e-3, 25, 200, 0.0, 256
    c.eval_every, c.checkpoint_every = 25, 100
  elif arg:
    raise ValueError(f'configs/learn_triplets.py: unknown argument {arg!r} (known: local, demo)')
  return c
