"""Learning similarity from triplets as wiring: triplets + frozen features -> a head trained on every device -> report.

Sources (config.source):
  'demo' / 'folder'  a teacher from the zoo (config.teacher.backbone) labels triplets over an image set (the
                     embedded demo photos of data/demo.py, or config.image_dir): k-means clusters of the teacher's
                     features, within / between / border sampling, soft labels = the teacher's pair similarities
                     (data/teacher_labels.py); the index files are written to <workdir>/triplets_{train,val}.npz.
  'files'            index files written before (config.train_file, config.val_file; data/triplet_index.py format) over
                     image paths.
  'synthetic'        random student features and a teacher that sees them through weighted random directions
                     (tests, :local, scale runs).
  'things'           THINGS odd-one-out choices (config.things_dir, config.things_file; data/things.py), split
                     into train / held-out triplets by config.triplets.val_fraction: hard targets (loss 'hard').
  'nights'           NIGHTS 2AFC votes (config.nights_dir; data/nights.py, votes >= config.min_votes), its train
                     and val splits: loss 'hinge' (DreamSim).
  'alignet'          AligNet's released triplets (config.alignet_dir, transform, sampling, val_sampling;
                     data/alignet.py) over tfds imagenet2012 train (config.tfds_data_dir): the student's features of
                     the images they use, soft targets (AligNet's similarities).
The student's features (config.backbone) of every image are computed once through the feature cache; the head
(config.head) trains with the loss of config.loss (odd_one_out.py) on seeded shuffled batches of the train triplets,
the batch axis split over every device of every host (training/head_step.py); chunks of config.eval_every steps go
through runtime.Run (lock, fingerprint, Orbax on every process, resume), each followed by the held-out accuracy.

Outputs in the workdir: config.json, fingerprint.json, metrics.json (held-out odd-one-out accuracy and loss of the
frozen features, the untrained head and the trained head; timings), curves.npz (train loss per step, held-out
accuracy / loss per evaluation), curves.png, head.npz (the trained head: params + meta, the spec
`triplets:<workdir>`), checkpoints/.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import time

import jax
import numpy as np

from visim_jax.core import cpu_kernels
from visim_jax.experiments import checks
from visim_jax.core import report, sharding
from visim_jax.models import heads
from visim_jax.training import head_file, runtime
from visim_jax.data import triplet_index
from visim_jax.training import head_step
from visim_jax.experiments import learn_triplets_data
from visim_jax.experiments.learn_triplets_data import load_data  # noqa: F401
from visim_jax.experiments import config_fields
from visim_jax.experiments.learn_triplets_parse import (  # noqa: F401 (the gate)
    LOSS_FOR_TARGET, SOURCES, check_targets, hparams_from_config, validate_config)

# --------------------------------------------------------------------------------------------- run

def fingerprint(hp: head_step.Hparams, eval_every: int, x, train, val) -> runtime.Fingerprint:
  """The training fields, the evaluation period (it shapes the checkpointed curves) and the data."""
  return runtime.fingerprint({**dataclasses.asdict(hp), 'eval_every': eval_every},
                             {'features': x, 'train triplets': train.triplets, 'train targets': train.target,
                              'held-out triplets': val.triplets, 'held-out targets': val.target})


@functools.lru_cache(maxsize=8)
def _init_program(rep):
  """head_step.init_state jitted with replicated outputs (one per sharding: a resumed run in one process reuses it)."""
  return cpu_kernels.jit(head_step.init_state, static_argnums=(0, 1), out_shardings=rep)


def run(config, workdir: str, progress: bool = True, devices=None) -> dict:
  validate_config(config)
  hp = hparams_from_config(config)
  t0 = time.time()
  if config.generate_only:   # the teacher's index files only (no student features, no training)
    _refuse_finished(workdir)
    _, train, val, _ = load_data(config, workdir, progress)
    check_targets(config, train, val, hp)
    learn_triplets_data.write_index_files(workdir, train, val)
    out = {k: os.path.join(os.path.abspath(workdir), f'triplets_{k}.npz') for k in ('train', 'val')}
    runtime.say(f'wrote {len(train):,} train / {len(val):,} held-out teacher triplets: {out["train"]}, {out["val"]}')
    return {'experiment': 'learn_triplets', 'generate_only': True, 'index_files': out}
  x, train, val, desc = load_data(config, workdir, progress)
  check_targets(config, train, val, hp)
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
  from visim_jax.core import memory
  emb = heads.out_dim(hp.head, x.shape[1], hp.size)
  tr, va = (('config.train_file', 'config.val_file') if config.source == 'files' else
            ('config.triplets.n_train', 'config.triplets.n_val') if config.source in ('demo', 'folder', 'synthetic')
            else ('the train triplets', 'the held-out triplets'))   # THINGS / NIGHTS: as published
  est = lambda v: triplet_index.memory_bytes(v[tr], v[va], len(x), x.shape[1], emb, v['config.batch_size'],
                                             v['config.eval_every'], 3 if train.target.ndim == 2 else 1, n_dev)
  sizes = {tr: len(train), va: len(val), 'config.batch_size': hp.batch_size, 'config.eval_every': config.eval_every}
  parts = est(sizes)
  triplet_index.check_memory(parts, memory.limit_bytes(), triplet_index.host_memory_bytes(),
                             {w: memory.drivers(lambda v, w=w: {w: est(v)[w]}, sizes) for w in ('host', 'device')})
  runtime.say(f'{len(train):,} train / {len(val):,} held-out triplets ({train.target_kind}), {len(x):,} images x '
              f'{x.shape[1]} features; head {hp.head}, loss {hp.loss}, batch {hp.batch_size} over {n_dev} device(s); '
              f'memory estimate host {parts["host"] / 2**20:,.1f} MiB, device {parts["device"] / 2**20:,.1f} MiB')

  rep = sharding.replicated(mesh)
  data = head_step.Data(*(sharding.to_global(a, rep) for a in (x, train.triplets, train.target)))
  val_j = tuple(sharding.to_global(a, rep) for a in (val.triplets, val.target))
  program = head_step.chunk_program(hp, mesh)
  stream = triplet_index.Stream(len(train), hp.batch_size, hp.seed)
  n_evals = -(-hp.steps // config.eval_every)
  evaluate = lambda head, params: {k: float(v) for k, v in head_step.evaluate(hp, head, params, data.feats, *val_j).items()}
  init = _init_program(rep)
  frozen, untrained = evaluate('identity', {}), evaluate(hp.head, init(hp, x.shape[1]).params)
  host = lambda: {'loss': np.zeros(hp.steps, np.float32), 'val_accuracy': np.zeros(n_evals, np.float32),
                  'val_loss': np.zeros(n_evals, np.float32), 'val_step': np.zeros(n_evals, np.int32)}
  fp = fingerprint(hp, config.eval_every, x, train, val)
  recorded = config_fields.recorded_config(config, uses_backbone=config.source != 'synthetic')
  with runtime.Run(workdir, recorded, fp, config.checkpoint, progress, desc='train (steps)') as rt:
    if config.source in ('demo', 'folder'):   # only now: the fingerprint accepted this workdir
      learn_triplets_data.write_index_files(rt.workdir, train, val)
    t1 = time.time()
    template = {'state': jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=rep),
                                      jax.eval_shape(lambda: head_step.init_state(hp, x.shape[1]))), **host()}
    tree, start = rt.restore(template) if config.checkpoint else (template, 0)
    if start:
      tree = {**tree, **{k: np.array(tree[k]) for k in host()}}
    else:
      tree = {'state': init(hp, x.shape[1]), **host()}
    rows_sh = head_step.rows_sharding(mesh)

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
      head_file.save_head(rt.path('head.npz'), hp, params, desc, rt.workdir)
      if config.plots:
        from visim_jax.plots import learn_triplets as plots
        plots.curves(tree, frozen, untrained, hp, rt.path('curves.png'))
  _print(metrics, workdir)
  return metrics


def _refuse_finished(workdir: str) -> None:
  """generate_only writes index files: never over those a trained head of this workdir was trained on."""
  found = [f for f in ('head.npz', 'metrics.json', 'config.json', 'checkpoints') if os.path.exists(
      os.path.join(workdir, f))]
  if found:
    raise checks.fail('generate_only', f'{workdir} holds a training run ({", ".join(found)}): its index files are '
                      'the ones its head was trained on; give a new --workdir', True)


def _print(m: dict, workdir: str) -> None:
  r = m['results']
  rows = [[k, f"{r[k]['accuracy']:.4f}", f"{r[k]['loss']:.4f}"] for k in ('frozen', 'untrained', 'trained')]
  runtime.say(f"\nheld-out odd-one-out ({m['n_triplets']['val']} triplets, {m['target']} targets), head "
              f"{m['hparams']['head']}, {m['hparams']['steps']} steps, workdir {workdir}")
  runtime.say(report.table(rows, ['features', 'accuracy', m['hparams']['loss'] + ' loss']))
