"""The library's gate (visim_jax.load and the `triplets:` spec) against a hostile corpus made here: crafted head.npz
files (random bytes, empty, no meta, meta not JSON or a list, object arrays, wrong shapes, an unknown head kind, NaN
or zero parameters), NaN images, empty arrays, pairs of different counts, batch_size=0 and spec errors in the
library's own words. Each ends in one line naming the file or argument; a good head works like every other spec
(distance, embed, apply)."""
import json
import types

import jax
import numpy as np
import pytest

import visim_jax as vj
from user_errors import refused
from visim_jax.backbones import features, registry
from visim_jax.models import heads
from visim_jax.training import head_file


def _write_head(folder, kind='affine', similarity='dot', params=None, meta_edit=None):
  bb = registry.get_backbone('alexnet', tiny=True)
  layers = tuple(bb.layers)
  in_dim = sum(bb.layer_dims(layers).values())
  params = heads.init(kind, jax.random.PRNGKey(0), in_dim, 8) if params is None else params
  hp = types.SimpleNamespace(head=kind, size=8, similarity=similarity)
  folder.mkdir(parents=True, exist_ok=True)
  head_file.save_head(str(folder / 'head.npz'), hp, params, features.describe(bb, layers), str(folder))
  if meta_edit is not None:
    z = dict(np.load(folder / 'head.npz'))
    meta = json.loads(str(z['meta']))
    meta_edit(meta)
    z['meta'] = np.asarray(json.dumps(meta))
    np.savez(folder / 'head.npz', **z)
  return folder


@pytest.mark.parametrize('similarity', ['dot', 'cosine'])
def test_the_triplets_spec_works_in_the_library(tmp_path, similarity):
  from visim_jax.data import demo
  wd = _write_head(tmp_path / 'w', similarity=similarity)
  model = vj.load(f'triplets:{wd}', fetch=False)
  root = demo.demo_pairs(None, 8, 0)
  import os
  imgs = sorted(os.path.join(root, 'left', n) for n in os.listdir(os.path.join(root, 'left')))[:3]
  d = model.distance(imgs[0], imgs[1])
  assert isinstance(d, float) and np.isfinite(d)
  e = model.embed(imgs)
  assert e.shape == (3, 8)
  want = -(e[0] * e[1]).sum() if similarity == 'dot' else 1 - e[0] @ e[1] / np.linalg.norm(e[0]) / np.linalg.norm(e[1])
  np.testing.assert_allclose(d, want, rtol=1e-4, atol=1e-5)
  x = np.random.default_rng(0).random((2, model.image_size, model.image_size, 3)).astype(np.float32)
  f = model.apply(model.params, x)
  assert f.shape == (2, 8)
  np.testing.assert_allclose(np.asarray(f), model.embed(list(x)), rtol=2e-2, atol=2e-2)   # uint8 rounding in embed
  assert model.apply_distance(model.params, x, x[::-1]).shape == (2,)


def _corpus(tmp_path):
  """name -> a crafted head.npz path."""
  out = {}

  def put(name, fn):
    folder = tmp_path / name
    folder.mkdir()
    fn(folder / 'head.npz')
    out[name] = folder / 'head.npz'
  good = _write_head(tmp_path / 'good') / 'head.npz'
  z = dict(np.load(good))
  put('random_bytes', lambda p: p.write_bytes(np.random.default_rng(0).bytes(300)))
  put('empty', lambda p: p.write_bytes(b''))
  put('no_meta', lambda p: np.savez(p, **{k: v for k, v in z.items() if k != 'meta'}))
  put('meta_not_json', lambda p: np.savez(p, **{**z, 'meta': np.asarray('{not json')}))
  put('meta_a_list', lambda p: np.savez(p, **{**z, 'meta': np.asarray('[1, 2]')}))
  put('object_arrays', lambda p: np.savez(p, **{**z, 'params/w': np.array([{'a': 1}], dtype=object)}))
  put('wrong_shape', lambda p: np.savez(p, **{**z, 'params/w': np.zeros((3, 5), np.float32) + 1}))
  put('nan_params', lambda p: np.savez(p, **{**z, 'params/w': z['params/w'] * np.nan}))
  put('zero_params', lambda p: np.savez(p, **{**z, 'params/w': z['params/w'] * 0}))
  meta = json.loads(str(z['meta']))
  put('unknown_kind', lambda p: np.savez(p, **{**z, 'meta': np.asarray(json.dumps({**meta, 'head': 'lora'}))}))
  put('meta_size_text', lambda p: np.savez(p, **{**z, 'meta': np.asarray(json.dumps({**meta, 'size': 'x'}))}))
  put('int_params', lambda p: np.savez(p, **{**z, 'params/w': z['params/w'].astype(np.int32)}))
  return out


