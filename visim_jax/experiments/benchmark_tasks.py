"""The benchmark's protocols: config -> image sets + human judgements -> a scoring function of any Similarity.

A protocol (a leaderboard column group) is a list of `Task`s, one per image set (a BAPPS set, a NIGHTS split...).
Each task lists its images once (every image is described once per model, its triplets index the rows) and
scores a model from its distances (visim_jax/zoo/similarity.py) with the scores of visim_jax/metrics/human.py (NIGHTS,
BAPPS, THINGS), metrics/retrieval.py (TLL aR@k) and metrics/twoafc.py (CoSIS 2AFC), each with a bootstrap
interval. Loaders are the package's (data/nights.py, bapps.py, things.py, pairs.py, triplets.py): every file is
checked before any image is decoded.

  nights      2AFC score per split (config.nights_splits; DreamSim's votes >= config.nights_min_votes filter)
  bapps_2afc  2AFC score with the human fraction per val set (config.bapps_sets; '' = the six)
  bapps_jnd   JND average precision per set (traditional, cnn)
  things      odd-one-out accuracy (config.things_triplets, '' = <things_dir>/things_valset.txt, DreamSim's)
  tll         aR@k over every pair of config.tll_dir (+ config.tll_subset); a bootstrap over pairs (the candidate
              set fixed)
  cosis       CoSIS 2AFC on mulref_val / mulref_test (config.cosis_dir + BG-20k images in config.cosis_image_dir),
              cluster bootstrap over references (paper 004's)
  classes     a labelled folder (config.classes_dir: <class>/<image>, as SimNet's classes mode): leave-one-out
              mAP (same class = relevant, the query itself ignored; metrics/map.py), a bootstrap over queries
"""
from __future__ import annotations

import dataclasses
import os
from typing import Callable

import jax.numpy as jnp
import numpy as np


from visim_jax.zoo import scoring
from visim_jax.core.errors import UserError
from visim_jax.data.preprocess import Preprocess

PROTOCOLS = ('nights', 'bapps_2afc', 'bapps_jnd', 'things', 'tll', 'cosis', 'classes', 'kadid')


@dataclasses.dataclass
class Task:
  protocol: str
  subset: str
  paths: list[str]
  arrays: list          # what the scores depend on besides the images (judgements, indices): fingerprinted
  score: Callable       # (sim, feats, opts) -> {column: {score, ci_low, ci_high, n}}
  native: bool = False  # image models read the pairs at their native sizes (feats None; the quality protocol)
  triplets: tuple | None = None   # 2AFC sets: (ref, p0, p1 rows of paths, judge), for the attacks (benchmark_attacks)


@dataclasses.dataclass(frozen=True)
class ScoreOptions:
  n_boot: int = 1000
  alpha: float = 0.05
  seed: int = 0
  pair_batch: int = 256
  ks: tuple = (1, 5, 20)
  things_ties: str = 'le'
  progress: bool = False      # a bar over the pairs where a network runs per pair (LPIPS)


def _index(paths):
  return {p: i for i, p in enumerate(paths)}


def _pairs(sim, feats, i, j, opts: ScoreOptions, desc: str) -> np.ndarray:
  return scoring.pair_distances(sim, feats, i, feats, j, opts.pair_batch, opts.progress and sim.kind == 'lpips', desc)


def _ci(opts: ScoreOptions) -> dict:
  return dict(n_resamples=opts.n_boot, alpha=opts.alpha, seed=opts.seed)


# ------------------------------------------------------------------------------------------- the tasks

def twoafc_task(protocol: str, subset: str, s) -> Task:
  """A TwoAFCSet (NIGHTS split, BAPPS set): d0 = d(ref, p0), d1 = d(ref, p1), the human fraction for p1."""
  paths = s.paths()
  ref, p0, p1 = s.rows(_index(paths))

  def score(sim, feats, opts):
    from visim_jax.metrics import human
    d0 = _pairs(sim, feats, ref, p0, opts, f'{subset} d(ref, p0)')
    d1 = _pairs(sim, feats, ref, p1, opts, f'{subset} d(ref, p1)')
    return {subset: {**human.twoafc_interval(d0, d1, s.judge, **_ci(opts)), 'items': {  # paired tests
        'kind': '2afc', 'd0': d0.tolist(), 'd1': d1.tolist(), 'judge': np.asarray(s.judge, float).tolist()}}}
  return Task(protocol, subset, paths, [ref, p0, p1, np.asarray(s.judge)], score,
              triplets=(ref, p0, p1, np.asarray(s.judge, np.float32)))


