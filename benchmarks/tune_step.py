r"""A LoRA / full training step of a ViT tower: ours (training/tower_step.py, jitted) vs PyTorch + peft, interleaved.

  python benchmarks/tune_step.py --gpu_preset              # ViT-B/16, bfloat16 both sides, batch 32 triplets (GPU)
  python benchmarks/tune_step.py --preset=ensemble         # DreamSim's default: 3 ViT-B/16 members, LoRA, batch 16
  python benchmarks/tune_step.py --preset=alignet          # AligNet: SigLIP-B/16-sized ViT, full tuning, batch 512
  python benchmarks/tune_step.py --arch=tiny --batch=4     # a tiny ViT on a CPU (seconds; the tests run it)

The work (DreamSim's recipe, configs/train_*_lora.yaml): a DINO-layout ViT (timm names: fused `qkv`, exact GELU,
LayerNorm eps 1e-6) whose weights are random but the SAME on both sides (made in PyTorch, converted by
backbones/vit.to_flax), LoRA r 16 alpha 8 on every block's qkv (dropout 0: equal numbers), the feature 'cls' = token
0 of the last block before the final LayerNorm, images (B, 3, 224, 224, 3) normalised on the device, d = 1 - cos,
DreamSim's hinge (margin 0.05) on d0 - d1, Adam lr 3e-4 betas (0.5, 0.999), `--steps` steps per timed call.
  ours       tower_step.step_program: one jitted step (forward, backward, Adam), state donated; bfloat16 compute with
             float32 master weights (`--dtype`)
  reference  peft.get_peft_model(LoraConfig(r, alpha, target_modules=['qkv'])) on the same torch ViT (a plain
             LoRA Linear when peft is not installed: said in the JSON), torch.optim.Adam, torch.autocast(bfloat16)
             for `--dtype=bfloat16`, a Python loop; cuda when available
`--members=3` (the `ensemble` preset): three such ViTs with their own random weights, the three CLS features
concatenated (DreamSim's ensemble embedding; its CLIP / OpenCLIP members differ in layout, a pre-LayerNorm and a
768 -> 512 projection, not in the cost of a step), LoRA on every member's qkv, batch 16 triplets in bfloat16.
`--tune=full` (the `alignet` preset): every weight trains (AligNet's configs/siglip.py: batch 512 triplets in
micro-batches of `--micro_batch` with gradient accumulation, rematerialised blocks, Adam 3e-5, bfloat16 compute);
a ViT-B/16 of SigLIP's size (196 tokens, no CLS; the MAP head's cost is below 1%); there is no PyTorch reference
for it (AligNet's code is JAX): ours alone, `--alternations` timed calls.
Before timing, one step of each side from the same LoRA factors gives the same loss (rtol 2e-2 in bfloat16, 1e-4 in
float32). Each side's callable blocks until its result is computed; interleaved A B B A (benchmarks/interleaved.py),
median and spread, images per second (3 per triplet). Model FLOP utilisation (`mfu`): the step's model FLOPs (the
ViT's matrix products and attention counted from its shapes: forward, the backward's activation gradients, and for
full tuning the weight gradients; rematerialisation not counted) over the median time, against the card's dense
bfloat16 peak (`PEAK_TFLOPS`, by device kind) or, on a CPU, the box's SGEMM rate measured in the same run.
Prints one JSON object; `--budget_s` stops adding alternations once it is spent (the GPU plan's limit).
"""
from __future__ import annotations

import json
import math
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

precision.define_flag()
_GPU = flags.DEFINE_bool('gpu_preset', False, 'ViT-B/16, bfloat16, batch 32, 5 steps a call, 3 alternations, 80 s.')
_ARCH = flags.DEFINE_enum('arch', 'b16', ['b16', 'tiny'], 'ViT-B/16 (224 px) or the tiny test ViT (32 px).')
_BATCH = flags.DEFINE_integer('batch', 32, 'Triplets per step (3 images each).')
_STEPS = flags.DEFINE_integer('steps', 5, 'Steps per timed call.')
_ALT = flags.DEFINE_integer('alternations', 3, 'Timed (ours, reference) pairs, the order flipped each time.')
_DTYPE = flags.DEFINE_enum('dtype', 'float32', ['float32', 'bfloat16'], 'Compute dtype of both sides.')
_BUDGET = flags.DEFINE_float('budget_s', 0.0, 'Stop adding alternations after this many seconds (0: none).')
_THREADS = flags.DEFINE_integer('torch_threads', 0, "PyTorch's intra-op threads on a CPU (0: os.cpu_count()).")
_PRESET = flags.DEFINE_enum('preset', '', ['', 'vit_b16', 'ensemble', 'alignet'],
                            "GPU presets (module docstring); '' = the flags as given.")
