"""Multi-host start-up: call jax.distributed.initialize() when the environment asks for it, else nothing.

Read in this order (the first rule that applies wins):
  VISIM_DISTRIBUTED=0                     never initialise (a single machine, even inside a SLURM allocation);
  JAX_COORDINATOR_ADDRESS (host:port)     explicit: with JAX_NUM_PROCESSES and JAX_PROCESS_ID (both required,
                                          integers, 0 <= id < num), optional JAX_LOCAL_DEVICE_IDS ('0,1,2,3');
                                          launch/slurm_gpu.sh sets these from SLURM_* variables;
  VISIM_DISTRIBUTED=1                     initialise with JAX's own cluster detection (TPU pods, SLURM, ...);
                                          launch/tpu_pod.sh sets this on every TPU VM worker;
  SLURM with more than one task           (SLURM_JOB_ID set, SLURM_NTASKS > 1, inside a step: SLURM_STEP_ID)
                                          JAX's SLURM detection;
  a multi-host TPU slice                  (TPU_WORKER_HOSTNAMES lists more than one host) JAX's TPU detection;
  otherwise                               a single machine: nothing is called.
A bad value fails with an error naming the variable. `maybe_initialize` is idempotent.
"""
from __future__ import annotations

import os
from typing import Callable, Mapping

_TRUE = ('1', 'true', 'yes', 'on')
_FALSE = ('0', 'false', 'no', 'off')


def _int(env: Mapping[str, str], name: str) -> int:
  raw = env.get(name)
  if raw is None or raw.strip() == '':
    raise ValueError(f'{name}: required when JAX_COORDINATOR_ADDRESS is set')
  try:
    return int(raw)
  except ValueError:
    raise ValueError(f'{name}: expected an integer, got {raw!r}') from None


def distributed_kwargs(environ: Mapping[str, str] | None = None) -> dict | None:
  """The keyword arguments for jax.distributed.initialize, or None on a single machine (pure: reads `environ`)."""
  env = os.environ if environ is None else environ
  flag = env.get('VISIM_DISTRIBUTED', '').strip().lower()
  if flag and flag not in _TRUE + _FALSE:
    raise ValueError(f'VISIM_DISTRIBUTED: expected 0 or 1, got {env["VISIM_DISTRIBUTED"]!r}')
  if flag in _FALSE:
    return None
  address = env.get('JAX_COORDINATOR_ADDRESS', '').strip()
  if address:
    host, _, port = address.rpartition(':')
    if not host or not port.isdigit():
      raise ValueError(f'JAX_COORDINATOR_ADDRESS: expected host:port, got {address!r}')
    num, pid = _int(env, 'JAX_NUM_PROCESSES'), _int(env, 'JAX_PROCESS_ID')
    if num < 1:
      raise ValueError(f'JAX_NUM_PROCESSES: must be >= 1, got {num}')
    if not 0 <= pid < num:
      raise ValueError(f'JAX_PROCESS_ID: must be in [0, {num - 1}] (JAX_NUM_PROCESSES={num}), got {pid}')
    kwargs = {'coordinator_address': address, 'num_processes': num, 'process_id': pid}
    ids = env.get('JAX_LOCAL_DEVICE_IDS', '').strip()
    if ids:
      try:
        kwargs['local_device_ids'] = [int(i) for i in ids.split(',') if i.strip()]
      except ValueError:
        raise ValueError(f"JAX_LOCAL_DEVICE_IDS: expected comma-separated integers, got {ids!r}") from None
    return kwargs
  if flag in _TRUE:
    return {}
  if env.get('SLURM_JOB_ID') and env.get('SLURM_STEP_ID') is not None:
    try:
      ntasks = int(env.get('SLURM_NTASKS', env.get('SLURM_NPROCS', '1')))
    except ValueError:
      raise ValueError(f'SLURM_NTASKS: expected an integer, got {env.get("SLURM_NTASKS")!r}') from None
    if ntasks > 1:
      return {}
  hosts = [h for h in env.get('TPU_WORKER_HOSTNAMES', '').split(',') if h.strip()]
  if len(hosts) > 1:
    return {}
  return None


def maybe_initialize(environ: Mapping[str, str] | None = None,
                     initialize: Callable[..., None] | None = None) -> dict | None:
  """Calls jax.distributed.initialize(**distributed_kwargs()) when the environment asks for it.

  Returns the kwargs used (None when nothing was called). `initialize` replaces jax.distributed.initialize
  (tests). Safe to call twice: a second call on an initialised process does nothing.
  """
  kwargs = distributed_kwargs(environ)
  if kwargs is None:
    return None
  import jax
  if initialize is None:
    if jax.distributed.is_initialized():
      return kwargs
    initialize = jax.distributed.initialize
  initialize(**kwargs)
  return kwargs
