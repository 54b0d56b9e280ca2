"""The leaderboard end to end on the offline demo folders (configs/benchmark.py:demo), its resume per
(model, protocol), its outputs, and one cell against an independent computation from the loaders and NumPy."""
import csv
import json
import os

import numpy as np
import pytest

from visim_jax import main
from visim_jax.core.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def demo_config(tmp_path, arg='local', **overrides):
  import importlib.util
  spec = importlib.util.spec_from_file_location('benchmark_config', os.path.join(ROOT, 'configs', 'benchmark.py'))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config(arg)
  c.cache_dir = str(tmp_path / 'cache')
  c.demo.root = str(tmp_path / 'demo')
  c.n_boot = 50
  c.plots = False
  for k, v in overrides.items():
    c[k] = v
  return c


@pytest.fixture(scope='module')
def demo_run(tmp_path_factory, human_demo_sets):
  tmp = tmp_path_factory.mktemp('bench')
  c = demo_config(tmp, plots=True)    # :local = :demo with its two fast models and one set per protocol
  assert c.models == 'cosine:efficientnet_lite0,lpips:alex'
  c.demo.root = os.path.dirname(human_demo_sets.root)               # the session's demo folders (conftest)
  work = str(tmp / 'w')
  return c, work, main.run(c, work), tmp


def test_demo_writes_the_leaderboard(demo_run):
  c, work, summary, _ = demo_run
  specs = [s.strip() for s in c.models.split(',')]
  with open(os.path.join(work, 'leaderboard.json')) as f:
    board = json.load(f)
  assert board['models'] == specs and set(board['protocols']) == {'nights', 'bapps_2afc', 'bapps_jnd', 'things'}
  for spec in specs:
    for protocol, subsets in board['results'][spec].items():
      for name, cell in subsets.items():
        assert set(cell) == {'score', 'ci_low', 'ci_high', 'n'}, (spec, protocol, name)
        assert 0 <= cell['ci_low'] <= cell['score'] <= cell['ci_high'] <= 1 and cell['n'] > 0
  r = board['results'][specs[0]]
  assert set(r['nights']) == {'test'} and set(r['bapps_jnd']) == {'traditional'}
  # graded distortions: a real backbone mostly prefers the milder rendering on the demo sets
  assert r['nights']['test']['score'] > 0.7 and r['things']['odd-one-out']['score'] > 0.7
  md = open(os.path.join(work, 'leaderboard.md')).read()
  assert 'Ranks come from a paired bootstrap' in md and 'DreamSim README' in md and f'`{specs[0]}`' in md
  rows = list(csv.reader(open(os.path.join(work, 'leaderboard.csv'))))
  assert rows[0][:2] == ['model', 'data'] and [row[0] for row in rows[1:]] == specs
  # every file the demo sets produce carries the toy-data caveat (issue 33)
  assert md.startswith('**Toy data.** demo data:') and 'real data, NOT comparable with the toy scores above' in md
  assert all(row[1].startswith('toy demo sets') for row in rows[1:]) and 'NOT comparable' in board['data_note']
  assert os.path.getsize(os.path.join(work, 'plots', 'leaderboard.png')) > 1000
  assert summary['computed_cells'] == len(specs) * 4


def test_rerun_reads_back_and_a_changed_field_recomputes(demo_run):
  c, work, first, _ = demo_run
  again = main.run(c, work)
  assert again['computed_cells'] == 0 and again['results'] == first['results']
  spec = first['models'][0]
  from visim_jax.experiments import benchmark
  os.remove(benchmark._record_path(work, spec, 'bapps_jnd'))   # a run killed before this cell
  c2 = c.copy_and_resolve_references()
  c2.things_ties = 'lt'                                    # a protocol's own field: its cells again, only them
  again = main.run(c2, work)
  assert again['computed_cells'] == 1 + len(first['models'])
  assert again['results'][spec]['bapps_2afc'] == first['results'][spec]['bapps_2afc']
  assert again['results'][spec]['bapps_jnd'] == first['results'][spec]['bapps_jnd']


