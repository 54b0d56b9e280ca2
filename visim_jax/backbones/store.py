"""The weights store: where converted weight files live, the command that makes one, and how one is written.

A leaf of backbones/ (imports no other backbones module at load time), so that the registry's listing, the packaged
weights (packaged.py), the readers (weights.py) and the converter (convert.py) all build on it without an import
circle (tests/test_gate_checkpoints.py walks the import graph).
- `weights_dir()`: `$VISIM_JAX_WEIGHTS` (default `~/.cache/visim_jax/weights`); `default_location(NAME)` the place of
  NAME's weights in it (`NAME.safetensors` for converted families, the folder `NAME/` for Hugging Face ones);
- `CHECKPOINTS`: per converted name, the public checkpoint `--checkpoint` takes and where it comes from (a URL, a
  Hugging Face repo id, OpenAI's CLIP download, DreamSim's release); `convert_command(NAME)` the one-time command,
  `checkpoint_source(NAME)`; `converted_path(NAME, weights)`;
- `write_converted(tensors, out, info)`: the .safetensors (atomically) + its `.json` sidecar with the sha256.
"""
from __future__ import annotations

import json
import os

import numpy as np


def weights_dir() -> str:
  """The folder that holds one sub-folder (or file) of weights per backbone name."""
  return os.path.expanduser(os.environ.get('VISIM_JAX_WEIGHTS', os.path.join('~', '.cache', 'visim_jax', 'weights')))


def default_location(name: str) -> str:
  return os.path.join(weights_dir(), name)


def network_allowed() -> bool:
  env = os.environ.get('HF_HUB_OFFLINE', '') or os.environ.get('TRANSFORMERS_OFFLINE', '')
  return env.strip().lower() not in ('1', 'true', 'yes', 'on')


_FB_SSL = 'https://dl.fbaipublicfiles.com/semiweaksupervision/model_files/'
_OPENAI = "OpenAI CLIP's clip.load('{}'): openaipublic.azureedge.net/clip/models/<sha256>/{}.pt"
_DREAMSIM = ("DreamSim's release, github.com/ssundaram21/dreamsim: the folder that `dreamsim(pretrained=True, "
             "cache_dir=FOLDER, dreamsim_type='{}'{})` fills")
# name -> (what --checkpoint takes, where that public file comes from): docs/backbones.md's tables, in one place
CHECKPOINTS: dict[str, tuple[str, str]] = {
    **{n: (f, f'https://download.pytorch.org/models/{f}') for n, f in (
        ('resnet18', 'resnet18-5c106cde.pth'), ('resnet34', 'resnet34-333f7ec4.pth'),
        ('resnet50', 'resnet50-19c8e357.pth'), ('resnet101', 'resnet101-5d3b4d8f.pth'),
        ('resnet152', 'resnet152-b121ed2d.pth'), ('alexnet', 'alexnet-owt-4df8aa71.pth'),
        ('vgg16', 'vgg16-397923af.pth'),
        ('resnext101_32x8d_wsl', 'ig_resnext101_32x8-c38310e5.pth'),
        ('resnext101_32x16d_wsl', 'ig_resnext101_32x16-c6f796b0.pth'),
        ('resnext101_32x32d_wsl', 'ig_resnext101_32x32-e4b90b00.pth'),
        ('resnext101_32x48d_wsl', 'ig_resnext101_32x48-3e41cc8a.pth'))},
    **{n: (f, _FB_SSL + f) for n, f in (
        ('resnet50_ssl', 'semi_supervised_resnet50-08389792.pth'),
        ('resnext101_32x8d_ssl', 'semi_supervised_resnext101_32x8-2cfe2f8b.pth'),
        ('resnext101_32x16d_ssl', 'semi_supervised_resnext101_32x16-15fffa57.pth'),
        ('resnet50_swsl', 'semi_weakly_supervised_resnet50-16a12f1b.pth'),
        ('resnext101_32x8d_swsl', 'semi_weakly_supervised_resnext101_32x8-b4712904.pth'),
        ('resnext101_32x16d_swsl', 'semi_weakly_supervised_resnext101_32x16-f3559a9c.pth'))},
    'barlow': ('resnet50.pth', 'https://dl.fbaipublicfiles.com/barlowtwins/ep1000_bs2048_lrw0.2_lrb0.0048_lambd0.0051/'
               'resnet50.pth'),
    **{n: (f'{f}.pth', f'https://dl.fbaipublicfiles.com/dino/{f}/{f}.pth') for n, f in (
        ('dino_resnet50', 'dino_resnet50_pretrain'), ('deits16', 'dino_deitsmall16_pretrain'),
        ('deits8', 'dino_deitsmall8_pretrain'), ('dino_vitb16', 'dino_vitbase16_pretrain'),
        ('dino_vitb8', 'dino_vitbase8_pretrain'))},
    **{f'bit_m_{v.lower()}': (f'BiT-M-{v}.npz', f'https://storage.googleapis.com/bit_models/BiT-M-{v}.npz')
       for v in ('R50x1', 'R50x3', 'R101x1', 'R101x3', 'R152x2', 'R152x4')},
    'vit': ('jx_vit_base_p16_224-80ecf9dd.pth', 'timm 0.4.5 vit_base_patch16_224 (also hf timm/vit_base_patch16_224.'
            'orig_in21k_ft_in1k)'),
    **{f'efficientnet_{v}': (f, f'gen-efficientnet / timm release file {f}') for v, f in (
        ('b0', 'efficientnet_b0_ra-3dd342df.pth'), ('b1', 'efficientnet_b1-533bc792.pth'),
        ('b2', 'efficientnet_b2_ra-bcdf34b7.pth'), ('b3', 'efficientnet_b3_ra2-cf984f9c.pth'))},
    'facenet': ('20180402-114759-vggface2.pt', "facenet-pytorch InceptionResnetV1(pretrained='vggface2')"),
    **{f'clip_{m.lower()}': (f'{m}.pt', _OPENAI.format(m, m)) for m in ('RN50', 'RN101', 'RN50x4', 'RN50x16',
                                                                        'RN50x64')},
    **{n: ('model.safetensors', f'hf {h}') for n, h in (
        ('siglip_b16_224', 'google/siglip-base-patch16-224'), ('siglip_b16_256', 'google/siglip-base-patch16-256'),
        ('siglip_b16_384', 'google/siglip-base-patch16-384'),
        ('siglip_so400m14_384', 'google/siglip-so400m-patch14-384'),
        ('siglip2_b16_224', 'google/siglip2-base-patch16-224'), ('siglip2_b16_256', 'google/siglip2-base-patch16-256'),
        ('siglip2_b16_384', 'google/siglip2-base-patch16-384'),
        ('siglip2_so400m14_384', 'google/siglip2-so400m-patch14-384'),
        ('siglip2_so400m16_384', 'google/siglip2-so400m-patch16-384'))},
    **{n: ('open_clip_model.safetensors', f'hf {h}') for n, h in (
        ('openclip_vit_b32_laion2b', 'laion/CLIP-ViT-B-32-laion2B-s34B-b79K'),
        ('openclip_vit_b16_laion2b', 'laion/CLIP-ViT-B-16-laion2B-s34B-b88K'),
        ('openclip_vit_l14_laion2b', 'laion/CLIP-ViT-L-14-laion2B-s32B-b82K'))},
    **{f'dreamsim_{t}': ('FOLDER', _DREAMSIM.format(t, '')) for t in (
        'ensemble', 'dino_vitb16', 'clip_vitb32', 'open_clip_vitb32', 'synclr_vitb16', 'dinov2_vitb14')},
    **{f'dreamsim_{t}_patch': ('FOLDER', _DREAMSIM.format(t, ', use_patch_model=True')) for t in (
        'dino_vitb16', 'dinov2_vitb14')},
    'dreamsim_ensemble_pretrained': ('FOLDER', _DREAMSIM.format('ensemble', '') + ' (its base files; the LoRA is '
                                     'not read)'),
    'dreamsim_dino_vitb16_pretrained': ('FOLDER', "torch hub's DINO file as DreamSim's load_dir holds it: "
                                        'FOLDER/checkpoints/dino_vitbase16_pretrain.pth'),
}


