"""Attacks on 2AFC judgements (metrics/attacks.py, vj.attack; docs/robustness.md): budgets, [0, 1], one PGD step
against a plain-loop NumPy statement, APGD's checkpoint schedule, and decisions flipped on LPIPS-alex's real weights."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import visim_jax as vj
from visim_jax.core.errors import UserError
from visim_jax.metrics import attacks


def toy_distance(params, x0, x1):
  """A cheap differentiable distance (N,): a weighted mean of squared differences after a tanh."""
  return jnp.mean(params * (jnp.tanh(3 * x0) - jnp.tanh(3 * x1)) ** 2, axis=(1, 2, 3))


def _norms(x, ref, norm):
  d = (np.asarray(x, np.float64) - np.asarray(ref, np.float64)).reshape(len(ref), -1)
  return np.abs(d).max(1) if norm == 'linf' else np.sqrt((d ** 2).sum(1))


@pytest.mark.parametrize('method', ['apgd', 'pgd'])
def test_every_image_within_its_budget_and_unit_range(method):
  """Random items (pixels at 0 and 1 included), both norms, budgets small and large (one program per norm: eps is
  traced): ||x_adv - ref|| <= eps (float32 rounding) and 0 <= x_adv <= 1, whatever the attack did."""
  rng = np.random.default_rng(1)
  n, params = 6, jnp.asarray(rng.uniform(0.5, 2.0, (8, 8, 3)), jnp.float32)
  for norm, budgets in (('linf', (4 / 255, 0.5)), ('l2', (0.3, 20.0))):
    fn = attacks.make(toy_distance, attacks.AttackOptions(norm, budgets[0], steps=7, method=method,
                                                          restarts=2 if method == 'pgd' else 1,
                                                          keep='max_loss' if norm == 'l2' else 'flipped'))
    for trial, eps in enumerate(budgets):
      ref = rng.uniform(0, 1, (n, 8, 8, 3)).astype(np.float32)
      ref[:, :2] = rng.integers(0, 2, (n, 2, 8, 3))           # saturated pixels: the clip must hold them in [0, 1]
      a, b = rng.uniform(0, 1, (2, n, 8, 8, 3)).astype(np.float32)
      x, success = fn(params, ref, a, b, rng.integers(0, 2, n), jax.random.PRNGKey(trial), eps)
      x = np.asarray(x)
      assert x.shape == ref.shape and x.dtype == np.float32 and np.asarray(success).shape == (n,)
      assert (_norms(x, ref, norm) <= eps * (1 + 1e-6) + 1e-6).all(), (norm, eps, _norms(x, ref, norm))
      assert x.min() >= 0.0 and x.max() <= 1.0


def _numpy_pgd_step(x_t, x, g, step, eps, norm):
  """One projected step written out pixel by pixel: x_t + step * dir(g), onto the eps-ball of x, then [0, 1]."""
  out = np.empty_like(x_t, np.float64)
  if norm == 'linf':
    for idx in np.ndindex(x.shape):
      v = x_t[idx] + step * np.sign(g[idx])
      v = min(max(v, x[idx] - eps), x[idx] + eps)
      out[idx] = min(max(v, 0.0), 1.0)
    return out
  gn = np.sqrt(sum(float(v) ** 2 for v in g.ravel()))
  z = {idx: x_t[idx] + step * g[idx] / (gn + 1e-12) for idx in np.ndindex(x.shape)}
  dn = np.sqrt(sum((z[idx] - x[idx]) ** 2 for idx in z))
  for idx in z:
    out[idx] = min(max(x[idx] + (z[idx] - x[idx]) / (dn + 1e-12) * min(eps, dn), 0.0), 1.0)
  return out


@pytest.mark.parametrize('norm,eps,step', [('linf', 8 / 255, 0.02), ('l2', 0.5, 0.4)])
def test_one_pgd_step_against_numpy(norm, eps, step):
  """project(x_t + step * direction(g)) equals the plain loop; the attack's single PGD step (no random start) on an
  item it flips returns exactly that point."""
  rng = np.random.default_rng(2)
  x = rng.uniform(0, 1, (5, 4, 3)).astype(np.float32)
  x_t = np.clip(x + rng.uniform(-eps, eps, x.shape), 0, 1).astype(np.float32)
  g = rng.normal(size=x.shape).astype(np.float32)
  ours = attacks.project(x_t + step * attacks.direction(g, norm), x, norm, eps)
  np.testing.assert_allclose(np.asarray(ours), _numpy_pgd_step(x_t, x, g, step, eps, norm), atol=2e-6)

  # the attack: ref = img0 exactly, img1 far; target 0 (img0): a big step always flips it
  params = jnp.ones((5, 4, 3), jnp.float32)
  ref, a = x[None], x[None]
  b = np.clip(x + 0.3, 0, 1)[None].astype(np.float32)
  opts = attacks.AttackOptions(norm, eps, steps=1, method='pgd', random_start=False, step_size=step)
  x_adv, success = attacks.make(toy_distance, opts)(params, ref, a, b, np.zeros(1), jax.random.PRNGKey(0))
  grad = jax.grad(lambda z: jax.nn.logsumexp(-toy_distance(params, jnp.stack([z, z]), jnp.concatenate([a, b])))
                  + toy_distance(params, z[None], a)[0])(jnp.asarray(x))
  expected = _numpy_pgd_step(x, x, np.asarray(grad), step, eps, norm)
  if bool(success[0]):
    np.testing.assert_allclose(np.asarray(x_adv[0]), expected, atol=2e-6)
  else:
    np.testing.assert_array_equal(np.asarray(x_adv[0]), x)   # not flipped: the start is returned


def test_apgd_schedule_is_the_authors_counter():
  """100 iterations: first check after 22 (0.22 n), then every k - 3 (0.03 n) down to 6 (0.06 n)."""
  check, ks = attacks.apgd_schedule(100)
  assert np.flatnonzero(check).tolist() == [21, 40, 56, 69, 79, 86, 92, 98]
  assert ks[check].tolist() == [22, 19, 16, 13, 10, 7, 6, 6]
  assert attacks.apgd_schedule(1)[0].tolist() == [True]


def test_budgets_and_options_refused_in_one_line():
  assert [(n, round(e, 6), s) for n, e, s in attacks.parse_budgets(' linf:4/255, l2:3 ')] == [
      ('linf', round(4 / 255, 6), 'linf:4/255'), ('l2', 3.0, 'l2:3')]
  assert attacks.parse_budgets('') == []
  for bad in ('linf', 'l1:3', 'linf:2', 'l2:-1', 'l2:a/b', 'linf:4/0'):
    with pytest.raises(UserError, match='config.attacks'):
      attacks.parse_budgets(bad)
  with pytest.raises(UserError, match='norm='):
    attacks.AttackOptions(norm='l1').check()
  with pytest.raises(UserError, match='steps='):
    attacks.AttackOptions(steps=0).check()


@pytest.fixture(scope='module')
def lpips_alex():
  return vj.load('lpips:alex', fetch=False)


def test_lpips_decisions_flip_where_the_attack_succeeds(lpips_alex):
  """Real LPIPS-alex weights, 2 items at 32 px: img0 a light, img1 a heavy distortion of ref, humans chose img0;
  APGD under Linf 8/255 flips LPIPS's answer on every item, and the returned images say so."""
  rng = np.random.default_rng(0)
  ref = rng.uniform(0, 1, (2, 32, 32, 3)).astype(np.float32)
  a = np.clip(ref + rng.normal(0, 0.03, ref.shape), 0, 1).astype(np.float32)
  b = np.clip(ref + rng.normal(0, 0.2, ref.shape), 0, 1).astype(np.float32)
  assert (lpips_alex.distance(ref, a) < lpips_alex.distance(ref, b)).all()       # clean: all correct
  x, success = vj.attack(lpips_alex, ref, a, b, np.zeros(2), norm='linf', eps=8 / 255, steps=4,
                         return_success=True)
  assert success.all()
  assert (_norms(x, ref, 'linf') <= 8 / 255 + 1e-6).all() and 0 <= x.min() and x.max() <= 1
  d0, d1 = lpips_alex.distance(x, a), lpips_alex.distance(x, b)
  np.testing.assert_array_equal(d0 >= d1, success)
  with pytest.raises(UserError, match='visim_jax.attack: target'):
    vj.attack(lpips_alex, ref, a, b, np.zeros(3))
