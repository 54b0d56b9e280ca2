"""Random, non-trivial weights for the PyTorch reference models of the parity tests (torch imported lazily)."""
import numpy as np


def randomise(model, seed, small=()):
  """Every float parameter and buffer drawn anew: BatchNorm variances in [0.5, 1.5), norm scales near 1,
  matrices/kernels with 1/sqrt(fan_in) scale (except names containing one of `small`), the rest 0.1 * N(0, 1).
  Returns the model in eval mode."""
  import torch
  g = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in list(model.named_parameters()) + list(model.named_buffers()):
      if not p.dtype.is_floating_point:
        continue
      if name.endswith('running_var'):
        p.copy_(0.5 + torch.rand(p.shape, generator=g))
      elif name.endswith('weight') and p.ndim == 1:  # norm scales
        p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
      elif p.ndim >= 2 and not any(s in name for s in small):
        fan_in = int(np.prod(p.shape[1:]))
        p.copy_(torch.randn(p.shape, generator=g) / np.sqrt(max(fan_in, 1)))
      else:
        p.copy_(0.1 * torch.randn(p.shape, generator=g))
  return model.eval()


def run_both(backbone, reference, size, seed=1, n=2):
  """Our backbone and a PyTorch reference (a callable on NCHW tensors returning {stage: tensor}) on the same
  random uint8 images, normalised by the backbone's own Preprocess. Returns (final, stages, want) as NumPy,
  every 4-d reference output moved to NHWC."""
  import jax
  import torch
  images = np.random.default_rng(seed).integers(0, 256, (n, size, size, 3), dtype=np.uint8)
  final, stages = jax.jit(backbone.__call__)(images)
  x = np.asarray(backbone.preprocess.normalise(images))
  with torch.no_grad():
    want = reference(torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2))))
  want = {k: v.numpy().transpose(0, 2, 3, 1) if v.ndim == 4 else v.numpy() for k, v in want.items()}
  return np.asarray(final), {k: np.asarray(v) for k, v in stages.items()}, want


def assert_stages_close(stages, want, atol=1e-4, rtol=1e-4, name=''):
  """The same stage names, and every stage within tolerance."""
  assert sorted(stages) == sorted(want)
  for k, v in want.items():
    np.testing.assert_allclose(stages[k], v, atol=atol, rtol=rtol, err_msg=f'{name} {k}')
