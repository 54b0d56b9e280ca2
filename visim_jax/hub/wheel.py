"""One file out of a pinned PyPI wheel, through the user's own pip: `member(package, version, path, wheel_sha256, ...)`.

For weights a PyPI package ships whose wheel cannot be a dependency of visim_jax (DISTS_pytorch 0.1 requires torch):
`python -m pip download --no-deps --only-binary=:all: PACKAGE==VERSION` into a staging folder (pip's own index
settings, proxies and cache apply; nothing is installed), the wheel's sha256 checked against the pinned one, the one
member read from the zip and its own sha256 checked; the staging folder is removed whatever happens. Offline
(VISIM_OFFLINE=1) nothing is tried. Errors are one line naming the command to run where the network is allowed.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

from visim_jax.core.errors import UserError


def member(package: str, version: str, path: str, wheel_sha256: str, member_sha256: str, *, what: str,
           staging_parent: str | None = None) -> bytes:
  """The bytes of PATH inside PACKAGE==VERSION's wheel (both sha256s checked). `what`: the command to name in errors."""
  from visim_jax.hub import download  # pylint: disable=g-import-not-at-top
  if download.offline():
    raise UserError(f'{package}: not on this machine and the network is off (VISIM_OFFLINE / HF_HUB_OFFLINE): run '
                    f'`{what}` where the network is allowed')
  if staging_parent:
    os.makedirs(staging_parent, exist_ok=True)
  staging = tempfile.mkdtemp(prefix=f'.{package}-', dir=staging_parent)
  try:
    cmd = [sys.executable, '-m', 'pip', 'download', '--no-deps', '--only-binary=:all:', '--disable-pip-version-check',
           '--quiet', '--dest', staging, f'{package}=={version}']
    try:
      r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
      raise UserError(f'{package}: `pip download` did not run ({e}); run `{what}` where pip reaches PyPI') from None
    wheels = [f for f in os.listdir(staging) if f.endswith('.whl')]
    if r.returncode or len(wheels) != 1:
      last = ' '.join((r.stderr or r.stdout).split())[-200:] or 'no wheel downloaded'
      raise UserError(f'{package}=={version}: pip could not download the wheel ({last}); run `{what}` where pip '
                      'reaches PyPI')
    wheel = os.path.join(staging, wheels[0])
    with open(wheel, 'rb') as f:
      digest = hashlib.sha256(f.read()).hexdigest()
    if digest != wheel_sha256:
      raise UserError(f'{wheels[0]}: sha256 {digest} is not the one of {package}=={version} ({wheel_sha256})')
    try:
      with zipfile.ZipFile(wheel) as z:
        data = z.read(path)
    except (KeyError, zipfile.BadZipFile) as e:
      raise UserError(f'{wheels[0]}: no {path} inside ({e})') from None
    got = hashlib.sha256(data).hexdigest()
    if got != member_sha256:
      raise UserError(f'{wheels[0]}: {path} has sha256 {got}, not {member_sha256}')
    return data
  finally:
    shutil.rmtree(staging, ignore_errors=True)
