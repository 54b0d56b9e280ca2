"""benchmarks/tune_step.py at a tiny size: both sides (ours jitted, PyTorch + peft) run the same LoRA step from the
same weights and LoRA factors (the script asserts equal first-step losses), and it prints one JSON object with a
run_all row; the --gpu_preset entry is in run_all's GPU plan."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_tiny_benchmark_runs_and_agrees():
  pytest.importorskip('torch')
  pytest.importorskip('peft')
  r = subprocess.run([sys.executable, os.path.join(ROOT, 'benchmarks', 'tune_step.py'), '--arch=tiny', '--batch=2',
                      '--steps=1', '--alternations=2', '--torch_threads=1'], cwd=ROOT, capture_output=True, text=True,
                     timeout=600, env={**os.environ, 'JAX_PLATFORMS': 'cpu',
                                       'PYTHONPATH': ROOT + os.pathsep + os.environ.get('PYTHONPATH', '')})
  assert r.returncode == 0, r.stderr[-3000:]
  out = json.loads(r.stdout[r.stdout.index('{'):])
  first = out['first_step_loss']
  assert abs(first['ours'] - first['reference']) <= 1e-4 * max(1.0, abs(first['reference']))
  assert out['reference'].startswith('peft') and out['rows'][0]['ratio'] > 0
  sys.path.insert(0, os.path.join(ROOT, 'benchmarks'))
  import run_all
  assert [e for e in run_all.gpu_commands() if e['script'] == 'tune_step.py'][0]['args'] == ['--gpu_preset']
