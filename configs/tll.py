r"""The adaptation experiment on Totally Looks Like (paper 001: Risser-Maroix et al., ICIP 2021).

  python -m visim_jax.main --config=configs/tll.py --workdir=workdirs/tll \
      --config.data_dir=/path/to/TLL --config.subset=/path/to/TLL_obj.csv --config.backbone=clip_rn50x4

`data_dir` holds left/ and right/ (a pair = the same file name in both). `subset` restricts to TLL_obj
(4,199 names; the authors' TLL_obj.csv, also in ../shared/data/tll/). `:local` is a small quick mode (3 runs x
30 epochs) that needs the same data; with no data at all use configs/demo.py:local (the embedded pairs):

  python -m visim_jax.main --config=configs/tll.py:local --workdir=/tmp/tll_local --config.data_dir=/path/to/TLL

Precomputed features: --config.features=feats.npz alone selects them
(with left_flip/right_flip arrays in the file for the flip view; without them the run says so and goes on;
one of the two alone is refused).
"""
import ml_collections

from visim_jax.experiments import config_fields


def get_config(arg=None):
  c = ml_collections.ConfigDict()
  c.experiment = 'adapt'
  c.dataset = 'tll'            # 'tll' | 'demo' | 'features'
  c.data_dir = ''              # TLL root (left/, right/)
  c.subset = ''                # list of pair names (e.g. TLL_obj.csv); '' = every pair in data_dir
  c.features = ''              # precomputed .npz (dataset='features')
  c.demo = ml_collections.ConfigDict({'root': '', 'n_pairs': 192, 'seed': 0})

  # features
  # backbone, backbone_kwargs.{weights,random_init,tiny}, layers ('' = its default pooled stages),
  # image_batch_size, dtype ('float32' | 'bfloat16'), cache_dir ('' = ~/.cache/visim_jax/features)
  config_fields.add_fields(c)
  c.flip = True                # mirrored images as a second training view (reference code)

  # method
  c.pca_dim = 256
  c.pca_fit = 'train'          # 'train' (the pairs each run trains on) | 'all' (reference: every vector + mirrored)
  c.pca_whiten = False
  c.adapt_dim = 1024
  c.sigmas = (15.0,)           # temperatures of Eq. 1, trained in one program; Table 1: (1, 15)
  c.lr = 1e-3
  c.epochs = 150
  c.train_dtype = 'float32'    # matmul inputs of the training step; 'bfloat16' on accelerators (f32 accumulation)

  # protocol
  c.runs = 20
  c.train_fraction = 0.75
  c.select_epoch = 'val'       # epoch rule: 'val' (held-out part of each training split) | 'last' | 'test' (optimistic)
  c.val_fraction = 0.1         # share of each run's training split held out to pick the epoch (select_epoch='val')
  c.min_val_pairs = 50         # fewer validation pairs per run: the headline is the last epoch (said, and recorded)
  c.seed = 0
  c.ks = (1, 5, 20)

  # outputs
  c.checkpoint = True
  c.checkpoint_every = 25
  c.plots = True
  c.sheet_queries = 6

  if arg == 'local':
    c.runs, c.epochs, c.checkpoint_every = 3, 30, 10
  elif arg:
    raise ValueError(f'configs/tll.py: unknown argument {arg!r} (known: local)')
  return c
