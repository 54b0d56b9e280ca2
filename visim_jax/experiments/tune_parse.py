"""The tune experiment's gate: config -> TuneOptions, every check here (one line naming the field), before anything
is read, built or allocated. Below this module nothing sees the config."""
from __future__ import annotations

import dataclasses

from visim_jax.backbones.features import FeatureOptions
from visim_jax.data import alignet, image_batches
from visim_jax.experiments import checks, config_fields, learn_triplets_parse
from visim_jax.losses import odd_one_out

SOURCES = ('nights', 'bapps', 'things', 'demo', 'folder', 'files', 'alignet')
TEACHER_SOURCES = ('demo', 'folder')
LOSS_FOR_TARGET = {'similarities': ('jsd', 'kl', 'hard'), 'odd': ('hard',), 'judge': ('hinge',)}
TUNES = ('lora', 'full', 'frozen')
HEADS = ('identity', 'affine')
ADAM_UPDATES = ('single', 'twice', 'twice_foreach')
HINGE_REFS = ('per_pair', 'shared')
TRANSFORMS = ('untransformed',)        # a teacher's triplets (demo, folder): its similarities as computed
PIXELS = ('backbone', 'alignet')       # the backbone's own preprocessing | AligNet's (image_batches.alignet_preprocess)


@dataclasses.dataclass(frozen=True)
class TuneOptions:
  source: str
  data: dict                    # the source's paths and numbers (nights_dir, min_votes, bapps sets, ...)
  features: FeatureOptions      # the tower (backbone fields)
  teacher: FeatureOptions | None  # teacher sources: the labelling backbone
  teacher_similarity: str
  triplets: dict                # teacher_labels.generate's n_train, n_val, clusters, sampling, val_fraction, ...
  feature: str
  head: str
  head_size: int
  tune: str
  lora: dict                    # r, alpha, dropout, targets (tuple), rslora
  hparams: dict                 # tower_step.Hparams fields but `steps` (known once the data is read)
  epochs: int
  steps: int                    # 0: epochs x steps per epoch
  batch_size: int
  fsdp: int
  transform: str                # AligNet's data variant (source 'alignet': its folder)
  pixels: str                   # PIXELS
  worker_count: int             # grain's decoding processes (0: threads of this process)
  eval_every: int
  checkpoint: bool
  checkpoint_every: int
  keep_checkpoints: int
  plots: bool
  leaderboard: bool
  ties: str
  seed: int
  adversarial_eval_steps: int = 100   # APGD steps of the held-out attacked accuracy (evaluation only)


def _names(text: str) -> tuple[str, ...]:
  return tuple(s.strip() for s in str(text).split(',') if s.strip())


def _adversarial(config, loss: str) -> dict:
  """config.adversarial ('' or one budget 'linf:4/255' / 'l2:3') -> the step's adv_* fields (training/tower_step)."""
  from visim_jax.metrics import attacks
  checks.text(config, 'adversarial')
  steps = checks.integer(config, 'adversarial_steps', 1, 10_000)
  checks.integer(config, 'adversarial_eval_steps', 1, 100_000, note=' (the authors evaluate with 100)')
  budgets = attacks.parse_budgets(config.adversarial, 'config.adversarial')
  if not budgets:
    return {}
  if len(budgets) > 1:
    raise checks.fail('adversarial', 'one budget trains (e.g. linf:4/255)', config.adversarial)
  if loss != 'hinge':
    raise checks.fail('adversarial', "attacked references need the 2AFC hinge (loss='hinge': NIGHTS / BAPPS "
                      'votes)', config.adversarial)
  norm, eps, _ = budgets[0]
  return {'adv_norm': norm, 'adv_eps': eps, 'adv_steps': steps}


def _loss(config, src: str) -> str:
  """config.loss; '' = the source's own: the hinge on 2AFC votes (nights, bapps; demo with `adversarial`, which
  needs votes: its mini NIGHTS), 'hard' on THINGS choices, the JSD on teacher triplets (demo, folder, alignet)."""
  loss = checks.choice(config, 'loss', ('',) + odd_one_out.LOSSES)
  if loss:
    return loss
  if src == 'files':
    raise checks.fail('loss', "source='files': name the loss of the index files' targets (hinge, jsd, kl, hard)",
                      loss)
  if src == 'demo':
    return 'hinge' if checks.text(config, 'adversarial').strip() else 'jsd'
  return {'nights': 'hinge', 'bapps': 'hinge', 'things': 'hard'}.get(src, 'jsd')


def validate_config(config) -> TuneOptions:
  return parse(config)


