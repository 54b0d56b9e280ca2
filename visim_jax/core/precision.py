"""The float32 matmul / convolution precision of a run: a recorded config choice (config.matmul_precision).

  'default'  the backend's default: float32 on a CPU; on a GPU XLA may use TensorFloat-32 for float32 dots and
             convolutions (about 1e-3 relative error per product: headlines can move in their last digits)
  'high'     TensorFloat-32 (or bfloat16 x 3 on TPUs) where the hardware has it
  'highest'  full float32 everywhere: a GPU run reproduces the CPU numbers to rounding
Applied around the whole run with jax.default_matmul_precision (visim_jax/main.py); every metrics.json records
the precision in effect as `matmul_precision` (runtime.Run.write_metrics), config.json the field.
"""
from __future__ import annotations

import contextlib

MATMUL_PRECISIONS = ('default', 'high', 'highest')


def context(p: str = 'default'):
  """jax.default_matmul_precision(p) (config.matmul_precision), or nothing for 'default'."""
  if p == 'default':
    return contextlib.nullcontext()
  if p not in MATMUL_PRECISIONS:
    from visim_jax.core.errors import UserError  # pylint: disable=g-import-not-at-top
    raise UserError(f'config.matmul_precision: one of {MATMUL_PRECISIONS}, got {p!r}')
  import jax  # pylint: disable=g-import-not-at-top
  return jax.default_matmul_precision(p)


def in_effect() -> str:
  """The matmul precision JAX is using now: 'default' or the value set (config.matmul_precision, a context)."""
  import jax  # pylint: disable=g-import-not-at-top
  return str(jax.config.jax_default_matmul_precision or 'default')
