"""Backbone families behind one interface (see base.py) and one naming scheme."""
from visim_jax.backbones.registry import get_backbone, list_backbones, register


def __getattr__(name):  # Backbone and Preprocess import jax: only when asked (listing names imports no jax)
  if name == 'Backbone':
    from visim_jax.backbones.base import Backbone  # pylint: disable=g-import-not-at-top
    return Backbone
  if name == 'Preprocess':
    from visim_jax.data.preprocess import Preprocess  # pylint: disable=g-import-not-at-top
    return Preprocess
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
