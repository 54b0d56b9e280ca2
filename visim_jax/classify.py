"""Top-5 ImageNet classes of images, to see with your own eyes that pretrained weights are right.

  python -m visim_jax.classify photo.jpg other.png            # EfficientNet-Lite0, offline
  python -m visim_jax.classify photos/ --out=classes.json     # every image of a folder; results as JSON too
  python -m visim_jax.classify --demo                          # the packaged photos (chelsea, coffee, ...)

The console says which model answered (backbone and weights) and that the numbers are softmax probabilities
over the 1000 ImageNet classes. An image that cannot be decoded is skipped and listed (on the console and in --out's `skipped`); --strict
aborts on it instead. User errors end with one line `error: <file or flag>: <what to do>`, exit status 1.
"""
from __future__ import annotations

import os
from typing import Sequence

import jax
import numpy as np

from visim_jax.core import cpu_kernels
from visim_jax.core import errors
from visim_jax.data import images as images_lib
from visim_jax.core.errors import UserError


def top_classes(backbone, arrays: Sequence[np.ndarray], top: int = 5) -> list[list[tuple[str, float]]]:
  """[(class name, probability)] * top for each uint8 image already resized to the backbone's input."""
  if not backbone.labels:
    raise UserError(f'--backbone: {backbone.name} has no classifier labels (try efficientnet_lite0)')
  logits, _ = cpu_kernels.jit(backbone.__call__)(np.stack(arrays))
  probs = np.asarray(jax.nn.softmax(logits, axis=-1))
  return [[(backbone.labels[i], float(p[i])) for i in np.argsort(-p)[:top]] for p in probs]


def classify(backbone, paths: Sequence[str], top: int = 5, demo: bool = False, strict: bool = False,
             batch_size: int = 32) -> dict:
  """{'images': [{'image', 'classes': [{'label', 'p'}]}], 'skipped': {'count', 'images': [{'path', 'reason'}]}}.

  backbone: a name or a Backbone; paths: image files or folders (their images); undecodable images are
  skipped and listed unless strict.
  """
  from visim_jax.backbones import get_backbone
  if top < 1:
    raise UserError(f'--top: must be >= 1, got {top}')
  if batch_size < 1:
    raise UserError(f'--batch_size: must be >= 1, got {batch_size}')
  files = []
  for p in paths:
    files.extend(images_lib.list_images(p) if os.path.isdir(p) else [p])
  if not files and not demo:
    raise UserError('classify: give image files or folders, or --demo')
  missing = [p for p in files if not os.path.isfile(p)]
  if strict and missing:  # before loading the backbone
    raise images_lib.ImageError(f'{missing[0]}: image file not found')
  if isinstance(backbone, str):
    with errors.as_flags({'config.backbone': '--backbone'}):
      backbone = get_backbone(backbone)
  items, skipped = [], []
  if demo:
    from visim_jax.data import demo as demo_lib
    items = [(name, images_lib.resize(im, backbone.preprocess)) for name, im in sorted(demo_lib.source_images().items())]
  for path in files:
    try:
      items.append((path, images_lib.load_image(path, backbone.preprocess)))
    except images_lib.ImageError as e:
      if strict:
        raise
      skipped.append({'path': path, 'reason': str(e)})
  if not items:
    raise UserError(f'{skipped[0]["path"]}: none of the {len(files)} images can be decoded: {skipped[0]["reason"]}')
  results = []
  for start in range(0, len(items), batch_size):
    chunk = items[start:start + batch_size]
    for (name, _), classes in zip(chunk, top_classes(backbone, [a for _, a in chunk], top)):
      results.append({'image': name, 'classes': [{'label': l, 'p': p} for l, p in classes]})
  return {'backbone': backbone.name, 'weights_sha256': backbone.weights_id,
          'p': 'softmax probability of the class (the classifier head over its 1000 ImageNet classes)',
          'images': results,
          'skipped': {'count': len(skipped), 'images': skipped}}


def main(argv):
  from absl import flags
  from visim_jax.core import report
  f = flags.FLAGS
  out = classify(f.backbone, argv[1:], f.top, f.demo, f.strict, f.batch_size)
  if f.out:
    try:
      report.write_json(f.out, out)
    except OSError as e:
      from visim_jax.training import runtime
      raise runtime.os_error(e, f.out, 'writing --out') from e
  print(f"{out['backbone']} (weights {str(out['weights_sha256'])[:12]}): top {f.top} ImageNet classes per image, "
        'p = softmax probability')
  for r in out['images']:
    print(os.path.basename(r['image']))
    for c in r['classes']:
      print(f'  {c["p"]:6.3f}  {c["label"]}')
  sk = out['skipped']
  if sk['count']:
    print(f'skipped {sk["count"]} image(s) that cannot be decoded: '
          + ', '.join(os.path.basename(s['path']) for s in sk['images']) + ' (--strict aborts instead)')


def _define_flags():  # only when run as a program: importing classify defines no flags
  from absl import flags
  flags.DEFINE_string('backbone', 'efficientnet_lite0', 'A backbone with an ImageNet-1k classifier.')
  flags.DEFINE_integer('top', 5, 'How many classes per image.')
  flags.DEFINE_integer('batch_size', 32, 'Images per forward pass.')
  flags.DEFINE_bool('demo', False, 'Classify the photos packaged with scikit-image / scikit-learn.')
  flags.DEFINE_bool('strict', False, 'Abort on the first image that cannot be decoded (default: skip and list it).')
  flags.DEFINE_string('out', None, 'Also write the results (and skipped images) as JSON to this file.')


if __name__ == '__main__':
  from visim_jax.core import errors
  _define_flags()
  errors.run(main)  # user errors and bad flags as one line `error: ...`, exit 1
