r"""Triplet learning: our sharded step program vs a PyTorch loop of the same head and loss; a 10M-triplet simulation.

  python benchmarks/learn_triplets.py --mode=compare               # interleaved timing, equal work checked equal
  python benchmarks/learn_triplets.py --mode=scale                 # 10M triplets on synthetic features: peak RSS,
                                                                   # per-epoch permutation and per-step time

compare: both sides train AligNet's head and loss from the same initial weights on the same batches: an affine head
D -> E on frozen features gathered by triplet rows (feats[tri[rows]]), raw dot-product pair similarities, JSD between
softmax(teacher sims) and softmax(s / tau), Adam (constant lr, no weight decay: torch.optim.Adam is then the same
update as optax's scale_by_adam + scale_by_learning_rate), `--steps` steps of batch `--batch`.
  ours       head_step.chunk_program: the steps in one jitted lax.scan (gather + head + loss + Adam)
  reference  what a competent PyTorch user writes: torch.nn.Linear, index gathers, F.softmax / log, the JSD written
             out, torch.optim.Adam, a Python loop over the steps; intra-op threads = CPUs
Before any timing the per-step losses of both sides are asserted equal (rtol 1e-4) and the final weights close.
The roofline is measured in the same interleaved rounds: the step's two matrix products alone (the head's forward
(3B, D) x (D, E) and its weight gradient (D, 3B) x (3B, E), --steps times) through XLA (a jitted scan) and through
torch; the faster is the box's SGEMM rate for this work, and each side's step is reported as a % of it.
scale: --triplets index rows (int32) and teacher similarities (float32) over --images x --dim synthetic features,
the memory estimate of triplet_index.memory_bytes beside the measured peak RSS, the time of one epoch permutation,
and the median time of a step over --chunks chunks of --chunk_steps steps (compile apart).
Prints one JSON object.
"""
from __future__ import annotations

import json
import os
import resource
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

import interleaved  # noqa: E402
import precision  # noqa: E402
from visim_jax.core import cpu_kernels  # noqa: E402
from visim_jax.core import sharding  # noqa: E402
from visim_jax.data import teacher_labels, triplet_index
from visim_jax.training import head_step  # noqa: E402

precision.define_flag()
_MODE = flags.DEFINE_enum('mode', 'compare', ['compare', 'scale'], 'What to measure (see the docstring).')
_IMAGES = flags.DEFINE_integer('images', 20_000, 'Rows of the feature table.')
_DIM = flags.DEFINE_integer('dim', 768, 'Feature size D (ViT-B/16 pre-logits: 768).')
_EMB = flags.DEFINE_integer('emb', 1024, 'Head output size E (AligNet: 1024).')
_BATCH = flags.DEFINE_integer('batch', 512, 'Triplets per step (AligNet: 512).')
_STEPS = flags.DEFINE_integer('steps', 50, 'compare: steps per timed call.')
_TRIPLETS = flags.DEFINE_integer('triplets', 200_000, 'Train triplets (scale: 10,000,000).')
_ALT = flags.DEFINE_integer('alternations', 3, 'compare: timed (ours, reference) pairs, order flipped each time.')
_CHUNKS = flags.DEFINE_integer('chunks', 5, 'scale: timed chunks.')
_CHUNK_STEPS = flags.DEFINE_integer('chunk_steps', 50, 'scale: steps per chunk.')


def hparams(steps: int) -> head_step.Hparams:
  return head_step.Hparams(head='affine', size=_EMB.value, loss='jsd', similarity='dot', tau=100.0, lr=1e-3,
                    warmup_steps=0, schedule='constant', steps=steps, weight_decay=0.0, batch_size=_BATCH.value)


def make_data(n_images: int, dim: int, n_triplets: int, seed: int = 0):
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((n_images, dim), dtype=np.float32)
  tri = np.empty((n_triplets, 3), np.int32)
  block = 1 << 22
  for s in range(0, n_triplets, block):     # three distinct images per row, in blocks (bounded temporaries)
    n = min(block, n_triplets - s)
    tri[s:s + n] = np.stack(teacher_labels.distinct(rng, np.full(n, n_images), 3), 1)
  sims = rng.standard_normal((n_triplets, 3), dtype=np.float32)
  return x, tri, sims


