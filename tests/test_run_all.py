"""benchmarks/run_all.py --gpu: the plan lists every script with a budget within GPU_TOTAL_S (dry run on a CPU); a
script that overruns its budget is killed and the suite goes on."""
import json
import os
import re
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
  assert sum(e["budget_s"] for e in plan) <= run_all.GPU_TOTAL_S
  # the plan splits into device calls (at most 600 s each, with the machine's start and the wheels' install)
  budget = {e['name']: e['budget_s'] for e in plan}
  parts = [n for part in run_all.GPU_CALLS for n in part]
  assert sorted(parts) == sorted(budget), 'every GPU_PLAN entry is in exactly one GPU_CALLS part'
  assert run_all.GPU_CALL_S <= 560
  for part in run_all.GPU_CALLS:
    assert sum(budget[n] for n in part) <= run_all.GPU_CALL_S, part
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
  assert re.search(r'quick\| \[\+\d+\.\d s\] step', capsys.readouterr().out)  # echoed as it comes, timed
  assert re.search(r'\[\+\d+\.\d s\] step', err)   # the stderr tail keeps the times (where a cut script was)
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


def _fake_row(load):
  return {'script': 'search.py', 'args': [], 'status': 'ok', 'wall_s': 0.1,
          'result': {'rows': [{'capability': 'look-alike search', 'ours': 'ours: 2 queries/s', 'reference': 'np: 1 queries/s',
                               'ratio': 2.0, 'spread': [1.9, 2.1], 'alternations': 3, 'load_average': [load, 1.0, 1.0]}]}}


@pytest.mark.parametrize('load,flags,written', [(0.9, [], True), (5.0, [], False), (5.0, ['--write_contended'], True),
                                                (5.0, ['--max_load=8'], True)])
def test_refuses_to_write_results_on_a_loaded_box(tmp_path, monkeypatch, capsys, load, flags, written):
  monkeypatch.setattr(run_all, 'run_one', lambda name, timeout, args: _fake_row(load))
  monkeypatch.setattr(run_all, 'load_average', lambda: [load, 1.0, 1.0])
  results, js, contended = tmp_path / 'RESULTS.md', tmp_path / 'all.json', tmp_path / 'contended.json'
  results.write_text('# Benchmark results\n\nquiet rows stay\n')
  run_all.main(['--only=search', '--small', f'--results={results}', f'--json_out={js}', f'--contended_json={contended}',
                *flags])
  out = capsys.readouterr().out
  text = results.read_text()
  assert 'quiet rows stay' in text
  assert f'| {load:.1f}/1.0/1.0 |' in out                       # the load average printed in the row
  assert (run_all.BEGIN in text) == written and js.exists() == written and contended.exists() == (not written)
  if not written:
    assert 'not writing' in out and '--write_contended' in out
    assert json.loads(contended.read_text())['contended'] is True
  elif load > 2:
    assert ('CONTENDED' in text) == ('--write_contended' in flags)


def test_gpu_entry_without_its_packages_is_skipped_with_a_reason(tmp_path, monkeypatch, capsys):
  monkeypatch.setitem(run_all.GPU_NEEDS, 'search', ('a_package_that_is_not_installed',))
  jsonl = tmp_path / 'gpu.jsonl'
  rows = run_all.main(['--gpu', '--only=search', f'--results={tmp_path / "R.md"}', f'--gpu_jsonl={jsonl}'])
  assert [r['status'] for r in rows] == [
      'skipped: the a_package_that_is_not_installed package is not installed (carry its wheel: '
      '../shared/tools/device-wheels.sh)']
  assert json.loads(jsonl.read_text().splitlines()[0])['status'].startswith('skipped')
  assert 'skipped: the a_package' in (tmp_path / 'R.md').read_text()


def test_results_section_is_found_on_its_own_line_not_in_the_prose(tmp_path):
  path = tmp_path / 'RESULTS.md'
  path.write_text(f'# R\n\nThe table goes between `{run_all.GPU_BEGIN}` and `{run_all.GPU_END}` below.\n\n'
                  f'{run_all.GPU_BEGIN}\nold table\n{run_all.GPU_END}\n\nafter\n')
  run_all.update_results(str(path), f'{run_all.GPU_BEGIN}\nnew table\n{run_all.GPU_END}', run_all.GPU_BEGIN,
                         run_all.GPU_END)
  text = path.read_text()
  assert 'old table' not in text and 'new table' in text and 'after' in text
  assert f'The table goes between `{run_all.GPU_BEGIN}` and `{run_all.GPU_END}` below.' in text


def test_gpu_section_keeps_the_earlier_runs_rows(tmp_path):
  path = tmp_path / 'RESULTS.md'
  path.write_text(f'# R\n\n{run_all.GPU_BEGIN}\n| H100 | old row |\n{run_all.GPU_END}\n\nafter\n')
  for new in ('part 1 table', 'part 2 table'):
    run_all.update_results(str(path), f'{run_all.GPU_BEGIN}\n{new}\n{run_all.GPU_END}', run_all.GPU_BEGIN,
                           run_all.GPU_END, keep=True)
  text = path.read_text()
  inner = text.split(run_all.GPU_BEGIN + '\n', 1)[1].split('\n' + run_all.GPU_END, 1)[0]
  assert inner == '| H100 | old row |\n\npart 1 table\n\npart 2 table'
  assert text.endswith(f'{run_all.GPU_END}\n\nafter\n')


def test_interleaved_min_time_times_the_same_back_to_back_runs_on_each_side(monkeypatch):
  inter = _bench_module('interleaved')
  clock = {'now': 0.0}
  calls = {'fast': 0, 'slow': 0}

  class FakeTime:   # a virtual clock: the sides advance it, so machine load cannot change the counts
    perf_counter = staticmethod(lambda: clock['now'])
    sleep = staticmethod(lambda s: clock.__setitem__('now', clock['now'] + s))

  monkeypatch.setattr(inter, 'time', FakeTime)

  def side(name, seconds):
    def run():
      calls[name] += 1
      clock['now'] += seconds
    return run
  times = inter.interleaved({'fast': side('fast', 0.001), 'slow': side('slow', 0.02)}, alternations=2,
                            warmup=False, pause=0.25, min_time=0.005)
  # 3 calibration calls of the fast side, 1 of the slow (longer than min_time), then 5 back-to-back calls of each
  # side per alternation, their mean recorded
  assert calls == {'fast': 3 + 2 * 5, 'slow': 1 + 2 * 5}
  import numpy as np
  np.testing.assert_allclose(times['fast'], [0.001, 0.001])
  np.testing.assert_allclose(times['slow'], [0.02, 0.02])
