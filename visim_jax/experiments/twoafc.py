"""The CoSIS 2AFC experiment (paper 004) end to end: annotations -> features -> CS models -> ensembles -> report.

Annotations (config.annotations): a CoSIS folder (dist_<ref>.txt x 8, mulref_val.txt, mulref_test.txt,
filename_dict.txt); '' = ../shared/data/cosis beside the checkout when present, else a small synthetic set in
the CoSIS format (written into workdir/synthetic_cosis, labels from a hidden metric on the stand-in
features, so there is something to learn); 'synthetic' forces the synthetic set.

Features, keyed by image id (`val/715`, `train/5880`), one of:
  * stand-in (neither config.features nor config.image_dir): seeded random vectors, a pure function of
    (seed, id). Labelled `features.kind = 'stand_in'` in metrics.json: on the real annotations they carry no
    information, so every accuracy is chance by construction; the run checks the pipeline, not the method.
  * config.features: an .npz with `features` (N, D) and `names` (N,): ids or BG-20k names (via filename_dict).
  * config.image_dir: a BG-20k folder (train/ and testval/ or val/); features from config.backbone through
    visim_jax.features.cached_features (cached once per image list x backbone).

Steps: cosine baseline on mulref_val / mulref_test; one CS head per context set trained on 2/3 of its rows
(all K in one vmapped program); each model's accuracy on every context's held-out third (Table 8), on
mulref_val and mulref_test (Table 4); ensembles fitted on mulref_val, evaluated on mulref_test (Table 6),
for the embedding answers and for the ranking-block answers (Table 7).
Outputs: config.json, metrics.json (schema in docs/twoafc.md), TensorBoard scalars (training loss per
context), plots/accuracy_per_context.png, plots/cross_context.png, plots/credibility_maps.png,
plots/ensembles.png; a console table.
"""
from __future__ import annotations

import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from visim_jax import ensembles, report
from visim_jax import triplets as cs
from visim_jax.data import triplets as tdata
from visim_jax.metrics import twoafc

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED_COSIS = os.path.join(REPO, '..', 'shared', 'data', 'cosis')
SYNTHETIC_VERSION = 1


# ------------------------------------------------------------------------------------------- config

def validate_config(config) -> None:
  def need(cond, field, msg):
    if not cond:
      value = config
      for part in field.split('.'):
        value = value[part]
      raise ValueError(f'config.{field}: {msg} (got {value!r})')
  need(not (config.features and config.image_dir), 'image_dir', 'set config.features or config.image_dir, not both')
  need(config.stand_in_dim >= 2, 'stand_in_dim', 'must be >= 2')
  m, e = config.model, config.ensemble
  need(0 < m.train_fraction < 1, 'model.train_fraction', 'must be in (0, 1)')
  for f in ('embed_dim', 'hidden', 'steps'):
    need(m[f] >= 1, f'model.{f}', 'must be >= 1')
  need(m.batch_size >= 0, 'model.batch_size', '>= 0 (0: full batch)')
  need(m.lr > 0, 'model.lr', 'must be > 0')
  need(m.triplet_weight >= 0, 'model.triplet_weight', 'must be >= 0')
  need(e.grid >= 2, 'ensemble.grid', 'must be >= 2')
  need(e.window >= 1 and e.window % 2 == 1, 'ensemble.window', 'an odd number of cells')
  need(e.mlp_dim >= 1 and e.mlp_hidden >= 1 and e.mlp_steps >= 1 and e.mlp_seeds >= 1, 'ensemble.mlp_seeds',
       'mlp_dim, mlp_hidden, mlp_steps, mlp_seeds must be >= 1')
  need(config.n_boot >= 0, 'n_boot', 'must be >= 0')
  need(config.dtype in ('float32', 'bfloat16'), 'dtype', "'float32' or 'bfloat16'")


# ------------------------------------------------------------------------------------------------ data

def stand_in_features(keys, dim: int, seed: int) -> np.ndarray:
  """Seeded random vectors, each a pure function of (seed, image id): the same id always gets the same row."""
  out = np.empty((len(keys), dim), np.float32)
  for i, k in enumerate(keys):
    split, idx = k.split('/', 1)
    out[i] = np.random.default_rng([seed, 0 if split == 'val' else 1, int(idx)]).standard_normal(dim)
  return out


