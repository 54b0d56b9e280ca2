"""The learn_triplets experiment's gate: its config checked once (validate_config) and its training hyper-parameters
(hparams_from_config), before anything is read or allocated."""
from __future__ import annotations

from visim_jax.core.errors import UserError
from visim_jax.experiments import checks
from visim_jax.models import heads
from visim_jax.losses import odd_one_out
from visim_jax.data import teacher_labels
from visim_jax.training import head_step
from visim_jax.experiments import config_fields

SOURCES = ('demo', 'folder', 'files', 'synthetic', 'things', 'nights', 'alignet')
LOSS_FOR_TARGET = {'similarities': ('jsd', 'kl', 'hard'), 'odd': ('hard',), 'judge': ('hinge',)}


def hparams_from_config(config) -> head_step.Hparams:
  return head_step.Hparams(head=config.head, size=config.size, loss=config.loss, similarity=config.similarity,
                    tau=float(config.tau), target_tau=float(config.target_tau), margin=float(config.margin),
                    lr=float(config.lr), warmup_steps=config.warmup, schedule=config.schedule,
                    steps=config.steps, weight_decay=float(config.weight_decay), b1=float(config.b1),
                    b2=float(config.b2), batch_size=config.batch_size, seed=config.seed, ties=config.ties)


def validate_config(config) -> None:
  checks.choice(config, 'source', SOURCES)
  # every path the source reads exists; a path only another source reads is refused, never silently ignored
  checks.data_source(config, {'folder': (('image_dir', 'dir'),),
                              'files': (('train_file', 'file'), ('val_file', 'file')),
                              'things': (('things_dir', 'dir'), ('things_file', 'file')),
                              'nights': (('nights_dir', 'dir'),), 'demo': (), 'synthetic': (),
                              'alignet': (('alignet_dir', 'dir'), ('tfds_data_dir', 'dir'))}, field='source')
  if config.source == 'folder' and not config.image_dir:
    raise checks.fail('image_dir', 'a folder of images is required for source=folder', config.image_dir)
  for src, fields in (('things', ('things_dir', 'things_file')), ('nights', ('nights_dir',)),
                      ('alignet', ('alignet_dir', 'sampling'))):
    for f in fields:
      if config.source == src and not checks.text(config, f):
        raise checks.fail(f, f'required for source={src}', config.get(f))
  checks.integer(config, 'min_votes', 0, 1000)
  if config.source == 'alignet':
    from visim_jax.data import alignet  # pylint: disable=g-import-not-at-top
    checks.choice(config, 'transform', alignet.TRANSFORMS)
    checks.text(config, 'val_sampling')
  if config.source == 'files':
    for f in ('train_file', 'val_file'):
      if not checks.text(config, f):
        raise checks.fail(f, 'an index file (.npz, data/triplet_index.py format) is required for source=files',
                          config.get(f))
  checks.choice(config, 'head', heads.KINDS)
  checks.choice(config, 'loss', odd_one_out.LOSSES)
  checks.choice(config, 'similarity', odd_one_out.SIMILARITIES)
  checks.choice(config, 'schedule', head_step.SCHEDULES)
  checks.choice(config, 'ties', ('lt', 'le', 'split'))
  checks.integer(config, 'size', 1, 2**16)
  checks.number(config, 'tau', 1e-4, 1e6)          # below 1e-4 Adam's squared gradients overflow float32
  checks.number(config, 'target_tau', 1e-4, 1e6)
  checks.number(config, 'margin', 0, 2)
  checks.number(config, 'lr', 0, 10, lo_open=True)
  checks.integer(config, 'warmup', 0, 10**9)
  checks.integer(config, 'steps', 1, 10**9)
  checks.number(config, 'weight_decay', 0, 1e3)
  checks.number(config, 'b1', 0, 1, hi_open=True)
  checks.number(config, 'b2', 0, 1, hi_open=True)
  checks.integer(config, 'batch_size', 1, 2**24)
  checks.seed(config)
  checks.integer(config, 'eval_every', 1, 10**9)
  checks.integer(config, 'checkpoint_every', 1, 10**9)
  if config.checkpoint_every % config.eval_every:
    raise checks.fail('checkpoint_every', f'must be a multiple of config.eval_every ({config.eval_every}): '
                      'checkpoints are taken at the end of an evaluation chunk', config.checkpoint_every)
  checks.flag(config, 'checkpoint')
  checks.flag(config, 'plots')
  checks.flag(config, 'generate_only')
  if config.generate_only and config.source not in ('demo', 'folder'):
    raise checks.fail('generate_only', 'writes teacher triplets: only for source=demo or source=folder',
                      config.generate_only)
  check_teacher_fields(config)
  checks.integer(config, 'synthetic.n_images', 6, 10**9)
  checks.integer(config, 'synthetic.dim', 1, 2**16)
  checks.integer(config, 'synthetic.teacher_dim', 1, config.synthetic.dim, note=' (at most synthetic.dim)')
  checks.seed(config, 'synthetic.seed')
  checks.integer(config, 'demo.n_pairs', 8, 10**5)
  checks.seed(config, 'demo.seed')
  config_fields.options(config)  # the backbone fields parsed (checked) once here too
  check_temperatures(config)


