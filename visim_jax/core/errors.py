"""User mistakes versus bugs (a leaf: imports nothing from visim_jax).

Raise `UserError` for anything a user can fix (a missing file, a bad config value, an unpaired image): its
message starts with the file or `config.field` at fault and says what to do. The command-line entry points
print it as one line `error: <message>` on stderr and exit with status 1, without a traceback (the traceback
is shown with --verbosity=1 or VISIM_TRACEBACK=1). Any other exception is a bug and keeps its traceback.
It subclasses ValueError so that callers catching ValueError keep working.

Every command-line program runs through one function, `errors.run(main)` (absl's app.run with this module's
flag parser and `main_wrapper`): a bad flag or config override (`--config.foo=1` -> `config.foo: unknown
field; known: a, b, ...`, `--config.runs=abc`, a missing config file, a bad `:arg`) and every user error raised
by `main` (UserError; FileNotFoundError / PermissionError / IsADirectoryError / NotADirectoryError /
FileExistsError; OSError ENOSPC / EDQUOT / EROFS; a ValueError whose message starts with `config.`; a
FloatingPointError from a diverging loss) end as one line `error: ...` and exit status 1; Ctrl-C as one line
and status 130. Without --verbosity, absl / Orbax / JAX INFO logging is off (warnings stay).
"""
from __future__ import annotations

import contextlib
import errno
import functools
import os
import sys


class UserError(ValueError):
  """A mistake the user can fix; str(e) is the whole one-line message (file or config.field first)."""


_OS_USER = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, FileExistsError)
_OS_ADVICE = {errno.ENOSPC: 'the disk is full: free some space and rerun',
              errno.EDQUOT: 'the disk quota is exceeded: free some space and rerun',
              errno.EROFS: 'the file system is read-only: choose another folder',
              errno.EACCES: 'permission denied: fix the permissions or choose another path',
              errno.ENOENT: 'no such file or folder: check the path',
              errno.ENOTDIR: 'a part of the path is a file, not a folder: check the path',
              errno.EISDIR: 'a folder where a file is expected: check the path',
              errno.EEXIST: 'a file is in the way: remove it or choose another path'}


@contextlib.contextmanager
def as_flags(names: dict):
  """Within the block, a user error that names a config field (`config.backbone: ...`) is re-raised naming
  the command-line flag the user typed instead (names = {'config.backbone': '--backbone', ...})."""
  try:
    yield
  except ValueError as e:
    msg = str(e)
    for field, flag in names.items():
      if msg.startswith(field + ':') and is_user_error(e):
        raise UserError(flag + msg[len(field):]) from None
    raise


def is_user_error(e: BaseException) -> bool:
  """Whether `e` is a mistake the user can fix (reported in one line) rather than a bug (traceback)."""
  if isinstance(e, (UserError, FloatingPointError, *_OS_USER)):
    return True
  if isinstance(e, OSError):
    return e.errno in _OS_ADVICE
  return isinstance(e, ValueError) and str(e).startswith('config.')


def one_line(e: BaseException) -> str:
  """The message on one line; an OSError raised by the OS as `<path>: <what> (<what to do>)`."""
  if isinstance(e, OSError) and e.errno is not None and e.filename is not None:
    advice = _OS_ADVICE.get(e.errno, 'check the path')
    return f'{e.filename}: {e.strerror or type(e).__name__}; {advice}'
  return ' '.join(str(e).split()) or type(e).__name__


def close_progress_bars() -> None:
  """Closes every open tqdm bar (each ends its line), so that a message printed next starts on a line of its own and
  no bar is drawn again after it (a bar left open by an exception would be, when it is garbage-collected)."""
  tqdm = getattr(sys.modules.get('tqdm.std'), 'tqdm', None)   # never imported here: no bar if tqdm never was
  for bar in list(getattr(tqdm, '_instances', ()) or ()):
    try:
      bar.close()
    except Exception:  # noqa: BLE001  pylint: disable=broad-except  (a bar half torn down: nothing to close)
      pass


def report_and_exit(e: BaseException, verbose: bool = False) -> None:
  """Prints `error: <message>` on stderr, after closing any open progress bar (the traceback too when verbose),
  and exits with status 1."""
  close_progress_bars()
  if verbose or os.environ.get('VISIM_TRACEBACK'):
    import traceback
    traceback.print_exception(e)
  print(f'error: {one_line(e)}', file=sys.stderr, flush=True)
  sys.exit(1)


def _verbose() -> bool:
  try:
    from absl import flags
    return flags.FLAGS.is_parsed() and flags.FLAGS.verbosity >= 1
  except Exception:  # absl absent or flags not defined
    return False


PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # .../visim_jax


def third_party(path: str) -> bool:
  """A source file of an installed library (site- / dist-packages), not of visim_jax: its warnings are chatter."""
  path = os.path.abspath(path or '')
  if path.startswith(PACKAGE_DIR + os.sep):
    return False
  parts = path.split(os.sep)
  return 'site-packages' in parts or 'dist-packages' in parts


class ThirdPartyFilter:
  """A logging filter: drops the records below ERROR that a library logs (Orbax's "Waiting for previous save to
  complete ... consider checkpointing less frequently" on a loaded machine, absl / JAX / etils warnings); visim_jax's
  own warnings (an unreadable checkpoint skipped, a corrupt cache rebuilt) and every error stay."""

  def filter(self, record) -> bool:
    import logging  # pylint: disable=g-import-not-at-top
    return record.levelno >= logging.ERROR or not third_party(record.pathname)


