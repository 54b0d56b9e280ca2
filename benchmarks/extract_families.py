r"""Feature extraction of one member per Table 1 family: our jitted path vs PyTorch on the same weights, same run.

  python benchmarks/extract_families.py                                    # CPU-sized (a few minutes, 2 cores)
  python benchmarks/extract_families.py --batch=128 --batches=10           # a GPU
  python benchmarks/extract_families.py --members=resnet50,alexnet
  python benchmarks/extract_families.py --members=siglip_b16_224      # vs transformers' torch SiglipVisionModel
  python benchmarks/extract_families.py --members=dreamsim_ensemble --batches=6   # DreamSim vs its PyTorch forward

For each member: a PyTorch model with random weights (timing does not depend on their values) is converted by
backbones/convert.py (the same path as the public checkpoints) and loaded into ours, so both run the same weights.
PyTorch side: the reference implementation when installed (torchvision for the ResNets / AlexNet, timm for BiT and
the ViTs, geffnet for EfficientNet, facenet-pytorch for FaceNet),
otherwise the PyTorch reference written in the parity tests (the same layers; the JSON says which), run the way the
seed code extracts: forward hooks on the default layers' modules, then per-layer spatial mean + L2 + concat,
`torch.inference_mode`, in --torch_dtype (default: the same dtype as ours; --precision for float32 matmuls).
Ours: `features.make_extract_fn` (uint8 in, normalise + network + pooling, one jitted program), --dtype.
Both are timed on inputs already on the device, interleaved (A B B A ..., --batches alternations, at least 3,
after one warm-up call each): images/s as the median over the calls, with the [slowest, fastest] spread; our
compile time is reported apart. The float32 pooled features are compared (max |diff|). Prints one JSON object.

MEMBERS: name -> function returning (torch module, {our layer: torch module path}, label).
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, 'tests'))  # the parity tests' PyTorch references (fallback)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from visim_jax.backbones import features  # noqa: E402
import precision  # noqa: E402  (benchmarks/precision.py; sys.path[0] is this folder)
from visim_jax.backbones import convert, get_backbone  # noqa: E402

_MEMBERS = flags.DEFINE_list('members', ['resnet50', 'bit_m_r50x1', 'alexnet', 'dino_vitb16', 'efficientnet_b0',
                                          'facenet'], 'Members to time.')
_BATCH = flags.DEFINE_integer('batch', 4, 'Images per batch (GPU: 128).')
_BATCHES = flags.DEFINE_integer('batches', 3, 'Interleaved alternations: one timed batch per side each (>= 3).')
_DTYPE = flags.DEFINE_enum('dtype', 'float32', ['float32', 'bfloat16'], 'Our compute dtype.')
precision.define_flag()
_TORCH_DTYPE = flags.DEFINE_enum('torch_dtype', 'auto', ['auto', 'float32', 'bfloat16', 'float16'],
                                 'PyTorch dtype; auto = the same as --dtype (same precision on both sides).')


def _torchvision_resnet(name):
  from visim_jax.backbones import resnet
  hooks = {f'stage{i}': f'layer{i}' for i in range(1, 5)}
  try:
    import torchvision
    ctor = {'resnet50': torchvision.models.resnet50, 'resnext101_32x8d_wsl': torchvision.models.resnext101_32x8d,
            'resnet18': torchvision.models.resnet18}[name]
    return ctor(), hooks, f'torchvision {torchvision.__version__} models.{ctor.__name__}'
  except ImportError:
    from test_backbones_resnet import RefResNet
    return RefResNet(resnet.MEMBERS[name][0], 1000), hooks, 'tests/test_backbones_resnet.py RefResNet'


def _timm_bit(name):
  from visim_jax.backbones import bit
  hooks = {'stage1': 'stages.0', 'stage2': 'stages.1', 'stage3': 'stages.2', 'norm': 'norm'}
  try:
    import timm
    return timm.create_model(bit.MEMBERS[name][1], pretrained=False), hooks, f'timm {timm.__version__}'
  except ImportError:
    from test_backbones_bit import RefResNetV2
    return RefResNetV2(bit.MEMBERS[name][0], 1000), hooks, 'tests/test_backbones_bit.py RefResNetV2 (timm 0.4.5 layers)'


def _torchvision_alexnet(name):
  from visim_jax.backbones import alexnet
  try:
    import torchvision
    return torchvision.models.alexnet(), {'features': 'features'}, f'torchvision {torchvision.__version__} models.alexnet'
  except ImportError:
    from test_backbones_alexnet import RefAlexNet
    return RefAlexNet(alexnet.CONVS), {'features': 'features'}, 'tests/test_backbones_alexnet.py RefAlexNet'


def _timm_vit(name):
  """DINO hub ViTs are timm's ViT with no head: the seed hooks `head` (Identity) = the CLS token after the norm."""
  from visim_jax.backbones import vit
  a = vit.ARCHS[name]
  try:
    import timm
    model = timm.VisionTransformer(patch_size=a.patch, embed_dim=a.width, depth=a.depth, num_heads=a.heads,
                                   num_classes=0)
    return model, {'pooled': 'head'}, f'timm {timm.__version__} VisionTransformer'
  except ImportError:
    from test_backbones_vit import RefViT
    return RefViT(a), {'pooled': 'head'}, 'tests/test_backbones_vit.py RefViT'


