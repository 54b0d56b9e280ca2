"""Published scores of the classical metrics beside ours (issue 35 item 4): paper_data/human_judgements.csv's rows
parse and name real subsets / specs, the LPIPS paper's Table 5 rows add up to the paper's own averages, and the
leaderboard puts them beside our `l2:lab` / `ssim:lpips_lab` rows (not beside the RGB `l2` / `ssim`)."""
import csv

import pytest

from visim_jax.data import bapps
from visim_jax.data import paper_data
from visim_jax.metrics import leaderboard
from visim_jax.zoo import similarity

SUBSETS = {'bapps_2afc': set(bapps.TWOAFC_SETS['val']), 'bapps_jnd': set(bapps.JND_SETS),
           'nights': {'val', 'test'}, 'nights@linf:4/255': {'test'}, 'nights@l2:3': {'test'},   # robustness
           **{q: {'SRCC', 'KRCC'} for q in ('csiq', 'live', 'tid2013')},   # pyiqa's FR table (its PLCC: linear)
           'kadid': {'SRCC'}, 'pipal': {'SRCC'}}                             # piq's README (SRCC only)
TABLE5 = 'arXiv:1801.03924v2 appendix A Table 5'


def rows():
  return paper_data.human_judgements()


def test_every_row_parses():
  seen = set()
  for r in rows():
    assert set(r) == {'protocol', 'subset', 'model', 'spec', 'score', 'source'}
    assert r['protocol'] in SUBSETS and r['subset'] in SUBSETS[r['protocol']], r
    assert 0.0 <= r['score'] <= 1.0 and r['model'] and r['source'], r
    key = (r['protocol'], r['subset'], r['model'])
    assert key not in seen, key
    seen.add(key)


@pytest.mark.parametrize('spec', sorted({r['spec'] for r in paper_data.human_judgements()
                                          if r['spec'] and not r['spec'].startswith('cosine:dreamsim')}))
def test_specs_are_models_of_the_zoo(spec):
  if spec == 'dists':
    from visim_jax.experiments import benchmark
    if not benchmark.dists_here():
      pytest.skip('DISTS weights not on this machine (python -m visim_jax.fetch dists)')
  assert similarity.build(spec).spec == spec      # classical metrics: no weights read, a bad spec raises


def table5():
  out = {}
  for r in rows():
    if TABLE5 in r['source']:
      out.setdefault(r['model'], {})[r['subset']] = r['score']
  return out


def test_table5_rows_add_up_to_the_papers_averages():
  """Transcription check: Table 5 also prints each row's mean over the two distortion sets and over the four
  real-algorithm sets (read in the same table; they round the unrounded scores, hence 1e-3)."""
  printed = {'L2': (0.689, 0.603), 'SSIM': (0.697, 0.598), 'FSIMc': (0.700, 0.606), 'HDR-VDP': (0.671, 0.585),
             'LPIPS Alex - lin': (0.787, 0.653), 'LPIPS VGG - lin': (0.794, 0.641), 'Human (oracle)': (0.826, 0.695)}
  t = table5()
  assert set(t) == set(printed)
  for model, (distortions, real) in printed.items():
    s = t[model]
    assert set(s) == SUBSETS['bapps_2afc'], model
    assert abs((s['traditional'] + s['cnn']) / 2 - distortions) <= 1e-3 + 1e-9, model
    total = 0.0
    for sub in ('superres', 'deblur', 'color', 'frameinterp'):
      total += s[sub]
    assert abs(total / 4 - real) <= 1e-3 + 1e-9, model
  specs = {r['model']: r['spec'] for r in rows() if TABLE5 in r['source']}
  assert specs['L2'] == 'l2:lab' and specs['SSIM'] == 'ssim:lpips_lab'      # the authors' code: Lab by default
  assert {specs[m] for m in printed if m not in ('L2', 'SSIM')} == {''}    # not ours: listed, never beside ours


def cell(s):
  return {'score': s, 'ci_low': s - 0.05, 'ci_high': s + 0.05, 'n': 20}