def write_synthetic_cosis(folder: str, seed: int = 0, dim: int = 32, n_val: int = 600, n_train: int = 400,
                          rows_per_context: int = 60, val_refs: int = 120, test_refs: int = 90) -> str:
  """A small CoSIS-format set (same file names and layout) whose answers follow a hidden metric.

  Truth: cosine after a fixed anisotropic rescaling of the stand-in features (dim = the stand-in dim), so plain
  cosine is informative but imperfect and a trained head can do better. Candidates of a row are sorted by
  truth similarity; classes are the similarity cut at (0.6, 0.3, 0, -0.3). mulref_val.txt gets a header line.
  """
  rng = np.random.RandomState(seed)
  scale = np.exp(np.linspace(1.5, -1.5, dim))[rng.permutation(dim)]
  keys = {'val': [f'val/{i}' for i in range(n_val)], 'train': [f'train/{i}' for i in range(n_train)]}
  truth = {s: stand_in_features(k, dim, seed) * scale for s, k in keys.items()}
  truth = {s: t / np.linalg.norm(t, axis=1, keepdims=True) for s, t in truth.items()}

  def rows(split, ref, n):
    out = []
    pool = len(truth[split])
    for _ in range(n):
      c = rng.choice(np.setdiff1d(np.arange(pool), [ref]), 3, replace=False)
      sim = truth[split][c] @ truth[split][ref]
      order = np.argsort(-sim)
      cls = 5 - np.digitize(sim[order], [-0.3, 0.0, 0.3, 0.6])
      out.append([ref] + [v for j in range(3) for v in (int(c[order[j]]), int(cls[j]))])
    return out

  os.makedirs(folder, exist_ok=True)
  write = lambda name, rr, header='': report.atomic_write_text(
      os.path.join(folder, name), header + ''.join(' '.join(map(str, r)) + '\n' for r in rr))
  ctx_refs = list(tdata.CONTEXTS)[:8]
  for j, r in enumerate(ctx_refs):  # contexts: the paper's reference ids, mapped into the small val pool
    ref = r % n_val
    write(f'dist_{r}.txt', [[r] + x[1:] for x in rows('val', ref, rows_per_context)])
  # the context refs are renamed to their paper ids: give those ids the features of the pool image
  val_rows = [x for ref in rng.choice(n_val, val_refs, replace=False) for x in rows('val', int(ref), 3)]
  write('mulref_val.txt', val_rows, 'ref order1 class1 order2 class2 order3 class3\n')
  write('mulref_test.txt', [x for ref in rng.choice(n_train, test_refs, replace=False) for x in rows('train', int(ref), 3)])
  names = [f'{i} val syn_val_{i}' for i in range(max(n_val, max(ctx_refs) + 1))]
  names += [f'{i} train syn_train_{i}' for i in range(n_train)]
  report.atomic_write_text(os.path.join(folder, 'filename_dict.txt'), '\n'.join(names) + '\n')
  report.atomic_write_text(os.path.join(folder, 'SYNTHETIC.txt'),
                           f'synthetic CoSIS-format set v{SYNTHETIC_VERSION}, seed {seed}, dim {dim}: not real data\n')
  return folder


def synthetic_alias(key: str, n_val: int = 600) -> str:
  """The pool image whose features a synthetic context reference (a paper id >= n_val) uses."""
  split, idx = key.split('/', 1)
  return f'{split}/{int(idx) % n_val}' if split == 'val' else key


def annotations_dir(config, workdir: str) -> tuple[str, bool]:
  a = config.annotations
  if a == 'synthetic' or (not a and not os.path.isdir(SHARED_COSIS)):
    if config.features or config.image_dir:
      raise ValueError('config.annotations: the synthetic set only works with stand-in features; point '
                       'config.annotations at the CoSIS folder')
    return write_synthetic_cosis(os.path.join(workdir, 'synthetic_cosis'), config.seed, config.stand_in_dim), True
  folder = a or SHARED_COSIS
  if not os.path.isdir(folder):
    raise FileNotFoundError(f'config.annotations: folder {folder} not found')
  return os.path.abspath(folder), False


