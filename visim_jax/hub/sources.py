"""Where each checkpoint and data set comes from: one table, data only (no network, no jax).

`WEIGHTS[name]`: the public files of backbone NAME (the sources docs/backbones.md names per family) and how
visim_jax/fetch.py turns them into the weights folder's file:
  * 'file':   one checkpoint -> `backbones/convert.py` (`$VISIM_JAX_WEIGHTS/NAME.safetensors` + sidecar);
  * 'folder': several files laid out as DreamSim's cache_dir (the release zip unpacked + the torch-hub base
              file under checkpoints/) -> convert.py's folder families;
  * 'hf':     a Hugging Face save_pretrained folder (config.json + model.safetensors) written to
              `$VISIM_JAX_WEIGHTS/NAME/`, where backbones/weights.py looks first (no conversion).
`DATA[name]`: the archives a data set's authors' download script fetches, each unpacked under `--root`
(`into`: the sub-folder the script untars into) and the loader check `fetch.check_layout` runs at the end; a set
without a public direct URL has `note` (where to get it) and no files.

sha256: the full digest where the publisher gives one (OpenAI's CLIP URLs carry it in their path), an 8+ hex
prefix where the file name carries one (torch hub's `NAME-<sha256 prefix>.pth` convention, checked the same way
torch.hub's check_hash does), None where none is published (the download is then only size- and format-checked;
the converted file's sidecar records the sha256 of what was read). size: bytes, where published.

`File.alternatives`: other names of the same file in the same folder, tried in order when the server answers 404
(HTTP "not found") for the first, as the publishers' own loaders do: Hugging Face repositories hold their weights as
`model.safetensors`, `flax_model.msgpack` or only `pytorch_model.bin` (google/vit-large-patch16-224 and
facebook/regnet-y-040 / -080 / -160 have no safetensors on their main branch), so the 'hf' families try those three in
that order (a .bin is read once through visim_jax.core.safe_pickle and kept as model.safetensors, never unpickled at
run time); open_clip's `download_pretrained_from_hf` tries `open_clip_model.safetensors` and then
`open_clip_pytorch_model.bin` (open_clip `pretrained.py` `_get_safe_alternatives`, `constants.py` HF_WEIGHTS_NAME /
HF_SAFE_WEIGHTS_NAME), and so do the OpenCLIP sources here.

`MB[name]`: the approximate size of the download (megabytes, 1e6 bytes; the publishers' file sizes where we know them,
else 4 bytes x the checkpoint's parameter count, rounded): what every "weights missing" message states beside the
command, so that a user knows what `python -m visim_jax.fetch NAME` will transfer. Not a check (`size` is).
"""
from __future__ import annotations

import dataclasses
import re


@dataclasses.dataclass(frozen=True)
class File:
  url: str
  path: str                      # where it goes, relative to the staging folder (weights) or --root (data)
  sha256: str | None = None      # full digest or a hex prefix (see the module docstring)
  size: int | None = None
  into: str = ''                 # archives: unpacked under this sub-folder of the root ('' = the root itself)
  alternatives: tuple[str, ...] = ()   # other file names in the same folder, tried in order on HTTP 404

  def named(self, name: str) -> 'File':
    """The same file under another name of its folder (an alternative): no checksum or size carried over."""
    if name == self.path.rsplit('/', 1)[-1]:
      return self
    head = self.path.rsplit('/', 1)[0] + '/' if '/' in self.path else ''
    return File(self.url.rsplit('/', 1)[0] + '/' + name, head + name, into=self.into)

  def candidates(self) -> tuple['File', ...]:
    return (self,) + tuple(self.named(n) for n in self.alternatives)


@dataclasses.dataclass(frozen=True)
class Source:
  name: str
  files: tuple[File, ...]
  convert: str = 'file'          # 'file' | 'folder' | 'hf' (weights); 'unpack' (data)
  checkpoint: str = ''           # what convert.py is given, relative to the staging folder ('' = files[0].path)
  note: str = ''                 # one line: where to get it when there is nothing to download


def _hash_in_name(url: str) -> str | None:
  """The sha256 prefix of a torch-hub style file name `NAME-<hex>.pth`."""
  m = re.search(r'-([0-9a-f]{8,})\.(pth|pt|pth\.tar)$', url.rsplit('/', 1)[-1])
  return m.group(1) if m else None


def _one(name: str, url: str, sha256: str | None = None) -> Source:
  base = url.rsplit('/', 1)[-1]
  return Source(name, (File(url, base, sha256 or _hash_in_name(url)),))


