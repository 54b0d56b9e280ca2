"""The one training runtime every experiment uses: workdir lock, fingerprint, Orbax checkpoints, chunked loop.

The stable API (adaptation, SimNet and the 2AFC context models train through exactly this):

  fp = runtime.fingerprint(fields, arrays)        # what the run depends on: a dict of config fields + data
  with runtime.Run(workdir, config.to_dict(), fp) as run:    # lock, refuse a changed config (nothing written yet)
    tree, start = run.restore(template)            # newest *valid* checkpoint, or (template, 0)
    tree = run.loop(tree, chunk_fn, start, end, every=n, save_every=m)
    run.write_metrics(metrics)                     # metrics.json (+ the fingerprint it was computed under)

- `chunk_fn(tree, step0, n) -> (tree, scalars)` runs steps step0+1 .. step0+n in one jitted call. `tree` is
  everything a resume needs (params, optimiser state, loss history...); `scalars` maps a TensorBoard tag to a
  float (written at the chunk's last step) or an (n,) array (one value per step). A non-finite 'loss'-tagged
  scalar stops the run. After each chunk whose end is a multiple of `save_every` (and at `end`) the tree is
  saved with Orbax, so a run killed at any moment resumes at its last saved step and ends bit-identical.
- The Orbax CheckpointManager is called on EVERY process (a multi-host save is collective); process 0 alone
  writes config.json, fingerprint.json, metrics.json, TensorBoard events and plots.
- `Run.__enter__`, in this order, before anything is written: the workdir is checked (a file, a broken link,
  not creatable or not writable -> one-line UserError naming it), an exclusive flock on `<workdir>/.lock` is
  taken for the whole run (a second run gets a UserError naming the holder's pid and host; the kernel drops
  the lock of a dead process, so a stale lock file is simply taken over), and when checkpoints exist their
  fingerprint must match (else a UserError naming the workdir and the differing fields: a refused run leaves
  the workdir untouched). Nothing is written on entry: config.json and fingerprint.json are written just before
  the run's first result (checkpoint, TensorBoard scalars or metrics.json; visim_jax/training/workdir.py `Record`), and a
  run that fails before a checkpoint or metrics.json landed puts back the ones it found.
- `workdir_lock(workdir)` (training/workdir.py) takes that lock for a whole command (main.py: a busy workdir is
  refused before hours of feature extraction); a `Run` inside it re-enters the held lock.
- `restore` skips a corrupt newest step (logs which and why, deletes it) and takes the newest valid one.
- `run.track_data(iterator)` (before `restore`): a grain DatasetIterator whose state is saved in every checkpoint
  beside the tree (item 'data', grain's Orbax handler: one JSON file per process) and restored with it, so a
  resumed run reads the batches an uninterrupted one reads. The tree is each step's item 'default' (checkpoints
  without a tracked iterator restore as before).
- A failed save (an OSError: a full disk) leaves no partial step nor temporary folder: one line names the folder.
- Tests inject faults through `FAULT_HOOK(phase, step, directory)`, called at the save phases 'before_save',
  'during_save' (the Orbax write in flight) and 'after_save'; production code never sets it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
from typing import Any, Callable, Mapping, Sequence

import numpy as np
from absl import logging

from visim_jax.training import compile_cache
from visim_jax.core import ops, report
from visim_jax.core.errors import UserError
from visim_jax.training.workdir import OUTER, Record, acquire, check_experiment, os_error, release, workdir_lock  # noqa: F401

# Test-only fault injection: FAULT_HOOK(phase, step, checkpoint_dir); phases in SAVE_PHASES.
FAULT_HOOK: Callable[[str, int, str], None] | None = None
SAVE_PHASES = ('before_save', 'during_save', 'after_save')
_TMP_MARK = '.orbax-checkpoint-tmp'


def _hook(phase: str, step: int, directory: str) -> None:
  if FAULT_HOOK is not None:
    FAULT_HOOK(phase, step, directory)


def say(msg: str) -> None:
  """One line of what the program is doing, on process 0 (the console stays short: no logging prefixes)."""
  if report.is_writer():
    print(msg, flush=True)


# ------------------------------------------------------------------------------------------ fingerprint

@dataclasses.dataclass(frozen=True)
class Fingerprint:
  digest: str          # 20 hex characters over fields + data
  fields: dict         # the JSON-normalised config fields the run depends on
  data_sha256: str     # the training data
  data_parts: dict = dataclasses.field(default_factory=dict)   # {name: 'dtype(shape) sha256[:16]'} of named arrays

  def record(self) -> dict:
    out = {'fingerprint': self.digest, 'data_sha256': self.data_sha256, 'fields': self.fields}
    return {**out, 'data_parts': self.data_parts} if self.data_parts else out


def fingerprint(fields: Mapping[str, Any], arrays: Sequence[Any] | Mapping[str, Any] = ()) -> Fingerprint:
  """The run's identity: the config fields that change its result and the bytes of its data arrays. Arrays given
  by name ({'train triplets': a, ...}, in a fixed order) are also recorded one by one, so that a refused rerun names
  the ones that differ (the digest is the same as for the same arrays in a sequence)."""
  fields = json.loads(json.dumps(dict(fields), sort_keys=True, default=str))
  named = isinstance(arrays, Mapping)
  h, parts = hashlib.sha256(), {}
  for name, a in (arrays.items() if named else enumerate(arrays)):
    if a is not None:
      a = np.ascontiguousarray(a)
      head = f'{a.dtype}{a.shape}'.encode()
      h.update(head)
      h.update(a.tobytes())
      if named:
        parts[name] = f'{a.dtype}{list(a.shape)} {hashlib.sha256(head + a.tobytes()).hexdigest()[:16]}'
  data = h.hexdigest()
  digest = hashlib.sha256((json.dumps(fields, sort_keys=True) + data).encode()).hexdigest()[:20]
  return Fingerprint(digest, fields, data, parts)


def _diff(old: dict, new: Fingerprint) -> str:
  of, nf = old.get('fields', {}), new.fields
  keys = sorted(set(of) | set(nf))
  changed = [f'config.{k} ({of.get(k, "unset")!r} -> {nf.get(k, "unset")!r})' for k in keys if of.get(k) != nf.get(k)]
  if old.get('data_sha256') != new.data_sha256:
    op = old.get('data_parts') or {}
    if op and new.data_parts:
      for name in dict.fromkeys([*new.data_parts, *op]):
        a, b = op.get(name), new.data_parts.get(name)
        if a != b:
          sa, sb = (x.rsplit(' ', 1)[0] if x else 'none' for x in (a, b))
          changed.append(f'the {name} differ ({sa} -> {sb})' if sa != sb else f'the {name} differ (same shape, '
                         'other values)')
    else:   # a record written before data_parts, or arrays given without names
      changed.append('the data differ (' + (', '.join(new.data_parts) if new.data_parts else 'the arrays the run '
                                            'reads: features, labels or judgements') + ')')
  return ', '.join(changed) or 'fingerprint differs'


# ----------------------------------------------------------------------------------------------- checks

# --------------------------------------------------------------------------------------------- the run

class Run:
  """One training run in one workdir (a context manager; see the module docstring)."""

  def __init__(self, workdir: str, record: Mapping, fp: Fingerprint, checkpoint: bool = True,
               progress: bool = True, desc: str = 'train', max_to_keep: int = 2):
    """record: the run's config as a plain dict (config.json), written last with fingerprint.json."""
    self.workdir = os.path.abspath(workdir)
    self.fp, self.progress, self.desc = fp, progress, desc
    self.ckpt_dir = os.path.join(self.workdir, 'checkpoints') if checkpoint else None
    self.max_to_keep = max_to_keep
    self._locked = None
    self._mngr = None
    self._data = None   # a tracked grain iterator (track_data)
    self._writer = None
    self._bar = None  # one progress bar across the loops (phases) of the run
    self.record = Record(self.workdir, record, fp.record())  # config.json + fingerprint.json, written last

  # ---------------------------------------------------------------- enter / exit
  def __enter__(self) -> 'Run':
    ops.check_writable_dir(self.workdir, 'workdir')
    self._lock()
    try:
      self._check_fingerprint()
      if self.ckpt_dir:
        self._open_manager()
    except BaseException:
      self._unlock()
      raise
    return self

  def __exit__(self, *exc) -> None:
    try:
      if exc[0] is not None:
        self.record.put_back()  # a run that failed before keeping a result leaves the record as it was
      if self._mngr is not None:
        with contextlib.suppress(Exception):
          self._mngr.wait_until_finished()
        self._mngr.close()
        self._mngr = None
      if self._writer is not None:
        self._writer.close()
        self._writer = None
      if self._bar is not None:
        self._bar.close()
        self._bar = None
      if self.ckpt_dir and report.is_writer():
        _remove_tmp_dirs(self.ckpt_dir)
    finally:
      self._unlock()

  def _lock(self) -> None:
    if self.workdir not in OUTER:  # inside workdir_lock the command already holds it
      self._locked = acquire(self.workdir)

  def _unlock(self) -> None:
    if self._locked is not None:
      release(self._locked)
      self._locked = None

  def _check_fingerprint(self) -> None:
    # checked whenever checkpoints are on disk, even for a run that does not checkpoint: it rewrites
    # fingerprint.json, which must keep describing the checkpoints beside it
    if not _steps_on_disk(os.path.join(self.workdir, 'checkpoints')):
      return
    fp_file = os.path.join(self.workdir, 'fingerprint.json')
    try:
      with open(fp_file) as f:
        old = json.load(f)
    except (OSError, ValueError):
      old = None
    if old is None:
      raise UserError(f'{self.workdir}: holds checkpoints without a readable fingerprint.json (another program or '
                      'version wrote them); use a new --workdir or delete its checkpoints/')
    if old.get('fingerprint') != self.fp.digest:
      raise UserError(f'{self.workdir}: holds checkpoints of a different config or data ({_diff(old, self.fp)}); '
                      'use a new --workdir, or delete its checkpoints/ to start over')

  def _open_manager(self) -> None:
    import orbax.checkpoint as ocp
    if report.is_writer():
      _remove_tmp_dirs(self.ckpt_dir)
    try:
      self._mngr = ocp.CheckpointManager(self.ckpt_dir, item_names=('default', 'data'),
                                         options=ocp.CheckpointManagerOptions(
          max_to_keep=self.max_to_keep, cleanup_tmp_directories=True))
    except OSError as e:
      raise os_error(e, self.ckpt_dir, 'opening the checkpoint folder') from e

  # ---------------------------------------------------------------- checkpoints
  def track_data(self, iterator) -> None:
    """Saves and restores the grain iterator's state with every checkpoint (module docstring)."""
    self._data = iterator

  def restore(self, template):
    """(tree, step) from the newest valid checkpoint, or (template, 0) when there is none.

    `template` is the tree to restore into: numpy arrays come back as numpy, jax.ShapeDtypeStruct (with a
    sharding) as global jax arrays. A step that cannot be restored is logged, deleted and skipped.
    """
    if self._mngr is None:
      return template, 0
    import orbax.checkpoint as ocp
    for step in sorted(self._mngr.all_steps(), reverse=True):
      try:
        args = {'default': ocp.args.StandardRestore(template)}
        if self._data is not None:
          if not os.path.isdir(os.path.join(self.ckpt_dir, str(step), 'data')):
            raise UserError(f'{self.ckpt_dir}: step {step} holds no data iterator state (an older version wrote '
                            'it); use a new --workdir, or delete its checkpoints/ to start over')
          import grain
          args['data'] = grain.checkpoint.CheckpointRestore(self._data)
        tree = self._mngr.restore(step, args=ocp.args.Composite(**args))['default']
      except UserError:
        raise
      except Exception as e:  # truncated / garbled files, missing arrays, wrong shapes
        why = ' '.join(f'{type(e).__name__}: {e}'.split())[:300]
        logging.warning('checkpoint step %d in %s is unreadable (%s): skipped and deleted', step, self.ckpt_dir, why)
        say(f'checkpoint step {step} is unreadable ({why[:120]}); skipped, resuming from an earlier step')
        self._mngr.delete(step)
        continue
      say(f'resuming from step {step} ({self.ckpt_dir})')
      return tree, int(step)
    return template, 0

  def save(self, step: int, tree) -> None:
    """Saves `tree` at `step` on every process; a failed save leaves no trace of that step."""
    if self._mngr is None:
      return
    import orbax.checkpoint as ocp
    self.record.write()
    _hook('before_save', step, self.ckpt_dir)
    try:
      args = {'default': ocp.args.StandardSave(tree)}
      if self._data is not None:
        import grain
        args['data'] = grain.checkpoint.CheckpointSave(self._data)
      self._mngr.save(step, args=ocp.args.Composite(**args))
      _hook('during_save', step, self.ckpt_dir)
      self._mngr.wait_until_finished()
    except BaseException as e:
      with contextlib.suppress(Exception):
        self._mngr.wait_until_finished()
      with contextlib.suppress(Exception):
        self._mngr.reload()
        if step in self._mngr.all_steps():
          self._mngr.delete(step)
      if report.is_writer():
        _remove_tmp_dirs(self.ckpt_dir)
      cause = _os_cause(e)  # Orbax's background writer may wrap the OSError
      if cause is not None:
        raise os_error(cause, self.ckpt_dir, f'saving checkpoint step {step}') from e
      raise
    self.record.kept = True
    _hook('after_save', step, self.ckpt_dir)

  # ---------------------------------------------------------------- the loop
  def loop(self, tree, chunk_fn, start: int, end: int, every: int, save_every: int | None = None,
           total: int | None = None):
    """`loop` with this run's checkpoints, TensorBoard scalars and progress setting."""
    return loop(tree, chunk_fn, start, end, every, save_every, total, run=self, progress=self.progress,
                desc=self.desc)

  def bar(self, total: int, initial: int = 0):
    """This run's one progress bar (made on first use): every loop and later phase of the run moves it."""
    if self._bar is None:
      from tqdm.auto import tqdm
      self._bar = tqdm(total=total, initial=initial, desc=self.desc, unit='step', dynamic_ncols=True,
                       disable=not (self.progress and report.is_writer()))
    return self._bar

  def phase(self, name: str, n: int = 1, total: int | None = None) -> None:
    """Marks a phase after the loops (evaluation, ensembles, plots) on the same bar: names it, then moves the bar
    on by n when the caller's `with` block ends (`with run.phase('ensembles', n): ...`)."""
    return _Phase(self.bar(total or n), name, n)

  # ---------------------------------------------------------------- outputs
  def scalars(self, step0: int, n: int, scalars: Mapping[str, np.ndarray]) -> None:
    """TensorBoard scalars of steps step0+1..step0+n ((n,) arrays per step, scalars at the last step)."""
    if not report.is_writer():
      return
    if self._writer is None:
      self.record.write()
      self._writer = report.metric_writer(self.workdir)
    for k, v in scalars.items():
      v = np.asarray(v, np.float64).reshape(-1)
      if len(v) == n and n > 1:
        for i, x in enumerate(v):
          self._writer.write_scalars(step0 + 1 + i, {k: x})
      else:
        self._writer.write_scalars(step0 + n, {k: float(v.mean())})
    self._writer.flush()

  def write_metrics(self, metrics: dict) -> dict:
    """metrics.json (process 0) with the fingerprint it was computed under; returns the dict written."""
    from visim_jax.core import precision  # pylint: disable=g-import-not-at-top
    metrics = {**metrics, 'fingerprint': self.fp.digest, 'matmul_precision': precision.in_effect()}
    self.record.write()
    self.record.kept = True
    if 'timing_s' in metrics:
      metrics['timing_s'] = compile_cache.report(metrics['timing_s'])
    try:
      report.write_json(os.path.join(self.workdir, 'metrics.json'), metrics)
    except OSError as e:
      raise os_error(e, os.path.join(self.workdir, 'metrics.json'), 'writing metrics.json') from e
    return metrics

  def path(self, *parts: str) -> str:
    return os.path.join(self.workdir, *parts)


