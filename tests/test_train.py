"""The training program of paper 001's protocol: sigmas vmapped in one program, the validation epoch rule,
the reference's PCA fit ('all': left, right and mirrored views) and its variance sum, against plain loops."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from visim_jax.models import adaptation
from visim_jax.losses import symmetric_ce
from visim_jax.core import pca
from visim_jax.training import adaptation_runs


def synthetic(n=48, d=12, seed=0):
  rng = np.random.RandomState(seed)
  z = rng.randn(n, d).astype(np.float32)
  mix = np.eye(d, dtype=np.float32) + 0.8 * rng.randn(d, d).astype(np.float32)
  left = z + 0.3 * rng.randn(n, d).astype(np.float32)
  right = z @ mix + 0.3 * rng.randn(n, d).astype(np.float32)
  flip = lambda a: a + 0.1 * rng.randn(n, d).astype(np.float32)
  return adaptation_runs.Features(*(jnp.asarray(a) for a in (left, right, flip(left), flip(right))))


HP = adaptation_runs.Hparams(runs=2, pca_dim=6, adapt_dim=16, epochs=5, sigmas=(1.0, 15.0), lr=1e-2, seed=1,
                   val_fraction=0.25)


def program(hp, feats):
  """The whole jitted path the experiments run: splits -> PCA -> projection -> init -> all epochs."""
  sp = adaptation_runs.splits(hp, feats.left.shape[0])
  pcas = adaptation_runs.fit_pcas(hp, feats, sp.train)
  data = adaptation_runs.project(feats, pcas, sp)
  state, out = jax.jit(adaptation_runs.train_chunk, static_argnums=(0, 3))(hp, adaptation_runs.init_state(hp), data, hp.epochs)
  return sp, pcas, state, out


def test_sigmas_in_one_program_equal_single_sigma_programs():
  feats = synthetic()
  _, _, state, out = program(HP, feats)
  assert out.loss.shape == (2, 2, 5) and out.test_ranks.shape[:3] == (2, 2, 5)
  for s, sigma in enumerate(HP.sigmas):
    _, _, st1, o1 = program(dataclasses.replace(HP, sigmas=(sigma,)), feats)
    np.testing.assert_allclose(out.loss[:, s], o1.loss[:, 0], rtol=1e-5)
    np.testing.assert_allclose(state.params['w'][:, s], st1.params['w'][:, 0], atol=1e-6)
    np.testing.assert_array_equal(out.test_ranks[:, s], o1.test_ranks[:, 0])
    np.testing.assert_array_equal(out.val_ranks[:, s], o1.val_ranks[:, 0])
  # the temperature matters: the two sigmas trained different models from the same start
  assert not np.allclose(state.params['w'][:, 0], state.params['w'][:, 1])


def test_validation_pairs_are_held_out_and_the_model_trains_on_the_rest():
  feats = synthetic()
  n = feats.left.shape[0]
  sp, _, state, out = program(HP, feats)
  assert HP.n_train(n) == 36 and HP.n_val(n) == 9 and HP.n_fit(n) == 27
  for r in range(HP.runs):
    tr, va, te = (np.asarray(a[r]) for a in (sp.train, sp.val, sp.test))
    assert len(set(tr) | set(va) | set(te)) == n and (len(tr), len(va), len(te)) == (27, 9, 12)
    # the test split is the one select_epoch='test' uses: only the training part is divided
    sp_t = adaptation_runs.splits(dataclasses.replace(HP, select_epoch='test'), n)
    np.testing.assert_array_equal(sp_t.test[r], te)
    np.testing.assert_array_equal(np.sort(sp_t.train[r]), np.sort(np.concatenate([tr, va])))
    # a plain loop: PCA on the fitting pairs only, Adam on their two views, ranks of the val pairs
    x = np.concatenate([feats.left[tr], feats.right[tr]])
    p = pca.fit(x, HP.pca_dim)
    t = lambda a: pca.transform(p, a)
    views = [(t(feats.left[tr]), t(feats.right[tr])), (t(feats.left_flip[tr]), t(feats.right_flip[tr]))]
    key = jax.random.fold_in(jax.random.PRNGKey(HP.seed), r)
    params = adaptation.init(jax.random.fold_in(key, 1), HP.pca_dim, HP.adapt_dim)
    opt = optax.adam(HP.lr)
    st = opt.init(params)
    for e in range(HP.epochs):
      g = jax.grad(lambda w: sum(symmetric_ce.loss_fn(w, a, b, 15.0) for a, b in views) / 2)(params)
      upd, st = opt.update(g, st, params)
      params = optax.apply_updates(params, upd)
      al, ar = (np.asarray(adaptation.adapt(params, t(a[va]))) for a in (feats.left, feats.right))
      np.testing.assert_array_equal(out.val_ranks[r, 1, e], np_best_ranks(al, ar))
    np.testing.assert_allclose(state.params['w'][r, 1], params['w'], atol=2e-5)


def np_best_ranks(a, b):
  """min over both directions of 1 + #{j != i: cos(i, j) >= cos(i, i)} (pessimistic ties), as loops."""
  a = a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)
  b = b / np.maximum(np.linalg.norm(b, axis=1, keepdims=True), 1e-12)
  s = a @ b.T
  n = len(s)
  out = []
  for i in range(n):
    lr = 1 + sum(s[i, j] >= s[i, i] for j in range(n) if j != i)
    rl = 1 + sum(s[j, i] >= s[i, i] for j in range(n) if j != i)
    out.append(min(lr, rl))
  return np.array(out)