HF_WEIGHT_FILES = ('model.safetensors', 'flax_model.msgpack', 'pytorch_model.bin')   # the order tried
OPEN_CLIP_FILES = ('open_clip_model.safetensors', 'open_clip_pytorch_model.bin')      # open_clip's own order


def _hf_file(repo: str, f: str, alternatives: tuple[str, ...] = ()) -> File:
  return File(f'https://huggingface.co/{repo}/resolve/main/{f}', f, alternatives=alternatives)


def _hf(name: str, repo: str, files=('config.json', HF_WEIGHT_FILES), convert: str = 'hf',
        checkpoint: str = '') -> Source:
  """A Hugging Face repository's files; an entry that is a tuple of names is one file under its alternative names."""
  return Source(name, tuple(_hf_file(repo, f[0], tuple(f[1:])) if isinstance(f, tuple) else _hf_file(repo, f)
                            for f in files), convert, checkpoint)


WEIGHTS: dict[str, Source] = {}

# OpenAI CLIP (openai/CLIP clip/clip.py `_MODELS`; the sha256 is the URL's last folder): TorchScript archives
_OPENAI = 'https://openaipublic.azureedge.net/clip/models'
for _name, _digest, _file in (
    ('clip_rn50', 'afeb0e10f9e5a86da6080e35cf09123aca3b358a0c3e3b6c78a7b63bc04b6762', 'RN50.pt'),
    ('clip_rn101', '8fa8567bab74a42d41c5915025a8e4538c3bdbe8804a470a72f30b0d94fab599', 'RN101.pt'),
    ('clip_rn50x4', '7e526bd135e493cef0776de27d5f42653e6b4c8bf9e0f653bb11773263205fdd', 'RN50x4.pt'),
    ('clip_rn50x16', '52378b407f34354e150460fe41077663dd5b39c54cd0bfd2b27167a4a06ec9aa', 'RN50x16.pt'),
    ('clip_rn50x64', 'be1cfb55d75a9666199fb2206c106743da0f6468c9d327f3e0d0a543a9919d9c', 'RN50x64.pt')):
  WEIGHTS[_name] = _one(_name, f'{_OPENAI}/{_digest}/{_file}', _digest)

# torchvision (the files torchvision 0.9.1, the seed code's pin, downloads) and Facebook's hub releases
_TV = 'https://download.pytorch.org/models'
_SEMI = 'https://dl.fbaipublicfiles.com/semiweaksupervision/model_files'
for _name, _url in (
    ('resnet18', f'{_TV}/resnet18-5c106cde.pth'), ('resnet34', f'{_TV}/resnet34-333f7ec4.pth'),
    ('resnet50', f'{_TV}/resnet50-19c8e357.pth'), ('resnet101', f'{_TV}/resnet101-5d3b4d8f.pth'),
    ('resnet152', f'{_TV}/resnet152-b121ed2d.pth'), ('alexnet', f'{_TV}/alexnet-owt-4df8aa71.pth'),
    ('vgg16', f'{_TV}/vgg16-397923af.pth'),
    ('resnet50_ssl', f'{_SEMI}/semi_supervised_resnet50-08389792.pth'),
    ('resnext101_32x8d_ssl', f'{_SEMI}/semi_supervised_resnext101_32x8-2cfe2f8b.pth'),
    ('resnext101_32x16d_ssl', f'{_SEMI}/semi_supervised_resnext101_32x16-15fffa57.pth'),
    ('resnet50_swsl', f'{_SEMI}/semi_weakly_supervised_resnet50-16a12f1b.pth'),
    ('resnext101_32x8d_swsl', f'{_SEMI}/semi_weakly_supervised_resnext101_32x8-b4712904.pth'),
    ('resnext101_32x16d_swsl', f'{_SEMI}/semi_weakly_supervised_resnext101_32x16-f3559a9c.pth'),
    ('resnext101_32x8d_wsl', f'{_TV}/ig_resnext101_32x8-c38310e5.pth'),
    ('resnext101_32x16d_wsl', f'{_TV}/ig_resnext101_32x16-c6f796b0.pth'),
    ('resnext101_32x32d_wsl', f'{_TV}/ig_resnext101_32x32-e4b90b00.pth'),
    ('resnext101_32x48d_wsl', f'{_TV}/ig_resnext101_32x48-3e41cc8a.pth'),
    ('barlow', 'https://dl.fbaipublicfiles.com/barlowtwins/ep1000_bs2048_lrw0.2_lrb0.0048_lambd0.0051/resnet50.pth'),
    ('dino_resnet50', 'https://dl.fbaipublicfiles.com/dino/dino_resnet50_pretrain/dino_resnet50_pretrain.pth'),
    ('deits16', 'https://dl.fbaipublicfiles.com/dino/dino_deitsmall16_pretrain/dino_deitsmall16_pretrain.pth'),
    ('deits8', 'https://dl.fbaipublicfiles.com/dino/dino_deitsmall8_pretrain/dino_deitsmall8_pretrain.pth'),
    ('dino_vitb16', 'https://dl.fbaipublicfiles.com/dino/dino_vitbase16_pretrain/dino_vitbase16_pretrain.pth'),
    ('dino_vitb8', 'https://dl.fbaipublicfiles.com/dino/dino_vitbase8_pretrain/dino_vitbase8_pretrain.pth'),
    ('vit', 'https://github.com/rwightman/pytorch-image-models/releases/download/v0.1-vitjx/'
            'jx_vit_base_p16_224-80ecf9dd.pth'),
    ('efficientnet_b0', 'https://github.com/rwightman/pytorch-image-models/releases/download/v0.1-weights/'
                        'efficientnet_b0_ra-3dd342df.pth'),
    ('efficientnet_b1', 'https://github.com/rwightman/pytorch-image-models/releases/download/v0.1-weights/'
                        'efficientnet_b1-533bc792.pth'),
    ('efficientnet_b2', 'https://github.com/rwightman/pytorch-image-models/releases/download/v0.1-weights/'
                        'efficientnet_b2_ra-bcdf34b7.pth'),
    ('efficientnet_b3', 'https://github.com/rwightman/pytorch-image-models/releases/download/v0.1-weights/'
                        'efficientnet_b3_ra2-cf984f9c.pth'),
    ('facenet', 'https://github.com/timesler/facenet-pytorch/releases/download/v2.2.9/20180402-114759-vggface2.pt')):
  WEIGHTS[_name] = _one(_name, _url)