def jnd_task(subset: str, s) -> Task:
  paths = s.paths()
  p0, p1 = s.rows(_index(paths))

  def score(sim, feats, opts):
    from visim_jax.metrics import human
    d = _pairs(sim, feats, p0, p1, opts, f'{subset} d(p0, p1)')
    return {subset: {**human.jnd_interval(d, s.same, **_ci(opts)),
                     'items': {'kind': 'jnd', 'd': d.tolist(), 'same': np.asarray(s.same, float).tolist()}}}
  return Task('bapps_jnd', subset, paths, [p0, p1, np.asarray(s.same)], score)


def odd_one_out_task(subset: str, s) -> Task:
  paths = s.paths()
  rows = s.rows(_index(paths))   # (T, 3)

  def score(sim, feats, opts):
    from visim_jax.metrics import human
    pairs = ((0, 1), (0, 2), (1, 2))
    d = np.stack([_pairs(sim, feats, rows[:, a], rows[:, b], opts, f'{subset} pair {a}{b}') for a, b in pairs], 1)
    values = np.asarray(human.odd_one_out_correct(d, s.odd, opts.things_ties)).tolist()
    return {subset: {**human.odd_one_out_interval(d, s.odd, opts.things_ties, **_ci(opts)),
                     'items': {'kind': 'mean', 'values': values}}}
  return Task('things', subset, paths, [rows, np.asarray(s.odd)], score)


def tll_task(pairs) -> Task:
  """aR@k over every pair: sim = -distance(left_i, right_j) (pessimistic ties, metrics/retrieval.py)."""
  n = len(pairs)
  paths = list(pairs.left) + list(pairs.right)

  def score(sim, feats, opts):
    from visim_jax.metrics import retrieval
    left = scoring.take_rows(feats, np.arange(n))
    right = scoring.take_rows(feats, np.arange(n, 2 * n))
    s = -scoring.distance_matrix(sim, left, right)
    out = retrieval.asymmetric_recall_intervals(s, opts.ks, **_ci(opts))
    best = np.minimum(*(np.asarray(r) for r in retrieval.partner_ranks(jnp.asarray(s))))   # per pair: paired tests
    return {c: {**cell, 'items': {'kind': 'mean', 'values': (best <= int(c[3:])).astype(float).tolist()}}
            for c, cell in out.items()}
  return Task('tll', 'aR@k', paths, [np.asarray([n])], score)


def cosis_task(subset: str, t, paths_of: dict) -> Task:
  """CoSIS 2AFC (paper 004): A is closer when d(R, A) < d(R, B); a tie scores 1/2; references resampled."""
  keys = t.keys()
  paths = [paths_of[k] for k in keys]
  ref, a, b = t.indices({k: i for i, k in enumerate(keys)})

  def score(sim, feats, opts):
    from visim_jax.metrics import twoafc
    da = _pairs(sim, feats, ref, a, opts, f'{subset} d(R, A)')
    db = _pairs(sim, feats, ref, b, opts, f'{subset} d(R, B)')
    scores = np.asarray(twoafc.score(-jnp.asarray(da), -jnp.asarray(db), jnp.asarray(t.a_closer)))
    sm = twoafc.summary(scores, t.ref, opts.n_boot, opts.alpha, opts.seed)
    cell = {'score': sm['accuracy'], 'ci_low': sm['ci_low'], 'ci_high': sm['ci_high'], 'n': sm['n_triplets']}
    items = {'kind': 'mean', 'values': scores.astype(float).tolist(), 'clusters': np.asarray(t.ref).tolist()}
    return {subset: {**cell, **({'degenerate': sm['degenerate']} if 'degenerate' in sm else {}), 'items': items}}
  return Task('cosis', subset, paths, [ref, a, b, t.a_closer], score)


def classes_task(data) -> Task:
  labels = np.unique(np.asarray(data.labels), return_inverse=True)[1].astype(np.int32)

  def score(sim, feats, opts):
    from visim_jax.metrics import map as map_lib
    s = -scoring.distance_matrix(sim, feats, feats)
    pos, junk = map_lib.label_masks(labels, labels, np.arange(len(labels)))
    ap = np.asarray(map_lib.summarise(s, pos, junk, opts.ks)['ap'], np.float64)   # per query: paired tests
    return {'mAP': {**map_lib.leave_one_out_interval(s, labels, opts.ks, **_ci(opts)),
                    'items': {'kind': 'mean', 'values': ap[np.isfinite(ap)].tolist()}}}
  return Task('classes', 'mAP', list(data.paths), [labels], score)