def test_one_cell_equals_loaders_plus_numpy(demo_run):
  """BAPPS 2AFC 'traditional' for cosine:efficientnet_lite0, recomputed from the loader, features.py and the
  LPIPS rule written here: (d0 < d1)(1 - j) + (d1 < d0) j + 0.5 (d0 == d1) with d = 1 - cos."""
  c, work, summary, tmp = demo_run
  from visim_jax.backbones import features
  from visim_jax.backbones import registry
  from visim_jax.data import bapps, human_demo
  d = human_demo.demo_sets(c.demo.root, c.demo.seed)
  s = bapps.load_2afc(d.bapps, 'val', ['traditional'])['traditional']
  b = registry.get_backbone('efficientnet_lite0')
  x = features.cached_features(b, s.paths(), c.cache_dir, tag='bapps_2afc-traditional', progress=False)
  f = dict(zip(s.paths(), x))   # the run's cache entry (its manifest checked): extraction is features.py's
  cos = lambda u, v: float(np.dot(u, v) / np.linalg.norm(u) / np.linalg.norm(v))
  scores = []
  for r, a, bb, j in zip(s.ref, s.p0, s.p1, s.judge):
    d0, d1 = 1 - cos(f[r], f[a]), 1 - cos(f[r], f[bb])
    scores.append((d0 < d1) * (1 - j) + (d1 < d0) * j + 0.5 * (d0 == d1))
  got = summary['results']['cosine:efficientnet_lite0']['bapps_2afc']['traditional']
  assert got['n'] == len(s) and abs(got['score'] - np.mean(scores)) < 1e-6


def test_lpips_cell_equals_lpips_on_the_native_images(demo_run):
  """BAPPS 2AFC 'traditional' for lpips:alex: lpips.lpips_distance on the 64x64 patches as decoded (LPIPS's
  native resolution, no resize), then the rule in NumPy."""
  c, work, summary, tmp = demo_run
  from PIL import Image
  from visim_jax.models import lpips
  from visim_jax.data import bapps, human_demo
  d = human_demo.demo_sets(c.demo.root, c.demo.seed)
  s = bapps.load_2afc(d.bapps, 'val', ['traditional'])['traditional']
  load = lambda paths: np.stack([np.asarray(Image.open(p).convert('RGB')) for p in paths])
  model = lpips.load_lpips('alex')
  d0 = np.asarray(lpips.lpips_distance(model, load(s.ref), load(s.p0)))
  d1 = np.asarray(lpips.lpips_distance(model, load(s.ref), load(s.p1)))
  j = np.asarray(s.judge)
  want = np.mean((d0 < d1) * (1 - j) + (d1 < d0) * j + 0.5 * (d0 == d1))
  got = summary['results']['lpips:alex']['bapps_2afc']['traditional']
  assert load(s.ref).shape[1:] == (64, 64, 3) and abs(got['score'] - want) < 1e-6


def test_no_data_and_bad_models_are_one_line(tmp_path):
  c = demo_config(tmp_path, dataset='folders')
  with pytest.raises(UserError, match='config.nights_dir: no data given'):
    main.run(c, str(tmp_path / 'w'))
  c = demo_config(tmp_path, models='cosine:efficientnet_lite0,bogus')
  with pytest.raises(UserError, match="config.models: 'bogus'"):
    main.run(c, str(tmp_path / 'w'))
  c = demo_config(tmp_path, dataset='folders', bapps_dir=str(tmp_path / 'nope'))
  with pytest.raises(UserError, match='config.bapps_dir: .*nope: folder not found'):
    main.run(c, str(tmp_path / 'w'))


def test_tll_and_classes_protocols_match_plain_loops(tmp_path):
  """aR@k (pessimistic ties) and leave-one-out mAP of a tiny random backbone, against loops over its features."""
  from visim_jax.backbones import features
  from visim_jax.zoo import similarity
  from visim_jax.zoo import interface
  from visim_jax.data import classes as classes_lib, demo, pairs as pairs_lib
  tll = demo.demo_pairs(str(tmp_path / 'demo'), n_pairs=8)
  cls = tmp_path / 'classes'
  for i, (name, im) in enumerate(sorted(demo.source_images().items())[:3]):
    (cls / name).mkdir(parents=True)
    for k in range(3):
      im.convert('RGB').crop((8 * k, 0, 8 * k + 96, 96)).save(cls / name / f'{k}.png')
  c = demo_config(tmp_path, dataset='folders', tll_dir=tll, classes_dir=str(cls), ks=(1, 2),
                  models='cosine:resnet18:tiny')
  r = main.run(c, str(tmp_path / 'w'))['results']['cosine:resnet18:tiny']
  sim = similarity.build('cosine:resnet18:tiny', interface.Options(c.cache_dir, 8, 'float32', False))
  p = pairs_lib.load_pairs(tll)
  f = sim.featurize(p.left + p.right, 'x')
  n = len(p)
  cos = lambda u, v: float(np.dot(u, v) / np.linalg.norm(u) / np.linalg.norm(v))
  s = np.array([[cos(f[i], f[n + j]) for j in range(n)] for i in range(n)])
  for k in (1, 2):
    found = [min(1 + sum(s[i, j] >= s[i, i] for j in range(n) if j != i),
                 1 + sum(s[j, i] >= s[i, i] for j in range(n) if j != i)) <= k for i in range(n)]
    assert abs(r['tll'][f'aR@{k}']['score'] - np.mean(found)) < 1e-6 and r['tll'][f'aR@{k}']['n'] == n
  data = classes_lib.image_folder(str(cls))
  g = sim.featurize(data.paths, 'y')
  labels = np.asarray(data.labels)
  aps = []
  for q in range(len(g)):
    others = [j for j in range(len(g)) if j != q]
    order = sorted(others, key=lambda j: -cos(g[q], g[j]))
    rel = [labels[j] == labels[q] for j in order]
    hits = np.cumsum(rel)
    aps.append(np.sum([hits[i] / (i + 1) for i in range(len(rel)) if rel[i]]) / sum(rel))
  assert abs(r['classes']['mAP']['score'] - np.mean(aps)) < 1e-5 and r['classes']['mAP']['n'] == 9


