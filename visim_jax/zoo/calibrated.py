"""A model's distances turned into probabilities people would give (`vj.calibrate`; docs/library.md "Calibrated
answers"): the host side of metrics/calibration.py (the logistic fit, bootstrap, reliability) on a loaded model.

  cal = vj.calibrate(model, judgements)        JND: BAPPS's load_jnd_set(...) or {'img0', 'img1', 'same'[, 'votes']}
                                              2AFC: load_2afc_set(...) or {'ref', 'img0', 'img1', 'prefer1'[, 'votes']}
  cal.probability_same(a, b)                  JND fits: P(people call a and b the same)
  cal.probability_closer(ref, a, b)           2AFC fits: P(people judge b closer to ref than a)
  cal.save('cal.json'); vj.load_calibration('cal.json', model)
  vj.plot_calibration(cal, 'reliability.png')  predicted vs observed per bin (plots/calibration.py)

Nothing ships pre-fitted: a calibration is only as good as the judgements it was fitted on (and the model spec,
image size and resizing it was fitted with: the file records them and `load_calibration` refuses another spec).
"""
from __future__ import annotations

import dataclasses
import json

import numpy as np

from visim_jax.core.errors import UserError
from visim_jax.metrics import calibration as cal_lib

WHERE = 'visim_jax.calibrate'
VERSION = 1


@dataclasses.dataclass
class Calibration:
  spec: str
  kind: str                     # 'jnd' | '2afc'
  coef: list                    # jnd: [a, b] of sigmoid(a + b d); 2afc: [b] of sigmoid(b (d0 - d1))
  interval: list                # (2, K): the bootstrap percentile interval of coef
  log_likelihood: float
  calibration_error: float
  reliability: dict
  data: dict                    # the fit data: d0 [, d1], y, votes
  model: object = None

  def probability(self, d0, d1=None) -> np.ndarray:
    """The fitted probability from distances (jnd: d0 = d(a, b); 2afc: d0 = d(ref, x0), d1 = d(ref, x1))."""
    x = cal_lib.design(self.kind, np.atleast_1d(d0), None if d1 is None else np.atleast_1d(d1))
    return cal_lib.sigmoid(x @ np.asarray(self.coef)).astype(np.float32)

  def _model(self):
    if self.model is None:
      raise UserError(f'{WHERE}: no model attached; vj.load_calibration(path, vj.load({self.spec!r}))')
    return self.model

  def probability_same(self, a, b):
    """P(people call a and b the same image) (JND fits)."""
    if self.kind != 'jnd':
      raise UserError(f'{WHERE}: this calibration was fitted on 2AFC judgements; use probability_closer(ref, a, b)')
    d = self._model().distance(a, b)
    p = self.probability(d)
    return float(p[0]) if np.ndim(d) == 0 else p

  def probability_closer(self, ref, a, b):
    """P(people judge b closer to ref than a) (2AFC fits)."""
    if self.kind != '2afc':
      raise UserError(f'{WHERE}: this calibration was fitted on JND judgements; use probability_same(a, b)')
    m = self._model()
    d0, d1 = m.distance(ref, a), m.distance(ref, b)
    p = self.probability(d0, d1)
    return float(p[0]) if np.ndim(d0) == 0 else p

  def to_json(self) -> dict:
    return {'version': VERSION, **{f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != 'model'}}

  def save(self, path: str) -> None:
    from visim_jax.core import ops  # pylint: disable=g-import-not-at-top
    ops.atomic_write_bytes(path, json.dumps(self.to_json(), indent=1).encode())


def load_calibration(path: str, model=None) -> Calibration:
  """A saved calibration (`save`), attached to `model` (its spec must be the one fitted)."""
  try:
    with open(path, encoding='utf-8') as f:
      raw = json.load(f)
    fields = {f.name for f in dataclasses.fields(Calibration)} - {'model'}
    if raw.pop('version', None) != VERSION or set(raw) != fields:
      raise ValueError('not a visim_jax calibration file')
    cal = Calibration(**raw)
  except (OSError, ValueError, TypeError) as e:
    raise UserError(f'{path}: cannot read a calibration ({e})') from None
  if model is not None and getattr(model, 'spec', None) != cal.spec:
    raise UserError(f'{path}: fitted for {cal.spec!r}, not {getattr(model, "spec", model)!r}')
  cal.model = model
  return cal


