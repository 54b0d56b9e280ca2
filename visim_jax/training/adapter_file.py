"""One trained adaptation as a single portable file (paper 001, Sec. 3: PCA to 256-d, then a = ReLU(W d)).

The adaptation experiment keeps R runs together in Orbax checkpoints (W/checkpoints/<epoch>/); search and
notebooks want ONE run's adapter in one file, independent of Orbax and of the training code:

  adapter.npz: pca_mean (D,), pca_components (D, P), pca_scale (P,), w (P, A), all float32,
               meta: a JSON string {backbone, layers, weights_sha256, preprocessing, ...free keys}.

apply_adapter(adapter, feats) = relu(((feats - mean) @ components * scale) @ w), i.e. pca.transform then
adaptation.adapt: the vectors whose cosine similarity the experiment ranks with. Loading never unpickles
(np.load(allow_pickle=False)).

`from_workdir` (the command `python -m visim_jax.export --workdir=W`, visim_jax/export.py) converts the latest checkpoint of an adaptation workdir (configs/tll.py or configs/demo.py, paper 001) written
before the experiment saved adapter.npz itself (meta from W/metrics.json and the backbone named there). Any other
workdir (nights_adapt, which writes its own adapter.npz; benchmark, simnet, twoafc, ...) or a checkpoint that
is not an adaptation's is refused in one line saying what export takes. User errors (no workdir, no checkpoint, a
run out of range) end with one line `error: <path or flag>: <what to do>` and exit status 1.
"""
from __future__ import annotations

import json
import os
from typing import Any, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from visim_jax.core import cpu_kernels
from visim_jax.core import ops
from visim_jax.core.errors import UserError

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


@cpu_kernels.jit
def adapt_arrays(mean, components, scale, w, feats):
  """The pure math: relu(((feats - mean) @ components * scale) @ w), float32."""
  d = ((feats.astype(jnp.float32) - mean) @ components) * scale
  return jax.nn.relu(d @ w)


def apply_adapter(adapter: Adapter, feats) -> jax.Array:
  """Adapted vectors (N, A) of pooled backbone features (N, D)."""
  if feats.shape[-1] != adapter.in_dim:
    raise UserError(f'apply_adapter: features have dim {feats.shape[-1]}, the adapter expects {adapter.in_dim} '
                     f'(backbone {adapter.meta.get("backbone")!r}, layers {adapter.meta.get("layers")})')
  return adapt_arrays(adapter.mean, adapter.components, adapter.scale, adapter.w, feats)


def _check_arrays(mean, components, scale, w, source: str = 'adapter') -> tuple[np.ndarray, ...]:
  """float32 numpy copies, after checking the shapes chain and the values are finite (errors name `source`)."""
  arrs = [np.asarray(a, np.float32) for a in (mean, components, scale, w)]
  mean, components, scale, w = arrs
  names = ('pca_mean', 'pca_components', 'pca_scale', 'w')
  want_nd = (1, 2, 1, 2)
  for a, n, nd in zip(arrs, names, want_nd):
    if a.ndim != nd:
      raise UserError(f'{source}: {n} must have {nd} dims, got shape {a.shape} '
                       '(one run\'s adapter: index the run axis of a checkpoint first)')
    if not np.isfinite(a).all():
      raise UserError(f'{source}: {n} has NaN/Inf values')
  if components.shape[0] != mean.shape[0]:
    raise UserError(f'{source}: pca_components {components.shape} does not match pca_mean {mean.shape}')
  if scale.shape[0] != components.shape[1]:
    raise UserError(f'{source}: pca_scale {scale.shape} does not match pca_components {components.shape}')
  if w.shape[0] != components.shape[1]:
    raise UserError(f'{source}: w {w.shape} does not match pca_components {components.shape}')
  return mean, components, scale, w


