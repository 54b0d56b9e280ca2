"""Look-alike search: blocked/sharded exact top-k and partner ranks vs brute force; a search of the demo pairs
ranks partners better with a trained adapter than without; plain folders, query files, bad input; undecodable
images skipped and listed (or --strict); outputs follow the umask; the command line's one-line errors."""
import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from visim_jax import search
from visim_jax.training import adapter_file
from visim_jax.training import adaptation_runs
from visim_jax.data import pairs as pairs_lib
from visim_jax.core.errors import UserError
from visim_jax.search import topk

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def brute(db, q, partner=None, exclude=None):
  """Stable argsort of -cosine (ties -> lower index) and pessimistic partner ranks, in NumPy."""
  dn = db / np.linalg.norm(db, axis=1, keepdims=True)
  qn = q / np.linalg.norm(q, axis=1, keepdims=True)
  s = np.array(topk.scores(jax.numpy.asarray(qn), jax.numpy.asarray(dn)))  # the same float rounding
  if exclude is not None:
    s[np.arange(len(q)), exclude] = -np.inf
  order = np.argsort(-s, axis=1, kind='stable')
  ranks = None
  if partner is not None:
    other = np.arange(len(db))[None] != partner[:, None]
    if exclude is not None:
      other &= np.arange(len(db))[None] != exclude[:, None]
    ranks = 1 + ((s >= s[np.arange(len(q)), partner][:, None]) & other).sum(1)
  return s, order, ranks


def data(n=103, d=16, nq=9, seed=0):
  rng = np.random.RandomState(seed)
  db = rng.randn(n, d).astype(np.float32)
  db[50] = db[7]
  db[60] = 2 * db[7]  # same direction: an exact cosine tie with 7 and 50
  q = rng.randn(nq, d).astype(np.float32)
  q[3] = db[7]
  partner = rng.randint(0, n, nq).astype(np.int32)
  partner[3] = 60
  return db, q, partner


def test_topk_and_partner_ranks_equal_brute_force():
  db, q, partner = data()
  s_ref, order, ranks_ref = brute(db, q, partner)
  index = search.build_index(db, block=8)  # 13 blocks, the last one padded
  s, i = search.search(index, q, 10, query_block=4)  # 3 query chunks, the last one padded
  np.testing.assert_array_equal(i, order[:, :10])
  np.testing.assert_allclose(s, np.take_along_axis(s_ref, order[:, :10], 1), atol=1e-6)
  assert list(i[3, :3]) == [7, 50, 60]  # ties go to the lower index
  ranks = search.partner_ranks(index, q, partner, query_block=4)
  np.testing.assert_array_equal(ranks, ranks_ref)
  assert ranks[3] == 3  # pessimistic: the two tied candidates rank ahead of the partner
  exclude = np.arange(9, dtype=np.int32)
  exclude[3] = 7
  _, order_ex, ranks_ex = brute(db, q, partner, exclude)
  _, i_ex = search.search(index, q, 5, exclude=exclude)
  np.testing.assert_array_equal(i_ex, order_ex[:, :5])
  np.testing.assert_array_equal(search.partner_ranks(index, q, partner, exclude), ranks_ex)
  # k up to the whole index; bfloat16 storage keeps the order of well-separated scores
  _, i_all = search.search(index, q, 103)
  np.testing.assert_array_equal(i_all, order)
  bf16 = search.build_index(db, block=32, dtype='bfloat16')
  near = db[:20] + 0.01 * np.random.RandomState(2).randn(20, 16).astype(np.float32)
  _, i_bf = search.search(bf16, near, 1)
  assert (i_bf[:, 0] == np.arange(20)).all()
  with pytest.raises(ValueError, match='--k=104'):
    search.search(index, q, 104)
  with pytest.raises(ValueError, match='16-d'):
    search.search(index, q[:, :5], 3)
  m = search.rank_metrics(np.array([1, 2, 10]))
  assert m['recall@1'] == pytest.approx(1 / 3) and m['mean_rank'] == pytest.approx(13 / 3)