def test_select_epochs_and_summary_match_plain_numpy():
  rng = np.random.RandomState(0)
  R, S, E, n = 3, 2, 7, 10
  test = rng.randint(1, 6, size=(R, S, E, n))
  val = rng.randint(1, 6, size=(R, S, E, 8))
  chosen = adaptation_runs.select_epochs(test, val, 1)
  for s in range(S):
    val_curve = [np.mean([np.mean([val[r, s, e, i] <= 1 for i in range(8)]) for r in range(R)]) for e in range(E)]
    test_curve = [np.mean([np.mean([test[r, s, e, i] <= 1 for i in range(n)]) for r in range(R)])
                  for e in range(E)]
    assert chosen['val'][s] == int(np.argmax(val_curve)) and chosen['test'][s] == int(np.argmax(test_curve))
    assert chosen['last'][s] == E - 1
  hp = adaptation_runs.Hparams(runs=R, sigmas=(1, 15), epochs=E, min_val_pairs=8)
  out = {'ranks': test, 'val_ranks': val, 'raw': test[:, 0, 0], 'pca': test[:, 0, 1]}
  summ = adaptation_runs.summarise(hp, out, (1, 5))
  assert summ['primary'] == 'val' and list(summ['adapted']) == ['sigma=1', 'sigma=15']
  e = chosen['val'][1]
  vals = [np.mean(test[r, 1, e] <= 5) for r in range(R)]
  m = sum(vals) / R
  sd = np.sqrt(sum((v - m) ** 2 for v in vals) / R)  # ddof 0, as the reference's np.std
  got = summ['adapted']['sigma=15']['aR@5']['val']
  np.testing.assert_allclose([got['mean'], got['std'], got['two_std']], [m, sd, 2 * sd])
  assert summ['epochs']['sigma=15'] == {'val': e + 1, 'test': chosen['test'][1] + 1, 'last': E}
  # fewer validation pairs than min_val_pairs: the headline is the last epoch, and metrics.json says why
  few = adaptation_runs.summarise(dataclasses.replace(hp, min_val_pairs=9), out, (1,))
  assert few['primary'] == 'last' and few['epochs']['sigma=15']['val'] == e + 1
  n_pairs = 120  # 90 training pairs, 9 validation pairs
  assert adaptation_runs.describe_epoch_rules(dataclasses.replace(hp, min_val_pairs=9), n_pairs, 1)['primary'] == 'val'
  rules = adaptation_runs.describe_epoch_rules(dataclasses.replace(hp, min_val_pairs=10), n_pairs, 1)
  assert rules['primary'] == 'last' and '9 validation pairs' in rules['fallback']
  # the console table (issue 45): on that fallback it shows the fixed-epoch column only (an argmax over epochs of so few
  # pairs moves with float rounding, so its digits would differ between CPUs); otherwise every rule, headline first
  from visim_jax.experiments import adapt
  eps = {'val': 3, 'test': 5, 'last': E}
  assert adapt.shown_rules(rules, eps) == ['last'] and 'not in the console table' in rules['fallback']
  assert adapt.shown_rules({'primary': 'val'}, eps) == ['val', 'last', 'test']
  assert adapt.shown_rules({'primary': 'last'}, eps) == ['last', 'val', 'test']
  # without validation pairs there is no 'val' rule
  no_val = adaptation_runs.summarise(dataclasses.replace(hp, select_epoch='test'), {**out, 'val_ranks': None}, (1,))
  assert set(no_val['epochs']['sigma=1']) == {'test', 'last'}
  one = adaptation_runs.select_sigma({'ranks': test, 'val_ranks': None, 'params': {'w': np.zeros((R, S, 4, 5))},
                            'raw': test[:, 0, 0]}, 1)
  assert one['ranks'].shape == (R, E, n) and one['params']['w'].shape == (R, 4, 5) and one['val_ranks'] is None


