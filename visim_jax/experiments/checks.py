"""Config value checks, one copy for every experiment: each raises a one-line UserError naming the field.

Every experiment's `validate_config(config)` is made of these (main.py calls it before the workdir is touched,
so a refused run writes nothing). A field is addressed by its dotted name ('lr', 'model.batch_size'); the
message reads `config.<field>: must be <what> (got <value>)`. Numbers are refused when they are of the wrong
type (a string, a bool), not finite (nan, inf) or out of range; an integer field takes a Python int only.
"""
from __future__ import annotations

import functools
import math
import os
from typing import Any, Sequence

from visim_jax.core.errors import UserError
from visim_jax.core.paths import needs_expanding, expand_path

SEED_MAX = 2**32 - 1   # numpy's RandomState and jax.random.PRNGKey both take a seed in [0, 2^32)


def get(config, field: str) -> Any:
  return functools.reduce(lambda node, key: node[key], field.split('.'), config)


def fail(field: str, msg: str, value: Any) -> UserError:
  return UserError(f'config.{field}: {msg} (got {value!r})')


def _num(x) -> str:
  return f'{x:,}' if isinstance(x, int) else f'{x:g}'


def _range_text(lo, hi, lo_open: bool, hi_open: bool) -> str:
  if lo is not None and hi is not None:
    return f'in {"(" if lo_open else "["}{_num(lo)}, {_num(hi)}{")" if hi_open else "]"}'
  if lo is not None:
    return f'{">" if lo_open else ">="} {_num(lo)}'
  if hi is not None:
    return f'{"<" if hi_open else "<="} {_num(hi)}'
  return 'finite'


def is_number(v: Any, integer: bool = False) -> bool:
  if isinstance(v, bool):
    return False
  if integer:
    return isinstance(v, int)
  return isinstance(v, (int, float)) and math.isfinite(v)


def in_range(v, lo=None, hi=None, lo_open: bool = False, hi_open: bool = False) -> bool:
  return ((lo is None or (v > lo if lo_open else v >= lo)) and
          (hi is None or (v < hi if hi_open else v <= hi)))


def number(config, field: str, lo=None, hi=None, *, integer: bool = False, lo_open: bool = False,
           hi_open: bool = False, note: str = '') -> Any:
  """The value of a numeric field, checked: type, finite, in the range; else a UserError naming it."""
  v = get(config, field)
  what = f'{"an integer" if integer else "a finite number"} {_range_text(lo, hi, lo_open, hi_open)}'
  if not is_number(v, integer) or not in_range(v, lo, hi, lo_open, hi_open):
    raise fail(field, f'must be {what}{note}', v)
  return v


def integer(config, field: str, lo=None, hi=None, note: str = '') -> int:
  return number(config, field, lo, hi, integer=True, note=note)


def fraction(config, field: str, lo_open: bool = True, hi_open: bool = True) -> float:
  return number(config, field, 0.0, 1.0, lo_open=lo_open, hi_open=hi_open)


def seed(config, field: str = 'seed') -> int:
  return integer(config, field, 0, SEED_MAX)


def numbers(config, field: str, lo=None, hi=None, *, integer: bool = False, lo_open: bool = False,
            hi_open: bool = False, distinct: bool = False, example: str = '') -> tuple:
  """A non-empty tuple/list of numbers, each checked as `number` does (and distinct when asked)."""
  v = get(config, field)
  kind = 'integers' if integer else 'finite numbers'
  what = f'one or more {"distinct " if distinct else ""}{kind} {_range_text(lo, hi, lo_open, hi_open)}'
  what += f', e.g. {example}' if example else ''
  ok = (isinstance(v, (tuple, list)) and len(v) >= 1 and
        all(is_number(x, integer) and in_range(x, lo, hi, lo_open, hi_open) for x in v) and
        (not distinct or len(set(v)) == len(v)))
  if not ok:
    raise fail(field, f'must be {what}', v)
  return tuple(v)


def choice(config, field: str, options: Sequence[Any]) -> Any:
  v = get(config, field)
  if not any(v == o and type(v) is type(o) for o in options):
    raise fail(field, f'one of {tuple(options)}', v)
  return v


def flag(config, field: str) -> bool:
  v = get(config, field)
  if not isinstance(v, bool):
    raise fail(field, 'must be True or False', v)
  return v


def text(config, field: str) -> str:
  v = get(config, field)
  if not isinstance(v, str):
    raise fail(field, 'must be a string', v)
  return v


def input_path(config, field: str, kind: str = 'file') -> str:
  """A path the run reads (a file or a folder): '' (not given) or existing, else refused naming the field. Every
  user path is checked here, before anything runs: a mode's default never stands in for it."""
  v = text(config, field)
  if v and not (os.path.isdir(v) if kind == 'dir' else os.path.isfile(v)):
    if os.path.islink(v) and not os.path.exists(v):
      raise UserError(f'config.{field}: {v} is a broken symbolic link')
    if kind == 'dir':
      raise UserError(f'config.{field}: {v}: ' + ('not a folder' if os.path.exists(v) else 'folder not found'))
    raise UserError(f'config.{field}: {v} ' + ('is not a file' if os.path.exists(v) else 'not found'))
  return v


def unused(config, fields: Sequence[str], why: str) -> None:
  """Fields the user set that this run would not read are refused (a setting silently ignored would be recorded
  as if it had been used): `config.<field>: not used <why>; remove it`."""
  for f in fields:
    v = get(config, f)
    if v not in ('', None, False, 0):
      raise UserError(f'config.{f}: not used {why}; remove it (got {v!r})')


def data_source(config, uses: dict, field: str = 'dataset') -> None:
  """config.dataset's own input paths checked (`input_path`); the path fields only other datasets read are refused
  when set (`unused`). uses: {dataset: ((field, 'file' | 'dir'), ...)}."""
  ds = get(config, field)
  mine = tuple(uses.get(ds, ()))
  for f, kind in mine:
    input_path(config, f, kind)
  others = sorted({f for k, v in uses.items() if k != ds for f, _ in v} - {f for f, _ in mine})
  unused(config, [f for f in others if f in config], f'with {field}={ds!r}')


def expand_config(config) -> None:
  """Expands, in place, every string field (nested too) of an ml_collections config that holds `~` or `$`."""
  for key, value in list(config.items()):
    if hasattr(value, 'items'):
      expand_config(value)
    elif isinstance(value, str) and needs_expanding(value):
      config[key] = expand_path(value)
    elif isinstance(value, (tuple, list)) and any(isinstance(v, str) and needs_expanding(v) for v in value):
      config[key] = type(value)(expand_path(v) for v in value)
