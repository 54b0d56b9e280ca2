"""The image-quality protocol (issue 47): SRCC / KRCC / PLCC against plain-loop versions, the five-parameter
logistic, the paired 'corr' test, the loaders' gates (bad rows, missing files, paths out of the folder: one line
each; CSIQ's .xlsx read with the standard library, PieAPP as a quality and a 2AFC set) and the leaderboard end to end
on the mini sets of data/quality_demo.py (built once per module, copied per test)."""
import json
import os
import shutil

import numpy as np
import pytest

from visim_jax.core.errors import UserError
from visim_jax.data import quality as quality_data
from visim_jax.data import quality_demo
from visim_jax.metrics import paired, quality


def _ranks(v):
  """Average ranks by a plain loop (1-based)."""
  return np.array([sum(w < x for w in v) + (sum(w == x for w in v) + 1) / 2 for x in v])


def test_correlations_against_plain_loops():
  rng = np.random.default_rng(0)
  mos = rng.uniform(1, 5, 60)
  q = np.round(-np.exp(-mos) + rng.normal(0, 0.05, 60), 2)          # monotone in mos, with ties
  r, m = _ranks(q), _ranks(mos)
  want = np.corrcoef(r, m)[0, 1]
  assert quality.srcc(q, mos) == pytest.approx(want, abs=1e-12)
  assert float(quality.srcc_batched(q.astype(np.float32), mos.astype(np.float32))) == pytest.approx(want, abs=1e-5)
  n = len(q)
  pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
  s = [np.sign(q[i] - q[j]) * np.sign(mos[i] - mos[j]) for i, j in pairs]
  t_q = sum(q[i] == q[j] for i, j in pairs)
  tau_b = sum(s) / np.sqrt((len(pairs) - t_q) * len(pairs))      # mos has no ties
  assert quality.krcc(q, mos) == pytest.approx(tau_b, abs=1e-12)
  f, ok = quality.fit_logistic(q, mos)
  assert ok and np.corrcoef(f, mos)[0, 1] > np.corrcoef(q, mos)[0, 1]   # the logistic straightens the curve
  b = (3.0, 2.0, 0.5, 0.1, 1.0)
  x = np.linspace(-2, 3, 7)
  want = [b[0] * (0.5 - 1 / (1 + np.exp(b[1] * (v - b[2])))) + b[3] * v + b[4] for v in x]
  np.testing.assert_allclose(quality.logistic5(x, *b), want)
  cells = quality.intervals(q, mos, n_resamples=100, seed=1)
  for stat in quality.STATS:
    c = cells[stat]
    assert c['ci_low'] <= c['score'] <= c['ci_high'] and c['n'] == n
  assert cells['srcc']['score'] == pytest.approx(quality.srcc(q, mos))


def test_paired_corr_items():
  rng = np.random.default_rng(1)
  mos = rng.uniform(1, 5, 80)
  good, bad = mos + rng.normal(0, 0.2, 80), mos + rng.normal(0, 3.0, 80)
  item = lambda q, stat: {'kind': 'corr', 'stat': stat, 'q': q.tolist(), 'mos': mos.tolist()}  # noqa: E731
  for stat in quality.STATS:
    r = paired.compare_pair(item(good, stat), item(bad, stat), n_boot=200)
    assert r['diff'] > 0 and r['p'] < 0.05, stat
    assert paired.compare_pair(item(good, stat), item(good, stat), n_boot=50)['p'] > 0.5   # never separated


@pytest.fixture(scope='module')
def built(tmp_path_factory):
  return quality_demo.quality_demo(str(tmp_path_factory.mktemp('quality_demo')))


def _copy(built, tmp_path) -> dict:
  """A private copy of the mini sets (tests edit files)."""
  root = os.path.dirname(built['kadid'])
  shutil.copytree(root, tmp_path / 'demo')
  return {k: str(tmp_path / 'demo' / os.path.basename(v)) for k, v in built.items()}


def _write_kadid(root, rows, images=('I01.png', 'I01_01_01.png')):
  os.makedirs(os.path.join(root, 'images'), exist_ok=True)
  for name in images:
    open(os.path.join(root, 'images', name), 'wb').close()
  with open(os.path.join(root, 'dmos.csv'), 'w') as f:
    f.write('dist_img,ref_img,dmos,var\n' + ''.join(r + '\n' for r in rows))
  return str(root)


