"""data/images.py: every PIL mode to 8-bit RGB against hand-made expected arrays (written from the documented
rules, not from PIL), EXIF orientation, and bad files named in errors."""
import io

import numpy as np
import pytest
from PIL import Image

from visim_jax.data import images


def grey3(v):
  return np.repeat(np.asarray(v, np.uint8)[..., None], 3, axis=-1)


def on_white(c, a):
  """The documented rule written plainly: round(c * a / 255 + 255 * (1 - a / 255)), per pixel."""
  c, a = np.broadcast_arrays(np.asarray(c, np.float64), np.asarray(a, np.float64))
  out = np.empty(c.shape)
  for i in np.ndindex(out.shape):
    out[i] = np.floor(c[i] * a[i] / 255 + 255 * (1 - a[i] / 255) + 0.5)
  return out.astype(np.uint8)


def reopen(im, fmt, **kw):
  buf = io.BytesIO()
  im.save(buf, fmt, **kw)
  buf.seek(0)
  out = Image.open(buf)
  out.load()
  return out


def rgb(im, **kw):
  out = images.to_rgb(im, **kw)
  assert out.mode == 'RGB'
  return np.asarray(out)


def test_16_bit_grey_png_and_tiff_scale_by_the_high_byte():
  v = np.array([[0, 255, 256, 257 * 100, 32896, 65535]], np.uint16)
  want = grey3([[0, 0, 1, 100, 128, 255]])  # v >> 8 written out by hand
  png = reopen(Image.fromarray(v), 'PNG')
  assert png.mode == 'I;16'
  np.testing.assert_array_equal(rgb(png), want)
  tiff = reopen(Image.frombytes('I;16B', (6, 1), v.astype('>u2').tobytes()), 'TIFF')
  assert tiff.mode == 'I;16B'
  np.testing.assert_array_equal(rgb(tiff), want)
  # the bug this fixes: a 16-bit gradient decoded through convert('RGB') is almost all white
  grad = np.tile(np.linspace(0, 65535, 256).astype(np.uint16), (8, 1))
  assert (np.asarray(reopen(Image.fromarray(grad), 'PNG').convert('RGB')) == 255).mean() > 0.9
  ours = rgb(reopen(Image.fromarray(grad), 'PNG'))
  np.testing.assert_array_equal(ours[0, :, 0], np.arange(256))


def test_32_bit_integer_and_float_grey():
  i32 = Image.fromarray(np.array([[-5, 0, 255, 256, 65535, 70000]], np.int32))
  assert i32.mode == 'I'
  np.testing.assert_array_equal(rgb(i32), grey3([[0, 0, 0, 1, 255, 255]]))
  f = Image.fromarray(np.array([[np.nan, -1.0, 0.0, 0.25, 1.0, 2.0]], np.float32))
  assert f.mode == 'F'
  np.testing.assert_array_equal(rgb(f), grey3([[0, 0, 0, 64, 255, 255]]))  # 0.25 * 255 = 63.75 -> 64
  f255 = Image.fromarray(np.array([[-3.0, 63.75, 300.0]], np.float32))
  np.testing.assert_array_equal(rgb(f255, float_max=255.0), grey3([[0, 64, 255]]))


def test_bilevel_grey_cmyk():
  one = Image.new('1', (3, 1))
  one.putpixel((1, 0), 1)
  np.testing.assert_array_equal(rgb(one), grey3([[0, 255, 0]]))
  grey = Image.fromarray(np.array([[0, 7, 255]], np.uint8))
  np.testing.assert_array_equal(rgb(grey), grey3([[0, 7, 255]]))
  cmyk = Image.new('CMYK', (1, 1), (10, 20, 30, 40))
  want = [round((255 - c) * (255 - 40) / 255) for c in (10, 20, 30)]  # R = (255 - C)(255 - K) / 255
  np.testing.assert_array_equal(rgb(cmyk)[0, 0], want)


