"""JAX's persistent compilation cache (on by default) and a clock of the time spent compiling.

A second run of the same config reads its compiled programs from disk instead of compiling them again.
Folder: $VISIM_COMPILE_CACHE when it names one, else $XDG_CACHE_HOME/visim_jax/jax_cache (default
~/.cache/visim_jax/jax_cache). Off with VISIM_COMPILE_CACHE=0 or `python -m visim_jax.main --nocompile_cache`.
A cache folder the user already gave JAX (JAX_COMPILATION_CACHE_DIR) is kept. A folder that cannot be created
turns the cache off with one line (it only saves time). Programs that compile in less than MIN_COMPILE_S are
not written (JAX's own threshold, lowered from 1 s).

clock() is the process-wide CompileClock: `seconds` = tracing + lowering + XLA compilation or cache read of
every jitted program since it started; `hits` / `misses` = programs read from / not found in the cache.
metrics.json's timing_s reports them (runtime.Run.write_metrics).
"""
from __future__ import annotations

import os
import threading

import jax

ENV = 'VISIM_COMPILE_CACHE'
MIN_COMPILE_S = 0.5
_OFF = ('0', 'false', 'off', 'no')
_ON = ('', '1', 'true', 'on', 'yes')
# jax.monitoring duration events that together make the compile time of one program
_DURATIONS = ('/jax/core/compile/jaxpr_trace_duration', '/jax/core/compile/jaxpr_to_mlir_module_duration',
              '/jax/core/compile/backend_compile_duration')
_HIT, _MISS = '/jax/compilation_cache/cache_hits', '/jax/compilation_cache/cache_misses'
_ours: dict = {}  # the folder enable() set and the clock's reading then


def default_dir() -> str | None:
  """The cache folder the environment asks for, or None when VISIM_COMPILE_CACHE turns it off."""
  v = os.environ.get(ENV, '').strip()
  if v.lower() in _OFF:
    return None
  if v.lower() not in _ON:
    return os.path.abspath(os.path.expanduser(v))
  base = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
  return os.path.join(base, 'visim_jax', 'jax_cache')


def enable(on: bool = True) -> str | None:
  """Turns the persistent cache on (in default_dir()) unless `on` is False or the environment says off;
  returns the folder in use, or None. Call it before the first jitted program runs (main.run does)."""
  from jax.experimental.compilation_cache import compilation_cache as cc
  current = jax.config.jax_compilation_cache_dir
  if current and current != _ours.get('dir'):
    return current  # the user's own JAX setting wins
  path = default_dir() if on else None
  if path is not None:
    try:
      os.makedirs(path, exist_ok=True)
    except OSError as e:
      print(f'note: compile cache off: cannot create {path} ({e.strerror})', flush=True)
      path = None
  if path != current:
    jax.config.update('jax_compilation_cache_dir', path)
    jax.config.update('jax_persistent_cache_min_compile_time_secs', MIN_COMPILE_S)
    cc.reset_cache()  # a process that compiled before this call would otherwise keep its first decision
  _ours['dir'], _ours['start'] = path, clock().snapshot()
  return path


def report(timing: dict | None = None) -> dict | None:
  """`timing` (metrics.json's timing_s) with 'compile' (seconds since enable()) and 'compile_cache' (folder,
  hits, misses) added where absent; `timing` unchanged when enable() was never called."""
  timing = dict(timing or {})
  if 'start' in _ours:
    c = since(_ours['start'])
    timing.setdefault('compile', c.pop('seconds'))
    timing.setdefault('compile_cache', c)
  return timing


class CompileClock:
  """Compile seconds and persistent-cache hits / misses since the clock started (listens to jax.monitoring).
  Seconds are the union of the compile events' time spans: a jit traced inside another counts once."""

  def __init__(self):
    self.hits, self.misses = 0, 0
    self._spans: list[tuple[float, float]] = []
    self._lock = threading.Lock()
    jax.monitoring.register_event_time_span_listener(self._span)
    jax.monitoring.register_event_listener(self._event)

  def _span(self, event, start, end, **_):
    if event in _DURATIONS:
      with self._lock:
        self._spans.append((start, end))

  def _event(self, event, **_):
    with self._lock:
      if event == _HIT:
        self.hits += 1
      elif event == _MISS:
        self.misses += 1

  @property
  def seconds(self) -> float:
    with self._lock:
      spans = sorted(self._spans)
    total, end = 0.0, float('-inf')
    for s, e in spans:
      if e > end:
        total += e - max(s, end)
        end = e
    return total

  def snapshot(self) -> dict:
    return {'seconds': self.seconds, 'hits': self.hits, 'misses': self.misses}


_CLOCK: list[CompileClock] = []


def clock() -> CompileClock:
  if not _CLOCK:
    _CLOCK.append(CompileClock())
  return _CLOCK[0]


def since(start: dict) -> dict:
  """Compile seconds, hits and misses since `start` (a clock().snapshot()), and the cache folder."""
  now = clock().snapshot()
  return {'seconds': now['seconds'] - start['seconds'], 'hits': now['hits'] - start['hits'],
          'misses': now['misses'] - start['misses'], 'dir': jax.config.jax_compilation_cache_dir}
