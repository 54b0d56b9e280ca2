"""One trained adaptation as a single portable file (paper 001, Sec. 3: PCA to 256-d, then a = ReLU(W d)).

The adaptation experiment keeps R runs together in Orbax checkpoints (W/checkpoints/<epoch>/); search and
notebooks want ONE run's adapter in one file, independent of Orbax and of the training code:

  adapter.npz: pca_mean (D,), pca_components (D, P), pca_scale (P,), w (P, A), all float32,
               meta: a JSON string {backbone, layers, weights_sha256, preprocessing, ...free keys}.

apply_adapter(adapter, feats) = relu(((feats - mean) @ components * scale) @ w), i.e. pca.transform then
adaptation.adapt: the vectors whose cosine similarity the experiment ranks with. Loading never unpickles
(np.load(allow_pickle=False)).

  python -m visim_jax.export --workdir=W [--run=0] [--out=W/adapter.npz]

converts the latest checkpoint of an adaptation workdir written before the experiment saved adapter.npz
itself (meta from W/metrics.json and the backbone named there).
"""
from __future__ import annotations

import argparse
import json
import os
from typing import Any, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

ADAPTER_VERSION = 1
META_KEYS = ('backbone', 'layers', 'weights_sha256', 'preprocessing')


class Adapter(NamedTuple):
  mean: np.ndarray        # (D,)
  components: np.ndarray  # (D, P)
  scale: np.ndarray       # (P,)
  w: np.ndarray           # (P, A)
  meta: dict

  @property
  def in_dim(self) -> int:
    return int(self.mean.shape[0])

  @property
  def out_dim(self) -> int:
    return int(self.w.shape[1])


@jax.jit
def adapt_arrays(mean, components, scale, w, feats):
  """The pure math: relu(((feats - mean) @ components * scale) @ w), float32."""
  d = ((feats.astype(jnp.float32) - mean) @ components) * scale
  return jax.nn.relu(d @ w)


def apply_adapter(adapter: Adapter, feats) -> jax.Array:
  """Adapted vectors (N, A) of pooled backbone features (N, D)."""
  if feats.shape[-1] != adapter.in_dim:
    raise ValueError(f'apply_adapter: features have dim {feats.shape[-1]}, the adapter expects {adapter.in_dim} '
                     f'(backbone {adapter.meta.get("backbone")!r}, layers {adapter.meta.get("layers")})')
  return adapt_arrays(adapter.mean, adapter.components, adapter.scale, adapter.w, feats)


def check_arrays(mean, components, scale, w, source: str = 'adapter') -> tuple[np.ndarray, ...]:
  """float32 numpy copies, after checking the shapes chain and the values are finite (errors name `source`)."""
  arrs = [np.asarray(a, np.float32) for a in (mean, components, scale, w)]
  mean, components, scale, w = arrs
  names = ('pca_mean', 'pca_components', 'pca_scale', 'w')
  want_nd = (1, 2, 1, 2)
  for a, n, nd in zip(arrs, names, want_nd):
    if a.ndim != nd:
      raise ValueError(f'{source}: {n} must have {nd} dims, got shape {a.shape} '
                       '(one run\'s adapter: index the run axis of a checkpoint first)')
    if not np.isfinite(a).all():
      raise ValueError(f'{source}: {n} has NaN/Inf values')
  if components.shape[0] != mean.shape[0]:
    raise ValueError(f'{source}: pca_components {components.shape} does not match pca_mean {mean.shape}')
  if scale.shape[0] != components.shape[1]:
    raise ValueError(f'{source}: pca_scale {scale.shape} does not match pca_components {components.shape}')
  if w.shape[0] != components.shape[1]:
    raise ValueError(f'{source}: w {w.shape} does not match pca_components {components.shape}')
  return mean, components, scale, w


def check_meta(meta: Mapping[str, Any], source: str = 'adapter') -> dict:
  if not isinstance(meta, Mapping):
    raise ValueError(f'{source}: meta must be a dict, got {type(meta).__name__}')
  missing = [k for k in META_KEYS if k not in meta]
  if missing:
    raise ValueError(f'{source}: meta lacks {missing} (needed: {list(META_KEYS)}; None where unknown)')
  try:
    return json.loads(json.dumps(dict(meta)))
  except TypeError as e:
    raise ValueError(f'{source}: meta is not JSON-serialisable ({e})') from None


def save_adapter(path: str, pca_mean, pca_components, pca_scale, w, meta: Mapping[str, Any]) -> str:
  """Writes one run's adapter as a single .npz (atomically); returns the path."""
  from visim_jax.features import save_npz_atomic
  mean, comps, scale, w = check_arrays(pca_mean, pca_components, pca_scale, w, source=path)
  meta = check_meta(meta, source=path)
  meta = {**meta, 'adapter_version': ADAPTER_VERSION}
  save_npz_atomic(path, pca_mean=mean, pca_components=comps, pca_scale=scale, w=w,
                  meta=np.asarray(json.dumps(meta, sort_keys=True)))
  return path


