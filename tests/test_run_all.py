"""benchmarks/run_all.py --gpu: the plan lists every script with a budget within 7.5 minutes (dry run on a CPU); a
script that overruns its budget is killed and the suite goes on."""
import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _bench_module(name):
  # loaded from its file, not through sys.path: benchmarks/lpips.py must never shadow the `lpips` package for
  # the tests that run after this one in the same worker
  import importlib.util
  spec = importlib.util.spec_from_file_location(f'bench_{name}', os.path.join(ROOT, 'benchmarks', f'{name}.py'))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


run_all = _bench_module('run_all')


def test_gpu_dry_run_lists_every_script_with_a_budget(capsys):
  plan = run_all.main(['--gpu', '--dry_run'])
  out = capsys.readouterr().out
  assert sum(e['budget_s'] for e in plan) <= run_all.GPU_TOTAL_S == 450
  scripts = {e['script'] for e in plan}
  for s in ('pipeline.py', 'extract.py', 'extract_clip.py', 'extract_families.py', 'lpips.py', 'adapt.py',
            'simnet.py', 'histograms.py', 'search.py', 'twoafc.py'):
    assert s in scripts
  for e in plan:
    assert os.path.exists(os.path.join(ROOT, 'benchmarks', e['script']))
    assert e['budget_s'] > 0 and e['precision'] in ('fp32', 'tf32')
    assert f'{e["budget_s"]:>4} s  {e["command"]}' in out
  assert any('--preset=tll' in e['args'] for e in plan if e['script'] == 'adapt.py')
  assert any('--samples=1281167' in e['args'] and '--dim=768' in e['args'] and '--classes=1000' in e['args']
             for e in plan if e['script'] == 'histograms.py')


def test_streaming_run_keeps_output_and_kills_at_the_budget(tmp_path, capsys):
  env = dict(os.environ)
  rc, out, err = run_all.run_streaming(
      [sys.executable, '-c', 'import sys, json; print("step", file=sys.stderr); print(json.dumps({"rows": []}))'],
      30, env, 'quick')
  assert rc == 0 and run_all.last_json_object(out) == {'rows': []} and 'step' in err
  assert 'quick| step' in capsys.readouterr().out  # progress echoed as it comes
  rc, out, err = run_all.run_streaming(
      [sys.executable, '-c', 'import sys, time; print("started", file=sys.stderr, flush=True); time.sleep(60)'],
      1.5, env, 'slow')
  assert rc is None and 'started' in err


def test_precision_is_set_and_recorded():
  precision = _bench_module('precision')
  import jax
  try:
    rec = precision.apply('fp32', torch_side=False)  # (the PyTorch side: benchmarks/precision.py, not imported here)
    assert jax.config.jax_default_matmul_precision == 'highest' and rec['name'] == 'fp32' and json.dumps(rec)
    assert precision.apply('tf32', torch_side=False)['jax_default_matmul_precision'] == 'tensorfloat32'
    with pytest.raises(ValueError):
      precision.apply('fp16', torch_side=False)
  finally:
    jax.config.update('jax_default_matmul_precision', None)
