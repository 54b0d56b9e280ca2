"""Triplets at scale without holding images: integer index files, their checks, and seeded shuffled batches.

An index file (.npz, written by `save`, read by `load`) holds triplets as rows of an image list whose features are
computed once (features.py's cache), and one kind of target:

  triplets      (N, 3) int32    rows of `images` (AligNet's `indices`)
  similarities  (N, 3) float32  teacher similarities [s_01, s_02, s_12] (AligNet's `similarities`; soft targets)
  odd           (N,) int32      the odd column 0 / 1 / 2 (THINGS choices; hard targets)
  judge         (N,) float32    2AFC: fraction of humans choosing column 2 over column 1 as closer to column 0
  images        (M,) str        the image list (paths or names)
  meta          JSON string     who wrote it (teacher, sampling, seed...)

`load` checks everything before any use: the keys, shapes and dtypes, every index in 0..M-1, finite targets, odd in
{0, 1, 2}, judge in [0, 1]; a bad file is one line naming it (errors.UserError).

Batches (`Stream`): step s (0-based) of a run reads rows perm_e[p B : (p + 1) B] of the triplet table, e = s // K,
p = s % K, K = N // B steps per epoch (the last partial batch of an epoch is dropped, so every step has one shape),
perm_e = a permutation of 0..N-1 seeded by (seed, e) (NumPy's PCG64 from SeedSequence([seed, e]): 2.6 s for 10M
triplets on this box's CPU, where jax.random.permutation takes 35 s). A step's batch depends on (seed, s) only, so a
resumed run reads exactly the batches an uninterrupted one reads. Only the (steps, B) row indices of a chunk go to
the devices; the triplet table, its targets and the feature table are put there once.
"""
from __future__ import annotations

import dataclasses
import json
import os

import numpy as np

from visim_jax.core import ops, readers
from visim_jax.core.errors import UserError

TARGETS = ('similarities', 'odd', 'judge')
VERSION = 1


@dataclasses.dataclass(frozen=True)
class TripletSet:
  triplets: np.ndarray                # (N, 3) int32
  target_kind: str                    # one of TARGETS
  target: np.ndarray                  # (N, 3) float32 | (N,) int32 | (N,) float32
  images: list                        # M image paths or names
  meta: dict = dataclasses.field(default_factory=dict)

  def __len__(self) -> int:
    return len(self.triplets)


def save(path: str, s: TripletSet) -> None:
  """Writes an index file atomically (the format above)."""
  meta = {**s.meta, 'version': VERSION}
  ops.save_npz_atomic(path, triplets=np.asarray(s.triplets, np.int32), **{s.target_kind: s.target},
                      images=np.asarray(list(s.images), dtype=str), meta=np.asarray(json.dumps(meta, sort_keys=True)))