def load_sets(folder: str) -> dict:
  ctx = {name: tdata.load_cosis(p) for name, p in tdata.context_files(folder).items()}
  sets = {'contexts': ctx}
  for name in ('mulref_val', 'mulref_test'):
    p = os.path.join(folder, f'{name}.txt')
    if not os.path.isfile(p):
      raise FileNotFoundError(f'config.annotations: {p} not found')
    sets[name] = tdata.load_cosis(p)
  return sets


def all_triplets(sets) -> list:
  return list(sets['contexts'].values()) + [sets['mulref_val'], sets['mulref_test']]


def load_features(config, sets, folder: str, synthetic: bool, progress: bool = True):
  """(features (N, D) float32, {key: row}, description)."""
  keys = list(dict.fromkeys(k for t in all_triplets(sets) for k in t.keys()))
  if config.features:
    feats, table = tdata.load_feature_table(config.features)
    if not any(k in table for k in keys):  # names are BG-20k names: map through filename_dict
      names = tdata.read_filename_dict(os.path.join(folder, 'filename_dict.txt'))
      table = tdata.keys_from_names(table, names)
    for t in all_triplets(sets):
      t.indices(table, what=f'features file {config.features}')  # a missing id fails here, naming its line
    return feats, table, {'kind': 'npz', 'path': os.path.abspath(config.features), 'dim': int(feats.shape[1])}
  if config.image_dir:
    names = tdata.read_filename_dict(os.path.join(folder, 'filename_dict.txt'))
    paths = tdata.resolve_images(all_triplets(sets), names, config.image_dir)  # every file checked first
    from visim_jax.backbones import config as backbone_config
    backbone, layers = backbone_config.build(config)
    feats = backbone_config.features_of(config, backbone, layers, [paths[k] for k in keys], keys, 'cosis',
                                        progress=progress)
    return feats, {k: i for i, k in enumerate(keys)}, {
        'kind': 'images', 'image_dir': os.path.abspath(config.image_dir), 'backbone': backbone.name,
        'weights_sha256': backbone.weights_id, 'layers': list(layers), 'dim': int(feats.shape[1])}
  src = [synthetic_alias(k) for k in keys] if synthetic else keys
  feats = stand_in_features(src, config.stand_in_dim, config.seed)
  return feats, {k: i for i, k in enumerate(keys)}, {
      'kind': 'stand_in', 'dim': config.stand_in_dim, 'seed': config.seed,
      'note': ('STAND-IN FEATURES: seeded random vectors keyed by image id, not image features. '
               + ('On the synthetic annotations the labels follow a hidden metric of these vectors.' if synthetic
                  else 'On the real CoSIS annotations they carry no information: every accuracy is chance '
                       'by construction; this run checks the pipeline, not the method.'))}


# ------------------------------------------------------------------------------------------ evaluation

def _rows(t: tdata.Triplets, table) -> tuple:
  r, a, b = t.indices(table)
  return r, a, b, t.a_closer, t.cls_a.astype(np.int32), t.cls_b.astype(np.int32)


def _acc(scores, refs, config) -> dict:
  return twoafc.summary(np.asarray(scores), refs, config.n_boot, 0.05, config.seed)


def per_ref_accuracy(votes: jax.Array, t: tdata.Triplets) -> tuple[np.ndarray, jax.Array]:
  """(reference keys, per-reference accuracy (K, R)) of K models' votes (K, T)."""
  uniq, groups = twoafc.group_ids(t.ref)
  scores = ensembles.vote_scores(votes.astype(jnp.float32), jnp.asarray(t.a_closer))
  per_ref, _ = twoafc.per_group_mean(scores, jnp.asarray(groups), len(uniq))
  return uniq, per_ref


