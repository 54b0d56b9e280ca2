"""User mistakes versus bugs (a leaf: imports nothing from visim_jax).

Raise `UserError` for anything a user can fix (a missing file, a bad config value, an unpaired image): its
message starts with the file or `config.field` at fault and says what to do. The command-line entry points
print it as one line `error: <message>` on stderr and exit with status 1, without a traceback (the traceback
is shown with --verbosity=1 or VISIM_TRACEBACK=1). Any other exception is a bug and keeps its traceback.
It subclasses ValueError so that callers catching ValueError keep working.
"""
from __future__ import annotations

import os
import sys


class UserError(ValueError):
  """A mistake the user can fix; str(e) is the whole one-line message (file or config.field first)."""


def one_line(e: BaseException) -> str:
  return ' '.join(str(e).split()) or type(e).__name__


def report_and_exit(e: BaseException, verbose: bool = False) -> None:
  """Prints `error: <message>` on stderr (the traceback too when verbose) and exits with status 1."""
  if verbose or os.environ.get('VISIM_TRACEBACK'):
    import traceback
    traceback.print_exception(e)
  print(f'error: {one_line(e)}', file=sys.stderr, flush=True)
  sys.exit(1)
