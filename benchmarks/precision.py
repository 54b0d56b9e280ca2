"""The float32 matmul / convolution precision of both sides of a benchmark, set explicitly and recorded.

  import precision
  precision.define_flag()          # absl scripts: --precision (default: $VISIM_BENCH_PRECISION or 'fp32')
  rec = precision.apply()          # before building anything; rec goes into the JSON as result['precision']

  fp32  strict float32 on both sides: JAX jax_default_matmul_precision='highest'; PyTorch
        torch.backends.cuda.matmul.allow_tf32 = False, torch.backends.cudnn.allow_tf32 = False,
        torch.set_float32_matmul_precision('highest')
  tf32  TensorFloat-32 on both sides (GPUs from Ampere on): JAX 'tensorfloat32'; PyTorch allow_tf32 = True for
        matmuls and cuDNN, set_float32_matmul_precision('high')
bfloat16 compute is a dtype choice of each script (--dtype), the same on both sides where a script offers it; the
precision setting only concerns float32 operands. On a CPU both settings compute in float32.
"""
from __future__ import annotations

import os

CHOICES = ('fp32', 'tf32')
_JAX = {'fp32': 'highest', 'tf32': 'tensorfloat32'}


def default() -> str:
  return os.environ.get('VISIM_BENCH_PRECISION', 'fp32')


def define_flag():
  from absl import flags  # pylint: disable=g-import-not-at-top
  if 'precision' not in flags.FLAGS:
    flags.DEFINE_enum('precision', default(), list(CHOICES),
                      'float32 precision of both sides (see benchmarks/precision.py).')


def apply(name: str | None = None, torch_side: bool = True) -> dict:
  """Sets `name` (default: the --precision flag, else $VISIM_BENCH_PRECISION, else fp32) on JAX and, when it
  imports and torch_side (False: a NumPy reference, nothing to set), PyTorch; returns what was set (for the JSON)."""
  if name is None:
    try:
      from absl import flags  # pylint: disable=g-import-not-at-top
      name = flags.FLAGS.precision if 'precision' in flags.FLAGS and flags.FLAGS.is_parsed() else default()
    except ImportError:
      name = default()
  if name not in CHOICES:
    raise ValueError(f'precision: expected one of {CHOICES}, got {name!r}')
  import jax  # pylint: disable=g-import-not-at-top
  jax.config.update('jax_default_matmul_precision', _JAX[name])
  rec = {'name': name, 'jax_default_matmul_precision': _JAX[name]}
  if not torch_side:
    rec['reference'] = 'NumPy on the host (float32 / float64 as the script says)'
    return rec
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    return rec
  tf32 = name == 'tf32'
  torch.backends.cuda.matmul.allow_tf32 = tf32
  torch.backends.cudnn.allow_tf32 = tf32
  torch.set_float32_matmul_precision('high' if tf32 else 'highest')
  rec.update({'torch.backends.cuda.matmul.allow_tf32': tf32, 'torch.backends.cudnn.allow_tf32': tf32,
              'torch.float32_matmul_precision': torch.get_float32_matmul_precision()})
  return rec
