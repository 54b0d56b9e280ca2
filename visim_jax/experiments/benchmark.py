"""The leaderboard: every model of config.models on every protocol whose data the config gives (wiring only).

  python -m visim_jax.main --config=configs/benchmark.py --workdir=W \
      --config.models=cosine:dinov2_b14,lpips:alex,adapter:workdirs/tll --config.nights_dir=... --config.bapps_dir=...

Models: visim_jax/zoo/similarity.py (the spec grammar). Protocols and their scores: experiments/benchmark_tasks.py.
For each (model, protocol) the scores are written to W/records/<model>/<protocol>.json with the runtime's
fingerprint of what they depend on (the model's weights / files, the protocol's options, the image file list
and the judgements); a rerun reads back every record whose fingerprint matches and computes only the others, so
a killed run resumes (model, protocol) by (model, protocol) and a changed model or dataset is recomputed.
Features are computed once per (model's features, image set): pooled backbone features through features.py's
on-disk cache (shared by cosine:, adapter:, simnet: and context: models of the same backbone), LPIPS reads the
images in batches. Outputs: leaderboard.json (results[model][protocol][subset] = {score, ci_low, ci_high, n}),
leaderboard.md / .csv (models x protocols, the best of each column marked, published numbers beside ours,
visim_jax/metrics/leaderboard.py), plots/leaderboard.png (rank heatmap), config.json; the table is printed at the end.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import time

from tqdm.auto import tqdm

from visim_jax.experiments import checks
from visim_jax.core import ops, report
from visim_jax.backbones import decode_pass
from visim_jax.metrics import leaderboard
from visim_jax.training import runtime
from visim_jax.training import workdir as workdir_lib
from visim_jax.zoo import similarity as sim_lib
from visim_jax.zoo import interface, library as vit_sizes
from visim_jax.core.errors import UserError
from visim_jax.experiments import benchmark_quality
from visim_jax.experiments import benchmark_tasks as tasks_lib
from visim_jax.experiments import benchmark_attacks
from visim_jax.metrics import degenerate

SCORE_FIELDS = ('n_boot', 'ci_level', 'seed')
PROTOCOL_FIELDS = {'nights': ('nights_min_votes',), 'things': ('things_ties',), 'tll': ('ks',), 'classes': ('ks',)}
DATA_FIELDS = ('nights_dir', 'bapps_dir', 'things_dir', 'tll_dir', 'cosis_dir', 'classes_dir',
               *benchmark_quality.QUALITY_FIELDS)


def validate_config(config) -> list[str]:
  """The model specs (form checked, nothing loaded); every field's type and range checked (checks.py), naming it."""
  for f in ('models', 'nights_splits', 'bapps_sets', 'bapps_jnd_sets', 'things_triplets', 'things_names',
            'tll_subset', 'cosis_image_dir', 'cache_dir', 'demo.root') + DATA_FIELDS:
    checks.text(config, f)
  specs = interface.split_specs(config.models)
  checks.integer(config, 'n_boot', 0, 100_000, note=' (0: no intervals)')
  checks.fraction(config, 'ci_level')
  degenerate.check_n_boot(config.n_boot, 'config.n_boot', 1 - config.ci_level)
  checks.integer(config, 'pair_batch_size', 1, 1 << 20)
  checks.integer(config, 'image_batch_size', 1, 1 << 16)
  checks.integer(config, 'lpips_size', 0, 4096, note=' (0: the native size)')
  checks.integer(config, 'image_size', 0, 4096, note=" (0: each model's own; ViT towers: 16..4096)")
  checks.integer(config, 'nights_min_votes', 0, 1000, note=" (DreamSim's 6)")
  checks.seed(config)
  checks.seed(config, 'demo.seed')
  checks.numbers(config, 'ks', 1, 2**31 - 1, integer=True, example='(1, 5, 20)')
  for f in ('plots', 'bapps_2afc', 'bapps_jnd', 'demo.quality'):
    checks.flag(config, f)
  checks.choice(config, 'dtype', ('float32', 'bfloat16'))
  checks.choice(config, 'things_ties', ('le', 'lt', 'split'))
  checks.choice(config, 'things_form', ('auto', 'dreamsim', 'osf', 'index0'))
  for f in DATA_FIELDS + ('cosis_image_dir',):
    checks.input_path(config, f, 'dir')
  for f in ('things_triplets', 'things_names', 'tll_subset'):
    checks.input_path(config, f)
  for f, parent in (('things_triplets', 'things_dir'), ('things_names', 'things_dir'), ('tll_subset', 'tll_dir'),
                    ('cosis_image_dir', 'cosis_dir')):
    if not config[parent] and not (config.dataset == 'demo' and parent == 'things_dir'):
      checks.unused(config, [f], f'without config.{parent}')
  checks.choice(config, 'dataset', ('folders', 'demo'))
  checks.choice(config, 'rank_test', ('bootstrap', 'sign', 'none'))   # metrics/paired.py (docs/metrics.md)
  checks.flag(config, 'twoafc_loglik')
  checks.fraction(config, 'loglik_bandwidth')
  benchmark_attacks.parse(config)   # config.attacks and its fields
  if config.dataset != 'demo' and not any(config[f] for f in DATA_FIELDS):
    raise UserError(f'config.nights_dir: no data given: set at least one of {", ".join(DATA_FIELDS)} (or run '
                    '--config=configs/benchmark.py:demo)')
  return specs


