"""Shared fixtures. Tests run on CPU; heavy objects (the pretrained backbone, the demo set) are built once."""
import os
import shutil
import tempfile

import pytest

os.environ.setdefault('JAX_PLATFORMS', 'cpu')
# JAX's persistent compilation cache (main.run turns it on): one folder per test session, shared with the
# subprocesses the tests start, never the user's ~/.cache; VISIM_COMPILE_CACHE=0 before pytest turns it off
_SESSION_CACHE = None
if 'VISIM_COMPILE_CACHE' not in os.environ:
  _SESSION_CACHE = os.environ['VISIM_COMPILE_CACHE'] = tempfile.mkdtemp(prefix='visim_jax_cache_')


def pytest_sessionfinish(session, exitstatus):
  if _SESSION_CACHE:
    shutil.rmtree(_SESSION_CACHE, ignore_errors=True)

SHARED_DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), '..', 'shared', 'data')


def shared_data(*parts):
  """Path under ../shared/data beside the checkout; skips the test if that folder is absent."""
  path = os.path.normpath(os.path.join(SHARED_DATA, *parts))
  if not os.path.exists(path):
    pytest.skip(f'{path} not found: ../shared/data must sit beside the checkout for this test')
  return path


@pytest.fixture(scope='session')
def lite0():
  from visim_jax.backbones import get_backbone
  return get_backbone('efficientnet_lite0')


@pytest.fixture(scope='session')
def demo_root(tmp_path_factory):
  from visim_jax.data import demo
  return demo.demo_pairs(str(tmp_path_factory.mktemp('demo')), n_pairs=192, seed=0)


@pytest.fixture(autouse=True)
def no_fault_hook_leaks():
  """A test that sets visim_jax.training.runtime.FAULT_HOOK (fault injection) never leaves it set for the next test."""
  yield
  import sys
  runtime = sys.modules.get('visim_jax.training.runtime')
  if runtime is not None:
    runtime.FAULT_HOOK = None


@pytest.fixture(scope='session')
def human_demo_sets(tmp_path_factory):
  """The mini NIGHTS / BAPPS / THINGS folders (data/human_demo.py), written once per session."""
  from visim_jax.data import human_demo
  return human_demo.demo_sets(str(tmp_path_factory.mktemp('human_demo')), seed=0)
