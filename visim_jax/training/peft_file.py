"""A peft LoRA adapter folder, in and out: what peft's `save_pretrained` writes.

DreamSim's training (training/train.py `__save_lora_weights`) saves one such folder an epoch,
`<ModelCheckpoint dirpath>/epoch_<N>/`: adapter_config.json (LoraConfig: r, lora_alpha, lora_dropout, bias 'none',
target_modules ['qkv']) + adapter_model.safetensors (peft's default; older peft: adapter_model.bin, a torch pickle,
read here only through visim_jax.core.safe_pickle), keys `base_model.model.extractor_list.<i>.model.blocks.<n>.attn.
qkv.lora_A.weight` / `lora_B.weight` (models/lora.py `from_peft` / `to_peft`).

`load(folder, backbone='')` -> (meta, {'lora': tree}, weights file): the meta `tuned:` reads (zoo/tuned.py). The
tower: `backbone` when given (`tuned:<folder>@<backbone>`), else the one our export recorded in `visim_jax.json`
beside the adapter (peft ignores the file; it also keeps the base weights' sha256 and the feature), else DreamSim's
layout by the adapter's extractor count: 3 -> `dreamsim_ensemble_pretrained` (train_ensemble_model_lora.yaml), 1 ->
`dreamsim_dino_vitb16_pretrained` (train_single_model_lora.yaml's model_type). The feature of a DreamSim adapter:
the tower's default, 'concat' (its eval_percep.py scores a trained checkpoint with PerceptualModel(normalize_embeds=
False): 1 - cosine of the concatenation).

`save(folder, tree, lora_cfg, meta)`: adapter_config.json with peft's LoraConfig fields, adapter_model.safetensors
(torch layouts, metadata format 'pt' as peft writes) and visim_jax.json (the meta). `PeftModel.from_pretrained(
model, folder)` on DreamSim's PerceptualModel (or `set_peft_model_state_dict`) loads it. target_modules lists the
module names the tree adapts ('qkv'); peft then adds LoRA to every such module, and one the tree does not hold stays
at peft's initialisation (B = 0: no change).
"""
from __future__ import annotations

import json
import os
import re

import numpy as np

from visim_jax.core.errors import UserError
from visim_jax.models import lora as lora_lib

CONFIG = 'adapter_config.json'
WEIGHTS = ('adapter_model.safetensors', 'adapter_model.bin')   # peft's names, the order it tries them
SIDECAR = 'visim_jax.json'
DREAMSIM_BASES = {3: 'dreamsim_ensemble_pretrained', 1: 'dreamsim_dino_vitb16_pretrained'}
_EXTRACTOR = re.compile(r'(?:^|\.)extractor_list\.(\d+)\.')


def is_adapter(folder: str) -> bool:
  return os.path.isdir(folder) and os.path.isfile(os.path.join(folder, CONFIG))


def branches_of(name: str) -> tuple[str, ...]:
  """The branch keys of a tower in DreamSim's extractor_list order (dreamsim.py); () for a plain ViT."""
  from visim_jax.backbones import dreamsim  # pylint: disable=g-import-not-at-top
  return tuple(b.key for b in dreamsim.MODELS[name][1]) if name in dreamsim.MODELS else ()


def weights_file(folder: str) -> str:
  for name in WEIGHTS:
    path = os.path.join(folder, name)
    if os.path.isfile(path):
      return path
  raise UserError(f'{folder}: no {" or ".join(WEIGHTS)} beside {CONFIG}: not a peft save_pretrained folder')


def _infer_backbone(folder: str, keys) -> str:
  found = {int(m.group(1)) for k in keys for m in [_EXTRACTOR.search(k)] if m}
  n = max(found) + 1 if found else 0
  if n not in DREAMSIM_BASES:
    raise UserError(f'{folder}: an adapter of {n or "no"} DreamSim extractor(s); name its tower as '
                    f'tuned:{folder}@<backbone> (DreamSim\'s: {", ".join(sorted(set(DREAMSIM_BASES.values())))})')
  return DREAMSIM_BASES[n]


def load(folder: str, backbone: str = '') -> tuple[dict, dict, str]:
  """(meta, {'lora': tree}, weights file) of a peft adapter folder (module docstring); one UserError naming the
  file and field otherwise."""
  from visim_jax.backbones import convert, dreamsim  # pylint: disable=g-import-not-at-top
  from visim_jax.core import readers  # pylint: disable=g-import-not-at-top
  cfg = dreamsim.read_peft_config(os.path.join(folder, CONFIG), dreamsim.PEFT_TARGETS)
  path = weights_file(folder)
  sd, _ = convert.read_checkpoint(path)
  side_path = os.path.join(folder, SIDECAR)
  side = readers.read_json(side_path, dict, 'visim_jax adapter meta') if os.path.isfile(side_path) else {}
  name = backbone or side.get('backbone') or _infer_backbone(folder, sd)
  tree = lora_lib.from_peft(sd, branches_of(name), path)
  recorded = side.get('backbone') == name
  meta = {'backbone': name, 'weights_sha256': side.get('weights_sha256') if recorded else None,
          'feature': side.get('feature') if recorded else None, 'head': 'identity', 'head_size': 0,
          'similarity': side.get('similarity', 'cosine') if recorded else 'cosine', 'tune': 'lora',
          'lora': {k: cfg[k] for k in ('r', 'alpha', 'dropout', 'targets', 'rslora')}, 'workdir': folder,
          'peft': os.path.basename(path)}
  return meta, {'lora': tree}, path


def save(folder: str, tree: dict, lora_cfg: dict, meta: dict) -> str:
  """Writes the peft folder of a LoRA tree (module docstring); returns the folder."""
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  name = meta['backbone']
  tensors = lora_lib.to_peft(tree, branches_of(name))
  cfg = {
      'peft_type': 'LORA', 'task_type': None, 'base_model_name_or_path': None, 'revision': None,
      'inference_mode': True, 'r': int(lora_cfg['r']), 'lora_alpha': float(lora_cfg['alpha']),
      'lora_dropout': float(lora_cfg.get('dropout', 0.0)), 'bias': 'none',
      'target_modules': sorted({p.rsplit('/', 1)[-1] for p in tree}), 'use_rslora': bool(lora_cfg.get('rslora')),
      'use_dora': False, 'fan_in_fan_out': False, 'init_lora_weights': True, 'modules_to_save': None,
      'layers_to_transform': None, 'layers_pattern': None, 'rank_pattern': {}, 'alpha_pattern': {}}
  os.makedirs(folder, exist_ok=True)
  tmp = os.path.join(folder, WEIGHTS[0] + '.tmp')
  save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, tmp, metadata={'format': 'pt'})
  os.replace(tmp, os.path.join(folder, WEIGHTS[0]))
  side = {k: meta.get(k) for k in ('backbone', 'weights_sha256', 'feature', 'similarity', 'backbone_kwargs')}
  for fname, content in ((CONFIG, cfg), (SIDECAR, side)):
    with open(os.path.join(folder, fname + '.tmp'), 'w') as f:
      json.dump(content, f, indent=2, sort_keys=True, default=str)
    os.replace(os.path.join(folder, fname + '.tmp'), os.path.join(folder, fname))
  return folder