def test_crafted_head_files_are_refused_in_one_line(tmp_path):
  from visim_jax.zoo import interface, similarity
  for name, path in _corpus(tmp_path).items():
    for fn, where in ((lambda: vj.load(f'triplets:{path.parent}', fetch=False), 'visim_jax.load'),
                      (lambda: similarity.build(f'triplets:{path}', interface.Options(progress=False)),
                       'config.models'),
                      (lambda: head_file.load_head(str(path)), str(path))):
      line = refused(fn, where, str(path))
      assert 'pickle' not in line.replace('pickled Python objects', ''), (name, line)
      assert 'allow_pickle' not in line, (name, line)


def test_nan_images_are_refused_as_the_range_is(tmp_path):
  model = vj.load('cosine:alexnet:tiny', fetch=False)
  x = np.full((16, 16, 3), 0.5, np.float32)
  for bad in (np.full_like(x, np.nan), np.where(np.arange(16)[:, None, None] == 3, np.nan, x),
              np.where(np.arange(16)[:, None, None] == 3, np.nan, x * 255), np.where(x > 0, np.inf, x)):
    refused(lambda: model.distance(bad, x), 'visim_jax.load', 'img0', 'NaN')
    refused(lambda: model.embed(bad[None]), 'NaN')
    refused(lambda: model.apply(model.params, bad[None]), 'NaN')


def test_library_arguments_blame_the_right_thing(tmp_path):
  model = vj.load('cosine:alexnet:tiny', fetch=False)
  refused(lambda: model.distance(np.zeros((0, 64, 3), np.uint8), np.zeros((8, 8, 3), np.uint8)), 'img0', '0 x 64')
  for bs in (0, -1, 1.5, True):
    refused(lambda: vj.load('cosine:alexnet:tiny', fetch=False, batch_size=bs), 'visim_jax.load', 'batch_size')
  line = refused(lambda: vj.load('cosine:nonexistent_net', fetch=False), 'visim_jax.load', 'nonexistent_net')
  assert 'config.models' not in line
  line = refused(lambda: vj.load(f'triplets:{tmp_path}', fetch=False), 'visim_jax.load', 'head.npz')
  assert 'config.models' not in line


def test_lpips_pairs_of_different_counts(tmp_path):
  model = vj.load('lpips:alex:tiny', fetch=False)
  a = np.zeros((2, 64, 64, 3), np.uint8)
  b = np.zeros((3, 64, 64, 3), np.uint8)
  line = refused(lambda: model.distance(a, b), 'img0 has 2 images, img1 3')
  assert 'resize' not in line
  refused(lambda: model.distance(np.full((64, 64, 3), np.nan, np.float32), a[0]), 'NaN')


# ------------------------------------------------------------------------------------------- the older battery

def test_dreamsim_pos_embed_of_another_form_is_refused():
  from visim_jax.backbones import dreamsim
  for bad in (np.zeros(768, np.float32), np.zeros((1, 1, 8), np.float32), np.zeros((1, 6, 8), np.float32),
              np.zeros((2, 5, 8), np.float32)):
    refused(lambda: dreamsim.resize_pos_embed(bad, 4, 0.1, '/d/dinov2.pth'), '/d/dinov2.pth', 'pos_embed')
  ok = np.random.default_rng(0).standard_normal((1, 17, 8)).astype(np.float32)
  assert dreamsim.resize_pos_embed(ok, 4, 0.1).shape == (1, 17, 8)


@pytest.mark.parametrize('experiment,wrote', [('nights_adapt', 'triplet_head.npz'), ('nights_adapt', 'adapter.npz'),
                                              ('learn_triplets', 'head.npz')])
def test_export_names_the_file_the_run_wrote(tmp_path, experiment, wrote):
  from visim_jax.training import adapter_file
  (tmp_path / 'checkpoints').mkdir()
  (tmp_path / 'metrics.json').write_text(json.dumps({'experiment': experiment}))
  (tmp_path / wrote).write_bytes(b'x')
  line = refused(lambda: adapter_file.from_workdir(str(tmp_path)), f'a {experiment} workdir', wrote)
  assert line.count('.npz') == 1


def test_header_only_things_file_is_one_line(tmp_path, capfd):
  from PIL import Image
  from visim_jax.data import things
  for i in range(3):
    Image.new('RGB', (8, 8)).save(tmp_path / f'{i}.png')
  (tmp_path / 't.csv').write_text('image1\timage2\timage3\tchoice\tRT\tnoise_ceiling\n')
  refused(lambda: things.load(str(tmp_path), str(tmp_path / 't.csv')), 't.csv')
  assert capfd.readouterr().err == ''
