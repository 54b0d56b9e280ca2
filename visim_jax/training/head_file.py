"""head.npz: the file a learn_triplets run writes for its trained head (read back by the zoo's `triplets:` spec).

'params/<path>' arrays (the head's parameter tree) and `meta`, a JSON string: head kind, size, similarity, the
backbone / layers / preprocessing its features come from, the workdir and the experiment.

`load_head` trusts nothing in the file: it is read without pickles, and a file that is not a zip, has no `meta`, a
`meta` that is not a JSON object, an unknown head kind or similarity, object or non-float arrays, a parameter tree
other than the one `heads.init` makes for that kind (names and shapes, against the backbone's feature size when
given), non-finite values, or weights that are all zero (every image would get one embedding) is one UserError
naming the file and what to do.
"""
from __future__ import annotations

import json
import zipfile

import jax
import jax.numpy as jnp
import numpy as np

from visim_jax.core.errors import UserError
from visim_jax.models import heads
from visim_jax.training import runtime

SIMILARITIES = ('dot', 'cosine')
_FIX = 'give the head.npz a finished learn_triplets run wrote (or rerun that run)'


def save_head(path: str, hp, params: dict, desc: dict, workdir: str) -> None:
  """head.npz: the parameters as 'params/<path>' arrays and a JSON meta (head, similarity, backbone...)."""
  flat = {'params/' + '/'.join(str(getattr(k, 'key', k)) for k in kp): np.asarray(v)
          for kp, v in jax.tree_util.tree_flatten_with_path(params)[0]}
  meta = {**{k: desc.get(k) for k in ('backbone', 'weights_sha256', 'layers', 'image_size', 'preprocessing')},
          'head': hp.head, 'size': hp.size, 'similarity': hp.similarity, 'workdir': workdir,
          'experiment': 'learn_triplets'}
  runtime.write_npz(path, **flat, meta=np.asarray(json.dumps(meta, sort_keys=True)))


def _bad(path: str, why: str) -> UserError:
  return UserError(f'{path}: {why}; {_FIX}')


def _read(path: str) -> dict[str, np.ndarray]:
  if not zipfile.is_zipfile(path):
    raise _bad(path, 'not an .npz archive (empty, random bytes or another format)')
  try:
    with np.load(path, allow_pickle=False) as z:
      if not hasattr(z, 'files'):
        raise ValueError('a single array, not an .npz archive')
      return {k: z[k] for k in z.files}
  except (ValueError, OSError, EOFError, zipfile.BadZipFile, KeyError) as e:
    text = ' '.join(str(e).split())
    if 'pickle' in text.lower():   # numpy's advice (allow_pickle=, pickle.load) is not ours to give
      text = 'it holds object arrays (pickled Python objects), which are never loaded'
    raise _bad(path, f'not a readable head file ({text[:120]})') from None


def _meta(path: str, data: dict) -> dict:
  if 'meta' not in data:
    raise _bad(path, 'no meta entry (the head kind, similarity and backbone)')
  m = data['meta']
  if m.dtype.kind != 'U' or m.shape != ():
    raise _bad(path, f'meta must be one JSON string, got {m.dtype} {m.shape}')
  try:
    meta = json.loads(str(m))
  except ValueError:
    raise _bad(path, 'meta is not JSON') from None
  if not isinstance(meta, dict):
    raise _bad(path, f'meta must be a JSON object, got {type(meta).__name__}')
  kinds = tuple(k for k in heads.KINDS if k != 'identity')
  if meta.get('head') not in kinds:
    raise _bad(path, f'meta.head is {meta.get("head")!r}; one of {", ".join(kinds)}')
  if meta.get('similarity') not in SIMILARITIES:
    raise _bad(path, f'meta.similarity is {meta.get("similarity")!r}; one of {", ".join(SIMILARITIES)}')
  size = meta.get('size')
  if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= 2**16:
    raise _bad(path, f'meta.size is {size!r}; an integer in 1..65536')
  for k in ('backbone', 'weights_sha256'):
    if meta.get(k) is not None and not isinstance(meta[k], str):
      raise _bad(path, f'meta.{k} must be a string, got {type(meta[k]).__name__}')
  layers = meta.get('layers')
  if layers is not None and not (isinstance(layers, list) and all(isinstance(l, str) for l in layers)):
    raise _bad(path, 'meta.layers must be a list of layer names')
  return meta


def _tree(path: str, data: dict) -> dict:
  params: dict = {}
  for k, v in data.items():
    if not k.startswith('params/'):
      continue
    if v.dtype.kind != 'f':
      raise _bad(path, f'{k} is {v.dtype}, not a float array')
    node = params
    *parents, leaf = k[len('params/'):].split('/')
    for p in parents:
      node = node.setdefault(p, {})
      if not isinstance(node, dict):
        raise _bad(path, f'{k} nests inside an array')
    node[leaf] = v
  return params


def _paths(tree) -> dict[str, tuple]:
  return {'/'.join(str(getattr(k, 'key', k)) for k in kp): tuple(v.shape)
          for kp, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


def check_shapes(path: str, params: dict, meta: dict, in_dim: int) -> None:
  """The parameter tree is the one heads.init makes for meta's head kind and size on in_dim features."""
  got = _paths(params)
  kind, size = meta['head'], meta['size']
  want = _paths(jax.eval_shape(lambda: heads.init(kind, jax.random.PRNGKey(0), in_dim, size)))
  if got != want:
    diff = sorted(set(got.items()) ^ set(want.items()))[:2]
    raise _bad(path, f'the parameters are not those of a {kind!r} head of size {size} on {in_dim} features '
                     f'(e.g. {", ".join(f"{k} {s}" for k, s in diff)})')


def load_head(path: str, in_dim: int | None = None) -> tuple[dict, dict]:
  """(params, meta) of a head.npz, checked (module docstring); in_dim: the backbone's feature size, when known
  (else the first matrix's rows)."""
  data = _read(path)
  meta = _meta(path, data)
  params = _tree(path, data)
  got = _paths(params)
  if not got:
    raise _bad(path, 'no params/ arrays')
  if in_dim is None:
    first = [s for s in got.values() if len(s) == 2]
    in_dim = first[0][0] if first else 1
  check_shapes(path, params, meta, in_dim)
  flat = [('/'.join(str(getattr(k, 'key', k)) for k in kp), v)
          for kp, v in jax.tree_util.tree_flatten_with_path(params)[0]]
  for k, v in flat:
    if not np.isfinite(v).all():
      raise _bad(path, f'params/{k} holds NaN or Inf')
  weights = [v for k, v in flat if k.rsplit('/', 1)[-1] == 'w']
  if meta['head'] != 'mlp' and weights and not any(np.any(w) for w in weights):
    raise _bad(path, 'its weights are all zero (every image would get the same embedding)')
  return jax.tree.map(jnp.asarray, params), meta
