"""Top-5 ImageNet classes of images, to see with your own eyes that pretrained weights are right.

  python -m visim_jax.classify photo.jpg other.png            # EfficientNet-Lite0, offline
  python -m visim_jax.classify --demo                          # the packaged photos (chelsea, coffee, ...)
"""
from __future__ import annotations

import os
from typing import Sequence

import jax
import numpy as np
from absl import app, flags

from visim_jax.data import images as images_lib

_BACKBONE = flags.DEFINE_string('backbone', 'efficientnet_lite0', 'A backbone with an ImageNet-1k classifier.')
_TOP = flags.DEFINE_integer('top', 5, 'How many classes per image.')
_DEMO = flags.DEFINE_bool('demo', False, 'Classify the photos packaged with scikit-image / scikit-learn.')


def top_classes(backbone, arrays: Sequence[np.ndarray], top: int = 5) -> list[list[tuple[str, float]]]:
  """[(class name, probability)] * top for each uint8 image already resized to the backbone's input."""
  if not backbone.labels:
    raise ValueError(f'{backbone.name} has no classifier labels')
  logits, _ = jax.jit(backbone.__call__)(np.stack(arrays))
  probs = np.asarray(jax.nn.softmax(logits, axis=-1))
  return [[(backbone.labels[i], float(p[i])) for i in np.argsort(-p)[:top]] for p in probs]


def main(argv):
  from visim_jax.backbones import get_backbone
  from visim_jax.data import demo
  backbone = get_backbone(_BACKBONE.value)
  items = []
  if _DEMO.value:
    for name, im in sorted(demo.source_images().items()):
      items.append((name, images_lib.resize(im, backbone.preprocess)))
  for path in argv[1:]:
    items.append((path, images_lib.load_image(path, backbone.preprocess)))
  if not items:
    raise app.UsageError('give image files, or --demo')
  for (name, _), classes in zip(items, top_classes(backbone, [a for _, a in items], _TOP.value)):
    print(os.path.basename(name))
    for label, p in classes:
      print(f'  {p:6.3f}  {label}')


if __name__ == '__main__':
  app.run(main)