def test_demo_leaves_dists_out_in_one_line_until_fetched(tmp_path, monkeypatch, capsys):
  """The demo runs offline: without DISTS's alpha / beta (neither fetched nor the DISTS_pytorch package) it ranks the
  other models and says so in one line naming the command; with them, DISTS stays (issue 45)."""
  import types
  import ml_collections
  from visim_jax.data import human_demo
  from visim_jax.experiments import benchmark
  from visim_jax.models import dists
  monkeypatch.setattr(human_demo, 'demo_sets', lambda *a: types.SimpleNamespace(
      nights='n', bapps='b', things='t', things_dreamsim='t/x.txt'))
  c = ml_collections.ConfigDict({'dataset': 'demo', 'demo': {'root': '', 'seed': 0}, 'cache_dir': str(tmp_path),
                                 'models': 'lpips:alex,dists,ssim', 'nights_dir': '', 'bapps_dir': '',
                                 'things_dir': '', 'things_triplets': ''})
  monkeypatch.setenv('VISIM_JAX_WEIGHTS', str(tmp_path))
  monkeypatch.setattr(dists, 'package_weights', lambda: None)
  out = benchmark.with_demo(c)
  assert out.models == 'lpips:alex,ssim' and c.models == 'lpips:alex,dists,ssim'
  lines = [l for l in capsys.readouterr().out.splitlines() if 'dists' in l]
  assert lines == [benchmark.DISTS_LEFT_OUT] and '`python -m visim_jax.fetch dists`' in lines[0]
  (tmp_path / 'dists.safetensors').write_bytes(b'')   # fetched: the demo ranks it
  assert benchmark.with_demo(c).models == 'lpips:alex,dists,ssim'


def test_image_size_reaches_the_vit_tower(tmp_path, human_demo_sets):
  """config.image_size: the tiny ViT's NIGHTS distances are vj.load(spec, image_size=64)'s on the same files (its
  position embeddings interpolated from the 32 px grid); a bad size is one line naming the field."""
  import visim_jax as vj
  from visim_jax.data import nights
  from visim_jax.experiments import benchmark
  c = demo_config(tmp_path, models='cosine:vit:tiny', image_size=64, n_boot=0, bapps_2afc=False,
                  bapps_jnd=False)
  c.demo.root = os.path.dirname(human_demo_sets.root)
  work = str(tmp_path / 'w')
  summary = main.run(c, work)
  assert summary['identities']['cosine:vit:tiny']['image_size'] == 64
  with open(benchmark._record_path(work, 'cosine:vit:tiny', 'nights')) as f:
    items = json.load(f)['results']['test']['items']
  s = nights.load(human_demo_sets.nights, 'test')
  model = vj.load('cosine:vit:tiny', fetch=False, image_size=64)
  assert model.image_size == 64
  np.testing.assert_allclose(items['d0'], model.distance(list(s.ref), list(s.p0)), rtol=1e-4, atol=1e-6)
  for size, match in ((60, 'config.image_size=60: .*multiple of 8'), (8, 'config.image_size=8: .*16..4096')):
    with pytest.raises(UserError, match=match):
      main.run(demo_config(tmp_path, models='cosine:vit:tiny', image_size=size), work)
  with pytest.raises(UserError, match='config.image_size=64: none of the models has a ViT'):
    main.run(demo_config(tmp_path, models='l1', image_size=64), work)