def test_alpha_is_composited_on_white_or_dropped():
  px = np.array([[[200, 10, 60, 255], [200, 10, 60, 0], [10, 100, 250, 128]]], np.uint8)
  rgba = Image.fromarray(px, 'RGBA')
  np.testing.assert_array_equal(rgb(rgba), on_white(px[..., :3], px[..., 3:]))
  assert rgb(rgba)[0, 1].tolist() == [255, 255, 255]
  np.testing.assert_array_equal(rgb(rgba, alpha='drop'), px[..., :3])
  la = np.array([[[200, 255], [200, 0], [10, 128]]], np.uint8)
  np.testing.assert_array_equal(rgb(Image.fromarray(la, 'LA')), grey3(on_white(la[..., 0], la[..., 1])))
  # premultiplied grey: stored L is already L * a / 255
  lap = Image.new('La', (1, 1), (50, 128))
  np.testing.assert_array_equal(rgb(lap)[0, 0], [50 + 255 - 128] * 3)
  # a palette with a transparent entry, through a PNG tRNS chunk
  pal = Image.new('P', (3, 1))
  pal.putpalette([0, 0, 0, 255, 0, 0, 0, 0, 255] + [0] * 759)
  for x, c in enumerate((0, 1, 2)):
    pal.putpixel((x, 0), c)
  p = reopen(pal, 'PNG', transparency=1)
  assert p.mode == 'P' and 'transparency' in p.info
  np.testing.assert_array_equal(rgb(p), [[[0, 0, 0], [255, 255, 255], [0, 0, 255]]])
  np.testing.assert_array_equal(rgb(p, alpha='drop'), [[[0, 0, 0], [255, 0, 0], [0, 0, 255]]])
  pa = Image.new('PA', (2, 1))
  pa.putpalette([0, 0, 0, 40, 80, 120] + [0] * 762)
  pa.putpixel((0, 0), (1, 255))
  pa.putpixel((1, 0), (1, 64))
  np.testing.assert_array_equal(rgb(pa), on_white(np.array([[[40, 80, 120]] * 2]), np.array([[[255], [64]]])))
  with pytest.raises(ValueError, match='alpha'):
    images.to_rgb(rgba, alpha='black')


@pytest.mark.parametrize('fmt', ['JPEG', 'PNG'])
def test_exif_orientation_is_applied(tmp_path, fmt):
  stored = np.zeros((16, 32, 3), np.uint8)
  stored[:, :16] = (250, 0, 0)   # left half red
  stored[:, 16:] = (0, 0, 250)   # right half blue
  exif = Image.Exif()
  exif[0x0112] = 6  # orientation 6: the viewer turns the stored pixels 90 degrees clockwise
  path = tmp_path / f'rot.{fmt.lower()}'
  Image.fromarray(stored).save(path, fmt, exif=exif.tobytes(), **({'quality': 95, 'subsampling': 0} if fmt == 'JPEG' else {}))
  want = np.rot90(stored, k=-1)  # (32, 16): the left column becomes the top row
  got = np.asarray(images.open_rgb(path))
  assert got.shape == want.shape == (32, 16, 3)
  np.testing.assert_allclose(got.astype(int), want.astype(int), atol=12)
  assert np.asarray(images.open_rgb(path, exif='none')).shape == (16, 32, 3)
  # exif='jpeg' is the reference's reader exactly (imageio 2.9 rotates JPEGs only)
  assert np.asarray(images.open_rgb(path, exif='jpeg')).shape == ((32, 16, 3) if fmt == 'JPEG' else (16, 32, 3))