def test_kadid_gate(tmp_path):
  ok = _write_kadid(tmp_path / 'a', ['I01_01_01.png,I01.png,4.57,0.49'])
  s = quality_data.load_kadid(ok)
  assert len(s) == 1 and s.mos.tolist() == [4.57] and s.higher_is_better and s.refs[0].endswith('images/I01.png')
  cases = {'b': (['I01_01_01.png,I01.png,high,0.4'], "line 2: column 'dmos' is not a number"),
           'c': (['I01_01_01.png,I01.png'], 'line 2'),
           'd': (['../x.png,I01.png,4.0,0.4'], 'leads outside'),
           'e': (['I01_01_02.png,I01.png,4.0,0.4'], 'I01_01_02.png: KADID-10k image not found')}
  for name, (rows, msg) in cases.items():
    with pytest.raises(UserError, match=msg):
      quality_data.load_kadid(_write_kadid(tmp_path / name, rows))
  with pytest.raises(UserError, match='dmos.csv not found'):
    quality_data.load_kadid(str(tmp_path / 'none'))


def test_tid2013_pipal_live_gates(built, tmp_path):
  sets = _copy(built, tmp_path)
  tid, pipal = quality_data.load_tid2013(sets['tid2013']), quality_data.load_pipal(sets['pipal'])
  kadid = quality_data.load_kadid(sets['kadid'])
  np.testing.assert_allclose(tid.mos, (kadid.mos - 1) * 9 / 4, atol=2e-4)   # the same opinions (rounded)
  np.testing.assert_allclose(pipal.mos, 1000 + 250 * kadid.mos, atol=0.02)
  assert tid.refs[0].endswith('reference_images/I01.BMP') and pipal.refs[0].endswith('Train_Ref/A0001.bmp')
  with open(os.path.join(sets['tid2013'], 'mos_with_names.txt'), 'a') as f:
    f.write('4.5 i09_01_1.bmp\n')
  with pytest.raises(UserError, match=r'mos_with_names.txt:line 65: no reference image I09.BMP'):
    quality_data.load_tid2013(sets['tid2013'])
  live = quality_data.load_live(sets['live'])
  np.testing.assert_allclose(np.sort(live.mos), np.sort(-(5 - kadid.mos) * 20), atol=0.01)   # negated; no orgs rows
  assert not live.higher_is_better and live.refs[0].endswith('refimgs/ref1.bmp')
  os.remove(os.path.join(sets['live'], 'jp2k', 'img17.bmp'))            # the folder's reference row (orgs = 1)
  with pytest.raises(UserError, match='67 images in the five folders but 68 DMOS values'):
    quality_data.load_live(sets['live'])
  with open(os.path.join(sets['pipal'], 'Train_Label', 'A0001.txt'), 'a') as f:
    f.write('A0001_01_01.bmp;1500\n')
  with pytest.raises(UserError, match=r'A0001.txt:line 17: expected "<distorted image>,<Elo score>"'):
    quality_data.load_pipal(sets['pipal'])


