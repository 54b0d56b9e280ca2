"""The gate on the result surfaces (issue 28): hostile input to search, classify, export and the model specs
ends in one UserError line naming the flag, spec or file (never a traceback, never an arbitrary ranking with
exit 0); search prints every result it found (issue 25.5); classify says which model and what the numbers are."""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from visim_jax.core import memory
from PIL import Image

from visim_jax import search
from visim_jax.training import adapter_file
from visim_jax.zoo import similarity as S
from visim_jax.zoo import interface
from visim_jax.core.errors import UserError
from visim_jax.search import folder as folder_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope='module')
def photos(tmp_path_factory):
  root = tmp_path_factory.mktemp('photos')
  rng = np.random.RandomState(0)
  for i in range(4):
    Image.fromarray(rng.randint(0, 256, (32, 32, 3)).astype(np.uint8)).save(root / f'{i}.png')
  return str(root)


@pytest.mark.parametrize('flag, value', [('sheet_k', -1), ('sheet_queries', 0), ('batch_size', 0), ('block', 0),
                                         ('query_block', -2), ('k', 0)])
def test_search_flags_are_checked_first_and_named(photos, tmp_path, flag, value):
  with pytest.raises(UserError, match=rf'^--{flag}: must be >= 1, got {value}$'):
    search.run(photos, ['all'], out=str(tmp_path / 'o'), cache_dir='none', progress=False, **{flag: value})
  assert not (tmp_path / 'o').exists()


def test_search_and_classify_name_the_backbone_flag(photos, tmp_path):
  from visim_jax import classify
  with pytest.raises(UserError, match=r"^--backbone: unknown backbone 'bogus'"):
    search.run(photos, ['all'], backbone='bogus', out=str(tmp_path / 'o'), cache_dir='none', progress=False)
  with pytest.raises(UserError, match=r"^--backbone: unknown backbone 'bogus'"):
    classify.classify('bogus', [photos])
  with pytest.raises(UserError, match=r'^--batch_size: must be >= 1, got 0$'):
    classify.classify('efficientnet_lite0', [photos], batch_size=0)


def test_degenerate_vectors_are_refused():
  rng = np.random.RandomState(1)
  with pytest.raises(UserError, match=r'^--adapter: a.npz: every image maps to the zero vector'):
    folder_lib.check_vectors(np.zeros((5, 8)), '--adapter: a.npz')                   # W = 0 after the ReLU
  with pytest.raises(UserError, match=r'^--adapter: a.npz: 2 of 5 vectors hold NaN/Inf'):
    folder_lib.check_vectors(np.r_[rng.rand(3, 8), np.full((2, 8), np.inf)], '--adapter: a.npz')
  with pytest.raises(UserError, match='one direction'):
    folder_lib.check_vectors(np.tile(rng.rand(1, 8), (5, 1)), "--folder: f")             # identical images
  folder_lib.check_vectors(rng.rand(5, 8), '--folder: f')


def test_search_with_a_zero_adapter_is_refused(photos, lite0, tmp_path):
  d = 1776
  rng = np.random.RandomState(2)
  zero = adapter_file.save_adapter(str(tmp_path / 'w0.npz'), np.zeros(d), rng.randn(d, 4), np.ones(4), np.zeros((4, 6)),
                             meta=adapter_file.backbone_meta(lite0))
  with pytest.raises(UserError, match=r'^--adapter: .*w0.npz: every image maps to the zero vector'):
    search.run(photos, ['all'], adapter=zero, out=str(tmp_path / 'z'), cache_dir='none', progress=False)
  assert not os.path.exists(tmp_path / 'z' / 'results.json')


def test_search_prints_every_result(capsys):
  """Issue 25.5: 3 of k = 5 were printed."""
  queries = [{'query': f'/p/q{i}.png', 'partner_rank': i + 1,
              'results': [{'rank': r + 1, 'name': f'm{i}{r}.png', 'path': '', 'score': 0.9 - 0.1 * r}
                          for r in range(5)]} for i in range(3)]
  summary = {'k': 5, 'queries': queries, 'metrics': {'mean_rank': 2.0, 'median_rank': 2, 'mrr': 0.6,
                                                     'recall@1': 0.3, 'recall@5': 1.0, 'recall@10': 1.0},
             'skipped': {'count': 0, 'images': []}, 'n_queries': 3, 'n_index': 9, 'similarity': 'cosine'}
  folder_lib._print(summary, np.array([1, 2, 3]), 2, '/out')
  printed = capsys.readouterr().out
  for q in queries[:2]:                                           # all five, not the first three
    for r in q['results']:
      assert re.search(rf"\b{r['rank']}\s+{r['name']}\s+{r['score']:.3f}\b", printed), r
  assert 'm14.png' in printed and 'm24.png' not in printed
  assert 'the first 2 of 3 queries' in printed


def test_cli_one_line_no_traceback(photos):
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu', 'PYTHONPATH': ROOT + os.pathsep + os.environ.get('PYTHONPATH', '')}
  env.pop('VISIM_TRACEBACK', None)
  r = subprocess.run([sys.executable, '-m', 'visim_jax.search', f'--folder={photos}', '--query=all',
                      '--sheet_k=-1'], cwd=ROOT, env=env, capture_output=True, text=True)
  assert r.returncode == 1 and r.stderr.strip().splitlines() == ['error: --sheet_k: must be >= 1, got -1']
  assert 'Traceback' not in r.stderr


