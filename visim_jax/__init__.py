"""visim_jax: learning and measuring visual image similarity (four papers) in JAX.

The house, layer folders from the bottom up (imports run down only; tests/test_house.py checks it):
core/ (errors, readers, safe_pickle, ops, memory, report, sharding, pca) <- hub/ (sources, download) <- data/ (one
loader per source, preprocess, pipeline) <- metrics/ <- backbones/ (families, features, cache) <- models/ (pure math
per paper) <- losses/ <- training/ (runtime, the jitted programs) <- zoo/ (every model by spec) <- plots/ <-
experiments/ (config -> typed options -> wiring) <- the faces: api.py (`load`), main.py and the other commands.
See README "Layout".
"""

__all__ = ['load', 'Model', 'jit', 'calibrate', 'load_calibration', 'plot_calibration', 'attack']


def __getattr__(name):
  """`visim_jax.load` / `visim_jax.Model` / `visim_jax.attack` (api.py) and `visim_jax.jit` (core/cpu_kernels.py: jax.jit with the CPU
  kernels the package's own programs use), imported on first use: `import visim_jax` stays cheap."""
  if name == 'jit':
    from visim_jax.core import cpu_kernels  # pylint: disable=g-import-not-at-top
    return cpu_kernels.jit
  if name in __all__:
    from visim_jax import api  # pylint: disable=g-import-not-at-top
    return getattr(api, name)
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