def load(path: str, n_rows: int | None = None, field: str = '') -> TripletSet:
  """An index file, checked (see the module docstring); n_rows: the feature table's rows (default: len(images));
  field: the config field that named it (its errors' head)."""
  if not os.path.isfile(path):
    raise UserError(f'{path}: triplet index file not found')
  data = readers.load_npz(path, 'triplet index file', 'write index files with learn_triplets '
                          '--config.generate_only=True, or triplet_index.save', f'{field}: {path}' if field else '')
  kinds = [k for k in TARGETS if k in data]
  missing = [k for k in ('triplets', 'images') if k not in data]
  if missing or len(kinds) != 1:
    raise UserError(f'{path}: a triplet index file holds triplets, images and exactly one of {TARGETS} '
                    f'(has {sorted(data)})')
  tri, images = data['triplets'], data['images']
  if tri.ndim != 2 or tri.shape[1] != 3 or tri.dtype.kind not in 'iu' or not len(tri):
    raise UserError(f'{path}: triplets must be a non-empty (N, 3) integer array, got {tri.dtype} {tri.shape}')
  if images.ndim != 1 or images.dtype.kind != 'U':
    raise UserError(f'{path}: images must be a 1-D array of strings, got {images.dtype} {images.shape}')
  m = len(images) if n_rows is None else n_rows
  bad = (tri < 0) | (tri >= m)
  if bad.any():
    t = int(np.argmax(bad.any(1)))
    raise UserError(f'{path}: triplet {t} has index {tri[t].tolist()} outside 0..{m - 1} (the image list has '
                    f'{m} rows); {int(bad.any(1).sum())} triplet(s) out of range')
  if (tri[:, 0] == tri[:, 1]).any() or (tri[:, 0] == tri[:, 2]).any() or (tri[:, 1] == tri[:, 2]).any():
    t = int(np.argmax((tri[:, 0] == tri[:, 1]) | (tri[:, 0] == tri[:, 2]) | (tri[:, 1] == tri[:, 2])))
    raise UserError(f'{path}: triplet {t} repeats an image ({tri[t].tolist()}); the three images must differ')
  kind = kinds[0]
  y = data[kind]
  want = (len(tri), 3) if kind == 'similarities' else (len(tri),)
  if y.shape != want or y.dtype.kind not in ('iu' if kind == 'odd' else 'iuf'):
    raise UserError(f'{path}: {kind} must have shape {want} ({"integers" if kind == "odd" else "numbers"}), got '
                    f'{y.dtype} {y.shape}')
  if kind == 'odd' and not np.isin(y, (0, 1, 2)).all():
    raise UserError(f'{path}: odd must be 0, 1 or 2 (the odd column); triplet {int(np.argmax(~np.isin(y, (0, 1, 2))))}'
                    f' has {y[~np.isin(y, (0, 1, 2))][0]}')
  if kind != 'odd' and not np.isfinite(y).all():
    raise UserError(f'{path}: {kind} has non-finite values (triplet {int(np.argmax(~np.isfinite(y).reshape(len(y), -1).all(1)))})')
  if kind == 'judge' and ((y < 0) | (y > 1)).any():
    raise UserError(f'{path}: judge must be in [0, 1] (a fraction of votes)')
  try:
    meta = json.loads(str(data['meta'])) if 'meta' in data else {}
  except ValueError:
    raise UserError(f'{path}: meta is not JSON') from None
  y = y.astype(np.int32 if kind == 'odd' else np.float32)
  return TripletSet(tri.astype(np.int32), kind, y, images.tolist(), meta)


# ----------------------------------------------------------------------------------------------- batches

def epoch_permutation(seed: int, epoch: int, n: int) -> np.ndarray:
  """The epoch's order of the n triplets: PCG64 seeded by SeedSequence([seed, epoch]) (int32)."""
  return np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed), int(epoch)]))).permutation(
      n).astype(np.int32)


class Stream:
  """Row indices of every step's batch (see the module docstring); keeps the permutations of two epochs."""

  def __init__(self, n: int, batch_size: int, seed: int):
    if batch_size > n:
      raise ValueError(f'batch_size {batch_size} exceeds the {n} triplets')
    self.n, self.batch_size, self.seed = n, batch_size, seed
    self.steps_per_epoch = n // batch_size
    self._perms: dict[int, np.ndarray] = {}

  def _perm(self, epoch: int) -> np.ndarray:
    if epoch not in self._perms:
      if len(self._perms) >= 2:
        self._perms.pop(min(self._perms))
      self._perms[epoch] = epoch_permutation(self.seed, epoch, self.n)
    return self._perms[epoch]

  def rows(self, step0: int, n_steps: int) -> np.ndarray:
    """(n_steps, B) int32: the triplet rows of steps step0 .. step0 + n_steps - 1 (0-based)."""
    out = np.empty((n_steps, self.batch_size), np.int32)
    for i in range(n_steps):
      e, p = divmod(step0 + i, self.steps_per_epoch)
      out[i] = self._perm(e)[p * self.batch_size:(p + 1) * self.batch_size]
    return out


