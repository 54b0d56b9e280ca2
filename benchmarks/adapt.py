r"""Adaptation training: our one jitted program (every run at every sigma) vs a batched PyTorch program.

  python benchmarks/adapt.py --preset=small      # 600 train / 200 test pairs, 2 runs, sigmas 1,15, 10 epochs
  python benchmarks/adapt.py --preset=tll_step   # TLL sizes per step (3,149 train / 1,050 test pairs), 1 run,
                                                 # sigmas 1,15, 3 epochs: the TLL-size ratio on a 2-core CPU
  python benchmarks/adapt.py --preset=tll        # the whole TLL protocol: 20 runs x sigmas 1,15 x 150 epochs
                                                 # (GPU-sized: 1,000x tll_step's work, hours on 2 cores)

Both sides do the same work from the same initial weights and data: PCA-256 features of the pairs and of
their mirrored images (two views), W 256 -> 1024 + ReLU, the symmetric softmax cross-entropy at each sigma
(Eq. 1), full-batch Adam, and after every epoch the best-partner ranks of the test pairs (a rank is a count of
larger scores) kept for every epoch.
  ours       adaptation_runs.train_chunk (runs and sigmas vmapped, epochs in lax.scan), jitted; compile time apart
  reference  what a competent PyTorch user writes: one weight tensor (runs x sigmas, 256, 1024), torch.bmm
             over that batch, both cross-entropies by F.cross_entropy on the (batch, N, N) logits, one
             torch.optim.Adam on the batch, the ranks under torch.inference_mode; intra-op threads = CPUs
Timed interleaved (ours, reference, reference, ours, ...), --alternations pairs. Before any timing both sides'
numbers are checked to agree as two correct float32 programs do (`check_agreement`): the loss of every epoch
(rtol LOSS_RTOL), the test ranks of the first RANK_EPOCHS epochs (99% within 2: rounding reorders near-ties of
random features) and the last epoch's aR@1,5,20 (within AR_TOL). The last epoch's ranks are not compared one by
one: over 150 epochs the two trajectories' roundings diverge (training is chaotic at this scale), so individual
ranks differ while the losses and the recall curve agree (on an H100 only 12% of the last-epoch ranks agreed within
2 while every loss agreed to 2e-4). The precision of both sides is set explicitly (benchmarks/precision.py,
--precision or $VISIM_BENCH_PRECISION) and recorded. Prints progress on stderr and one JSON object.
"""
from __future__ import annotations

import json
import os
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
from visim_jax.training import adaptation_runs  # noqa: E402

PRESETS = {'small': dict(n_train=600, n_test=200, runs=2, epochs=10),
           'tll_step': dict(n_train=3149, n_test=1050, runs=1, epochs=3),
           'tll': dict(n_train=3149, n_test=1050, runs=20, epochs=150)}

_PRESET = flags.DEFINE_enum('preset', 'small', list(PRESETS), 'Sizes (see the docstring).')
_SIGMAS = flags.DEFINE_list('sigmas', ['1', '15'], 'Temperatures trained in one program (Table 1: 1,15).')
_FLIP = flags.DEFINE_bool('flip', True, 'Two training views (pairs + mirrored pairs), as the reference code.')
_ALT = flags.DEFINE_integer('alternations', 3, 'Timed (ours, reference) pairs, order flipped each time.')
_RUNS = flags.DEFINE_integer('runs', 0, 'Override the preset\'s runs (0: keep).')
_EPOCHS = flags.DEFINE_integer('epochs', 0, 'Override the preset\'s epochs (0: keep).')
_N = flags.DEFINE_list('pairs', [], 'Override the preset\'s train,test pair counts, e.g. 1500,500.')
precision.define_flag()
LOSS_RTOL, RANK_EPOCHS, AR_TOL = 1e-3, 3, 0.01


def check_agreement(ours, ref) -> dict:
  """Asserts what two correct float32 programs share; returns the measured differences. Each side is (loss (R, S,
  E), ranks of the first RANK_EPOCHS epochs (R, S, K, n_test), ranks of the last epoch (R, S, n_test))."""
  (lo, fo, ro), (lr_, fr, rr) = ours, ref
  np.testing.assert_allclose(lo, lr_, rtol=LOSS_RTOL, atol=1e-5, err_msg='per-epoch losses differ')
  close_first = float((np.abs(fo - fr) <= 2).mean())
  assert close_first > 0.99, f'only {close_first:.4f} of the first {fo.shape[2]} epochs\' test ranks agree within 2'
  ar = {k: (float((ro <= k).mean()), float((rr <= k).mean())) for k in (1, 5, 20)}
  assert all(abs(a - b) <= AR_TOL for a, b in ar.values()), f'last-epoch aR@k differ by more than {AR_TOL}: {ar}'
  return {'max_loss_rel_diff': float(np.max(np.abs(lo - lr_) / np.abs(lr_))),
          'first_epochs_ranks_within_2_share': close_first,
          'last_epoch_ranks_equal_share': float((ro == rr).mean()),
          'last_epoch_aR@k_ours_reference': ar,
          'tolerances': {'loss_rtol': LOSS_RTOL, 'rank_epochs': int(fo.shape[2]), 'ranks_within_2_share': 0.99,
                         'aR@k_abs': AR_TOL}}