# BiT-M: Google's original .npz files (what timm 0.4.5 downloads)
for _v in ('R50x1', 'R50x3', 'R101x1', 'R101x3', 'R152x2', 'R152x4'):
  _name = f'bit_m_{_v.lower()}'
  WEIGHTS[_name] = _one(_name, f'https://storage.googleapis.com/bit_models/BiT-M-{_v}.npz')

# SigLIP / SigLIP 2 (Hugging Face safetensors + the processor config whose resize the converter records)
for _name, _repo in (
    ('siglip_b16_224', 'google/siglip-base-patch16-224'), ('siglip_b16_256', 'google/siglip-base-patch16-256'),
    ('siglip_b16_384', 'google/siglip-base-patch16-384'), ('siglip_so400m14_384', 'google/siglip-so400m-patch14-384'),
    ('siglip2_b16_224', 'google/siglip2-base-patch16-224'), ('siglip2_b16_256', 'google/siglip2-base-patch16-256'),
    ('siglip2_b16_384', 'google/siglip2-base-patch16-384'),
    ('siglip2_so400m14_384', 'google/siglip2-so400m-patch14-384'),
    ('siglip2_so400m16_384', 'google/siglip2-so400m-patch16-384')):
  WEIGHTS[_name] = _hf(_name, _repo, ('model.safetensors', 'preprocessor_config.json'), 'file', 'model.safetensors')

# OpenCLIP LAION-2B (open_clip's hf-hub files)
for _name, _repo in (('openclip_vit_b32_laion2b', 'laion/CLIP-ViT-B-32-laion2B-s34B-b79K'),
                     ('openclip_vit_b16_laion2b', 'laion/CLIP-ViT-B-16-laion2B-s34B-b88K'),
                     ('openclip_vit_l14_laion2b', 'laion/CLIP-ViT-L-14-laion2B-s32B-b82K')):
  WEIGHTS[_name] = _hf(_name, _repo, (OPEN_CLIP_FILES,), 'file')

# Hugging Face Flax / transformers families (registry 'hf:' entries): a save_pretrained folder
for _name, _repo in (
    ('clip_vit_b32', 'openai/clip-vit-base-patch32'), ('clip_vit_b16', 'openai/clip-vit-base-patch16'),
    ('clip_vit_l14', 'openai/clip-vit-large-patch14'), ('vit_b16', 'google/vit-base-patch16-224'),
    ('vit_l16', 'google/vit-large-patch16-224'), ('dinov2_s14', 'facebook/dinov2-small'),
    ('dinov2_b14', 'facebook/dinov2-base'), ('dinov2_l14', 'facebook/dinov2-large'),
    ('hf_resnet18', 'microsoft/resnet-18'), ('hf_resnet34', 'microsoft/resnet-34'),
    ('hf_resnet50', 'microsoft/resnet-50'), ('hf_resnet101', 'microsoft/resnet-101'),
    ('hf_resnet152', 'microsoft/resnet-152'), ('regnet_y_040', 'facebook/regnet-y-040'),
    ('regnet_y_080', 'facebook/regnet-y-080'), ('regnet_y_160', 'facebook/regnet-y-160'),
    ('regnet_y_320', 'facebook/regnet-y-320')):
  WEIGHTS[_name] = _hf(_name, _repo)

