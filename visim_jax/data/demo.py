"""The embedded offline demo: look-alike pairs built only from images that ship inside installed packages.

Sources: photos bundled with scikit-image (`skimage.data`) and scikit-learn (`load_sample_images`). A pair
is two views of one random region of a source photo (the second shifted and rescaled a little); the right
side is re-rendered (grayscale, posterised,
edge sketch, colour shift, mirror, blur, ...), so the two sides look alike without being the same pixels,
which stands in for TLL's 'totally looks like' pairs until the user points the config at the real data.

`demo_pairs(root, n_pairs, seed, cache_dir)` writes the set once in the TLL layout (left/NNNNN.png,
right/NNNNN.png, plus classes.csv: name,source) and returns that folder; the same seed gives byte-identical
files. Where: `root` (config.demo.root) if given, else `<cache_dir>/demo` when a cache folder is given
(config.cache_dir: everything the tools cache goes where the user said), else $VISIM_CACHE/demo or
~/.cache/visim_jax/demo. `experiments/config_fields.demo_root(config)` does that for a config. The set is built in a temp folder
and renamed into place (concurrent builders: one wins, the others use its set); files get the umask's
permissions. The class of a pair (its source photo) also makes a small labelled set.
"""
from __future__ import annotations

import csv
import functools
import io
import json
import os
import shutil
import tempfile
from typing import Callable

import numpy as np
from PIL import Image, ImageFilter, ImageOps

from visim_jax.core import ops
from visim_jax.core.errors import UserError

DEMO_VERSION = 2
IMAGE_SIZE = 160  # side of the stored demo images
# skimage.data names of bundled photos (no download needed) with enough content to crop
SKIMAGE_SOURCES = ('astronaut', 'chelsea', 'coffee', 'rocket', 'camera', 'coins', 'hubble_deep_field',
                   'immunohistochemistry', 'moon', 'motorcycle_left', 'retina', 'brick', 'grass', 'gravel',
                   'page', 'colorwheel', 'cell')
SKLEARN_SOURCES = ('china.jpg', 'flower.jpg')
RENDERINGS = ('grayscale', 'posterise', 'sketch', 'colour_shift', 'mirror', 'blur', 'solarise', 'contrast')


@functools.lru_cache(maxsize=1)
def source_images() -> dict[str, Image.Image]:
  """{name: RGB PIL image} of every packaged photo available (file-backed, offline; decoded once a process,
  read-only for callers)."""
  import skimage.data
  from sklearn.datasets import load_sample_image
  out = {}
  for name in SKIMAGE_SOURCES:
    fn = getattr(skimage.data, name, None)
    if fn is None:
      continue
    try:
      arr = np.asarray(fn())
    except Exception:  # an image that would need a download in this skimage version
      continue
    if arr.dtype != np.uint8:
      arr = (255 * (arr.astype(np.float64) - arr.min()) / max(np.ptp(arr), 1e-9)).astype(np.uint8)
    out[name] = Image.fromarray(arr).convert('RGB')
  for name in SKLEARN_SOURCES:
    out[name.split('.')[0]] = Image.fromarray(load_sample_image(name)).convert('RGB')
  if len(out) < 8:
    raise UserError(f'demo: only {len(out)} packaged source images found; install scikit-image and scikit-learn')
  return out


def _box(im: Image.Image, rng: np.random.RandomState) -> tuple[int, int, int]:
  """A random square region (x0, y0, side) covering 30-60% of the shorter side."""
  w, h = im.size
  side = int(min(w, h) * rng.uniform(0.3, 0.6))
  return rng.randint(0, w - side + 1), rng.randint(0, h - side + 1), side


def _jitter(im: Image.Image, box, rng: np.random.RandomState) -> tuple[int, int, int]:
  """The same region seen again: shifted by up to 12% and rescaled by 0.88-1.12, kept inside the image."""
  w, h = im.size
  x0, y0, side = box
  new = int(np.clip(side * rng.uniform(0.88, 1.12), 8, min(w, h)))
  cx = x0 + side / 2 + rng.uniform(-0.12, 0.12) * side
  cy = y0 + side / 2 + rng.uniform(-0.12, 0.12) * side
  nx = int(np.clip(cx - new / 2, 0, w - new))
  ny = int(np.clip(cy - new / 2, 0, h - new))
  return nx, ny, new


def _crop(im: Image.Image, box) -> Image.Image:
  x0, y0, side = box
  return im.crop((x0, y0, x0 + side, y0 + side)).resize((IMAGE_SIZE, IMAGE_SIZE), Image.Resampling.BICUBIC)


