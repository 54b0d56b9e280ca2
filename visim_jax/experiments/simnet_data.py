"""The SimNet experiment's data: config -> vectors (see experiments/simnet.py): the labelled set or the pairs,
through data/classes, data/pairs and the feature cache; the split (classes: 'images' stratified or 'classes'
held out; pairs: a seeded train_fraction); optional PCA fitted on training vectors, then L2. Sizes known from
the file list (the split, pca_dim against the feature size and the training vectors) are checked before any
image is read.
"""
from __future__ import annotations

import os

import jax.numpy as jnp
import numpy as np

from visim_jax.backbones import features as features_lib
from visim_jax.core import ops
from visim_jax.models import simnet
from visim_jax.data import classes as classes_lib
from visim_jax.data import npz
from visim_jax.data import pairs as pairs_lib
from visim_jax.core.errors import UserError
from visim_jax.experiments import config_fields


def _extract(config, groups, progress, n_fit):
  """[(paths, names, tag)] -> feature arrays through the cache, and the description metrics.json records.
  config.pca_dim is checked against the feature size and the `n_fit` training vectors before extraction."""
  fo = config_fields.options(config)
  backbone, layers = features_lib.build(fo)
  dim = sum(backbone.layer_dims(layers).values())
  if config.pca_dim > min(dim, n_fit):
    raise UserError(f'config.pca_dim: {config.pca_dim} exceeds min(feature dim {dim}, training vectors {n_fit}); '
                    f'use --config.pca_dim={min(dim, n_fit)} or less')
  out = [features_lib.features_of(fo, backbone, layers, p, n, tag, progress=progress) for p, n, tag in groups]
  return out, features_lib.describe(backbone, layers)


def load_classes(config, progress=True):
  """(features (N, D) float32, labels (N,) int32 over the classes present, description)."""
  if config.dataset == 'features':
    z = npz.read_arrays(config.features, ('features', 'labels'))
    x, raw = z['features'].astype(np.float32), z['labels']
    if x.ndim != 2 or raw.shape != (len(x),):
      raise UserError(f'config.features: {config.features}: features {x.shape} and labels {raw.shape} mismatch')
    npz.check_features(x, config.features)
    desc = {'source': os.path.abspath(config.features)}
  else:
    if config.dataset == 'demo':
      root = config_fields.demo_root(config)
      data = classes_lib.demo_labelled(os.path.dirname(root), config.demo.n_pairs, config.demo.seed)
      half = len(data.paths) // 2   # left sides, then right sides (the cache entries of the pairs experiments)
      names = [os.path.basename(p) for p in data.paths[:half]]
      groups = [(data.paths[:half], names, 'left'), (data.paths[half:], names, 'right')]
    else:
      root = config.data_dir
      data = classes_lib.image_folder(root)
      groups = [(data.paths, [os.path.relpath(p, root) for p in data.paths], 'classes')]
    labels = np.unique(data.labels, return_inverse=True)[1]
    if labels.max() >= 1:  # the split prepare() will draw (same seed): its sizes are checked before extraction
      n_fit = len(split_classes(labels, config, np.random.RandomState(config.seed))[0])
    arrays, desc = _extract(config, groups, progress, n_fit if labels.max() >= 1 else len(labels))
    x, raw, desc['root'] = np.concatenate(arrays), data.labels, os.path.abspath(root)
  names, labels = np.unique(raw, return_inverse=True)
  if len(names) < 2:
    raise UserError(f'config.dataset={config.dataset}: need at least 2 classes, found {len(names)}')
  return x, labels.astype(np.int32), {**desc, 'n_classes': len(names)}


def load_pairs(config, progress=True):
  """(left, right, names, description)."""
  if config.dataset == 'features':
    left, right, names = pairs_lib.load_feature_pairs(config.features)
    return left, right, names, {'source': os.path.abspath(config.features)}
  pairs, root = config_fields.pairs(config)
  n_train = pair_split(config, len(pairs))
  (left, right), desc = _extract(config, [(pairs.left, pairs.names, 'left'), (pairs.right, pairs.names, 'right')],
                                 progress, 2 * n_train)
  pairs_lib.check_feature_pairs(left, right, pairs.names, source=f'{config.backbone} features of {root}')
  return left, right, pairs.names, {**desc, 'root': os.path.abspath(root)}


def pair_split(config, n: int) -> int:
  """The number of training pairs; refuses splits too small for training or for the largest k."""
  n_train, k = int(round(config.train_fraction * n)), max(int(k) for k in config.ks)
  if n_train < 2 or n - n_train < k:
    raise UserError(f'config.train_fraction: {config.train_fraction} of {n} pairs gives {n_train} train / '
                    f'{n - n_train} test pairs (need 2+ and at least max(ks) = {k})')
  return n_train


def split_classes(labels, config, rng):
  """(train_idx, test_idx) of a labelled set: 'images' stratified per class, or 'classes' held out."""
  n_cls = labels.max() + 1
  if config.split == 'classes':
    test_cls = np.zeros(n_cls, bool)
    test_cls[rng.permutation(n_cls)[:max(1, int(round(config.test_fraction * n_cls)))]] = True
    test = test_cls[labels]
  else:
    test = np.zeros(len(labels), bool)
    for c in range(n_cls):
      idx = rng.permutation(np.nonzero(labels == c)[0])
      test[idx[:int(round(config.test_fraction * len(idx)))]] = True
  train_idx, test_idx = np.nonzero(~test)[0], np.nonzero(test)[0]
  counts = np.bincount(labels[train_idx], minlength=n_cls)
  if (counts >= 2).sum() < 1 or (counts > 0).sum() < 2:
    raise UserError(f'config.test_fraction: {config.test_fraction} leaves a training split without 2 classes, '
                    f'one with 2+ images (class counts {counts.tolist()})')
  if len(test_idx) < 2:
    raise UserError(f'config.test_fraction: {config.test_fraction} gives a test split of {len(test_idx)} images')
  return train_idx, test_idx


