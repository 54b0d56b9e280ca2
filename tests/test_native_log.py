"""native_log: XLA's autotuning chatter written to fd 2 by C++ is dropped; every other line goes through."""
import io
import os
import subprocess
import sys

from visim_jax.core import native_log

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHATTER = (b'2026-11-25 10:00:00.000: E external/xla/xla/stream_executor/cuda/cuda_timer.cc:86] Delay kernel timed '
           b'out: measured time has sub-optimal accuracy. There may be a missing warmup execution, please '
           b'investigate in Nsight Systems.\n')


def test_filter_lines_drops_only_chatter():
  out = io.BytesIO()
  native_log.filter_lines(io.BytesIO(b'epoch 1\n' + CHATTER + b'error: real problem\n'), out)
  assert out.getvalue() == b'epoch 1\nerror: real problem\n'


def test_installed_filter_on_fd_2():
  code = ('import os, sys; from visim_jax.core import native_log; assert native_log.install(); '
          f'os.write(2, {CHATTER!r}); os.write(2, b"kept native\\n"); print("kept python", file=sys.stderr)')
  p = subprocess.run([sys.executable, '-c', code], capture_output=True, env={**os.environ, 'PYTHONPATH': ROOT},
                     timeout=60)
  assert p.returncode == 0, p.stderr
  assert b'Delay kernel' not in p.stderr and b'kept native' in p.stderr and b'kept python' in p.stderr