@pytest.mark.parametrize('spec, needle', [
    ('cosine:resnet18:tiny@stage2+stage2', "layer 'stage2' is listed twice"),
    ('cosine:resnet18:tiny@', 'nothing after @'),
    ('cosine:resnet18:tiny@stage2++stage3', 'an empty layer name'),
])
def test_bad_layers_in_a_spec(spec, needle):
  with pytest.raises(UserError, match=r'^config.models: ') as e:
    interface.split_specs(spec)
  assert needle in str(e.value) and '\n' not in str(e.value)


def _workdir(path, metrics, checkpoint_bytes=None):
  os.makedirs(path / 'checkpoints', exist_ok=True)
  (path / 'metrics.json').write_text(metrics if isinstance(metrics, str) else json.dumps(metrics))
  if checkpoint_bytes is not None:
    os.makedirs(path / 'checkpoints' / '3', exist_ok=True)
    (path / 'checkpoints' / '3' / '_CHECKPOINT_METADATA').write_bytes(checkpoint_bytes)
  return str(path)


SIMNET = {'experiment': 'simnet', 'mode': 'images', 'backbone': 'resnet18', 'weights_sha256': 'random:0:tiny',
          'config': {}}
CONTEXT = {'experiment': 'twoafc', 'features': {'kind': 'images', 'backbone': 'resnet18', 'dim': 8,
                                                'weights_sha256': 'random:0:tiny'},
           'context_models': {'models': ['global'], 'contexts': ['a'], 'hparams': {}}}


def test_malformed_model_workdirs_are_one_line(tmp_path):
  junk = os.urandom(300)
  cases = [
      ('simnet', _workdir(tmp_path / 's1', SIMNET), 'checkpoints'),                          # no checkpoint
      ('simnet', _workdir(tmp_path / 's2', SIMNET, junk), 'checkpoints'),                    # random bytes
      ('simnet', _workdir(tmp_path / 's3', '[1, 2]'), 'a JSON object expected'),
      ('simnet', _workdir(tmp_path / 's4', '{"experiment": "simn'), 'unreadable'),
      ('context', _workdir(tmp_path / 'c1', {'experiment': 'twoafc'}), 'not a finished CoSIS run'),
      ('context', _workdir(tmp_path / 'c2', CONTEXT), 'no checkpoint'),
      ('context', _workdir(tmp_path / 'c3', CONTEXT, junk), 'checkpoints'),
      ('context', _workdir(tmp_path / 'c4', {**CONTEXT, 'features': {**CONTEXT['features'], 'backbone': [1]}}),
       'unknown backbone'),
  ]
  (tmp_path / 'rand.npz').write_bytes(junk)
  cases.append(('adapter', str(tmp_path / 'rand.npz'), 'unreadable adapter file'))
  for kind, target, needle in cases:
    spec = f'{kind}:{target}'
    with pytest.raises(UserError) as e:
      S.build(spec)
    msg = str(e.value)
    assert msg.startswith(f'config.models: {spec!r}: ') and needle in msg and '\n' not in msg, (spec, msg)


def test_export_takes_only_adaptation_workdirs(tmp_path):
  wd = _workdir(tmp_path / 'na', {'experiment': 'nights_adapt'})
  with pytest.raises(UserError, match=r'^--workdir: .*na: a nights_adapt workdir; '
                                      'export takes the workdir of an adaptation run'):
    adapter_file.from_workdir(wd)
  open(os.path.join(wd, 'triplet_head.npz'), 'wb').close()   # the file the run wrote is named, not adapter.npz
  with pytest.raises(UserError, match=r'^--workdir: .*na: a nights_adapt workdir; it wrote .*triplet_head.npz itself; '
                                      'export takes the workdir of an adaptation run'):
    adapter_file.from_workdir(wd)
  os.remove(os.path.join(wd, 'triplet_head.npz'))
  with pytest.raises(UserError, match='a benchmark workdir'):
    adapter_file.from_workdir(_workdir(tmp_path / 'b', {'experiment': 'benchmark'}))
  with pytest.raises(UserError, match=r'checkpoints: not an adaptation checkpoint'):
    adapter_file.from_workdir(_workdir(tmp_path / 'r', {'experiment': 'adapt'}, os.urandom(200)))
  assert not os.path.exists(os.path.join(wd, 'adapter.npz'))


def test_classify_says_which_model_and_what_the_numbers_are(photos, lite0):
  from visim_jax import classify
  out = classify.classify(lite0, [os.path.join(photos, '0.png')], top=2)
  assert out['backbone'] == 'efficientnet_lite0' and out['weights_sha256'] == lite0.weights_id
  assert 'softmax probability' in out['p'] and len(out['images'][0]['classes']) == 2
  assert sum(c['p'] for c in out['images'][0]['classes']) <= 1.0


def test_search_memory_is_estimated_before_the_index_is_built(photos, tmp_path, monkeypatch):
  monkeypatch.setattr(memory, 'limit_bytes', lambda: 2**20)   # a 1 MiB "device"
  with pytest.raises(UserError, match=r'^--block: the search index needs at least .* GiB .*lower '
                                      r'--block \(.* of it\) or --query_block \(.* of it\)$'):   # the larger first
    search.run(photos, ['all'], out=str(tmp_path / 'm'), cache_dir='none', progress=False, block=4096,
               query_block=256)
  assert not os.path.exists(tmp_path / 'm' / 'results.json')
