"""The pixels a tower is tuned on: the decoded-pixel table of an image list, AligNet's preprocessing, and the
distinct images of a triplet set.

  table = pixel_table(paths, pre, image_cache=FOLDER)   # (M, S, S, 3) as images.load_batch gives them (uint8, or
                                                         # float32 on 0..255 for 'torch_bilinear'), row i = paths[i]

Pixels come through data/pipeline.py: each image decoded and resized once by the backbone's own preprocessing
(`Preprocess`: resize, crop, interpolation; the device normalises). With a cache folder the table is pipeline's
memory-mapped decoded-image cache (one .npy per file list x preprocessing, published atomically, shared with
feature extraction: a second run or a second model with the same preprocessing reads it and decodes nothing);
without one it is an array in memory. The tune experiment reads a table through grain (data/grain_data.TableImages)
where it was measured to win (an image list re-read every epoch: NIGHTS, BAPPS, THINGS, a folder); AligNet's
ImageNet is decoded batch by batch instead (data/grain_data.TfdsImages). Every step's batch: data/grain_data.py.

No image augmentation: neither DreamSim (Resize + ToTensor) nor AligNet (a cubic resize to 224 x 224) augments.

alignet_preprocess(): AligNet's configs/siglip.py pipeline, preprocessing.ResizeImage (cv2.resize INTER_CUBIC to
224 x 224, the aspect ratio not kept) then kd.data.ValueRange (0, 255) -> (0, 1), fed to the SigLIP tower as is
(big_vision's SigLIP was pretrained on [-1, 1]; AligNet's code feeds [0, 1]). Ours: interpolation 'cv2_cubic'
(data/images.py: OpenCV's resize.cpp INTER_CUBIC in NumPy, without depending on cv2) and x / 255 on the device.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from visim_jax.data import pipeline
from visim_jax.data.preprocess import Preprocess

AUGMENT = ('none',)


def alignet_preprocess(size: int = 224) -> Preprocess:
  """AligNet's pixels (module docstring) at `size` (AligNet: 224, SigLIP B/16 224's input)."""
  return Preprocess(size=size, resize='squash', interpolation='cv2_cubic', mean=(0.0,) * 3, std=(255.0,) * 3)


def pixel_table(paths: Sequence[str], pre, image_cache: str | None = None, batch_size: int = 64,
                workers: int | None = None, progress: bool = True, desc: str = 'images') -> np.ndarray:
  """(M, S, S, 3) pixels of `paths` in order (see the module docstring); a bad image is one UserError naming it."""
  from tqdm.auto import tqdm
  paths = list(paths)
  if image_cache:
    try:
      manifest = pipeline.image_cache_manifest(paths, pre)
    except OSError:
      manifest = None   # a missing file: the decoding below names it
    if manifest is not None:
      path = pipeline.image_cache_path(image_cache, manifest)
      hit = pipeline.read_image_cache(path, manifest)
      if hit is not None:
        return hit
      with tqdm(total=len(paths), desc=desc, unit='img', disable=not progress) as bar:
        for _, n, _ in pipeline.host_batches(paths, pre, batch_size, workers=workers, image_cache=image_cache):
          bar.update(n)
      hit = pipeline.read_image_cache(path, manifest)
      if hit is not None:
        return hit    # else the cache could not be written (logged): decoded again into memory below
  s = pre.size
  out = np.empty((len(paths), s, s, 3), pipeline.pixel_dtype(pre))
  with tqdm(total=len(paths), desc=desc, unit='img', disable=not progress) as bar:
    for start, n, x in pipeline.host_batches(paths, pre, batch_size, workers=workers):
      out[start:start + n] = x[:n]
      bar.update(n)
  return out


def image_rows(triplets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(the distinct table rows a triplet set uses, sorted; the triplets as positions into that list): every held-out
  image is embedded once."""
  rows, inv = np.unique(np.asarray(triplets).reshape(-1), return_inverse=True)
  return rows, inv.reshape(np.shape(triplets)).astype(np.int32)
