"""CLIP ModifiedResNet checkpoints for the one converter (backbones/convert.py):

    python -m visim_jax.backbones.convert --backbone=clip_rn50x4 --checkpoint=RN50x4.pt

`prepare_state_dict` is what convert.py dispatches to for the clip_rn* names: it keeps the visual tower (OpenAI
names with `visual.` prefixes, or open_clip's, possibly under 'state_dict' and with 'module.' prefixes), float32,
checks every entry against clip_resnet.convert_state_dict's key mapping and the architecture against the name,
and records the architecture in the sidecar. Inputs are read by convert.read_checkpoint: OpenAI TorchScript
archives (RN50.pt ... as `clip.load` downloads them; needs torch and runs the archive's code, so convert only files
you trust and compare the recorded `source_sha256` with the one in OpenAI's download URL), plain state dicts (the
restricted unpickler, no torch) or safetensors / npz.

The older command `python -m visim_jax.backbones.convert_clip --input F --output O [--name N]` still works and
writes the same files.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

from visim_jax.backbones import clip_resnet
from visim_jax.core.errors import UserError


def prepare_state_dict(name: str | None, sd: dict, where: str, tiny: bool = False) -> tuple[dict, dict]:
  """(the visual tower's tensors, {'architecture', 'name'}) of a CLIP checkpoint; see the module docstring."""
  visual = clip_resnet.strip_prefix(sd)
  visual = {k: np.ascontiguousarray(v, np.float32) for k, v in visual.items() if not k.endswith('num_batches_tracked')}
  arch = clip_resnet.infer_arch(visual, where)
  clip_resnet.convert_state_dict(visual, where)  # fails on unexpected entries before anything is written
  matches = [n for n, a in clip_resnet.ARCHS.items() if a == arch]
  if name is not None and (arch != clip_resnet.TINY if tiny else name not in matches):
    raise UserError(f'{where}: holds a CLIP ResNet {arch}, which is {matches or "no registered model"}, not {name}')
  return visual, {
      'architecture': {'layers': list(arch.layers), 'width': arch.width, 'output_dim': arch.output_dim,
                       'image_size': arch.image_size, 'heads': arch.heads},
      'name': matches[0] if matches else None,
  }


def convert(input_path: str, output_path: str, name: str | None = None) -> dict:
  """Writes the safetensors file + sidecar JSON (convert.write_converted); returns the sidecar's content."""
  from visim_jax.backbones import convert as convert_lib  # pylint: disable=g-import-not-at-top
  from visim_jax.backbones.base import sha256_file  # pylint: disable=g-import-not-at-top
  if not output_path.endswith('.safetensors'):
    raise UserError(f'--output {output_path}: must end with .safetensors')
  sd, fmt = convert_lib.read_checkpoint(input_path)
  tensors, extra = prepare_state_dict(name, sd, input_path)
  info = {'backbone': extra['name'], 'source': os.path.abspath(input_path), 'source_sha256': sha256_file(input_path),
          'source_format': fmt, **extra}
  return convert_lib.write_converted(tensors, output_path, info)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description='(older spelling of) python -m visim_jax.backbones.convert for CLIP ResNets')
  p.add_argument('--input', required=True, help='OpenAI TorchScript .pt, a state dict (.pt/.bin/.pth), .safetensors')
  p.add_argument('--output', required=True, help='output .safetensors (a .json sidecar is written beside it)')
  p.add_argument('--name', default=None, choices=sorted(clip_resnet.ARCHS),
                 help='fail unless the checkpoint is this registered architecture')
  args = p.parse_args(argv)
  try:
    info = convert(os.path.expanduser(args.input), os.path.expanduser(args.output), args.name)
  except (ValueError, FileNotFoundError) as e:
    print(f'error: {e}', file=sys.stderr)
    return 1
  print(json.dumps(info, indent=2, sort_keys=True))
  return 0


if __name__ == '__main__':
  sys.exit(main())