def _geffnet_efficientnet(name):
  """gen-efficientnet (the seed's hub repo) when installed; the seed hooks `global_pool` (mean of the head)."""
  from visim_jax.backbones import efficientnet
  try:
    import geffnet
    return getattr(geffnet, name)(), {'head': 'global_pool'}, f'geffnet {geffnet.__version__}'
  except ImportError:
    from test_backbones_efficientnet_b import RefEfficientNet
    return (RefEfficientNet(efficientnet.ARCHS[name]), {'head': 'global_pool'},
            'tests/test_backbones_efficientnet_b.py RefEfficientNet')


def _facenet_pytorch(name):
  """facenet-pytorch's InceptionResnetV1 when installed; the seed hooks `block8`."""
  from visim_jax.backbones import inception_resnet_v1
  try:
    from facenet_pytorch import InceptionResnetV1
    return InceptionResnetV1(), {'block8': 'block8'}, 'facenet-pytorch InceptionResnetV1'
  except ImportError:
    from test_backbones_facenet import RefInceptionResnetV1
    return (RefInceptionResnetV1(inception_resnet_v1.FULL), {'block8': 'block8'},
            'tests/test_backbones_facenet.py RefInceptionResnetV1')


def _transformers_siglip(name):
  """transformers' torch SiglipVisionModel of the member's config (default attention implementation); the
  MAP head's output (`vision_model.head`) is HF's pooler_output, our 'pooled'."""
  import transformers
  from visim_jax.backbones import siglip
  a = siglip.ARCHS[name]
  config = transformers.SiglipVisionConfig(hidden_size=a.width, intermediate_size=a.mlp_dim, num_hidden_layers=a.depth,
                                           num_attention_heads=a.heads, image_size=a.image_size, patch_size=a.patch)
  return (transformers.SiglipVisionModel(config), {'pooled': 'vision_model.head'},
          f'transformers {transformers.__version__} SiglipVisionModel ({config._attn_implementation} attention)')


# name -> builder(name) -> (torch module with the public state-dict names, {our layer: torch module path}, label)
MEMBERS = {
    'resnet50': _torchvision_resnet,
    'resnet18': _torchvision_resnet,
    'resnext101_32x8d_wsl': _torchvision_resnet,
    'bit_m_r50x1': _timm_bit,
    'alexnet': _torchvision_alexnet,
    'dino_vitb16': _timm_vit,
    'deits16': _timm_vit,
    'efficientnet_b0': _geffnet_efficientnet,
    'facenet': _facenet_pytorch,
    'siglip_b16_224': _transformers_siglip,
}


def interleaved(fa, fb, alternations):
  """Per-call seconds of fa and fb run A B B A A B ... (`alternations` >= 3 pairs, after one warm-up each)."""
  fa(), fb()
  times = {fa: [], fb: []}
  for i in range(max(3, alternations)):
    for f in ((fa, fb) if i % 2 == 0 else (fb, fa)):
      t = time.perf_counter()
      f()
      times[f].append(time.perf_counter() - t)
  return times[fa], times[fb]


def _rate(batch, seconds):
  """(median images/s, [slowest, fastest] images/s) of per-batch seconds."""
  return batch / float(np.median(seconds)), [batch / max(seconds), batch / min(seconds)]


