"""Three small photos to try the library on (README's `a.png`, `b.png`): `python -m visim_jax.fetch examples`.

Made offline from a photo that ships inside scikit-image (a dependency), so the same bytes on every machine with the
same Pillow: `a.png` = `skimage.data.astronaut()` (512 px) resized to SIZE x SIZE; `b.png` = a look-alike of it (the
same photo cropped 16 px tighter on each side, resized, blurred with radius 1, a little brighter); `c.png` = another
photo (`skimage.data.chelsea()`, the centre square). All SIZE x SIZE RGB, the same size (LPIPS compares images of one
size) and larger than MS-SSIM's 161 px, so every metric the docs show runs on them.
"""
from __future__ import annotations

import io
import os

import numpy as np
from PIL import Image, ImageEnhance, ImageFilter

from visim_jax.core import ops

SIZE = 256
NAMES = ('a.png', 'b.png', 'c.png')
DESCRIPTION = (f'{SIZE} x {SIZE} RGB from scikit-image\'s photos: a = the astronaut, b = a look-alike of a (cropped, '
               'blurred, brighter), c = the cat')


def images() -> dict[str, Image.Image]:
  """{file name: PIL image} of the three examples (module docstring)."""
  import skimage.data  # pylint: disable=g-import-not-at-top
  astronaut = Image.fromarray(np.asarray(skimage.data.astronaut()))
  a = astronaut.resize((SIZE, SIZE), Image.BICUBIC)
  w, h = astronaut.size
  b = astronaut.crop((16, 16, w - 16, h - 16)).resize((SIZE, SIZE), Image.BICUBIC)
  b = ImageEnhance.Brightness(b.filter(ImageFilter.GaussianBlur(1))).enhance(1.1)
  cat = Image.fromarray(np.asarray(skimage.data.chelsea()))
  w, h = cat.size
  s = min(w, h)
  c = cat.crop(((w - s) // 2, (h - s) // 2, (w - s) // 2 + s, (h - s) // 2 + s)).resize((SIZE, SIZE), Image.BICUBIC)
  return dict(zip(NAMES, (a, b, c)))


def write(folder: str) -> list[str]:
  """Writes a.png, b.png, c.png into FOLDER (made if missing; files there are replaced); their paths."""
  os.makedirs(folder, exist_ok=True)
  out = []
  for name, im in images().items():
    buf = io.BytesIO()
    im.convert('RGB').save(buf, 'PNG')
    path = os.path.join(folder, name)
    ops.atomic_write_bytes(path, buf.getvalue())
    out.append(path)
  return out