def torch_reference(hp: head_step.Hparams, x, tri, sims, rows, w0, b0):
  """A PyTorch training loop of the same head and loss; returns (run(), losses of the last run, final weight)."""
  import torch
  import torch.nn.functional as F
  torch.set_num_threads(os.cpu_count() or 1)
  dev = 'cuda' if torch.cuda.is_available() else 'cpu'   # the same device as ours (run_all --gpu)
  xt, trit, st = (torch.from_numpy(a).to(dev) for a in (x, tri.astype(np.int64), sims))
  rows_t = torch.from_numpy(rows.astype(np.int64)).to(dev)
  out = {}

  def kl(p, q):
    return (p * (torch.log(p) - torch.log(q))).sum(-1)

  def run():
    head = torch.nn.Linear(x.shape[1], hp.size).to(dev)
    with torch.no_grad():
      head.weight.copy_(torch.from_numpy(np.ascontiguousarray(w0.T)).to(dev))
      head.bias.copy_(torch.from_numpy(b0).to(dev))
    opt = torch.optim.Adam(head.parameters(), lr=hp.lr, betas=(hp.b1, hp.b2), eps=1e-8)
    losses = []
    for r in rows_t:
      t = trit[r]
      e = head(xt[t])                                             # (B, 3, E)
      s = torch.stack([(e[:, 0] * e[:, 1]).sum(-1), (e[:, 0] * e[:, 2]).sum(-1), (e[:, 1] * e[:, 2]).sum(-1)], -1)
      p, q = F.softmax(st[r], -1), F.softmax(s / hp.tau, -1)
      m = (p + q) / 2
      loss = ((kl(p, m) + kl(q, m)) / 2).mean()
      opt.zero_grad(set_to_none=True)
      loss.backward()
      opt.step()
      losses.append(loss.detach())
    out['loss'] = torch.stack(losses).cpu().numpy()    # waits for the device
    out['w'] = head.weight.detach().cpu().numpy().T
    return out['loss']
  return run, out


def sgemm_sides(steps: int, rows: int, dim: int, emb: int) -> dict:
  """{'sgemm_xla', 'sgemm_torch'}: callables doing a step's two matrix products `steps` times (the roofline)."""
  import torch
  rng = np.random.default_rng(1)
  x, w, g = (rng.standard_normal(s, dtype=np.float32) for s in ((rows, dim), (dim, emb), (rows, emb)))

  def chain(x, w, g):
    def body(c, _):
      xc = x + c                                  # depends on the carry: nothing is hoisted out of the loop
      return c + 1e-30 * (jnp.sum(xc @ w) + jnp.sum(xc.T @ g)), None
    return jax.lax.scan(body, jnp.float32(0), None, length=steps)[0]
  chain = cpu_kernels.jit(chain)
  xj, wj, gj = (jnp.asarray(a) for a in (x, w, g))
  dev = 'cuda' if torch.cuda.is_available() else 'cpu'
  xt, wt, gt = (torch.from_numpy(a).to(dev) for a in (x, w, g))

  def torch_chain():
    c = torch.zeros((), device=dev)
    for _ in range(steps):
      xc = xt + c
      c = c + 1e-30 * ((xc @ wt).sum() + (xc.T @ gt).sum())
    return float(c)
  return {'sgemm_xla': lambda: float(chain(xj, wj, gj)), 'sgemm_torch': torch_chain}