def slug(spec: str) -> str:
  """A folder name for a model spec (readable, unique through a short hash of the spec)."""
  base = re.sub(r'[^A-Za-z0-9._-]+', '_', spec).strip('_')[-60:]
  return f'{base}-{hashlib.sha256(spec.encode()).hexdigest()[:6]}'


def _record_path(workdir, spec, protocol):
  name = re.sub(r'[^A-Za-z0-9._-]+', '_', protocol)   # an attacked protocol: nights@linf:4/255
  return os.path.join(workdir, 'records', slug(spec), f'{name}.json')


def finished(path: str, fp: runtime.Fingerprint) -> dict | None:
  """The record's results when it was written under this fingerprint (else None: compute them)."""
  try:
    with open(path) as f:
      rec = json.load(f)
  except (OSError, ValueError):
    return None
  return rec.get('results') if rec.get('fingerprint', {}).get('fingerprint') == fp.digest else None


def fingerprint(sim, protocol: str, tasks, config) -> runtime.Fingerprint:
  from visim_jax.backbones import features
  recorded = {'model': sim.spec, 'identity': sim.identity, 'protocol': protocol,
              'subsets': [t.subset for t in tasks], **{f: config[f] for f in SCORE_FIELDS},
              'image_lists': [features.file_list_hash(t.paths) for t in tasks]}
  if sim.preprocess is None:
    recorded['lpips_size'] = config.lpips_size
  recorded.update({f: config[f] for f in PROTOCOL_FIELDS.get(protocol.partition('@')[0], ())})
  if '@' in protocol:   # the robustness columns (experiments/benchmark_attacks.py)
    recorded.update({f: config[f] for f in benchmark_attacks.FIELDS})
  recorded['items'] = 1   # cells carry their per-item data (paired tests): records written before are recomputed
  return runtime.fingerprint(recorded, [a for t in tasks for a in t.arrays])


DISTS_LEFT_OUT = ('dists: left out of the demo: its learned weights are not on this machine (run `python -m '
                  'visim_jax.fetch dists` once, 20 kB; the demo then ranks it too)')


def dists_here() -> bool:
  """DISTS's alpha / beta can be read offline here (fetched, or the installed DISTS_pytorch)."""
  from visim_jax.models import dists as dists_lib
  return dists_lib.default_weights() is not None


def with_demo(config):
  """dataset='demo': the mini human-judgement folders (written once) for every protocol folder left empty."""
  if config.dataset != 'demo':
    return config
  from visim_jax.backbones import features
  from visim_jax.data import human_demo
  d = human_demo.demo_sets(config.demo.root or None, config.demo.seed, features.cache_dir(config.cache_dir))
  runtime.say(human_demo.DEMO_NOTE)
  config = config.copy_and_resolve_references()
  with config.unlocked():
    specs = interface.split_specs(config.models)
    if 'dists' in specs and not dists_here():   # the demo runs offline: DISTS joins once its 20 kB are fetched
      config.models = ','.join(s for s in specs if s != 'dists')
      runtime.say(DISTS_LEFT_OUT)
    if not config.nights_dir:
      config.nights_dir = d.nights
    if not config.bapps_dir:
      config.bapps_dir = d.bapps
    if config.demo.get('quality', False) and not config.get('kadid_dir'):   # the mini KADID-10k (its TID2013,
      from visim_jax.data import quality_demo                               # PIPAL and LIVE twins hold the same
      config.kadid_dir = quality_demo.quality_demo(                         # images: not scored twice)
          config.demo.root or None, config.demo.seed, features.cache_dir(config.cache_dir))['kadid']
    if not config.things_dir:  # the demo's triplet list only where the user gave none (never replaced)
      config.things_dir = d.things
      config.things_triplets = config.things_triplets or d.things_dreamsim
  return config


def human_demo_note(config) -> str:
  """data/human_demo.DEMO_NOTE when the demo sets fill a protocol folder (dataset='demo'), else ''."""
  if config.dataset != 'demo':
    return ''
  from visim_jax.data import human_demo, quality_demo
  return human_demo.DEMO_NOTE + ('; ' + quality_demo.QUALITY_DEMO_NOTE if config.demo.get('quality', False) else '')


