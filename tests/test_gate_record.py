"""The gate's record: a refused run changes nothing in a finished workdir, on every surface.

For adaptation, table1, benchmark, nights_adapt, twoafc, histograms and simnet, a finished workdir is made once with
the smallest config (in-process, main.run), then runs that must be refused go into it: a bad field, a late image
that does not decode (truncated, 0-byte, text saved as .png: made here), another experiment's workdir, a memory
estimate beyond the machine. Each ends in one UserError line naming the field or file, and the workdir's tree
(names, bytes and mtimes of every file but `.lock`, which holds the last holder's pid) is unchanged.
"""
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from visim_jax.core import memory

from visim_jax import main
from visim_jax.core.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HUGE_MEMORY = 1 << 40     # the machine's memory as the estimate sees it (8 GiB below): the same everywhere


def config(name, mode=None, **fields):
  spec = importlib.util.spec_from_file_location(f'gate_{name}', os.path.join(ROOT, 'configs', f'{name}.py'))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  c = mod.get_config(mode)
  c.update_from_flattened_dict(fields)   # 'a.b' keys, as --config.a.b= sets them
  return c


def tree(wd) -> str:
  h = hashlib.sha256()
  for r, dirs, files in sorted(os.walk(wd)):
    dirs.sort()
    h.update(os.path.relpath(r, wd).encode() + b'/\n')
    for f in sorted(files):
      if f == '.lock':
        continue
      p = os.path.join(r, f)
      with open(p, 'rb') as fh:
        h.update(f'{f}\0{os.stat(p).st_mtime_ns}\0'.encode() + hashlib.sha256(fh.read()).digest())
  return h.hexdigest()


def refused(c, wd, starts: str) -> str:
  """main.run(c, wd) is refused with one line starting with `starts`; wd's tree is unchanged."""
  before = tree(wd)
  with pytest.raises(UserError) as e:
    main.run(c, str(wd))
  msg = str(e.value)
  assert '\n' not in msg and msg.startswith(starts), msg
  assert tree(wd) == before, f'{wd} changed by a refused run ({msg})'
  return msg


@pytest.fixture(autouse=True)
def eight_gib(monkeypatch):
  monkeypatch.setattr(memory, 'limit_bytes', lambda: 8 * 2**30)