# ----------------------------------------------------------------------------------------------- memory

def memory_bytes(n_train: int, n_val: int, n_images: int, dim: int, emb: int, batch: int, steps_per_chunk: int,
                 target_cols: int, devices: int = 1) -> dict[str, int]:
  """What a run holds at once (bytes; a lower bound, XLA's temporaries come on top). Host: the triplet tables and
  targets, two epoch permutations, the features. Device (each): the replicated features and triplet tables, one
  chunk of batch rows, and the step's gathered rows and embeddings (3 per triplet, forward + backward) for its
  share of the batch."""
  f4 = 4
  tables = (n_train + n_val) * (3 + target_cols) * f4
  host = tables + 2 * n_train * f4 + n_images * dim * f4
  per_dev_batch = -(-batch // devices)
  device = (n_images * dim * f4 + tables + steps_per_chunk * batch * f4
            + 2 * per_dev_batch * 3 * (dim + emb) * f4 + n_images * emb * f4)
  return {'host': int(host), 'device': int(device)}


def check_memory(parts: dict[str, int], device_limit: int, host_limit: int, field='config.batch_size') -> None:
  """Refuses (nothing allocated) a run whose estimate exceeds 90% of the device's or the host's memory, naming
  `field`, or for each side the fields that drive it ({'host' | 'device': core.memory.drivers(...)}), largest first."""
  for where, limit in (('device', device_limit), ('host', host_limit)):
    if parts[where] > 0.9 * limit:
      ranked = field.get(where) if isinstance(field, dict) else None
      if ranked:
        keep = [f for i, (f, b) in enumerate(ranked.items()) if i == 0 or b >= 0.01 * parts[where]]
        head, lower = keep[0], 'lower ' + ' or '.join(f'{f} ({ranked[f] / 2**30:,.2f} GiB of it)' for f in keep)
      else:
        head, lower = (field if isinstance(field, str) else 'config.batch_size'), \
            'use fewer triplets or images, or a smaller batch'
      raise UserError(f'{head}: this run needs at least {parts[where] / 2**30:,.2f} GiB of {where} memory, more '
                      f'than 90% of the {limit / 2**30:,.1f} GiB available; {lower}')


def host_memory_bytes() -> int:
  return int(os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES'))


# ------------------------------------------------------------------------------------ human judgement sets

def from_twoafc(train, val) -> tuple[TripletSet, TripletSet]:
  """NIGHTS / BAPPS 2AFC sets (data.judgements.TwoAFCSet) as index sets over one image list: columns (ref, p0, p1),
  target judge = the fraction of humans choosing p1 (DreamSim's right_vote)."""
  images = list(dict.fromkeys(train.paths() + val.paths()))
  index = {p: i for i, p in enumerate(images)}
  out = []
  for s in (train, val):
    tri = np.stack(s.rows(index), 1).astype(np.int32)
    out.append(TripletSet(tri, 'judge', np.asarray(s.judge, np.float32), images, {'source': s.name}))
  return out[0], out[1]


def from_odd_one_out(s, val_fraction: float, seed: int) -> tuple[TripletSet, TripletSet]:
  """THINGS odd-one-out choices (data.judgements.OddOneOutSet) split into train / held-out triplets by a seeded
  permutation (THINGS has no train / val split of its own in the forms read here)."""
  n = len(s)
  n_val = int(round(n * val_fraction))
  if n_val < 1 or n - n_val < 1:
    raise ValueError(f'val_fraction={val_fraction} leaves {n - n_val} train / {n_val} held-out of {n} triplets')
  perm = np.random.default_rng([seed, 4]).permutation(n)
  part = lambda idx: TripletSet(np.asarray(s.triplets, np.int32)[idx], 'odd', np.asarray(s.odd, np.int32)[idx],
                                list(s.images), {'source': s.name, 'file': s.source})
  return part(np.sort(perm[n_val:])), part(np.sort(perm[:n_val]))
