"""Paper 001's Table 1 in one command: every backbone through the adaptation experiment, then one table.

  python -m visim_jax.main --config=configs/table1.py --workdir=W --config.data_dir=TLL --config.subset=TLL_obj.csv

For each entry of config.backbones ('' = Table 1's 37 names in the paper's order; 'name:tiny' = the tiny
random-weights member of that family, for tests and the demo) W/<name>/ is one run of experiments/adapt.py:
the backbone's features are extracted once into the feature cache (left, right and mirrored views), then every
run at every sigma of config.sigmas trains in one program, with checkpoints, metrics.json and
plots/recall_at_k.png (aR@k before and after adaptation). A backbone whose W/<name>/metrics.json was written
under the same config and data (its fingerprint, the features read through the cache) is read back instead of
run again (else it runs as a plain adaptation run would: refused when its checkpoints hold other data), so a killed sweep resumes backbone by backbone (and
inside the interrupted backbone at its last checkpoint).
Then W/table1.csv and W/table1.md hold Table 1's columns, ours beside the paper's (visim_jax/data/paper_data) for
every row whose name is in Table 1, and W/plots/table1.png compares the rows.
"""
from __future__ import annotations

import csv
import io
import json
import os

import ml_collections

from visim_jax.core import ops, report
from visim_jax.data import paper_data
from visim_jax.training import runtime
from visim_jax.core.errors import UserError
from visim_jax.experiments import adapt
from visim_jax.experiments import config_fields

# our column -> (the paper's column, its std column or None)
PAPER_COLUMNS = {'pca_variance_sum': ('pca_variance_sum', None),
                 'concatenated': ('concatenated_score', 'concatenated_std'), 'pca': ('pca_score', None),
                 'sigma=1': ('ar1_sigma1', 'ar1_sigma1_std'), 'sigma=15': ('ar1_sigma15', 'ar1_sigma15_std')}


def backbone_specs(config) -> list[str]:
  specs = [s.strip() for s in config.backbones.split(',') if s.strip()] or list(paper_data.table1())
  from visim_jax.backbones import registry
  out = []
  for s in specs:
    name, _, opt = s.partition(':')
    try:
      name = registry.canonical(name)  # Table 1's printed names (clip_vit32_b, BiT-M-R50x1) are aliases
    except ValueError:
      raise UserError(f'config.backbones: unknown backbone {name!r}; `python -m visim_jax.main --list_backbones` '
                      'lists them') from None
    if opt not in ('', 'tiny'):
      raise UserError(f"config.backbones: {s!r}: the only option after ':' is 'tiny'")
    out.append(f'{name}:{opt}' if opt else name)
  specs = out
  if len(set(specs)) != len(specs):
    raise UserError(f'config.backbones: a name is listed twice in {config.backbones!r}')
  return specs


def adapt_config(config, spec: str) -> ml_collections.ConfigDict:
  """The adaptation experiment's config for one backbone of the sweep."""
  d = config.to_dict()
  d.pop('backbones')
  name, _, opt = spec.partition(':')
  d.update(experiment='adapt', backbone=name)
  if opt == 'tiny':
    d['backbone_kwargs']['tiny'] = True
  return ml_collections.ConfigDict(d)


def _json(x):
  return json.loads(json.dumps(x))


def finished(workdir: str, c, progress: bool = False) -> dict | None:
  """The backbone's metrics.json when it was written under this config AND this data (its fingerprint, as a
  plain run checks it: the features are read through the cache); else None, and the backbone runs as a plain
  adaptation run would (refused when its checkpoints describe other data)."""
  path = os.path.join(workdir, 'metrics.json')
  if not os.path.exists(path):
    return None
  with open(path) as f:
    m = json.load(f)
  if m.get('config') != _json(config_fields.recorded_config(c, uses_backbone=True)):
    return None
  hp = adapt.hparams_from_config(c)
  feats = adapt.load_features(c, hp, [int(k) for k in c.ks], progress)[0]
  return m if m.get('fingerprint') == adapt.fingerprint(hp, feats).digest else None


def row(spec: str, m: dict) -> dict:
  """One table row from a backbone's metrics.json (primary = the config's epoch rule)."""
  rule, res = m['epoch_rule']['primary'], m['results']
  out = {'model': spec, 'concatenated_size': m['feature_dim'], 'rule': rule,
         'pca_variance_sum': m['pca']['explained_variance']['mean'],
         'concatenated': res['aR@1']['raw'], 'pca': res['aR@1']['pca']}
  for key, eps in m['epochs_selected'].items():
    out[key] = res['aR@1'][key][rule]
    out[f'{key} epoch'] = eps[rule]
    out[f'{key} test-selected (optimistic)'] = res['aR@1'][key]['test']
    out[f'{key} last epoch'] = res['aR@1'][key]['last']
    for k in m['ks'][1:]:
      out[f'aR@{k} {key}'] = res[f'aR@{k}'][key][rule]
  return out


def _pm(s) -> str:
  if s is None or s == '':
    return '-'
  return f"{s['mean']:.4f} ± {s['std']:.4f}" if isinstance(s, dict) else f'{s:.4f}'