def parse(config) -> TuneOptions:
  src = checks.choice(config, 'source', SOURCES)
  checks.data_source(config, {'nights': (('nights_dir', 'dir'),), 'bapps': (('bapps_dir', 'dir'),),
                              'things': (('things_dir', 'dir'), ('things_file', 'file')),
                              'folder': (('image_dir', 'dir'),),
                              'files': (('train_file', 'file'), ('val_file', 'file')), 'demo': (),
                              'alignet': (('alignet_dir', 'dir'), ('tfds_data_dir', 'dir'), ('things_dir', 'dir'),
                                          ('things_file', 'file'))}, field='source')
  need = {'nights': ('nights_dir',), 'bapps': ('bapps_dir',), 'things': ('things_dir', 'things_file'),
          'folder': ('image_dir',), 'files': ('train_file', 'val_file'), 'alignet': ('alignet_dir',)}
  for f in need.get(src, ()):
    if not checks.text(config, f):
      raise checks.fail(f, f'required for source={src}', checks.get(config, f))
  checks.integer(config, 'min_votes', 0, 1000)
  for f in ('bapps_sets', 'bapps_val_sets'):
    if not _names(checks.text(config, f)):
      raise checks.fail(f, 'one or more comma-separated BAPPS 2AFC set names', checks.get(config, f))
  checks.integer(config, 'demo.n_pairs', 8, 10**5)
  checks.seed(config, 'demo.seed')
  learn_triplets_parse.check_teacher_fields(config)
  transform = checks.choice(config, 'transform', alignet.TRANSFORMS if src == 'alignet' else TRANSFORMS)
  for f in ('sampling', 'val_sampling'):
    v = checks.text(config, f)
    if f == 'sampling' and not v or v and not all(ch.isalnum() or ch in '_-' for ch in v):
      raise checks.fail(f, "a sampling of AligNet's release, e.g. 'cluster_border_500' (letters, digits, _ and -)",
                        v)
  pixels = checks.choice(config, 'pixels', PIXELS)
  worker_count = checks.integer(config, 'worker_count', 0, 1024)
  checks.choice(config, 'augment', image_batches.AUGMENT)
  features = config_fields.options(config)
  if features.pooling != 'mean':
    raise checks.fail('pooling', "a tuned tower is compared on its own feature (config.feature): use 'mean'",
                      config.pooling)
  loss = _loss(config, src)
  demo_votes = src == 'demo' and loss == 'hinge'   # the demo's 2AFC votes (its mini NIGHTS), no teacher
  teacher = None
  if src in TEACHER_SOURCES and not demo_votes:
    c = config.copy_and_resolve_references()
    with c.unlocked():
      c.backbone, c.layers = c.teacher.backbone, c.teacher.layers
      c.backbone_kwargs.weights, c.backbone_kwargs.random_init = '', -1
    if not c.backbone:
      raise checks.fail('teacher.backbone', f'a teacher labels the triplets of source={src}', c.backbone)
    teacher = config_fields.options(c)
  checks.text(config, 'feature')
  head = checks.choice(config, 'head', HEADS)
  checks.integer(config, 'head_size', 1, 2**16)
  tune = checks.choice(config, 'tune', TUNES)
  checks.integer(config, 'lora.r', 1, 4096)
  checks.number(config, 'lora.alpha', 0, 1e6, lo_open=True)
  checks.number(config, 'lora.dropout', 0, 1, hi_open=True)
  targets = _names(checks.text(config, 'lora.targets'))
  if tune == 'lora' and not targets:
    raise checks.fail('lora.targets', 'name the kernels LoRA adapts (e.g. qkv, or conv_head,project_conv)',
                      config.lora.targets)
  checks.flag(config, 'lora.rslora')
  sim = checks.choice(config, 'similarity', odd_one_out.SIMILARITIES)
  checks.number(config, 'tau', 0, 1e6, lo_open=True)
  checks.number(config, 'target_tau', 0, 1e6, lo_open=True)
  if sim == 'cosine' and loss in ('jsd', 'kl', 'hard') and float(config.tau) >= 10:
    raise checks.fail('tau', 'a softmax of cosines (in [-1, 1]) divided by tau >= 10 is near uniform and cannot '
                      "learn; use tau ~0.05 with similarity='cosine', or similarity='dot' (AligNet's tau 100)",
                      config.tau)
  if loss == 'hinge' and sim != 'cosine':
    raise checks.fail('similarity', "the hinge trains on DreamSim's distance 1 - cosine: use 'cosine'", sim)
  checks.number(config, 'margin', 0, 2)
  checks.choice(config, 'hinge_ref', HINGE_REFS)
  adv = _adversarial(config, loss)
  ties = checks.choice(config, 'ties', ('lt', 'le', 'split'))
  checks.number(config, 'lr', 0, 10, lo_open=True)
  checks.number(config, 'b1', 0, 1, hi_open=True)
  checks.number(config, 'b2', 0, 1, hi_open=True)
  checks.choice(config, 'adam_updates', ADAM_UPDATES)
  checks.number(config, 'weight_decay', 0, 1e3)
  checks.choice(config, 'schedule', ('constant', 'cosine'))
  checks.integer(config, 'warmup', 0, 10**9)
  epochs = checks.integer(config, 'epochs', 1, 10**6)
  steps = checks.integer(config, 'steps', 0, 10**9)
  batch = checks.integer(config, 'batch_size', 1, 2**20)
  accum = checks.integer(config, 'accum_steps', 1, 2**16)
  if batch % accum:
    raise checks.fail('accum_steps', f'must divide config.batch_size ({batch}): each pass takes batch_size / '
                      'accum_steps triplets', accum)
  checks.choice(config, 'compute_dtype', ('float32', 'bfloat16'))
  checks.flag(config, 'remat')
  fsdp = checks.integer(config, 'fsdp', 1, 2**16)
  seed = checks.seed(config)
  every = checks.integer(config, 'eval_every', 1, 10**9)
  checks.integer(config, 'checkpoint_every', 1, None)
  if config.checkpoint_every % every:
    raise checks.fail('checkpoint_every', f'must be a multiple of config.eval_every ({every}): checkpoints are '
                      'taken at the end of an evaluation chunk', config.checkpoint_every)
  checks.flag(config, 'checkpoint')
  keep = checks.integer(config, 'keep_checkpoints', 1, 10**6)
  checks.flag(config, 'plots')
  board = checks.flag(config, 'leaderboard')
  if board and tune == 'frozen':
    raise checks.fail('leaderboard', 'ranks the tuned tower against the frozen one: nothing is tuned with '
                      "tune='frozen'", board)
  trip = config.triplets
  return TuneOptions(
      source=src,
      data={'nights_dir': config.nights_dir, 'min_votes': config.min_votes, 'bapps_dir': config.bapps_dir,
            'bapps_sets': _names(config.bapps_sets), 'bapps_val_sets': _names(config.bapps_val_sets),
            'things_dir': config.things_dir, 'things_file': config.things_file, 'image_dir': config.image_dir,
            'train_file': config.train_file, 'val_file': config.val_file, 'demo_root': config.demo.root,
            'demo_n_pairs': config.demo.n_pairs, 'demo_seed': config.demo.seed, 'alignet_dir': config.alignet_dir,
            'sampling': config.sampling, 'val_sampling': config.val_sampling or config.sampling,
            'tfds_data_dir': config.tfds_data_dir,
            'things_after': src == 'alignet' and bool(config.things_dir), 'demo_votes': demo_votes},
      features=features, teacher=teacher, teacher_similarity=config.teacher.similarity,
      triplets=dict(n_train=trip.n_train, n_val=trip.n_val, clusters=trip.clusters, sampling=trip.sampling,
                    val_fraction=float(trip.val_fraction), kmeans_iters=trip.kmeans_iters),
      feature=config.feature, head=head, head_size=config.head_size, tune=tune,
      lora=dict(r=config.lora.r, alpha=float(config.lora.alpha), dropout=float(config.lora.dropout),
                targets=targets, rslora=config.lora.rslora),
      hparams=dict(tune=tune, loss=loss, similarity=sim, tau=float(config.tau), target_tau=float(config.target_tau),
                   margin=float(config.margin), lr=float(config.lr), b1=float(config.b1), b2=float(config.b2),
                   adam_updates=config.adam_updates, weight_decay=float(config.weight_decay),
                   schedule=config.schedule, warmup_steps=config.warmup, compute_dtype=config.compute_dtype,
                   remat=config.remat, accum_steps=accum, hinge_ref=config.hinge_ref, seed=seed, **adv),
      epochs=epochs, steps=steps, batch_size=batch, fsdp=fsdp, transform=transform, pixels=pixels,
      worker_count=worker_count, eval_every=every, checkpoint=config.checkpoint,
      checkpoint_every=config.checkpoint_every, keep_checkpoints=keep, plots=config.plots, leaderboard=board,
      ties=ties, seed=seed, adversarial_eval_steps=config.adversarial_eval_steps)
