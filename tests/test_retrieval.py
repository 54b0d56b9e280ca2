"""aR@k against a brute-force reference, ties included."""
import itertools

import numpy as np

from visim_jax.metrics import retrieval


def brute_force_ar(sim, k):
  n = len(sim)
  found = 0
  for i in range(n):
    # pessimistic rank: every other candidate scoring >= the partner goes first
    r_lr = 1 + sum(1 for j in range(n) if j != i and sim[i, j] >= sim[i, i])
    r_rl = 1 + sum(1 for j in range(n) if j != i and sim[j, i] >= sim[i, i])
    found += (r_lr <= k) or (r_rl <= k)
  return found / n


def test_hand_made_case():
  sim = np.array([[0.9, 0.1, 0.2],    # pair 0: rank 1 left->right
                  [0.5, 0.4, 0.6],    # pair 1: rank 3 l->r, and column 1: 0.1, 0.4, 0.3 -> rank 1 r->l
                  [0.95, 0.2, 0.3]])  # pair 2: l->r rank 2; r->l column 2: 0.2, 0.6, 0.3 -> rank 2
  np.testing.assert_allclose(retrieval.asymmetric_recall(sim, [1, 2, 3]), [2 / 3, 1, 1])
  np.testing.assert_allclose(retrieval.recall(sim, [1, 2, 3]), [1 / 3, 2 / 3, 1])


def test_ties_are_pessimistic():
  sim = np.ones((3, 3))  # everything tied: the partner ranks last in both directions
  np.testing.assert_allclose(retrieval.asymmetric_recall(sim, [1, 2, 3]), [0, 0, 1])


def test_matches_brute_force_with_ties():
  rng = np.random.RandomState(0)
  for n, levels in itertools.product((5, 12), (3, 50)):
    sim = rng.randint(0, levels, (n, n)).astype(np.float32)  # few levels: many ties
    ks = [1, 2, 5]
    got = np.asarray(retrieval.asymmetric_recall(sim, ks))
    np.testing.assert_allclose(got, [brute_force_ar(sim, k) for k in ks])


def test_features_version_uses_cosine():
  rng = np.random.RandomState(1)
  x = rng.randn(6, 4)
  # scaling rows does not change cosine
  np.testing.assert_allclose(retrieval.asymmetric_recall_features(x, 3 * x + 0, [1]), [1.0])
