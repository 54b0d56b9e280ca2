r"""Runs every capability benchmark and prints one table: capability, ours, reference, ratio, spread, load average.

  python benchmarks/run_all.py            # CPU sizes (adaptation at TLL step sizes), ~15-25 min on a quiet 2-core box
  python benchmarks/run_all.py --small    # the same comparisons at small sizes, a few minutes
  python benchmarks/run_all.py --only=adapt,twoafc
  python benchmarks/run_all.py --dry_run  # the commands it would run
  python benchmarks/run_all.py --gpu      # every capability on one GPU in at most 7.5 minutes (GPU_PLAN)
  python benchmarks/run_all.py --gpu --dry_run   # the GPU plan: each script, its budget and its command

Each script runs as a subprocess (its arguments: PRESETS[--small or full] on a CPU, the bare GPU-size defaults
with --sizes=default) and prints one JSON object whose `rows` are its comparisons: each side timed interleaved
(benchmarks/interleaved.py: A B B A ..., >= 3 alternations, median, spread = smallest and largest ratio of the
alternations, the load average when measured). The table goes into benchmarks/RESULTS.md between
`<!-- run_all:begin -->` and `<!-- run_all:end -->` with the machine, the date and the command; the full JSON
of every script into benchmarks/results_all.json. A script that fails or times out gets a row saying so.

--gpu runs GPU_PLAN instead: each entry one script with GPU sizes chosen to finish, its own budget (a subprocess
timeout; the budgets add up to GPU_TOTAL_S = 7.5 minutes), the float32 precision of both sides set explicitly
($VISIM_BENCH_PRECISION -> benchmarks/precision.py) and written in its JSON. Each script's progress lines are
echoed as they come, and its JSON is printed and appended to benchmarks/results_gpu.jsonl as soon as it finishes,
so a suite that is killed keeps what finished; the table goes between `<!-- run_all_gpu:begin -->` and
`<!-- run_all_gpu:end -->` in RESULTS.md.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SCRIPTS = ('extract', 'adapt', 'histograms', 'simnet', 'twoafc', 'extract_clip', 'search', 'leaderboard', 'lpips',
           'learn_triplets')
BEGIN, END = '<!-- run_all:begin -->', '<!-- run_all:end -->'
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
    },
    'small': {
        'adapt': ['--preset=small'],
        'twoafc': ['--small'],
        'histograms': ['--samples=20000', '--dim=128', '--classes=20', '--n_pairs=1000'],
        'simnet': ['--preset=cpu', '--reference', '--queries=8', '--database=128', '--q_tile=8', '--skip_naive'],
        'extract': ['--batch=8', '--batches=2', '--files=16'],
        'extract_clip': ['--dtype=float32', '--batch=4', '--batches=2', '--files=8'],
        'search': ['--n=20000', '--queries=64'],
        'leaderboard': ['--small'],
        'lpips': [],
        'learn_triplets': ['--mode=compare', '--images=2000', '--dim=128', '--emb=128', '--batch=128',
                           '--steps=20', '--triplets=20000'],
    },
}


# --gpu: (entry name, script, arguments, budget in seconds, float32 precision of both sides). Sizes are chosen so that
# each finishes within its budget on one H100 (80 GB) with 16 host cores, start-up and compilation included.
GPU_TOTAL_S = 450
GPU_PLAN = (
    ('pipeline', 'pipeline', ['--files=1024', '--batch=256', '--dtype=bfloat16', '--repeats=2', '--alternations=2'],
     30, 'fp32'),
    ('extract_lite0', 'extract', ['--batch=256', '--batches=10', '--dtype=float32', '--files=256'], 25, 'fp32'),
    ('extract_clip_b32', 'extract_clip', ['--batch=256', '--batches=10', '--files=512'], 35, 'fp32'),
    ('extract_siglip_dreamsim', 'extract_families',
     ['--members=siglip_b16_224,dreamsim_ensemble', '--batch=64', '--batches=3', '--dtype=bfloat16'], 65, 'fp32'),
    ('lpips', 'lpips', ['--nets=alex,vgg', '--sizes=64,224', '--pairs=4096', '--batch=256'], 25, 'fp32'),
    ('adapt_tll', 'adapt', ['--preset=tll', '--alternations=2'], 70, 'fp32'),
    ('simnet', 'simnet', ['--preset=gpu', '--reference', '--skip_naive', '--queries=512', '--database=16384',
                          '--repeats=2'], 25, 'fp32'),
    ('histograms_imagenet', 'histograms', ['--samples=1281167', '--dim=768', '--classes=1000', '--n_pairs=2000',
                                           '--repeats=2'], 30, 'fp32'),
    ('search', 'search', ['--n=1000000', '--dim=768', '--queries=512', '--repeats=2'], 15, 'fp32'),
    ('twoafc', 'twoafc', ['--n_triplets=2000000', '--loop_triplets=20000', '--sweep_triplets=20000',
                          '--repeats=2'], 20, 'fp32'),
    ('learn_triplets', 'learn_triplets', ['--mode=compare', '--steps=50', '--alternations=3'], 20, 'fp32'),
    # ViT-B/16 LoRA step vs PyTorch + peft, bfloat16 compute on both sides (the script's preset; stops at 80 s)
    ('tune_step_vitb16_lora', 'tune_step', ['--gpu_preset'], 90, 'fp32'),
)
GPU_BEGIN, GPU_END = '<!-- run_all_gpu:begin -->', '<!-- run_all_gpu:end -->'


def gpu_commands() -> list[dict]:
  """GPU_PLAN as {name, script, args, budget_s, precision, command} (what --gpu --dry_run prints)."""
  return [{'name': n, 'script': f'{s}.py', 'args': a, 'budget_s': b, 'precision': p,
           'command': f'VISIM_BENCH_PRECISION={p} python benchmarks/{s}.py {" ".join(a)}'.rstrip()}
          for n, s, a, b, p in GPU_PLAN]


def run_streaming(cmd: list[str], timeout: float, env: dict, prefix: str) -> tuple[int | None, str, str]:
  """(exit status or None on timeout, stdout, stderr tail): stderr lines echoed as they come; the process group
  is killed at `timeout`."""
  p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       start_new_session=True)
  out, err = [], []

  def pump(stream, sink, echo):
    for line in stream:
      sink.append(line)
      if echo:
        print(f'   {prefix}| {line.rstrip()}'[:300], flush=True)
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
  t_suite = time.time()
  for e in plan:
    print(f'-- {e["name"]} (budget {e["budget_s"]} s, {time.time() - t_suite:.0f} s into the suite)', flush=True)
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
           'precision': e['precision'], 'status': status, 'wall_s': wall, 'result': result}
    if status != 'ok':
      row['stderr_tail'] = err
    print(f'   {status} in {wall:.1f} s', flush=True)
    print(json.dumps(row), flush=True)
    with open(a.gpu_jsonl, 'a') as f:
      f.write(json.dumps(row) + '\n')
    rows.append(row)
  mach = machine()
  date = datetime.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')
  section = render(rows, mach, date, 'python benchmarks/run_all.py --gpu').replace(BEGIN, GPU_BEGIN).replace(
      END, GPU_END).replace('benchmarks/results_all.json', os.path.relpath(a.gpu_jsonl, ROOT))
  print('\n'.join(l for l in section.split('\n') if l.startswith('|') or l.startswith('Machine')))
  update_results(a.results, section, GPU_BEGIN, GPU_END)
  print(f'wrote {a.results} and {a.gpu_jsonl} ({time.time() - t_suite:.0f} s in all)')
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
  """The table lines of one script's result: its `rows`, or one line saying it gave none / failed."""
  res = row.get('result') or {}
  if row['status'] == 'ok' and res.get('rows'):
    return res['rows']
  return [{'capability': row['script'], 'ours': row['status'] if row['status'] != 'ok' else
           '(no interleaved comparison)', 'reference': '-', 'ratio': None, 'spread': None, 'load_average': None}]


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


