"""The adaptation model, its loss and the PCA against direct NumPy formulas."""
import jax
import numpy as np
import pytest

from visim_jax.models import adaptation
from visim_jax.losses import symmetric_ce
from visim_jax.core import pca


def np_loss(w, dl, dr, sigma):
  al, ar = np.maximum(dl @ w, 0), np.maximum(dr @ w, 0)
  al = al / np.linalg.norm(al, axis=1, keepdims=True)
  ar = ar / np.linalg.norm(ar, axis=1, keepdims=True)
  s = al @ ar.T * sigma

  def ce(m):  # mean over rows of -log softmax(m)[i, i]
    m = m - m.max(1, keepdims=True)
    return np.mean(np.log(np.exp(m).sum(1)) - np.diag(m))
  return (ce(s) + ce(s.T)) / 2


@pytest.mark.parametrize('sigma', [1.0, 15.0])
def test_loss_matches_numpy(sigma):
  rng = np.random.RandomState(0)
  dl, dr = rng.randn(7, 8).astype(np.float32), rng.randn(7, 8).astype(np.float32)
  params = adaptation.init(jax.random.PRNGKey(0), 8, 16)
  got = float(symmetric_ce.loss_fn(params, dl, dr, sigma))
  np.testing.assert_allclose(got, np_loss(np.asarray(params['w']), dl, dr, sigma), rtol=1e-5)


def test_loss_gradient_matches_plain_loop_numpy():
  """The written-out gradient of the symmetric CE (custom_vjp) against the softmax - one-hot of each direction,
  accumulated entry by entry from the equation, and through W against float64 central differences."""
  rng = np.random.RandomState(1)
  s = rng.randn(5, 5).astype(np.float32) * 3
  n = s.shape[0]
  want = np.zeros((n, n))
  for i in range(n):        # CE(S, I): row i, softmax over j, mean over rows
    for j in range(n):
      want[i, j] += (np.exp(s[i, j]) / np.exp(s[i]).sum() - (i == j)) / (2 * n)
  for j in range(n):        # CE(S^T, I): column j, softmax over i
    for i in range(n):
      want[i, j] += (np.exp(s[i, j]) / np.exp(s[:, j]).sum() - (i == j)) / (2 * n)
  np.testing.assert_allclose(jax.grad(symmetric_ce.symmetric_ce)(s), want, atol=1e-6)
  dl, dr = rng.randn(6, 4), rng.randn(6, 4)
  w = rng.randn(4, 8) * 0.5
  g = np.asarray(jax.grad(lambda w: symmetric_ce.loss_fn({'w': w}, dl.astype(np.float32), dr.astype(np.float32),
                                                       15.0))(w.astype(np.float32)))
  for (a, b) in [(0, 0), (1, 3), (3, 7)]:
    e = np.zeros_like(w)
    e[a, b] = 1e-5
    fd = (np_loss(w + e, dl, dr, 15.0) - np_loss(w - e, dl, dr, 15.0)) / 2e-5
    np.testing.assert_allclose(g[a, b], fd, rtol=1e-3, atol=1e-4)


def test_init_like_torch_linear():
  w = np.asarray(adaptation.init(jax.random.PRNGKey(0), 256, 1024)['w'])
  assert w.shape == (256, 1024) and np.abs(w).max() <= 1 / 16
  assert abs(w.std() - (1 / 16) / np.sqrt(3)) < 1e-3


def test_pca_matches_numpy_and_masks():
  rng = np.random.RandomState(0)
  x = rng.randn(40, 10) @ rng.randn(10, 10)
  p = pca.fit(x, 4)
  xc = x - x.mean(0)
  _, _, vt = np.linalg.svd(xc, full_matrices=False)
  proj = np.asarray(pca.transform(p, x))
  np.testing.assert_allclose(np.abs(proj), np.abs(xc @ vt[:4].T), rtol=1e-3, atol=1e-3)
  # masked rows are ignored: the fit equals the fit on the kept rows
  mask = np.arange(40) < 25
  pm, pk = pca.fit(x, 4, mask), pca.fit(x[:25], 4)
  np.testing.assert_allclose(np.asarray(pm.components), np.asarray(pk.components), atol=1e-4)
  # the wide case (D > N) goes through the SVD branch and agrees
  wide = rng.randn(6, 20)
  pw = pca.fit(wide, 3)
  _, _, vt = np.linalg.svd(wide - wide.mean(0), full_matrices=False)
  np.testing.assert_allclose(np.abs(np.asarray(pw.components)), np.abs(vt[:3].T), atol=1e-4)
  # whitening gives unit variance per component
  white = np.asarray(pca.transform(pca.fit(x, 4, whiten=True), x))
  np.testing.assert_allclose(white.std(0, ddof=1), 1.0, rtol=1e-3)
  with pytest.raises(ValueError, match='config.pca_dim'):
    pca.fit(x, 11)