def run_ensembles(config, feats, table, val: tdata.Triplets, test: tdata.Triplets, votes_val, votes_test,
                  names) -> dict:
  """Best single, majority, PCA credibility, MLP: fitted on val, scored on val (fit set) and test."""
  e = config.ensemble
  k = votes_val.shape[0]
  out = {}
  refs_val, acc_val = per_ref_accuracy(votes_val, val)
  ref_f = lambda keys: jnp.asarray(feats[[table[x] for x in keys]])
  f_val = ref_f(refs_val)
  _, g_val = twoafc.group_ids(val.ref)
  refs_test, g_test = twoafc.group_ids(test.ref)
  f_test = ref_f(refs_test)
  av, at = jnp.asarray(val.a_closer), jnp.asarray(test.a_closer)
  single_val = [float(ensembles.vote_scores(votes_val[i].astype(jnp.float32), av).mean()) for i in range(k)]
  best = int(np.argmax(single_val))
  sc = lambda v, a: ensembles.vote_scores(v.astype(jnp.float32), a)
  out['best_single'] = {'model': names[best], 'chosen_on': 'mulref_val accuracy',
                        'val': _acc(sc(votes_val[best], av), val.ref, config),
                        'test': _acc(sc(votes_test[best], at), test.ref, config)}
  out['majority_vote'] = {
      'val': _acc(ensembles.vote_scores(ensembles.weighted_vote(votes_val, jnp.ones((k,))), av), val.ref, config),
      'test': _acc(ensembles.vote_scores(ensembles.weighted_vote(votes_test, jnp.ones((k,))), at), test.ref, config)}
  cm = jax.jit(ensembles.fit_credibility, static_argnums=(2, 3))(f_val, acc_val, e.grid, e.window)
  pca_scores = {}
  for split, t, f, g, votes, a in (('val', val, f_val, g_val, votes_val, av), ('test', test, f_test, g_test,
                                                                              votes_test, at)):
    w_ref = ensembles.threshold_weights(ensembles.credibility(cm, f), e.threshold)   # (K, R)
    dec = ensembles.weighted_vote(votes, w_ref[:, jnp.asarray(g)])
    pca_scores[split] = _acc(ensembles.vote_scores(dec, a), t.ref, config)
  out['pca_credibility'] = dict(pca_scores, grid=e.grid, window=e.window, threshold=e.threshold)
  mlp = {'val': [], 'test': []}
  fit = jax.jit(ensembles.fit_mlp_weights, static_argnums=(3, 4, 5, 6))
  for s in range(e.mlp_seeds):
    mw = fit(jax.random.PRNGKey(config.seed * 1000 + s), f_val, acc_val, e.mlp_dim, e.mlp_hidden, e.mlp_steps,
             e.mlp_lr)
    for split, f, g, votes, a in (('val', f_val, g_val, votes_val, av), ('test', f_test, g_test, votes_test, at)):
      w_ref = ensembles.mlp_weights(mw, f)
      mlp[split].append(np.asarray(ensembles.vote_scores(ensembles.weighted_vote(votes, w_ref[:, jnp.asarray(g)]), a)))
  out['mlp'] = {}
  for split, t in (('val', val), ('test', test)):
    accs = [float(x.mean()) for x in mlp[split]]
    out['mlp'][split] = dict(_acc(mlp[split][0], t.ref, config), accuracy_mean=float(np.mean(accs)),
                             accuracy_std=float(np.std(accs)), accuracy_seeds=accs)
  out['mlp'].update(pca_dim=int(min(e.mlp_dim, *f_val.shape)), hidden=e.mlp_hidden, seeds=e.mlp_seeds)
  return out, {'credibility': cm, 'refs_val': refs_val, 'acc_val': np.asarray(acc_val), 'f_val': f_val}


# ----------------------------------------------------------------------------------------------- run

def model_hparams(config) -> cs.Hparams:
  m = config.model
  return cs.Hparams(embed_dim=m.embed_dim, hidden=m.hidden, triplet_weight=m.triplet_weight,
                    normalize=m.normalize, lr=m.lr, weight_decay=m.weight_decay, steps=m.steps,
                    batch_size=m.batch_size, swap=m.swap, seed=config.seed)