COSINE_TAU_MAX = 2.0   # cosines span [-1, 1]: at tau 2 no probability of the softmax can leave [0.21, 0.58]


def check_temperatures(config) -> None:
  """A temperature that makes a cosine softmax near uniform cannot learn (AligNet's tau = 100 is for raw dot products
  of unnormalised ViT outputs, in the hundreds): refused in one line naming the field."""
  if config.loss in ('jsd', 'kl', 'hard') and config.similarity == 'cosine' and config.tau > COSINE_TAU_MAX:
    raise checks.fail('tau', f'with similarity=cosine the student\'s logits s / tau span at most 2 / tau, so its '
                      f'probabilities stay near 1/3 and nothing is learned: use tau <= {COSINE_TAU_MAX:g} (e.g. 0.05), '
                      'or similarity=dot (AligNet\'s tau = 100 is for raw dot products)', config.tau)
  if config.loss in ('jsd', 'kl') and config.source in ('demo', 'folder', 'synthetic') \
     and config.teacher.similarity == 'cosine' and config.target_tau > COSINE_TAU_MAX:
    raise checks.fail('target_tau', 'the teacher\'s cosines divided by it give near-uniform targets: use '
                      f'target_tau <= {COSINE_TAU_MAX:g} (e.g. 0.05)', config.target_tau)


def check_targets(config, train, val, hp) -> None:
  """Targets that decide something: held-out (and train) triplets that are not all tied, similarities that the
  temperature does not take past float32."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  where = {'files': (config.train_file, config.val_file), 'things': (config.things_file,) * 2,
           'alignet': (config.alignet_dir,) * 2,
           'nights': (config.nights_dir,) * 2}.get(config.source, ('config.teacher',) * 2)
  for name, s, w in (('train', train, where[0]), ('held-out', val, where[1])):
    t = np.asarray(s.target, np.float64)
    if s.target_kind == 'similarities':
      tied = (t == t.max(1, keepdims=True)).sum(1) > 1
      if np.abs(t).max() / min(hp.target_tau, 1.0) > 1e30:
        raise UserError(f'{w}: {name} similarities reach {np.abs(t).max():.3g}: divided by config.target_tau they '
                        'overflow float32; rescale them')
    elif s.target_kind == 'judge':
      tied = t == 0.5
    else:
      tied = np.zeros(len(t), bool)
    if tied.all():
      raise UserError(f'{w}: every {name} triplet ties (no odd one out, no preferred image): there is nothing to '
                      f'{"score" if name == "held-out" else "learn"}; a constant teacher or labels?')


def check_teacher_fields(config) -> None:
  """The teacher-triplet fields (triplets.*, teacher.*) learn_triplets and tune share, each named as typed."""
  checks.integer(config, 'triplets.n_train', 1, 10**10)
  checks.integer(config, 'triplets.n_val', 1, 10**9)
  checks.integer(config, 'triplets.clusters', 1, 10**6)
  checks.integer(config, 'triplets.kmeans_iters', 0, 10**4)
  checks.choice(config, 'triplets.sampling', teacher_labels.SAMPLING)
  checks.fraction(config, 'triplets.val_fraction')
  checks.choice(config, 'teacher.similarity', odd_one_out.SIMILARITIES)
  checks.text(config, 'teacher.backbone')
  checks.text(config, 'teacher.layers')
