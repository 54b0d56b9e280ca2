"""How an image is fed to a backbone: host geometry (size, squash or shorter-side + centre crop, interpolation)
and the device-side normalisation. A leaf: imports nothing from visim_jax, so both the image code (data/images.py)
and every backbone family use it without depending on each other.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

# torchvision's ImageNet normalisation, on the 0..255 scale of Preprocess.mean / std
IMAGENET_MEAN = tuple(255.0 * v for v in (0.485, 0.456, 0.406))
IMAGENET_STD = tuple(255.0 * v for v in (0.229, 0.224, 0.225))


@dataclasses.dataclass(frozen=True)
class Preprocess:
  """Host-side geometry + device-side normalisation of an image.

  resize: 'squash' resizes the whole image to size x size (aspect ratio not kept);
          'shorter_crop' resizes the shorter side to `resize_to` (default `size`) and centre-crops size x size,
          as CLIP and the torchvision ImageNet transforms do (torchvision's rounding: the longer side
          int(resize_to * long / short), the crop offset round((n - size) / 2)).
  interpolation: 'bilinear' / 'bicubic': PIL's (antialiased when shrinking) on uint8, rounded to uint8;
          'torch_bilinear': torch's F.interpolate(bilinear, align_corners=False) on float values, no
          antialiasing, no rounding (a float32 host array): what torchvision's Resize does to a ToTensor
          image, the seed code of paper 001 (data/images.py);
          'tf_bilinear': TF2's tf.image.resize(bilinear, antialias=False) (half-pixel centres, no antialiasing,
          float32 lerps) cast back to uint8 by truncation, as big_vision's `resize` pp op does (SigLIP).
          'cv2_cubic': OpenCV's cv2.resize(INTER_CUBIC) on uint8 (Keys' cubic, A = -0.75, no antialiasing, 11-bit
          fixed-point weights, rounded and saturated to uint8), as AligNet's preprocessing.py resizes.
  mean, std: per-channel, on the 0..255 scale: x_in = (x - mean) / std.
  """
  size: int = 224
  resize: str = 'squash'
  resize_to: int | None = None
  mean: tuple[float, float, float] = (127.0, 127.0, 127.0)
  std: tuple[float, float, float] = (128.0, 128.0, 128.0)
  interpolation: str = 'bilinear'

  def __post_init__(self):
    if not isinstance(self.size, int) or self.size < 8 or self.size > 4096:
      raise ValueError(f'preprocess.size: expected an integer in [8, 4096], got {self.size!r}')
    if self.resize not in ('squash', 'shorter_crop'):
      raise ValueError(f"preprocess.resize: expected 'squash' or 'shorter_crop', got {self.resize!r}")
    if self.resize_to is not None and self.resize_to < self.size:
      raise ValueError(f'preprocess.resize_to ({self.resize_to}) must be >= size ({self.size})')
    if self.interpolation not in ('bilinear', 'bicubic', 'torch_bilinear', 'tf_bilinear', 'cv2_cubic'):
      raise ValueError("preprocess.interpolation: 'bilinear', 'bicubic', 'torch_bilinear', 'tf_bilinear' or "
                       "'cv2_cubic', "
                       f'got {self.interpolation!r}')

  def normalise(self, images: jax.Array, dtype=jnp.float32) -> jax.Array:
    """uint8 (or float 0..255) NHWC -> normalised float NHWC, on device."""
    mean = jnp.asarray(self.mean, jnp.float32)
    std = jnp.asarray(self.std, jnp.float32)
    return ((images.astype(jnp.float32) - mean) / std).astype(dtype)

  def describe(self) -> dict:
    return dataclasses.asdict(self)
