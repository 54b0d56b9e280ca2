"""Two images, one number: `python -m visim_jax.distance a.png b.png [--model=SPEC] [--map=map.png]`.

    python -m visim_jax.distance a.png b.png                         # LPIPS v0.1 AlexNet (the default, as LPIPS's
    python -m visim_jax.distance a.png b.png --model=dreamsim        #   lpips_2imgs.py), or any vj.load spec
    python -m visim_jax.distance ref.png x.png --model=lpips:vgg --map=map.png   # + LPIPS's spatial map as an image

The command-line face of `visim_jax.load(SPEC).distance(a, b)` (visim_jax/api.py): the same decoding, weights and
numbers, printed as LPIPS's own two-image script prints them (richzhang/PerceptualSimilarity `lpips_2imgs.py`:
`Distance: %.3f`; here four decimals and the model). Smaller = more similar. Missing weights are fetched once as
`vj.load` fetches them (`--nofetch`: never download; the error names `python -m visim_jax.fetch NAME`).
LPIPS compares the two images at their own size (both the same size, as the reference; `--resize=shorter|HxW`
resizes them first, as `distance(..., resize=)`); `--map` writes the model's distance map (`Model.distance_map`:
LPIPS's `spatial=True` map, 1 - SSIM, per-pixel errors, DISTS per location, per-patch cosine for embedding models)
as a grey PNG, white = most different, scaled to the map's maximum (the maximum is printed; negative values, which
only SSIM can have, print black). `--image_size=N`: a ViT tower at N px (`vj.load(spec, image_size=N)`).
"""
from __future__ import annotations

import numpy as np

from visim_jax.core.errors import UserError


def write_map(m: np.ndarray, path: str) -> float:
  """A (H, W) non-negative map -> a grey PNG scaled to its maximum (white = most different); the maximum."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  from visim_jax.core import ops  # pylint: disable=g-import-not-at-top
  import io  # pylint: disable=g-import-not-at-top
  top = float(np.max(m)) if m.size else 0.0
  grey = np.zeros(m.shape, np.uint8) if top <= 0 else np.clip(np.rint(m / top * 255), 0, 255).astype(np.uint8)
  buf = io.BytesIO()
  Image.fromarray(grey, 'L').save(buf, 'PNG')
  ops.atomic_write_bytes(path, buf.getvalue())
  return top


def main(argv) -> None:
  from absl import flags  # pylint: disable=g-import-not-at-top
  import visim_jax as vj  # pylint: disable=g-import-not-at-top
  f = flags.FLAGS
  paths = argv[1:]
  if len(paths) != 2:
    raise UserError(f'give two image files: `python -m visim_jax.distance a.png b.png [--model=SPEC]`, got '
                    f'{len(paths)}')
  model = vj.load(f.model, fetch=f.fetch, image_size=f.image_size)
  d = model.distance(paths[0], paths[1], resize=f.resize)
  print(f'Distance: {d:.4f} ({model.spec})')
  if f.map:
    top = write_map(np.clip(np.asarray(model.distance_map(paths[0], paths[1], resize=f.resize)), 0.0, None), f.map)
    print(f'map: {f.map} (white = {top:.4f} per pixel)')


def run_main() -> None:
  from absl import flags  # pylint: disable=g-import-not-at-top
  from visim_jax.core import errors  # pylint: disable=g-import-not-at-top
  flags.DEFINE_string('model', 'lpips:alex', 'any spec visim_jax.load takes: lpips:alex, lpips:vgg, dreamsim, '
                      'cosine:<backbone>, a backbone name, adapter:/simnet:/context:/triplets:<workdir>')
  flags.DEFINE_string('map', None, 'write the distance map (Model.distance_map: every kind that has one) to this '
                      'PNG file')
  flags.DEFINE_string('resize', 'none', "same-size models (LPIPS, SSIM, DISTS, ...): 'none' (refuse two sizes), "
                      "'shorter' (shorter sides scaled to the smaller one, centre-cropped) or 'HxW'")
  flags.DEFINE_integer('image_size', None, 'ViT towers: the input size, position embeddings interpolated')
  flags.DEFINE_bool('fetch', True, 'download missing weights once (--nofetch: never; the error names the command)')
  errors.run(main)


if __name__ == '__main__':
  run_main()
