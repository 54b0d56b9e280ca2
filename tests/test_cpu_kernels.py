"""core/cpu_kernels: on a CPU our programs keep YNNPACK for dots only (XLA's Eigen convolutions, its own reductions)."""
import ast
import functools
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from visim_jax.core import cpu_kernels
from visim_jax.core.errors import UserError

ROOT = pathlib.Path(__file__).resolve().parents[1] / 'visim_jax'


def _conv_dot(x, w, m):
  y = jax.lax.conv_general_dilated(x, w, (1, 1), 'SAME', dimension_numbers=('NHWC', 'HWIO', 'NHWC'))
  return jnp.maximum(y, 0).reshape(-1, y.shape[-1]) @ m


def _library_ops(text: str) -> set[str]:
  """The ops (convolution, dot, reduce) inside the YNNPACK fusions of a compiled program's HLO text."""
  bodies, name, ops = {}, None, set()
  for line in text.splitlines():
    m = re.match(r'\s*%?([\w.]+) .*\{\s*$', line)
    if m and '=' not in line.split('{')[0]:
      name, bodies[m.group(1)] = m.group(1), ''
    elif name:
      bodies[name] += line + '\n'
  for called in re.findall(r'ynn_fusion[\w.]* = .*calls=%([\w.]+)', text):
    ops |= {op for op in ('convolution', 'dot', 'reduce') if f' {op}(' in bodies.get(called, '')}
  return ops


def _args():
  rng = np.random.default_rng(0)
  return (jnp.asarray(rng.standard_normal((4, 16, 16, 32)), jnp.float32),
          jnp.asarray(rng.standard_normal((3, 3, 32, 32)), jnp.float32),
          jnp.asarray(rng.standard_normal((32, 64)), jnp.float32))


def test_options_by_choice(monkeypatch):
  monkeypatch.delenv(cpu_kernels.ENV, raising=False)
  assert cpu_kernels.choice() == 'eigen'
  assert cpu_kernels.options() == cpu_kernels.EIGEN      # the test machine's backend is a CPU
  monkeypatch.setenv(cpu_kernels.ENV, 'xla')
  assert cpu_kernels.options() == {}
  monkeypatch.setenv(cpu_kernels.ENV, 'fast')
  with pytest.raises(UserError, match=r'VISIM_JAX_CPU_KERNELS: one of .*fast'):
    cpu_kernels.options()


def test_no_ynnpack_fusion_and_same_numbers(monkeypatch):
  monkeypatch.delenv(cpu_kernels.ENV, raising=False)
  args = _args()
  ours = cpu_kernels.jit(_conv_dot)
  text = ours.lower(*args).compile().as_text()
  assert 'convolution(' in text and 'convolution' not in _library_ops(text)
  default_ops = _library_ops(jax.jit(_conv_dot).lower(*args).compile().as_text())
  assert _library_ops(text) == default_ops - {'convolution', 'reduce'}   # dots as jaxlib's default has them
  plain = lambda x, m: x.reshape(-1, x.shape[-1]) @ m    # a dot alone: the very same program
  assert (cpu_kernels.jit(plain).lower(args[0], args[2]).compile().as_text()
          == jax.jit(plain).lower(args[0], args[2]).compile().as_text())
  monkeypatch.setenv(cpu_kernels.ENV, 'xla')
  default = cpu_kernels.jit(_conv_dot)                   # a fresh wrapper reads the choice at its first use
  want = np.asarray(jax.jit(_conv_dot)(*args))
  np.testing.assert_allclose(np.asarray(ours(*args)), want, rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose(np.asarray(default(*args)), want, rtol=0, atol=0)


def test_forms_of_jax_jit():
  @functools.partial(cpu_kernels.jit, static_argnums=1)
  def power(x, n):
    return x ** n

  @cpu_kernels.jit(static_argnames='k')
  def scale(x, k=2):
    return x * k

  x = jnp.arange(4.0)
  np.testing.assert_array_equal(power(x, 3), x ** 3)
  np.testing.assert_array_equal(scale(x, k=5), x * 5)
  assert power.__name__ == 'power'
  donated = cpu_kernels.jit(lambda a: a * 2, donate_argnums=0)
  np.testing.assert_array_equal(donated(jnp.ones(3)), 2 * np.ones(3))
  given = cpu_kernels.jit(lambda a: a + 1, compiler_options={'xla_cpu_enable_fast_math': False})
  np.testing.assert_array_equal(given(jnp.ones(3)), 2 * np.ones(3))


def test_every_program_of_the_package_uses_it():
  """No module but core/cpu_kernels.py calls jax.jit itself (ast: code, not docstrings)."""
  found = []
  for path in ROOT.rglob('*.py'):
    if path.name == 'cpu_kernels.py' and path.parent.name == 'core':
      continue
    for node in ast.walk(ast.parse(path.read_text())):
      if (isinstance(node, ast.Attribute) and node.attr in ('jit', 'pmap') and isinstance(node.value, ast.Name)
          and node.value.id == 'jax'):
        found.append(f'{path.relative_to(ROOT.parent)}:{node.lineno}')
  assert not found, f'use visim_jax.core.cpu_kernels.jit, not jax.jit: {found}'


def test_inside_callers_jit_vmap_and_grad():
  """Called while another program is traced, ours runs as a plain nested jit (JAX refuses nested options)."""
  inner = cpu_kernels.jit(lambda x: jnp.sin(x) * 2.0)
  x = jnp.linspace(0.0, 1.0, 5)
  want = np.sin(np.asarray(x)) * 2.0
  np.testing.assert_allclose(jax.jit(lambda v: inner(v) + 1.0)(x), want + 1.0, rtol=1e-6)
  np.testing.assert_allclose(cpu_kernels.jit(lambda v: inner(v) + 1.0)(x), want + 1.0, rtol=1e-6)
  np.testing.assert_allclose(jax.vmap(inner)(x), want, rtol=1e-6)
  np.testing.assert_allclose(jax.grad(lambda v: inner(v).sum())(x), 2.0 * np.cos(np.asarray(x)), rtol=1e-6)
  np.testing.assert_allclose(inner(x), want, rtol=1e-6)   # and top level again, with the options


def test_library_face():
  import visim_jax as vj
  assert vj.jit is cpu_kernels.jit and 'jit' in vj.__all__
