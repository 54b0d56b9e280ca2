r"""Full-size tuning steps on random weights of the real shapes: peak memory against the estimate, seconds a step.

  python benchmarks/tune_full.py --preset=dreamsim               # configs/tune.py's default: the DINO + CLIP +
                                                                 # OpenCLIP ViT-B/16 ensemble, LoRA, batch 16
  python benchmarks/tune_full.py --preset=alignet --passes=2     # configs/tune.py:alignet (:full where absent):
                                                                 # SigLIP B/16 full tuning, remat, micro-batches
  python benchmarks/tune_full.py --preset=tiny                   # the tiny random ViT of :local (seconds; tests)

What runs is the tune experiment's own path, not a copy: the preset's config (configs/tune.py) -> tune_parse.parse ->
tune.build (the experiment's setup: features.build with `random_init=0`, the real architecture with random weights,
no download; tower_step.tower / Hparams; the abstract trainable tree) -> tower_step.init_state / place / step_program -> `--steps` steps on random uint8 images (and random targets of the
loss's kind) of the config's batch. Before anything is allocated, tune_memory.estimate gives the experiment's
estimate (parameters, gradients, optimiser state, the backward pass's residuals per image x images per pass).

Measured: the process's resident set (VmRSS) before the backbone is built, and its peak (VmHWM, the kernel's
high-water mark) after the steps; the peak above that baseline is what the run added, compared with the estimate.
On a CPU the backbone's host copy and the device copy are both in RAM (on an accelerator only the second is on the
card): the row gives both readings. Seconds a step: the median of the steps after the first (which compiles).

`--passes=N` runs N micro-batches of the preset's micro-batch (batch_size / accum_steps) a step instead of all
accum_steps of them: a pass's memory is the same (the accumulated gradient is one tree), the step's time scales
with the passes; the row says how many ran and extrapolates the full step linearly (said in the JSON).
Prints one JSON object (`--out` writes it too).
"""
from __future__ import annotations

import json
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

_PRESET = flags.DEFINE_enum('preset', 'tiny', ['dreamsim', 'alignet', 'tiny'], 'Which config (module docstring).')
_STEPS = flags.DEFINE_integer('steps', 2, 'Steps to run (the first compiles).')
_PASSES = flags.DEFINE_integer('passes', 0, 'Micro-batches a step (0: all of the config\'s accum_steps).')
_MICRO = flags.DEFINE_integer('micro_batch', 0, 'Triplets a pass (0: the config\'s batch_size / accum_steps).')
_OUT = flags.DEFINE_string('out', '', 'Also write the JSON here.')


def _status(key: str) -> int:
  """Bytes of /proc/self/status's `key` (VmRSS, VmHWM)."""
  with open('/proc/self/status') as f:
    for line in f:
      if line.startswith(key + ':'):
        return int(line.split()[1]) * 1024
  raise KeyError(key)


