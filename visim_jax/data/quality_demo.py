"""A mini KADID-10k in the published layout (dmos.csv + images/), from packaged photos only (issue 47's `:demo`).

4 references (192 x 192 crops of the packaged photos) x 4 distortion families of data/human_demo.py (blur, noise,
colour, superres) x 4 levels = 64 distorted images, named as KADID-10k names them (I<ref>_<family>_<level>.png).
The simulated DMOS (1..5, higher = better, as KADID-10k's): 5 - 4 v / (v + 0.35) + N(0, 0.15), v = the level times
a per-family visibility (blur 1.0, noise 1.3, colour 0.6, superres 0.9) times a log-normal factor per image, so
metrics that weigh the families differently rank differently. These are simulated opinions: the numbers rank
metrics on this toy set only and are not comparable with the published ones (QUALITY_DEMO_NOTE).
"""
from __future__ import annotations

import os

import numpy as np

from visim_jax.core import ops
from visim_jax.data import demo, human_demo

QUALITY_DEMO_VERSION = 1
SIZE = 192
FAMILIES = {'blur': 1.0, 'noise': 1.3, 'colour': 0.6, 'superres': 0.9}
LEVELS = (0.1, 0.25, 0.45, 0.7)
QUALITY_DEMO_NOTE = ('demo data: a mini KADID-10k built from 4 packaged photos with synthetic distortions and '
                     'simulated opinion scores (visim_jax/data/quality_demo.py); the correlations rank metrics on '
                     'this toy set only and are NOT comparable with published KADID-10k numbers')


def _build(folder: str, seed: int) -> None:
  rng = np.random.RandomState(seed)
  sources = demo.source_images()
  names = sorted(n for n, im in sources.items() if min(im.size) >= SIZE)[:4]
  rows = []
  for r, name in enumerate(names, 1):
    ref, _ = human_demo._crop(sources[name].convert('RGB'), rng, SIZE)   # pylint: disable=protected-access
    ref_name = f'I{r:02d}.png'
    human_demo._save(ref, os.path.join(folder, 'images', ref_name))       # pylint: disable=protected-access
    for f, (family, vis) in enumerate(FAMILIES.items(), 1):
      for lv, level in enumerate(LEVELS, 1):
        dist_name = f'I{r:02d}_{f:02d}_{lv:02d}.png'
        human_demo._save(human_demo.render(ref, family, level, rng),      # pylint: disable=protected-access
                         os.path.join(folder, 'images', dist_name))
        v = level * vis * float(np.exp(rng.normal(0.0, 0.25)))
        dmos = float(np.clip(5.0 - 4.0 * v / (v + 0.35) + rng.normal(0.0, 0.15), 1.0, 5.0))
        rows.append((dist_name, ref_name, f'{dmos:.4f}', f'{rng.uniform(0.2, 1.2):.4f}'))
  ops.atomic_write_text(os.path.join(folder, 'dmos.csv'),
                        human_demo._csv_text(('dist_img', 'ref_img', 'dmos', 'var'), rows))  # pylint: disable=protected-access


def kadid_demo(root: str | None = None, seed: int = 0, cache_dir: str | None = None) -> str:
  """Writes (once) and returns the mini KADID-10k folder (root as data/demo.py's)."""
  return demo.write_once(root or demo.default_root(cache_dir), f'quality-v{QUALITY_DEMO_VERSION}-seed{seed}',
                         lambda f: _build(os.path.join(f, 'kadid10k'), seed),
                         {'version': QUALITY_DEMO_VERSION, 'seed': seed}) + '/kadid10k'