def test_csiq_pieapp_gates(built, tmp_path):
  """CSIQ's workbook (a title row above the header, shared strings, numbers) and PieAPP's label files hold the same
  opinions as the mini KADID-10k; bad rows and missing files: one line naming the file."""
  from visim_jax.core import readers
  sets = _copy(built, tmp_path)
  kadid = quality_data.load_kadid(sets['kadid'])
  csiq = quality_data.load_csiq(sets['csiq'])
  np.testing.assert_allclose(np.sort(csiq.mos), np.sort(-(5 - kadid.mos) / 4), atol=3e-5)   # negated; KADID rounded
  assert not csiq.higher_is_better and csiq.dists[0].endswith('dst_imgs/blur/img1.BLUR.1.png')
  assert csiq.refs[0].endswith('src_imgs/img1.png')
  pie = quality_data.load_pieapp(sets['pieapp'])
  np.testing.assert_allclose(np.sort(pie.mos), np.sort(-(5 - kadid.mos)), atol=1e-4)   # the reference rows left out
  pairs = quality_data.load_pieapp_2afc(sets['pieapp'])
  assert len(pairs) == 4 * 16 and pairs.p0[0].endswith('reference_images/test/ref_0001.png')
  assert pairs.p1[0].endswith('distorted_images/test/ref_0001/distort_0001_blur_inter_1.png')
  labels = os.path.join(sets['pieapp'], 'labels', 'test', 'ref_0001_pairwise_labels.csv')
  second = open(labels).read().splitlines()[2].split(',')                    # the file's P(A closer) -> judge
  assert pairs.judge[1] == pytest.approx(1 - float(second[3]), abs=1e-6)
  # the .xlsx reader against the table written (a plain-loop check of every cell)
  from visim_jax.data.quality_demo import write_xlsx
  table = [['title'], ['image', 'n', 'x'], ['a&b', 3, 0.25], ['1600', 1600, -2.5e-07]]
  write_xlsx(str(tmp_path / 't.xlsx'), 'all_by_image', table)
  name, rows = readers.xlsx_rows(str(tmp_path / 't.xlsx'))
  assert name == 'all_by_image' and [r for _, r in rows] == [[str(v) for v in row] for row in table]
  with pytest.raises(UserError, match="t.xlsx: CSIQ DMOS workbook has no sheet 'x'"):
    readers.xlsx_rows(str(tmp_path / 't.xlsx'), 'x', 'CSIQ DMOS workbook')
  xlsx = os.path.join(sets['csiq'], 'csiq.DMOS.xlsx')
  (tmp_path / 'bad.xlsx').write_text('image,dmos\n')
  with pytest.raises(UserError, match='bad.xlsx: not a readable .xlsx'):
    readers.xlsx_rows(str(tmp_path / 'bad.xlsx'))
  os.remove(os.path.join(sets['csiq'], 'dst_imgs', 'awgn', 'img2.AWGN.3.png'))
  with pytest.raises(UserError, match=r'csiq.DMOS.xlsx:sheet all_by_image row \d+: .*img2.AWGN.3.png: CSIQ image not'):
    quality_data.load_csiq(sets['csiq'])
  write_xlsx(xlsx, 'all_by_image', [['image', 'dst_idx', 'dst_type', 'dst_lev', 'dmos'], ['img1', 7, 'x', 1, 0.2]])
  with pytest.raises(UserError, match=r'row 2: .*dst_idx'):
    quality_data.load_csiq(sets['csiq'])
  with open(labels, 'a') as f:
    f.write('ref_0001.png,distort_0001_blur_inter_1.png,distort_0001_blur_inter_2.png,1.5\n')
  with pytest.raises(UserError, match=r'ref_0001_pairwise_labels.csv:line 18: .*not in \[0, 1\]'):
    quality_data.load_pieapp_2afc(sets['pieapp'])
  with open(labels, 'a') as f:
    f.write('ref_0001.png,../../x.png,distort_0001_blur_inter_2.png\n')
  scores = os.path.join(sets['pieapp'], 'labels', 'test', 'ref_0002_per_image_score.csv')
  with open(scores, 'a') as f:
    f.write('ref_0002.png,distort_0002_blur_inter_9.png,1.0\n')
  with pytest.raises(UserError, match='distort_0002_blur_inter_9.png: PieAPP image not found'):
    quality_data.load_pieapp(sets['pieapp'])


def test_leaderboard_on_the_mini_sets(built, tmp_path):
  """configs/benchmark.py with the six quality folders: SRCC / KRCC / PLCC columns with intervals and ranks (and
  PieAPP's 2AFC column group); the demo sets in the published layouts; a rerun reads the cells back."""
  from visim_jax import main
  from test_benchmark import demo_config
  sets = built
  assert sorted(os.listdir(sets['kadid'])) == ['dmos.csv', 'images'] and len(quality_data.load_kadid(sets['kadid'])) == 64
  c = demo_config(tmp_path, 'local', models='gmsd,psnr', kadid_dir=sets['kadid'], tid2013_dir=sets['tid2013'],
                  pipal_dir=sets['pipal'], live_dir=sets['live'], csiq_dir=sets['csiq'], pieapp_dir=sets['pieapp'],
                  dataset='folders')
  work = str(tmp_path / 'w')
  summary = main.run(c, work)
  assert summary['protocols'] == ['kadid', 'tid2013', 'pipal', 'live', 'csiq', 'pieapp', 'pieapp_2afc']
  for spec in ('gmsd', 'psnr'):
    cell = summary['results'][spec]['pieapp_2afc']['test']
    assert cell['n'] == 64 and 0.6 < cell['score'] <= 1.0
    for protocol in ('kadid', 'tid2013', 'pipal', 'live', 'csiq', 'pieapp'):
      cells = summary['results'][spec][protocol]
      assert set(cells) == {'SRCC', 'KRCC', 'PLCC'}
      for cell in cells.values():
        assert cell['ci_low'] <= cell['score'] <= cell['ci_high'] and cell['n'] == 64 and cell['score'] > 0.2
    # the same images and monotone transforms of the same opinions: nearly the same rank correlations
    assert summary['results'][spec]['tid2013']['SRCC']['score'] == pytest.approx(
        summary["results"][spec]["kadid"]["SRCC"]["score"], abs=0.01)   # the scores were rounded apart
  assert 'kadid SRCC' in open(os.path.join(work, 'leaderboard.md')).read()
  with open(os.path.join(work, 'records', os.listdir(os.path.join(work, 'records'))[0], 'kadid.json')) as f:
    assert json.load(f)['results']['SRCC']['items']['kind'] == 'corr'
  assert main.run(c, work)['computed_cells'] == 0