def run(config, workdir: str, progress: bool = True) -> dict:
  validate_config(config)
  t0 = time.time()
  folder, synthetic = annotations_dir(config, workdir)
  sets = load_sets(folder)
  feats, table, feat_desc = load_features(config, sets, folder, synthetic, progress)
  names = list(sets['contexts'])
  val, test = sets['mulref_val'], sets['mulref_test']
  rows = {n: _rows(t, table) for n, t in sets['contexts'].items()}
  rows_val, rows_test = _rows(val, table), _rows(test, table)
  os.makedirs(workdir, exist_ok=True)
  report.write_config(workdir, config)
  feats_j = jnp.asarray(feats)
  t1 = time.time()

  # context-sensitive models: 2/3 of each set's rows train, one vmapped program
  hp = model_hparams(config)
  splits = {n: cs.split_rows(t.line, config.model.train_fraction, config.seed + j)
            for j, (n, t) in enumerate(sets['contexts'].items())}
  train_sets = cs.pad_sets([tuple(np.asarray(c)[splits[n][0]] for c in rows[n]) for n in names])
  logging.info('training %d context models x %d steps', len(names), hp.steps)
  state, loss = jax.jit(cs.train, static_argnums=0)(hp, feats_j, train_sets)
  loss = np.asarray(loss)
  if not np.isfinite(loss).all():
    raise FloatingPointError('context-model training loss is NaN/Inf (try a smaller config.model.lr)')
  t2 = time.time()
  # one evaluation call for everything: every context's held-out third, mulref_val, mulref_test
  parts = [tuple(np.asarray(c)[splits[n][1]] for c in rows[n]) for n in names] + [rows_val, rows_test]
  cat = [jnp.asarray(np.concatenate([np.asarray(p[c]) for p in parts])) for c in range(4)]
  bounds = np.cumsum([0] + [len(p[0]) for p in parts])
  emb_all, rank_all = jax.jit(cs.predict_all, static_argnums=5)(state.params, feats_j, *cat[:3], hp.normalize)
  cos_all = np.asarray(twoafc.cosine_scores(feats_j, *cat))
  sl = lambda i: slice(int(bounds[i]), int(bounds[i + 1]))
  per_context = {}
  cross = {'embedding': np.zeros((len(names), len(names))), 'ranking_block': np.zeros((len(names), len(names)))}
  for j, n in enumerate(names):
    for kind, v in (('embedding', emb_all), ('ranking_block', rank_all)):
      cross[kind][:, j] = np.asarray(ensembles.vote_scores(v[:, sl(j)].astype(jnp.float32), cat[3][sl(j)]).mean(1))
    per_context[n] = {
        'reference': str(sets['contexts'][n].ref[0]), 'n_triplets': len(sets['contexts'][n]),
        'n_train': int(len(splits[n][0])), 'n_held_out': int(len(splits[n][1])),
        'cosine_held_out': float(cos_all[sl(j)].mean()),
        'own_model_embedding_held_out': float(cross['embedding'][j, j]),
        'own_model_ranking_block_held_out': float(cross['ranking_block'][j, j]),
        'final_train_loss': float(loss[j, -20:].mean())}
  k = len(names)
  votes = {'val': (emb_all[:, sl(k)], rank_all[:, sl(k)]), 'test': (emb_all[:, sl(k + 1)], rank_all[:, sl(k + 1)])}
  baseline = {'val': _acc(cos_all[sl(k)], val.ref, config), 'test': _acc(cos_all[sl(k + 1)], test.ref, config)}
  av, at = jnp.asarray(val.a_closer), jnp.asarray(test.a_closer)
  model_acc = {n: {kind: {'val': float(ensembles.vote_scores(votes['val'][i][m].astype(jnp.float32), av).mean()),
                          'test': float(ensembles.vote_scores(votes['test'][i][m].astype(jnp.float32), at).mean())}
                   for i, kind in enumerate(('embedding', 'ranking_block'))}
               for m, n in enumerate(names)}
  t3 = time.time()

  ens, extra = run_ensembles(config, feats, table, val, test, votes['val'][0], votes['test'][0], names)
  ens_rank, _ = run_ensembles(config, feats, table, val, test, votes['val'][1], votes['test'][1], names)
  t4 = time.time()

  files = {}
  for n, t in list(sets['contexts'].items()) + [('mulref_val', val), ('mulref_test', test)]:
    cr = tdata.read_cosis_rows(t.source)
    files[os.path.basename(t.source)] = {'rows': int(len(cr.rows)), 'triplets': len(t), 'header': cr.header,
                                         'references': len(t.references()), 'split': tdata.split_of(t.source)}
  table6 = [
      {'description': f'not fine-tuned: cosine on {feat_desc["kind"]} features', 'val': baseline['val']['accuracy'],
       'test': baseline['test']['accuracy']},
      {'description': f'best single CS model ({ens["best_single"]["model"]}, chosen on val)',
       'val': ens['best_single']['val']['accuracy'], 'test': ens['best_single']['test']['accuracy']},
      {'description': 'majority vote', 'val': ens['majority_vote']['val']['accuracy'],
       'test': ens['majority_vote']['test']['accuracy']},
      {'description': 'PCA credibility maps', 'val': ens['pca_credibility']['val']['accuracy'],
       'test': ens['pca_credibility']['test']['accuracy']},
      {'description': f'MLP weights (mean ± std over {config.ensemble.mlp_seeds} seeds)',
       'val': ens['mlp']['val']['accuracy_mean'], 'test': ens['mlp']['test']['accuracy_mean'],
       'val_std': ens['mlp']['val']['accuracy_std'], 'test_std': ens['mlp']['test']['accuracy_std']},
  ]
  metrics = {
      'experiment': 'twoafc',
      'features': feat_desc,
      'annotations': {'dir': folder, 'synthetic': synthetic, 'files': files},
      'tie_rule': 'a tie (equal similarities or a zero vote sum) scores 1/2',
      'ci': '95% percentile bootstrap over references',
      'cosine_baseline': baseline,
      'context_models': {'hparams': hp.__dict__, 'train_fraction': config.model.train_fraction,
                         'split': 'by annotation row (a row\'s three triples stay together), seeded',
                         'contexts': names, 'per_context': per_context,
                         'cross_context_held_out': {k: v.tolist() for k, v in cross.items()},
                         'cc_accuracy': model_acc},
      'ensembles': ens, 'ensembles_ranking_block': ens_rank, 'table6': table6,
      'timing_s': {'data_and_features': t1 - t0, 'training': t2 - t1, 'model_eval': t3 - t2,
                   'ensembles': t4 - t3},
      'config': config.to_dict(),
  }
  report.write_json(os.path.join(workdir, 'metrics.json'), metrics)
  if report.is_writer():
    report.write_scalars_series(workdir, {f'train/loss_{n}': loss[j, ::max(1, hp.steps // 200)]
                                          for j, n in enumerate(names)})
    if config.plots:
      _plots(workdir, names, per_context, cross, extra, table6, feat_desc)
  label = '' if feat_desc['kind'] != 'stand_in' else '  [STAND-IN FEATURES: ' + (
      'synthetic annotations]' if synthetic else 'accuracies are chance by construction]')
  print(f'\nCoSIS 2AFC: {len(val)} val / {len(test)} test triples, {len(names)} context models, '
        f'features: {feat_desc["kind"]} (dim {feats.shape[1]}){label}')
  print(report.table([[r['description'], r['val'], r['test']] for r in table6], ['model', 'mulref_val', 'mulref_test']))
  print(report.table([[n, per_context[n]['cosine_held_out'], per_context[n]['own_model_embedding_held_out'],
                       per_context[n]['own_model_ranking_block_held_out']] for n in names],
                     ['context', 'cosine', 'CS embedding', 'CS ranking block']))
  return metrics


def _plots(workdir, names, per_context, cross, extra, table6, feat_desc) -> None:
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  tag = ' (stand-in features)' if feat_desc['kind'] == 'stand_in' else ''
  x = np.arange(len(names))
  fig, ax = plt.subplots(figsize=(8, 3.6))
  for i, (key, lab) in enumerate((('cosine_held_out', 'cosine (not fine-tuned)'),
                                  ('own_model_embedding_held_out', 'CS model: embedding'),
                                  ('own_model_ranking_block_held_out', 'CS model: ranking block'))):
    ax.bar(x + (i - 1) * 0.27, [per_context[n][key] for n in names], 0.27, label=lab)
  ax.axhline(0.5, color='k', lw=0.6, ls=':')
  ax.set_xticks(x, names)
  ax.set_ylim(0, 1)
  ax.set_ylabel('2AFC accuracy, held-out third')
  ax.legend(fontsize=7, loc='lower right')
  ax.set_title('Accuracy per context' + tag)
  report.save_figure(fig, os.path.join(workdir, 'plots', 'accuracy_per_context.png'))

  fig, axes = plt.subplots(1, 2, figsize=(11, 4.4))
  for ax, kind in zip(axes, ('embedding', 'ranking_block')):
    im = ax.imshow(cross[kind], vmin=0.3, vmax=1.0, cmap='viridis')
    for i in range(len(names)):
      for j in range(len(names)):
        ax.text(j, i, f'{100 * cross[kind][i, j]:.0f}', ha='center', va='center', fontsize=6, color='w')
    ax.set_xticks(x, names, rotation=45, fontsize=7)
    ax.set_yticks(x, names, fontsize=7)
    ax.set_xlabel('context set (held-out third)')
    ax.set_ylabel('model')
    ax.set_title(f'{kind} answers', fontsize=8)
  fig.colorbar(im, ax=axes, shrink=0.8)
  fig.suptitle('Model x context accuracy on held-out thirds (Table 8)' + tag, fontsize=9)
  report.save_figure(fig, os.path.join(workdir, 'plots', 'cross_context.png'))

  cm = extra['credibility']
  from visim_jax import pca as pca_lib
  xy = np.asarray(pca_lib.transform(cm.pca, extra['f_val']))
  lo, hi = np.asarray(cm.lo), np.asarray(cm.hi)
  cols = 4
  rows_ = (len(names) + cols - 1) // cols
  fig, axes = plt.subplots(rows_, cols, figsize=(3.2 * cols, 3.0 * rows_), squeeze=False)
  for i, n in enumerate(names):
    ax = axes[i // cols, i % cols]
    im = ax.imshow(np.asarray(cm.maps[i]).T, origin='lower', extent=(lo[0], hi[0], lo[1], hi[1]),
                   vmin=0.3, vmax=1.0, cmap='RdYlBu', aspect='auto')
    ax.scatter(xy[:, 0], xy[:, 1], c=extra['acc_val'][i], s=3, cmap='RdYlBu', vmin=0.3, vmax=1.0,
               edgecolors='k', linewidths=0.1)
    ax.set_title(f'{n}', fontsize=8)
    ax.set_xticks([]), ax.set_yticks([])
  for j in range(len(names), rows_ * cols):
    axes[j // cols, j % cols].axis('off')
  fig.colorbar(im, ax=axes, shrink=0.7, label='credibility (windowed mean per-reference accuracy)')
  fig.suptitle('Credibility maps on the 2-D PCA of mulref_val reference features' + tag, fontsize=9)
  report.save_figure(fig, os.path.join(workdir, 'plots', 'credibility_maps.png'))

  fig, ax = plt.subplots(figsize=(8, 3.4))
  y = np.arange(len(table6))
  ax.barh(y + 0.2, [r['val'] for r in table6], 0.4, label='mulref_val (fit set)')
  ax.barh(y - 0.2, [r['test'] for r in table6], 0.4, label='mulref_test')
  ax.set_yticks(y, [r['description'][:48] for r in table6], fontsize=7)
  ax.set_xlim(0, 1)
  ax.axvline(0.5, color='k', lw=0.6, ls=':')
  ax.invert_yaxis()
  ax.legend(fontsize=7)
  ax.set_xlabel('2AFC accuracy')
  ax.set_title('Ensembles (Table 6)' + tag, fontsize=9)
  report.save_figure(fig, os.path.join(workdir, 'plots', 'ensembles.png'))