def render(im: Image.Image, how: str, rng: np.random.RandomState) -> Image.Image:
  if how == 'grayscale':
    return ImageOps.grayscale(im).convert('RGB')
  if how == 'posterise':
    return ImageOps.posterize(im, int(rng.randint(1, 4)))
  if how == 'sketch':
    edges = ImageOps.grayscale(im).filter(ImageFilter.FIND_EDGES)
    return ImageOps.invert(ImageOps.autocontrast(edges)).convert('RGB')
  if how == 'colour_shift':
    hsv = np.asarray(im.convert('HSV')).copy()
    hsv[..., 0] = (hsv[..., 0].astype(int) + rng.randint(40, 216)) % 256
    return Image.fromarray(hsv, 'HSV').convert('RGB')
  if how == 'mirror':
    return ImageOps.mirror(im)
  if how == 'blur':
    return im.filter(ImageFilter.GaussianBlur(radius=float(rng.uniform(2.0, 4.0))))
  if how == 'solarise':
    return ImageOps.solarize(im, threshold=int(rng.randint(64, 192)))
  if how == 'contrast':
    return ImageOps.autocontrast(ImageOps.equalize(im))
  raise ValueError(f'unknown rendering {how!r}')


def _build(folder: str, n_pairs: int, seed: int) -> None:
  rng = np.random.RandomState(seed)
  sources = source_images()
  names = sorted(sources)
  os.makedirs(os.path.join(folder, 'left'))
  os.makedirs(os.path.join(folder, 'right'))
  rows = []
  for i in range(n_pairs):
    src = names[i % len(names)]
    box = _box(sources[src], rng)
    left = _crop(sources[src], box)
    how = RENDERINGS[rng.randint(len(RENDERINGS))]
    right = render(_crop(sources[src], _jitter(sources[src], box, rng)), how, rng)
    name = f'{i + 1:05d}.png'
    left.save(os.path.join(folder, 'left', name), optimize=False)
    right.save(os.path.join(folder, 'right', name), optimize=False)
    rows.append((name, src, how))
  text = io.StringIO(newline='')
  w = csv.writer(text)
  w.writerow(('name', 'source', 'rendering'))
  w.writerows(rows)
  ops.atomic_write_text(os.path.join(folder, 'classes.csv'), text.getvalue())


def default_root(cache_dir: str | None = None) -> str:
  """<cache_dir>/demo if a cache folder is given, else $VISIM_CACHE/demo or ~/.cache/visim_jax/demo."""
  if cache_dir:
    return os.path.join(os.path.expanduser(cache_dir), 'demo')
  base = os.environ.get('VISIM_CACHE', os.path.join(os.path.expanduser('~'), '.cache', 'visim_jax'))
  return os.path.join(base, 'demo')


def write_once(root: str, name: str, build: Callable[[str], None], meta: dict) -> str:
  """<root>/<name>, built once by build(folder) in a temp folder and renamed into place with a DONE.json
  stamp (concurrent builders: one wins, the others use its set); an unwritable root is a one-line error."""
  folder = os.path.join(root, name)
  stamp = os.path.join(folder, 'DONE.json')
  if os.path.exists(stamp):
    return folder
  try:
    os.makedirs(root, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=root, prefix='.tmp-demo-')
  except OSError as e:
    raise UserError(f'{root}: cannot create the demo folder ({e.strerror}); set config.demo.root or '
                    'config.cache_dir to a writable folder') from None
  try:
    build(os.path.join(tmp, 'set'))
    ops.atomic_write_text(os.path.join(tmp, 'set', 'DONE.json'), json.dumps(meta))
    if os.path.exists(folder) and not os.path.exists(stamp):  # an incomplete earlier attempt
      shutil.rmtree(folder, ignore_errors=True)
    try:
      os.replace(os.path.join(tmp, 'set'), folder)
    except OSError:  # another process won the race
      if not os.path.exists(stamp):
        raise
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  return folder


def demo_pairs(root: str | None = None, n_pairs: int = 192, seed: int = 0, cache_dir: str | None = None) -> str:
  """Writes (once) and returns the folder of the demo pairs set in the TLL layout (root: see the module doc)."""
  if n_pairs < 8:
    raise UserError(f'config.demo.n_pairs: need at least 8 pairs, got {n_pairs}')
  return write_once(root or default_root(cache_dir), f'pairs-v{DEMO_VERSION}-n{n_pairs}-seed{seed}',
                    lambda folder: _build(folder, n_pairs, seed),
                    {'version': DEMO_VERSION, 'n_pairs': n_pairs, 'seed': seed})


def demo_classes(folder: str) -> dict[str, str]:
  """{pair name: source photo} of a demo set (its classes, for labelled-set experiments)."""
  with open(os.path.join(folder, 'classes.csv')) as f:
    return {row['name']: row['source'] for row in csv.DictReader(f)}
