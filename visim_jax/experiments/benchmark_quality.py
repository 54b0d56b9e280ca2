"""The leaderboard's image-quality protocol (issue 47): per data set, SRCC, KRCC and PLCC (after the five-parameter
logistic, metrics/quality.py) of a model's quality -distance(reference, distorted) against the opinion scores
(oriented higher = better), each with a bootstrap interval over the distorted images and paired rank groups
(metrics/paired.py, item kind 'corr').

  config field   layout (data/quality.py)                    protocol (leaderboard column group)
  kadid_dir      KADID-10k: dmos.csv + images/               kadid
  tid2013_dir    TID2013: mos_with_names.txt + *_images/     tid2013
  pipal_dir      PIPAL (train): Train_Label/ + Train_Dis/ + Train_Ref/   pipal
  live_dir       LIVE Release 2: 5 folders + refimgs/ + .mat files       live
  csiq_dir       CSIQ: csiq.DMOS.xlsx + src_imgs/ + dst_imgs/            csiq
  pieapp_dir     PieAPP (test split): labels/test/*_per_image_score.csv  pieapp
                 and its *_pairwise_labels.csv as 2AFC triplets          pieapp_2afc (subset test: the 2AFC score
                 with the human fraction, metrics/human.py, as NIGHTS and BAPPS are scored)

Image models (the full-reference metrics, LPIPS, DISTS: `Similarity.preprocess is None`) compare each pair at its
native size, as the IQA papers and piq / pyiqa do (pairs of one size batched together, `pair_batch` at most
NATIVE_BATCH); embedding models read the images through their own preprocessing as everywhere else.
"""
from __future__ import annotations

import numpy as np

from visim_jax.experiments.benchmark_tasks import Task, ScoreOptions, _ci, _index, _pairs, twoafc_task

QUALITY_FIELDS = {'kadid_dir': 'kadid', 'tid2013_dir': 'tid2013', 'pipal_dir': 'pipal', 'live_dir': 'live',
                  'csiq_dir': 'csiq', 'pieapp_dir': 'pieapp'}
NATIVE_BATCH = 8


def native_pair_distances(sim, refs: list[str], dists: list[str], batch: int) -> np.ndarray:
  """d(ref_t, dist_t) for every row, each pair decoded at its native size (uint8 RGB), pairs of one size batched
  in fixed-size batches (the last padded by repetition: one compilation per size)."""
  from PIL import Image
  from visim_jax.data import images
  sizes = []
  for r, d in zip(refs, dists):
    with Image.open(r) as a, Image.open(d) as b:
      if a.size != b.size:
        from visim_jax.core.errors import UserError
        raise UserError(f'{d}: {b.size[0]}x{b.size[1]} px, its reference {r} is {a.size[0]}x{a.size[1]}: a '
                        'full-reference metric compares images of one size')
      sizes.append(a.size)
  out = np.zeros(len(refs), np.float32)
  batch = max(1, min(batch, NATIVE_BATCH))
  for size in dict.fromkeys(sizes):
    rows = [t for t, s in enumerate(sizes) if s == size]
    for s0 in range(0, len(rows), batch):
      part = rows[s0:s0 + batch]
      full = part + [part[-1]] * (batch - len(part))
      u0 = np.stack([np.asarray(images.open_rgb(refs[t])) for t in full])
      u1 = np.stack([np.asarray(images.open_rgb(dists[t])) for t in full])
      out[part] = np.asarray(sim.distance(sim.params, u0, u1), np.float32)[:len(part)]
  return out


def quality_task(protocol: str, s) -> Task:
  """A QualitySet -> a task whose score gives the SRCC, KRCC and PLCC columns."""
  paths = s.paths()
  idx = _index(paths)
  ref = np.asarray([idx[p] for p in s.refs], np.int32)
  dist = np.asarray([idx[p] for p in s.dists], np.int32)
  mos = np.asarray(s.mos, np.float64)

  def score(sim, feats, opts: ScoreOptions):
    from visim_jax.metrics import quality
    if feats is None:      # an image model: native sizes
      d = native_pair_distances(sim, s.refs, s.dists, opts.pair_batch)
    else:
      d = _pairs(sim, feats, ref, dist, opts, f'{s.name} d(ref, distorted)')
    q = -np.asarray(d, np.float64)
    out = quality.intervals(q, mos, **_ci(opts))
    fitted = out['plcc'].pop('fitted')
    return {stat.upper(): {**out[stat], 'items': {'kind': 'corr', 'stat': stat, 'mos': mos.tolist(),
                                                   'q': (fitted if stat == 'plcc' else q.tolist())}}
            for stat in quality.STATS}
  return Task(protocol, s.name, paths, [ref, dist, mos], score, native=True)


def protocols(config) -> dict[str, list[Task]]:
  """{protocol: [task]} for every quality folder the config gives (files checked, nothing decoded)."""
  from visim_jax.data import quality as quality_data
  out = {}
  for field, protocol in QUALITY_FIELDS.items():
    folder = config.get(field, '')
    if folder:
      out[protocol] = [quality_task(protocol, quality_data.LOADERS[protocol](folder))]
      if protocol == 'pieapp':   # the same folder's pairwise labels: a 2AFC column group
        out['pieapp_2afc'] = [twoafc_task('pieapp_2afc', quality_data.PIEAPP_SPLIT,
                                          quality_data.load_pieapp_2afc(folder))]
  return out
