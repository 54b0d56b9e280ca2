"""The command that writes one run of an adaptation workdir as one portable adapter.npz (training/adapter_file.py).

  python -m visim_jax.export --workdir=W [--run=0] [--sigma_index=0] [--out=W/adapter.npz]

User errors (no workdir, no checkpoint, a run out of range, another experiment's workdir) end with one line
`error: <path or flag>: <what to do>` and exit status 1.
"""
from __future__ import annotations

from visim_jax.core.errors import UserError
from visim_jax.training import adapter_file


def main(argv):
  from absl import flags
  if len(argv) > 1:
    raise UserError(f'unexpected arguments {argv[1:]}: the flags are --workdir, --run, --sigma_index, --out')
  f = flags.FLAGS
  if not f.workdir:
    raise UserError('--workdir: required: the adaptation workdir holding checkpoints/')
  path = adapter_file.from_workdir(f.workdir, f.run, f.out, f.sigma_index)
  ad = adapter_file.load_adapter(path)
  print(f'{path}: {ad.in_dim} -> {ad.components.shape[1]} (PCA) -> {ad.out_dim}, backbone {ad.meta["backbone"]}')


def _define_flags():  # only when run as a program: importing export defines no flags
  from absl import flags
  flags.DEFINE_string('workdir', None, 'An adaptation workdir with checkpoints/.')
  flags.DEFINE_integer('run', 0, 'Which run of the R trained runs.')
  flags.DEFINE_integer('sigma_index', 0, 'Which temperature of the run\'s config.sigmas (0 = the first).')
  flags.DEFINE_string('out', None, 'Output .npz (default WORKDIR/adapter.npz).')


if __name__ == '__main__':
  from visim_jax.core import errors
  _define_flags()
  errors.run(main)  # user errors and bad flags as one line `error: ...`, exit 1