def test_scan_steps_and_equal_blocks_give_the_same_answers(monkeypatch):
  """The shard in equal blocks (little padding), scanned one block per step (a tiny score tile) or all at once: the
  same top-k and ranks as brute force either way."""
  from visim_jax.search import index as index_lib
  assert index_lib.equal_blocks(20000, 8192) == (6672, 3) and index_lib.equal_blocks(100, 8) == (8, 13)
  for rows, block in ((20000, 4096), (200000, 4096), (4097, 4096), (17, 8), (5, 4096), (1, 1)):
    size, nb = index_lib.equal_blocks(rows, block)
    assert size <= max(block, 8) and 0 <= size * nb - rows < max(8 * nb, size)
  assert topk.scan_block(104, 8, 4, tile=10 ** 6) == 104 and topk.scan_block(104, 8, 4, tile=100) == 8
  assert topk.scan_block(96, 8, 4, tile=200) == 48  # the largest group of blocks dividing the 12 that fits
  db, q, partner = data(n=203)
  _, order, ranks_ref = brute(db, q, partner)
  for tile in (1, 10 ** 6):
    monkeypatch.setitem(topk.SCORE_TILE, 'cpu', tile)
    monkeypatch.setattr(topk, 'SCORE_TILE_ACCELERATOR', tile)
    index = search.build_index(db, block=24)
    assert index.block == 24 and index.vectors.shape[0] == 216
    assert index.scan(4) == (24 if tile == 1 else 216)
    _, i = search.search(index, q, 7, query_block=4)
    np.testing.assert_array_equal(i, order[:, :7])
    np.testing.assert_array_equal(search.partner_ranks(index, q, partner, query_block=4), ranks_ref)


SHARDED = """
import json, numpy as np, jax
from visim_jax import search
from tests.test_search import brute, data
db, q, partner = data(n=203, nq=11)
s_ref, order, ranks_ref = brute(db, q, partner)
index = search.build_index(db, block=16)
s, i = search.search(index, q, 12, query_block=8)
r = search.partner_ranks(index, q, partner, query_block=8)
print(json.dumps({'devices': index.mesh.devices.size, 'shard_rows': index.vectors.addressable_shards[0].data.shape[0],
                  'topk': bool((i == order[:, :12]).all()), 'ranks': bool((r == ranks_ref).all())}))
"""


def test_sharded_over_four_devices_equals_brute_force():
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu', 'XLA_FLAGS': '--xla_force_host_platform_device_count=4',
         'PYTHONPATH': ROOT + os.pathsep + os.environ.get('PYTHONPATH', '')}
  r = subprocess.run([sys.executable, '-c', SHARDED], cwd=ROOT, env=env, capture_output=True, text=True)
  assert r.returncode == 0, r.stderr[-3000:]
  out = json.loads(r.stdout.strip().splitlines()[-1])
  assert out == {'devices': 4, 'shard_rows': 64, 'topk': True, 'ranks': True}


def _link(src, dst):
  """A file inside the new folder (a hard link, or a copy across file systems)."""
  try:
    os.link(src, dst)
  except OSError:
    shutil.copy2(src, dst)


@pytest.fixture(scope='module')
def pairs96(demo_root, tmp_path_factory):
  """The first 96 demo pairs as a pairs folder (hard links: a symbolic link out of a dataset folder is refused,
  docs/reliability.md), with a module-wide feature cache."""
  root = tmp_path_factory.mktemp('pairs96')
  for side in ('left', 'right'):
    os.makedirs(root / 'pairs' / side)
    for name in sorted(os.listdir(os.path.join(demo_root, side)))[:96]:
      _link(os.path.join(demo_root, side, name), root / 'pairs' / side / name)
  return str(root / 'pairs'), str(root / 'cache')