def render(rows: list[dict], mach: dict, date: str, command: str) -> str:
  lines = [BEGIN, '', f'### All benchmarks: `{command}`, {date}', '',
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


def update_results(path: str, section: str, begin: str = BEGIN, end: str = END) -> None:
  """Replaces the run_all section of `path` (or appends it), leaving the rest of the file as it was."""
  text = open(path).read() if os.path.exists(path) else '# Benchmark results\n'
  b, e = text.find(begin), text.find(end)
  if b >= 0 and e > b:
    text = text[:b] + section + text[e + len(end):]
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
  ap.add_argument('--gpu', action='store_true', help='GPU_PLAN: every capability on one GPU within 7.5 minutes')
  ap.add_argument('--gpu_jsonl', default=os.path.join(HERE, 'results_gpu.jsonl'),
                  help='--gpu: each finished script\'s JSON is appended here at once')
  a = ap.parse_args(argv)
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
  for name, args in runs:
    print(f'-- {name}.py ...', flush=True)
    row = run_one(name, a.timeout, args)
    print(f'   {row["status"]} in {row["wall_s"]:.1f} s', flush=True)
    for t in table_rows(row):
      print('   ' + fmt_row(t, name), flush=True)
    rows.append(row)
  mach = machine()
  date = datetime.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')
  command = 'python benchmarks/run_all.py' + (' ' + ' '.join(argv if argv is not None else sys.argv[1:])).rstrip()
  section = render(rows, mach, date, command)
  print('\n'.join(l for l in section.split('\n') if l.startswith('|') or l.startswith('Machine')))
  update_results(a.results, section)
  with open(a.json_out, 'w') as f:
    json.dump({'date': date, 'machine': mach, 'benchmarks': rows}, f, indent=1)
  print(f'wrote {a.results} and {a.json_out}')
  return rows


if __name__ == '__main__':
  main()
