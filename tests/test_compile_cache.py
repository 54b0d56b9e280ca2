"""The persistent compilation cache: a second identical run reads its programs from the cache; off switch."""
import os
import sys

import jax
import numpy as np
import pytest

from visim_jax.training import compile_cache
from visim_jax import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, 'configs'))
import tll as tll_config  # noqa: E402


@pytest.fixture
def restore_jax_cache():
  before, ours = jax.config.jax_compilation_cache_dir, dict(compile_cache._ours)
  yield
  from jax.experimental.compilation_cache import compilation_cache as cc
  jax.config.update('jax_compilation_cache_dir', before)
  cc.reset_cache()
  compile_cache._ours.clear()
  compile_cache._ours.update(ours)  # a folder an earlier main.run set stays ours, not a 'user setting'


def tiny_config(tmp_path):
  rng = np.random.RandomState(0)
  left = rng.randn(24, 6).astype(np.float32)
  path = tmp_path / 'feats.npz'
  np.savez(path, left=left, right=left + 0.3 * rng.randn(24, 6).astype(np.float32),
           names=np.array([f'{i}.jpg' for i in range(24)]))
  c = tll_config.get_config()
  c.dataset, c.features = 'features', str(path)
  c.runs, c.epochs, c.pca_dim, c.adapt_dim, c.ks, c.checkpoint, c.plots = 2, 3, 4, 8, (1,), False, False
  c.select_epoch = 'last'
  return c


def test_second_identical_run_reads_its_programs_from_the_cache(tmp_path, monkeypatch, restore_jax_cache):
  monkeypatch.setenv(compile_cache.ENV, str(tmp_path / 'jax_cache'))
  monkeypatch.setattr(compile_cache, 'MIN_COMPILE_S', 0.0)  # the tiny programs compile in well under 0.5 s
  config = tiny_config(tmp_path)
  timings = []
  for wd in ('a', 'b'):
    jax.clear_caches()  # a new process: nothing compiled in memory
    timings.append(main.run(config, str(tmp_path / wd))['timing_s'])
  first, second = (t['compile_cache'] for t in timings)
  assert first['dir'] == str(tmp_path / 'jax_cache') and os.listdir(first['dir'])
  assert first['misses'] > 0 and first['hits'] == 0, first
  # nothing compiled the second time; a program a Python-level cache still holds (jax.clear_caches does not reach
  # it; a new process would) is not asked for again, so hits may be fewer than the first run's misses
  assert second['misses'] == 0 and 0 < second['hits'] <= first['misses'], (first, second)
  for t in timings:
    assert t['compile'] > 0 and t['train'] >= 0 and t['extract'] >= 0, t


def test_off_by_environment_or_flag(tmp_path, monkeypatch, restore_jax_cache):
  monkeypatch.setenv(compile_cache.ENV, '0')
  assert compile_cache.enable() is None and jax.config.jax_compilation_cache_dir is None
  monkeypatch.setenv(compile_cache.ENV, str(tmp_path / 'c'))
  assert compile_cache.enable(False) is None
  monkeypatch.delenv(compile_cache.ENV)
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'xdg'))
  assert compile_cache.default_dir() == str(tmp_path / 'xdg' / 'visim_jax' / 'jax_cache')