def test_leaderboard_shows_the_papers_l2_and_ssim_beside_ours(tmp_path):
  results = {m: {'bapps_2afc': {'traditional': cell(v), 'superres': cell(v - 0.05)}}
             for m, v in (('l2:lab', 0.61), ('ssim:lpips_lab', 0.62), ('l2', 0.6), ('ssim', 0.63))}
  board = leaderboard.build(results, list(results), ['bapps_2afc'], leaderboard.RankOptions(test='none'))
  leaderboard.write(str(tmp_path), board)
  md = (tmp_path / 'leaderboard.md').read_text()
  line = {m: next(x for x in md.splitlines() if x.startswith(f'| `{m}` |')) for m in results}
  t = table5()
  for m, paper in (('l2:lab', 'L2'), ('ssim:lpips_lab', 'SSIM')):
    for sub in ('traditional', 'superres'):
      assert f"(published {t[paper][sub]:.3f})" in line[m], (m, sub)
  assert '(published 0.599)' in line['l2:lab'] and '(published 0.603)' in line['ssim:lpips_lab']   # Table 5
  assert 'published' not in line['l2'] and 'published' not in line['ssim']   # RGB variants: another quantity
  listed = md.split('Published on the same columns')[1]
  assert '| FSIMc | bapps_2afc traditional | 0.614 |' in listed and '| L2 |' not in listed
  got = list(csv.DictReader(open(tmp_path / 'leaderboard.csv')))
  by = {r['model']: r for r in got}
  assert float(by['l2:lab']['bapps_2afc/superres published']) == t['L2']['superres']
  assert by['l2']['bapps_2afc/superres published'] == ''


PYIQA = "pyiqa tests/FR_benchmark_results.csv (chaofengc/IQA-PyTorch@f49e31f; docs/benchmark.rst 'FR benchmark')"


def test_pyiqa_quality_rows_sit_beside_ours(tmp_path):
  """pyiqa's FR table (SRCC / KRCC; its PLCC is linear, ours after the logistic: not stored): a few transcription
  spot checks against the table as published, and the rows print beside our psnr / fsim quality cells only."""
  got = {(r['protocol'], r['subset'], r['model']): r for r in rows() if r['source'] == PYIQA}
  assert len(got) == 8 * 3 * 2
  for key, score in ((('csiq', 'SRCC', 'pyiqa psnr'), 0.8087), (('live', 'KRCC', 'pyiqa fsim'), 0.8366),
                     (('tid2013', 'SRCC', 'pyiqa dists'), 0.7077), (('csiq', 'KRCC', 'pyiqa vif'), 0.7532)):
    assert got[key]['score'] == score, key
  assert {r['spec'] for r in got.values()} == {'psnr', 'fsim', 'lpips:alex', 'lpips:vgg', 'dists', ''}
  results = {m: {'csiq': {'SRCC': cell(v), 'KRCC': cell(v - 0.2)}} for m, v in (('psnr', 0.8), ('ssim', 0.85))}
  board = leaderboard.build(results, list(results), ['csiq'], leaderboard.RankOptions(test='none'))
  leaderboard.write(str(tmp_path), board)
  md = (tmp_path / 'leaderboard.md').read_text()
  line = {m: next(x for x in md.splitlines() if x.startswith(f'| `{m}` |')) for m in results}
  assert '(published 0.809)' in line['psnr'] and '(published 0.599)' in line['psnr']
  assert 'published' not in line['ssim']        # pyiqa's SSIM is on the Y channel: another quantity
  assert '| pyiqa ssim | csiq SRCC | 0.837 |' in md.split('Published on the same columns')[1]


PIQ = "piq README.rst 'Benchmark' FR table (photosynthesis-team/piq@9948a52)"


def test_piq_readme_rows_sit_beside_the_ten_metrics(tmp_path):
  """piq's README SRCC table: its PIQ column is piq's own code (= our default variants, tests/test_metrics_iqa.py), so
  those rows print beside ours; its Reference column (the metrics' papers and surveys) is listed under the table."""
  got = {(r['protocol'], r['model']): r for r in rows() if r['source'].startswith(PIQ)}
  assert {r['subset'] for r in got.values()} == {'SRCC'} and len(got) == 16 * 3 + 31
  for key, score, spec in ((('kadid', 'piq HaarPSI'), 0.89, 'haarpsi'), (('pipal', 'piq DSS'), 0.63, 'dss'),
                           (('tid2013', 'piq MS-GMSDc'), 0.89, 'ms_gmsd:chromatic'),
                           (('tid2013', 'VSI as reported by the Eval2019 survey (IEEE 8847307)'), 0.90, '')):
    assert (got[key]['score'], got[key]['spec']) == (score, spec), key
  results = {m: {'kadid': {'SRCC': cell(v)}} for m, v in (('haarpsi', 0.7), ('vsi', 0.6))}
  board = leaderboard.build(results, list(results), ['kadid'], leaderboard.RankOptions(test='none'))
  leaderboard.write(str(tmp_path), board)
  md = (tmp_path / 'leaderboard.md').read_text()
  assert '(published 0.890)' in next(x for x in md.splitlines() if x.startswith('| `haarpsi` |'))
  assert '| HaarPSI as reported by the KADID-10k paper | kadid SRCC | 0.890 |' in md