def make_inputs(p: dict, hp: adaptation_runs.Hparams, views: int):
  rng = np.random.RandomState(0)
  data = adaptation_runs.RunData(
      train_views=jnp.asarray(rng.randn(hp.runs, views, 2, p['n_train'], hp.pca_dim).astype(np.float32)),
      test=jnp.asarray(rng.randn(hp.runs, 2, p['n_test'], hp.pca_dim).astype(np.float32)))
  return data, adaptation_runs.init_state(hp)


def torch_program(hp: adaptation_runs.Hparams, w0: np.ndarray, data: adaptation_runs.RunData):
  """The PyTorch version: returns run() -> (loss (R, S, E), test ranks of the last epoch (R, S, n_test))."""
  import torch
  f = torch.nn.functional
  r, s = len(w0), len(hp.sigmas)
  b = r * s
  dev = 'cuda' if torch.cuda.is_available() else 'cpu'
  tv = torch.from_numpy(np.array(data.train_views)).to(dev)      # (R, V, 2, N, P)
  v, n, p = tv.shape[1], tv.shape[3], tv.shape[4]
  x = tv.reshape(r, 1, v * 2 * n, p).expand(r, s, v * 2 * n, p).reshape(b, v * 2 * n, p)
  te = torch.from_numpy(np.array(data.test)).to(dev)             # (R, 2, Nt, P)
  nt = te.shape[2]
  xt = te.reshape(r, 1, 2 * nt, p).expand(r, s, 2 * nt, p).reshape(b, 2 * nt, p)
  sig = torch.tensor(hp.sigmas, dtype=torch.float32, device=dev).repeat(r).view(b, 1, 1, 1)
  y = torch.arange(n, device=dev).expand(b * v, n)

  k = min(RANK_EPOCHS, hp.epochs)

  def run():
    first = []
    w = torch.nn.Parameter(torch.from_numpy(np.array(w0)).reshape(b, p, -1).to(dev))
    opt = torch.optim.Adam([w], lr=hp.lr)
    losses = torch.empty(hp.epochs, b, device=dev)
    for e in range(hp.epochs):
      opt.zero_grad(set_to_none=True)
      a = f.normalize(torch.relu(torch.bmm(x, w)), dim=-1, eps=1e-8).view(b, v, 2, n, -1)
      logits = (torch.matmul(a[:, :, 0], a[:, :, 1].transpose(-1, -2)) * sig).reshape(b * v, n, n)
      ce = (f.cross_entropy(logits.transpose(1, 2), y, reduction='none') +   # row i: left i -> every right
            f.cross_entropy(logits, y, reduction='none')).mean(-1) / 2      # column j: right j -> every left
      loss = ce.view(b, v).mean(-1)
      loss.sum().backward()
      opt.step()
      losses[e] = loss.detach()
      with torch.inference_mode():
        at = f.normalize(torch.relu(torch.bmm(xt, w)), dim=-1).view(b, 2, nt, -1)
        st = torch.bmm(at[:, 0], at[:, 1].transpose(1, 2))
        d = st.diagonal(dim1=1, dim2=2)
        ranks = torch.minimum((st >= d[:, :, None]).sum(2), (st >= d[:, None, :]).sum(1))
        if e < k:
          first.append(ranks)
    return (losses.T.reshape(r, s, -1).cpu().numpy(),  # waits for the device
            torch.stack(first, 1).reshape(r, s, k, nt).cpu().numpy(), ranks.reshape(r, s, nt).cpu().numpy())
  return run, f'PyTorch {torch.__version__} bmm over runs x sigmas on {dev}, {torch.get_num_threads()} threads'


