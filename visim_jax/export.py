"""The command that writes one trained run as one portable file or folder.

  python -m visim_jax.export --workdir=W [--run=0] [--sigma_index=0] [--out=W/adapter.npz]   # an adaptation run
  python -m visim_jax.export --workdir=W [--out=W/merged.npz]                    # a tune run: merged weights
  python -m visim_jax.export --workdir=W --format=peft [--out=W/peft_adapter]    # a tune run's LoRA, peft's form

An adaptation workdir (checkpoints/) -> adapter.npz (training/adapter_file.py). A tune workdir (tuned.npz) ->
`--format=merged` (the default there): merged.npz, the tower's weights with the LoRA folded in (zoo/tuned.export);
`--format=peft`: a peft save_pretrained folder (adapter_config.json + adapter_model.safetensors in DreamSim's names,
training/peft_file.py) that `PeftModel.from_pretrained` and `tuned:<folder>` load. User errors (no workdir, no
checkpoint, a run out of range, a format the run has no form in) end with one line `error: <path or flag>: <what to
do>` and exit status 1.
"""
from __future__ import annotations

import os

from visim_jax.core.errors import UserError
from visim_jax.training import adapter_file

FORMATS = ('auto', 'merged', 'peft')


def main(argv):
  from absl import flags
  if len(argv) > 1:
    raise UserError(f'unexpected arguments {argv[1:]}: the flags are --workdir, --format, --run, --sigma_index, --out')
  f = flags.FLAGS
  if not f.workdir:
    raise UserError('--workdir: required: the adaptation workdir holding checkpoints/ or a tune workdir (tuned.npz)')
  if f.format not in FORMATS:
    raise UserError(f'--format={f.format}: one of {", ".join(FORMATS)}')
  if os.path.isfile(os.path.join(f.workdir, 'tuned.npz')):
    from visim_jax.zoo import tuned  # pylint: disable=g-import-not-at-top
    if f.format == 'peft':
      print(f'{tuned.export_peft(f.workdir, f.out)}: peft LoRA adapter (adapter_config.json, adapter_model.safetensors)')
    else:
      print(f'{tuned.export(f.workdir, f.out)}: merged weights')
    return
  if f.format != 'auto':
    raise UserError(f'--format={f.format}: {f.workdir} holds no tuned.npz (a tune run\'s); an adaptation workdir '
                    'exports its adapter.npz (leave --format out)')
  path = adapter_file.from_workdir(f.workdir, f.run, f.out, f.sigma_index)
  ad = adapter_file.load_adapter(path)
  print(f'{path}: {ad.in_dim} -> {ad.components.shape[1]} (PCA) -> {ad.out_dim}, backbone {ad.meta["backbone"]}')


def _define_flags():  # only when run as a program: importing export defines no flags
  from absl import flags
  flags.DEFINE_string('workdir', None, 'An adaptation workdir with checkpoints/, or a tune workdir with tuned.npz.')
  flags.DEFINE_string('format', 'auto', 'auto (adapter.npz / merged.npz) | merged | peft (a tune run\'s LoRA as a '
                      'peft adapter folder)')
  flags.DEFINE_integer('run', 0, 'Which run of the R trained runs.')
  flags.DEFINE_integer('sigma_index', 0, 'Which temperature of the run\'s config.sigmas (0 = the first).')
  flags.DEFINE_string('out', None, 'Output file / folder (default in WORKDIR: adapter.npz, merged.npz, '
                      'peft_adapter/).')


if __name__ == '__main__':
  from visim_jax.core import errors
  _define_flags()
  errors.run(main)  # user errors and bad flags as one line `error: ...`, exit 1
