"""vj.calibrate (zoo/calibrated.py, metrics/calibration.py): the logistic fit against plain loops, recovery of a
known curve, bootstrap, save / reload, 2AFC, the reliability plot and one-line refusals. Pixel L1 on tiny images."""
import numpy as np
import pytest

import visim_jax as vj
from visim_jax.core.errors import UserError
from visim_jax.metrics import calibration as cal_lib


def test_fit_solves_the_likelihood_equations_and_recovers_a_known_curve():
  rng = np.random.default_rng(0)
  d = rng.uniform(0, 1, 4000)
  y = (rng.uniform(size=d.size) < 1 / (1 + np.exp(-(2.0 - 6.0 * d)))).astype(float)
  x = cal_lib.design('jnd', d)
  w = cal_lib.fit(x, y)
  np.testing.assert_allclose(w, [2.0, -6.0], atol=0.4)
  # the score equations, as a plain loop: sum_i (y_i - p_i) x_i = 0 (up to the 1e-6 ridge)
  g = np.zeros(2)
  for xi, yi in zip(x, y):
    g += (yi - 1 / (1 + np.exp(-(xi @ w)))) * xi
  np.testing.assert_allclose(g, cal_lib.RIDGE * w, atol=1e-6)
  lo, hi = cal_lib.bootstrap(x, y, rounds=20)
  assert (lo <= w).all() and (w <= hi).all()
  p = cal_lib.sigmoid(x @ w)
  ece, tot = 0.0, 0
  for b in range(10):   # plain-loop expected calibration error
    k = [i for i in range(len(p)) if min(int(p[i] * 10), 9) == b]
    if k:
      ece += len(k) * abs(np.mean(y[k]) - np.mean(p[k]))
      tot += len(k)
  np.testing.assert_allclose(cal_lib.calibration_error(p, y), ece / tot, rtol=1e-9)


def test_calibrate_a_model_save_reload_and_plot(tmp_path):
  rng = np.random.default_rng(1)
  a = rng.integers(0, 256, (24, 16, 16, 3), dtype=np.uint8)
  noise = rng.normal(0, 1, a.shape) * np.linspace(0, 90, 24)[:, None, None, None]
  b = np.clip(a + noise, 0, 255).astype(np.uint8)
  model = vj.load('l1', fetch=False)
  d = model.distance(a, b)
  same = 1 / (1 + np.exp(-(3.0 - 40.0 * d)))
  cal = vj.calibrate(model, {'img0': a, 'img1': b, 'same': same}, bootstrap=10)
  assert cal.kind == 'jnd' and cal.coef[1] < 0 and cal.calibration_error < 0.05
  np.testing.assert_allclose(cal.probability_same(a, b), same, atol=0.02)
  cal.save(str(tmp_path / 'cal.json'))
  again = vj.load_calibration(str(tmp_path / 'cal.json'), model)
  assert again.coef == cal.coef and again.probability_same(a[0], b[0]) == pytest.approx(cal.probability_same(a[0], b[0]))
  vj.plot_calibration(cal, str(tmp_path / 'rel.png'))
  assert (tmp_path / 'rel.png').stat().st_size > 1000
  with pytest.raises(UserError, match='fitted for'):
    vj.load_calibration(str(tmp_path / 'cal.json'), vj.load('l2', fetch=False))
  # 2AFC: people prefer the candidate nearer the reference
  d0, d1 = model.distance(a[:12], b[:12]), model.distance(a[:12], b[12:])
  prefer1 = 1 / (1 + np.exp(-30.0 * (d0 - d1)))
  cal2 = vj.calibrate(model, {'ref': a[:12], 'img0': b[:12], 'img1': b[12:], 'prefer1': prefer1}, bootstrap=0)
  np.testing.assert_allclose(cal2.coef, [30.0], rtol=0.02)
  np.testing.assert_allclose(cal2.probability_closer(a[:12], b[:12], b[12:]), prefer1, atol=0.01)
  assert cal2.kind == '2afc'
  with pytest.raises(UserError, match='probability_closer'):
    cal2.probability_same(a, b)
  for bad in ({'img0': a}, {'img0': a[:2], 'img1': b[:2], 'same': [0.5, 2.0]}, [1, 2]):
    with pytest.raises(UserError, match='judgements'):
      vj.calibrate(model, bad)