def _check_meta(meta: Mapping[str, Any], source: str = 'adapter') -> dict:
  if not isinstance(meta, Mapping):
    raise UserError(f'{source}: meta must be a dict, got {type(meta).__name__}')
  missing = [k for k in META_KEYS if k not in meta]
  if missing:
    raise UserError(f'{source}: meta lacks {missing} (needed: {list(META_KEYS)}; None where unknown)')
  try:
    return json.loads(json.dumps(dict(meta)))
  except TypeError as e:
    raise UserError(f'{source}: meta is not JSON-serialisable ({e})') from None


def save_adapter(path: str, pca_mean, pca_components, pca_scale, w, meta: Mapping[str, Any]) -> str:
  """Writes one run's adapter as a single .npz (atomically); returns the path."""
  mean, comps, scale, w = _check_arrays(pca_mean, pca_components, pca_scale, w, source=path)
  meta = _check_meta(meta, source=path)
  meta = {**meta, 'adapter_version': ADAPTER_VERSION}
  ops.save_npz_atomic(path, pca_mean=mean, pca_components=comps, pca_scale=scale, w=w,
                  meta=np.asarray(json.dumps(meta, sort_keys=True)))
  return path


def load_adapter(path: str) -> Adapter:
  if not os.path.exists(path):
    raise UserError(f'{path}: adapter file not found (give the adapter.npz an adaptation run wrote)')
  try:
    with np.load(path, allow_pickle=False) as z:
      missing = [k for k in ('pca_mean', 'pca_components', 'pca_scale', 'w', 'meta') if k not in z.files]
      if missing:
        raise UserError(f'{path}: not an adapter file (missing arrays {missing})')
      arrays = [z[k] for k in ('pca_mean', 'pca_components', 'pca_scale', 'w')]
      meta = json.loads(str(z['meta']))
  except UserError:
    raise
  except Exception as e:  # zip errors, truncation, pickled or random bytes, bad JSON
    why = ('not an .npz of plain arrays (numpy takes it for pickled data, which is never loaded)'
           if 'pickle' in str(e) else f'{type(e).__name__}: {" ".join(str(e).split())[:200]}')
    raise UserError(f'{path}: unreadable adapter file ({why}); give the adapter.npz an adaptation run wrote') from None
  mean, comps, scale, w = _check_arrays(*arrays, source=path)
  return Adapter(mean, comps, scale, w, _check_meta(meta, source=path))


def run_arrays(out: Mapping[str, Any], run: int = 0, sigma: int = 0) -> dict[str, np.ndarray]:
  """save_adapter's array arguments for run `run` of adapt.train_all's output (or a restored checkpoint:
  {'params': {'w': (R, P, A), or (R, S, P, A) with one W per sigma}, 'pcas': {mean, components, scale} with a
  leading R axis}); `sigma` indexes the run's temperatures (config.sigmas) when W has that axis."""
  pcas = out['pcas']
  get = (lambda k: getattr(pcas, k)) if hasattr(pcas, '_fields') else (lambda k: pcas[k])
  runs = int(np.shape(out['params']['w'])[0])
  if not 0 <= run < runs:
    raise UserError(f'--run={run}: the training output holds runs 0..{runs - 1}')
  return {'pca_mean': np.asarray(get('mean'))[run], 'pca_components': np.asarray(get('components'))[run],
          'pca_scale': np.asarray(get('scale'))[run], 'w': _one_sigma(np.asarray(out['params']['w'])[run], sigma)}


def _one_sigma(w: np.ndarray, sigma: int) -> np.ndarray:
  if w.ndim == 2:
    return w
  if not 0 <= sigma < w.shape[0]:
    raise UserError(f'--sigma_index={sigma}: the training output holds sigmas 0..{w.shape[0] - 1} (config.sigmas)')
  return w[sigma]


def backbone_meta(backbone, layers=None, **extra) -> dict:
  """The meta of an adapter trained on `backbone`'s pooled `layers` (default: its default layers)."""
  return {'backbone': backbone.name, 'layers': list(layers or backbone.layers),
          'weights_sha256': backbone.weights_id, 'preprocessing': backbone.preprocess.describe(), **extra}


