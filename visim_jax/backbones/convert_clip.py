"""One-time converter: an OpenAI CLIP or open_clip ResNet checkpoint -> safetensors of the visual tower.

    python -m visim_jax.backbones.convert_clip --input RN50.pt --output ~/.cache/visim_jax/weights/clip_rn50.safetensors

Input formats:
- a PyTorch state dict (zip or legacy `torch.save`; OpenAI names with `visual.` prefixes, or open_clip's, possibly
  under 'state_dict' and with 'module.' prefixes): read by visim_jax.safe_pickle's restricted unpickler (no torch);
- an OpenAI TorchScript archive (RN50.pt, RN101.pt, RN50x4.pt as downloaded by `clip.load`): needs torch (the
  optional `torch` extra) and is read with `torch.jit.load(..., map_location='cpu').state_dict()`. TorchScript holds
  code: convert only files you trust (OpenAI's download URLs embed the file's sha256; compare it with the
  `source_sha256` this tool records).
- a .safetensors / .npz state dict (re-checked and re-written).

Output: `--output` (.safetensors) with the visual weights only, PyTorch names without `visual.` and layouts, float32;
and `<output>.json` beside it: {"sha256" (of the output file), "source", "source_sha256", "source_format",
"architecture": {layers, width, output_dim, image_size, heads}, "name" (the registered backbone it fits),
"num_tensors"}. The runtime (clip_resnet.py) checks that sha256 before use and never unpickles.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import zipfile

import numpy as np

from visim_jax import safe_pickle
from visim_jax.backbones import clip_resnet
from visim_jax.backbones.base import sha256_file


def _is_torchscript(path: str) -> bool:
  if not zipfile.is_zipfile(path):
    return False
  with zipfile.ZipFile(path) as z:
    return any(n.endswith('/constants.pkl') or n.split('/', 1)[-1].startswith('code/') for n in z.namelist())


def read_checkpoint(path: str) -> tuple[dict[str, np.ndarray], str]:
  """({name: float array}, format) from any supported input (see the module docstring)."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f'--input {path}: no such file')
  if path.endswith(('.safetensors', '.npz')):
    return clip_resnet.read_weights(path), os.path.splitext(path)[1][1:]
  if _is_torchscript(path):
    try:
      import torch  # pylint: disable=g-import-not-at-top
    except ImportError:
      raise SystemExit(f'--input {path} is a TorchScript archive: converting it needs torch '
                       '(pip install torch==2.13.0, the optional `torch` extra)') from None
    module = torch.jit.load(path, map_location='cpu')
    sd = {k: v.detach().float().cpu().numpy() for k, v in module.state_dict().items()
          if v.dtype.is_floating_point}
    return sd, 'torchscript'
  try:
    return safe_pickle.load_torch_state_dict(path), 'state_dict'
  except safe_pickle.UnsafePickleError as e:
    raise SystemExit(f'--input {path}: refused by the restricted unpickler ({e}); save a plain state dict '
                     '(`torch.save(model.state_dict(), path)`) and convert that') from None


def convert(input_path: str, output_path: str, name: str | None = None) -> dict:
  """Writes the safetensors file + sidecar JSON; returns the sidecar's content."""
  if not output_path.endswith('.safetensors'):
    raise ValueError(f'--output {output_path}: must end with .safetensors')
  sd, fmt = read_checkpoint(input_path)
  visual = clip_resnet.strip_prefix(sd)
  visual = {k: np.ascontiguousarray(v, np.float32) for k, v in visual.items() if not k.endswith('num_batches_tracked')}
  arch = clip_resnet.infer_arch(visual, input_path)
  clip_resnet.convert_state_dict(visual, input_path)  # fails on unexpected entries before anything is written
  matches = [n for n, a in clip_resnet.ARCHS.items() if a == arch]
  if name is not None and name not in matches:
    raise ValueError(f'--name {name}: {input_path} holds {arch}, which is {matches or "no registered model"}')
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  out_dir = os.path.dirname(os.path.abspath(output_path))
  os.makedirs(out_dir, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=out_dir, prefix='.tmp-', suffix='.safetensors')
  os.close(fd)
  try:
    save_file(visual, tmp, metadata={'format': 'pt', 'source': 'clip-modified-resnet-visual'})
    os.replace(tmp, output_path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)
  info = {
      'sha256': sha256_file(output_path),
      'source': os.path.abspath(input_path),
      'source_sha256': sha256_file(input_path),
      'source_format': fmt,
      'architecture': {'layers': list(arch.layers), 'width': arch.width, 'output_dim': arch.output_dim,
                       'image_size': arch.image_size, 'heads': arch.heads},
      'name': matches[0] if matches else None,
      'num_tensors': len(visual),
  }
  with open(output_path + '.json', 'w') as f:
    json.dump(info, f, indent=2, sort_keys=True)
  return info


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
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
  if info['name']:
    print(f'use: get_backbone("{info["name"]}", weights="{os.path.abspath(args.output)}")', file=sys.stderr)
  return 0


if __name__ == '__main__':
  sys.exit(main())
