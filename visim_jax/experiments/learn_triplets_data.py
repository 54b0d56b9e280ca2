"""The learn_triplets experiment's data: student features and train / held-out triplet index sets for each
config.source (synthetic, a teacher over the demo photos or a folder, index files, THINGS choices, NIGHTS votes)."""
from __future__ import annotations

import os

import numpy as np

from visim_jax.core import memory, ops, report
from visim_jax.training import runtime
from visim_jax.data import teacher_labels, triplet_index
from visim_jax.backbones import features as features_lib
from visim_jax.core.errors import UserError
from visim_jax.experiments import config_fields

def _synthetic(config):
  """(student feats (M, D), teacher feats (M, Dt), names): x ~ N(0, I) unit rows; the teacher sees x through
  Dt orthonormal random directions weighted exp(0) .. exp(-4), t = (x Q) w: cosine on x agrees with it little
  (~55% of odd-one-out choices), an affine head can learn it exactly."""
  s = config.synthetic
  est = lambda v: {'synthetic features': v['config.synthetic.n_images'] * (12 * v['config.synthetic.dim']
                                                                          + 8 * v['config.synthetic.teacher_dim'])}
  sizes = {'config.synthetic.n_images': s.n_images, 'config.synthetic.dim': s.dim,
           'config.synthetic.teacher_dim': s.teacher_dim}
  memory.check(est(sizes), memory.drivers(est, sizes), f'n_images={s.n_images}, dim={s.dim}, '
               f'teacher_dim={s.teacher_dim}', 'making the synthetic features')
  rng = np.random.default_rng(s.seed)
  x = rng.standard_normal((s.n_images, s.dim)).astype(np.float32)
  x /= np.linalg.norm(x, axis=1, keepdims=True)
  q, _ = np.linalg.qr(rng.standard_normal((s.dim, s.teacher_dim)))
  t = (x @ q.astype(np.float32)) * np.exp(np.linspace(0, -4, s.teacher_dim)).astype(np.float32)
  return x, t, [f'synthetic/{i}' for i in range(s.n_images)]


def _images(config) -> list[str]:
  from visim_jax.data import demo, images as images_lib
  if config.source == 'folder':
    return images_lib.list_images(config.image_dir)
  root = demo.demo_pairs(config.demo.root or None, config.demo.n_pairs, config.demo.seed,
                         cache_dir=config.get('cache_dir') or None)
  return images_lib.list_images(os.path.join(root, 'left')) + images_lib.list_images(os.path.join(root, 'right'))


def _teacher_features(config, paths, progress) -> tuple[np.ndarray, dict]:
  """The teacher's pooled features (config.teacher.backbone / layers with the student's image_batch_size, dtype,
  cache and backbone_kwargs.tiny; its own default weights)."""
  t = config.teacher
  c = config.copy_and_resolve_references()
  with c.unlocked():
    c.backbone, c.layers = t.backbone, t.layers
    c.backbone_kwargs.weights, c.backbone_kwargs.random_init = '', -1
  try:   # the student's field checks and builder, on the teacher's fields: its errors name them
    fo = config_fields.options(c)
    backbone, layers = features_lib.build(fo)
  except (UserError, ValueError) as e:   # the registry's ValueError('config.backbone: ...') too
    if not str(e).startswith('config.'):
      raise
    raise UserError(str(e).replace('config.backbone:', 'config.teacher.backbone:').replace(
        'config.layers:', 'config.teacher.layers:')) from None
  feats = features_lib.features_of(fo, backbone, layers, paths, tag='teacher', progress=progress)
  return np.asarray(feats, np.float32), features_lib.describe(backbone, layers)


def load_data(config, workdir: str, progress: bool = True):
  """(student features (M, D), train TripletSet, val TripletSet, description) for config.source."""
  trip = config.triplets
  gen = dict(n_train=trip.n_train, n_val=trip.n_val, clusters=trip.clusters, sampling=trip.sampling,
             val_fraction=float(trip.val_fraction), similarity=config.teacher.similarity,
             kmeans_iters=trip.kmeans_iters, seed=config.seed)
  if config.source == 'synthetic':
    x, t, names = _synthetic(config)
    train, val = _generate(t, names, gen, {'teacher': 'synthetic'})
    return x, train, val, {'backbone': None, 'source': 'synthetic'}
  fo = config_fields.options(config)
  backbone, layers = features_lib.build(fo)
  loader = source_id = None
  if config.source == 'alignet':
    train, val, paths, loader, source_id = _alignet(config)
  elif config.source in ('things', 'nights'):
    train, val = _human(config)
    paths = train.images
  elif config.source == 'files':
    train = triplet_index.load(config.train_file, field='config.train_file')
    val = triplet_index.load(config.val_file, field='config.val_file')
    if train.images != val.images:
      raise UserError(f'{config.val_file}: its image list differs from {config.train_file}\'s; both index files '
                      'must index one image list')
    if train.target_kind != val.target_kind:
      raise UserError(f'{config.val_file}: holds {val.target_kind} targets, {config.train_file} {train.target_kind}')
    from visim_jax.data.judgements import check_files
    paths = _resolved(config.train_file, train.images)
    check_files(paths, 'image')
  else:
    paths = _images(config)
    runtime.say(f'teacher {config.teacher.backbone}: labelling triplets over {len(paths)} images')
    teach, tdesc = _teacher_features(config, paths, progress)
    train, val = _generate(teach, paths, gen, {'teacher': tdesc})
    if config.generate_only:   # the caller writes the index files (write_index_files), after its checks
      return None, train, val, None
  runtime.say(f'student {backbone.name}: features of {len(paths)} images')
  x = np.asarray(features_lib.features_of(fo, backbone, layers, paths, tag='triplets', progress=progress,
                                          loader=loader, source_id=source_id), np.float32)
  return x, train, val, {**features_lib.describe(backbone, layers), 'source': config.source}


