"""Learning similarity from triplets as wiring: triplets + frozen features -> a head trained on every device -> report.

Sources (config.source):
  'demo' / 'folder'  a teacher from the zoo (config.teacher.backbone) labels triplets over an image set (the
                     embedded demo photos of data/demo.py, or config.image_dir): k-means clusters of the teacher's
                     features, within / between / border sampling, soft labels = the teacher's pair similarities
                     (teacher_triplets.py); the index files are written to <workdir>/triplets_{train,val}.npz.
  'files'            index files written before (config.train_file, config.val_file; triplet_stream.py format) over
                     image paths.
  'synthetic'        random student features and a teacher that sees them through weighted random directions
                     (tests, :local, scale runs).
  'things'           THINGS odd-one-out choices (config.things_dir, config.things_file; data/things.py), split
                     into train / held-out triplets by config.triplets.val_fraction: hard targets (loss 'hard').
  'nights'           NIGHTS 2AFC votes (config.nights_dir; data/nights.py, votes >= config.min_votes), its train
                     and val splits: loss 'hinge' (DreamSim).
The student's features (config.backbone) of every image are computed once through the feature cache; the head
(config.head) trains with the loss of config.loss (odd_one_out.py) on seeded shuffled batches of the train triplets,
the batch axis split over every device of every host (triplet_training.py); chunks of config.eval_every steps go
through runtime.Run (lock, fingerprint, Orbax on every process, resume), each followed by the held-out accuracy.

Outputs in the workdir: config.json, fingerprint.json, metrics.json (held-out odd-one-out accuracy and loss of the
frozen features, the untrained head and the trained head; timings), curves.npz (train loss per step, held-out
accuracy / loss per evaluation), curves.png, head.npz (the trained head: params + meta, the spec
`triplets:<workdir>`), checkpoints/.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from visim_jax import checks, heads, odd_one_out, ops, report, runtime, sharding
from visim_jax import features as features_lib
from visim_jax import teacher_triplets, triplet_stream
from visim_jax import triplet_training as tt
from visim_jax.errors import UserError

SOURCES = ('demo', 'folder', 'files', 'synthetic', 'things', 'nights')
LOSS_FOR_TARGET = {'similarities': ('jsd', 'kl', 'hard'), 'odd': ('hard',), 'judge': ('hinge',)}


def hparams_from_config(config) -> tt.Hparams:
  return tt.Hparams(head=config.head, size=config.size, loss=config.loss, similarity=config.similarity,
                    tau=float(config.tau), target_tau=float(config.target_tau), margin=float(config.margin),
                    lr=float(config.lr), warmup_steps=config.warmup, schedule=config.schedule,
                    steps=config.steps, weight_decay=float(config.weight_decay), b1=float(config.b1),
                    b2=float(config.b2), batch_size=config.batch_size, seed=config.seed, ties=config.ties)


def validate_config(config) -> None:
  checks.choice(config, 'source', SOURCES)
  if config.source == 'folder' and not config.image_dir:
    raise checks.fail('image_dir', 'a folder of images is required for source=folder', config.image_dir)
  for src, fields in (('things', ('things_dir', 'things_file')), ('nights', ('nights_dir',))):
    for f in fields:
      if config.source == src and not checks.text(config, f):
        raise checks.fail(f, f'required for source={src}', config.get(f))
  checks.integer(config, 'min_votes', 0, 1000)
  if config.source == 'files':
    for f in ('train_file', 'val_file'):
      if not checks.text(config, f):
        raise checks.fail(f, 'an index file (.npz, triplet_stream.py format) is required for source=files',
                          config.get(f))
  checks.choice(config, 'head', heads.KINDS)
  checks.choice(config, 'loss', odd_one_out.LOSSES)
  checks.choice(config, 'similarity', odd_one_out.SIMILARITIES)
  checks.choice(config, 'schedule', tt.SCHEDULES)
  checks.choice(config, 'ties', ('lt', 'le', 'split'))
  checks.integer(config, 'size', 1, 2**16)
  checks.number(config, 'tau', 0, 1e6, lo_open=True)
  checks.number(config, 'target_tau', 0, 1e6, lo_open=True)
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
  checks.integer(config, 'triplets.n_train', 1, 10**10)
  checks.integer(config, 'triplets.n_val', 1, 10**9)
  checks.integer(config, 'triplets.clusters', 1, 10**6)
  checks.integer(config, 'triplets.kmeans_iters', 0, 10**4)
  checks.choice(config, 'triplets.sampling', teacher_triplets.SAMPLING)
  checks.fraction(config, 'triplets.val_fraction')
  checks.choice(config, 'teacher.similarity', odd_one_out.SIMILARITIES)
  checks.text(config, 'teacher.backbone')
  checks.text(config, 'teacher.layers')
  checks.integer(config, 'synthetic.n_images', 6, 10**9)
  checks.integer(config, 'synthetic.dim', 1, 2**16)
  checks.integer(config, 'synthetic.teacher_dim', 1, config.synthetic.dim, note=' (at most synthetic.dim)')
  checks.seed(config, 'synthetic.seed')
  checks.integer(config, 'demo.n_pairs', 8, 10**5)
  checks.seed(config, 'demo.seed')
  features_lib.check_fields(config)


# --------------------------------------------------------------------------------------------- data

def _synthetic(config):
  """(student feats (M, D), teacher feats (M, Dt), names): x ~ N(0, I) unit rows; the teacher sees x through
  Dt orthonormal random directions weighted exp(0) .. exp(-4), t = (x Q) w: cosine on x agrees with it little
  (~55% of odd-one-out choices), an affine head can learn it exactly."""
  s = config.synthetic
  rng = np.random.default_rng(s.seed)
  x = rng.standard_normal((s.n_images, s.dim)).astype(np.float32)
  x /= np.linalg.norm(x, axis=1, keepdims=True)
  q, _ = np.linalg.qr(rng.standard_normal((s.dim, s.teacher_dim)))
  t = (x @ q.astype(np.float32)) * np.exp(np.linspace(0, -4, s.teacher_dim)).astype(np.float32)
  return x, t, [f'synthetic/{i}' for i in range(s.n_images)]


def _images(config) -> list[str]:
  from visim_jax.data import demo, images as images_lib
  if config.source == 'folder':
    return images_lib.list_images(config.image_dir)
  root = demo.demo_pairs(config.demo.root or None, config.demo.n_pairs, config.demo.seed,
                         cache_dir=config.get('cache_dir') or None)
  return images_lib.list_images(os.path.join(root, 'left')) + images_lib.list_images(os.path.join(root, 'right'))


def _teacher_features(config, paths, progress) -> tuple[np.ndarray, dict]:
  """The teacher's pooled features (config.teacher.backbone / layers with the student's image_batch_size, dtype,
  cache and backbone_kwargs.tiny; its own default weights)."""
  t = config.teacher
  c = config.copy_and_resolve_references()
  with c.unlocked():
    c.backbone, c.layers = t.backbone, t.layers
    c.backbone_kwargs.weights, c.backbone_kwargs.random_init = '', -1
  backbone, layers = features_lib.build(c)
  feats = features_lib.features_of(c, backbone, layers, paths, tag='teacher', progress=progress)
  return np.asarray(feats, np.float32), features_lib.describe(backbone, layers)


def load_data(config, workdir: str, progress: bool = True):
  """(student features (M, D), train TripletSet, val TripletSet, description) for config.source."""
  trip = config.triplets
  gen = dict(n_train=trip.n_train, n_val=trip.n_val, clusters=trip.clusters, sampling=trip.sampling,
             val_fraction=float(trip.val_fraction), similarity=config.teacher.similarity,
             kmeans_iters=trip.kmeans_iters, seed=config.seed)
  if config.source == 'synthetic':
    x, t, names = _synthetic(config)
    train, val = _generate(t, names, gen, {'teacher': 'synthetic'})
    return x, train, val, {'backbone': None, 'source': 'synthetic'}
  backbone, layers = features_lib.build(config)
  if config.source in ('things', 'nights'):
    train, val = _human(config)
    paths = train.images
  elif config.source == 'files':
    train = triplet_stream.load(config.train_file)
    val = triplet_stream.load(config.val_file)
    if train.images != val.images:
      raise UserError(f'{config.val_file}: its image list differs from {config.train_file}\'s; both index files '
                      'must index one image list')
    if train.target_kind != val.target_kind:
      raise UserError(f'{config.val_file}: holds {val.target_kind} targets, {config.train_file} {train.target_kind}')
    from visim_jax.data.judgements import check_files
    check_files(train.images, 'image')
    paths = train.images
  else:
    paths = _images(config)
    runtime.say(f'teacher {config.teacher.backbone}: labelling triplets over {len(paths)} images')
    teach, tdesc = _teacher_features(config, paths, progress)
    train, val = _generate(teach, paths, gen, {'teacher': tdesc})
    _write_index_files(workdir, train, val)
    if config.generate_only:
      return None, train, val, None
  runtime.say(f'student {backbone.name}: features of {len(paths)} images')
  x = np.asarray(features_lib.features_of(config, backbone, layers, paths, tag='triplets', progress=progress),
                 np.float32)
  return x, train, val, {**features_lib.describe(backbone, layers), 'source': config.source}


def _write_index_files(workdir: str, train, val) -> None:
  """<workdir>/triplets_{train,val}.npz (process 0); OS errors as one line."""
  if not report.is_writer():
    return
  ops.check_writable_dir(workdir, 'workdir')
  for name, s in (('train', train), ('val', val)):
    path = os.path.join(workdir, f'triplets_{name}.npz')
    try:
      triplet_stream.save(path, s)
    except OSError as e:
      raise runtime.os_error(e, path, 'writing the triplet index file') from e


def _human(config):
  """(train, val) index sets of THINGS choices or NIGHTS votes (files checked by the loaders first)."""
  if config.source == 'nights':
    from visim_jax.data import nights
    return triplet_stream.from_twoafc(nights.load(config.nights_dir, 'train', config.min_votes),
                                      nights.load(config.nights_dir, 'val', config.min_votes))
  from visim_jax.data import things
  s = things.load(config.things_dir, config.things_file)
  try:
    return triplet_stream.from_odd_one_out(s, float(config.triplets.val_fraction), config.seed)
  except ValueError as e:
    raise UserError(f'config.triplets.val_fraction: {e}') from None


def _generate(teacher, names, gen: dict, meta: dict):
  try:
    return teacher_triplets.generate(teacher, names, meta=meta, **gen)
  except ValueError as e:   # too few images for the split / clusters for the sampling
    raise UserError(f'config.triplets: {e}') from None


# --------------------------------------------------------------------------------------------- run

def fingerprint(hp: tt.Hparams, eval_every: int, x, train, val) -> runtime.Fingerprint:
  """The training fields, the evaluation period (it shapes the checkpointed curves) and the data."""
  return runtime.fingerprint({**dataclasses.asdict(hp), 'eval_every': eval_every},
                             [x, train.triplets, train.target, val.triplets, val.target])


@functools.lru_cache(maxsize=8)
def _init_program(rep):
  """tt.init_state jitted with replicated outputs (one per sharding: a resumed run in one process reuses it)."""
  return jax.jit(tt.init_state, static_argnums=(0, 1), out_shardings=rep)


def run(config, workdir: str, progress: bool = True, devices=None) -> dict:
  validate_config(config)
  hp = hparams_from_config(config)
  t0 = time.time()
  if config.generate_only:   # the teacher's index files only (no student features, no training)
    _, train, val, _ = load_data(config, workdir, progress)
    out = {k: os.path.join(os.path.abspath(workdir), f'triplets_{k}.npz') for k in ('train', 'val')}
    runtime.say(f'wrote {len(train):,} train / {len(val):,} held-out teacher triplets: {out["train"]}, {out["val"]}')
    return {'experiment': 'learn_triplets', 'generate_only': True, 'index_files': out}
  x, train, val, desc = load_data(config, workdir, progress)
  ok = LOSS_FOR_TARGET[train.target_kind]
  if hp.loss not in ok:
    raise checks.fail('loss', f'the triplets hold {train.target_kind} targets: use one of {ok}', hp.loss)
  if hp.batch_size > len(train):
    raise checks.fail('batch_size', f'exceeds the {len(train)} train triplets; use {len(train)} or less',
                      hp.batch_size)
  mesh = sharding.make_mesh('batch', devices)
  n_dev = mesh.devices.size
  if hp.batch_size % n_dev:
    raise checks.fail('batch_size', f'must be a multiple of the {n_dev} devices (the batch axis is split over '
                      f'them); use {sharding.padded(hp.batch_size, mesh)}', hp.batch_size)
  from visim_jax.metrics.blocked_histograms import memory_limit_bytes
  emb = heads.out_dim(hp.head, x.shape[1], hp.size)
  parts = triplet_stream.memory_bytes(len(train), len(val), len(x), x.shape[1], emb, hp.batch_size,
                                      config.eval_every, 3 if train.target.ndim == 2 else 1, n_dev)
  triplet_stream.check_memory(parts, memory_limit_bytes(), triplet_stream.host_memory_bytes())
  runtime.say(f'{len(train):,} train / {len(val):,} held-out triplets ({train.target_kind}), {len(x):,} images x '
              f'{x.shape[1]} features; head {hp.head}, loss {hp.loss}, batch {hp.batch_size} over {n_dev} device(s); '
              f'memory estimate host {parts["host"] / 2**20:,.1f} MiB, device {parts["device"] / 2**20:,.1f} MiB')

  rep = sharding.replicated(mesh)
  data = tt.Data(*(sharding.to_global(a, rep) for a in (x, train.triplets, train.target)))
  val_j = tuple(sharding.to_global(a, rep) for a in (val.triplets, val.target))
  program = tt.chunk_program(hp, mesh)
  stream = triplet_stream.Stream(len(train), hp.batch_size, hp.seed)
  n_evals = -(-hp.steps // config.eval_every)
  evaluate = lambda head, params: {k: float(v) for k, v in tt.evaluate(hp, head, params, data.feats, *val_j).items()}
  init = _init_program(rep)
  frozen, untrained = evaluate('identity', {}), evaluate(hp.head, init(hp, x.shape[1]).params)
  host = lambda: {'loss': np.zeros(hp.steps, np.float32), 'val_accuracy': np.zeros(n_evals, np.float32),
                  'val_loss': np.zeros(n_evals, np.float32), 'val_step': np.zeros(n_evals, np.int32)}
  fp = fingerprint(hp, config.eval_every, x, train, val)
  recorded = features_lib.recorded_config(config, uses_backbone=config.source != 'synthetic')
  with runtime.Run(workdir, recorded, fp, config.checkpoint, progress, desc='train (steps)') as rt:
    t1 = time.time()
    template = {'state': jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=rep),
                                      jax.eval_shape(lambda: tt.init_state(hp, x.shape[1]))), **host()}
    tree, start = rt.restore(template) if config.checkpoint else (template, 0)
    if start:
      tree = {**tree, **{k: np.array(tree[k]) for k in host()}}
    else:
      tree = {'state': init(hp, x.shape[1]), **host()}
    rows_sh = tt.rows_sharding(mesh)

    def chunk_fn(tree, s0, n):
      rows = sharding.to_global(stream.rows(s0, n), rows_sh)
      state, loss = program(tree['state'], data, rows)
      tree['loss'][s0:s0 + n] = sharding.to_host(loss)
      k = (s0 + n - 1) // config.eval_every
      ev = evaluate(hp.head, state.params)
      tree['val_accuracy'][k], tree['val_loss'][k], tree['val_step'][k] = ev['accuracy'], ev['loss'], s0 + n
      return {**tree, 'state': state}, {'train/loss': tree['loss'][s0:s0 + n], 'val/accuracy': ev['accuracy'],
                                        'val/loss': ev['loss']}
    tree = rt.loop(tree, chunk_fn, start, hp.steps, config.eval_every, config.checkpoint_every)
    t2 = time.time()
    params = jax.tree.map(sharding.to_host, tree['state'].params)
    trained = evaluate(hp.head, tree['state'].params)
    metrics = {'experiment': 'learn_triplets', 'source': config.source, **desc, 'hparams': dataclasses.asdict(hp),
               'n_triplets': {'train': len(train), 'val': len(val)}, 'n_images': len(x), 'devices': n_dev,
               'target': train.target_kind, 'triplets_meta': {k: v for k, v in train.meta.items()
                                                              if k != 'cluster_sizes'},
               'results': {'frozen': frozen, 'untrained': untrained, 'trained': trained},
               'accuracy_rule': f'odd-one-out: the pair leaving out the target odd column has the largest '
                                f'similarity (ties={hp.ties}); target odd = the teacher\'s argmax for similarities',
               'memory_estimate_bytes': parts,
               'timing_s': {'data_and_features': t1 - t0, 'training_and_eval': t2 - t1}}
    metrics = rt.write_metrics({**metrics, 'config': recorded})
    if report.is_writer():
      runtime.write_npz(rt.path('curves.npz'), **{k: tree[k] for k in host()})
      save_head(rt.path('head.npz'), hp, params, desc, rt.workdir)
      if config.plots:
        from visim_jax.plots import learn_triplets as plots
        plots.curves(tree, frozen, untrained, hp, rt.path('curves.png'))
  _print(metrics, workdir)
  return metrics


def save_head(path: str, hp: tt.Hparams, params: dict, desc: dict, workdir: str) -> None:
  """head.npz: the parameters as 'params/<path>' arrays and a JSON meta (head, similarity, backbone...)."""
  flat = {'params/' + '/'.join(str(getattr(k, 'key', k)) for k in kp): np.asarray(v)
          for kp, v in jax.tree_util.tree_flatten_with_path(params)[0]}
  meta = {**{k: desc.get(k) for k in ('backbone', 'weights_sha256', 'layers', 'image_size', 'preprocessing')},
          'head': hp.head, 'size': hp.size, 'similarity': hp.similarity, 'workdir': workdir,
          'experiment': 'learn_triplets'}
  runtime.write_npz(path, **flat, meta=np.asarray(json.dumps(meta, sort_keys=True)))


def load_head(path: str) -> tuple[dict, dict]:
  """(params, meta) of a head.npz."""
  with np.load(path, allow_pickle=False) as z:
    meta = json.loads(str(z['meta']))
    params: dict = {}
    for k in z.files:
      if k.startswith('params/'):
        node = params
        *parents, leaf = k[len('params/'):].split('/')
        for p in parents:
          node = node.setdefault(p, {})
        node[leaf] = jnp.asarray(z[k])
  return params, meta


def _print(m: dict, workdir: str) -> None:
  r = m['results']
  rows = [[k, f"{r[k]['accuracy']:.4f}", f"{r[k]['loss']:.4f}"] for k in ('frozen', 'untrained', 'trained')]
  runtime.say(f"\nheld-out odd-one-out ({m['n_triplets']['val']} triplets, {m['target']} targets), head "
              f"{m['hparams']['head']}, {m['hparams']['steps']} steps, workdir {workdir}")
  runtime.say(report.table(rows, ['features', 'accuracy', m['hparams']['loss'] + ' loss']))