@pytest.mark.parametrize('flip', [True, False])
def test_pca_fit_all_uses_every_vector_the_reference_fits_on(flip):
  feats = synthetic() if flip else adaptation_runs.Features(*synthetic()[:2])
  hp = dataclasses.replace(HP, pca_fit='all')
  sp = adaptation_runs.splits(hp, feats.left.shape[0])
  pcas = adaptation_runs.fit_pcas(hp, feats, sp.train)
  # the reference (extract.py --data-aug + AdaptationProcessorPCA / pca.py) fits one PCA on the left and right
  # vectors of every pair and of their mirrored images, test pairs included
  x = np.concatenate([np.asarray(a) for a in feats if a is not None]).astype(np.float64)
  assert x.shape[0] == (4 if flip else 2) * 48
  mean = x.mean(0)
  xc = x - mean
  cov = sum(np.outer(row, row) for row in xc)   # plain loop over the fit vectors
  evals, evecs = np.linalg.eigh(cov)
  order = np.argsort(evals)[::-1][:hp.pca_dim]
  for r in range(hp.runs):
    np.testing.assert_allclose(pcas.mean[r], mean, atol=1e-5)
    np.testing.assert_allclose(np.abs(pcas.components[r]), np.abs(evecs[:, order]), atol=1e-4)
  # the Table 1 column: share of the fit vectors' variance the components keep (sklearn explained_variance_ratio_)
  evr = np.asarray(adaptation_runs.explained_variance(hp, feats, pcas, sp.train))
  np.testing.assert_allclose(evr, evals[order].sum() / evals.sum(), rtol=1e-4)
  # the honest default fits on the run's fitting pairs only (left + right), never on val/test or mirrored views
  hp_t = dataclasses.replace(HP, pca_fit='train')
  p_t = adaptation_runs.fit_pcas(hp_t, feats, sp.train)
  ev_t = np.asarray(adaptation_runs.explained_variance(hp_t, feats, p_t, sp.train))
  for r in range(hp.runs):
    tr = np.asarray(sp.train[r])
    xt = np.concatenate([np.asarray(feats.left)[tr], np.asarray(feats.right)[tr]]).astype(np.float64)
    np.testing.assert_allclose(p_t.mean[r], xt.mean(0), atol=1e-5)
    w = np.linalg.eigvalsh(np.cov(xt.T))[::-1]
    np.testing.assert_allclose(ev_t[r], w[:hp.pca_dim].sum() / w.sum(), rtol=1e-4)
