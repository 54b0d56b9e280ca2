"""Class trees for per-node histogram metrics (paper 003, Sec. 4.1 "Taxonomic Node", Fig. 1 steps 1-2).

A node of the tree (e.g. a WordNet synset) is evaluated as its own small classification problem: "a taxonomic
node assigns each direct child as one cluster; one cluster consists of all images belonging to the child and its
descendants". The paper keeps the nodes "having more than 2 children" (Sec. 4.1): `min_children=3`, counting
children whose subtree holds samples. Readings (ours, docs/histograms.md): samples labelled with the node itself,
and in a DAG samples reachable from two children of the node, are left out of that node; a node's level is its
shortest distance (edges) from a root (roots are level 0; Sec. 8.1 "according to the distance to the root node").
"""
from __future__ import annotations

from typing import Callable, Iterable, Mapping, Sequence

import numpy as np

from visim_jax.metrics import histograms as H

MIN_CHILDREN = 3  # Sec. 4.1: more than 2 children


def descendants(tree: Mapping[str, Sequence[str]]) -> dict[str, frozenset]:
  """{node: the node and every node below it} of a parent -> children tree (a DAG is fine)."""
  memo: dict[str, frozenset] = {}

  def visit(node, stack):
    if node in memo:
      return memo[node]
    if node in stack:
      raise ValueError(f'class tree: a cycle through {node!r}')
    stack.add(node)
    out = {node}
    for ch in tree.get(node, ()):
      out |= visit(ch, stack)
    stack.discard(node)
    memo[node] = frozenset(out)
    return memo[node]

  nodes = set(tree) | {c for cs in tree.values() for c in cs}
  for n in sorted(nodes):
    visit(n, set())
  return memo


def levels(tree: Mapping[str, Sequence[str]]) -> dict[str, int]:
  """Shortest distance of each node from a root (a node that is nobody's child), roots at 0."""
  children = {c for cs in tree.values() for c in cs}
  nodes = set(tree) | children
  level = {r: 0 for r in nodes - children}
  frontier = sorted(level)
  while frontier:
    nxt = []
    for n in frontier:
      for c in tree.get(n, ()):
        if c not in level:
          level[c] = level[n] + 1
          nxt.append(c)
    frontier = nxt
  return level


def node_clusters(tree: Mapping[str, Sequence[str]], class_names: Sequence[str], labels: np.ndarray,
                  min_children: int = MIN_CHILDREN) -> Iterable[tuple[str, int, list[str], np.ndarray]]:
  """For each node with >= min_children children holding samples: (node, level, children, cluster labels).

  cluster labels: (N,) index of the child whose subtree holds the sample's class, -1 for samples outside the
  node, labelled with the node itself, or under two children (module docstring)."""
  desc = descendants(tree)
  lvl = levels(tree)
  labels = np.asarray(labels)
  name_of = np.asarray(list(class_names), dtype=object)
  present = {n for n in name_of[np.unique(labels[labels >= 0])]} if len(labels) else set()
  for node in sorted(tree, key=lambda n: (lvl.get(n, 0), n)):
    kids = [c for c in tree[node] if desc.get(c, frozenset({c})) & present]
    if len(kids) < min_children:
      continue
    owner = np.full(len(class_names), -1, np.int64)
    for ci, name in enumerate(class_names):
      hits = [i for i, c in enumerate(kids) if name in desc.get(c, frozenset({c}))]
      if len(hits) == 1:
        owner[ci] = hits[0]
    cl = np.where(labels >= 0, owner[np.clip(labels, 0, None)], -1)
    yield node, lvl.get(node, 0), kids, cl


def evaluate_nodes(x, nodes, opts, estimator: str, wrap: Callable = lambda it: it) -> tuple[list[dict], int]:
  """Per-node rows {node, level, clusters, samples, H.SCALARS} of `node_clusters` output, one estimator for all
  (no standard errors; classes are filtered once, globally, so clusters need only 2 samples), and the number of
  nodes skipped for having fewer than 2 clusters with samples. `wrap` may wrap the node list (a progress bar)."""
  node_opts = H.Options(**{**opts.__dict__, 'min_class_size': 2})
  rows, skipped = [], 0
  for node, level, kids, cl in wrap(nodes):
    try:
      m = H.evaluate(x, cl, len(kids), node_opts, estimator=estimator, replicates=0)
    except H.TooFewClasses:
      skipped += 1
      continue
    rows.append({'node': node, 'level': level, 'clusters': int(m['valid'].sum()), 'samples': int((cl >= 0).sum()),
                 **H.scalars(m)})
  return rows, skipped


def level_means(rows: Sequence[Mapping], keys: Sequence[str]) -> tuple[list[dict], dict]:
  """Tables 1 and 8: per level (rows' 'level'), the mean of each key over the level's nodes, and the mean over
  all nodes (the paper's 'AVG'); None values (a metric a node could not have) are left out of the means."""
  def mean(rs, k):
    v = [r[k] for r in rs if r[k] is not None]
    return float(np.mean(v)) if v else None
  levels = []
  for lv in sorted({r['level'] for r in rows}):
    rs = [r for r in rows if r['level'] == lv]
    levels.append({'level': lv, 'nodes': len(rs), **{k: mean(rs, k) for k in keys}})
  return levels, {k: mean(rows, k) for k in keys}
