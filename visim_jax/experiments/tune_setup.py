"""The tune experiment's setup, shared with benchmarks/tune_full.py: TuneOptions -> the backbone, its Tower, the
step's Hparams and the abstract trainable state (nothing allocated)."""
from __future__ import annotations

import dataclasses

import jax

from visim_jax.backbones import features as features_lib
from visim_jax.data import image_batches


@dataclasses.dataclass(frozen=True)
class Built:
  """What a run tunes, before any state exists: the backbone, its Tower, the step's Hparams, the image shape and the
  abstract trainable tree (jax.eval_shape of tower_step.init_state: nothing allocated)."""
  backbone: object
  tower: object
  hp: object
  image_shape: tuple
  trainable: dict

  @property
  def images_a_triplet(self) -> int:
    return 4 if self.hp.two_refs else 3


def build(opts, steps: int, **hparams) -> Built:
  """TuneOptions -> Built (the experiment's and benchmarks/tune_full.py's one setup): features.build, AligNet's
  preprocessing where pixels='alignet', tower_step.tower / Hparams (hparams: overrides of opts.hparams, e.g.
  accum_steps) and the abstract trainable tree."""
  from visim_jax.models import lora as lora_lib
  from visim_jax.training import tower_step
  backbone, _ = features_lib.build(opts.features)
  if opts.pixels == 'alignet':   # AligNet's preprocessing.py: a cubic squash to 224 x 224, values in [0, 1]
    backbone = dataclasses.replace(backbone, preprocess=image_batches.alignet_preprocess(backbone.preprocess.size))
  tower = tower_step.tower(backbone, feature=opts.feature or None, head=opts.head, head_size=opts.head_size)
  hp = tower_step.Hparams(**{**opts.hparams, **hparams}, steps=steps, lora=lora_lib.Config(**opts.lora))
  hp.check()
  size = backbone.preprocess.size
  image_shape = (size, size, 3)
  abstract, _ = jax.eval_shape(lambda: tower_step.init_state(hp, tower, backbone.variables,
                                                             jax.random.PRNGKey(opts.seed), image_shape))
  return Built(backbone, tower, hp, image_shape, abstract.trainable)
