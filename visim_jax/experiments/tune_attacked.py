"""The tune experiment's held-out robustness (config.adversarial; docs/robustness.md): the 2AFC accuracy of a tower
on the APGD examples of the held-out references, before and after tuning."""
from __future__ import annotations

import functools

import jax
import numpy as np

from visim_jax.core import cpu_kernels, sharding


def budget(hp) -> str:
  from visim_jax.experiments import benchmark_attacks
  return benchmark_attacks.label(hp.adv_norm, hp.adv_eps)


@functools.lru_cache(maxsize=4)
def _attack_program(hp, tower, steps: int):
  from visim_jax.training import tower_step
  return cpu_kernels.jit(functools.partial(tower_step.attacked_correct, hp, tower, steps))


def accuracy(hp, images, val, steps: int, seed: int, batch: int, tower, trainable, frozen) -> float:
  """Held-out 2AFC accuracy of the tower on the APGD examples of the references (tower_step.attacked_correct), in
  batches of `batch` items (the last one padded; random starts keyed by (seed, batch index))."""
  from visim_jax.training import tower_step
  program = _attack_program(hp, tower, steps)
  n, bs = len(val), min(batch, len(val))
  out = []
  for k, lo in enumerate(range(0, n, bs)):
    rows = np.arange(lo, lo + bs) % n
    pixels = np.stack([np.stack([images[int(i)] for i in val.triplets[r]]) for r in rows])
    key = jax.random.fold_in(jax.random.PRNGKey(seed), 0xE7A1 + k)
    ok = program(trainable, frozen, tower_step.Batch(pixels, np.asarray(val.target[rows], np.float32)), key)
    out.append(np.asarray(sharding.to_host(ok))[:min(bs, n - lo)])
  return float(np.concatenate(out).mean())