def load_adapter(path: str) -> Adapter:
  if not os.path.exists(path):
    raise FileNotFoundError(f'{path}: adapter file not found')
  try:
    with np.load(path, allow_pickle=False) as z:
      missing = [k for k in ('pca_mean', 'pca_components', 'pca_scale', 'w', 'meta') if k not in z.files]
      if missing:
        raise ValueError(f'{path}: not an adapter file (missing arrays {missing})')
      arrays = [z[k] for k in ('pca_mean', 'pca_components', 'pca_scale', 'w')]
      meta = json.loads(str(z['meta']))
  except ValueError:
    raise
  except Exception as e:  # zip errors, truncation, bad JSON
    raise ValueError(f'{path}: unreadable adapter file ({type(e).__name__}: {e})') from None
  mean, comps, scale, w = check_arrays(*arrays, source=path)
  return Adapter(mean, comps, scale, w, check_meta(meta, source=path))


def run_arrays(out: Mapping[str, Any], run: int = 0) -> dict[str, np.ndarray]:
  """save_adapter's array arguments for run `run` of adapt.train_all's output (or a restored checkpoint:
  {'params': {'w': (R, P, A)}, 'pcas': {mean, components, scale} with a leading R axis})."""
  pcas = out['pcas']
  get = (lambda k: getattr(pcas, k)) if hasattr(pcas, '_fields') else (lambda k: pcas[k])
  runs = int(np.shape(out['params']['w'])[0])
  if not 0 <= run < runs:
    raise ValueError(f'run={run}: the training output holds runs 0..{runs - 1}')
  return {'pca_mean': np.asarray(get('mean'))[run], 'pca_components': np.asarray(get('components'))[run],
          'pca_scale': np.asarray(get('scale'))[run], 'w': np.asarray(out['params']['w'])[run]}


def backbone_meta(backbone, layers=None, **extra) -> dict:
  """The meta of an adapter trained on `backbone`'s pooled `layers` (default: its default layers)."""
  return {'backbone': backbone.name, 'layers': list(layers or backbone.layers),
          'weights_sha256': backbone.weights_id, 'preprocessing': backbone.preprocess.describe(), **extra}


# --------------------------------------------------------------------------- checkpoint -> adapter.npz

def from_workdir(workdir: str, run: int = 0, out: str | None = None) -> str:
  """Converts the latest Orbax checkpoint of an adaptation workdir into one run's adapter.npz."""
  import orbax.checkpoint as ocp
  ckpt = os.path.join(os.path.abspath(workdir), 'checkpoints')
  metrics_path = os.path.join(workdir, 'metrics.json')
  if not os.path.isdir(ckpt):
    raise FileNotFoundError(f'{ckpt}: no checkpoints folder (was config.checkpoint False?)')
  meta = {k: None for k in META_KEYS}
  if os.path.exists(metrics_path):
    with open(metrics_path) as f:
      m = json.load(f)
    meta.update({k: m.get(k) for k in ('backbone', 'layers', 'weights_sha256')})
    meta['source'] = {'workdir': os.path.abspath(workdir), 'dataset': m.get('dataset'), 'run': run}
    if meta['backbone']:
      from visim_jax.backbones import get_backbone
      meta['preprocessing'] = get_backbone(meta['backbone']).preprocess.describe()
  with ocp.CheckpointManager(ckpt) as mngr:
    step = mngr.latest_step()
    if step is None:
      raise FileNotFoundError(f'{ckpt}: no finished checkpoint')
    saved = mngr.restore(step, args=ocp.args.StandardRestore())
  state = saved['state']
  params = state['params'] if isinstance(state, Mapping) else state[0]
  meta['source'] = {**(meta.get('source') or {}), 'epoch': int(step)}
  out = out or os.path.join(workdir, 'adapter.npz')
  return save_adapter(out, **run_arrays({'params': params, 'pcas': saved['pca']}, run), meta=meta)


def main(argv=None):
  p = argparse.ArgumentParser(prog='python -m visim_jax.export', description=__doc__.split('\n')[0])
  p.add_argument('--workdir', required=True, help='an adaptation workdir with checkpoints/')
  p.add_argument('--run', type=int, default=0, help='which run of the R trained runs')
  p.add_argument('--out', default=None, help='output .npz (default WORKDIR/adapter.npz)')
  a = p.parse_args(argv)
  path = from_workdir(a.workdir, a.run, a.out)
  ad = load_adapter(path)
  print(f'{path}: {ad.in_dim} -> {ad.components.shape[1]} (PCA) -> {ad.out_dim}, backbone {ad.meta["backbone"]}')


if __name__ == '__main__':
  main()
