"""tuned.npz: what a `tune` run keeps of its tower (read back by the zoo's `tuned:` spec and by `vj.load`).

Arrays, by the trainable tree of training/tower_step.py:
  lora/<module path>/a, lora/<module path>/b   the LoRA factors of each adapted kernel (models/lora.py; tune='lora':
                                               the file stays small: r (fan_in + out) numbers a kernel)
  tower/<param path>                           the whole tuned parameter tree (tune='full')
  head/<param path>                            the trained head (head='affine')
and `meta`, a JSON string: the backbone (name, weights_sha256 of the pretrained weights the factors apply to,
backbone_kwargs), the feature, head, head_size, similarity, tune, the LoRA config (r, alpha, targets, rslora) and
the workdir. The merged tower (W + alpha / r B A) is made when the file is read (`merged_variables`).
"""
from __future__ import annotations

import json

import jax
import numpy as np

from visim_jax.core.errors import UserError
from visim_jax.models import lora as lora_lib
from visim_jax.training import runtime

VERSION = 1


def _key(kp) -> str:
  return '/'.join(str(getattr(k, 'key', k)) for k in kp)


def save(path: str, meta: dict, trainable: dict) -> None:
  """Writes tuned.npz atomically (process 0): `trainable` = {'lora': {path: {'a', 'b'}}} or {'tower': params},
  plus 'head' when a head was trained."""
  flat = {}
  for top, sub in trainable.items():
    if top == 'lora':
      flat.update({f'lora/{k}': np.asarray(v) for k, v in lora_lib.to_arrays(sub).items()})
    else:
      for kp, v in jax.tree_util.tree_flatten_with_path(sub)[0]:
        flat[f'{top}/{_key(kp)}'] = np.asarray(v)
  runtime.write_npz(path, **flat, meta=np.asarray(json.dumps({**meta, 'version': VERSION}, sort_keys=True,
                                                             default=str)))


def load(path: str) -> tuple[dict, dict]:
  """(meta, trainable) of a tuned.npz; a file that is not one is one UserError naming it."""
  try:
    with np.load(path, allow_pickle=False) as z:
      meta = json.loads(str(z['meta']))
      arrays = {k: z[k] for k in z.files if k != 'meta'}
  except Exception as e:  # pylint: disable=broad-except  (not a zip, truncated, no meta, pickles)
    raise UserError(f'{path}: not a readable tuned.npz ({type(e).__name__}: {" ".join(str(e).split())[:120]})') \
        from None
  if not isinstance(meta, dict) or not meta.get('backbone') or meta.get('tune') not in ('lora', 'full', 'frozen'):
    raise UserError(f'{path}: its meta names no backbone / tune mode: not written by a tune run')
  trainable: dict = {}
  lora = {k[len('lora/'):]: v for k, v in arrays.items() if k.startswith('lora/')}
  if lora:
    try:
      trainable['lora'] = {m: {k: np.asarray(v) for k, v in e.items()} for m, e in lora_lib.from_arrays(lora).items()}
    except UserError as e:
      raise UserError(f'{path}: {e}') from None
  for k, v in arrays.items():
    top, _, rest = k.partition('/')
    if top != 'lora':
      node = trainable.setdefault(top, {})
      *parents, leaf = rest.split('/')
      for p in parents:
        node = node.setdefault(p, {})
      node[leaf] = v
  return meta, trainable