def _judgements(j) -> tuple[str, dict]:
  """('jnd' | '2afc', {'ref'?, 'img0', 'img1', 'y', 'votes'}) from a BAPPS set or a dict (module docstring)."""
  if hasattr(j, 'same') and hasattr(j, 'p0'):
    j = {'img0': j.p0, 'img1': j.p1, 'same': j.same}
  elif hasattr(j, 'judge') and hasattr(j, 'ref'):
    j = {'ref': j.ref, 'img0': j.p0, 'img1': j.p1, 'prefer1': j.judge}
  if not isinstance(j, dict):
    raise UserError(f"{WHERE}: judgements: a BAPPS set (data/bapps.py) or a dict with 'img0', 'img1', 'same' (JND) "
                    f"or 'ref', 'img0', 'img1', 'prefer1' (2AFC), got {type(j).__name__}")
  kind = 'jnd' if 'same' in j else '2afc' if 'prefer1' in j and 'ref' in j else None
  if kind is None:
    raise UserError(f"{WHERE}: judgements: keys {sorted(j)}; JND needs 'img0', 'img1', 'same', 2AFC 'ref', 'img0', "
                    "'img1', 'prefer1'")
  y = np.asarray(j['same' if kind == 'jnd' else 'prefer1'], np.float64).reshape(-1)
  n = len(y)
  if n < 4 or not np.all((y >= 0) & (y <= 1)):
    raise UserError(f'{WHERE}: judgements: {n} fractions; give at least 4, each in [0, 1] (the share of people who '
                    'answered so)')
  votes = np.asarray(j.get('votes', np.ones(n)), np.float64).reshape(-1)
  if len(votes) != n or np.any(votes <= 0):
    raise UserError(f'{WHERE}: judgements: votes must be {n} positive counts')
  out = {'img0': j['img0'], 'img1': j['img1'], 'y': y, 'votes': votes}
  if kind == '2afc':
    out['ref'] = j['ref']
  return kind, out


def calibrate(model, judgements, *, bootstrap: int = 200, seed: int = 0, bins: int = 10) -> Calibration:
  """Fits the model's distances to the judgements (module docstring)."""
  kind, j = _judgements(judgements)
  if isinstance(bootstrap, bool) or not isinstance(bootstrap, int) or bootstrap < 0:
    raise UserError(f'{WHERE}: bootstrap={bootstrap!r}; a number of refits >= 0')
  if kind == 'jnd':
    d0, d1 = np.asarray(model.distance(j['img0'], j['img1']), np.float64).reshape(-1), None
  else:
    d0 = np.asarray(model.distance(j['ref'], j['img0']), np.float64).reshape(-1)
    d1 = np.asarray(model.distance(j['ref'], j['img1']), np.float64).reshape(-1)
  if len(d0) != len(j['y']):
    raise UserError(f'{WHERE}: judgements: {len(d0)} pairs but {len(j["y"])} fractions')
  x = cal_lib.design(kind, d0, d1)
  w = cal_lib.fit(x, j['y'], j['votes'])
  interval = cal_lib.bootstrap(x, j['y'], j['votes'], bootstrap, seed) if bootstrap else np.stack([w, w])
  p = cal_lib.sigmoid(x @ w)
  data = {'d0': d0.tolist(), 'y': j['y'].tolist(), 'votes': j['votes'].tolist()}
  if d1 is not None:
    data['d1'] = d1.tolist()
  return Calibration(model.spec, kind, w.tolist(), interval.tolist(), cal_lib.log_likelihood(x, j['y'], j['votes'], w),
                     cal_lib.calibration_error(p, j['y'], j['votes'], bins),
                     cal_lib.reliability(p, j['y'], j['votes'], bins), data, model)
