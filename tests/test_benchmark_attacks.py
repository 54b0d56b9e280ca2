"""The leaderboard's robustness columns (config.attacks; experiments/benchmark_attacks.py, docs/robustness.md): an
attacked column group per 2AFC protocol and budget, scored as the clean one, read back on a rerun; a model without
a pixel path listed, not scored; bad attack fields refused in one line."""
import os

import numpy as np
import pytest

from test_benchmark import demo_config
from visim_jax import main
from visim_jax.core.errors import UserError
from visim_jax.experiments import benchmark_attacks
from visim_jax.zoo import interface, pixels


@pytest.fixture(scope='module')
def attacked_run(tmp_path_factory, human_demo_sets):
  tmp = tmp_path_factory.mktemp('bench_attacks')
  c = demo_config(tmp, models='lpips:alex', attacks='linf:8/255', attack_steps=3, lpips_size=32)
  c.demo.root = os.path.dirname(human_demo_sets.root)
  work = str(tmp / 'w')
  return c, work, main.run(c, work)


def test_attacked_columns_beside_the_clean_ones(attacked_run):
  c, work, summary = attacked_run
  assert summary['protocols'][:4] == ['nights', 'nights@linf:8/255', 'bapps_2afc', 'bapps_2afc@linf:8/255']
  r = summary['results']['lpips:alex']
  clean, attacked = r['nights']['test'], r['nights@linf:8/255']['test']
  assert attacked['n'] == clean['n'] == 16 and attacked['ci_low'] <= attacked['score'] <= attacked['ci_high']
  assert attacked['score'] < clean['score']          # LPIPS-alex is not robust, even at 3 APGD steps
  assert r['bapps_2afc@linf:8/255']['traditional']['score'] <= r['bapps_2afc']['traditional']['score']
  assert os.path.exists(os.path.join(work, 'records', os.listdir(os.path.join(work, 'records'))[0],
                                     'nights_linf_8_255.json'))
  text = open(os.path.join(work, 'leaderboard.md')).read()
  assert 'nights@linf:8/255 test' in text
  assert main.run(c, work)['computed_cells'] == 0     # read back, (model, protocol) by (model, protocol)


def test_a_model_without_pixels_is_listed_not_scored():
  sim = interface.Similarity('context:w', 'context', lambda p, a, b: a, None, lambda *a: None, {})
  why = pixels.pixel_distance(sim)
  assert isinstance(why, str) and 'not differentiable' in why
  plan = benchmark_attacks.Plan((('linf', 4 / 255, 'linf:4/255'),), steps=1)
  from visim_jax.experiments.benchmark_tasks import Task
  task = Task('nights', 'test', ['a.png'], [], None, triplets=(np.zeros(1, int),) * 3 + (np.ones(1, np.float32),))
  cell = benchmark_attacks.attacked_task(task, plan, 'linf', 4 / 255, 'linf:4/255').score(sim, None, None)['test']
  assert 'not differentiable' in cell['degenerate'] and cell['n'] == 0


def test_labels_and_bad_fields(tmp_path):
  assert benchmark_attacks.label('linf', 4 / 255) == 'linf:4/255'
  assert benchmark_attacks.label('linf', 0.5 / 255) == 'linf:0.5/255'
  assert benchmark_attacks.label('l2', 3.0) == 'l2:3'
  for field, value in (('attacks', 'linf:2'), ('attacks', 'l1:3'), ('attack_method', 'fgsm'), ('attack_steps', 0)):
    with pytest.raises(UserError, match=f'config.{field}'):
      benchmark_attacks.parse(demo_config(tmp_path, **{'attacks': 'linf:4/255', field: value}))
