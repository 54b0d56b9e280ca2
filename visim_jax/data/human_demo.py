"""Mini NIGHTS, BAPPS (2AFC + JND) and THINGS sets in the exact published layouts, from packaged photos only.

Graded distortions, so that models differ: a rendering has a family (blur, noise, colour turn, down-up sampling,
shift) and a level in [0, 1] (`render`); the simulated observer prefers the milder rendering (lower level) with
probability sigmoid(14 x level gap). Each triplet draws its own milder level (0.05..0.55) and gap (0.04..0.45),
and half of them compare two *different* families (a blur against noise, ...): the cases where networks disagree
with each other and with the simulated observer. So
  * NIGHTS: ref = a photo crop, left/right = its milder and stronger renderings (side drawn at random);
    right_vote = 1 when the right one is the milder (NIGHTS's filtered rows are unanimous); votes 6..10, plus 4
    rows with votes 5 that DreamSim's filter drops. Splits: 24 train, 8 val, 16 test (8 is_imagenet True, 8
    False). 128 x 128 px.
  * BAPPS 2AFC: every published set (train: traditional, cnn, mix; val: traditional, cnn, superres, deblur,
    color, frameinterp), 8 triplets each, 64 x 64 px, the set's family on one side, closer calls (gaps
    0.02..0.3, 2/3 across families); judge = fraction of 5 simulated judges (train sets: 2) preferring p1.
  * BAPPS JND: val/traditional and val/cnn, 12 pairs each: p1 = p0 rendered at a level in 0..0.5; same =
    fraction of 3 judges calling them identical, falling with the level as the judges see it (the level times
    a log-normal factor per pair: families differ in visibility).
  * THINGS: 16 photos x 2 views (two overlapping crops of one region, the second rendered at a level 0..0.8) =
    32 images; a triplet is the two views of one photo and one view of another, the other being the odd one.
    Both list forms over the same folder: DreamSim's `things_valset.txt` (names, the odd one third) and the OSF
    table `triplets_large_final_correctednc_correctedorder.csv` (tab-separated, 1-based indices into the sorted
    image list, `choice` = 1-based column of the odd one, drawn at random) with `unique_id.txt` (names in order).
These are simulated judgements on a few dozen triplets: the numbers rank models on this toy set only and are not
comparable with the published ones (`DEMO_NOTE`, which the demo configs print).

`demo_sets(root, seed, cache_dir)` writes the four folders once (data/demo.py's write_once: same seed, same
bytes; same root rules as the pairs demo) and returns a `HumanDemo` of their paths.
"""
from __future__ import annotations

import csv
import dataclasses
import io
import os

import numpy as np
from PIL import Image, ImageChops, ImageFilter

from visim_jax.core import ops
from visim_jax.data import bapps, demo

HUMAN_DEMO_VERSION = 4
NIGHTS_SIZE, BAPPS_SIZE, THINGS_SIZE = 128, 64, 128
FAMILIES = ('blur', 'noise', 'colour', 'superres', 'shift')
SET_FAMILY = {'traditional': 'noise', 'cnn': 'blur', 'mix': 'colour', 'superres': 'superres', 'deblur': 'blur',
              'color': 'colour', 'frameinterp': 'shift'}
NIGHTS_SPLITS = (('train', 24), ('val', 8), ('test', 16))
MILD_LEVELS, GAPS = (0.05, 0.55), (0.04, 0.45)   # per triplet: the milder rendering's level, the gap to the other
BAPPS_GAPS = (0.02, 0.3)                         # BAPPS 2AFC: closer calls, 2/3 of them across families
SHARPNESS = 14.0                                 # P(observer prefers the milder) = sigmoid(SHARPNESS * gap)
DEMO_NOTE = ('demo data: mini NIGHTS / BAPPS / THINGS sets built from a few packaged photos with graded synthetic '
             'distortions and simulated judges (visim_jax/data/human_demo.py); the scores rank models on this toy '
             'set only and are NOT comparable with published numbers (DreamSim, LPIPS, THINGS), which need the real '
             'data: python -m visim_jax.fetch nights|bapps --root=DIR')


@dataclasses.dataclass(frozen=True)
class HumanDemo:
  root: str
  nights: str            # nights.load(nights, split)
  bapps: str             # bapps.load_2afc(bapps, split) / bapps.load_jnd(bapps)
  things: str            # the THINGS image folder
  things_dreamsim: str   # things.load(things, things_dreamsim)            (form 'dreamsim')
  things_osf: str        # things.load(things, things_osf, names_file=things_names)   (form 'osf')
  things_names: str