_MEMBERS = flags.DEFINE_integer('members', 1, 'ViT towers whose CLS features are concatenated (DreamSim: 3).')
_TUNE = flags.DEFINE_enum('tune', 'lora', ['lora', 'full'], 'LoRA on qkv (DreamSim) or every weight (AligNet).')
_MICRO = flags.DEFINE_integer('micro_batch', 0, 'Triplets a pass (gradient accumulation; 0: the whole batch).')
_REMAT = flags.DEFINE_bool('remat', False, 'Rematerialise every block in the backward pass (ours).')
R, ALPHA, MARGIN, LR, BETAS = 16, 8.0, 0.05, 3e-4, (0.5, 0.999)
# dense bfloat16 peaks (TFLOP/s) by jax device_kind substring, from the vendors' data sheets (SXM / per chip)
PEAK_TFLOPS = {'H200': 989.0, 'H100': 989.0, 'A100': 312.0, 'L4': 121.0, 'A10': 125.0, 'TPU v4': 275.0,
               'TPU v5 lite': 197.0, 'TPU v5e': 197.0, 'TPU v5p': 459.0, 'TPU v5': 459.0, 'TPU v6 lite': 918.0}
# preset -> flag values (the GPU plan's rows)
PRESETS = {
    'vit_b16': dict(arch='b16', batch=32, steps=5, dtype='bfloat16', alternations=3, budget_s=80.0),
    'ensemble': dict(arch='b16', members=3, batch=16, steps=5, dtype='bfloat16', alternations=3, budget_s=120.0),
    'alignet': dict(arch='b16', tune='full', batch=512, micro_batch=64, remat=True, steps=1, dtype='bfloat16',
                    alternations=3, budget_s=150.0),
}


