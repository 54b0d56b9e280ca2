"""The house (issue 31): layer folders, imports one way (down only), no cycle, the config ending at experiments/,
file sizes, and only the faces at the package root. Nothing is imported or run: the files are read with ast.

The layers, low to high (README "Layout", visim_jax/__init__.py): a module imports its own layer or a lower one.
"""
import ast
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, 'visim_jax')
LAYERS = ('core', 'hub', 'data', 'metrics', 'backbones', 'models', 'losses', 'training', 'zoo', 'plots',
          'experiments', 'faces')
FACES = {'__init__', 'api', 'main', 'classify', 'export', 'fetch', 'search', 'distance'}


def _modules(pkg_root):
  out = {}
  for d, _, fs in os.walk(pkg_root):
    for f in fs:
      if f.endswith('.py'):
        rel = os.path.relpath(os.path.join(d, f), os.path.dirname(pkg_root))[:-3].replace(os.sep, '.')
        out[rel.removesuffix('.__init__')] = os.path.join(d, f)
  return out


def import_graph(pkg_root):
  """{module: modules of the package it imports} from every import statement (ast: nothing is executed), lazy
  imports inside functions included."""
  mods = _modules(pkg_root)
  graph = {m: set() for m in mods}
  for m, path in mods.items():
    package = m if path.endswith('__init__.py') else m.rpartition('.')[0]
    for node in ast.walk(ast.parse(open(path).read())):
      if isinstance(node, ast.Import):
        graph[m] |= {a.name for a in node.names if a.name in mods}
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ''
        if node.level:
          parts = package.split('.')[:len(package.split('.')) - node.level + 1]
          base = '.'.join(parts + ([base] if base else []))
        for a in node.names:
          full = f'{base}.{a.name}'
          graph[m].add(full if full in mods else base) if (full in mods or base in mods) else None
  return graph


def cycles(graph):
  """The strongly connected components with more than one module (or a module importing itself)."""
  index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

  def visit(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on.add(v)
    for w in sorted(graph[v]):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = []
      while True:
        w = stack.pop()
        on.discard(w)
        comp.append(w)
        if w == v:
          break
      if len(comp) > 1 or v in graph[v]:
        out.append(sorted(comp))

  sys.setrecursionlimit(max(sys.getrecursionlimit(), 10000))
  for v in sorted(graph):
    if v not in index:
      visit(v)
  return out


def test_cycle_finder_finds_a_circle(tmp_path):
  pkg = tmp_path / 'pkg'
  (pkg / 'sub').mkdir(parents=True)
  (pkg / '__init__.py').write_text('')
  (pkg / 'sub' / '__init__.py').write_text('')
  (pkg / 'a.py').write_text('from pkg.sub import b\n')
  (pkg / 'sub' / 'b.py').write_text('def f():\n  from .. import c\n')
  (pkg / 'c.py').write_text('import pkg.a\n')
  (pkg / 'd.py').write_text('from pkg import a\n')
  assert cycles(import_graph(str(pkg))) == [['pkg.a', 'pkg.c', 'pkg.sub.b']]


def layer(module: str) -> str:
  part = module.split('.')[1] if module.count('.') else '__init__'
  return part if part in LAYERS else 'faces'


def test_no_import_circle():
  graph = import_graph(PKG)
  assert 'visim_jax.backbones.store' in graph['visim_jax.backbones.registry']
  assert cycles(graph) == []


def test_imports_run_down_only():
  """Every import (lazy ones inside functions too) goes to the module's own layer or a lower one."""
  up = sorted(f'{m} ({layer(m)}) imports {d} ({layer(d)})' for m, deps in import_graph(PKG).items() for d in deps
              if d != 'visim_jax' and LAYERS.index(layer(d)) > LAYERS.index(layer(m)))
  assert up == []


def test_the_root_holds_the_faces_and_the_layers_only():
  names = {n[:-3] if n.endswith('.py') else n for n in os.listdir(PKG) if not n.startswith(('.', '__pycache__'))}
  assert names - FACES - set(LAYERS) == set()
  assert set(LAYERS) - {'faces'} <= names


def test_module_sizes():
  """No module over 450 lines, no experiment module over 250."""
  too_long = []
  for m, path in _modules(PKG).items():
    n = sum(1 for _ in open(path, encoding='utf-8'))
    if n > (250 if layer(m) == 'experiments' else 450):
      too_long.append(f'{m}: {n} lines')
  assert too_long == []


def test_the_config_ends_at_experiments():
  """Below experiments/ no module imports ml_collections and no function takes a parameter named `config`."""
  below = LAYERS.index('experiments')
  found = []
  for m, path in _modules(PKG).items():
    if LAYERS.index(layer(m)) >= below:
      continue
    for node in ast.walk(ast.parse(open(path, encoding='utf-8').read())):
      if isinstance(node, ast.Import) and any(a.name.startswith('ml_collections') for a in node.names):
        found.append(f'{m}: imports ml_collections')
      elif isinstance(node, ast.ImportFrom) and (node.module or '').startswith('ml_collections'):
        found.append(f'{m}: imports ml_collections')
      elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        if 'config' in [a.arg for a in node.args.args + node.args.kwonlyargs]:
          found.append(f'{m}.{node.name} takes `config`')
  assert found == []


def test_no_two_modules_say_triplet():
  """One name per sense (issue 31): beside the experiment and plots named after configs/learn_triplets.py, one module
  says "triplet" (the index files of data/)."""
  assert [m for m in _modules(PKG) if 'triplet' in m.rpartition('.')[2] and layer(m) not in ('plots', 'experiments')
          ] == ['visim_jax.data.triplet_index']
