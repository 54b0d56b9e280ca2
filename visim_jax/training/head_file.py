"""head.npz: the file a learn_triplets run writes for its trained head (read back by the zoo's `triplets:` spec).

'params/<path>' arrays (the head's parameter tree) and `meta`, a JSON string: head kind, size, similarity, the
backbone / layers / preprocessing its features come from, the workdir and the experiment.
"""
from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np

from visim_jax.training import runtime


def save_head(path: str, hp, params: dict, desc: dict, workdir: str) -> None:
  """head.npz: the parameters as 'params/<path>' arrays and a JSON meta (head, similarity, backbone...)."""
  flat = {'params/' + '/'.join(str(getattr(k, 'key', k)) for k in kp): np.asarray(v)
          for kp, v in jax.tree_util.tree_flatten_with_path(params)[0]}
  meta = {**{k: desc.get(k) for k in ('backbone', 'weights_sha256', 'layers', 'image_size', 'preprocessing')},
          'head': hp.head, 'size': hp.size, 'similarity': hp.similarity, 'workdir': workdir,
          'experiment': 'learn_triplets'}
  runtime.write_npz(path, **flat, meta=np.asarray(json.dumps(meta, sort_keys=True)))


def load_head(path: str) -> tuple[dict, dict]:
  """(params, meta) of a head.npz."""
  with np.load(path, allow_pickle=False) as z:
    meta = json.loads(str(z['meta']))
    params: dict = {}
    for k in z.files:
      if k.startswith('params/'):
        node = params
        *parents, leaf = k[len('params/'):].split('/')
        for p in parents:
          node = node.setdefault(p, {})
        node[leaf] = jnp.asarray(z[k])
  return params, meta
