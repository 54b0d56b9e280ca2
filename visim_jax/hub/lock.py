"""One process at a time per destination: `lock(path)`, an fcntl lock on a file outside the path's folder (in
$TMPDIR/visim_jax-locks-UID/, named by the path's hash, holding the holder's pid), so that locking writes nothing
beside the data. hub/download.py takes it per file, fetch.py per data set (and root) and per weights name: a second
fetch waits for the first, then finds its work done.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import sys
import tempfile
import time

from visim_jax.core.errors import UserError


@contextlib.contextmanager
def lock(path: str, what: str = '', deadline: float | None = 3600.0):
  """One process at a time per `path` (an fcntl lock on a file outside its folder, holding the holder's pid): a
  second caller says once that it waits, and waits (`deadline` seconds at most; None: as long as the holder runs).
  Yields whether it waited."""
  import fcntl  # pylint: disable=g-import-not-at-top
  folder = os.path.join(tempfile.gettempdir(), f'visim_jax-locks-{os.getuid()}')
  os.makedirs(folder, exist_ok=True)
  key = hashlib.sha256(os.path.abspath(path).encode()).hexdigest()[:32]
  with open(os.path.join(folder, key + '.lock'), 'a+') as fh:
    t0, said = time.monotonic(), False
    while True:
      try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        break
      except OSError as e:
        if e.errno not in (errno.EAGAIN, errno.EACCES):
          raise
      if not said:
        fh.seek(0)
        holder = fh.read().strip()
        print(f'{path}: another process{f" (pid {holder})" if holder.isdigit() else ""} is {what or "downloading it"}; '
              'waiting for it', file=sys.stderr, flush=True)
        said = True
      if deadline is not None and time.monotonic() - t0 > deadline:
        raise UserError(f'{path}: another process has been {what or "downloading it"} for {deadline:.0f} s; wait for '
                        'it, or stop it and run again') from None
      time.sleep(0.2)
    try:
      fh.seek(0)
      fh.truncate()
      fh.write(str(os.getpid()))
      fh.flush()
      yield said
    finally:
      fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
