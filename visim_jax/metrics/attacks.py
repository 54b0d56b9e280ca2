"""Adversarial attacks on 2AFC judgements through any differentiable distance (issue 48; docs/robustness.md).

A 2AFC item is (ref, img0, img1, target): target = 1 when the humans chose img1 (the closer), 0 for img0. The
model answers with the logits (-d(ref, img0), -d(ref, img1)) of a pure `distance_fn(params, x0, x1) -> (N,)`
(a model's `apply_distance`: LPIPS, DreamSim, any cosine model), float NHWC images in [0, 1]. As Croce et al.
(SaTML 2025, fra31/perceptual-metrics: eval.py, attacks_clip.eval_loader, autopgd_train_clean.apgd_train) the
*reference* is perturbed, img0 and img1 stay clean, and the attack maximises the cross-entropy of those two logits
at the human label y (their default `--loss ce`; 'margin' is their binary margin, d(ref, img_y) - d(ref, other)):

  apgd   Croce & Hein (ICML 2020) APGD: step 2 eps (alpha = 2), momentum 0.75 after the first step, checkpoints
         every 0.22 n, shrinking by 0.03 n to at least 0.06 n; at a checkpoint where the loss rose on <= 75 % of
         the last k steps, or the best loss did not improve since the last checkpoint that did not halve, the
         step halves and the iterate restarts from the best point (its gradient with it)
  pgd    Madry et al. (2018): constant step (default 2.5 eps / steps), sign (Linf) / normalised (L2) gradient

Both start from a random point of the budget (authors' `--use_rs`: uniform in the Linf box, on the L2 sphere),
clipped to [0, 1]; each step is projected onto the budget and [0, 1] (L2: rescaled to norm <= eps, then clipped,
which only shortens it). The returned image is the authors' `x_best_adv`: the last iterate where the decision was
wrong, else the start (keep='max_loss': the iterate of the highest loss, the example adversarial training wants);
`success` says where the decision flipped (a tie d0 == d1 counts as answering img0, as
torch's max). Restarts keep the first run's images and replace those a later run flips. Everything runs every
step (no early stop: the authors stop a batch when all its items flipped; a flipped item stays flipped).

`make(distance_fn, opts)` returns a jitted (params, ref, img0, img1, target, key) -> (x_adv, success), vmapped
over the batch: each item has its own step size and checkpoints, as the authors' per-image tensors.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from visim_jax.core import cpu_kernels
from visim_jax.core.errors import UserError

NORMS = ('linf', 'l2')
METHODS = ('apgd', 'pgd')
LOSSES = ('ce', 'margin')
KEEPS = ('flipped', 'max_loss')


@dataclasses.dataclass(frozen=True)
class AttackOptions:
  norm: str = 'linf'            # 'linf' | 'l2' (on [0, 1] pixels of the whole (H, W, 3) image)
  eps: float = 4 / 255          # the paper's Linf 4/255; L2: 3 at 224 px
  steps: int = 100              # the authors' NIGHTS runs: APGD 100 iterations, 1 restart
  method: str = 'apgd'          # 'apgd' | 'pgd'
  loss: str = 'ce'              # 'ce' (authors' default) | 'margin'
  restarts: int = 1
  random_start: bool = True     # authors' --use_rs
  step_size: float = 0.0        # 0: apgd 2 eps (alpha = 2), pgd 2.5 eps / steps
  keep: str = 'flipped'         # 'flipped' (authors' x_best_adv) | 'max_loss' (the highest-loss iterate: training)

  def check(self, where: str = 'attack') -> 'AttackOptions':
    if self.norm not in NORMS:
      raise UserError(f"{where}: norm={self.norm!r}; one of {', '.join(NORMS)}")
    if self.method not in METHODS:
      raise UserError(f"{where}: method={self.method!r}; one of {', '.join(METHODS)}")
    if self.keep not in KEEPS:
      raise UserError(f"{where}: keep={self.keep!r}; one of {', '.join(KEEPS)}")
    if self.loss not in LOSSES:
      raise UserError(f"{where}: loss={self.loss!r}; one of {', '.join(LOSSES)}")
    if not np.isfinite(self.eps) or not 0 < self.eps <= (1.0 if self.norm == 'linf' else 1e4):
      raise UserError(f'{where}: eps={self.eps!r}; a positive budget (Linf <= 1 on [0, 1] pixels)')
    for f, lo in (('steps', 1), ('restarts', 1)):
      v = getattr(self, f)
      if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not lo <= v <= 100_000:
        raise UserError(f'{where}: {f}={v!r}; an integer in {lo}..100000')
    if not np.isfinite(self.step_size) or self.step_size < 0:
      raise UserError(f'{where}: step_size={self.step_size!r}; >= 0 (0: the method\'s default)')
    return self


def apgd_schedule(steps: int) -> tuple[np.ndarray, np.ndarray]:
  """(check, k) per iteration: whether APGD checks its step size after iteration i, and over how many steps
  (the authors' counter3 / k / size_decr / n_iter_min, a function of the number of steps only)."""
  n2, n_min, decr = max(int(0.22 * steps), 1), max(int(0.06 * steps), 1), max(int(0.03 * steps), 1)
  check, ks = np.zeros(steps, bool), np.zeros(steps, np.int32)
  k, counter = n2, 0
  for i in range(steps):
    counter += 1
    if counter == k:
      check[i], ks[i] = True, k
      counter, k = 0, max(k - decr, n_min)
  return check, ks


def project(x_adv, x, norm: str, eps: float):
  """The point of the budget ball around x (and of [0, 1]) the authors' step lands on: Linf clips each pixel to
  [x - eps, x + eps]; L2 rescales x_adv - x to norm min(eps, its norm); then both clip to [0, 1]."""
  if norm == 'linf':
    return jnp.clip(jnp.clip(x_adv, x - eps, x + eps), 0.0, 1.0)
  d = x_adv - x
  n = jnp.sqrt(jnp.sum(d * d))
  return jnp.clip(x + d / (n + 1e-12) * jnp.minimum(eps, n), 0.0, 1.0)


def direction(g, norm: str):
  """The ascent direction of a gradient: its sign (Linf) or g / ||g||_2 (L2)."""
  return jnp.sign(g) if norm == 'linf' else g / (jnp.sqrt(jnp.sum(g * g)) + 1e-12)


def _loss(logits, y, kind: str):
  other = logits[1 - y]
  if kind == 'margin':
    return other - logits[y]
  return jax.nn.logsumexp(logits) - logits[y]


def _start(x, key, opts: AttackOptions, eps):
  if not opts.random_start:
    return x
  if opts.norm == 'linf':
    t = jax.random.uniform(key, x.shape, x.dtype, -1.0, 1.0) * eps
  else:
    t = jax.random.normal(key, x.shape, x.dtype)
    t = t / (jnp.sqrt(jnp.sum(t * t)) + 1e-12) * eps
  return jnp.clip(x + t, 0.0, 1.0)


def _one(distance_fn: Callable, opts: AttackOptions, params, x, a, b, y, key, eps):
  """One item's attack (vmapped over the batch): (x_adv, success)."""
  def value(z):
    d = distance_fn(params, jnp.stack([z, z]), jnp.stack([a, b]))
    logits = -d
    return _loss(logits, y, opts.loss), logits

  grad_fn = jax.value_and_grad(value, has_aux=True)
  n = opts.steps
  x0 = _start(x, key, opts, eps)
  (loss0, logits0), g0 = grad_fn(x0)
  correct0 = jnp.argmax(logits0) == y
  if opts.method == 'pgd':
    step = opts.step_size or 2.5 * eps / n

    def body(_, s):
      z, g, acc, best_adv, x_best, loss_best = s
      z = project(z + step * direction(g, opts.norm), x, opts.norm, eps)
      (loss, logits), g = grad_fn(z)
      wrong = jnp.argmax(logits) != y
      better = loss > loss_best
      return (z, g, acc & ~wrong, jnp.where(wrong, z, best_adv), jnp.where(better, z, x_best),
              jnp.where(better, loss, loss_best))

    _, _, acc, best_adv, x_best, _ = jax.lax.fori_loop(0, n, body, (x0, g0, correct0, x0, x0, loss0))
    return (best_adv if opts.keep == 'flipped' else x_best), ~acc

  check_np, k_np = apgd_schedule(n)
  check, ks, cs = jnp.asarray(check_np), jnp.asarray(k_np), jnp.arange(n)
  step0 = jnp.asarray(opts.step_size or 2.0 * eps, x.dtype)

  def body(i, s):
    (z, z_old, g, step, acc, best_adv, x_best, g_best, loss_best, hist, reduced_last, loss_best_last) = s
    grad2 = z - z_old
    z_old = z
    m = jnp.where(i > 0, 0.75, 1.0)
    z1 = project(z + step * direction(g, opts.norm), x, opts.norm, eps)
    z = project(z + (z1 - z) * m + grad2 * (1 - m), x, opts.norm, eps)
    (loss, logits), g = grad_fn(z)
    wrong = jnp.argmax(logits) != y
    acc = acc & ~wrong
    best_adv = jnp.where(wrong, z, best_adv)
    hist = hist.at[i].set(loss)
    better = loss > loss_best
    x_best, g_best = jnp.where(better, z, x_best), jnp.where(better, g, g_best)
    loss_best = jnp.where(better, loss, loss_best)
    # the checkpoint: the loss rose on <= 75 % of the last k steps (indices wrap as the authors' tensor does)
    k = ks[i]
    rose = (hist[(i - cs) % n] > hist[(i - cs - 1) % n]) & (cs < k)
    osc = jnp.sum(rose) <= k * 0.75
    osc = osc | (~reduced_last & (loss_best_last >= loss_best))
    halve = check[i] & osc
    step = jnp.where(halve, step / 2.0, step)
    z, g = jnp.where(halve, x_best, z), jnp.where(halve, g_best, g)
    reduced_last = jnp.where(check[i], osc, reduced_last)
    loss_best_last = jnp.where(check[i], loss_best, loss_best_last)
    return (z, z_old, g, step, acc, best_adv, x_best, g_best, loss_best, hist, reduced_last, loss_best_last)

  init = (x0, x0, g0, step0, correct0, x0, x0, g0, loss0, jnp.zeros(n, loss0.dtype), jnp.asarray(True), loss0)
  out = jax.lax.fori_loop(0, n, body, init)
  return (out[5] if opts.keep == 'flipped' else out[6]), ~out[4]


def make(distance_fn: Callable, opts: AttackOptions) -> Callable:
  """`attack_fn` jitted (the library's and the benchmark's program)."""
  return cpu_kernels.jit(attack_fn(distance_fn, opts))


def attack_fn(distance_fn: Callable, opts: AttackOptions) -> Callable:
  """A pure (params, ref, img0, img1, target, key[, eps]) -> (x_adv (N, H, W, 3), success (N,) bool); ref, img0,
  img1 float NHWC in [0, 1], target (N,) in {0, 1} (or the human fraction for img1: > 0.5 is img1); eps (a traced
  scalar: one program for every budget of a norm) defaults to opts.eps, as the step size (0: 2 eps / 2.5 eps / n)."""
  opts.check()
  one = lambda params, x, a, b, y, key, eps: _one(distance_fn, opts, params, x, a, b, y, key, eps)
  batched = jax.vmap(one, in_axes=(None, 0, 0, 0, 0, 0, None))

  def run(params, ref, img0, img1, target, key, eps=None):
    eps = jnp.asarray(opts.eps if eps is None else eps, jnp.float32)
    ref, img0, img1 = (jnp.asarray(v, jnp.float32) for v in (ref, img0, img1))
    y = (jnp.asarray(target, jnp.float32) > 0.5).astype(jnp.int32)
    x_adv, success = None, None
    for r in range(opts.restarts):
      keys = jax.random.split(jax.random.fold_in(key, r), ref.shape[0])
      xr, sr = batched(params, ref, img0, img1, y, keys, eps)
      if x_adv is None:
        x_adv, success = xr, sr
      else:   # the authors' restarts: replace where the new run flipped the decision
        x_adv = jnp.where(sr[:, None, None, None], xr, x_adv)
        success = success | sr
    return x_adv, success

  return run


def parse_budgets(text: str, where: str = 'config.attacks') -> list[tuple[str, float, str]]:
  """'linf:4/255,l2:3' -> [('linf', 0.0157, 'linf:4/255'), ('l2', 3.0, 'l2:3')]; '' -> []."""
  out = []
  for item in (s.strip() for s in str(text).split(',')):
    if not item:
      continue
    norm, sep, value = item.partition(':')
    norm = norm.strip().lower()
    num, _, den = value.partition('/')
    try:
      eps = float(num) / (float(den) if den else 1.0)
    except (ValueError, ZeroDivisionError):
      eps = float('nan')
    if not sep or norm not in NORMS or not np.isfinite(eps) or eps <= 0 or (norm == 'linf' and eps > 1):
      raise UserError(f"{where}: {item!r}; expected <norm>:<eps> with norm linf or l2 and eps > 0 on [0, 1] "
                      "pixels, e.g. 'linf:4/255,l2:3'")
    out.append((norm, eps, f'{norm}:{value.strip()}'))
  return out
