r"""Adaptation training: all runs in one vmapped jitted program vs the per-run loop a researcher writes.

  python benchmarks/adapt.py                        # CPU-sized (small)
  python benchmarks/adapt.py --preset=tll           # TLL_obj sizes: 4,199 pairs (3,149 train), 256 -> 1024,
                                                    # 20 runs x 150 epochs, flip view: the issue's GPU goal

Reference: the reference code's loop in PyTorch (one run after another, nn.Linear without bias, Adam,
full batch, test ranking every epoch) when torch is installed, otherwise the same loop in JAX with a jitted
step per epoch. Compile time is reported apart. Prints one JSON object.
"""
from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from visim_jax import train  # noqa: E402

_PRESET = flags.DEFINE_enum('preset', 'cpu', ['cpu', 'tll'], 'Sizes: cpu (small) or tll (the paper).')
_REF_RUNS = flags.DEFINE_integer('ref_runs', 0, 'Runs timed for the reference (extrapolated); 0 = all.')
_FLIP = flags.DEFINE_bool('flip', True, 'Train on two views (pairs + mirrored pairs), as the reference.')
_DTYPE = flags.DEFINE_enum('dtype', 'float32', ['float32', 'bfloat16'], 'Matmul inputs of our training step.')
_SIGMAS = flags.DEFINE_list('sigmas', ['15'], 'Temperatures trained in one program (Table 1: 1,15); the '
                            'reference trains one run per (run, sigma).')

PRESETS = {'cpu': dict(n=400, runs=4, epochs=30), 'tll': dict(n=4199, runs=20, epochs=150)}


def main(_):
  p = PRESETS[_PRESET.value]
  hp = train.Hparams(runs=p['runs'], epochs=p['epochs'], pca_dim=256, adapt_dim=1024, sigmas=tuple(map(float, _SIGMAS.value)), lr=1e-3,
                     dtype=_DTYPE.value)
  n, nt = p['n'], hp.n_train(p['n'])
  n_test = n - nt
  rng = np.random.RandomState(0)
  views = 2 if _FLIP.value else 1
  data = train.RunData(
      train_views=jnp.asarray(rng.randn(hp.runs, views, 2, nt, 256).astype(np.float32)),
      test=jnp.asarray(rng.randn(hp.runs, 2, n_test, 256).astype(np.float32)))
  result = {'benchmark': 'adapt', 'device': str(jax.devices()[0].device_kind), 'platform': jax.default_backend(),
            'n_train': nt, 'n_test': n_test, 'runs': hp.runs, 'epochs': hp.epochs, 'views': views,
            'dims': '256->1024', 'dtype': _DTYPE.value, 'sigmas': list(hp.sigmas)}

  state = train.init_state(hp)
  prog = jax.jit(train.train_chunk, static_argnums=(0, 3))
  t0 = time.perf_counter()
  compiled = prog.lower(hp, state, data, hp.epochs).compile()
  result['ours_compile_s'] = time.perf_counter() - t0
  jax.block_until_ready(compiled(state, data))  # warm
  t0 = time.perf_counter()
  jax.block_until_ready(compiled(state, data))
  result['ours_train_s'] = time.perf_counter() - t0

  ref_runs = _REF_RUNS.value or hp.runs
  try:
    import torch
    torch.set_num_threads(os.cpu_count())
    dev = 'cuda' if torch.cuda.is_available() else 'cpu'
    tv = torch.from_numpy(np.array(data.train_views)).to(dev)
    te = torch.from_numpy(np.array(data.test)).to(dev)

    def loss_t(al, ar, sigma=hp.sigmas[0]):
      s = torch.nn.functional.normalize(al, dim=1) @ torch.nn.functional.normalize(ar, dim=1).T * sigma
      y = torch.arange(s.shape[0], device=dev)
      return (torch.nn.functional.cross_entropy(s, y) + torch.nn.functional.cross_entropy(s.T, y)) / 2

    def one_run(r):
      lin = torch.nn.Linear(256, 1024, bias=False).to(dev)
      opt = torch.optim.Adam(lin.parameters(), lr=hp.lr)
      for _ in range(hp.epochs):
        opt.zero_grad()
        loss = sum(loss_t(torch.relu(lin(tv[r, v, 0])), torch.relu(lin(tv[r, v, 1]))) for v in range(views)) / views
        loss.backward()
        opt.step()
        with torch.no_grad():
          s = torch.nn.functional.normalize(torch.relu(lin(te[r, 0])), dim=1) @ \
              torch.nn.functional.normalize(torch.relu(lin(te[r, 1])), dim=1).T
          d = s.diagonal()
          torch.minimum((s >= d[:, None]).sum(1), (s >= d[None, :]).sum(0)).cpu()
    one_run(0)  # warm
    t0 = time.perf_counter()
    for r in range(ref_runs):
      one_run(r)
    if dev == 'cuda':
      torch.cuda.synchronize()
    result['reference'] = f'PyTorch {torch.__version__} per-run loop on {dev} (the reference code\'s structure)'
  except ImportError:
    step = jax.jit(lambda st, d: train.train_chunk(hp, st, d, 1))
    one = lambda r: jax.tree.map(lambda a: a[r:r + 1], (state, data))
    step(*one(0))
    t0 = time.perf_counter()
    for r in range(ref_runs):
      st, d = one(r)
      for _ in range(hp.epochs):
        st, o = step(st, d)
      jax.block_until_ready(o.test_ranks)
    result['reference'] = 'per-run, per-epoch Python loop of jitted JAX steps'
  ref = (time.perf_counter() - t0) * hp.runs * len(hp.sigmas) / ref_runs  # one reference run per (run, sigma)
  result['reference_train_s'] = ref
  result['reference_runs_timed'] = ref_runs
  result['speedup'] = ref / result['ours_train_s']
  print(json.dumps(result, indent=1))


if __name__ == '__main__':
  app.run(main)
