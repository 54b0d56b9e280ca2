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