def main(_):
  p = dict(PRESETS[_PRESET.value])
  p['runs'] = _RUNS.value or p['runs']
  p['epochs'] = _EPOCHS.value or p['epochs']
  if _N.value:
    p['n_train'], p['n_test'] = (int(x) for x in _N.value)
  hp = adaptation_runs.Hparams(runs=p['runs'], epochs=p['epochs'], pca_dim=256, adapt_dim=1024,
                     sigmas=tuple(map(float, _SIGMAS.value)), lr=1e-3)
  views = 2 if _FLIP.value else 1
  prec = precision.apply()
  print(f'[adapt] {p} precision {prec["name"]}: compiling', file=sys.stderr, flush=True)
  data, state = make_inputs(p, hp, views)
  result = {'benchmark': 'adapt', 'capability': 'adaptation training (runs x sigmas x epochs)',
            'preset': _PRESET.value, 'device': str(jax.devices()[0].device_kind),
            'platform': jax.default_backend(), 'n_train': p['n_train'], 'n_test': p['n_test'],
            'runs': hp.runs, 'sigmas': list(hp.sigmas), 'epochs': hp.epochs, 'views': views, 'dims': '256->1024',
            'work': 'runs x sigmas x epochs training steps', 'precision': prec}

  prog = adaptation_runs.chunk_program()
  t0 = time.perf_counter()
  compiled = prog.lower(hp, state, data, hp.epochs).compile()
  result['ours_compile_s'] = time.perf_counter() - t0

  def ours():
    _, o = compiled(state, data)
    return (np.asarray(o.loss), np.asarray(o.test_ranks[:, :, :min(RANK_EPOCHS, hp.epochs)]),
            np.asarray(o.test_ranks[:, :, -1]))

  import torch
  torch.set_num_threads(os.cpu_count())
  ref, result['reference'] = torch_program(hp, np.asarray(state.params['w']), data)

  # same numbers first (also the warm-up of both sides)
  print('[adapt] both sides once (warm-up and agreement check)', file=sys.stderr, flush=True)
  result.update(check_agreement(ours(), ref()))
  print('[adapt] timing', file=sys.stderr, flush=True)
  times = interleaved.interleaved({'ours': ours, 'reference': ref}, _ALT.value, warmup=False)
  steps = hp.runs * len(hp.sigmas) * hp.epochs
  stats = interleaved.compare(times['ours'], times['reference'], work=steps, unit='steps')
  result.update(stats)
  result['rows'] = [interleaved.row(
      f'adaptation training, {p["n_train"]}/{p["n_test"]} pairs, {hp.runs} run(s) x sigmas {_SIGMAS.value} x '
      f'{hp.epochs} epochs, {views} views', stats, 'ours (one jitted program)', 'PyTorch bmm', 'steps')]
  # the roofline: the step's matrix products counted from their shapes (XLA's cost_analysis counts a lax.scan's
  # body once, not once per epoch: it read 10x low here), against the box's SGEMM rate. Per (run, sigma, epoch),
  # n train pairs, t test pairs, P -> D: each view's two P -> D products and the n x n cosine matrix forward
  # (2 * 2nPD + 2n^2 D), their W gradients and both cosine gradients backward (2 * 2nPD + 2 * 2n^2 D); the test
  # pairs' products and cosine matrix for the ranks (2 * 2tPD + 2t^2 D).
  n, t, pd = p['n_train'], p['n_test'], hp.pca_dim * hp.adapt_dim
  flops = steps * (views * (8 * n * pd + 6 * n * n * hp.adapt_dim) + 4 * t * pd + 2 * t * t * hp.adapt_dim)
  if jax.default_backend() == 'cpu':
    sg = interleaved.sgemm_gflops(2 * views * n, hp.pca_dim, hp.adapt_dim)   # the step's P -> D product, one run
    pct = {k: interleaved.roofline_percent(flops, stats[f'{k}_s'], sg['best']) for k in ('ours', 'reference')}
    result.update(matmul_flops_per_call=flops, sgemm_gflops=sg, roofline_percent=pct)
    pct['ours_of_xla_rate'] = interleaved.roofline_percent(flops, stats['ours_s'], sg['xla'])
    result['rows'][0]['ours'] += (f" (its matrix products at {pct['ours']:.0f}% of the box's SGEMM rate, "
                                  f"{sg['best']:.0f} GFLOP/s; {pct['ours_of_xla_rate']:.0f}% of XLA's own, "
                                  f"{sg['xla']:.0f}: the rest of the time is its softmax and rank passes)")
    result['rows'][0]['reference'] += f" ({pct['reference']:.0f}%)"
  print(json.dumps(result, indent=1))


if __name__ == '__main__':
  from visim_jax.core import errors  # pylint: disable=g-import-not-at-top
  app.run(main, flags_parser=errors.flags_parser)   # one-line flag errors; --help exits 0
