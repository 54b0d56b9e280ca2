"""A workdir as the runs see it: its lock, and its record (config.json, fingerprint.json) written last.

- `workdir_lock(workdir)` / `acquire` / `release`: an exclusive flock on `<workdir>/.lock` (process 0 takes it, the
  others learn the outcome); a second run is refused naming the holder's pid and host; the kernel drops the lock of
  a dead process. `.lock` is the one file a refused run may rewrite (the holder's pid).
- `check_experiment(workdir, experiment)`: a workdir whose config.json records another experiment is refused in one
  line before anything runs (a benchmark into a nights_adapt workdir, and the reverse).
- `Record`: the run's config.json and fingerprint.json are written when its first result lands (the first
  checkpoint, TensorBoard scalars or metrics.json), never before: every check, every decode and every model file
  has passed by then. A run that fails after writing them but before a checkpoint or metrics.json landed puts back
  the files it found, so a refused or failed run leaves the workdir's record byte-identical.
- `os_error`: an OSError (full disk, read-only, permissions) as a one-line UserError naming the path.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import socket

import jax
import numpy as np

from visim_jax.core import ops, report
from visim_jax.core.errors import UserError

RECORD = ('config.json', 'fingerprint.json')  # what describes the results beside them
OUTER: set[str] = set()  # workdirs whose lock this process holds for a whole command (workdir_lock)


def os_error(e: OSError, path: str, doing: str) -> UserError:
  """An OSError while `doing` something at `path`, as a one-line UserError saying what to do."""
  advice = {errno.ENOSPC: 'the disk is full: free some space and rerun (the run resumes)',
            errno.EDQUOT: 'the disk quota is exceeded: free some space and rerun (the run resumes)',
            errno.EROFS: 'the file system is read-only: choose another folder',
            errno.EACCES: 'permission denied: fix the permissions or choose another folder'}
  msg = advice.get(e.errno, f'{e.strerror or e}: check the folder and rerun')
  return UserError(f'{e.filename or path}: {doing} failed; {msg}')


def read_bytes(path: str) -> bytes | None:
  try:
    with open(path, 'rb') as f:
      return f.read()
  except OSError:
    return None


def recorded_experiment(workdir: str) -> str | None:
  """The experiment named by the workdir's config.json (None when there is none or it names none)."""
  data = read_bytes(os.path.join(workdir, 'config.json'))
  if data is None:
    return None
  try:
    rec = json.loads(data)
  except ValueError:
    return None
  return rec.get('experiment') if isinstance(rec, dict) and isinstance(rec.get('experiment'), str) else None


def check_experiment(workdir: str, experiment: str) -> None:
  """A workdir holding another experiment's record is refused (its results would be mixed or overwritten)."""
  other = recorded_experiment(workdir)
  if other is not None and other != experiment:
    raise UserError(f'{workdir}: holds a {other} run (config.json: experiment={other!r}), not {experiment}; '
                    'pass another --workdir')


class Record:
  """config.json + fingerprint.json of one run, written by `write()` just before its first result (process 0);
  `put_back()` restores the files found at construction when the run fails before a result of its own was kept."""

  def __init__(self, workdir: str, record: dict, fp_record: dict | None):
    self.workdir, self.config, self.fp_record = workdir, dict(record), fp_record
    self.found = {n: read_bytes(os.path.join(workdir, n)) for n in RECORD} if report.is_writer() else None
    self.written = False
    self.kept = False  # a checkpoint or metrics.json of this run is on disk: its record stays

  def write(self) -> None:
    if self.written or not report.is_writer():
      self.written = True
      return
    self.written = True
    try:
      report.write_config(self.workdir, self.config)
      if self.fp_record is not None:
        report.write_json(os.path.join(self.workdir, 'fingerprint.json'), self.fp_record)
    except OSError as e:
      raise os_error(e, self.workdir, 'writing config.json') from e

  def put_back(self) -> None:
    """Puts back the record files this run rewrote before it kept anything (removes those it created)."""
    if not self.written or self.kept or self.found is None:
      return
    for name, data in self.found.items():
      path = os.path.join(self.workdir, name)
      with contextlib.suppress(OSError):
        if data is None:
          os.remove(path)
        else:
          ops.atomic_write_bytes(path, data)


def acquire(workdir: str) -> int | None:
  """Takes the exclusive flock on `<workdir>/.lock` (process 0; the others learn the outcome): its fd (None on
  other processes), or a UserError naming the holder when another run has it. Another open of the same file
  conflicts even within one process, so two Runs of one workdir never overlap."""
  multi = jax.distributed.is_initialized()  # asked without starting a backend on one machine
  ok, holder, fd = 1, '', None
  if not multi or report.is_writer():
    path = os.path.join(workdir, '.lock')
    try:
      fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as e:
      raise os_error(e, path, 'creating the workdir lock') from e
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
      holder = os.pread(fd, 200, 0).decode(errors='replace').strip() or 'unknown'
      os.close(fd)
      fd, ok = None, 0
    else:
      os.ftruncate(fd, 0)
      os.pwrite(fd, f'pid {os.getpid()} on host {socket.gethostname()}\n'.encode(), 0)
  if multi and jax.process_count() > 1:  # every process learns whether process 0 got the lock
    from jax.experimental import multihost_utils
    ok = int(multihost_utils.broadcast_one_to_all(np.int32(ok)))
  if not ok:
    raise UserError(f'{workdir}: another run is using this workdir ({holder}); wait for it to finish or '
                    'pass another --workdir')
  return fd


def release(fd: int | None) -> None:
  if fd is not None:
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


@contextlib.contextmanager
def workdir_lock(workdir: str):
  """Holds the workdir's lock for a whole command (data, features, training, report), so a busy workdir is
  refused before any extraction; `Run`s inside re-enter it. When the command fails, the folders it created and
  left empty (an Orbax manager opened, nothing saved) are removed, and so is a workdir it created and left empty:
  a refused run leaves no trace."""
  workdir = os.path.abspath(workdir)
  created = not os.path.lexists(workdir)
  ops.check_writable_dir(workdir, 'workdir')
  fd = acquire(workdir)
  before = set(os.listdir(workdir))
  OUTER.add(workdir)
  try:
    yield workdir
  except BaseException:
    for n in set(os.listdir(workdir)) - before - {'.lock'}:  # folders this command made and left empty
      path = os.path.join(workdir, n)
      if os.path.isdir(path) and not os.path.islink(path) and _empty_tree(path):
        shutil.rmtree(path, ignore_errors=True)
    if created and os.listdir(workdir) == ['.lock']:
      shutil.rmtree(workdir, ignore_errors=True)
    raise
  finally:
    OUTER.discard(workdir)
    release(fd)


def _empty_tree(path: str) -> bool:
  return all(not files for _, _, files in os.walk(path))
