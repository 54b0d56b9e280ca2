"""Runs adapt.train_all on the synthetic features of test_adapt in a fresh process (multi-device tests).

  python tests/adapt_worker.py OUT.npz WORKDIR [PROCESS_ID NUM_PROCESSES PORT]
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(out, ckpt, pid=None, nproc=None, port=None):
  import jax
  if pid is not None:
    jax.config.update('jax_cpu_collectives_implementation', 'gloo')
    jax.distributed.initialize(f'localhost:{port}', int(nproc), int(pid))
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  from test_adapt import HP, synthetic
  from visim_jax.training import runtime, adaptation_runs
  from visim_jax.experiments import adapt
  d = synthetic()
  feats = adaptation_runs.Features(d['left'], d['right'], d['left_flip'], d['right_flip'])
  fp = runtime.fingerprint(HP.__dict__, feats)
  with runtime.Run(ckpt, {'hparams': HP.__dict__}, fp, progress=False) as run:  # checkpoints in ckpt/checkpoints
    res = adapt.train_all(HP, feats, run, checkpoint_every=3, progress=False)
  if jax.process_index() == 0:
    np.savez(out, loss=res['loss'], ranks=res['ranks'], w=res['params']['w'], raw=res['raw'],
             devices=jax.device_count(), processes=jax.process_count())


if __name__ == '__main__':
  main(*sys.argv[1:])
