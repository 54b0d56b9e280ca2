"""visim_jax.distributed: which environments initialise jax.distributed and with what (no real cluster needed),
plus one real two-process localhost start-up on CPU."""
import os
import socket
import subprocess
import sys

import pytest

from visim_jax import distributed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_single_machine_does_nothing():
  calls = []
  assert distributed.maybe_initialize({}, initialize=lambda **kw: calls.append(kw)) is None
  assert distributed.maybe_initialize({'PATH': '/bin', 'HOME': '/x'}, initialize=calls.append) is None
  # a one-task SLURM job, or an sbatch shell outside a step, is a single machine
  assert distributed.distributed_kwargs({'SLURM_JOB_ID': '7', 'SLURM_STEP_ID': '0', 'SLURM_NTASKS': '1'}) is None
  assert distributed.distributed_kwargs({'SLURM_JOB_ID': '7', 'SLURM_NTASKS': '4'}) is None
  assert distributed.distributed_kwargs({'TPU_WORKER_HOSTNAMES': 'localhost'}) is None
  assert not calls


def test_explicit_coordinator():
  calls = []
  env = {'JAX_COORDINATOR_ADDRESS': 'node001:12345', 'JAX_NUM_PROCESSES': '4', 'JAX_PROCESS_ID': '2',
         'JAX_LOCAL_DEVICE_IDS': '0,1'}
  kw = distributed.maybe_initialize(env, initialize=lambda **k: calls.append(k))
  assert kw == calls[0] == {'coordinator_address': 'node001:12345', 'num_processes': 4, 'process_id': 2,
                            'local_device_ids': [0, 1]}
  # explicit variables win over SLURM detection; VISIM_DISTRIBUTED=0 wins over everything
  env.update(SLURM_JOB_ID='1', SLURM_STEP_ID='0', SLURM_NTASKS='4')
  assert distributed.distributed_kwargs(env)['process_id'] == 2
  assert distributed.distributed_kwargs({**env, 'VISIM_DISTRIBUTED': '0'}) is None


def test_auto_detection():
  assert distributed.distributed_kwargs({'VISIM_DISTRIBUTED': '1'}) == {}
  assert distributed.distributed_kwargs({'VISIM_DISTRIBUTED': 'true'}) == {}
  assert distributed.distributed_kwargs({'SLURM_JOB_ID': '9', 'SLURM_STEP_ID': '0', 'SLURM_NTASKS': '8'}) == {}
  assert distributed.distributed_kwargs({'TPU_WORKER_HOSTNAMES': 't1-w-0,t1-w-1'}) == {}


@pytest.mark.parametrize('env, match', [
    ({'VISIM_DISTRIBUTED': 'maybe'}, 'VISIM_DISTRIBUTED'),
    ({'JAX_COORDINATOR_ADDRESS': 'node001'}, 'JAX_COORDINATOR_ADDRESS: expected host:port'),
    ({'JAX_COORDINATOR_ADDRESS': 'n:1', 'JAX_PROCESS_ID': '0'}, 'JAX_NUM_PROCESSES: required'),
    ({'JAX_COORDINATOR_ADDRESS': 'n:1', 'JAX_NUM_PROCESSES': 'two', 'JAX_PROCESS_ID': '0'},
     'JAX_NUM_PROCESSES: expected an integer'),
    ({'JAX_COORDINATOR_ADDRESS': 'n:1', 'JAX_NUM_PROCESSES': '2', 'JAX_PROCESS_ID': '2'},
     r'JAX_PROCESS_ID: must be in \[0, 1\]'),
    ({'JAX_COORDINATOR_ADDRESS': 'n:1', 'JAX_NUM_PROCESSES': '2', 'JAX_PROCESS_ID': '0',
      'JAX_LOCAL_DEVICE_IDS': 'a,b'}, 'JAX_LOCAL_DEVICE_IDS'),
    ({'SLURM_JOB_ID': '1', 'SLURM_STEP_ID': '0', 'SLURM_NTASKS': 'x'}, 'SLURM_NTASKS'),
])
def test_bad_values_name_the_variable(env, match):
  with pytest.raises(ValueError, match=match):
    distributed.maybe_initialize(env, initialize=lambda **k: None)


CHILD = """
import jax
from visim_jax import distributed
kw = distributed.maybe_initialize()
assert distributed.maybe_initialize() == kw  # idempotent
print('RESULT', jax.process_index(), jax.process_count(), len(jax.devices()), flush=True)
"""


def test_two_processes_on_localhost():
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    port = s.getsockname()[1]
  base = {k: v for k, v in os.environ.items() if not k.startswith(('SLURM_', 'TPU_', 'JAX_COORD', 'VISIM_DIST'))}
  base.update(JAX_PLATFORMS='cpu', JAX_COORDINATOR_ADDRESS=f'127.0.0.1:{port}', JAX_NUM_PROCESSES='2',
              PYTHONPATH=ROOT + os.pathsep + base.get('PYTHONPATH', ''))
  procs = [subprocess.Popen([sys.executable, '-c', CHILD], env={**base, 'JAX_PROCESS_ID': str(i)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
  outs = []
  for p in procs:
    try:
      out, err = p.communicate(timeout=120)
    except subprocess.TimeoutExpired:
      for q in procs:
        q.kill()
      pytest.fail('two-process jax.distributed start-up timed out')
    assert p.returncode == 0, err[-2000:]
    outs.append([l for l in out.splitlines() if l.startswith('RESULT')][0].split()[1:])
  assert sorted(o[0] for o in outs) == ['0', '1']
  assert all(o[1] == '2' for o in outs)
  assert all(int(o[2]) == 2 for o in outs)  # one CPU device per process, both visible globally