def break_image(path, how):
  data = open(path, 'rb').read()
  with open(path, 'wb') as f:
    f.write({'truncated': data[:len(data) // 2], 'empty': b'', 'text': b'not a png, a text file\n'}[how])


# ------------------------------------------------------------------------------------------- finished workdirs

@pytest.fixture(scope='module')
def base(tmp_path_factory):
  return tmp_path_factory.mktemp('gate')


@pytest.fixture(scope='module')
def adapt_wd(base):
  rng = np.random.RandomState(0)
  left = rng.randn(40, 12).astype(np.float32)
  np.savez(base / 'pairs.npz', left=left, right=left + 0.4 * rng.randn(40, 12).astype(np.float32))
  c = adapt_config(base)
  main.run(c, str(base / 'adapt'))
  return base / 'adapt'


def adapt_config(base, **kw):
  return config('tll', 'local', **{'features': str(base / 'pairs.npz'), 'runs': 1, 'epochs': 2, 'pca_dim': 4,
                                   'adapt_dim': 8, 'ks': (1, 2), 'checkpoint': True, 'checkpoint_every': 2,
                                   'plots': False, 'val_fraction': 0.2, **kw})


@pytest.fixture(scope='module')
def hist_wd(base):
  rng = np.random.default_rng(0)
  lab = np.repeat(np.arange(4), 6)
  x = rng.normal(size=(4, 8))[lab] + rng.normal(size=(24, 8))
  np.savez(base / 'classes.npz', features=x.astype(np.float32), labels=lab)
  main.run(hist_config(base), str(base / 'hist'))
  return base / 'hist'


def hist_config(base, **kw):
  return config('histograms', 'local', dataset='features', features=str(base / 'classes.npz'), class_tree='',
                plots=False, min_class_size=3, **kw)


def twoafc_config(**kw):
  return config('twoafc', 'local', annotations='synthetic', **{'model.embed_dim': 8, 'model.hidden': 8,
                'model.steps': 4, 'model.chunk_steps': 4, 'ensemble.mlp_epochs': 2, 'ensemble.mlp_seeds': 1,
                'ensemble.mlp_dim': 4, 'ensemble.sweep': False, 'n_boot': 50, 'plots': False, **kw})


@pytest.fixture(scope='module')
def twoafc_wd(base):
  main.run(twoafc_config(), str(base / 'twoafc'))
  return base / 'twoafc'


def simnet_config(**kw):
  return config('simnet_warmup', 'local', warmup_steps=20, log_every=10, checkpoint_every=10,
                warmup_eval_pairs=100, plots=False, **kw)


@pytest.fixture(scope='module')
def simnet_wd(base):
  main.run(simnet_config(), str(base / 'simnet'))
  return base / 'simnet'


@pytest.fixture(scope='module')
def nights_copy(base, human_demo_sets):
  """A private copy of the mini NIGHTS folder (its images are broken by the tests, in further copies)."""
  dst = base / 'nights'
  shutil.copytree(human_demo_sets.nights, dst)
  return dst


def nights_config(base, nights_dir, **kw):
  return config('nights_adapt', 'demo', dataset='nights', nights_dir=str(nights_dir), cache_dir=str(base / 'cache'),
                backbone='alexnet', **{'backbone_kwargs.tiny': True, 'pca_dim': 8, 'adapt_dim': 16, 'embed_dim': 8,
                                       'epochs': 2, 'seeds': 1, 'checkpoint_every': 2, 'n_boot': 50, **kw})


@pytest.fixture(scope='module')
def nights_wd(base, nights_copy):
  main.run(nights_config(base, nights_copy), str(base / 'nights_adapt'))
  return base / 'nights_adapt'


def bench_config(base, nights_dir, **kw):
  return config('benchmark', None, **{'models': 'cosine:alexnet:tiny', 'nights_dir': str(nights_dir),
                                     'nights_splits': 'test', 'cache_dir': str(base / 'cache'), 'n_boot': 50,
                                     'plots': False, **kw})


@pytest.fixture(scope='module')
def bench_wd(base, nights_copy):
  main.run(bench_config(base, nights_copy), str(base / 'bench'))
  return base / 'bench'


def broken_copy(src, dst, how) -> str:
  """A copy of a NIGHTS folder whose last test image (decoded late) is broken `how`; its path."""
  from visim_jax.data import nights
  shutil.copytree(src, dst)
  last = nights.load(str(dst), 'test').paths()[-1]
  break_image(last, how)
  return last


# ------------------------------------------------------------------------------------------------ the refusals

def test_adaptation(adapt_wd, base, hist_wd):
  refused(adapt_config(base, lr=-1.0), adapt_wd, 'config.lr:')
  assert 'GiB' in refused(adapt_config(base, adapt_dim=2**24, runs=1000), adapt_wd, 'config.adapt_dim: this run needs')
  refused(adapt_config(base, subset=str(base / 'names.csv')), adapt_wd, 'config.subset:')       # not read: refused
  refused(hist_config(base), adapt_wd, f'{adapt_wd}: holds a adapt run')                       # another experiment
  refused(adapt_config(base), hist_wd, f'{hist_wd}: holds a histograms run')


def test_histograms(hist_wd, base):
  refused(hist_config(base, bins=0), hist_wd, 'config.bins:')
  refused(hist_config(base, source_stats=str(base / 'stats.npz')), hist_wd, 'config.source_stats:')


def test_twoafc(twoafc_wd, base):
  refused(twoafc_config(**{'model.lr': -1.0}), twoafc_wd, 'config.model.lr:')
  msg = refused(twoafc_config(**{'model.embed_dim': 2**16, 'model.hidden': 2**16}), twoafc_wd,
                'config.model.embed_dim: this run needs at least')
  assert 'GiB' in msg
  refused(simnet_config(), twoafc_wd, f'{twoafc_wd}: holds a twoafc run')


def test_simnet(simnet_wd):
  refused(simnet_config(lr=-1.0), simnet_wd, 'config.lr:')
  refused(simnet_config(architecture='1000000,1000000'), simnet_wd, 'config.architecture: this run needs')
  refused(twoafc_config(), simnet_wd, f'{simnet_wd}: holds a simnet run')


def test_nights_adapt(nights_wd, base, nights_copy, bench_wd):
  refused(nights_config(base, nights_copy, margin=-1.0), nights_wd, 'config.margin:')
  # both in range; together 10^6 GiB: refused before anything is allocated (it used to hang)
  # the fields that drive the estimate, largest first (issue 44): adapt_dim's share, then seeds'
  msg = refused(nights_config(base, nights_copy, seeds=10**4, adapt_dim=2**20), nights_wd, 'config.adapt_dim: this run')
  assert 'or config.seeds' in msg
  assert 'GiB' in msg
  msg = refused(nights_config(base, nights_copy, model='triplet', embed_dim=2**20, seeds=100), nights_wd,
                'config.embed_dim: this run')
  bad = broken_copy(nights_copy, base / 'nights_broken', 'truncated')
  refused(nights_config(base, base / 'nights_broken'), nights_wd, bad)
  refused(bench_config(base, nights_copy), nights_wd, f'{nights_wd}: holds a nights_adapt run')
  refused(nights_config(base, nights_copy), bench_wd, f'{bench_wd}: holds a benchmark run')


@pytest.mark.parametrize('how', ['truncated', 'empty', 'text'])
def test_benchmark_decodes_every_image_before_writing(bench_wd, base, nights_copy, how):
  bad = broken_copy(nights_copy, base / f'bench_{how}', how)
  refused(bench_config(base, base / f'bench_{how}'), bench_wd, bad)


def test_benchmark_fields(bench_wd, base, nights_copy):
  refused(bench_config(base, nights_copy, n_boot=-1), bench_wd, 'config.n_boot:')
  refused(bench_config(base, nights_copy, things_triplets=str(base / 'none.txt')), bench_wd, 'config.things_triplets:')
  refused(bench_config(base, nights_copy, bapps_dir=str(nights_copy), bapps_sets='nope'), bench_wd,
          'config.bapps_sets:')


def test_table1(base, adapt_wd):
  c = config('table1', 'demo', backbones='alexnet:tiny', runs=1, epochs=2, checkpoint_every=2, pca_dim=8,
             adapt_dim=8, ks=(1, 2), plots=False, sheet_queries=0, select_epoch='last', cache_dir=str(base / 'cache'),
             **{'demo.n_pairs': 16, 'demo.root': str(base / 'tll_demo')})
  wd = base / 'table1'
  main.run(c, str(wd))
  c.subset = str(base / 'thirty_names.csv')
  open(c.subset, 'w').write('a\n')
  refused(c, wd, 'config.subset: not used')        # the demo pairs take no subset: refused, not recorded
  refused(adapt_config(base), wd, f'{wd}: holds a table1 run')


def test_command_line_refusal_is_one_line(tmp_path):
  """`benchmark.py:local --config.things_triplets=/nonexistent.txt` used to run on the demo list (exit 0)."""
  missing = str(tmp_path / 'nonexistent.txt')
  p = subprocess.run([sys.executable, '-m', 'visim_jax.main', '--config=configs/benchmark.py:local',
                      f'--config.things_triplets={missing}', f'--workdir={tmp_path / "w"}'],
                     cwd=ROOT, capture_output=True, text=True, env={**os.environ, 'PYTHONPATH': ROOT})
  assert p.returncode == 1
  assert p.stderr.strip() == f'error: config.things_triplets: {missing} not found', p.stderr
  assert not (tmp_path / 'w').exists()
