"""core/pooling.max_pool = a plain NumPy loop over windows (and flax.linen.max_pool), bit for bit."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from visim_jax.core import pooling


def _loop(x, window, strides, pads):
  (kh, kw), (sh, sw), ((pt, pb), (pl, pr)) = window, strides, pads
  x = np.pad(x, ((0, 0), (pt, pb), (pl, pr), (0, 0)), constant_values=-np.inf)
  n, h, w, c = x.shape
  ho, wo = (h - kh) // sh + 1, (w - kw) // sw + 1
  out = np.empty((n, ho, wo, c), x.dtype)
  for b in range(n):
    for i in range(ho):
      for j in range(wo):
        for ch in range(c):
          out[b, i, j, ch] = max(x[b, i * sh + dy, j * sw + dx, ch] for dy in range(kh) for dx in range(kw))
  return out


@pytest.mark.parametrize('shape,window,strides,pads', [
    ((2, 13, 11, 3), (3, 3), (2, 2), ((0, 0), (0, 0))),      # AlexNet / BiT / Inception: 3 / 2, odd sides
    ((1, 8, 9, 2), (2, 2), (2, 2), ((0, 0), (0, 0))),        # VGG: 2 / 2, a side not divisible
    ((2, 9, 10, 2), (3, 3), (2, 2), ((1, 1), (1, 1))),       # ResNet stem: padded by 1 with -inf
])
def test_equals_the_loop_and_flax(shape, window, strides, pads):
  x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
  padding = 'VALID' if pads == ((0, 0), (0, 0)) else pads
  got = np.asarray(jax.jit(lambda v: pooling.max_pool(v, window, strides, padding))(x))
  np.testing.assert_array_equal(got, _loop(x, window, strides, pads))
  np.testing.assert_array_equal(got, np.asarray(nn.max_pool(jnp.asarray(x), window, strides, padding=padding)))


def test_refuses_same_padding():
  with pytest.raises(ValueError, match='VALID or explicit'):
    pooling.max_pool(jnp.zeros((1, 4, 4, 1)), (2, 2), (2, 2), 'SAME')