def test_cli_adapter_ranks_partners_higher(pairs96, lite0, tmp_path):
  from visim_jax.experiments import adapt
  folder, cache = pairs96
  common = dict(k=5, cache_dir=cache, progress=False, verbose=False, sheet_queries=4)
  raw = search.run(folder, ['all'], out=str(tmp_path / 'raw'), **common)
  # train an adapter on half of the pairs (the features come from the cache the CLI just wrote)
  pairs = pairs_lib.load_pairs(folder)  # the CLI's cache entries: tags left/right, names relative to the side
  right, _ = search.features_of(lite0, pairs.right, os.path.join(folder, 'right'), cache, tag='right', progress=False)
  left, _ = search.features_of(lite0, pairs.left, os.path.join(folder, 'left'), cache, tag='left', progress=False)
  names = list(pairs.names)
  assert left.shape == (96, 1776)
  hp = adaptation_runs.Hparams(runs=1, train_fraction=0.5, pca_dim=64, adapt_dim=256, epochs=60, sigmas=(15.0,), lr=1e-3)
  out = adapt.train_all(hp, adaptation_runs.Features(left, right), None, 60, progress=False)
  path = adapter_file.save_adapter(str(tmp_path / 'adapter.npz'), **adapter_file.run_arrays(out, 0),
                             meta=adapter_file.backbone_meta(lite0, demo='first 96 pairs, run 0 train split'))
  adapted = search.run(folder, ['all'], out=str(tmp_path / 'adapted'), adapter=path, **common)

  held_out = out['test_idx'][0]
  rank = lambda summary: np.array([q['partner_rank'] for q in summary['queries']])
  assert [os.path.basename(q['query']) for q in raw['queries']] == names
  print('mean partner rank, held-out pairs: raw', rank(raw)[held_out].mean(), 'adapted',
        rank(adapted)[held_out].mean())
  assert rank(adapted)[held_out].mean() < rank(raw)[held_out].mean()
  assert adapted['metrics']['mean_rank'] < raw['metrics']['mean_rank']
  assert raw['mode'] == 'pairs' and raw['n_index'] == raw['n_queries'] == 96 and raw['adapter'] is None
  assert adapted['similarity'] == 'cosine of adapted features' and adapted['vector_dim'] == 256

  # the outputs: results.json, topk.npz, contact sheets with relative paths that resolve
  wd = tmp_path / 'adapted'
  on_disk = json.load(open(wd / 'results.json'))
  assert on_disk['metrics'] == adapted['metrics'] and len(on_disk['queries'][0]['results']) == 5
  with np.load(wd / 'topk.npz') as z:
    assert z['indices'].shape == (96, 5) and (z['partner_ranks'] == rank(adapted)).all()
  assert (wd / 'sheet.png').stat().st_size > 10000
  page = (wd / 'sheet.html').read_text()
  srcs = [s.split('"')[0] for s in page.split('src="')[1:]]
  assert len(srcs) == 4 * 6 and all(not s.startswith('/') for s in srcs)
  assert all(os.path.exists(os.path.join(wd, s)) for s in srcs)


def test_cli_plain_folder_and_query_files(pairs96, tmp_path):
  folder, cache = pairs96
  plain = tmp_path / 'plain'
  os.makedirs(plain)
  for name in sorted(os.listdir(os.path.join(folder, 'right')))[:12]:
    os.symlink(os.path.join(folder, 'right', name), plain / name)
  files = [str(plain / '00003.png'), os.path.join(folder, 'left', '00003.png')]
  s = search.run(str(plain), files, k=3, out=str(tmp_path / 'q'), cache_dir=cache, progress=False, verbose=False,
                 formats=('html',))
  assert s['mode'] == 'folder' and s['n_queries'] == 2 and s['metrics'] is None and s['n_index'] == 12
  assert '00003.png' not in [r['name'] for r in s['queries'][0]['results']]  # a query in the index is not its own match
  assert s['queries'][1]['results'][0]['name'] == '00003.png'  # the left image finds its partner
  assert (tmp_path / 'q' / 'sheet.html').exists() and not (tmp_path / 'q' / 'sheet.png').exists()
  loo = search.run(str(plain), ['all'], k=20, out=str(tmp_path / 'all'), cache_dir=cache, progress=False,
                   verbose=False, formats=())
  assert loo['n_queries'] == 12 and loo['k'] == 11  # k is capped at the index size minus the query itself
  assert all(q['query'] != r['path'] for q in loo['queries'] for r in q['results'])


def test_an_out_ending_in_png_is_the_sheet_file_and_tilde_is_expanded(pairs96, tmp_path, monkeypatch):
  """Issue 22: README's `--out=sheet.png` made a folder named sheet.png; docs/search.md's `--folder=~/...` was
  refused. A .png out is the sheet; results, top-k and html go beside it under its stem; `~` is the home."""
  folder, cache = pairs96
  monkeypatch.setenv('HOME', str(tmp_path))
  plain = tmp_path / 'photos'
  os.makedirs(plain)
  for name in sorted(os.listdir(os.path.join(folder, 'right')))[:6]:
    os.symlink(os.path.join(folder, 'right', name), plain / name)
  s = search.run('~/photos', ['all'], k=2, out='~/out/sheet.png', cache_dir=cache, progress=False, verbose=False)
  assert s['folder'] == str(plain)
  assert (tmp_path / 'out' / 'sheet.png').is_file() and (tmp_path / 'out' / 'sheet.png').stat().st_size > 1000
  assert sorted(os.listdir(tmp_path / 'out')) == ['sheet.html', 'sheet.json', 'sheet.npz', 'sheet.png']
  assert json.load(open(tmp_path / 'out' / 'sheet.json'))['n_index'] == 6


