"""A memory estimate before every allocation that scales with the config: refused in one line, nothing allocated.

Each experiment adds up what its program must hold at once (bytes, a lower bound: XLA's temporaries come on top)
per part, and calls `check(parts, fields)` before it allocates: when the total exceeds `FRACTION` of the device's
memory (the accelerator's limit, else the host's physical memory) the run is refused naming the fields to lower,
as the user typed them, and the need in GiB. A config within every field's range can still need 10^6 GiB
(nights_adapt seeds=10^4 x adapt_dim=2^20): without this the allocation fails deep in XLA, or the OOM killer
ends the process with no message, or it swaps for ever.
"""
from __future__ import annotations

import os
from typing import Mapping, Sequence

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


def check(parts: Mapping[str, float], fields: Sequence[str], sizes: str = '', what: str = 'this run',
          fraction: float = FRACTION) -> None:
  """Refuses when sum(parts) > fraction x the memory available: `<fields[0]>: <what> needs at least N GiB (part
  a GiB, ...; sizes), more than 90% of the M GiB available; lower <fields>`. fields: most likely culprit first."""
  total, limit = float(sum(parts.values())), limit_bytes()
  if total <= fraction * limit:
    return
  detail = ', '.join(f'{k} {gib(v)}' for k, v in parts.items() if v) + (f'; {sizes}' if sizes else '')
  raise UserError(f'{fields[0]}: {what} needs at least {gib(total)} ({detail}), more than {fraction:.0%} of the '
                  f'{limit / GiB:.1f} GiB available; lower {" or ".join(fields)}')