def test_bad_files_are_named_and_listed(tmp_path):
  good = tmp_path / 'good.png'
  Image.fromarray(np.zeros((8, 8), np.uint16)).save(good)
  (tmp_path / 'text.png').write_text('not an image')
  data = (tmp_path / 'cut.jpg')
  buf = io.BytesIO()
  Image.fromarray(np.random.RandomState(0).randint(0, 255, (64, 64, 3), np.uint8)).save(buf, 'JPEG')
  data.write_bytes(buf.getvalue()[:len(buf.getvalue()) // 2])
  paths = [str(good), str(tmp_path / 'text.png'), str(data), str(tmp_path / 'gone.png')]
  bad = images.check_images(paths, num_threads=2)
  assert [b[0] for b in bad] == paths[1:]
  assert 'not an image' in bad[0][1] and 'cut.jpg' in bad[1][1] and 'not found' in bad[2][1]
  with pytest.raises(images.ImageError, match='text.png'):
    images.open_rgb(paths[1])
  assert issubclass(images.ImageError, ValueError)


def test_arrays_follow_the_same_rules():
  np.testing.assert_array_equal(np.asarray(images.from_array(np.array([[0, 256, 65535]], np.uint16))),
                                grey3([[0, 1, 255]]))
  np.testing.assert_array_equal(np.asarray(images.from_array(np.array([[[0.25], [2.0]]], np.float32))),
                                grey3([[64, 255]]))
  px = np.array([[[200, 10, 60, 0], [10, 100, 250, 128]]], np.uint8)
  np.testing.assert_array_equal(np.asarray(images.from_array(px)), on_white(px[..., :3], px[..., 3:]))
  rgb8 = np.random.RandomState(0).randint(0, 256, (4, 5, 3)).astype(np.uint8)
  np.testing.assert_array_equal(np.asarray(images.from_array(rgb8)), rgb8)
  with pytest.raises(ValueError, match='image array'):
    images.from_array(np.zeros((4, 5, 2), np.uint8))


def test_torch_bilinear_equals_torch_interpolate():
  """The seed's transform: ToTensor then Resize([224, 224]) on the tensor = F.interpolate(bilinear,
  align_corners=False), no antialiasing, no rounding; ours on the 0..255 scale."""
  torch = pytest.importorskip('torch')
  from visim_jax.data.preprocess import Preprocess
  rng = np.random.RandomState(0)
  for h, w, size in ((37, 53, 16), (10, 9, 24), (64, 64, 64)):  # shrink, enlarge, same size
    arr = rng.randint(0, 256, (h, w, 3)).astype(np.uint8)
    ours = images.resize(Image.fromarray(arr), Preprocess(size=size, interpolation='torch_bilinear'))
    t = torch.from_numpy(arr).permute(2, 0, 1)[None].float() / 255
    ref = torch.nn.functional.interpolate(t, size=(size, size), mode='bilinear', align_corners=False)
    assert ours.dtype == np.float32 and ours.shape == (size, size, 3)
    np.testing.assert_allclose(ours / 255, ref[0].permute(1, 2, 0).numpy(), atol=1e-5)
  # shorter side + centre crop: the same taps as resizing the whole image, then cropping
  arr = rng.randint(0, 256, (30, 41, 3)).astype(np.uint8)
  crop = images.resize(Image.fromarray(arr), Preprocess(size=16, resize='shorter_crop', resize_to=20,
                                                        interpolation='torch_bilinear'))
  full = torch.nn.functional.interpolate(torch.from_numpy(arr).permute(2, 0, 1)[None].float(), size=(20, 27),
                                         mode='bilinear', align_corners=False)[0].permute(1, 2, 0).numpy()
  np.testing.assert_allclose(crop, full[2:18, 6:22], atol=1e-3)  # 27 = int(20 * 41 / 30); left round(11 / 2) = 6


def test_torch_bilinear_is_torchs_float32_arithmetic():
  """Issue 22: source coordinates in float32 with torch's rounding (float64 ones were up to 0.0074 off on the
  0..255 scale). Odd sizes, shrink and enlarge: on the 0..255 scale equal to F.interpolate(antialias=False) bit for
  bit on photo-like shrinks and within 2 float32 ulps (3.1e-5) everywhere; on the seed's 0..1 scale (ToTensor,
  then Resize on the tensor) within 1e-6."""
  torch = pytest.importorskip('torch')
  from visim_jax.data.preprocess import Preprocess
  rng = np.random.RandomState(1)
  for h, w, size, exact in ((333, 500, 224, True), (481, 321, 299, True), (97, 131, 224, True), (37, 53, 17, False),
                            (10, 9, 24, False), (7, 1001, 13, False)):
    arr = rng.randint(0, 256, (h, w, 3)).astype(np.uint8)
    ours = images.resize(Image.fromarray(arr), Preprocess(size=size, interpolation='torch_bilinear'))
    t = torch.from_numpy(arr).permute(2, 0, 1)[None].float()
    ref = torch.nn.functional.interpolate(t, size=(size, size), mode='bilinear', align_corners=False,
                                          antialias=False)[0].permute(1, 2, 0).numpy()
    if exact:
      np.testing.assert_array_equal(ours, ref, err_msg=f'{h}x{w}->{size}')
    np.testing.assert_allclose(ours, ref, atol=3.1e-5, rtol=0, err_msg=f'{h}x{w}->{size}')
    seed = torch.nn.functional.interpolate(t / 255, size=(size, size), mode='bilinear', align_corners=False,
                                           antialias=False)[0].permute(1, 2, 0).numpy()
    np.testing.assert_allclose(ours / 255, seed, atol=1e-6, rtol=0, err_msg=f'{h}x{w}->{size}')


def test_shorter_side_geometry_is_torchvision():
  """Resize(int): the longer side int(target * long / short); CenterCrop: offset round((n - size) / 2)."""
  from visim_jax.data.preprocess import Preprocess
  pre = Preprocess(size=8, resize='shorter_crop', resize_to=10)
  assert images._geometry(30, 41, pre) == (10, 13, 1, 2)       # 13.67 -> 13; crop (2 / 2, 5 / 2 -> 2)
  assert images._geometry(41, 30, pre) == (13, 10, 2, 1)
  assert images._geometry(70, 30, pre) == (23, 10, 8, 1)       # 15 / 2 = 7.5 -> 8 (round half to even)
  assert images._geometry(13, 99, Preprocess(size=8)) == (8, 8, 0, 0)
  arr = np.arange(30 * 41 * 3, dtype=np.uint8).reshape(30, 41, 3)
  want = np.asarray(Image.fromarray(arr).resize((13, 10), Image.Resampling.BILINEAR))[1:9, 2:10]
  np.testing.assert_array_equal(images.resize(Image.fromarray(arr), pre), want)