def write_index_files(workdir: str, train, val) -> None:
  """<workdir>/triplets_{train,val}.npz (process 0), each only when it is not already there with the same contents
  (a rerun leaves a finished workdir's files untouched); OS errors as one line."""
  if not report.is_writer():
    return
  ops.check_writable_dir(workdir, 'workdir')
  for name, s in (('train', train), ('val', val)):
    path = os.path.join(workdir, f'triplets_{name}.npz')
    if os.path.isfile(path) and _same(path, s):
      continue
    try:
      triplet_index.save(path, s)
    except OSError as e:
      raise runtime.os_error(e, path, 'writing the triplet index file') from e


def _same(path: str, s) -> bool:
  try:
    old = triplet_index.load(path)
  except UserError:
    return False
  return (old.target_kind == s.target_kind and old.images == list(s.images)
          and np.array_equal(old.triplets, s.triplets) and np.array_equal(old.target, s.target))


def _resolved(index_file: str, images) -> list[str]:
  """An index file's image paths: absolute as written, relative ones under the file's own folder (not the working
  folder), never climbing out of it."""
  from visim_jax.data import resolve
  inside = resolve.Root(os.path.dirname(os.path.abspath(index_file))).inside
  return [p if os.path.isabs(p) else inside(p, f'{index_file}: images[{i}]', 'image path')
          for i, p in enumerate(images)]


def generation_bytes(n_train: int, n_val: int, n_images: int, dim: int) -> dict[str, int]:
  """What teacher_labels.generate holds at its peak (bytes): ~260 per triplet (sampling indices, triplets and
  similarities; tracemalloc measured 230-252), four blocks of up to 2^18 gathered teacher rows, and the teacher's
  features with their normalised copy (checked against measured peaks in tests/test_gate_learning.py)."""
  n = max(n_train, n_val)
  return {'triplets': 260 * (n_train + n_val), 'similarity blocks': 16 * min(1 << 18, n) * dim,
          'teacher features': 12 * n_images * dim}


def _alignet(config):
  """AligNet's released train / val files (data/alignet.py) as index sets over the ImageNet images they use: (train,
  val, those images' rows of tfds imagenet2012 train, a loader of them, the feature cache's source id)."""
  from visim_jax.data import alignet, grain_data
  src = grain_data.TfdsImages(alignet.TFDS_NAME, alignet.TFDS_SPLIT, config.tfds_data_dir, None)
  sets = [alignet.load(alignet.path(config.alignet_dir, config.transform, split, sampling), len(src))
          for split, sampling in (('train', config.sampling), ('val', config.val_sampling or config.sampling))]
  ids = np.unique(np.concatenate([s.triplets.reshape(-1) for s in sets]))
  names = [f'{alignet.TFDS_NAME}/{alignet.TFDS_SPLIT}/{i}' for i in ids]
  train, val = (triplet_index.TripletSet(np.searchsorted(ids, s.triplets).astype(np.int32), s.target_kind, s.target,
                                         names, s.meta) for s in sets)
  source_id = {'tfds': alignet.TFDS_NAME, 'split': alignet.TFDS_SPLIT, 'data_dir': config.tfds_data_dir,
               'n': len(src), 'rows': grain_data.rows_digest(ids)}
  return train, val, list(ids), src.loader, source_id


def _human(config):
  """(train, val) index sets of THINGS choices or NIGHTS votes (files checked by the loaders first)."""
  if config.source == 'nights':
    from visim_jax.data import nights
    return triplet_index.from_twoafc(nights.load(config.nights_dir, 'train', config.min_votes),
                                      nights.load(config.nights_dir, 'val', config.min_votes))
  from visim_jax.data import things
  s = things.load(config.things_dir, config.things_file)
  try:
    return triplet_index.from_odd_one_out(s, float(config.triplets.val_fraction), config.seed)
  except ValueError as e:
    raise UserError(f'config.triplets.val_fraction: {e}') from None


def _generate(teacher, names, gen: dict, meta: dict):
  est = lambda v: generation_bytes(v['config.triplets.n_train'], v['config.triplets.n_val'], *teacher.shape)
  sizes = {'config.triplets.n_train': gen['n_train'], 'config.triplets.n_val': gen['n_val']}
  memory.check(est(sizes), memory.drivers(est, sizes), f'n_train={gen["n_train"]:,}, n_val={gen["n_val"]:,}',
               'generating the triplets')
  try:
    return teacher_labels.generate(teacher, names, meta=meta, **gen)
  except ValueError as e:   # too few images for the split / clusters for the sampling
    raise UserError(f'config.triplets: {e}') from None
