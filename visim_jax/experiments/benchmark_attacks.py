"""The leaderboard's robustness columns (issue 48; docs/robustness.md): each 2AFC set attacked through the model.

config.attacks = 'linf:4/255,l2:3' adds, beside every 2AFC protocol the config gives (NIGHTS, BAPPS 2AFC), one
protocol per budget, `<protocol>@<norm>:<eps>` (e.g. `nights@linf:4/255`), with the same subsets (splits, sets):
each item's reference is attacked (metrics/attacks.py: config.attack_method 'apgd' | 'pgd', config.attack_steps,
config.attack_restarts; the cross-entropy of (-d0, -d1) at the human majority, as Croce et al.'s NIGHTS
evaluation), then d0 = d(ref_adv, p0), d1 = d(ref_adv, p1) are scored as the clean column (human.twoafc_interval:
the same bootstrap interval; per-item data, so the paired rank tests rank the models within the column).
A model without a pixel path (zoo/pixels.py: features read from elsewhere) gets a degenerate cell naming why: listed,
not scored. The images are the ones the clean column reads (LPIPS and the metrics: the protocol resolution; embedding
models: their own decode, resize and crop), as floats in [0, 1]; the attacked images are never rounded to uint8.
"""
from __future__ import annotations

import dataclasses

import jax
import numpy as np

from visim_jax.core import cpu_kernels
from visim_jax.core.errors import UserError
from visim_jax.experiments import checks
from visim_jax.experiments.benchmark_tasks import Task
from visim_jax.metrics import attacks, degenerate
from visim_jax.zoo import scoring
from visim_jax.zoo.pixels import pixel_distance

ATTACKED = ('nights', 'bapps_2afc')
FIELDS = ('attacks', 'attack_steps', 'attack_method', 'attack_restarts', 'attack_batch_size')


@dataclasses.dataclass(frozen=True)
class Plan:
  budgets: tuple          # ((norm, eps, label), ...)
  steps: int = 100
  method: str = 'apgd'
  restarts: int = 1
  batch: int = 16
  seed: int = 0

  def options(self, norm: str, eps: float) -> attacks.AttackOptions:
    return attacks.AttackOptions(norm, eps, self.steps, self.method, restarts=self.restarts).check('config.attacks')


def label(norm: str, eps: float) -> str:
  """A budget's column name: Linf in 255ths when it is one ('linf:4/255'), else the number ('l2:3')."""
  k = eps * 255
  if norm == 'linf' and abs(k - round(k, 3)) < 1e-9:
    return f'linf:{round(k, 3):g}/255'
  return f'{norm}:{eps:g}'


def parse(config) -> Plan | None:
  """config.attacks and its fields -> a Plan (None: no attacks); every field checked, naming it."""
  checks.text(config, 'attacks')
  checks.integer(config, 'attack_steps', 1, 100_000, note=' (the authors: 100)')
  checks.integer(config, 'attack_restarts', 1, 1000)
  checks.integer(config, 'attack_batch_size', 1, 1 << 16)
  checks.choice(config, 'attack_method', attacks.METHODS)
  budgets = tuple((n, e, label(n, e)) for n, e, _ in attacks.parse_budgets(config.attacks))
  if not budgets:
    return None
  return Plan(budgets, int(config.attack_steps), config.attack_method, int(config.attack_restarts),
              int(config.attack_batch_size), int(config.seed))


def add(protocols: dict, plan: Plan | None) -> dict:
  """protocols + one attacked protocol per (2AFC protocol, budget), in that order."""
  if plan is None:
    return protocols
  if not any(p in protocols for p in ATTACKED):
    raise UserError(f'config.attacks: attacks 2AFC judgements ({", ".join(ATTACKED)}): give config.nights_dir or '
                    'config.bapps_dir (or run the :demo / :local sets), or leave config.attacks empty')
  out = {}
  for p, tasks in protocols.items():   # each attacked column group right after its clean one
    out[p] = tasks
    for norm, eps, lab in plan.budgets if p in ATTACKED else ():
      out[f'{p}@{lab}'] = [attacked_task(t, plan, norm, eps, lab) for t in tasks]
  return out


_PROGRAMS = {}


def _program(sim, opts: attacks.AttackOptions):
  """(jitted attack, jitted distance, params) per model and attack (eps traced: one program for every budget).

  Keyed by the model object: the entry holds the model itself, so its id is not reused while the entry lives.
  """
  key = (id(sim), dataclasses.replace(opts, eps=1.0))
  if key not in _PROGRAMS or _PROGRAMS[key][0] is not sim:
    pix = pixel_distance(sim)
    if isinstance(pix, str):
      _PROGRAMS[key] = (sim, pix)
    else:
      fn, params = pix
      _PROGRAMS[key] = (sim, (attacks.make(fn, opts), cpu_kernels.jit(fn), params))
  return _PROGRAMS[key][1]


def attacked_task(task: Task, plan: Plan, norm: str, eps: float, lab: str) -> Task:
  ref, p0, p1, judge = task.triplets
  opts = plan.options(norm, eps)

  def score(sim, feats, sopts):
    from visim_jax.metrics import human
    prog = _program(sim, opts)
    if isinstance(prog, str):
      return {task.subset: degenerate.result(prog, 0)}
    attack, dist, params = prog
    table = feats if isinstance(feats, scoring.ImageTable) else scoring.ImageTable(tuple(task.paths), sim.preprocess)
    n, b = len(ref), plan.batch
    d0, d1 = np.zeros(n, np.float32), np.zeros(n, np.float32)
    for s in range(0, n, b):
      idx = np.arange(s, min(s + b, n))
      pad = np.concatenate([idx, np.full(b - len(idx), idx[-1])])   # one program for every batch
      x, a, c = (table.take(rows[pad]).astype(np.float32) / np.float32(255.0) for rows in (ref, p0, p1))
      key = jax.random.fold_in(jax.random.PRNGKey(plan.seed), s)
      x_adv, _ = attack(params, x, a, c, judge[pad], key, eps)
      d0[idx] = np.asarray(dist(params, x_adv, a))[:len(idx)]
      d1[idx] = np.asarray(dist(params, x_adv, c))[:len(idx)]
    return {task.subset: {**human.twoafc_interval(d0, d1, judge, n_resamples=sopts.n_boot, alpha=sopts.alpha,
                                                  seed=sopts.seed),
                          'items': {'kind': '2afc', 'd0': d0.tolist(), 'd1': d1.tolist(),
                                    'judge': np.asarray(judge, float).tolist()}}}
  return Task(f'{task.protocol}@{lab}', task.subset, task.paths,
              list(task.arrays) + [np.asarray([eps], np.float64)], score)
