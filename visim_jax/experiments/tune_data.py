"""The tune experiment's data: train and held-out triplet index sets over one image list, for each source.

  nights   NIGHTS 2AFC votes (votes >= min_votes, DreamSim's filter): the train split, held out: val.
  bapps    BAPPS 2AFC (LPIPS): the 2afc/train sets (traditional, cnn, mix), held out: 2afc/val sets; judge = the
           fraction of humans choosing p1 (2 judges a train triplet, 5 a val one).
  things   THINGS odd-one-out choices, split into train / held-out triplets by triplets.val_fraction.
  demo     the embedded demo photos, folder: an image folder; a teacher from the zoo labels triplets over them
           (data/teacher_labels.py: k-means clusters of its features, border / within / between sampling, the
           teacher's similarities as soft targets: AligNet's 'untransformed' data). The index files are written to
           <workdir>/triplets_{train,val}.npz once the run holds the workdir (`write_index_files`).
           With the hinge (loss='hinge', or '' with `adversarial`), demo is the demo's mini NIGHTS 2AFC votes
           instead (data/human_demo.py, votes >= min_votes): train split, held out: val + test (8 + 16 items).
  files    index files written before (data/triplet_index.py).
  alignet  AligNet's release as published (data/alignet.py): <alignet_dir>/<transform>/{train,val}_<sampling>.npz,
           indices into tfds.data_source('imagenet2012', split='train') (tfds_data_dir), read through grain.

`image_source` gives the images the triplets index, as a grain random-access source (data/grain_data.py).
"""
from __future__ import annotations

import os

import numpy as np

from visim_jax.backbones import features as features_lib
from visim_jax.core import report
from visim_jax.core.errors import UserError
from visim_jax.data import alignet, grain_data, image_batches, judgements, teacher_labels, triplet_index
from visim_jax.training import runtime


def load(opts, progress: bool = True):
  """(train TripletSet, held-out TripletSet, description) over one image list (train.images == val.images)."""
  d, src = opts.data, opts.source
  if src == 'alignet':
    n = len(_imagenet(opts, None))
    train, val = (alignet.load(alignet.path(d['alignet_dir'], opts.transform, split, sampling), n)
                  for split, sampling in (('train', d['sampling']), ('val', d['val_sampling'])))
  elif src == 'nights':
    from visim_jax.data import nights
    train, val = triplet_index.from_twoafc(nights.load(d['nights_dir'], 'train', d['min_votes']),
                                           nights.load(d['nights_dir'], 'val', d['min_votes']))
  elif src == 'demo' and d['demo_votes']:
    from visim_jax.data import human_demo, nights
    root = human_demo.demo_sets(d['demo_root'] or None, d['demo_seed'], opts.features.cache_dir or None).nights
    held = {s: nights.load(root, s, d['min_votes']) for s in ('val', 'test')}
    train, val = triplet_index.from_twoafc(nights.load(root, 'train', d['min_votes']), _concat(held))
  elif src == 'bapps':
    from visim_jax.data import bapps
    train, val = triplet_index.from_twoafc(_concat(bapps.load_2afc(d['bapps_dir'], 'train', d['bapps_sets'])),
                                           _concat(bapps.load_2afc(d['bapps_dir'], 'val', d['bapps_val_sets'])))
  elif src == 'things':
    from visim_jax.data import things
    s = things.load(d['things_dir'], d['things_file'])
    try:
      train, val = triplet_index.from_odd_one_out(s, opts.triplets['val_fraction'], opts.seed)
    except ValueError as e:
      raise UserError(f'config.triplets.val_fraction: {e}') from None
  elif src == 'files':
    train, val = triplet_index.load(d['train_file']), triplet_index.load(d['val_file'])
    if train.images != val.images:
      raise UserError(f'{d["val_file"]}: its image list differs from {d["train_file"]}\'s; both index files must '
                      'index one image list')
    if train.target_kind != val.target_kind:
      raise UserError(f'{d["val_file"]}: holds {val.target_kind} targets, {d["train_file"]} {train.target_kind}')
    judgements.check_files(train.images, 'image')
  else:
    paths = _images(opts)
    runtime.say(f'teacher {opts.teacher.backbone}: labelling triplets over {len(paths)} images')
    backbone, layers = features_lib.build(opts.teacher)
    teach = features_lib.features_of(opts.teacher, backbone, layers, paths, tag='teacher', progress=progress)
    try:
      train, val = teacher_labels.generate(np.asarray(teach, np.float32), paths, similarity=opts.teacher_similarity,
                                           seed=opts.seed, meta={'teacher': features_lib.describe(backbone, layers),
                                                                 'transform': 'untransformed'}, **opts.triplets)
    except ValueError as e:   # too few images for the split / clusters for the sampling
      raise UserError(f'config.triplets: {e}') from None
  if src == 'alignet':   # the files index ImageNet's train split
    return train, val, {'source': src, 'target': train.target_kind, 'n_images': n, 'transform': opts.transform,
                        'files': [train.meta['file'], val.meta['file']]}
  return train, val, {'source': src, 'target': train.target_kind, 'n_images': len(train.images)}


def image_source(opts, train, pre, progress: bool = True):
  """The images train / val index (grain_data): AligNet's tfds ImageNet; else the image list's decoded-pixel table
  (the cache folder <cache_dir>/images with config.image_cache, else in memory), re-read every epoch."""
  if opts.source == 'alignet':
    return _imagenet(opts, pre)
  cache = os.path.join(opts.features.cache_dir, 'images') if opts.features.image_cache else None
  return grain_data.TableImages(image_batches.pixel_table(train.images, pre, cache, progress=progress))


def _imagenet(opts, pre):
  return grain_data.TfdsImages(alignet.TFDS_NAME, alignet.TFDS_SPLIT, opts.data['tfds_data_dir'], pre)


def _concat(sets: dict) -> judgements.TwoAFCSet:
  """Several 2AFC sets as one (the BAPPS train sets are trained on together)."""
  ss = list(sets.values())
  return judgements.TwoAFCSet('+'.join(s.name for s in ss), [p for s in ss for p in s.ref],
                              [p for s in ss for p in s.p0], [p for s in ss for p in s.p1],
                              np.concatenate([s.judge for s in ss]).astype(np.float32),
                              [i for s in ss for i in s.ids])


def _images(opts) -> list[str]:
  from visim_jax.data import demo, images as images_lib
  d = opts.data
  if opts.source == 'folder':
    return images_lib.list_images(d['image_dir'])
  root = demo.demo_pairs(d['demo_root'] or None, d['demo_n_pairs'], d['demo_seed'],
                         cache_dir=opts.features.cache_dir or None)
  return images_lib.list_images(os.path.join(root, 'left')) + images_lib.list_images(os.path.join(root, 'right'))


def write_index_files(workdir: str, train, val) -> None:
  """<workdir>/triplets_{train,val}.npz (process 0, inside the run: a refused run writes nothing); OS errors as one
  line."""
  if not report.is_writer():
    return
  os.makedirs(workdir, exist_ok=True)
  for name, s in (('train', train), ('val', val)):
    path = os.path.join(workdir, f'triplets_{name}.npz')
    try:
      triplet_index.save(path, s)
    except OSError as e:
      raise runtime.os_error(e, path, 'writing the triplet index file') from e