# ----------------------------------------------------------------------------------- config -> protocols

def _list(value) -> list[str]:
  return [x.strip() for x in str(value).split(',') if x.strip()]


def protocols(config) -> dict[str, list[Task]]:
  """{protocol: tasks} for every protocol whose data the config gives (files checked, no image decoded)."""
  out = {}
  if config.nights_dir:
    from visim_jax.data import nights
    splits = _list(config.nights_splits)
    bad = [s for s in splits if s not in nights.SPLITS]
    if bad or not splits:
      raise UserError(f'config.nights_splits: {bad or "empty"}; known: {", ".join(nights.SPLITS)}')
    out['nights'] = [twoafc_task('nights', s, nights.load(config.nights_dir, s, config.nights_min_votes))
                     for s in splits]
  if config.bapps_dir:
    from visim_jax.data import bapps
    sets = _list(config.bapps_sets) or None
    jnd_sets = _list(config.bapps_jnd_sets) or None
    for field, chosen, sub, published, on in (('bapps_sets', sets, '2afc/val', bapps.TWOAFC_SETS['val'],
                                               config.bapps_2afc),
                                              ('bapps_jnd_sets', jnd_sets, 'jnd/val', bapps.JND_SETS, config.bapps_jnd)):
      missing = [s for s in chosen or () if on and not os.path.isdir(os.path.join(config.bapps_dir, sub, s))]
      if missing:
        raise UserError(f'config.{field}: {missing[0]!r} is not a set folder of {os.path.join(config.bapps_dir, sub)} '
                        f'(published: {", ".join(published)}); choose some with --config.{field}=a,b')
    if config.bapps_2afc:
      out['bapps_2afc'] = [twoafc_task('bapps_2afc', n, s) for n, s in bapps.load_2afc(config.bapps_dir, 'val',
                                                                                         sets).items()]
    if config.bapps_jnd:
      out['bapps_jnd'] = [jnd_task(n, s) for n, s in bapps.load_jnd(config.bapps_dir, jnd_sets).items()]
  if config.things_dir:
    from visim_jax.data import things
    tri = config.things_triplets or os.path.join(config.things_dir, 'things_valset.txt')
    s = things.load(config.things_dir, tri, config.things_form, config.things_names or None)
    out['things'] = [odd_one_out_task('odd-one-out', s)]
  if config.tll_dir:
    from visim_jax.data import pairs as pairs_lib
    p = pairs_lib.load_pairs(config.tll_dir, config.tll_subset or None)
    if len(p) <= max(int(k) for k in config.ks):
      raise UserError(f'config.tll_dir: {len(p)} pairs, fewer than max(config.ks) + 1')
    out['tll'] = [tll_task(p)]
  if config.cosis_dir:
    from visim_jax.data import cosis
    if not config.cosis_image_dir:
      raise UserError('config.cosis_image_dir: the CoSIS protocol needs the BG-20k images (train/ and testval/)')
    sets = cosis.load_cosis_sets(config.cosis_dir)
    chosen = [sets[n] for n in ('mulref_val', 'mulref_test')]
    names = cosis.read_filename_dict(os.path.join(config.cosis_dir, 'filename_dict.txt'))
    paths_of = cosis.resolve_images(chosen, names, config.cosis_image_dir)
    out['cosis'] = [cosis_task(n, t, paths_of) for n, t in zip(('mulref_val', 'mulref_test'), chosen)]
  if config.classes_dir:
    from visim_jax.data import classes as classes_lib
    out['classes'] = [classes_task(classes_lib.image_folder(config.classes_dir))]
  return out   # + the quality protocols (experiments/benchmark_quality.py), which benchmark.py adds


def protocol_preprocess(task: Task, size: int) -> Preprocess:
  """The resolution a model without its own preprocessing (LPIPS) sees: `size`, or 0 = the native size of the
  set's first image (every image of the set resized to it: a no-op on BAPPS (64 x 64) and NIGHTS, which is how
  LPIPS and DreamSim's LPIPS baseline read them)."""
  if size <= 0:
    from PIL import Image
    with Image.open(task.paths[0]) as im:
      w, h = im.size
    if w != h:
      raise UserError(f'{task.paths[0]}: {w}x{h} is not square; set config.lpips_size to a resolution')
    size = w
  return Preprocess(size=max(8, int(size)), resize='squash', mean=(0.0, 0.0, 0.0), std=(255.0, 255.0, 255.0),
                    interpolation='bicubic')
