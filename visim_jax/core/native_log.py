"""XLA's GPU autotuning chatter kept off the console: lines that XLA's C++ code writes straight to stderr (file
descriptor 2, below Python's logging) while it times kernels, e.g. `cuda_timer.cc:86] Delay kernel timed out:
measured time has sub-optimal accuracy` (logged at ERROR level, so TF_CPP_MIN_LOG_LEVEL cannot hide it without
hiding real errors). `install()` puts a pipe behind fd 2 and forwards every line except those matching CHATTER;
errors.quiet_logs installs it when a CUDA plugin is present and --verbosity was not given (with --verbosity=1
everything is shown). Restored at exit, after the pipe is drained.
"""
from __future__ import annotations

import atexit
import importlib.util
import os
import re
import sys
import threading

CHATTER = re.compile(r'cuda_timer\.cc|Delay kernel timed out|Skipping the delay kernel|'
                     r'sub-optimal accuracy\. There may be a missing warmup')
_state = {}


def has_gpu_plugin() -> bool:
  """A CUDA / ROCm PJRT plugin is installed (the only backends that print this chatter)."""
  for name in ('jax_cuda12_plugin', 'jax_cuda13_plugin', 'jax_rocm60_plugin', 'jax_plugins.xla_cuda12',
               'jax_plugins.xla_cuda13'):
    try:
      if importlib.util.find_spec(name) is not None:
        return True
    except (ImportError, ValueError):
      continue
  return False


def filter_lines(src, dst, pattern=CHATTER) -> None:
  """Copies lines of the binary file `src` to the binary file `dst`, dropping those matching `pattern`."""
  for line in iter(src.readline, b''):
    if not pattern.search(line.decode('utf-8', 'replace')):
      dst.write(line)
      dst.flush()


def install() -> bool:
  """Filters fd 2 from now on (idempotent); False where it cannot (no fd 2, not on a POSIX pipe-capable OS)."""
  if _state or not hasattr(os, 'pipe'):
    return bool(_state)
  try:
    sys.stderr.flush()
    saved = os.dup(2)
    r, w = os.pipe()
    os.dup2(w, 2)
    os.close(w)
  except OSError:
    return False
  src, dst = os.fdopen(r, 'rb', 0), os.fdopen(saved, 'wb', 0)
  t = threading.Thread(target=filter_lines, args=(src, dst), daemon=True, name='native-stderr-filter')
  t.start()
  _state.update(saved=saved, thread=t, dst=dst)
  atexit.register(uninstall)
  return True


def uninstall() -> None:
  if not _state:
    return
  try:
    sys.stderr.flush()
    os.dup2(_state['saved'], 2)  # closes the pipe's last write end: the thread drains it and stops
  except OSError:
    pass
  _state['thread'].join(timeout=2)
  _state.clear()
