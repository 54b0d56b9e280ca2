r"""A LoRA training step of a ViT: ours (training/tower_step.py, jitted) vs PyTorch + peft, the same work, interleaved.

  python benchmarks/tune_step.py --gpu_preset              # ViT-B/16, bfloat16 both sides, batch 32 triplets (GPU)
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
Before timing, one step of each side from the same LoRA factors gives the same loss (rtol 2e-2 in bfloat16, 1e-4 in
float32). Each side's callable blocks until its result is computed; interleaved A B B A (benchmarks/interleaved.py),
median and spread, images per second (3 per triplet). Prints one JSON object; `--budget_s` stops adding alternations
once it is spent (the GPU plan's limit).
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
R, ALPHA, MARGIN, LR, BETAS = 16, 8.0, 0.05, 3e-4, (0.5, 0.999)


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


def setup(arch, batch: int, dtype: str, steps: int):
  """(ours(), reference(), first-step losses, what the reference is)."""
  import torch
  from visim_jax.backbones import vit
  from visim_jax.core import sharding
  from visim_jax.models import lora
  from visim_jax.training import tower_step
  dev = 'cuda' if torch.cuda.is_available() else 'cpu'
  torch.set_num_threads(_THREADS.value or os.cpu_count() or 1)
  model = torch_vit(arch)
  sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
  variables = jax.tree.map(jnp.asarray, vit.to_flax(sd, 'benchmark'))
  pre = vit.preprocess_for('vit', 'seed', arch.image_size)
  backbone = type('B', (), {'apply_fn': staticmethod(lambda v, x: vit.apply_vit(arch, v, x)), 'preprocess': pre,
                            'layers': (f'block{arch.depth}',)})
  tower = tower_step.tower(backbone)
  hp = tower_step.Hparams(tune='lora', lora=lora.Config(R, ALPHA, 0.0, ('qkv',)), loss='hinge', margin=MARGIN,
                          lr=LR, b1=BETAS[0], b2=BETAS[1], compute_dtype=dtype, steps=10**6)
  mesh = sharding.train_mesh(1)
  state, frozen = tower_step.init_state(hp, tower, variables)
  rng = np.random.RandomState(0)
  s = arch.image_size
  images = rng.randint(0, 256, (batch, 3, s, s, 3)).astype(np.uint8)
  judge = rng.randint(0, 2, batch).astype(np.float32)
  a0 = {k: np.asarray(v['a']) for k, v in state.trainable['lora'].items()}
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
        m.lora_A['default'].weight.copy_(torch.from_numpy(a0[f'blocks_{i}/attn/qkv'].T))
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
  for i, blk in enumerate(model.blocks):
    blk.attn.qkv = LoraLinear(blk.attn.qkv, a0[f'blocks_{i}/attn/qkv'])
  return model


def main(argv):
  del argv
  t0 = time.time()
  from visim_jax.backbones import vit
  prec = precision.apply()
  gpu = _GPU.value
  arch = vit.TINY if (_ARCH.value == 'tiny' and not gpu) else vit.ARCHS['dino_vitb16']
  batch, steps = (32, 5) if gpu else (_BATCH.value, _STEPS.value)
  dtype = 'bfloat16' if gpu else _DTYPE.value
  alternations, budget = (3, 80.0) if gpu else (_ALT.value, _BUDGET.value)
  ours, ref, first, kind, dev = setup(arch, batch, dtype, steps)
  tol = 2e-2 if dtype == 'bfloat16' else 1e-4
  if not math.isclose(first['ours'], first['reference'], rel_tol=tol, abs_tol=tol * 1e-2):
    raise SystemExit(f'first-step losses differ: {first}')
  sides = {'ours': ours, 'reference': ref}
  for f in sides.values():   # warm-up: compiled, cuDNN tuned
    f()
  times = {k: [] for k in sides}
  for i in range(alternations):   # interleaved.interleaved's A B, B A, ... with a time budget
    if i and budget and time.time() - t0 > budget * 0.75:
      break
    for k in (list(sides) if i % 2 == 0 else list(sides)[::-1]):
      time.sleep(getattr(interleaved, 'PAUSE_S', 0.0))   # the other side's worker threads idle first
      t = time.perf_counter()
      sides[k]()
      times[k].append(time.perf_counter() - t)
  images = steps * batch * 3
  stats = interleaved.compare(times['ours'], times['reference'], work=images, unit='images')
  name = f'ViT-{"B/16" if arch.width == 768 else "tiny"} LoRA step ({dtype}, batch {batch} triplets)'
  res = {'benchmark': 'tune_step', 'arch': 'b16' if arch.width == 768 else 'tiny', 'batch_triplets': batch,
         'steps_per_call': steps, 'dtype': dtype, 'device': dev, 'jax_backend': jax.default_backend(),
         'precision': prec, 'reference': kind,
         'torch_threads': __import__('torch').get_num_threads(), 'first_step_loss': first, 'stats': stats,
         'rows': [interleaved.row(name, stats, 'ours: tower_step jitted', f'PyTorch + {kind}', 'images')],
         'wall_s': time.time() - t0}
  print(json.dumps(res, indent=1, default=float))


if __name__ == '__main__':
  from visim_jax.core import errors  # pylint: disable=g-import-not-at-top
  app.run(main, flags_parser=errors.flags_parser)   # one-line flag errors; --help exits 0