def columns(rows: list[dict], ks) -> list[tuple[str, str | None, object]]:
  """(csv name, markdown title or None, getter(row, paper row or None)) for every column of the table."""
  def ours(key):
    return lambda r, p: r.get(key)

  def paper(col, std=None):
    return lambda r, p: (None if p is None else {'mean': p[col], 'std': p[std]} if std else p[col])
  cols = [('model', 'model', lambda r, p: r['model']),
          ('concatenated_size', 'size', ours('concatenated_size')),
          ('paper_concatenated_size', '(paper)', lambda r, p: p and p['concatenated_size']),
          ('pca_variance_sum', 'PCA variance sum', ours('pca_variance_sum')),
          ('paper_pca_variance_sum', '(paper)', paper('pca_variance_sum')),
          ('concatenated', 'concatenated aR@1', ours('concatenated')),
          ('paper_concatenated', '(paper)', paper('concatenated_score', 'concatenated_std')),
          ('pca', 'PCA aR@1', ours('pca')), ('paper_pca', '(paper)', paper('pca_score'))]
  sigmas = [k for k in rows[0] if k.startswith('sigma=') and ' ' not in k]
  for s in sigmas:
    cols.append((f'aR@1 {s}', f'aR@1 {s}', ours(s)))
    if s in PAPER_COLUMNS:
      cols.append((f'paper aR@1 {s}', '(paper)', paper(*PAPER_COLUMNS[s])))
  for s in sigmas:
    cols += [(f'aR@{k} {s}', f'aR@{k} {s}', ours(f'aR@{k} {s}')) for k in ks[1:]]
  for s in sigmas:
    cols += [(f'{s} epoch', f'{s} epoch', ours(f'{s} epoch')),
             (f'{s} last epoch', None, ours(f'{s} last epoch')),
             (f'{s} test-selected (optimistic)', f'aR@1 {s} test-selected (optimistic)',
              ours(f'{s} test-selected (optimistic)'))]
  return cols + [('rule', None, ours('rule'))]


def write_tables(workdir: str, rows: list[dict], ks, rule: str) -> str:
  """table1.csv (means and stds in their own columns) and table1.md; returns the markdown."""
  paper, cols = paper_data.table1(), columns(rows, ks)
  cells = [[get(r, None if ':' in r['model'] else paper.get(r['model'])) for _, _, get in cols] for r in rows]
  flat_head, flat = [], [[] for _ in rows]
  for j, (name, _, _) in enumerate(cols):
    has_std = any(isinstance(c[j], dict) for c in cells)
    flat_head += [name, f'{name} std'] if has_std else [name]
    for i, c in enumerate(cells):
      v = c[j]
      if has_std:
        flat[i] += [v['mean'], v['std']] if isinstance(v, dict) else ['', '']
      else:
        flat[i].append('' if v is None else v)
  buf = io.StringIO()
  csv.writer(buf, lineterminator='\n').writerows([flat_head] + flat)
  ops.atomic_write_text(os.path.join(workdir, 'table1.csv'), buf.getvalue())
  shown = [j for j, (_, title, _) in enumerate(cols) if title]
  fmt = lambda xs: '| ' + ' | '.join(xs) + ' |'
  md = [fmt([cols[j][1] for j in shown]), fmt(['---'] * len(shown))]
  for c in cells:
    md.append(fmt([c[j] if isinstance(c[j], str) else str(c[j]) if isinstance(c[j], int) else _pm(c[j])
                   for j in shown]))
  note = (f'aR@1 on the test pairs, mean ± one standard deviation over runs (Table 1\'s ±; Fig. 3 draws ± 2 std: '
          f'two_std in each <name>/metrics.json). Adapted scores at the epoch picked by the `{rule}` rule '
          '(`last` where a run had fewer than min_val_pairs validation pairs: see each metrics.json); '
          '"test-selected (optimistic)" uses the epoch maximising the run-averaged test curve, how Table 1\'s '
          f'numbers were picked. (paper): {paper_data.SOURCE}; "-" where a row is not in Table 1 (tiny members).')
  text = '\n'.join(md + ['', note, ''])
  ops.atomic_write_text(os.path.join(workdir, 'table1.md'), text)
  return text


def validate_config(config) -> list[str]:
  """Checks the sweep's fields and the adaptation fields (naming the field); returns the backbone specs."""
  if config.dataset not in ('tll', 'demo'):
    raise UserError(f"config.dataset: table1 extracts every backbone's features itself: 'tll' or 'demo' "
                    f'(got {config.dataset!r})')
  specs = backbone_specs(config)
  adapt.validate_config(adapt_config(config, specs[0]))
  return specs


def run(config, workdir: str, progress: bool = True) -> dict:
  specs = validate_config(config)
  configs = {s: adapt_config(config, s) for s in specs}
  os.makedirs(workdir, exist_ok=True)
  rows, ks = [], [int(k) for k in config.ks]
  for i, spec in enumerate(specs):
    sub = os.path.join(workdir, spec.replace(':', '_'))
    m = finished(sub, configs[spec])
    runtime.say(f'[{i + 1}/{len(specs)}] {spec}: ' + ('done earlier, read from metrics.json' if m else sub))
    if m is None:
      m = adapt.run(configs[spec], sub, progress)
    rows.append(row(spec, m))
  rules = sorted({r['rule'] for r in rows})
  text = write_tables(workdir, rows, ks, ' / '.join(rules) if len(rules) > 1 else rules[0])
  if config.plots:
    from visim_jax.plots import table1 as plots
    plots.summary(rows, os.path.join(workdir, 'plots', 'table1.png'))
  runtime.say(f'\nTable 1 ({len(rows)} backbones) in {os.path.join(workdir, "table1.md")}\n\n{text}')
  summary = {'experiment': 'table1', 'backbones': specs, 'rows': rows}
  ops.atomic_write_text(os.path.join(workdir, 'table1.json'), json.dumps(summary, indent=1) + '\n')
  report.write_config(workdir, config.to_dict())  # the record last: another experiment is refused this workdir
  return summary