# DreamSim (ssundaram21/dreamsim dreamsim/config.py `dreamsim_weights`: GitHub release zips, unpacked as
# `dreamsim(cache_dir=...)` unpacks them) + the torch-hub base file its DINO / DINOv2 branches load
_DS = 'https://github.com/ssundaram21/dreamsim/releases/download'
_DINO = File('https://dl.fbaipublicfiles.com/dino/dino_vitbase16_pretrain/dino_vitbase16_pretrain.pth',
             'checkpoints/dino_vitbase16_pretrain.pth')
_DINOV2 = File('https://dl.fbaipublicfiles.com/dinov2/dinov2_vitb14/dinov2_vitb14_pretrain.pth',
               'checkpoints/dinov2_vitb14_pretrain.pth')
for _name, _release, _base in (
    ('ensemble', 'v0.2.0', _DINO), ('dino_vitb16', 'v0.2.0', _DINO), ('clip_vitb32', 'v0.2.0', None),
    ('open_clip_vitb32', 'v0.2.0', None), ('dinov2_vitb14', 'v0.2.1', _DINOV2), ('synclr_vitb16', 'v0.2.1', None),
    ('dino_vitb16_patch', 'v0.2.1', _DINO), ('dinov2_vitb14_patch', 'v0.2.1', _DINOV2)):
  _zip = File(f'{_DS}/{_release}-checkpoints/dreamsim_{_name}_checkpoint.zip', f'dreamsim_{_name}_checkpoint.zip')
  WEIGHTS[f'dreamsim_{_name}'] = Source(f'dreamsim_{_name}', (_zip,) + ((_base,) if _base else ()), 'folder', '.')
# DreamSim's starting points (training/train.py's members before LoRA): the ensemble zip's base files (the
# authors' DINO-layout CLIP / OpenCLIP ViT-B/16) + torch hub's DINO; the single model: torch hub's DINO alone
WEIGHTS['dreamsim_ensemble_pretrained'] = Source('dreamsim_ensemble_pretrained',
                                                 WEIGHTS['dreamsim_ensemble'].files, 'folder', '.')
WEIGHTS['dreamsim_dino_vitb16_pretrained'] = Source('dreamsim_dino_vitb16_pretrained', (_DINO,), 'folder', '.')

# ------------------------------------------------------------------------------------------------ data

_BAPPS = 'https://perceptual-similarity.s3.us-west-2.amazonaws.com/dataset'
DATA: dict[str, Source] = {
    # ssundaram21/dreamsim dataset/download_dataset.sh: nights.zip (58 GB) unzipped -> nights/data.csv, ref/, distort/
    'nights': Source('nights', (File('https://data.csail.mit.edu/nights/nights.zip', 'nights.zip'),), 'unpack'),
    # richzhang/PerceptualSimilarity scripts/download_dataset.sh: jnd -> dataset/, twoafc_* -> dataset/2afc/
    'bapps': Source('bapps', (File(f'{_BAPPS}/jnd.tar.gz', 'jnd.tar.gz'),
                              File(f'{_BAPPS}/twoafc_val.tar.gz', 'twoafc_val.tar.gz', into='2afc'),
                              File(f'{_BAPPS}/twoafc_train.tar.gz', 'twoafc_train.tar.gz', into='2afc')), 'unpack'),
    # scripts/download_dataset_valonly.sh: the validation sets only
    'bapps_val': Source('bapps_val', (File(f'{_BAPPS}/jnd.tar.gz', 'jnd.tar.gz'),
                                      File(f'{_BAPPS}/twoafc_val.tar.gz', 'twoafc_val.tar.gz', into='2afc')),
                        'unpack'),
    'things': Source('things', (), 'unpack', note=(
        'THINGS has no public direct archive: the images are a password-protected download from OSF '
        '(osf.io/jum2f, password in its README), the odd-one-out triplets at osf.io/f5rn6 (data/triplet_dataset); '
        'unpack both under ROOT (docs/benchmark.md gives the layout)')),
    'tll': Source('tll', (), 'unpack', note=(
        'Totally-Looks-Like (Rosenfeld et al. 2018) has no public direct URL: request it from the authors\' page '
        '(sites.google.com/view/totally-looks-like-dataset) and unpack it as ROOT/left/, ROOT/right/')),
}


