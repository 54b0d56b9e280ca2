"""A memory estimate before every allocation that scales with the config: refused in one line, nothing allocated.

Each experiment adds up what its program must hold at once (bytes, a lower bound: XLA's temporaries come on top)
per part, and calls `check(parts, fields)` before it allocates: when the total exceeds `FRACTION` of the device's
memory (the accelerator's limit, else the host's physical memory) the run is refused naming the fields to lower,
as the user typed them, and the need in GiB. `drivers` ranks the fields by the bytes each one drives (the estimate
with that field alone at its least), so that the refusal names the field whose value is too large, not the first
of a fixed list. A config within every field's range can still need 10^6 GiB
(nights_adapt seeds=10^4 x adapt_dim=2^20): without this the allocation fails deep in XLA, or the OOM killer
ends the process with no message, or it swaps for ever.
"""
from __future__ import annotations

import os
from typing import Callable, Mapping, Sequence

import jax

from visim_jax.core.errors import UserError

GiB = 2**30
FRACTION = 0.9
F32 = 4


def limit_bytes() -> int:
  """Memory of one device (the accelerator's limit, else the host's physical memory): one copy, looked up at call
  time (tests set it)."""
  try:
    stats = jax.devices()[0].memory_stats() or {}
    if stats.get('bytes_limit'):
      return int(stats['bytes_limit'])
  except Exception:  # pylint: disable=broad-except  (backends without memory_stats)
    pass
  return int(os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES'))


def gib(n: float) -> str:
  return f'{n / GiB:,.3g} GiB' if n < 1000 * GiB else f'{n / GiB:,.0f} GiB'


def drivers(estimate: Callable[[dict], Mapping[str, float]], values: Mapping[str, float],
            floors: Mapping[str, float] | None = None) -> dict[str, float]:
  """{field: the bytes it drives}, largest first: how much `estimate(values)` (parts, summed) shrinks when that field
  alone is set to its floor (default 1: a count or a width at its least). A field already at its floor drives
  nothing and is left out (seeds=1 is never the field to lower)."""
  floors = floors or {}
  total = float(sum(estimate(dict(values)).values()))
  saved = {f: total - float(sum(estimate({**values, f: floors.get(f, 1)}).values())) for f in values}
  return dict(sorted(((f, b) for f, b in saved.items() if b > 0), key=lambda fb: -fb[1]))


def check(parts: Mapping[str, float], fields: Sequence[str] | Mapping[str, float], sizes: str = '',
          what: str = 'this run', fraction: float = FRACTION) -> None:
  """Refuses when sum(parts) > fraction x the memory available: `<first field>: <what> needs at least N GiB (part
  a GiB, ...; sizes), more than 90% of the M GiB available; lower <fields>`. fields: most likely culprit first, or
  `drivers(...)`'s {field: bytes it drives} (those driving 1% of the need or more, named with their share, largest
  first)."""
  total, limit = float(sum(parts.values())), limit_bytes()
  if total <= fraction * limit:
    return
  detail = ', '.join(f'{k} {gib(v)}' for k, v in parts.items() if v) + (f'; {sizes}' if sizes else '')
  if isinstance(fields, Mapping):   # the drivers of 1% of the need or more (the first always), largest first
    names = [f for i, (f, b) in enumerate(fields.items()) if i == 0 or b >= 0.01 * total] or ['the run\'s sizes']
    lower = ' or '.join(f'{f} ({gib(fields[f])} of it)' for f in names if f in fields) or names[0]
  else:
    names, lower = list(fields), ' or '.join(fields)
  raise UserError(f'{names[0]}: {what} needs at least {gib(total)} ({detail}), more than {fraction:.0%} of the '
                  f'{limit / GiB:.1f} GiB available; lower {lower}')


def tower_parts(n_params: int, n_trainable: int, activations_per_image: float, images_per_device: int,
                param_bytes: int = F32, opt_slots: int = 2, init_copy: bool = False, fsdp: int = 1) -> dict:
  """What one device holds for a step that tunes a tower (bytes; a lower bound, XLA's temporaries come on top):
  the tower's parameters, the trainable ones' gradients and optimiser slots (Adam: 2; decay towards the pretrained
  weights keeps a copy of them), all sharded over the `fsdp` devices, and the activations the backward pass keeps
  for the images of one pass (measured per image by the caller, e.g. from the traced residuals)."""
  shard = max(1, int(fsdp))
  return {'parameters': n_params * param_bytes / shard,
          'gradients': n_trainable * F32 / shard,
          'optimiser state': n_trainable * F32 * (opt_slots + int(init_copy)) / shard,
          'activations': float(activations_per_image) * images_per_device}


def check_tower(parts: Mapping[str, float], sizes: str, remat: bool, remat_parts: Mapping[str, float] | None = None,
                fraction: float = FRACTION) -> None:
  """Refuses a tuning run whose `tower_parts` exceed fraction x the device's memory, naming the field to change:
  the batch (config.batch_size, or config.accum_steps to split it, or config.remat when rematerialisation would
  make it fit) when activations are the largest part, config.adversarial when the attack's part ('attack': what it
  holds beyond the activations) is, else config.fsdp / config.tune (LoRA keeps no optimiser state for the tower)."""
  total, limit = float(sum(parts.values())), limit_bytes()
  if total <= fraction * limit:
    return
  detail = ', '.join(f'{k} {gib(v)}' for k, v in parts.items() if v) + (f'; {sizes}' if sizes else '')
  head = f'tuning needs at least {gib(total)} a device ({detail}), more than {fraction:.0%} of the {limit / GiB:.1f} ' \
         'GiB available'
  if parts.get('attack', 0) and parts['attack'] >= max(v for k, v in parts.items() if k != 'attack'):
    raise UserError(f'config.adversarial: {head}; the attack on the references (a forward + backward of the tower '
                    'per APGD step) holds the most: lower config.batch_size or raise config.accum_steps (the batch '
                    'in passes), or train without config.adversarial')
  if parts.get('activations', 0) >= max(v for k, v in parts.items() if k != 'activations'):
    if not remat and remat_parts is not None and sum(remat_parts.values()) <= fraction * limit:
      raise UserError(f'config.remat: {head}; set config.remat=True (rematerialised blocks: '
                      f'{gib(sum(remat_parts.values()))}), or lower config.batch_size')
    raise UserError(f'config.batch_size: {head}; lower config.batch_size, or raise config.accum_steps (the batch in '
                    'passes)' + ('' if remat else ', or set config.remat=True'))
  raise UserError(f'config.fsdp: {head}; raise config.fsdp (parameters and optimiser state sharded over more '
                  "devices) or use config.tune='lora'")