def quiet_logs() -> None:
  """Unless --verbosity was given: absl / Orbax / JAX INFO logging off, and no library's warning reaches the console
  (ThirdPartyFilter on every root handler, absl's included; Python warnings of modules outside visim_jax ignored).
  visim_jax's own warnings and every error stay."""
  import logging
  import warnings
  from absl import flags
  from absl import logging as absl_logging
  if flags.FLAGS.is_parsed() and flags.FLAGS['verbosity'].present:
    return
  absl_logging.set_verbosity(absl_logging.WARNING)
  for name in ('jax', 'orbax', 'absl', 'etils'):
    logging.getLogger(name).setLevel(logging.WARNING)
  for handler in {absl_logging.get_absl_handler(), *logging.getLogger().handlers}:
    if not any(isinstance(f, ThirdPartyFilter) for f in handler.filters):
      handler.addFilter(ThirdPartyFilter())
  warnings.filterwarnings('ignore', module=r'(?!visim_jax(\.|$))')
  logging.getLogger('jax._src.xla_bridge').setLevel(logging.ERROR)  # "no GPU/TPU found" on CPU machines
  from visim_jax.core import native_log  # XLA's GPU autotuning chatter on fd 2 (C++), see native_log.py
  if native_log.has_gpu_plugin():
    native_log.install()


def main_wrapper(main):
  """Wraps an absl `main(argv)`: quiet logs; user errors -> `error: ...` + exit 1 (traceback when verbose)."""
  @functools.wraps(main)
  def wrapped(argv):
    quiet_logs()
    try:
      return main(argv)
    except KeyboardInterrupt:
      if _verbose():
        raise
      close_progress_bars()
      print('error: interrupted; rerun the same command to resume from the last checkpoint', file=sys.stderr,
            flush=True)
      sys.exit(130)
    except Exception as e:  # noqa: BLE001 (bugs are re-raised)
      if is_user_error(e):
        report_and_exit(e, verbose=_verbose())
      raise
  return wrapped


def _unknown_config_field(argv) -> str | None:
  """`config.a.b: unknown field; known: ...` for the first --config.* override naming no field, else None."""
  from absl import flags
  overrides = [a[2:].split('=', 1)[0] for a in argv[1:] if a.startswith('--config.')]
  base = [a for a in argv if not a.startswith('--config.')]
  saved = sys.argv
  try:
    sys.argv = base  # ml_collections reads the overrides from sys.argv
    flags.FLAGS.unparse_flags()
    flags.FLAGS(base)
    config = flags.FLAGS['config'].value
  except Exception:  # noqa: BLE001
    return None
  finally:
    sys.argv = saved
  for name in overrides:
    node, done = config, ['config']
    for part in name.split('.')[1:]:
      keys = list(node.keys()) if hasattr(node, 'keys') else []
      if part not in keys:
        return f'{".".join(done + [part])}: unknown field; known: {", ".join(sorted(keys))}'
      node, done = node[part], done + [part]
  return None


HELP_FLAGS = ('help', '?', 'helpshort', 'helpfull', 'helpxml')


def asked_for_help(argv) -> bool:
  """Whether argv asks for absl's usage text (--help, -?, --helpshort, --helpfull, --helpxml)."""
  return any(a.startswith('-') and a.lstrip('-').partition('=')[0] in HELP_FLAGS for a in argv[1:] if a != '--')


def flags_parser(argv):
  """absl flag parsing with bad flags / config overrides reported as one `error:` line (exit 1)."""
  from absl import flags
  try:
    try:
      out = flags.FLAGS(argv)
    except SystemExit as e:   # absl's --help / --helpfull print the usage and exit 1: asked-for help is a success
      if e.code == 1 and asked_for_help(argv):
        sys.exit(0)
      raise
    if 'config' in flags.FLAGS and flags.FLAGS['config'].value is not None:
      flags.FLAGS['config'].value.get('experiment')  # a config file that failed to load raises here
    from visim_jax.core import paths  # pylint: disable=g-import-not-at-top
    paths.expand_flags(flags.FLAGS)  # --folder=~/x: the shell leaves `~` after '=' unexpanded
    return out
  except Exception as e:  # noqa: BLE001: flag errors, and errors raised while loading a config file
    msg = ' '.join(str(e).split())
    unknown = _unknown_config_field(argv) if any(a.startswith('--config.') for a in argv) else None
    if unknown or isinstance(e, (AttributeError, KeyError)):
      msg = unknown or f'config: unknown field ({msg})'
    elif 'No such file or directory' in msg or 'Attempted' in msg:
      path = next((a.split('=', 1)[1] for a in argv if a.startswith('--config=')), '--config')
      msg = f'{path.split(":")[0]}: config file not found; pass --config=configs/NAME.py'
    else:
      msg = msg.removeprefix('flag --')
      if msg.startswith('config.') and '=' in msg.split(':')[0]:
        field, _, rest = msg.partition(':')
        name, _, value = field.partition('=')
        msg = f'{name}: cannot use the value {value!r}:{rest}'
      for known in (' ValueError: ', ' UserError: '):  # an error raised by get_config(arg)
        if known in msg:
          msg = msg.split(known)[-1].split(' Pass --help')[0]
      msg = msg.split(' Pass --helpshort')[0]
    if _verbose() or os.environ.get('VISIM_TRACEBACK'):
      import traceback
      traceback.print_exception(e)
    print(f'error: {msg}', file=sys.stderr, flush=True)
    sys.exit(1)


def run(main) -> None:
  """absl app.run(main) with one-line flag and user errors (see the module docstring)."""
  from absl import app
  app.run(main_wrapper(main), flags_parser=flags_parser)
