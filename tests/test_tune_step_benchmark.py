"""benchmarks/tune_step.py at a tiny size: both sides (ours jitted, PyTorch + peft) run the same LoRA step of a
two-member ensemble from the same weights and LoRA factors (the script asserts equal first-step losses), and it
prints one JSON object with a run_all row and the model FLOP utilisation; the full-tuning path (AligNet's: micro-
batches, remat, ours alone) runs; the GPU presets are in run_all's GPU plan; the FLOP count is a ViT-B/16's."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(*args):
  r = subprocess.run([sys.executable, os.path.join(ROOT, 'benchmarks', 'tune_step.py'), '--arch=tiny', '--steps=1',
                      '--alternations=2', '--torch_threads=1', *args], cwd=ROOT, capture_output=True, text=True,
                     timeout=600, env={**os.environ, 'JAX_PLATFORMS': 'cpu',
                                       'PYTHONPATH': ROOT + os.pathsep + os.environ.get('PYTHONPATH', '')})
  assert r.returncode == 0, r.stderr[-3000:]
  return json.loads(r.stdout[r.stdout.index('{'):])


def test_tiny_benchmark_runs_and_agrees():
  pytest.importorskip('torch')
  pytest.importorskip('peft')
  out = _run('--batch=2', '--members=2')
  first = out['first_step_loss']
  assert abs(first['ours'] - first['reference']) <= 1e-4 * max(1.0, abs(first['reference']))
  assert out['reference'].startswith('peft') and out['rows'][0]['ratio'] > 0
  assert 0 < out['mfu']['mfu'] and out['mfu']['peak_source'].startswith('this CPU')
  full = _run('--batch=4', '--tune=full', '--micro_batch=2', '--remat')
  assert full['reference'].startswith('none') and full['stats']['images_per_s'] > 0 and not full['rows']
  sys.path.insert(0, os.path.join(ROOT, 'benchmarks'))
  import run_all
  args = {e['name']: e['args'] for e in run_all.gpu_commands() if e['script'] == 'tune_step.py'}
  assert args == {'tune_step_vitb16_lora': ['--gpu_preset'], 'tune_step_ensemble': ['--preset=ensemble'],
                  'tune_step_alignet': ['--preset=alignet']}
  assert run_all.GPU_CALLS[0] == ('tune_step_ensemble', 'tune_step_alignet', 'tune_step_vitb16_lora')


def test_vit_b16_forward_flops_are_timms():
  """ViT-B/16 at 224 px: 17.6 GMACs (timm's and fvcore's count), i.e. 35.1 GFLOPs a forward."""
  sys.path.insert(0, os.path.join(ROOT, 'benchmarks'))
  import tune_step
  from visim_jax.backbones import vit
  macs = tune_step.vit_forward_flops(vit.ARCHS['dino_vitb16'], 1) / 2
  assert abs(macs - 17.56e9) / 17.56e9 < 0.005, macs
  assert tune_step.model_flops(vit.ARCHS['dino_vitb16'], 3, 2, 'lora') == 12 * tune_step.vit_forward_flops(
      vit.ARCHS['dino_vitb16'], 1)