def compare() -> dict:
  prec = precision.apply()
  hp = hparams(_STEPS.value)
  x, tri, sims = make_data(_IMAGES.value, _DIM.value, _TRIPLETS.value)
  rows = triplet_index.Stream(len(tri), hp.batch_size, 0).rows(0, hp.steps)
  mesh = sharding.make_mesh('batch')
  rep = sharding.replicated(mesh)
  data = head_step.Data(*(sharding.to_global(a, rep) for a in (x, tri, sims)))
  rows_j = sharding.to_global(rows, head_step.rows_sharding(mesh))
  program = head_step.chunk_program(hp, mesh)
  state0 = jax.device_put(head_step.init_state(hp, x.shape[1]), rep)
  w0, b0 = np.asarray(state0.params['w']), np.asarray(state0.params['b'])
  ours_out = {}

  def ours():
    state, loss = program(state0, data, rows_j)
    ours_out['loss'], ours_out['w'] = np.asarray(loss), np.asarray(state.params['w'])
    return ours_out['loss']
  ref, ref_out = torch_reference(hp, x, tri, sims, rows, w0, b0)
  ours()
  ref()
  np.testing.assert_allclose(ours_out['loss'], ref_out['loss'], rtol=1e-4, atol=1e-7)
  np.testing.assert_allclose(ours_out['w'], ref_out['w'], rtol=1e-3, atol=1e-5)
  sides = {'ours': ours, 'reference': ref, **sgemm_sides(hp.steps, 3 * hp.batch_size, x.shape[1], hp.size)}
  sides['sgemm_xla'](), sides['sgemm_torch']()   # compile / warm up (ours and the reference ran above)
  times = interleaved.interleaved(sides, _ALT.value, warmup=False)
  stats = interleaved.compare(times['ours'], times['reference'], work=hp.steps * hp.batch_size, unit='triplets')
  gflop = 2 * 2 * 3 * hp.batch_size * x.shape[1] * hp.size * hp.steps / 1e9
  rate = {k: gflop / float(np.median(times[k])) for k in times}
  roof = max(rate['sgemm_xla'], rate['sgemm_torch'])
  roofline = {'matmul_gflop': gflop, 'gflop_per_s': rate, 'sgemm_gflop_per_s': roof,
              'ours_pct': 100 * rate['ours'] / roof, 'reference_pct': 100 * rate['reference'] / roof}
  row = interleaved.row('triplet step (gather + affine + JSD + Adam)', stats, 'ours: jitted scan', 'PyTorch loop',
                        'triplets')
  row['ours'] += f' ({roofline["ours_pct"]:.0f}% of the SGEMM roofline, {roof:.0f} GFLOP/s)'
  row['reference'] += f' ({roofline["reference_pct"]:.0f}%)'
  return {'mode': 'compare', 'devices': jax.device_count(), 'backend': jax.default_backend(), 'precision': prec,
          'sizes': {'images': _IMAGES.value, 'dim': _DIM.value, 'emb': _EMB.value, 'batch': hp.batch_size,
                    'steps': hp.steps, 'triplets': _TRIPLETS.value},
          'equal_work': 'per-step losses equal (rtol 1e-4), final weights close (rtol 1e-3)', **stats,
          'roofline': roofline, 'rows': [row]}


def _rss_mib() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def scale() -> dict:
  n, b, k = _TRIPLETS.value, _BATCH.value, _CHUNK_STEPS.value
  hp = hparams(k)
  out = {'mode': 'scale', 'devices': jax.device_count(), 'backend': jax.default_backend(),
         'sizes': {'images': _IMAGES.value, 'dim': _DIM.value, 'emb': _EMB.value, 'batch': b, 'triplets': n,
                   'chunk_steps': k},
         'rss_mib': {'start': _rss_mib()}}
  est = triplet_index.memory_bytes(n, 0, _IMAGES.value, _DIM.value, _EMB.value, b, k, 3, jax.device_count())
  out['memory_estimate_mib'] = {w: v / 2**20 for w, v in est.items()}
  t = time.perf_counter()
  x, tri, sims = make_data(_IMAGES.value, _DIM.value, n)
  out['make_triplets_s'] = time.perf_counter() - t
  out['rss_mib']['data'] = _rss_mib()
  stream = triplet_index.Stream(n, b, 0)
  t = time.perf_counter()
  stream.rows(0, 1)
  out['epoch_permutation_s'] = time.perf_counter() - t
  mesh = sharding.make_mesh('batch')
  rep = sharding.replicated(mesh)
  data = head_step.Data(*(sharding.to_global(a, rep) for a in (x, tri, sims)))
  del x, tri, sims
  program = head_step.chunk_program(hp, mesh)
  state = jax.device_put(head_step.init_state(hp, _DIM.value), rep)
  rows_sh = head_step.rows_sharding(mesh)
  t = time.perf_counter()
  state, loss = program(state, data, sharding.to_global(stream.rows(0, k), rows_sh))
  jax.block_until_ready(loss)
  out['first_chunk_s_with_compile'] = time.perf_counter() - t
  per_step = []
  for c in range(1, _CHUNKS.value + 1):
    rows = sharding.to_global(stream.rows(c * k, k), rows_sh)
    t = time.perf_counter()
    state, loss = program(state, data, rows)
    jax.block_until_ready(loss)
    per_step.append((time.perf_counter() - t) / k)
  out['step_s'] = {'median': float(np.median(per_step)), 'min': float(np.min(per_step)),
                   'max': float(np.max(per_step))}
  out['triplets_per_s'] = b / out['step_s']['median']
  out['rss_mib']['peak'] = _rss_mib()
  out['load_average'] = interleaved.load_average()
  steps_epoch = n // b
  out['epoch_s_estimate'] = steps_epoch * out['step_s']['median'] + out['epoch_permutation_s']
  return out


def main(argv):
  del argv
  res = compare() if _MODE.value == 'compare' else scale()
  print(json.dumps(res, indent=1, default=float))


if __name__ == '__main__':
  from visim_jax.core import errors  # pylint: disable=g-import-not-at-top
  app.run(main, flags_parser=errors.flags_parser)   # one-line flag errors; --help exits 0
