"""visim_jax/metrics/leaderboard.py: columns, best per column (ties all marked), ranks, published numbers beside ours."""
import csv
import os

import numpy as np

from visim_jax.metrics import leaderboard


def cell(s, n=10):
  return {'score': s, 'ci_low': s - 0.1, 'ci_high': min(1.0, s + 0.1), 'n': n}


def test_best_ranks_and_published(tmp_path):
  results = {'cosine:dreamsim_ensemble': {'nights': {'test': cell(0.95)}, 'bapps_2afc': {'cnn': cell(0.8)}},
             'lpips:alex': {'nights': {'test': cell(0.7)}, 'bapps_2afc': {'cnn': cell(0.8), 'color': cell(0.6)}}}
  models = list(results)
  b = leaderboard.build(results, models, ['nights', 'bapps_2afc'])
  assert b.columns == [('nights', 'test'), ('bapps_2afc', 'cnn'), ('bapps_2afc', 'color')]
  np.testing.assert_array_equal(b.ranks, [[1, 1, np.nan], [2, 1, 1]])       # a tie: both rank 1
  md = leaderboard.write(str(tmp_path), b)
  full = open(tmp_path / 'leaderboard.md').read()
  assert '**0.950 [0.850, 1.000]** (published 0.962)' in full             # the DreamSim README's test number
  assert '| `lpips:alex` | 0.700 [0.600, 0.800] | **0.800' in full and md.split('\n')[2].endswith('| - |')
  assert 'DreamSim dino_vitb16' in full and 'DreamSim dino_vitb16' not in md   # other published rows: file only
  rows = list(csv.reader(open(tmp_path / 'leaderboard.csv')))
  head = rows[0]
  assert rows[1][head.index('nights/test published')] == '0.962' and rows[1][head.index('bapps_2afc/color')] == ''
  assert rows[2][head.index('bapps_2afc/cnn best')] == rows[1][head.index('bapps_2afc/cnn best')] == '1'