def loop(tree, chunk_fn, start: int, end: int, every: int, save_every: int | None = None,
         total: int | None = None, run: Run | None = None, progress: bool = True, desc: str = 'train'):
  """Runs chunk_fn from step `start` to `end` in chunks ending on multiples of `every`; with a `run`, writes
  the chunk's scalars and saves after each chunk ending on a multiple of `save_every` (default: every chunk)
  and at `end`. Returns the tree. `total` (default `end`) is the progress bar's length (runs in phases).
  """
  from tqdm.auto import tqdm
  save_every = save_every or every
  step = start
  if step >= end:
    return tree
  if run is not None:  # a later phase of the same run: the same bar goes on
    bar = run.bar(total or end, initial=step)
  else:
    bar = tqdm(total=total or end, initial=step, desc=desc, unit='step', dynamic_ncols=True,
               disable=not (progress and report.is_writer()))
  try:
    while step < end:
      n = min(every - step % every, end - step)
      tree, scalars = chunk_fn(tree, step, n)
      scalars = {k: np.asarray(v, np.float64) for k, v in scalars.items()}
      loss = [v for k, v in scalars.items() if 'loss' in k]
      if any(not np.isfinite(v).all() for v in loss):
        raise FloatingPointError(f'training loss is NaN/Inf at steps {step + 1}..{step + n} '
                                 '(try a smaller config.lr)')
      if run is not None:
        run.scalars(step, n, scalars)
      step += n
      bar.update(n)
      if loss:
        bar.set_postfix(loss=f'{float(loss[0].mean()):.4f}')
      if run is not None and (step % save_every == 0 or step == end):
        run.save(step, tree)
  finally:
    if run is None:
      bar.close()
  return tree