def vit_forward_flops(arch, images: int, cls: bool = True) -> float:
  """FLOPs of a ViT's forward on `images` (its matrix products and attention; LayerNorm, GELU, softmax not
  counted): per block 24 T D^2 (qkv 6, proj 2, MLP 16 at ratio 4) + 4 T^2 D (scores and values), + the patch
  embedding 2 T (3 p^2) D; T tokens (+1 for a CLS)."""
  t = (arch.image_size // arch.patch) ** 2 + int(cls)
  d = arch.width
  block = 2 * t * d * (3 * d + d + 2 * arch.mlp_ratio * d) + 4 * t * t * d
  return float(images) * (arch.depth * block + 2 * t * 3 * arch.patch ** 2 * d)


def model_flops(arch, members: int, images: int, tune: str) -> float:
  """A training step's model FLOPs: forward + the backward's activation gradients (= forward), + the weight
  gradients (= forward) when every weight trains (LoRA's factors cost < 1%); recomputation (remat) not counted."""
  return vit_forward_flops(arch, images) * members * (3 if tune == 'full' else 2)


def peak_tflops(device) -> float | None:
  kind = getattr(device, 'device_kind', '')
  for k in sorted(PEAK_TFLOPS, key=len, reverse=True):
    if k.lower() in kind.lower():
      return PEAK_TFLOPS[k]
  return None


def torch_vit(arch, seed: int = 0):
  """A DINO / timm-layout ViT in PyTorch (no head): forward(x NCHW) -> token 0 of the last block's output."""
  import torch
  from torch import nn

  class Attention(nn.Module):
    def __init__(self, c, h):
      super().__init__()
      self.h, self.qkv, self.proj = h, nn.Linear(c, 3 * c), nn.Linear(c, c)

    def forward(self, x):
      n, t, c = x.shape
      q, k, v = self.qkv(x).reshape(n, t, 3, self.h, c // self.h).permute(2, 0, 3, 1, 4)
      a = ((q * (c // self.h) ** -0.5) @ k.transpose(-2, -1)).softmax(-1)
      return self.proj((a @ v).transpose(1, 2).reshape(n, t, c))

  class Mlp(nn.Module):
    def __init__(self, c, hidden):
      super().__init__()
      self.fc1, self.act, self.fc2 = nn.Linear(c, hidden), nn.GELU(), nn.Linear(hidden, c)

    def forward(self, x):
      return self.fc2(self.act(self.fc1(x)))

  class Block(nn.Module):
    def __init__(self, c, h, ratio):
      super().__init__()
      self.norm1, self.attn = nn.LayerNorm(c, eps=1e-6), Attention(c, h)
      self.norm2, self.mlp = nn.LayerNorm(c, eps=1e-6), Mlp(c, ratio * c)

    def forward(self, x):
      x = x + self.attn(self.norm1(x))
      return x + self.mlp(self.norm2(x))

  class PatchEmbed(nn.Module):
    def __init__(self, c, p):
      super().__init__()
      self.proj = nn.Conv2d(3, c, p, p)

    def forward(self, x):
      return self.proj(x).flatten(2).transpose(1, 2)

  class ViT(nn.Module):
    def __init__(self, a):
      super().__init__()
      c = a.width
      self.patch_embed = PatchEmbed(c, a.patch)
      self.cls_token = nn.Parameter(torch.randn(1, 1, c) * 0.02)
      self.pos_embed = nn.Parameter(torch.randn(1, (a.image_size // a.patch) ** 2 + 1, c) * 0.02)
      self.blocks = nn.ModuleList([Block(c, a.heads, a.mlp_ratio) for _ in range(a.depth)])
      self.norm = nn.LayerNorm(c, eps=1e-6)   # unused by the 'cls' feature (before the final norm), as DreamSim

    def forward(self, x):
      x = self.patch_embed(x)
      x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], 1) + self.pos_embed
      for b in self.blocks:
        x = b(x)
      return x[:, 0]
  torch.manual_seed(seed)
  return ViT(arch)


def setup(arch, batch: int, dtype: str, steps: int, members: int = 1, tune: str = 'lora', micro: int = 0,
          remat: bool = False):
  """(ours(), reference() or None, first-step losses, what the reference is, device)."""
  import torch
  from visim_jax.backbones import vit
  from visim_jax.core import sharding
  from visim_jax.models import lora
  from visim_jax.training import tower_step
  dev = 'cuda' if torch.cuda.is_available() else 'cpu'
  torch.set_num_threads(_THREADS.value or os.cpu_count() or 1)
  towers = [torch_vit(arch, seed=i) for i in range(members)]
  model = towers[0] if members == 1 else _Concat(towers)
  sds = [{k: v.detach().numpy() for k, v in t.state_dict().items()} for t in towers]
  if members == 1:
    variables = jax.tree.map(jnp.asarray, vit.to_flax(sds[0], 'benchmark'))
    apply_fn = lambda v, x: vit.apply_vit(arch, v, x)
    layers = (f'block{arch.depth}',)
  else:   # DreamSim's ensemble: each member applied to its own subtree, the CLS features concatenated
    variables = {'params': {f'm{i}': jax.tree.map(jnp.asarray, vit.to_flax(sd, 'benchmark'))['params']
                            for i, sd in enumerate(sds)}}

    def apply_fn(v, x):
      feats = [vit.apply_vit(arch, {'params': v['params'][f'm{i}']}, x)[1][f'block{arch.depth}'][:, 0]
               for i in range(members)]
      cat = jnp.concatenate(feats, -1)
      return cat, {'concat': cat}
    layers = ('final',)
  pre = vit.preprocess_for('vit', 'seed', arch.image_size)
  backbone = type('B', (), {'apply_fn': staticmethod(apply_fn), 'preprocess': pre, 'layers': layers})
  tower = tower_step.tower(backbone)
  accum = batch // micro if micro else 1
  if tune == 'full':   # AligNet: every weight, Adam 3e-5 (b1 0.9), decay towards the pretrained weights
    hp = tower_step.Hparams(tune='full', loss='hinge', margin=MARGIN, lr=3e-5, b1=0.9, b2=0.999, weight_decay=1.0,
                            compute_dtype=dtype, steps=10**6, accum_steps=accum, remat=remat)
  else:
    hp = tower_step.Hparams(tune='lora', lora=lora.Config(R, ALPHA, 0.0, ('qkv',)), loss='hinge', margin=MARGIN,
                            lr=LR, b1=BETAS[0], b2=BETAS[1], compute_dtype=dtype, steps=10**6, accum_steps=accum,
                            remat=remat)
  mesh = sharding.train_mesh(1)
  state, frozen = tower_step.init_state(hp, tower, variables)
  rng = np.random.RandomState(0)
  s = arch.image_size
  images = rng.randint(0, 256, (batch, 3, s, s, 3)).astype(np.uint8)
  judge = rng.randint(0, 2, batch).astype(np.float32)
  a0 = ({k: np.asarray(v['a']) for k, v in state.trainable['lora'].items()} if tune == 'lora' else {})
  state, frozen, jbatch = tower_step.place(mesh, state, frozen, tower_step.Batch(images, judge))
  program = tower_step.step_program(hp, tower, mesh)
  box = {'state': state}

  def ours(n=steps):
    st = box['state']
    for _ in range(n):
      st, m = program(st, frozen, jbatch)
    jax.block_until_ready(st)
    box['state'] = st
    return float(m['loss'])

  if tune == 'full' or micro:
    return ours, None, {'ours': ours(1)}, 'none (ours alone)', dev
  # the reference: peft's LoRA (or a plain one) on the same weights, the same A factors, B = 0
  try:
    import peft
    pm = peft.get_peft_model(model, peft.LoraConfig(r=R, lora_alpha=ALPHA, lora_dropout=0.0, bias='none',
                                                     target_modules=['qkv']))
    kind = f'peft {peft.__version__} LoRA on qkv'
    loras = {n: m for n, m in pm.named_modules() if n.endswith('qkv') and hasattr(m, 'lora_A')}
    with torch.no_grad():
      for n, m in loras.items():
        i = int(n.split('blocks.')[1].split('.')[0])
        key = f'blocks_{i}/attn/qkv' if members == 1 else f'm{n.split("towers.")[1].split(".")[0]}/blocks_{i}/attn/qkv'
        m.lora_A['default'].weight.copy_(torch.from_numpy(a0[key].T))
  except ImportError:
    pm, kind = _plain_lora(model, a0), 'a plain LoRA Linear (peft is not installed)'
  pm = pm.to(dev)
  params = [p for p in pm.parameters() if p.requires_grad]
  opt = torch.optim.Adam(params, lr=LR, betas=BETAS)
  mean = torch.tensor(pre.mean, device=dev).view(1, 3, 1, 1)
  std = torch.tensor(pre.std, device=dev).view(1, 3, 1, 1)
  x = torch.from_numpy(images).to(dev).reshape(batch * 3, s, s, 3).permute(0, 3, 1, 2)
  y = 2 * torch.from_numpy(judge).to(dev) - 1

  def reference(n=steps):
    for _ in range(n):
      opt.zero_grad(set_to_none=True)
      with torch.autocast(device_type=dev, dtype=torch.bfloat16, enabled=dtype == 'bfloat16'):
        e = pm((x.float() - mean) / std).float().reshape(batch, 3, -1)
      e = torch.nn.functional.normalize(e, dim=-1)
      d0 = 1 - (e[:, 0] * e[:, 1]).sum(-1)
      d1 = 1 - (e[:, 0] * e[:, 2]).sum(-1)
      loss = torch.clamp(MARGIN - (d0 - d1) * y, min=0).mean()
      loss.backward()
      opt.step()
    if dev == 'cuda':
      torch.cuda.synchronize()
    return float(loss)
  first = {'ours': ours(1), 'reference': reference(1)}
  return ours, reference, first, kind, dev


def _Concat(towers):
  """The torch ensemble: forward(x) = the members' CLS features concatenated (`towers.<i>` names)."""
  import torch
  from torch import nn

  class Concat(nn.Module):
    def __init__(self):
      super().__init__()
      self.towers = nn.ModuleList(towers)

    def forward(self, x):
      return torch.cat([t(x) for t in self.towers], -1)
  return Concat()


def _plain_lora(model, a0):
  import torch
  from torch import nn

  class LoraLinear(nn.Module):
    def __init__(self, base, a):
      super().__init__()
      self.base = base.requires_grad_(False)
      self.a = nn.Parameter(torch.from_numpy(a.T.copy()))
      self.b = nn.Parameter(torch.zeros(base.out_features, R))

    def forward(self, x):
      return self.base(x) + (x @ self.a.T @ self.b.T) * (ALPHA / R)
  model.requires_grad_(False)
  towers = list(model.towers) if hasattr(model, 'towers') else [model]
  for t, tower in enumerate(towers):
    for i, blk in enumerate(tower.blocks):
      key = f'blocks_{i}/attn/qkv' if len(towers) == 1 else f'm{t}/blocks_{i}/attn/qkv'
      blk.attn.qkv = LoraLinear(blk.attn.qkv, a0[key])
  return model


def main(argv):
  del argv
  t0 = time.time()
  from visim_jax.backbones import vit
  prec = precision.apply()
  preset = 'vit_b16' if _GPU.value else _PRESET.value
  f = {'arch': _ARCH.value, 'batch': _BATCH.value, 'steps': _STEPS.value, 'dtype': _DTYPE.value,
       'alternations': _ALT.value, 'budget_s': _BUDGET.value, 'members': _MEMBERS.value, 'tune': _TUNE.value,
       'micro_batch': _MICRO.value, 'remat': _REMAT.value}
  if preset:
    f.update(PRESETS[preset])
  arch = vit.TINY if f['arch'] == 'tiny' else vit.ARCHS['dino_vitb16']
  batch, steps, dtype = f['batch'], f['steps'], f['dtype']
  ours, ref, first, kind, dev = setup(arch, batch, dtype, steps, f['members'], f['tune'], f['micro_batch'],
                                      f['remat'])
  tol = 2e-2 if dtype == 'bfloat16' else 1e-4
  if ref is not None and not math.isclose(first['ours'], first['reference'], rel_tol=tol, abs_tol=tol * 1e-2):
    raise SystemExit(f'first-step losses differ: {first}')
  sides = {'ours': ours} if ref is None else {'ours': ours, 'reference': ref}
  for fn in sides.values():   # warm-up: compiled, cuDNN tuned
    fn()
  times = {k: [] for k in sides}
  for i in range(f['alternations']):   # interleaved.interleaved's A B, B A, ... with a time budget
    if i and f['budget_s'] and time.time() - t0 > f['budget_s'] * 0.75:
      break
    for k in (list(sides) if i % 2 == 0 else list(sides)[::-1]):
      time.sleep(getattr(interleaved, 'PAUSE_S', 0.0))   # the other side's worker threads idle first
      t = time.perf_counter()
      sides[k]()
      times[k].append(time.perf_counter() - t)
  images = steps * batch * 3
  size = 'B/16' if arch.width == 768 else 'tiny'
  name = (f'ViT-{size} {"x" + str(f["members"]) + " ensemble " if f["members"] > 1 else ""}'
          f'{"full" if f["tune"] == "full" else "LoRA"} step ({dtype}, batch {batch} triplets'
          f'{", micro-batches of " + str(f["micro_batch"]) if f["micro_batch"] else ""}'
          f'{", remat" if f["remat"] else ""})')
  # model FLOP utilisation of our step: against the card's bf16 peak, or this CPU's SGEMM rate measured now
  flops = model_flops(arch, f['members'], steps * batch * 3, f['tune'])
  t_ours = float(np.median(times['ours']))
  peak = peak_tflops(jax.devices()[0])
  if peak is None and jax.default_backend() == 'cpu':
    peak = interleaved.sgemm_gflops(1024, 768, 3072, alternations=2)['best'] / 1e3
  mfu = {'model_flops_per_step': flops / steps, 'achieved_tflops': flops / t_ours / 1e12, 'peak_tflops': peak,
         'mfu': (flops / t_ours / 1e12 / peak) if peak else None,
         'peak_source': ('data sheet, dense bf16' if peak_tflops(jax.devices()[0]) else 'this CPU\'s SGEMM now')}
  if ref is None:
    stats = {'ours_median_s': t_ours, 'ours_s': times['ours'], 'images_per_s': images / t_ours}
    rows = []
  else:
    stats = interleaved.compare(times['ours'], times['reference'], work=images, unit='images')
    rows = [interleaved.row(name, stats, 'ours: tower_step jitted', f'PyTorch + {kind}', 'images')]
  res = {'benchmark': 'tune_step', 'preset': preset or None, 'name': name,
         'arch': 'b16' if arch.width == 768 else 'tiny', 'members': f['members'], 'tune': f['tune'],
         'batch_triplets': batch, 'micro_batch': f['micro_batch'], 'remat': f['remat'],
         'steps_per_call': steps, 'dtype': dtype, 'device': dev, 'jax_backend': jax.default_backend(),
         'device_kind': getattr(jax.devices()[0], 'device_kind', ''), 'precision': prec, 'reference': kind,
         'torch_threads': __import__('torch').get_num_threads(), 'first_step_loss': first, 'stats': stats,
         'images_per_s_ours': images / t_ours, 'mfu': mfu, 'rows': rows, 'wall_s': time.time() - t0}
  print(json.dumps(res, indent=1, default=float))


if __name__ == '__main__':
  from visim_jax.core import errors  # pylint: disable=g-import-not-at-top
  app.run(main, flags_parser=errors.flags_parser)   # one-line flag errors; --help exits 0
