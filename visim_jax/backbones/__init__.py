"""Backbone families behind one interface (see base.py) and one naming scheme."""
from visim_jax.backbones.base import Backbone
from visim_jax.preprocess import Preprocess
from visim_jax.backbones.registry import get_backbone, list_backbones, register