def check_backbone(adapter: Adapter, backbone, layers, source: str) -> None:
  """The adapter was trained on these features: same backbone, weights, layers and preprocessing."""
  meta = adapter.meta
  if meta.get('backbone') is None:
    return  # trained on a features file: nothing to compare but the dimension (checked when applied)
  ours = json.loads(json.dumps(backbone_meta(backbone, layers)))  # tuples -> lists, as stored
  for key in META_KEYS:
    if meta.get(key) is not None and meta[key] != ours[key]:
      raise UserError(f'{source}: meta.{key} = {meta[key]!r} but the search uses {ours[key]!r} '
                      f'(index with the backbone and layers the adapter was trained on)')


# --------------------------------------------------------------------------- checkpoint -> adapter.npz

def from_workdir(workdir: str, run: int = 0, out: str | None = None, sigma: int = 0) -> str:
  """Converts the latest Orbax checkpoint of an adaptation workdir into one run's adapter.npz."""
  import orbax.checkpoint as ocp
  if not os.path.isdir(workdir):
    raise UserError(f'--workdir: {workdir}: not a folder (give an adaptation workdir)')
  ckpt = os.path.join(os.path.abspath(workdir), 'checkpoints')
  metrics_path = os.path.join(workdir, 'metrics.json')
  if not os.path.isdir(ckpt):
    raise UserError(f'{ckpt}: no checkpoints folder (was config.checkpoint False? then the experiment '
                    'wrote adapter.npz itself)')
  meta = {k: None for k in META_KEYS}
  if os.path.exists(metrics_path):
    try:
      with open(metrics_path, encoding='utf-8') as f:
        m = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:
      raise UserError(f'{metrics_path}: unreadable ({e}); move it away to convert without its meta') from None
    if not isinstance(m, dict):
      raise UserError(f'{metrics_path}: not a run\'s metrics (a JSON object expected); move it away to convert '
                      'without its meta')
    if m.get('experiment', 'adapt') != 'adapt':
      wrote = [f for f in ('adapter.npz', 'triplet_head.npz', 'head.npz') if os.path.isfile(os.path.join(workdir, f))]
      own = (f'; it wrote {os.path.join(workdir, wrote[0])} itself' if wrote and m['experiment'] in (
          'nights_adapt', 'learn_triplets') else '')
      raise UserError(f'--workdir: {workdir}: a {m["experiment"]} workdir{own}; export takes the workdir of an '
                      'adaptation run (configs/tll.py or configs/demo.py, paper 001) with checkpoints/')
    meta.update({k: m.get(k) for k in ('backbone', 'layers', 'weights_sha256')})
    meta['source'] = {'workdir': os.path.abspath(workdir), 'dataset': m.get('dataset'), 'run': run}
    if meta['backbone']:
      from visim_jax.backbones import get_backbone
      meta['preprocessing'] = get_backbone(meta['backbone']).preprocess.describe()
  try:
    with ocp.CheckpointManager(ckpt) as mngr:
      step = mngr.latest_step()
      if step is None:
        raise UserError(f'{ckpt}: no finished checkpoint (the run was stopped before its first save)')
      saved = mngr.restore(step, args=ocp.args.StandardRestore())
    state = saved['state']
    params = state['params'] if isinstance(state, Mapping) else state[0]
    arrays = run_arrays({'params': params, 'pcas': saved['pca']}, run, sigma)
  except UserError:
    raise
  except Exception as e:  # pylint: disable=broad-except  (Orbax errors of a bad file, another run's layout)
    raise UserError(f'{ckpt}: not an adaptation checkpoint ({type(e).__name__}: {" ".join(str(e).split())[:160]}); '
                    'export takes the workdir of an adaptation run (configs/tll.py or configs/demo.py, paper 001)'
                    ) from None
  meta['source'] = {**(meta.get('source') or {}), 'epoch': int(step)}
  out = out or os.path.join(workdir, 'adapter.npz')
  try:
    return save_adapter(out, **arrays, meta=meta)
  except OSError as e:
    from visim_jax.training import runtime
    raise runtime.os_error(e, out, 'writing the adapter') from e
