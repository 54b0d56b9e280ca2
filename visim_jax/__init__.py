"""visim_jax: learning and measuring visual image similarity (four papers) in JAX.

The house, bottom to top (imports go one way): leaves (ops, errors, preprocess, safe_pickle) <- data/ (one
loader per source) and backbones/ (one module per family) <- features.py (pooling, extraction, cache, backbone
config glue) <- the pure math per paper (adaptation, pca, train, simnet, rmac, triplets, ensembles, metrics/)
<- runtime.py (the one training loop: lock, fingerprint, Orbax, resume), plots/, report.py <- experiments/
(wiring only) <- main.py and the other command-line tools (search/, classify, export). See README "Layout".
"""

__all__ = ['load', 'Model']


def __getattr__(name):
  """`visim_jax.load` / `visim_jax.Model` (api.py), imported on first use: `import visim_jax` stays cheap."""
  if name in __all__:
    from visim_jax import api  # pylint: disable=g-import-not-at-top
    return getattr(api, name)
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
