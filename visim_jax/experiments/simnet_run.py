"""The SimNet experiment's three phases on the runtime, its evaluation and its report (see experiments/simnet.py).

train(): one checkpoint tree {params, opt_state, losses, warm_curve} (host arrays) and one global step counter
through warm-up -> stage 1 -> stage 2 (SimNet*), each phase a runtime loop of jitted chunks from simnet.py;
every chunk's key folds in the global step, so a resumed run is bit-identical to an uninterrupted one.
evaluate(): SimNet beside cosine on the same test vectors (classes: leave-one-out mAP / mP@k / recall@k;
pairs: aR@k, R@k; Oxford/Paris: classic or revisited mAP).
"""
from __future__ import annotations

import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np

from visim_jax.core import cpu_kernels, report
from visim_jax.training import runtime
from visim_jax.models import simnet
from visim_jax.core.errors import UserError
from visim_jax.metrics import map as map_lib, retrieval as retrieval_metrics

PAPER_TABLE1_RHO = {'A': 0.909, 'B': 0.965, 'C': 0.974, 'D': 0.964}
_optimizer = functools.lru_cache(maxsize=16)(simnet.optimizer)  # one object per setting: a static jit argument


def arch(a):
  """config.architecture: a Table 1 letter, or comma-separated widths."""
  return a if (isinstance(a, str) and ',' not in a) else [int(x) for x in str(a).split(',') if x.strip()]


def _host(tree):
  return jax.tree.map(np.asarray, tree)