def test_bad_input_fails_early(pairs96, lite0, tmp_path):
  folder, cache = pairs96
  out = tmp_path / 'out'
  with pytest.raises(UserError, match='--folder: .*nope'):
    search.run(str(tmp_path / 'nope'), ['all'], out=str(out))
  with pytest.raises(UserError, match='--query: .*missing.png'):
    search.run(folder, [str(tmp_path / 'missing.png')], out=str(out), cache_dir=cache, progress=False)
  with pytest.raises(ValueError, match='--k'):
    search.run(folder, ['all'], k=0, out=str(out))
  with pytest.raises(UserError, match='--layers'):
    search.run(folder, ['all'], layers='no_such_stage', out=str(out), cache_dir=cache)
  rng = np.random.RandomState(0)
  meta = dict(adapter_file.backbone_meta(lite0), weights_sha256='0' * 64)
  bad = adapter_file.save_adapter(str(tmp_path / 'bad.npz'), rng.randn(1776), rng.randn(1776, 4), np.ones(4),
                            rng.randn(4, 8), meta=meta)
  with pytest.raises(UserError, match='bad.npz: meta.weights_sha256'):
    search.run(folder, ['all'], adapter=bad, out=str(out), cache_dir=cache)
  assert not out.exists()


def _bad_images(folder):
  """A text file named like an image and a truncated JPEG, in `folder`."""
  (folder / 'aaa_text.png').write_text('not an image')
  buf = __import__('io').BytesIO()
  from PIL import Image
  Image.fromarray(np.random.RandomState(0).randint(0, 255, (64, 64, 3), np.uint8)).save(buf, 'JPEG')
  (folder / 'zzz_cut.jpg').write_bytes(buf.getvalue()[:len(buf.getvalue()) // 2])
  return ['aaa_text.png', 'zzz_cut.jpg']


def test_bad_images_are_skipped_and_listed_or_strict(pairs96, tmp_path, capsys):
  folder, cache = pairs96
  plain = tmp_path / 'plain'
  os.makedirs(plain)
  for name in sorted(os.listdir(os.path.join(folder, 'right')))[:6]:
    os.symlink(os.path.join(folder, 'right', name), plain / name)
  bad = _bad_images(plain)
  s = search.run(str(plain), ['all'], k=3, out=str(tmp_path / 'o'), cache_dir=cache, progress=False, formats=())
  assert s['n_index'] == s['n_queries'] == 6
  assert s['skipped']['count'] == 2 and [os.path.basename(x['path']) for x in s['skipped']['images']] == bad
  assert 'not an image' in s['skipped']['images'][0]['reason']
  assert json.load(open(tmp_path / 'o' / 'results.json'))['skipped'] == s['skipped']
  printed = capsys.readouterr().out
  assert 'skipped 2 image(s)' in printed and 'aaa_text.png (not an image file' in printed  # each with its reason
  assert printed.index('aaa_text.png (') < printed.index(', zzz_cut.jpg (corrupt')
  with pytest.raises(UserError, match='aaa_text.png: not an image'):
    search.run(str(plain), ['all'], k=3, out=str(tmp_path / 's'), cache_dir=cache, progress=False, strict=True)
  assert not (tmp_path / 's' / 'results.json').exists()
  # a pairs folder: a bad right image drops its pair's query (no partner to rank), a bad left image its query
  pairs = tmp_path / 'pairs'
  for side in ('left', 'right'):
    os.makedirs(pairs / side)
    for name in sorted(os.listdir(os.path.join(folder, side)))[:6]:
      _link(os.path.join(folder, side, name), pairs / side / name)
  (pairs / 'right' / '00002.png').unlink()
  (pairs / 'right' / '00002.png').write_text('broken')
  (pairs / 'left' / '00005.png').unlink()
  (pairs / 'left' / '00005.png').write_bytes(b'\x89PNG\r\n\x1a\n')
  p = search.run(str(pairs), ['all'], k=3, out=str(tmp_path / 'p'), cache_dir=cache, progress=False,
                 verbose=False, formats=())
  assert p['n_index'] == 5 and p['n_queries'] == 4 and p['skipped']['count'] == 2
  assert [os.path.basename(q['query']) for q in p['queries']] == ['00001.png', '00003.png', '00004.png', '00006.png']
  assert all(os.path.basename(q['partner']) == os.path.basename(q['query']) for q in p['queries'])


def test_outputs_follow_the_umask(pairs96, lite0, tmp_path):
  folder, cache = pairs96
  old = os.umask(0o022)
  try:
    out = tmp_path / 'u'
    search.run(folder, [os.path.join(folder, 'left', '00001.png')], k=2, out=str(out), cache_dir=cache,
               progress=False, verbose=False)
    path = adapter_file.save_adapter(str(tmp_path / 'a.npz'), np.zeros(3), np.eye(3), np.ones(3), np.eye(3),
                               meta=adapter_file.backbone_meta(lite0))
    os.umask(0o027)
    search.run(folder, [os.path.join(folder, 'left', '00001.png')], k=2, out=str(tmp_path / 'g'), cache_dir=cache,
               progress=False, verbose=False, formats=('html',))
  finally:
    os.umask(old)
  files = ['results.json', 'topk.npz', 'sheet.png', 'sheet.html']
  assert {f: oct(os.stat(out / f).st_mode & 0o777) for f in files} == {f: '0o644' for f in files}
  assert oct(os.stat(path).st_mode & 0o777) == '0o644'
  assert oct(os.stat(tmp_path / 'g' / 'results.json').st_mode & 0o777) == '0o640'
  assert not [f for f in os.listdir(out) if f.startswith('.tmp')]


def _cli(module, *args, env=None):
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu', 'PYTHONPATH': ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''),
         **(env or {})}
  env.pop('VISIM_TRACEBACK', None)
  return subprocess.run([sys.executable, '-m', module, *args], cwd=ROOT, env=env, capture_output=True, text=True)


def test_cli_user_errors_are_one_line(tmp_path):
  r = _cli('visim_jax.search', f'--folder={tmp_path / "nope"}', '--query=all')
  assert r.returncode == 1 and r.stderr.strip().splitlines() == [
      f'error: --folder: {tmp_path / "nope"}: not a folder (give the folder of images to index)']
  r = _cli('visim_jax.search', f'--folder={tmp_path}', '--query=all', '--k=0')
  assert r.returncode == 1 and r.stderr.strip().splitlines() == ['error: --k: must be >= 1, got 0']
  (tmp_path / 'file').write_text('')
  r = _cli('visim_jax.search', f'--folder={tmp_path}', '--query=all', f'--out={tmp_path / "file"}')
  assert r.returncode == 1 and r.stderr.strip().splitlines() == [
      f'error: {tmp_path / "file"}: output folder (--out) is a file, not a folder; choose another path']
  env_home = {'HOME': str(tmp_path)}
  r = _cli('visim_jax.search', '--folder=~/nope', '--query=all', env=env_home)  # `~` after '=': the shell keeps it
  assert r.returncode == 1 and r.stderr.strip().splitlines() == [
      f'error: --folder: {tmp_path / "nope"}: not a folder (give the folder of images to index)']
  r = _cli('visim_jax.export', f'--workdir={tmp_path}')
  assert r.returncode == 1 and r.stderr.strip().splitlines() == [
      f'error: {tmp_path}/checkpoints: no checkpoints folder (was config.checkpoint False? then the experiment '
      'wrote adapter.npz itself)']
  r = _cli('visim_jax.search', f'--folder={tmp_path}', '--query=all', '--bogus=1')
  assert r.returncode == 1 and r.stderr.strip().splitlines() == ["error: Unknown command line flag 'bogus'"]
  r = _cli('visim_jax.classify', str(tmp_path / 'missing.jpg'), '--strict')
  assert r.returncode == 1 and r.stderr.strip().splitlines() == [f'error: {tmp_path / "missing.jpg"}: image file not found']
  assert 'Traceback' not in r.stderr


def test_classify_skips_and_lists_bad_images_or_strict(lite0, tmp_path):
  from visim_jax import classify
  from visim_jax.data import demo
  photos = demo.source_images()
  for name in ('chelsea', 'coffee'):
    photos[name].save(tmp_path / f'{name}.png')
  bad = _bad_images(tmp_path)
  out = classify.classify(lite0, [str(tmp_path)], top=3)
  assert [os.path.basename(r['image']) for r in out['images']] == ['chelsea.png', 'coffee.png']
  assert 'cat' in out['images'][0]['classes'][0]['label'] and len(out['images'][0]['classes']) == 3
  assert out['skipped']['count'] == 2 and [os.path.basename(s['path']) for s in out['skipped']['images']] == bad
  with pytest.raises(UserError, match='aaa_text.png: not an image'):
    classify.classify(lite0, [str(tmp_path)], strict=True)
