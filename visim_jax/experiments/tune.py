"""Tuning the tower as wiring: image triplets -> the tower's own embedding trained (LoRA or full) on every device ->
held-out accuracy frozen vs tuned -> a model like any other (`tuned:<workdir>`).

config -> TuneOptions (tune_parse.py, every check) -> train / held-out index sets (tune_data.py) -> the tower
(training/tower_step.py over the backbone, LoRA from models/lora.py) -> the memory estimate (tune_memory.py: refused
in one line before the training state exists) -> pixels through grain (data/grain_data.py: the image files, their
decoded-pixel cache (data/image_batches.py) or AligNet's tfds ImageNet source; decoded in the process or in
worker_count processes; each jax process reads its disjoint share of every step's batch) -> steps of `batch_size`
triplets (step s's batch a function of (seed, s); dropout keyed by (seed, step)) on the ('data', 'fsdp') mesh, in
chunks of eval_every steps through training/runtime.Run (lock, fingerprint, Orbax checkpoints of the trainable
state only, LoRA checkpoints are small, and the grain iterator's state beside it: a resumed run reads the batches
an uninterrupted one reads) -> held-out accuracy after each chunk.

With `adversarial` (the hinge on attacked references, training/tower_step.adversarial_refs) the held-out items are
also attacked before and after tuning (tower_step.attacked_correct, APGD of adversarial_eval_steps): metrics.json's
`attacked`, a column of the console table. `build` is the setup benchmarks/tune_full.py shares.

Outputs: tuned.npz (training/tuned_file.py: the LoRA factors or the tuned tower, the head, the meta `tuned:` reads),
curves.npz / curves.png, triplets_{train,val}.npz (teacher sources), leaderboard/ (config.leaderboard: the demo
human sets, `cosine:<backbone>` vs `tuned:<workdir>`), things/ (source 'alignet' with config.things_dir: THINGS
odd-one-out of both), metrics.json last.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import time
import types

import jax
import numpy as np

from visim_jax.backbones import features as features_lib
from visim_jax.core import cpu_kernels
from visim_jax.core import report, sharding
from visim_jax.data import grain_data, image_batches
from visim_jax.experiments import checks, config_fields, tune_attacked, tune_data, tune_memory
from visim_jax.experiments.tune_setup import Built, build  # noqa: F401  (tune.build: benchmarks/tune_full.py's too)
from visim_jax.experiments.tune_parse import LOSS_FOR_TARGET, TEACHER_SOURCES, parse, validate_config  # noqa: F401
from visim_jax.training import head_step, runtime, tuned_file


def fingerprint(opts, hp, train, val) -> runtime.Fingerprint:
  skip = ('plots', 'leaderboard', 'checkpoint', 'keep_checkpoints', 'adversarial_eval_steps')   # not the training
  fields = {**{k: v for k, v in dataclasses.asdict(opts).items() if k not in skip},
            'hparams': dataclasses.asdict(hp)}
  fields['data_engine'] = 'grain-1'   # batches of shuffle(seed).repeat().batch(B) (data/grain_data.py)
  return runtime.fingerprint(fields, {'train triplets': train.triplets, 'train targets': train.target,
                                      'held-out triplets': val.triplets, 'held-out targets': val.target,
                                      'image list': np.asarray(train.images)})


def run(config, workdir: str, progress: bool = True, devices=None) -> dict:
  opts = parse(config)
  from visim_jax.training import tower_step
  t0 = time.time()
  train, val, desc = tune_data.load(opts, progress)
  if opts.hparams['loss'] not in LOSS_FOR_TARGET[train.target_kind]:
    raise checks.fail('loss', f'the triplets hold {train.target_kind} targets: use one of '
                      f'{LOSS_FOR_TARGET[train.target_kind]}', opts.hparams['loss'])
  if opts.batch_size > len(train):
    raise checks.fail('batch_size', f'exceeds the {len(train)} train triplets; use {len(train)} or less',
                      opts.batch_size)
  steps = opts.steps or opts.epochs * (len(train) // opts.batch_size)
  b = build(opts, steps)
  backbone, tower, hp, image_shape = b.backbone, b.tower, b.hp, b.image_shape
  mesh = sharding.train_mesh(opts.fsdp, devices)
  n_dev = mesh.devices.size
  micro = opts.batch_size // hp.accum_steps
  if micro % n_dev:
    raise checks.fail('batch_size', f'each pass takes batch_size / accum_steps = {micro} triplets, split over the '
                      f'{n_dev} devices: use a multiple of {n_dev * hp.accum_steps}', opts.batch_size)
  key = jax.random.PRNGKey(opts.seed)
  parts = tune_memory.check(hp, tower, backbone, b.trainable, image_shape, micro * b.images_a_triplet // n_dev,
                            opts.fsdp)
  images = tune_data.image_source(opts, train, backbone.preprocess, progress)
  runtime.say(f'{len(train):,} train / {len(val):,} held-out triplets ({train.target_kind}) over {len(images):,} '
              f'images; {backbone.name} tune={hp.tune}, loss {hp.loss}, {steps} steps of {opts.batch_size} over '
              f'{n_dev} device(s); memory estimate {sum(parts.values()) / 2**20:,.0f} MiB a device')

  lo, hi = _process_rows(opts.batch_size)
  batches = grain_data.triplet_batches(train.triplets, train.target, images, opts.batch_size, opts.seed, steps, lo,
                                       hi, opts.worker_count)
  state0, frozen = tower_step.init_state(hp, tower, backbone.variables, key, image_shape)
  state0, frozen = tower_step.place(mesh, state0, frozen)
  program = tower_step.step_program(hp, tower, mesh)
  val_rows, val_pos = image_batches.image_rows(val.triplets)
  eval_hp = head_step.Hparams(head='identity', loss=hp.loss, similarity=hp.similarity, tau=hp.tau,
                              target_tau=hp.target_tau, margin=hp.margin, ties=opts.ties)
  evaluate = functools.partial(_evaluate, eval_hp, mesh, images, val_rows, val_pos, val.target, opts.features)
  bare = dataclasses.replace(tower, head='identity')   # the tower's own feature at step 0 (LoRA's b = 0): frozen
  frozen_res = evaluate(_embedder(hp, bare), {k: v for k, v in state0.trainable.items() if k != 'head'}, frozen)
  untrained = evaluate(_embedder(hp, tower), state0.trainable, frozen) if opts.head != 'identity' else frozen_res
  attacked = None
  if hp.adv_eps:   # held-out clean and attacked 2AFC accuracy, before (the frozen tower) and after tuning
    attack = functools.partial(tune_attacked.accuracy, hp, images, val, opts.adversarial_eval_steps, opts.seed, micro)
    attacked = {'budget': tune_attacked.budget(hp), 'steps': opts.adversarial_eval_steps, 'method': 'apgd', 'items': len(val),
                'frozen': attack(bare, {k: v for k, v in state0.trainable.items() if k != 'head'}, frozen)}
    runtime.say(f"held-out 2AFC accuracy of the frozen tower: {frozen_res['accuracy']:.4f} clean, "
                f"{attacked['frozen']:.4f} attacked ({attacked['budget']}, APGD {attacked['steps']})")
  embed = _embedder(hp, tower)
  n_evals = -(-steps // opts.eval_every)
  host = lambda: {'loss': np.zeros(steps, np.float32), 'val_accuracy': np.zeros(n_evals, np.float32),
                  'val_loss': np.zeros(n_evals, np.float32), 'val_step': np.zeros(n_evals, np.int32)}
  recorded = config_fields.recorded_config(config, uses_backbone=True)
  with runtime.Run(workdir, recorded, fingerprint(opts, hp, train, val), opts.checkpoint, progress,
                   desc='tune (steps)', max_to_keep=opts.keep_checkpoints) as rt:
    if opts.teacher is not None:   # teacher-labelled triplets
      tune_data.write_index_files(rt.workdir, train, val)
    t1 = time.time()
    rt.track_data(batches)
    template = {'state': jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding),
                                      state0), **host()}
    tree, start = rt.restore(template) if opts.checkpoint else (template, 0)
    tree = {**tree, **{k: np.array(tree[k]) for k in host()}} if start else {'state': state0, **host()}

    def chunk_fn(tree, s0, n):
      state, losses = tree['state'], []
      for s in range(s0, s0 + n):
        pixels, target = next(batches)
        batch = tower_step.Batch(*(sharding.from_local(a, mesh) for a in (pixels, target)))
        state, m = program(state, frozen, batch)
        losses.append(m['loss'])
      tree['loss'][s0:s0 + n] = [float(sharding.to_host(l)) for l in losses]
      k = (s0 + n - 1) // opts.eval_every
      ev = evaluate(embed, state.trainable, frozen)
      tree['val_accuracy'][k], tree['val_loss'][k], tree['val_step'][k] = ev['accuracy'], ev['loss'], s0 + n
      return {**tree, 'state': state}, {'train/loss': tree['loss'][s0:s0 + n], 'val/accuracy': ev['accuracy'],
                                        'val/loss': ev['loss']}
    tree = rt.loop(tree, chunk_fn, start, steps, opts.eval_every, opts.checkpoint_every)
    t2 = time.time()
    state = tree['state']
    tuned = evaluate(embed, state.trainable, frozen)
    if attacked is not None:
      attacked['tuned'] = attack(tower, state.trainable, frozen)
    trainable = jax.tree.map(sharding.to_host, state.trainable)
    meta = {**features_lib.describe(backbone, ()), 'feature': tower.feature, 'head': opts.head,
            'head_size': opts.head_size, 'similarity': hp.similarity, 'tune': hp.tune, 'lora': opts.lora,
            'backbone_kwargs': dict(opts.features.backbone_kwargs), 'workdir': rt.workdir}
    if report.is_writer():
      tuned_file.save(rt.path('tuned.npz'), meta, trainable)
      runtime.write_npz(rt.path('curves.npz'), **{k: tree[k] for k in host()})
      if opts.plots:
        from visim_jax.plots import learn_triplets as plots
        shown = types.SimpleNamespace(head=f'{hp.tune} tower', loss=hp.loss, tau=hp.tau, similarity=hp.similarity)
        plots.curves(tree, frozen_res, untrained, shown, rt.path('curves.png'))
    board = _leaderboard(config, rt.workdir, backbone, progress) if opts.leaderboard else None
    things_res = _things(config, rt.workdir, backbone, progress) if opts.data['things_after'] else None
    metrics = {'experiment': 'tune', **desc, 'backbone': backbone.name, 'weights_sha256': backbone.weights_id,
               'feature': tower.feature, 'hparams': dataclasses.asdict(hp), 'batch_size': opts.batch_size,
               'n_triplets': {'train': len(train), 'val': len(val)}, 'devices': n_dev, 'fsdp': opts.fsdp,
               'trainable_parameters': int(sum(np.size(l) for l in jax.tree.leaves(trainable))),
               'results': {'frozen': frozen_res, 'untrained': untrained, 'tuned': tuned}, 'attacked': attacked,
               'memory_estimate_bytes': parts, 'leaderboard': board, 'things': things_res,
               'timing_s': {'data': t1 - t0, 'training_and_eval': t2 - t1, 'total': time.time() - t0}}
    metrics = rt.write_metrics({**metrics, 'config': recorded})
  _print(metrics, workdir)
  return metrics


def _process_rows(batch: int) -> tuple[int, int]:
  """This process's rows of every step's batch (sharding.from_local assembles the global batch)."""
  per = batch // jax.process_count()
  return jax.process_index() * per, (jax.process_index() + 1) * per


def _embedder(hp, tower):
  from visim_jax.training import tower_step
  return cpu_kernels.jit(functools.partial(tower_step.embed, hp, tower))


def _evaluate(eval_hp, mesh, images, rows, pos, target, fo, embed, trainable, frozen) -> dict:
  """Held-out accuracy and loss: every held-out image embedded once (batches of image_batch_size through grain,
  split over the devices), then head_step.evaluate's rule on the triplets (the heads' experiments use the same)."""
  bs = sharding.padded(min(fo.image_batch_size, len(rows)), mesh)
  out = []
  for n, x in grain_data.image_batches(rows, images, bs):
    e = embed(trainable, frozen, sharding.to_global(x, sharding.batch_sharding(mesh, x.ndim)))
    out.append(np.asarray(sharding.to_host(e))[:n])
  feats = np.concatenate(out)
  return {k: float(v) for k, v in head_step.evaluate(eval_hp, 'identity', {}, feats, pos, target).items()}


def _leaderboard(config, workdir: str, backbone, progress: bool) -> dict:
  """The leaderboard on the demo human sets (data/human_demo.py): the frozen tower vs the tuned one."""
  from visim_jax.experiments import benchmark
  c = _benchmark_config('local')
  tag = ':tiny' if dict(config.backbone_kwargs).get('tiny') else ''
  c.models = f'cosine:{backbone.name}{tag},tuned:{workdir}'
  c.cache_dir, c.image_batch_size, c.plots = config.cache_dir, config.image_batch_size, config.plots
  c.n_boot = 200
  c.attacks, c.attack_steps = config.adversarial, config.adversarial_eval_steps   # attacked columns before / after
  s = benchmark.run(c, os.path.join(workdir, 'leaderboard'), progress)
  return {'models': s['models'], 'results': s['results']}


def _things(config, workdir: str, backbone, progress: bool) -> dict:
  """THINGS odd-one-out (configs/benchmark.py's protocol on config.things_dir / things_file) of the frozen tower and
  the tuned one, after a run on AligNet's release (AligNet's configs/siglip.py leaves it as a TODO)."""
  from visim_jax.experiments import benchmark
  c = _benchmark_config(None)
  tag = ':tiny' if dict(config.backbone_kwargs).get('tiny') else ''
  c.models = f'cosine:{backbone.name}{tag},tuned:{workdir}'
  c.things_dir, c.things_triplets = config.things_dir, config.things_file
  c.cache_dir, c.image_batch_size, c.plots = config.cache_dir, config.image_batch_size, config.plots
  s = benchmark.run(c, os.path.join(workdir, 'things'), progress)
  return {'models': s['models'], 'results': s['results']}


def _benchmark_config(arg):
  import importlib.util
  path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), 'configs',
                      'benchmark.py')
  spec = importlib.util.spec_from_file_location('benchmark_config', path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod.get_config(arg)


def _print(m: dict, workdir: str) -> None:
  r = m['results']
  shown = ('frozen', 'untrained', 'tuned') if r['untrained'] != r['frozen'] else ('frozen', 'tuned')
  rows = [[k, f"{r[k]['accuracy']:.4f}", f"{r[k]['loss']:.4f}"] for k in shown]
  head = ['tower', 'accuracy', m['hparams']['loss'] + ' loss']
  a = m.get('attacked')
  if a:   # the attacked column: the frozen tower's before, the tuned one's after (untrained: not attacked)
    head.append(f"attacked {a['budget']} (APGD {a['steps']})")
    for row in rows:
      row.append(f"{a[row[0]]:.4f}" if row[0] in a else '')
  runtime.say(f"\nheld-out accuracy ({m['n_triplets']['val']} triplets, {m['target']} targets), {m['backbone']} "
              f"tune={m['hparams']['tune']}, {m['hparams']['steps']} steps, workdir {workdir}")
  runtime.say(report.table(rows, head))
