"""Ensemble weights on a small hand-made case: majority vote, PCA credibility maps, MLP weights."""
import numpy as np
import jax
import jax.numpy as jnp

from visim_jax import ensembles as E


def _clusters():
  rng = np.random.RandomState(0)
  xa = np.c_[np.full(10, -5.0), rng.randn(10) * 0.1, rng.randn(10) * 0.01]
  xb = np.c_[np.full(10, 5.0), rng.randn(10) * 0.1, rng.randn(10) * 0.01]
  anchors = np.array([[0.0, -5.0, 0.0], [0.0, 5.0, 0.0]])   # stretch the second PCA axis
  feats = np.concatenate([xa, xb, anchors]).astype(np.float32)
  acc = np.array([[1.0] * 10 + [0.0] * 10 + [0.5, 0.5],     # model 0: right around A
                  [0.0] * 10 + [1.0] * 10 + [0.5, 0.5],     # model 1: right around B
                  [0.6] * 22], np.float32)                  # model 2: so-so everywhere
  return feats, acc


def test_majority_and_weighted_vote():
  votes = jnp.array([[1, 1, -1, 0], [1, -1, -1, 0], [-1, -1, 1, 0]], jnp.int8)
  dec = E.weighted_vote(votes, E.majority_weights(3, 4))
  np.testing.assert_array_equal(dec, [1, -1, -1, 0])
  np.testing.assert_array_equal(E.vote_scores(dec, jnp.array([True, True, True, False])), [1, 0, 0, 0.5])
  # per-model weights: model 2 alone outweighs the two others
  np.testing.assert_array_equal(E.weighted_vote(votes, jnp.array([1.0, 1.0, 3.0])), [-1, -1, 1, 0])


def test_credibility_maps_and_threshold_weights():
  feats, acc = _clusters()
  cm = E.fit_credibility(jnp.asarray(feats), jnp.asarray(acc), grid=20, window=3)
  assert cm.maps.shape == (3, 20, 20) and float(cm.support.max()) >= 10
  probe = jnp.asarray(np.array([[-5.0, 0, 0], [5.0, 0, 0], [0.0, 0, 0]], np.float32))
  cred = np.asarray(E.credibility(cm, probe))
  np.testing.assert_allclose(cred[:, 0], [1.0, 0.0, 0.6], atol=1e-6)   # inside cluster A's window
  np.testing.assert_allclose(cred[:, 1], [0.0, 1.0, 0.6], atol=1e-6)
  np.testing.assert_allclose(cred[:, 2], [0.5, 0.5, 0.6], atol=1e-6)   # empty window: each model's mean
  w = np.asarray(E.threshold_weights(jnp.asarray(cred), 0.55))
  np.testing.assert_allclose(w, [[0.45, 0, 0], [0, 0.45, 0], [0.05, 0.05, 0.05]], atol=1e-6)
  w = np.asarray(E.threshold_weights(jnp.asarray(cred), 0.7))
  np.testing.assert_allclose(w[:, 2], [0, 0, 1])                        # none above: the best model decides
  # far outside the box: clipped into the edge cells, never an index error
  far = np.asarray(E.credibility(cm, jnp.asarray([[-50.0, 0, 0]])))
  np.testing.assert_allclose(far[:, 0], [1.0, 0.0, 0.6], atol=1e-6)


def test_mlp_weights_follow_local_accuracy():
  feats, acc = _clusters()
  mw = E.fit_mlp_weights(jax.random.PRNGKey(0), jnp.asarray(feats), jnp.asarray(acc), dim=2, hidden=16,
                         steps=300, lr=1e-2)
  w = np.asarray(E.mlp_weights(mw, jnp.asarray(feats[[0, 15]])))
  np.testing.assert_allclose(w.sum(0), 1.0, rtol=1e-5)
  assert w[0, 0] > 0.5 > w[1, 0] and w[1, 1] > 0.5 > w[0, 1]
  assert 0.2 < w[2, 0] < 0.5