def train(config, rt: runtime.Run, d: dict):
  """(final params, stats for evaluation and the report)."""
  dim, bs, every = d['dim'], config.batch_size, config.log_every
  hidden = simnet.hidden_sizes(arch(config.architecture))
  tx = _optimizer(config.lr, config.momentum, config.weight_decay, config.optimizer, config.decay_biases)
  k_init, k_warm, k_eval, k_train, k_refine, k_hard = jax.random.split(jax.random.PRNGKey(config.seed), 6)
  params = simnet.init_params(k_init, dim, hidden, init=config.init, init_std=config.init_std)
  if config.init_from:
    loaded = runtime.latest_params(config.init_from)
    if jax.tree.map(np.shape, loaded) != jax.tree.map(np.shape, params):
      raise UserError(f'config.init_from: {config.init_from} holds parameters of another shape (architecture or '
                      'feature dimension differ)')
    params = loaded
  W = config.warmup_steps
  S1 = W + (config.steps if config.mode != 'warmup' else 0)
  S2 = S1 + (config.refine_steps if config.mode != 'warmup' else 0)
  tree = _host({'params': params, 'opt_state': cpu_kernels.jit(tx.init)(params), 'losses': np.full((S2,), np.nan, np.float32),
                'warm_curve': np.full((S2 // every + 2, 3), np.nan, np.float32)})  # (step, mse, rho)
  tree, step = rt.restore(tree)
  tree = {**tree, 'losses': np.array(tree['losses']), 'warm_curve': np.array(tree['warm_curve'])}
  pairs = cpu_kernels.jit(simnet.random_pairs, static_argnums=(1, 2), static_argnames='x_dist')  # one compilation, not many
  wx, wy, wc = pairs(k_eval, int(config.warmup_eval_pairs), dim, x_dist=config.warmup_x_dist)
  warm_eval = lambda p: _warm_eval(p, wx, wy, wc)

  def chunk(fn):
    def chunk_fn(tree, s0, n):
      p, o, l = fn(tree, s0, n)
      tree['losses'][s0:s0 + n] = np.asarray(l)
      scalars = {'train/loss': np.asarray(l)}
      if fn is warm:
        st, _ = warm_eval(p)
        s1 = s0 + n
        tree['warm_curve'][s1 // every + (s1 % every > 0)] = (s1, st['mse'], st['rho'])
        scalars.update({'warmup/heldout_mse': st['mse'], 'warmup/heldout_rho': st['rho']})
      return {**tree, 'params': _host(p), 'opt_state': _host(o)}, scalars
    return chunk_fn

  warm = lambda t, s0, n: simnet.warmup_chunk(tx, t['params'], t['opt_state'], k_warm, s0, n, bs, dim,
                                              config.warmup_x_dist)
  loop = lambda tree, fn, start, end: rt.loop(tree, chunk(fn), start, end, every, config.checkpoint_every, total=S2)
  tree = loop(tree, warm, step, W)
  step = max(step, W)
  warm_stats, warm_pred = warm_eval(tree['params']) if W or config.mode == 'warmup' else (None, None)
  hard_stats = None
  if config.mode != 'warmup':
    data = jax.tree.map(jnp.asarray, d['train'])
    if step == W:
      tree['opt_state'] = _host(cpu_kernels.jit(tx.init)(tree['params']))  # a fresh optimiser for training proper
    stage1 = lambda t, s0, n: simnet.train_chunk(tx, t['params'], t['opt_state'], k_train, s0, data, config.delta, n,
                                                 bs, config.mode)
    tree = loop(tree, stage1, step, S1)
    step = max(step, S1)
    if config.refine_steps:
      pool_file = rt.path('hard_pairs.npz')
      if step == S1 or not os.path.exists(pool_file):
        hp, hn, hard_stats = mine(config, tree['params'], d, k_hard)
        runtime.write_npz(pool_file, pos=hp, neg=hn, stats=json.dumps(hard_stats))
        runtime.write_npz(rt.path('params_simnet.npz'), **_flat(tree['params']))   # SimNet, before SimNet*
      else:
        with np.load(pool_file, allow_pickle=False) as z:
          hp, hn, hard_stats = z['pos'], z['neg'], json.loads(str(z['stats']))
      n_hard = int(round(config.hard_fraction * bs)) if (len(hp) or len(hn)) else 0
      data = dict(data, pool_pos=jnp.asarray(hp.reshape(-1, 2)), pool_neg=jnp.asarray(hn.reshape(-1, 2)))
      stage2 = lambda t, s0, n: simnet.train_chunk(tx, t['params'], t['opt_state'], k_refine, s0, data, config.delta,
                                                   n, bs, config.mode, n_hard)
      tree = loop(tree, stage2, step, S2)
  params = jax.tree.map(jnp.asarray, tree['params'])
  stage1 = None
  if config.mode != 'warmup' and config.refine_steps and os.path.exists(rt.path('params_simnet.npz')):
    with np.load(rt.path('params_simnet.npz'), allow_pickle=False) as z:
      stage1 = {k: {'w': jnp.asarray(z[f'{k}/w']), 'b': jnp.asarray(z[f'{k}/b'])} for k in params}
  return params, {'params_simnet': stage1, 'losses': tree['losses'], 'warm_curve': tree['warm_curve'], 'phase_ends': (W, S1, S2),
                  'hidden': hidden, 'warm_stats': warm_stats, 'warm_pred': warm_pred, 'warm_cos': np.asarray(wc),
                  'hard_stats': hard_stats}


def _flat(params):
  return {f'{layer}/{k}': np.asarray(v) for layer, leaves in params.items() for k, v in leaves.items()}


def _warm_eval(params, x, y, c):
  s = cpu_kernels.jit(simnet.apply)(params, x, y)
  return {k: float(v) for k, v in simnet.regression_stats(s, c).items()}, np.asarray(s)


def mine(config, params, d, key):
  """SimNet*: a fresh random set of training images (pairs) scored all-vs-all; its difficult pairs as global
  indices (matches (P, 2), non-matches (M, 2)) and stats."""
  a_all, b_all = d['train']['a'], d['train']['b']
  n = a_all.shape[0]
  m = min(config.hard_set_size, n)
  sel = np.sort(np.asarray(jax.random.choice(key, n, (m,), replace=False)))
  if config.mode == 'classes':
    lab = d['labels_train'][sel]
    similar = (lab[:, None] == lab[None, :]).astype(np.int8)
    np.fill_diagonal(similar, -1)    # an image with itself is not a pair
  else:
    similar = np.eye(m, dtype=np.int8)
  hp, hn, stats = simnet.hard_pairs(params, a_all[sel], b_all[sel], similar, config.q_tile, config.d_tile,
                                    config.score_dtype)
  stats['set_size'] = int(m)
  return sel[hp].astype(np.int32), sel[hn].astype(np.int32), stats


# ------------------------------------------------------------------------------------------ evaluation

def evaluate(config, params, d, stats) -> dict:
  ks = [int(k) for k in config.ks]
  W, S1, S2 = stats['phase_ends']
  bs = config.batch_size
  m = {'experiment': 'simnet', 'mode': config.mode,
       'dataset': config.dataset if config.mode != 'warmup' else 'random', **d['desc'], **d['extra'],
       'feature_dim': int(d['dim']), 'architecture': str(config.architecture), 'hidden': list(stats['hidden']),
       'num_params': simnet.num_params(params), 'delta': config.delta,
       'steps': {'warmup': W, 'stage1': S1 - W, 'stage2_simnet_star': S2 - S1, 'batch_size': bs},
       'pairs_seen': {'warmup': W * bs, 'training': (S2 - W) * bs}}
  if stats['warm_stats'] is not None:
    m['warmup'] = {'heldout_pairs': int(config.warmup_eval_pairs), 'train_pairs': W * bs,
                   'mse': stats['warm_stats']['mse'], 'rho': stats['warm_stats']['rho'],
                   'paper_table1_rho': PAPER_TABLE1_RHO, 'paper_train_pairs': 22_500_000}
  if stats['hard_stats'] is not None:
    m['simnet_star'] = stats['hard_stats']
  kw = dict(q_tile=config.q_tile, d_tile=config.d_tile, compute_dtype=config.score_dtype)
  stats['scatter'] = None
  if config.mode == 'classes':
    x_te, lab_te = (jnp.asarray(d['test'][0]), d['test'][1])
    s = np.asarray(simnet.score_matrix(params, x_te, x_te, **kw))
    cos = np.asarray(retrieval_metrics.cosine_matrix(x_te, x_te))
    pos, junk = map_lib.label_masks(lab_te, lab_te, np.arange(len(lab_te)))
    res = {'cosine': map_lib.summarise(cos, pos, junk, ks), 'simnet': map_lib.summarise(s, pos, junk, ks)}
    m['results'] = {name: {k: v for k, v in r.items() if k != 'ap'} for name, r in res.items()}
    m['protocol'] = 'leave-one-out retrieval among test images; same class = relevant; the query ignored'
    stats['scatter'] = (cos[~junk], s[~junk], pos[~junk])
    if 'retrieval' in d:
      m['oxford_paris'] = evaluate_oxford_paris(params, d['retrieval'], ks, kw)
    if 'retrieval_sets' in d:   # cosine, SimNet (end of stage 1) and SimNet* (after refinement) when both exist
      models = {'simnet': params}
      if config.refine_steps:
        models = {k: v for k, v in (('simnet', stats['params_simnet']), ('simnet_star', params)) if v is not None}
      m['retrieval_sets'] = {name: evaluate_oxford_paris(models, r, ks, kw) for name, r in d['retrieval_sets'].items()}
  elif config.mode == 'pairs':
    l_te, r_te = (jnp.asarray(a) for a in d['test'])
    s, cos = simnet.score_matrix(params, l_te, r_te, **kw), retrieval_metrics.cosine_matrix(l_te, r_te)
    m['results'] = {}
    for name, mat in (('cosine', cos), ('simnet', s)):
      ar, r = np.asarray(retrieval_metrics.asymmetric_recall(mat, ks)), np.asarray(retrieval_metrics.recall(mat, ks))
      m['results'][name] = {**{f'aR@{k}': float(v) for k, v in zip(ks, ar)},
                            **{f'R@{k}': float(v) for k, v in zip(ks, r)}}
    m['protocol'] = ('test split pairs; sim[i, j] = g([left_i, right_j]); aR@k: partner within k in either '
                     'direction (pessimistic ties); R@k: left -> right')
    s, cos = np.asarray(s), np.asarray(cos)
    stats['scatter'] = (cos.ravel(), s.ravel(), np.eye(len(s), dtype=bool).ravel())
  return m


def evaluate_oxford_paris(params, arrays, ks, score_kw):
  """Classic or revisited mAP of cosine and of each model ({name: params}, or one params tree = 'simnet')."""
  gt = arrays['gt']
  q, db = jnp.asarray(arrays['queries']), jnp.asarray(arrays['database'])
  out = {'protocol': gt.protocol, 'n_queries': len(gt), 'n_database': len(gt.imlist)}
  models = params if 'layer_00' not in params else {'simnet': params}
  scored = [('cosine', retrieval_metrics.cosine_matrix(q, db))]
  scored += [(name, simnet.score_matrix(p, q, db, **score_kw)) for name, p in models.items()]
  for name, s in scored:
    s = np.asarray(s)
    if gt.protocol == 'revisited':
      r = map_lib.evaluate_revisited(s, gt.gnd, ks)
      out[name] = {setting: {k: v for k, v in r[setting].items() if k != 'ap'} for setting in r}
    else:
      out[name] = {k: v for k, v in map_lib.evaluate_classic(s, gt.gnd, ks).items() if k != 'ap'}
  return out


# ---------------------------------------------------------------------------------------------- report

def write_outputs(config, rt: runtime.Run, stats) -> None:
  """curves.npz and the figures (process 0; TensorBoard scalars were written while training)."""
  if not report.is_writer():
    return
  wcv = stats['warm_curve'][~np.isnan(stats['warm_curve'][:, 0])]
  runtime.write_npz(rt.path('curves.npz'), loss=stats['losses'], warmup_eval=wcv,
                    phase_ends=np.asarray(stats['phase_ends']))
  if not config.plots:
    return
  from visim_jax.plots import simnet as plots
  plots.training_curve(stats['losses'], wcv, stats['phase_ends'], config.log_every, rt.path('plots', 'training_curve.png'))
  if stats['warm_pred'] is not None:
    plots.warmup_scatter(stats['warm_cos'], stats['warm_pred'], rt.path('plots', 'warmup_scatter.png'))
  if stats['scatter'] is not None:
    plots.score_vs_cosine(*stats['scatter'], rt.path('plots', 'score_vs_cosine.png'))


def print_summary(metrics, ks) -> None:
  say = runtime.say
  say(f"\nSimNet {metrics['mode']} ({metrics['dataset']}), architecture {metrics['architecture']} "
      f"({metrics['num_params']:,} params), feature dim {metrics['feature_dim']}")
  if 'warmup' in metrics:
    w = metrics['warmup']
    say(report.table([[w['train_pairs'], w['heldout_pairs'], w['mse'], w['rho']]],
                     ['warm-up train pairs', 'held-out pairs', 'MSE', 'rho']))
  if 'results' in metrics:
    names = [k for k in metrics['results']['cosine'] if '@' in k or k == 'mAP']
    say(report.table([[m] + [metrics['results'][m][k] for k in names] for m in ('cosine', 'simnet')],
                     ['similarity'] + names))
  sets = {**({'oxford_paris': metrics['oxford_paris']} if 'oxford_paris' in metrics else {}),
          **metrics.get('retrieval_sets', {})}
  for set_name, o in sets.items():
    names = [k for k in o if k not in ('protocol', 'n_queries', 'n_database')]
    if o['protocol'] == 'revisited':
      rows = [[m] + [o[m][s]['mAP'] for s in map_lib.REVISITED_SETTINGS] for m in names]
      say(report.table(rows, [set_name, 'mAP easy', 'mAP medium', 'mAP hard']))
    else:
      say(report.table([[m, o[m]['mAP']] for m in names], [set_name, 'mAP (classic)']))