def bench(name, tmp, torch, tdev, tdtype):
  model, hooks, label = MEMBERS[name](name)
  model = model.eval()
  torch.save(model.state_dict(), os.path.join(tmp, f'{name}.pth'))
  out = os.path.join(tmp, f'{name}.safetensors')
  convert.convert(name, os.path.join(tmp, f'{name}.pth'), out)
  bb = get_backbone(name, weights=out)
  layers = tuple(hooks)
  assert layers == bb.layers, (layers, bb.layers)
  b, size = _BATCH.value, bb.preprocess.size
  x = np.random.default_rng(0).integers(0, 256, (b, size, size, 3), dtype=np.uint8)
  r = {'image_size': size, 'layers': list(layers), 'dim': int(sum(bb.layer_dims(layers).values()))
       if hasattr(bb, 'layer_dims') else int(sum(features.layer_dims(bb, layers).values()))}

  fn = features.make_extract_fn(bb, layers, jnp.dtype(_DTYPE.value))
  variables, dev_x = jax.device_put(bb.variables), jax.device_put(x)
  t0 = time.perf_counter()
  ours = np.asarray(jax.block_until_ready(fn(variables, dev_x)))
  r['ours_compile_s'] = time.perf_counter() - t0

  captured = {}
  modules = dict(model.named_modules())
  for ours_name, path in hooks.items():
    if path not in modules and path.startswith('vision_model.'):
      path = path[len('vision_model.'):]    # transformers 5's SiglipVisionModel holds the tower's modules directly
    modules[path].register_forward_hook(lambda m, i, o, k=ours_name: captured.__setitem__(k, o))
  xn = torch.from_numpy(np.asarray(bb.preprocess.normalise(x)).transpose(0, 3, 1, 2).copy())

  def run_torch(model, xt):
    with torch.inference_mode():
      model(xt)
      maps = [captured[l].float() for l in layers]  # (N, C, H, W) maps are averaged, (N, C) vectors kept
      pooled = [torch.nn.functional.normalize(m.mean(dim=(2, 3)) if m.ndim == 4 else m, dim=1, eps=1e-12)
                for m in maps]
      out = torch.cat(pooled, dim=1)
    if tdev == 'cuda':
      torch.cuda.synchronize()
    return out

  model_t, xt = model.to(tdev, tdtype), xn.to(tdev, tdtype)
  r['reference'] = f'{label} on PyTorch {torch.__version__} ({tdev}, {str(tdtype).replace("torch.", "")}), hooks'
  t_ours, t_ref = interleaved(lambda: jax.block_until_ready(fn(variables, dev_x)), lambda: run_torch(model_t, xt),
                              _BATCHES.value)
  r['ours_images_per_s'], r['ours_images_per_s_spread'] = _rate(b, t_ours)
  r['reference_images_per_s'], r['reference_images_per_s_spread'] = _rate(b, t_ref)
  r['timed_batches_each'] = len(t_ours)
  r['speedup'] = r['ours_images_per_s'] / r['reference_images_per_s']
  want = run_torch(model.to(tdev, torch.float32), xn.to(tdev)).cpu().numpy()
  got = ours if _DTYPE.value == 'float32' else np.asarray(features.make_extract_fn(bb, layers)(variables, dev_x))
  r['max_abs_diff_pooled_fp32'] = float(np.abs(got - want).max())
  return r


