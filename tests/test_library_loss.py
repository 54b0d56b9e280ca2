"""Issue 46, "as a loss": the gradient of a model's distance with respect to the image (what colabs/loss.ipynb and
docs/library.md "As a loss" descend) equals central finite differences, for DISTS and DreamSim (its single-branch DINO
model; tiny random-weight towers: the same code paths as the real weights). LPIPS's is tests/test_api.py's
test_lpips_gradient_matches_finite_differences (the packaged weights, a direction over the whole image).

The models compute in float32 (lpips.as_unit_range, dists and the ViT modules cast their inputs), so the check is
float32's: a direction confined to a few pixels (a 3 x 3 patch, 3 channels, unit norm), steps of +-eps, and a
tolerance of 2% plus the rounding the difference quotient itself carries (a few float32 ulps of the loss over 2 eps).
eps = 3e-3: a step of 1e-2 crosses a max-pool / ReLU kink of DISTS's VGG (its quotient is 25% off there, and comes to
the gradient as eps shrinks), while float32 rounding grows as 1 / eps."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import visim_jax as vj

F32 = float(np.finfo(np.float32).eps)


@pytest.mark.parametrize('spec,size', [('dists:vgg:tiny', 16), ('cosine:dreamsim_dino_vitb16:tiny', None)])
def test_image_gradient_matches_finite_differences(spec, size):
  model = vj.load(spec, fetch=False)
  size = model.image_size or size
  rng = np.random.default_rng(0)
  x0, x1 = (jnp.asarray(rng.uniform(0.2, 0.8, (1, size, size, 3)), jnp.float32) for _ in range(2))
  params = model.params
  eps = 3e-3
  v = np.zeros((2,) + x0.shape[1:])
  for i, (top, left) in enumerate(((1, 2), (size // 2, size - 5))):   # a patch near the border and one inside
    v[i, top:top + 3, left:left + 3] = rng.standard_normal((3, 3, 3))
  v = jnp.asarray(v / np.linalg.norm(v.reshape(2, -1), axis=1)[:, None, None, None], jnp.float32)

  @jax.jit   # one program: the gradient the loss descends, and the four shifted images' distances
  def check(x):
    g = jax.grad(lambda y: model.apply_distance(params, y, x1).sum())(x)
    shifted = jnp.concatenate([x + eps * v, x - eps * v])
    return g, model.apply_distance(params, shifted, jnp.broadcast_to(x1, shifted.shape))
  g, d = (np.asarray(a, np.float64) for a in check(x0))
  for i in range(2):
    up, down = d[i], d[2 + i]
    fd = (up - down) / (2 * eps)
    analytic = float((g * np.asarray(v[i:i + 1], np.float64)).sum())
    rounding = 8 * F32 * max(abs(up), abs(down)) / (2 * eps)
    assert abs(analytic) > 20 * rounding, (spec, analytic, rounding)   # a derivative the check can see
    assert abs(analytic - fd) <= 0.02 * abs(fd) + rounding, (spec, i, analytic, fd)