def render(im: Image.Image, family: str, level: float, rng: np.random.RandomState) -> Image.Image:
  """`im` (same size) distorted in one family at `level` in [0, 1] (0: barely visible, 1: strong)."""
  w, h = im.size
  level = float(np.clip(level, 0.0, 1.0))
  if family == 'blur':
    return im.filter(ImageFilter.GaussianBlur(radius=0.3 + 5.0 * level))
  if family == 'noise':
    x = np.asarray(im, np.float32) + rng.normal(0.0, 1.0 + 50.0 * level, (h, w, 3))
    return Image.fromarray(np.clip(np.rint(x), 0, 255).astype(np.uint8))
  if family == 'colour':
    rgb = np.asarray(im)
    if (rgb.max(-1) == rgb.min(-1)).all():  # a grey photo has no hue to turn: shift its levels instead
      return Image.fromarray(np.clip(rgb.astype(int) + int(round(2 + 90 * level)), 0, 255).astype(np.uint8))
    hsv = np.asarray(im.convert('HSV')).copy()
    hsv[..., 0] = (hsv[..., 0].astype(int) + int(round(2 + 110 * level))) % 256
    return Image.fromarray(hsv, 'HSV').convert('RGB')
  if family == 'superres':
    f = 1.1 + 6.0 * level
    small = im.resize((max(2, int(w / f)), max(2, int(h / f))), Image.Resampling.BILINEAR)
    return small.resize((w, h), Image.Resampling.NEAREST if level > 0.5 else Image.Resampling.BICUBIC)
  if family == 'shift':
    s = max(1, int(round(level * w / 4)))
    return ImageChops.offset(im, s, s // 2)
  raise ValueError(f'unknown family {family!r}')


def graded_pair(ref: Image.Image, rng: np.random.RandomState, family: str | None = None, cross: float = 0.5,
                gaps: tuple[float, float] = GAPS):
  """(milder, stronger, P(observer prefers the milder)) renderings of `ref`: the milder level and the gap (in
  `gaps`) drawn per call; with probability `cross` the two sides are of different families (`family`, if given,
  is on one of the sides)."""
  fam_a = family or FAMILIES[rng.randint(len(FAMILIES))]
  fam_b = FAMILIES[rng.randint(len(FAMILIES))] if rng.uniform() < cross else fam_a
  if rng.randint(2):
    fam_a, fam_b = fam_b, fam_a
  mild = rng.uniform(*MILD_LEVELS)
  gap = rng.uniform(*gaps)
  p = 1.0 / (1.0 + np.exp(-SHARPNESS * gap))
  return render(ref, fam_a, mild, rng), render(ref, fam_b, mild + gap, rng), float(p)


def _crop(im: Image.Image, rng: np.random.RandomState, size: int, box=None) -> tuple[Image.Image, tuple]:
  box = box or demo._box(im, rng)
  x0, y0, side = box
  return im.crop((x0, y0, x0 + side, y0 + side)).resize((size, size), Image.Resampling.BICUBIC), box


def _save(im: Image.Image, path: str) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  im.save(path, optimize=False, compress_level=1)


def _csv_text(header, rows, delimiter=',') -> str:
  text = io.StringIO(newline='')
  w = csv.writer(text, delimiter=delimiter, lineterminator='\n')
  w.writerow(header)
  w.writerows(rows)
  return text.getvalue()


def _nights(folder: str, sources, rng) -> None:
  names = sorted(sources)
  header = ('id', 'left_vote', 'right_vote', 'votes', 'ref_path', 'left_path', 'right_path', 'prompt', 'split',
            'is_imagenet')
  plan = [(s, i) for s, n in NIGHTS_SPLITS for i in range(n)] + [('test', -1)] * 4  # -1: votes 5
  rows = []
  for k, (split, i) in enumerate(plan):
    src = names[k % len(names)]
    ref, _ = _crop(sources[src], rng, NIGHTS_SIZE)
    light, heavy, _ = graded_pair(ref, rng)
    right_light = bool(rng.randint(2))
    left, right = (heavy, light) if right_light else (light, heavy)
    d, n = f'{k // 1000:03d}', f'{k % 1000:03d}'
    paths = (f'ref/{d}/{n}.png', f'distort/{d}/{n}_0.png', f'distort/{d}/{n}_1.png')
    for im, p in zip((ref, left, right), paths):
      _save(im, os.path.join(folder, p))
    votes = 5 if i < 0 else int(rng.randint(6, 11))
    rv = 1.0 if right_light else 0.0
    imagenet = i % 2 == 0 if split == 'test' else bool(rng.randint(2))
    rows.append((k, f'{1.0 - rv:.1f}', f'{rv:.1f}', votes, *paths, f'An image of a {src}', split,
                 'True' if imagenet else 'False'))
  ops.atomic_write_text(os.path.join(folder, 'data.csv'), _csv_text(header, rows))


def _bapps(folder: str, sources, rng) -> None:
  names = sorted(sources)
  k = 0
  for split, sets in bapps.TWOAFC_SETS.items():
    n_judges = 5 if split == 'val' else 2
    for s in sets:
      d = os.path.join(folder, '2afc', split, s)
      for i in range(8):
        ref, _ = _crop(sources[names[k % len(names)]], rng, BAPPS_SIZE)
        k += 1
        light, heavy, p = graded_pair(ref, rng, SET_FAMILY[s], cross=2 / 3, gaps=BAPPS_GAPS)
        p1_light = bool(rng.randint(2))
        p0, p1 = (heavy, light) if p1_light else (light, heavy)
        j = round(p * n_judges) / n_judges            # fraction of the judges preferring the milder one
        n = f'{i:06d}'
        for im, part in ((ref, 'ref'), (p0, 'p0'), (p1, 'p1')):
          _save(im, os.path.join(d, part, n + '.png'))
        os.makedirs(os.path.join(d, 'judge'), exist_ok=True)
        np.save(os.path.join(d, 'judge', n + '.npy'), np.asarray([j if p1_light else 1.0 - j], np.float32))
  for s in bapps.JND_SETS:
    d = os.path.join(folder, 'jnd', 'val', s)
    for i in range(12):
      p0, _ = _crop(sources[names[k % len(names)]], rng, BAPPS_SIZE)
      k += 1
      level = rng.uniform(0.0, 0.5)
      p1 = render(p0, SET_FAMILY[s], level, rng)
      seen = level * np.exp(rng.normal(0.0, 0.6))   # each family's visibility differs: the judges' level is noisy
      same = round(3.0 / (1.0 + np.exp(25.0 * (seen - 0.15)))) / 3.0   # 3 judges; fewer say "same" as it grows
      n = f'{i:06d}'
      _save(p0, os.path.join(d, 'p0', n + '.png'))
      _save(p1, os.path.join(d, 'p1', n + '.png'))
      os.makedirs(os.path.join(d, 'same'), exist_ok=True)
      np.save(os.path.join(d, 'same', n + '.npy'), np.asarray([same], np.float32))


def _things(folder: str, sources, rng) -> None:
  names = sorted(sources)[:16]
  img_dir = os.path.join(folder, 'images')
  views = {}
  for src in names:
    a, box = _crop(sources[src], rng, THINGS_SIZE)
    b, _ = _crop(sources[src], rng, THINGS_SIZE, demo._jitter(sources[src], box, rng))
    b = render(b, FAMILIES[rng.randint(len(FAMILIES))], rng.uniform(0.0, 0.8), rng)
    views[src] = (f'{src}_1', f'{src}_2')
    _save(a, os.path.join(img_dir, f'{src}_1.png'))
    _save(b, os.path.join(img_dir, f'{src}_2.png'))
  order = sorted(n for v in views.values() for n in v)          # the 'concept order' of the OSF indices
  ops.atomic_write_text(os.path.join(folder, 'unique_id.txt'), '\n'.join(order) + '\n')
  ds_lines, osf_rows = [], []
  for t in range(32):
    src = names[t % len(names)]
    other = names[(t % len(names) + 1 + rng.randint(len(names) - 1)) % len(names)]
    trip = [views[src][0], views[src][1], views[other][rng.randint(2)]]
    ds_lines.append(' '.join(trip))
    pos = rng.randint(3)                                         # where the odd one sits in the OSF row
    pair = trip[:2] if rng.randint(2) else trip[1::-1]
    row = pair[:pos] + [trip[2]] + pair[pos:]
    osf_rows.append([order.index(n) + 1 for n in row] + [pos + 1, int(rng.randint(800, 3000)), 0, f'S{t % 5}'])
  ops.atomic_write_text(os.path.join(folder, 'things_valset.txt'), '\n'.join(ds_lines) + '\n')
  ops.atomic_write_text(os.path.join(folder, 'triplets_large_final_correctednc_correctedorder.csv'),
                        _csv_text(('image1', 'image2', 'image3', 'choice', 'RT', 'noise_ceiling', 'subject_id'),
                                  osf_rows, delimiter='\t'))


def _build(folder: str, seed: int) -> None:
  sources = demo.source_images()
  rng = np.random.RandomState(seed)
  _nights(os.path.join(folder, 'nights'), sources, rng)
  _bapps(os.path.join(folder, 'bapps', 'dataset'), sources, rng)
  _things(os.path.join(folder, 'things'), sources, rng)


def demo_sets(root: str | None = None, seed: int = 0, cache_dir: str | None = None) -> HumanDemo:
  """Writes (once) and returns the mini NIGHTS / BAPPS / THINGS folders (root as data/demo.py's)."""
  folder = demo.write_once(root or demo.default_root(cache_dir), f'human-v{HUMAN_DEMO_VERSION}-seed{seed}',
                           lambda f: _build(f, seed), {'version': HUMAN_DEMO_VERSION, 'seed': seed})
  t = os.path.join(folder, 'things')
  return HumanDemo(folder, os.path.join(folder, 'nights'), os.path.join(folder, 'bapps', 'dataset'),
                   os.path.join(t, 'images'), os.path.join(t, 'things_valset.txt'),
                   os.path.join(t, 'triplets_large_final_correctednc_correctedorder.csv'),
                   os.path.join(t, 'unique_id.txt'))
