"""`refused(fn, *names)`: fn() must fail as a user error in one line naming each of `names` (the gate tests)."""
import pytest

from visim_jax.core import errors


def refused(fn, *names) -> str:
  """fn() raises a user error (errors.is_user_error) whose one line contains every one of `names`; the line."""
  with pytest.raises(Exception) as info:
    fn()
  e = info.value
  assert errors.is_user_error(e), repr(e)
  line = errors.one_line(e)
  assert '\n' not in str(e) and 'Traceback' not in line, line
  for n in names:
    assert str(n) in line, (n, line)
  return line