def transform(config, fit_rows, *arrays):
  """Optional PCA (fitted on fit_rows) then L2 normalisation; returns float32 arrays."""
  if config.pca_dim:
    from visim_jax.core import pca as pca_lib
    if config.pca_dim > min(fit_rows.shape[1], len(fit_rows)):
      raise UserError(f'config.pca_dim: {config.pca_dim} exceeds min(feature dim {fit_rows.shape[1]}, training '
                      f'vectors {len(fit_rows)})')
    p = pca_lib.fit(jnp.asarray(fit_rows), config.pca_dim)
    arrays = [np.asarray(pca_lib.transform(p, jnp.asarray(a))) for a in arrays]
  return [np.asarray(ops.l2_normalize(np.asarray(a, np.float32)) if config.normalize else a, np.float32)
          for a in arrays]


def prepare(config, progress):
  """Mode -> {'dim', 'train' (sampler data), 'test' arrays, fingerprint arrays, metrics extras, retrieval}."""
  rng = np.random.RandomState(config.seed)
  if config.mode == 'warmup':
    return {'dim': int(config.warmup_dim), 'fp': {}, 'desc': {}, 'extra': {}}
  if config.mode == 'classes':
    x, labels, desc = load_classes(config, progress)
    tr, te = split_classes(labels, config, rng)
    x_tr, x_te = transform(config, x[tr], x[tr], x[te])
    out = {'dim': x_tr.shape[1], 'fp': {'features': x, 'labels': labels, 'training rows': tr}, 'desc': desc,
           'labels_train': labels[tr],
           'train': {'a': x_tr, 'b': x_tr, 'index': simnet.class_index(labels[tr])},
           'test': (x_te, labels[te]),
           'extra': {'n_images': int(len(x)), 'n_classes': desc.pop('n_classes'), 'n_train': int(len(tr)),
                     'n_test': int(len(te)), 'split': config.split}}
    if config.retrieval.gt:
      r = load_retrieval_eval(config, x.shape[1])
      db, q = transform(config, x[tr], r['database'], r['queries'])
      out['retrieval'] = {'database': db, 'queries': q, 'gt': r['gt']}
    if config.retrieval.roots:
      out['retrieval_sets'] = {}
      for r in load_retrieval_sets(config, progress):
        db, q = transform(config, x[tr], r['database'], r['queries'])
        out['retrieval_sets'][r['name']] = {'database': db, 'queries': q, 'gt': r['gt']}
    return out
  left, right, names, desc = load_pairs(config, progress)
  n, perm = len(names), rng.permutation(len(names))
  n_train = pair_split(config, n)
  tr, te = np.sort(perm[:n_train]), np.sort(perm[n_train:])
  l_tr, r_tr, l_te, r_te = transform(config, np.concatenate([left[tr], right[tr]]), left[tr], right[tr], left[te],
                                     right[te])
  return {'dim': l_tr.shape[1], 'fp': {'left features': left, 'right features': right, 'training pairs': tr},
          'desc': desc, 'train': {'a': l_tr, 'b': r_tr},
          'test': (l_te, r_te), 'extra': {'n_pairs': n, 'n_train': n_train, 'n_test': n - n_train}}


# ------------------------------------------------------------------------- Oxford / Paris evaluation sets

def load_retrieval_eval(config, dim):
  from visim_jax.data import retrieval as retrieval_data
  path = config.retrieval.features
  z = npz.read_arrays(path, ('database', 'queries'), ('imlist',), field='config.retrieval.features')
  db, q = z['database'].astype(np.float32), z['queries'].astype(np.float32)
  imlist = [str(n) for n in z['imlist']] if 'imlist' in z else None
  for name, a in (('database', db), ('queries', q)):
    if a.ndim != 2 or a.shape[1] != dim:
      raise UserError(f'config.retrieval.features: {path}: {name} is {a.shape}, expected (N, {dim}) like the '
                      'training features')
    npz.check_features(a, f'config.retrieval.features: {path}', what=name)
  gt = retrieval_data.load_gt(config.retrieval.gt, imlist)
  if len(gt.imlist) != len(db) or len(gt) != len(q):
    raise UserError(f'config.retrieval: ground truth has {len(gt.imlist)} images / {len(gt)} queries, features '
                    f'{len(db)} / {len(q)}')
  return {'database': db, 'queries': q, 'gt': gt}


def load_retrieval_sets(config, progress=True) -> list[dict]:
  """config.retrieval.roots -> [{'name', 'database', 'queries', 'gt'}]: R-MAC of every database image and of every
  query cropped to its box (data/retrieval.py folders), with the run's backbone, whitening and cache."""
  from visim_jax.data import retrieval as retrieval_data
  fo = config_fields.options(config)
  backbone, _ = features_lib.build(fo)
  out = []
  for root in [r.strip() for r in config.retrieval.roots.split(',') if r.strip()]:
    ds = retrieval_data.load_retrieval_set(root)
    db = features_lib.rmac_features(fo, backbone, ds.image_paths, tag=f'{ds.name}-db', progress=progress)
    q = features_lib.rmac_features(fo, backbone, ds.query_paths, bboxes=ds.gt.bboxes, tag=f'{ds.name}-queries',
                                   progress=progress)
    out.append({'name': ds.name, 'database': db, 'queries': q, 'gt': ds.gt})
  return out
