"""From a distance to a probability people would give: logistic calibration on human judgements (pure NumPy).

  JND (two images; BAPPS jnd/, "are these the same?"):   P(same | d) = sigmoid(a + b d)           (b < 0 expected)
  2AFC (a reference and two candidates; BAPPS 2afc/, NIGHTS): P(people pick x1 | d0, d1) = sigmoid(b (d0 - d1))
                                                          (no intercept: the order of x0 / x1 carries no information)

The targets are the fractions of people who answered so (soft labels, one weight per judged pair, or `votes` per
pair when given); the fit maximises the binomial log-likelihood sum_i n_i [y_i log p_i + (1 - y_i) log(1 - p_i)]
by Newton's method (IRLS) with a 1e-6 ridge. `bootstrap` refits on pairs resampled with replacement (percentile
interval); `reliability` bins predictions (equal width) and `calibration_error` is the n-weighted mean
|observed - predicted| over bins (expected calibration error).
"""
from __future__ import annotations

import numpy as np

RIDGE = 1e-6


def sigmoid(z):
  z = np.asarray(z, np.float64)
  return np.where(z >= 0, 1.0 / (1.0 + np.exp(-np.abs(z))), np.exp(-np.abs(z)) / (1.0 + np.exp(-np.abs(z))))


def design(kind: str, d0, d1=None) -> np.ndarray:
  """The regressors: JND [1, d]; 2AFC [d0 - d1]."""
  d0 = np.asarray(d0, np.float64)
  if kind == 'jnd':
    return np.stack([np.ones_like(d0), d0], -1)
  return (d0 - np.asarray(d1, np.float64))[:, None]


def fit(x: np.ndarray, y, n=None, iters: int = 100) -> np.ndarray:
  """Weighted logistic regression of fractions y in [0, 1] on regressors x (rows), weights n: the coefficients."""
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  n = np.ones_like(y) if n is None else np.asarray(n, np.float64)
  w = np.zeros(x.shape[1])
  for _ in range(iters):
    p = sigmoid(x @ w)
    grad = x.T @ (n * (y - p)) - RIDGE * w
    hess = (x * (n * p * (1 - p))[:, None]).T @ x + RIDGE * np.eye(len(w))
    step = np.linalg.solve(hess, grad)
    w = w + step
    if np.max(np.abs(step)) < 1e-10:
      break
  return w


def log_likelihood(x, y, n, w) -> float:
  """sum n [y log p + (1 - y) log(1 - p)] (nats)."""
  p = np.clip(sigmoid(np.asarray(x, np.float64) @ w), 1e-12, 1 - 1e-12)
  y = np.asarray(y, np.float64)
  n = np.ones_like(y) if n is None else np.asarray(n, np.float64)
  return float(np.sum(n * (y * np.log(p) + (1 - y) * np.log(1 - p))))


def bootstrap(x, y, n=None, rounds: int = 200, seed: int = 0, level: float = 0.95) -> np.ndarray:
  """(2, K) percentile interval of the coefficients over `rounds` refits on resampled pairs."""
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  n = np.ones_like(y) if n is None else np.asarray(n, np.float64)
  rng = np.random.default_rng(seed)
  ws = np.stack([fit(x[i], y[i], n[i]) for i in (rng.integers(0, len(y), len(y)) for _ in range(rounds))])
  lo = (1 - level) / 2
  return np.quantile(ws, [lo, 1 - lo], axis=0)


def reliability(p, y, n=None, bins: int = 10) -> dict:
  """Equal-width bins of predicted p: per bin the weight, mean predicted and mean observed (empty bins dropped)."""
  p, y = np.asarray(p, np.float64), np.asarray(y, np.float64)
  n = np.ones_like(y) if n is None else np.asarray(n, np.float64)
  idx = np.minimum((p * bins).astype(int), bins - 1)
  rows = {'weight': [], 'predicted': [], 'observed': []}
  for b in range(bins):
    k = idx == b
    if n[k].sum() > 0:
      rows['weight'].append(float(n[k].sum()))
      rows['predicted'].append(float(np.sum(n[k] * p[k]) / n[k].sum()))
      rows['observed'].append(float(np.sum(n[k] * y[k]) / n[k].sum()))
  return rows


def calibration_error(p, y, n=None, bins: int = 10) -> float:
  """Expected calibration error: the weight-averaged |observed - predicted| over reliability's bins."""
  r = reliability(p, y, n, bins)
  w = np.asarray(r['weight'])
  return float(np.sum(w * np.abs(np.asarray(r['observed']) - np.asarray(r['predicted']))) / w.sum()) if w.size else 0.0
