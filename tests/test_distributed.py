"""visim_jax.training.distributed: which environments initialise jax.distributed and with what (no real cluster needed),
plus one real two-process localhost start-up on CPU."""
import os
import shutil
import sys

import pytest

import subprocs
from visim_jax.training import distributed

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
from visim_jax.training import distributed
kw = distributed.maybe_initialize()
assert distributed.maybe_initialize() == kw  # idempotent
print('RESULT', jax.process_index(), jax.process_count(), len(jax.devices()), flush=True)
"""


def test_two_processes_on_localhost():
  base = {k: v for k, v in os.environ.items() if not k.startswith(('SLURM_', 'TPU_', 'JAX_COORD', 'VISIM_DIST'))}
  base.update(JAX_PLATFORMS='cpu', JAX_NUM_PROCESSES='2', PYTHONPATH=ROOT + os.pathsep + base.get('PYTHONPATH', ''))

  def jobs(port):  # no time limit: a loaded box is slow, not wrong (subprocs.run_all)
    return [dict(args=[sys.executable, '-c', CHILD], env={**base, 'JAX_PROCESS_ID': str(i),
                                                           'JAX_COORDINATOR_ADDRESS': f'127.0.0.1:{port}'})
            for i in range(2)]
  outs = []
  for rc, log in subprocs.free_port_run(jobs):
    assert rc == 0, log[-2000:]
    outs.append([l for l in log.splitlines() if l.startswith('RESULT')][0].split()[1:])
  assert sorted(o[0] for o in outs) == ['0', '1']
  assert all(o[1] == '2' for o in outs)
  assert all(int(o[2]) == 2 for o in outs)  # one CPU device per process, both visible globally


# a child's start: (pid, nproc, port, arg, workdir) from argv; jax.distributed over gloo when nproc > 1
CHILD_START = """
import json, os, sys, pathlib
import jax
jax.config.update('jax_cpu_collectives_implementation', 'gloo')
pid, nproc, port, arg, wd = sys.argv[1:6]
if int(nproc) > 1:
  jax.distributed.initialize(f'localhost:{port}', int(nproc), int(pid))
"""


def two_and_one(tmp_path, child: str, arg: str) -> tuple[dict, dict]:
  """Runs `child` (after CHILD_START) on 2 jax.distributed processes into tmp_path/two and alone into tmp_path/one
  (no time limit: subprocs.run_all; a taken port is retried with another); their child.json files."""
  import json
  base = {k: v for k, v in os.environ.items() if not k.startswith(('SLURM_', 'TPU_', 'JAX_COORD', 'VISIM_DIST'))}
  base.update(JAX_PLATFORMS='cpu', PYTHONPATH=ROOT + os.pathsep + base.get('PYTHONPATH', ''))

  def jobs(port):
    shutil.rmtree(tmp_path / 'two', ignore_errors=True)
    shutil.rmtree(tmp_path / 'one', ignore_errors=True)
    job = lambda pid, nproc, wd: dict(args=[sys.executable, '-c', CHILD_START + child, str(pid), str(nproc),
                                            str(port), arg, str(wd)], cwd=ROOT, env=base)
    return [job(i, 2, tmp_path / 'two') for i in range(2)] + [job(0, 1, tmp_path / 'one')]
  for rc, log in subprocs.free_port_run(jobs):
    assert rc == 0, log[-3000:]
  two, one = (json.load(open(tmp_path / w / 'child.json')) for w in ('two', 'one'))
  return two, one


SIMNET_CHILD = """
sys.path.insert(0, os.path.join(os.getcwd(), 'configs'))
import simnet_tll
from visim_jax.experiments import simnet
c = simnet_tll.get_config('local')
c.features, c.plots = arg, False
m = simnet.run(c, wd, progress=False)
if jax.process_index() == 0:
  json.dump({'results': m['results'], 'simnet_star': m['simnet_star'], 'processes': jax.process_count()},
            open(os.path.join(wd, 'child.json'), 'w'))
"""


def test_simnet_two_processes_equal_one(tmp_path):
  """SimNet through the runtime on 2 jax.distributed processes (Orbax saves on both, writes on process 0) =
  1 process: same results and SimNet* pool, checkpoints of every chunk written once."""
  import numpy as np
  rng = np.random.RandomState(1)
  left = rng.randn(40, 10).astype(np.float32)
  np.savez(tmp_path / 'pairs.npz', left=left, right=left + 0.5 * rng.randn(40, 10).astype(np.float32),
           names=np.array([f'{i:05d}.jpg' for i in range(40)]))
  two, one = two_and_one(tmp_path, SIMNET_CHILD, str(tmp_path / 'pairs.npz'))
  assert two['processes'] == 2 and one['processes'] == 1
  assert two['results'] == one['results'] and two['simnet_star'] == one['simnet_star']
  assert {int(s) for s in os.listdir(tmp_path / 'two' / 'checkpoints')} == {80, 120}


TUNE_CHILD = """
sys.path.insert(0, os.path.join(os.getcwd(), 'tests'))
import tensorflow_datasets as tfds
from test_tune import alignet_tiny
from visim_jax.experiments import tune
with tfds.testing.mock_data(num_examples=40):
  m = tune.run(alignet_tiny(pathlib.Path(arg), steps=4, eval_every=2, checkpoint_every=4), wd, progress=False)
if jax.process_index() == 0:
  json.dump({'results': m['results'], 'devices': m['devices']}, open(os.path.join(wd, 'child.json'), 'w'))
"""


def test_tune_two_processes_read_disjoint_shares_and_equal_one(tmp_path):
  """`:alignet` (tiny) over mocked TFDS ImageNet on 2 jax.distributed processes: each reads its half of every
  step's batch through grain (its own iterator state in the checkpoint) and the run ends as 1 process does."""
  import json
  from test_tune import write_alignet
  write_alignet(tmp_path / 'alignet')
  two, one = two_and_one(tmp_path, TUNE_CHILD, str(tmp_path))
  assert two['devices'] == 2 and one['devices'] == 1
  for k in ('frozen', 'tuned'):
    for q in ('accuracy', 'loss'):
      assert two['results'][k][q] == pytest.approx(one['results'][k][q], rel=1e-4, abs=1e-6)
  data = tmp_path / 'two' / 'checkpoints' / '4' / 'data'
  states = [json.load(open(data / f'process_{i}-of-2.json')) for i in range(2)]
  assert states == [{'next_index': 4 * 3 * 2}] * 2    # 4 steps x 2 triplets of 3 images each, per process
