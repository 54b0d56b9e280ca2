"""An error raised while a progress bar is open is printed after the bar is closed: the bar's line ends, the error
has a line of its own and is the last thing on the screen (core/errors.close_progress_bars), on the bare case and on
learn_triplets reading an image that does not decode in the middle of its feature bar."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(args, **kw):
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS='cpu')
  return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT, **kw)


def _screen(err: str) -> list:
  """The lines a terminal keeps: each '\\r' returns to the start of the line, '\\n' ends it."""
  lines = []
  for line in err.split('\n'):
    lines.append(line.split('\r')[-1])
  return [l for l in lines if l.strip()]


def test_the_error_comes_after_the_bar():
  code = ('from tqdm.auto import tqdm\n'
          'from visim_jax.core import errors\n'
          'def main(argv):\n'
          '  bar = tqdm(total=10, desc="features")\n'
          '  bar.update(3)\n'
          '  raise errors.UserError("/d/x.png: cannot decode this image")\n'
          'errors.run(main)\n')
  r = _run(['-c', code])
  assert r.returncode == 1, r.stderr
  assert '\nerror: /d/x.png: cannot decode this image\n' in r.stderr, repr(r.stderr)
  assert r.stderr.rstrip('\n').endswith('error: /d/x.png: cannot decode this image'), repr(r.stderr)
  assert _screen(r.stderr)[-1] == 'error: /d/x.png: cannot decode this image'


def test_learn_triplets_feature_bar_then_the_error(tmp_path):
  from PIL import Image
  img = tmp_path / 'img'
  img.mkdir()
  for i in range(12):
    Image.new('RGB', (8, 8), (20 * i, 255 - 20 * i, (37 * i) % 256)).save(img / f'{i:02d}.png')
  data = (img / '11.png').read_bytes()
  (img / '11.png').write_bytes(data[:len(data) // 2])   # truncated: found by the decoder, mid-bar
  r = _run(['-m', 'visim_jax.main', '--config=configs/learn_triplets.py:local', f'--workdir={tmp_path / "w"}',
            '--config.source=folder', f'--config.image_dir={img}', '--config.backbone=alexnet',
            '--config.backbone_kwargs.tiny=True', '--config.teacher.backbone=alexnet', '--config.image_batch_size=4',
            '--config.triplets.n_train=40', '--config.triplets.n_val=10', '--config.triplets.clusters=3',
            '--config.triplets.val_fraction=0.34'])
  assert r.returncode == 1, r.stderr[-2000:]
  screen = _screen(r.stderr)
  assert screen[-1].startswith('error: ') and '11.png' in screen[-1], repr(r.stderr[-1000:])
  assert '\nerror: ' in r.stderr and not os.path.exists(tmp_path / 'w' / 'triplets_train.npz')