MB: dict[str, int] = {  # approximate download size per weights name (module docstring)
    'clip_rn50': 244, 'clip_rn101': 278, 'clip_rn50x4': 402, 'clip_rn50x16': 630, 'clip_rn50x64': 1260,
    'resnet18': 47, 'resnet34': 87, 'resnet50': 103, 'resnet101': 179, 'resnet152': 242, 'alexnet': 244,
    'vgg16': 553, 'resnet50_ssl': 103, 'resnext101_32x8d_ssl': 356, 'resnext101_32x16d_ssl': 777,
    'resnet50_swsl': 103, 'resnext101_32x8d_swsl': 356, 'resnext101_32x16d_swsl': 777,
    'resnext101_32x8d_wsl': 356, 'resnext101_32x16d_wsl': 777, 'resnext101_32x32d_wsl': 1874,
    'resnext101_32x48d_wsl': 3317, 'barlow': 94, 'dino_resnet50': 94, 'deits16': 87, 'deits8': 87,
    'dino_vitb16': 343, 'dino_vitb8': 343, 'vit': 346, 'efficientnet_b0': 21, 'efficientnet_b1': 31,
    'efficientnet_b2': 37, 'efficientnet_b3': 49, 'facenet': 107,
    'bit_m_r50x1': 273, 'bit_m_r50x3': 1380, 'bit_m_r101x1': 349, 'bit_m_r101x3': 2064, 'bit_m_r152x2': 1286,
    'bit_m_r152x4': 4460,
    'siglip_b16_224': 813, 'siglip_b16_256': 813, 'siglip_b16_384': 814, 'siglip_so400m14_384': 3510,
    'siglip2_b16_224': 1500, 'siglip2_b16_256': 1500, 'siglip2_b16_384': 1500, 'siglip2_so400m14_384': 4550,
    'siglip2_so400m16_384': 4550,
    'openclip_vit_b32_laion2b': 605, 'openclip_vit_b16_laion2b': 599, 'openclip_vit_l14_laion2b': 1710,
    'clip_vit_b32': 605, 'clip_vit_b16': 599, 'clip_vit_l14': 1710, 'vit_b16': 346, 'vit_l16': 1220,
    'dinov2_s14': 88, 'dinov2_b14': 346, 'dinov2_l14': 1220, 'hf_resnet18': 47, 'hf_resnet34': 87,
    'hf_resnet50': 103, 'hf_resnet101': 179, 'hf_resnet152': 242, 'regnet_y_040': 83, 'regnet_y_080': 157,
    'regnet_y_160': 335, 'regnet_y_320': 581,
    'dreamsim_ensemble': 1050, 'dreamsim_dino_vitb16': 350, 'dreamsim_clip_vitb32': 350,
    'dreamsim_open_clip_vitb32': 350, 'dreamsim_dinov2_vitb14': 350, 'dreamsim_synclr_vitb16': 350,
    'dreamsim_dino_vitb16_patch': 350, 'dreamsim_dinov2_vitb14_patch': 350, 'dreamsim_ensemble_pretrained': 1050,
    'dreamsim_dino_vitb16_pretrained': 343,
}
MB.update({'nights': 58000, 'bapps': 6600, 'bapps_val': 1300})   # nights.zip 58 GB (DreamSim's README); BAPPS


def lookup(name: str) -> Source | None:
  return WEIGHTS.get(name) or DATA.get(name)


def size_text(name: str) -> str:
  """'about 1.2 GB' / 'about 350 MB' (MB), or 'size not recorded'."""
  mb = MB.get(name)
  if mb is None:
    return 'size not recorded'
  return f'about {f"{mb / 1000:.1f}".removesuffix(".0")} GB' if mb >= 1000 else f'about {mb} MB'


def checksum_text(f: File) -> str:
  """What the download of `f` is checked against: 'sha256', 'sha256 prefix' or 'none published'."""
  if not f.sha256:
    return 'none published'
  return 'sha256' if len(f.sha256) == 64 else 'sha256 prefix'


def remedy(name: str, where: str) -> str:
  """The one remedy of missing weights, as every message words it: the command, what it writes, its size."""
  return f'`python -m visim_jax.fetch {name}` (downloads {size_text(name)}; writes {where})'
