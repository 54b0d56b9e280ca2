"""Paths as users type them: `~` and environment variables expanded, once, for every path flag and config field
(a leaf: imports nothing from visim_jax).

A shell expands `~` only at the start of a word, so `--folder=~/.cache/x` or `--config.data_dir=~/TLL` reach the
program unexpanded; `errors.flags_parser` (every command line) expands every string flag and `main.run` every
string config field with `expand_path`: `~`, `~user` and `$VAR` / `${VAR}`, each item of a comma-separated list
on its own. Values without `~` or `$` (names, modes) are left as they are.
"""
from __future__ import annotations

import os


def needs_expanding(value: str) -> bool:
  return '$' in value or value.startswith('~') or ',~' in value.replace(' ', '')


def expand_path(value):
  """`~` and `$VAR` expanded in a path string (each item of 'a,b'); anything else returned unchanged."""
  if isinstance(value, os.PathLike):
    value = os.fspath(value)
  if not isinstance(value, str) or not needs_expanding(value):
    return value
  if ',' in value:
    return ','.join(expand_path(v.strip()) if v.strip() else v for v in value.split(','))
  return os.path.expandvars(os.path.expanduser(value))


def expand_flags(flag_values) -> None:
  """Expands every string / list-of-strings flag value that holds `~` or `$` (absl FlagValues, after parsing)."""
  for name in list(flag_values):
    flag = flag_values[name]
    value = flag.value
    if isinstance(value, str) and needs_expanding(value):
      flag.value = expand_path(value)
    elif isinstance(value, list) and any(isinstance(v, str) and needs_expanding(v) for v in value):
      flag.value = [expand_path(v) for v in value]