def convert_command(name: str) -> str:
  """The conversion command of NAME, naming its public checkpoint file (CHECKPOINTS) when known."""
  default = 'FOLDER' if name.startswith('dreamsim_') else 'FILE'  # DreamSim converts from its cache_dir (dreamsim.py)
  source = CHECKPOINTS.get(name, (default,))[0]
  return f'python -m visim_jax.backbones.convert --backbone={name} --checkpoint={source}'


def fetch_remedy(name: str) -> str | None:
  """The one remedy of NAME's missing weights: "`python -m visim_jax.fetch NAME` (downloads about N MB; writes
  WHERE)" (hub/sources.py knows the download), or None when no public download is known."""
  from visim_jax.hub import sources  # pylint: disable=g-import-not-at-top
  src = sources.WEIGHTS.get(name)
  if src is None:
    return None
  return sources.remedy(name, default_location(name) + (os.sep if src.convert == 'hf' else '.safetensors'))


def missing_line(name: str) -> str:
  """What to do about NAME's missing weights, in one clause: the fetch command first; a checkpoint you already
  have converts with the converter (convert_command)."""
  remedy = fetch_remedy(name)
  convert = f'`{convert_command(name)}`'
  if remedy is None:
    return f'convert its public checkpoint once: {convert}'
  return f'run {remedy}; or, with the checkpoint file at hand, {convert}'


def checkpoint_source(name: str) -> str | None:
  """Where NAME's public checkpoint comes from (a URL, a hub id, a release), or None when not recorded."""
  return CHECKPOINTS[name][1] if name in CHECKPOINTS else None


def converted_path(name: str, weights: str | None = None) -> str:
  """The converted weight file of backbone NAME: `weights` if given, else `$VISIM_JAX_WEIGHTS/NAME.safetensors`."""
  return os.path.expanduser(os.fspath(weights)) if weights else default_location(name) + '.safetensors'


def write_converted(tensors: dict[str, np.ndarray], out: str, info: dict) -> dict:
  """Writes `out` (safetensors, atomically) and `<out>.json` with its sha256 + `info`; returns the sidecar."""
  from safetensors.numpy import save  # pylint: disable=g-import-not-at-top
  from visim_jax.core import ops  # pylint: disable=g-import-not-at-top
  from visim_jax.backbones.base import sha256_file  # pylint: disable=g-import-not-at-top
  from visim_jax.core.errors import UserError  # pylint: disable=g-import-not-at-top
  if not out.endswith('.safetensors'):
    raise UserError(f'--out {out}: must end with .safetensors')
  tensors = {k: np.ascontiguousarray(v, np.float32) for k, v in tensors.items()}
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  ops.atomic_write_bytes(out, save(tensors, metadata={'format': 'pt', 'backbone': str(info.get('backbone'))}))
  info = {'sha256': sha256_file(out), 'num_tensors': len(tensors), **info}
  ops.atomic_write_text(out + '.json', json.dumps(info, indent=2, sort_keys=True) + '\n')
  return info