class _Phase:
  """`with run.phase(name, n):` shows `name` on the run's bar while the block runs, then counts n steps."""

  def __init__(self, bar, name: str, n: int):
    self.bar, self.name, self.n = bar, name, n

  def __enter__(self):
    self.bar.set_postfix_str(self.name)
    return self

  def __exit__(self, *exc):
    if exc[0] is None:
      self.bar.update(self.n)
      if self.bar.total and self.bar.n >= self.bar.total:  # the last phase: the bar ends before the report prints
        self.bar.close()
    return False


def _os_cause(e: BaseException | None) -> OSError | None:
  """The OSError in e's cause/context chain (e itself included), if any; TensorStore (Orbax's writer) reports
  one as a ValueError carrying `[os_error_code='28']` (a full disk)."""
  import re
  seen = set()
  while e is not None and id(e) not in seen:
    if isinstance(e, OSError):
      return e
    code = re.search(r"os_error_code='(\d+)'", str(e))
    if code:
      return OSError(int(code.group(1)), os.strerror(int(code.group(1))))
    seen.add(id(e))
    e = e.__cause__ or e.__context__
  return None


def _steps_on_disk(ckpt_dir: str) -> list[int]:
  if not os.path.isdir(ckpt_dir):
    return []
  return sorted(int(n) for n in os.listdir(ckpt_dir) if n.isdigit())