def run(config, workdir: str, progress: bool = True) -> dict:
  config = with_demo(config)
  specs = validate_config(config)
  t0 = time.time()
  protocols = benchmark_attacks.add(tasks_lib.protocols(config),   # every file checked, nothing decoded
                                    benchmark_attacks.parse(config))
  protocols.update(benchmark_quality.protocols(config))   # KADID-10k, ...: SRCC / KRCC / PLCC against MOS
  from visim_jax.backbones import features
  opts = interface.Options(features.check_cache_dir(config.cache_dir), config.image_batch_size, config.dtype, progress)
  models = {s: sim_lib.build(s, opts) for s in specs}   # weights and files read now: a bad entry fails here
  models = vit_sizes.at_image_size_all(models, config.image_size, opts, 'config.image_size', runtime.say)   # ViTs
  ops.check_writable_dir(workdir, 'workdir')
  decode_pass.check([p for ts in protocols.values() for t in ts for p in t.paths], opts.cache_dir)
  record = workdir_lib.Record(workdir, config, None)  # config.json: written with the first result, not before
  try:
    return _cells(config, workdir, specs, protocols, models, record, progress, t0)
  except BaseException:
    record.put_back()
    raise


def _cells(config, workdir, specs, protocols, models, record, progress, t0) -> dict:
  sopts = tasks_lib.ScoreOptions(config.n_boot, 1 - config.ci_level, config.seed, config.pair_batch_size,
                                 tuple(int(k) for k in config.ks), config.things_ties, progress)
  results, timing, computed = {s: {} for s in specs}, {}, 0
  memo = {}
  jobs = [(s, p) for s in specs for p in protocols]
  runtime.say(f'benchmark: {len(specs)} model(s) x {len(protocols)} protocol(s) ({", ".join(protocols)}) -> '
              f'{workdir}')
  bar = tqdm(jobs, desc='leaderboard', unit='cell', disable=not progress)
  for spec, protocol in bar:
    bar.set_postfix_str(f'{spec} / {protocol}')
    sim, tasks = models[spec], protocols[protocol]
    fp = fingerprint(sim, protocol, tasks, config)
    path = _record_path(workdir, spec, protocol)
    res = finished(path, fp)
    if res is None:
      t1 = time.time()
      res = {}
      for task in tasks:
        key = None
        if not (task.native and sim.preprocess is None):   # else: the task reads the pairs at native sizes
          pre = sim.preprocess or tasks_lib.protocol_preprocess(task, config.lpips_size)
          key = (sim.feature_key, pre.describe().__repr__(), tuple(task.paths))
          if key not in memo:
            memo[key] = sim.featurize(task.paths, f'{protocol}-{task.subset}', pre)
        try:
          res.update(task.score(sim, memo.get(key), sopts))
        except UserError as e:   # a metric that does not apply to these images (MS-SSIM below 161 px): not scored
          if sim.kind not in interface.METRIC_KINDS:
            raise
          res[task.subset] = degenerate.result(f'not applicable: {e}', 0)
      timing[f'{spec} / {protocol}'] = time.time() - t1
      computed += 1
      record.write()
      record.kept = True
      if report.is_writer():
        report.write_json(path, {'model': spec, 'protocol': protocol, 'fingerprint': fp.record(),
                                 'results': res, 'timing_s': timing[f'{spec} / {protocol}']})
    results[spec][protocol] = res
  bar.close()
  board = leaderboard.build(results, specs, list(protocols), leaderboard.RankOptions(
      config.rank_test, 1 - config.ci_level, config.n_boot or 1000, config.seed, config.twoafc_loglik,
      config.loglik_bandwidth))
  summary = {'experiment': 'benchmark', 'models': specs, 'protocols': list(protocols),
             'results': leaderboard.without_items(results), 'rank_test': config.rank_test,
             'identities': {s: models[s].identity for s in specs}, 'computed_cells': computed,
             'read_back_cells': len(jobs) - computed, 'timing_s': {'total': time.time() - t0, 'cells': timing},
             'ci': f'{100 * config.ci_level:g}% percentile bootstrap ({config.n_boot} resamples)'}
  note = human_demo_note(config)   # every file a demo set produces says so (issue 33)
  if note:
    summary['data_note'] = note
  record.write()
  if report.is_writer():
    report.write_json(os.path.join(workdir, 'leaderboard.json'), summary)
    text = leaderboard.write(workdir, board, note)
    if config.plots:
      from visim_jax.plots import benchmark as plots
      plots.rank_heatmap(board, os.path.join(workdir, 'plots', 'leaderboard.png'), note)
    runtime.say(f'\nleaderboard ({computed} computed, {len(jobs) - computed} read back) in '
                f'{os.path.join(workdir, "leaderboard.md")}\n\n{text}')
  return summary