def preset_config(name: str):
  """The preset's config: configs/tune.py as a user runs it, with random weights and a data source that needs no
  files (the steps below make their own images)."""
  import importlib.util
  path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'configs', 'tune.py')
  spec = importlib.util.spec_from_file_location('tune_config', path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  if name == 'alignet':
    try:
      c = mod.get_config('alignet')
    except ValueError:
      c = mod.get_config('full')
    c.remat = True
    if c.accum_steps == 1:
      c.accum_steps = 16     # 32 triplets (96 images) a pass on one device
  elif name == 'tiny':
    c = mod.get_config('local')
  else:
    c = mod.get_config()
  c.source, c.teacher.backbone = 'demo', 'alexnet'
  if name != 'tiny':
    c.backbone_kwargs.random_init = 0
  return c


def run(preset: str, steps: int, passes: int = 0, micro_batch: int = 0) -> dict:
  import jax
  import numpy as np
  from visim_jax.core import sharding
  from visim_jax.experiments import tune, tune_memory
  from visim_jax.experiments.tune_parse import parse
  from visim_jax.training import tower_step
  c = preset_config(preset)
  opts = parse(c)
  micro = micro_batch or opts.batch_size // max(1, opts.hparams.get('accum_steps', 1))
  full_passes = opts.batch_size // micro
  n_pass = passes or full_passes
  jax.block_until_ready(jax.jit(lambda x: x + 1)(np.zeros(4, np.float32)))   # the backend and XLA up: baseline
  rss0 = _status('VmRSS')
  t0 = time.time()
  built = tune.build(opts, max(steps, 10), accum_steps=n_pass)   # the experiment's own setup
  backbone, tower, hp, image_shape = built.backbone, built.tower, built.hp, built.image_shape
  per_triplet = built.images_a_triplet
  parts, _, sizes = tune_memory.estimate(hp, tower, backbone, built.trainable, image_shape, micro * per_triplet,
                                         opts.fsdp)
  rss_built = _status('VmRSS')
  mesh = sharding.train_mesh(1)
  rng = np.random.RandomState(0)
  b = micro * n_pass
  dtype = np.float32 if backbone.preprocess.interpolation == 'torch_bilinear' else np.uint8
  images = rng.randint(0, 256, (b, 3) + image_shape).astype(dtype)
  if hp.loss == 'hinge':
    target = rng.randint(0, 2, b).astype(np.float32)
  elif hp.loss == 'hard':
    target = rng.randint(0, 3, b).astype(np.int32)
  else:
    target = rng.rand(b, 3).astype(np.float32)
  state, frozen = tower_step.init_state(hp, tower, backbone.variables, jax.random.PRNGKey(0), image_shape)
  state, frozen, batch = tower_step.place(mesh, state, frozen, tower_step.Batch(images, target))
  program = tower_step.step_program(hp, tower, mesh)
  times, losses = [], []
  for _ in range(steps):
    t = time.perf_counter()
    state, m = program(state, frozen, batch)
    jax.block_until_ready(state)
    times.append(time.perf_counter() - t)
    losses.append(float(m['loss']))
  hwm = _status('VmHWM')
  est = float(sum(parts.values()))
  step_s = float(np.median(times[1:])) if len(times) > 1 else float(times[0])
  n_img = b * per_triplet
  return {
      'benchmark': 'tune_full', 'preset': preset, 'backbone': backbone.name, 'tune': hp.tune, 'loss': hp.loss,
      'remat': hp.remat, 'compute_dtype': hp.compute_dtype, 'batch_size_config': opts.batch_size,
      'micro_batch_triplets': micro, 'passes_run': n_pass, 'passes_full_step': full_passes,
      'images_a_pass': micro * per_triplet, 'estimate_bytes': {k: int(v) for k, v in parts.items()},
      'estimate_total_gib': est / 2**30, 'estimate_sizes': sizes,
      'rss_before_build_gib': rss0 / 2**30, 'rss_after_build_gib': rss_built / 2**30,
      'peak_rss_gib': hwm / 2**30, 'peak_above_baseline_gib': (hwm - rss0) / 2**30,
      'peak_above_built_gib': (hwm - rss_built) / 2**30,
      'input_batch_gib': images.nbytes / 2**30,
      'peak_vs_estimate': (hwm - rss0) / est if est else None,
      'step_s': times, 'step_s_median': step_s,
      'full_step_s_extrapolated': step_s * full_passes / n_pass,
      'images_per_s': n_img / step_s, 'losses': losses, 'build_s': time.time() - t0 - sum(times),
      'machine': {'cpu': platform.processor() or platform.machine(), 'cores': os.cpu_count(),
                  'load_avg': os.getloadavg(), 'jax': jax.__version__, 'backend': jax.default_backend()},
  }


def main(argv):
  del argv
  res = run(_PRESET.value, _STEPS.value, _PASSES.value, _MICRO.value)
  text = json.dumps(res, indent=1, default=float)
  print(text)
  if _OUT.value:
    with open(_OUT.value, 'w') as f:
      f.write(text + '\n')


if __name__ == '__main__':
  from visim_jax.core import errors  # pylint: disable=g-import-not-at-top
  app.run(main, flags_parser=errors.flags_parser)   # one-line flag errors; --help exits 0