def _remove_tmp_dirs(ckpt_dir: str) -> None:
  """Orbax's temporary folders of interrupted saves (a kill mid-save leaves one)."""
  if not os.path.isdir(ckpt_dir):
    return
  for n in os.listdir(ckpt_dir):
    if _TMP_MARK in n:
      shutil.rmtree(os.path.join(ckpt_dir, n), ignore_errors=True)


def latest_params(ckpt_dir: str, key: str = 'params'):
  """`tree[key]` of the newest checkpoint in a finished run's checkpoints/ folder (to start another run)."""
  import orbax.checkpoint as ocp
  if not os.path.isdir(ckpt_dir):
    raise UserError(f'{ckpt_dir}: not a checkpoints folder')
  mngr = ocp.CheckpointManager(os.path.abspath(ckpt_dir), options=ocp.CheckpointManagerOptions(read_only=True))
  try:
    step = mngr.latest_step()
    if step is None:
      raise UserError(f'{ckpt_dir}: no checkpoint in this folder')
    return mngr.restore(step)[key]
  finally:
    mngr.close()


def write_npz(path: str, **arrays) -> None:
  """An output .npz of the run (process 0), atomically; OS errors as one line."""
  if report.is_writer():
    try:
      ops.save_npz_atomic(path, **arrays)
    except OSError as e:
      raise os_error(e, path, 'writing') from e