def bench_dreamsim(name, tmp, torch, tdev, tdtype):
  """DreamSim: random full-size weights + a random LoRA adapter written in the layout of DreamSim's cache_dir,
  converted (LoRA merged) and loaded into ours; PyTorch side: the parity test's RefDreamSim, DreamSim's forward
  with peft's unmerged LoRA path (what `dreamsim(pretrained=True)` runs: PeftModel does not merge), on the same
  weights. Timed interleaved (`interleaved`), per-batch seconds: median and spread."""
  from test_backbones_dreamsim import RefDreamSim
  import pathlib
  r_lora, alpha = 16, 8  # DreamSim's ensemble training config (lora_r 16, lora_alpha 8)
  model = RefDreamSim(name, r_lora, alpha / r_lora, seed=0, tiny=False).eval()
  folder = pathlib.Path(tmp) / name
  model.write_cache_dir(folder, name, alpha, r_lora, 'safetensors')
  out = os.path.join(tmp, f'{name}.safetensors')
  convert.convert(name, str(folder), out)
  bb = get_backbone(name, weights=out)
  layers = bb.layers
  b, size = _BATCH.value, bb.preprocess.size
  x = np.random.default_rng(0).integers(0, 256, (b, size, size, 3), dtype=np.uint8)
  r = {'image_size': size, 'layers': list(layers), 'dim': int(sum(bb.layer_dims(layers).values()))}
  fn = features.make_extract_fn(bb, layers, jnp.dtype(_DTYPE.value))
  variables, dev_x = jax.device_put(bb.variables), jax.device_put(x)
  t0 = time.perf_counter()
  ours = np.asarray(jax.block_until_ready(fn(variables, dev_x)))
  r['ours_compile_s'] = time.perf_counter() - t0
  xn = torch.from_numpy(np.asarray(bb.preprocess.normalise(x)).transpose(0, 3, 1, 2).copy())
  model_t, xt = model.to(tdev, tdtype), xn.to(tdev, tdtype)

  def run_torch():
    with torch.inference_mode():
      out = model_t(xt)['embedding']
    if tdev == 'cuda':
      torch.cuda.synchronize()
    return out

  t_ours, t_ref = interleaved(lambda: jax.block_until_ready(fn(variables, dev_x)), run_torch, _BATCHES.value)
  r['ours_images_per_s'], r['ours_images_per_s_spread'] = _rate(b, t_ours)
  r['reference_images_per_s'], r['reference_images_per_s_spread'] = _rate(b, t_ref)
  r['timed_batches_each'] = len(t_ours)
  r['reference'] = (f'tests/test_backbones_dreamsim.py RefDreamSim (DreamSim forward, unmerged LoRA) on PyTorch '
                    f'{torch.__version__} ({tdev}, {str(tdtype).replace("torch.", "")})')
  r['speedup'] = r['ours_images_per_s'] / r['reference_images_per_s']
  with torch.inference_mode():
    want = model.to(tdev, torch.float32)(xn.to(tdev))['embedding'].cpu().numpy()
  got = ours if _DTYPE.value == 'float32' else np.asarray(features.make_extract_fn(bb, layers)(variables, dev_x))
  r['max_abs_diff_pooled_fp32'] = float(np.abs(got - want).max())
  return r


SPECIAL = {'dreamsim_ensemble': bench_dreamsim}  # members with their own bench function (not hook-and-pool)


def main(_):
  import torch
  torch.set_num_threads(os.cpu_count())
  prec = precision.apply()
  cuda = torch.cuda.is_available()
  tdev = 'cuda' if cuda else 'cpu'
  tdtype = {'auto': torch.bfloat16 if _DTYPE.value == 'bfloat16' else torch.float32, 'float32': torch.float32,
            'bfloat16': torch.bfloat16, 'float16': torch.float16}[_TORCH_DTYPE.value]
  unknown = sorted(set(_MEMBERS.value) - set(MEMBERS) - set(SPECIAL))
  if unknown:
    raise app.UsageError(f'--members: {unknown} unknown; known: {", ".join(list(MEMBERS) + list(SPECIAL))}')
  result = {'benchmark': 'extract_families', 'devices': [str(d) for d in jax.devices()],
            'device_kind': jax.devices()[0].device_kind, 'platform': jax.default_backend(), 'batch': _BATCH.value,
            'batches': _BATCHES.value, 'dtype': _DTYPE.value, 'torch_dtype': str(tdtype).replace('torch.', ''),
            'precision': prec, 'host_cpus': os.cpu_count(), 'members': {}}
  with tempfile.TemporaryDirectory() as tmp:
    for name in _MEMBERS.value:
      torch.manual_seed(0)
      print(f'[extract_families] {name}', file=sys.stderr, flush=True)
      result['members'][name] = SPECIAL.get(name, bench)(name, tmp, torch, tdev, tdtype)
  load = [round(x, 2) for x in os.getloadavg()]
  result['rows'] = [{'capability': f'extraction, {name} {m.get("layers")}, batch {_BATCH.value}, {_DTYPE.value} '
                                   f'(PyTorch {result["torch_dtype"]})',
                     'ours': f'ours (jitted Flax): {m["ours_images_per_s"]:.4g} images/s',
                     'reference': f'{m.get("reference", "PyTorch")}: {m["reference_images_per_s"]:.4g} images/s',
                     'ratio': m.get('speedup'), 'spread': None, 'load_average': load}
                    for name, m in result['members'].items() if 'ours_images_per_s' in m]
  print(json.dumps(result, indent=1))


if __name__ == '__main__':
  from visim_jax.core import errors  # pylint: disable=g-import-not-at-top
  app.run(main, flags_parser=errors.flags_parser)   # one-line flag errors; --help exits 0
