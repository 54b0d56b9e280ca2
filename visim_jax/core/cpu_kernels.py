"""Which XLA CPU kernels visim_jax's programs compile to: `jit` = jax.jit, convolutions and reductions by XLA itself.

jaxlib 0.10-0.12 hand float32 convolutions, dots and reductions on a CPU to YNNPACK (its default
`xla_cpu_experimental_ynn_fusion_type` = INDIVIDUAL_DOT, INDIVIDUAL_CONVOLUTION, REDUCE). Measured on this project's
2-core boxes (`python benchmarks/cpu_kernels.py`, `benchmarks/metrics.py`; RESULTS.md "XLA's CPU kernels"):
YNNPACK's convolutions are 1.05-2.35x slower than XLA's Eigen ones (VGG16's 3x3 layers at 64 px; Eigen runs at
PyTorch's oneDNN rate), and each of its reduction fusions costs ~0.35 ms of set-up (PSNR of 8 pairs of 64 px: 420 us
a call under it, 72 us under XLA's own loops; SSIM and MS-SSIM 4x faster without it), while its dots are as fast as
Eigen's or faster (the look-alike search's 64-query products ran 1.2-1.8x slower under Eigen). Every program the
package jits therefore compiles with YNNPACK for dots only, per program (jax.jit's `compiler_options`), so a user's
own programs keep their XLA_FLAGS. Convolutions and reductions agree with YNNPACK's to float32 rounding (a
different summation order; against a float64 reference Eigen's convolutions are as close or closer); a formula
that cancels (DISTS' covariance) is written two-pass so its value does not hang on that order.

  VISIM_JAX_CPU_KERNELS=eigen        (default) YNNPACK dots, XLA's Eigen convolutions and own reductions
  VISIM_JAX_CPU_KERNELS=eigen_dots   no YNNPACK at all (Eigen dots too)
  VISIM_JAX_CPU_KERNELS=xla          XLA's default kernels

The choice is made at a program's first call, not at import (nothing here initialises a backend at import, so
jax.distributed.initialize and platform settings keep working), and only when the default backend is a CPU: on a
GPU or TPU the options are not passed. A jaxlib that does not know the option (probed once, on a tiny program)
gets no options. A function of ours called inside a caller's own jax.jit compiles with the caller's options:
jit the caller with `visim_jax.jit` (this `jit`) to get the same kernels. `jit` returns a wrapper, not JAX's own
jitted type: `jax.eval_shape(f, ...)` of one with static arguments needs `f.eval_shape(...)` instead.
"""
from __future__ import annotations

import functools
import os
from typing import Any, Callable

ENV = 'VISIM_JAX_CPU_KERNELS'
CHOICES = ('eigen', 'eigen_dots', 'xla')
_YNN = 'xla_cpu_experimental_ynn_fusion_type'
# the library fusions kept (a comma-separated list of the enum's names): jaxlib's default minus convolutions, reductions
EIGEN = {_YNN: 'LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT'}
EIGEN_DOTS = {_YNN: ''}   # dots to Eigen as well


def choice() -> str:
  """'eigen' (default), 'eigen_dots' or 'xla', from $VISIM_JAX_CPU_KERNELS; anything else is refused (one line)."""
  value = os.environ.get(ENV, 'eigen').strip().lower() or 'eigen'
  if value not in CHOICES:
    from visim_jax.core.errors import UserError  # pylint: disable=g-import-not-at-top
    raise UserError(f'${ENV}: one of {CHOICES}, got {value!r}')
  return value


@functools.lru_cache(maxsize=None)
def _supported(backend: str) -> bool:
  """Whether this jaxlib's `backend` compiler accepts EIGEN (a tiny dot, compiled once per process)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  try:
    x = jax.ShapeDtypeStruct((2, 2), jnp.float32)
    jax.jit(jnp.dot, compiler_options=EIGEN, backend=backend).lower(x, x).compile()
    return True
  except Exception:  # pylint: disable=broad-except  # an unknown option: XLA's defaults, as before
    return False


def options() -> dict[str, Any]:
  """The compiler options our programs compile with now: EIGEN (EIGEN_DOTS) on a CPU default backend, else none."""
  if choice() == 'xla':
    return {}
  import jax  # pylint: disable=g-import-not-at-top
  backend = jax.default_backend()
  if backend != 'cpu' or not _supported(backend):
    return {}
  return dict(EIGEN_DOTS if choice() == 'eigen_dots' else EIGEN)


class _Jit:
  """jax.jit(fun, **kwargs, compiler_options=options()) built at the first call or attribute access; called
  while another program is traced (inside a jit, vmap or grad of the caller), the same jit without options (JAX
  refuses compiler options on a nested jit; the outer program's options apply there)."""

  def __init__(self, fun: Callable, kwargs: dict):
    self._fun, self._kwargs, self._jitted, self._nested = fun, dict(kwargs), None, None
    functools.update_wrapper(self, fun)

  def _get(self):
    if self._jitted is None:
      import jax  # pylint: disable=g-import-not-at-top
      kwargs = dict(self._kwargs)
      given = dict(kwargs.pop('compiler_options', None) or {})
      opts = {**options(), **given}
      self._nested = jax.jit(self._fun, **kwargs)
      self._jitted = jax.jit(self._fun, **kwargs, compiler_options=opts) if opts else self._nested
    return self._jitted

  def __call__(self, *args, **kwargs):
    jitted = self._jitted
    if jitted is None:
      jitted = self._get()
    try:
      return jitted(*args, **kwargs)
    except ValueError as e:
      if jitted is self._nested or 'compiler_options' not in str(e):
        raise
      return self._nested(*args, **kwargs)

  def __getattr__(self, name: str):  # lower, trace, eval_shape, clear_cache ...
    if name.startswith('__') or name in ('_fun', '_kwargs', '_jitted', '_nested'):
      raise AttributeError(name)
    return getattr(self._get(), name)


def jit(fun: Callable | None = None, /, **kwargs):
  """jax.jit with our CPU kernels (module docstring); same arguments, also as `jit(**kwargs)(fun)`."""
  if fun is None:
    return lambda f: _Jit(f, kwargs)
  return _Jit(fun, kwargs)
