"""HF families (hf.py: CLIP vision / ViT / DINOv2 on vit.py's module, ResNet / RegNet in hf_resnet.py) vs transformers'
PyTorch models, and the three checkpoint formats.

- Parity: each family's real (full-size) architecture with random weights (torch_init.randomise: BatchNorm running
  statistics, norm scales and biases perturbed; DINOv2's 37x37 position embeddings resized to 16x16 the reference
  way), every stage and the pooled feature against transformers' PyTorch model (4.57 or 5.x).
- Formats: one tiny checkpoint as model.safetensors (save_pretrained), flax_model.msgpack (transformers' Flax names,
  written here) and pytorch_model.bin (read by core.safe_pickle) loads by key to the same variables.
- Nothing in visim_jax imports transformers; the families build and run with it blocked.
"""
import ast
import dataclasses
import json
import pathlib
import re
import sys

import jax
import numpy as np
import pytest

from torch_init import randomise, run_both
from visim_jax.backbones import features, get_backbone, hf, list_backbones, registry
from visim_jax.backbones import weights as weights_lib
from visim_jax.core.errors import UserError

FULL = ['clip_vit_b32', 'vit_b16', 'dinov2_s14', 'hf_resnet50', 'regnet_y_040']
TINY_NAMES = {'clip': 'clip_vit_b32', 'vit': 'vit_b16', 'dinov2': 'dinov2_s14', 'resnet': 'hf_resnet50',
              'regnet': 'regnet_y_040'}
# tokens and position embeddings drawn as 0.1 * N(0, 1) (not 1/sqrt(fan_in)): the DINOv2 resize sees real values
SMALL = ('position_embedding', 'cls_token', 'class_embedding', 'mask_token')


def _transformers():
  pytest.importorskip('torch')
  return pytest.importorskip('transformers')


def _base_model(family, cfg):
  """transformers' PyTorch base model of a config dict (eager attention: the reference softmax(qk^T)v)."""
  T = _transformers()
  if family == 'clip':
    return T.CLIPVisionModel(T.CLIPVisionConfig(**cfg, attn_implementation='eager'))
  if family == 'vit':
    return T.ViTModel(T.ViTConfig(**cfg, attn_implementation='eager'), add_pooling_layer=False)
  if family == 'dinov2':
    return T.Dinov2Model(T.Dinov2Config(**cfg, attn_implementation='eager'))
  if family == 'resnet':
    return T.ResNetModel(T.ResNetConfig(**cfg))
  return T.RegNetModel(T.RegNetConfig(**cfg))


def _reference_stages(ref, family):
  """{stage: tensor} of the PyTorch model on NCHW pixels, named as hf.py names them."""
  def forward(x):
    out = ref(pixel_values=x.float(), output_hidden_states=True)
    hs = out.hidden_states
    if family in hf.VIT_LIKE:
      want = {'embeddings': hs[0], **{f'block{i}': h for i, h in enumerate(hs[1:], 1)}}
      want['pooled'] = out.last_hidden_state[:, 0] if family == 'vit' else out.pooler_output
    else:
      want = {'stem': hs[0], **{f'stage{i}': h for i, h in enumerate(hs[1:], 1)}}
      want['pooled'] = out.pooler_output.flatten(1)
    return want
  return forward


def _saved_state(model, folder):
  """The checkpoint `save_pretrained` writes, read back by key: the hub's key names (transformers 5 renamed some
  modules in memory, e.g. ViT's `layers.N.attention.q_proj`, and writes the original names back on saving)."""
  model.save_pretrained(folder)
  return hf.load_state(str(folder))


@pytest.mark.parametrize('name', FULL)
def test_full_size_parity_with_transformers_pytorch(name, tmp_path):
  """The registered architecture itself (random weights): pooled features to ~1e-5 of the reference's scale."""
  family = hf.SPECS[name].family
  ref = randomise(_base_model(family, hf.SPECS[name].config), 0, small=SMALL)
  cfg = hf.family_config(family, hf.SPECS[name].config)
  variables = hf.variables_from_state(family, cfg, _saved_state(ref, tmp_path), name)
  with weights_lib.shapes_only():  # the backbone's apply / preprocess without drawing weights it would replace
    b = get_backbone(name, random_init=0)
  b = dataclasses.replace(b, variables=variables)
  final, stages, want = run_both(b, _reference_stages(ref, family), b.preprocess.size, n=1)
  assert sorted(stages) == sorted(want)
  scale = np.abs(want['pooled']).max()
  np.testing.assert_allclose(final, want['pooled'], rtol=0, atol=1e-5 * scale, err_msg=name)
  for k, v in want.items():  # every stage, each to 1e-5 of its own scale
    np.testing.assert_allclose(stages[k], v, rtol=0, atol=1e-5 * np.abs(v).max(), err_msg=f'{name} {k}')


def _with_head(family):
  """A tiny PyTorch checkpoint as the hub holds it: the model with its head (CLIP: both towers)."""
  T = _transformers()
  cfg = hf.TINY[family]
  if family == 'clip':
    text = dict(vocab_size=99, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                max_position_embeddings=16)
    m = T.CLIPModel(T.CLIPConfig(text_config=text, vision_config=cfg, projection_dim=16))
    return m, m.vision_model
  if family == 'vit':
    m = T.ViTForImageClassification(T.ViTConfig(**cfg, num_labels=5))
    return m, m.vit
  if family == 'dinov2':
    m = T.Dinov2Model(T.Dinov2Config(**cfg))
    return m, m
  if family == 'resnet':
    m = T.ResNetForImageClassification(T.ResNetConfig(**cfg, num_labels=5))
    return m, m.resnet
  m = T.RegNetForImageClassification(T.RegNetConfig(**cfg, num_labels=5))
  return m, m.regnet


def _flax_tree(sd):
  """A PyTorch state dict in transformers' Flax layout (what `FlaxModel.save_pretrained` writes): the key split on
  '.', 4-d weight -> kernel HWIO, 2-d weight -> kernel (in, out) (nn.Embedding weight -> embedding, as it is), 1-d
  weight -> scale, running_mean / running_var -> batch_stats mean / var, num_batches_tracked dropped."""
  params, stats = {}, {}
  for k, v in sd.items():
    *path, leaf = k.split('.')
    tree = params
    if leaf in ('running_mean', 'running_var'):
      tree, leaf = stats, leaf[len('running_'):]
    elif leaf == 'num_batches_tracked' or leaf == 'position_ids':
      continue
    elif leaf == 'weight' and v.ndim == 4:
      leaf, v = 'kernel', v.transpose(2, 3, 1, 0)
    elif leaf == 'weight' and v.ndim == 2:
      leaf, v = ('embedding', v) if path[-1].endswith('embedding') else ('kernel', v.T)
    elif leaf == 'weight':
      leaf = 'scale'
    for p in path:
      tree = tree.setdefault(p, {})
    tree[leaf] = np.ascontiguousarray(v)
  return {'params': params, 'batch_stats': stats} if stats else params


@pytest.fixture(scope='module', params=sorted(TINY_NAMES))
def checkpoints(request, tmp_path_factory):
  """(name, reference base model, {format: folder}) of one tiny random checkpoint in the three formats."""
  import torch
  from flax import serialization
  family = request.param
  full, ref = _with_head(family)
  randomise(full, 0, small=SMALL)
  root = tmp_path_factory.mktemp(family)
  sd = _saved_state(full, root / 'safetensors')
  config = (root / 'safetensors' / 'config.json').read_text()
  for fmt, file, write in (
      ('msgpack', 'flax_model.msgpack', lambda p: p.write_bytes(serialization.to_bytes(_flax_tree(sd)))),
      ('bin', 'pytorch_model.bin', lambda p: torch.save({k: torch.from_numpy(v) for k, v in sd.items()}, p))):
    (root / fmt).mkdir()
    (root / fmt / 'config.json').write_text(config)
    write(root / fmt / file)
  return TINY_NAMES[family], ref.eval(), {f: root / f for f in ('safetensors', 'msgpack', 'bin')}


def test_tiny_checkpoints_load_by_key_from_every_format(checkpoints):
  name, ref, folders = checkpoints
  assert hf.state_file(str(folders['safetensors'])).endswith('model.safetensors')
  states = {f: hf.load_state(str(d)) for f, d in folders.items()}
  for fmt in ('msgpack', 'bin'):
    common = set(states[fmt])
    assert common <= set(states['safetensors']), fmt
    for k in common:
      np.testing.assert_array_equal(states[fmt][k], states['safetensors'][k], err_msg=f'{fmt} {k}')
  b = get_backbone(name, weights=str(folders['safetensors']), tiny=True)
  assert b.weights_id == weights_lib.check_sidecar(str(folders['safetensors'] / 'model.safetensors'))
  m = get_backbone(name, weights=str(folders['msgpack']), tiny=True)
  assert m.weights_id == weights_lib.check_sidecar(str(folders['msgpack'] / 'flax_model.msgpack'))
  family = hf.SPECS[name].family
  cfg = hf.read_config(str(folders['bin']), family)
  from_bin = hf.variables_from_state(family, cfg, states['bin'], 'bin')
  for v in (m.variables, from_bin):
    assert jax.tree.structure(v) == jax.tree.structure(b.variables)
    for x, y in zip(jax.tree.leaves(v), jax.tree.leaves(b.variables)):
      np.testing.assert_array_equal(x, y)
  final, stages, want = run_both(b, _reference_stages(ref, family), b.preprocess.size)
  for k, v in want.items():
    np.testing.assert_allclose(stages[k], v, rtol=1e-5, atol=1e-5, err_msg=f'{name} {k}')


def test_the_flax_layout_written_here_is_transformers_own(checkpoints):
  """_flax_tree above == transformers 4.x's PyTorch -> Flax conversion (skipped where transformers has no Flax)."""
  T = _transformers()
  utils = pytest.importorskip('transformers.modeling_flax_pytorch_utils')
  import types
  from flax.traverse_util import flatten_dict
  name, _, folders = checkpoints
  flax_cls = {'clip': 'FlaxCLIPModel', 'vit': 'FlaxViTForImageClassification', 'dinov2': 'FlaxDinov2Model',
              'resnet': 'FlaxResNetForImageClassification', 'regnet': 'FlaxRegNetForImageClassification'}
  cls = getattr(T, flax_cls[hf.SPECS[name].family])
  model = cls(cls.config_class.from_pretrained(folders['safetensors']), _do_init=False)
  shim = types.SimpleNamespace(base_model_prefix=cls.base_model_prefix, params=model.params_shape_tree)
  sd = hf.load_state(str(folders['safetensors']))
  want = flatten_dict(utils.convert_pytorch_state_dict_to_flax(sd, shim))
  got = flatten_dict(_flax_tree(sd))
  assert sorted(got) == sorted(want)
  for k in want:
    np.testing.assert_array_equal(got[k], want[k])


def test_every_family_builds_offline_without_transformers(monkeypatch):
  monkeypatch.setenv('HF_HUB_OFFLINE', '1')
  monkeypatch.setitem(sys.modules, 'transformers', None)  # `import transformers` fails from here on
  names = [n for n in list_backbones() if n in hf.SPECS]
  assert set(names) == set(hf.SPECS)
  families = {}
  for name in names:  # every name resolves to a factory; one build per family (they share the tiny config)
    families.setdefault(hf.SPECS[name].family, name)
    assert callable(registry.resolve(name))
  for name in families.values():
    b = get_backbone(name, tiny=True, random_init=3)
    assert b.weights_id == 'random:3:tiny'
    assert set(b.layers) <= set(b.stage_names()), name
  b = get_backbone('clip_vit_b32', tiny=True, layers='block1,pooled')
  assert b.layers == ('block1', 'pooled')
  assert sorted(b.stage_names()) == ['block1', 'block2', 'embeddings', 'pooled']
  assert sorted(get_backbone('hf_resnet18', tiny=True).stage_names()) == ['pooled', 'stage1', 'stage2', 'stage3',
                                                                          'stage4', 'stem']
  with pytest.raises(ValueError, match='block9'):
    get_backbone('clip_vit_b32', tiny=True, layers=['block9'])


def test_no_module_of_visim_jax_imports_transformers():
  """transformers is no run-time dependency (issue 36): no import of it (nor of a Flax class of it) anywhere."""
  import visim_jax
  root = pathlib.Path(visim_jax.__file__).parent
  offenders = []
  for path in sorted(root.rglob('*.py')):
    source = path.read_text()
    for node in ast.walk(ast.parse(source)):
      mods = ([a.name for a in node.names] if isinstance(node, ast.Import) else
              [node.module or ''] if isinstance(node, ast.ImportFrom) else [])
      offenders += [f'{path.relative_to(root)}: import {m}' for m in mods if m.split('.')[0] == 'transformers']
    offenders += [f'{path.relative_to(root)}: {w}' for w in ('modeling_flax', 'FlaxCLIP', 'FlaxViT', 'FlaxDinov2',
                                                               'FlaxResNet', 'FlaxRegNet', 'FlaxPreTrained')
                  if w in source]
  assert not offenders, offenders


def test_random_weights_are_the_flax_ports_draw():
  """'random:SEED' names the numbers the transformers-Flax version drew: weights.random_variables over the Flax
  port's tree (its names = the checkpoint keys split on '.'), visited in sorted order (checked here by hand for
  two leaves of each kind)."""
  cfg = hf.family_config('dinov2', hf.TINY['dinov2'])
  sd = hf.random_state('dinov2', cfg, 3)
  shapes = hf.checkpoint_keys('dinov2', cfg)
  leaves = []  # (the Flax port's path, key, PyTorch shape, Flax shape)
  for k, shape in shapes.items():
    *path, leaf = k.split('.')
    flax_shape = shape
    if leaf == 'weight':
      leaf = 'scale' if len(shape) == 1 else 'kernel'
      flax_shape = shape[2:] + shape[1::-1] if len(shape) == 4 else shape[::-1] if len(shape) == 2 else shape
    leaves.append((tuple(path) + (leaf,), k, shape, flax_shape))
  rng = np.random.default_rng(3)
  for path, k, shape, flax_shape in sorted(leaves):  # kernels N(0, 1/fan_in), scales and lambda1 ones, rest N(0, .02^2)
    if path[-1] in ('scale', 'lambda1'):
      np.testing.assert_array_equal(sd[k], 1.0)
      continue
    std = 1.0 / np.sqrt(np.prod(flax_shape[:-1])) if path[-1] == 'kernel' else 0.02
    v = rng.standard_normal(flax_shape, dtype=np.float32) * np.float32(std)
    v = v.transpose(3, 2, 0, 1) if len(shape) == 4 else v.T if path[-1] == 'kernel' else v
    np.testing.assert_array_equal(sd[k], v, err_msg=k)


def test_real_architecture_with_random_weights_has_paper_dims():
  with weights_lib.shapes_only():
    b = get_backbone('hf_resnet50', random_init=0)
  assert sum(features.layer_dims(b, b.layers).values()) == 3840  # paper 001 Table 1
  assert b.preprocess.size == 224 and b.preprocess.resize_to == 256


def test_config_json_is_read_over_the_class_defaults(tmp_path):
  """save_pretrained writes only the fields that differ from the config class's defaults; CLIPModel's nests the
  image tower's under vision_config; a different architecture or model type fails naming the field."""
  (tmp_path / 'config.json').write_text(json.dumps({'model_type': 'vit', 'hidden_size': 1024,
                                                    'num_hidden_layers': 24, 'num_attention_heads': 16,
                                                    'intermediate_size': 4096}))
  cfg = hf.read_config(str(tmp_path), 'vit')
  assert (cfg['layer_norm_eps'], cfg['patch_size'], cfg['hidden_act'], cfg['image_size']) == (1e-12, 16, 'gelu', 224)
  assert hf.vit_arch('vit', cfg).mlp_ratio == 4
  (tmp_path / 'config.json').write_text(json.dumps({'model_type': 'clip', 'vision_config': {'patch_size': 16}}))
  cfg = hf.read_config(str(tmp_path), 'clip')
  assert (cfg['patch_size'], cfg['hidden_act'], cfg['layer_norm_eps']) == (16, 'quick_gelu', 1e-5)
  with pytest.raises(UserError, match='model_type .resnet. is not a clip model'):
    (tmp_path / 'config.json').write_text(json.dumps({'model_type': 'resnet'}))
    hf.read_config(str(tmp_path), 'clip')
  (tmp_path / 'config.json').write_text(json.dumps({'model_type': 'dinov2', 'use_swiglu_ffn': True}))
  with pytest.raises(UserError, match='use_swiglu_ffn'):
    hf.read_config(str(tmp_path), 'dinov2')


def test_wrong_or_broken_weights_fail_in_one_line(checkpoints, tmp_path):
  name, _, folders = checkpoints
  family = hf.SPECS[name].family
  cfg = json.loads((folders['safetensors'] / 'config.json').read_text())
  cfg_field = 'vision_config' if family == 'clip' else None
  if family in hf.VIT_LIKE:
    (cfg[cfg_field] if cfg_field else cfg)['num_hidden_layers'] = 3
    (tmp_path / 'config.json').write_text(json.dumps(cfg))
    (tmp_path / 'model.safetensors').symlink_to(folders['safetensors'] / 'model.safetensors')
    with pytest.raises(UserError, match='num_hidden_layers=3'):
      get_backbone(name, weights=str(tmp_path), tiny=True)  # checked before any weight is read
    (tmp_path / 'model.safetensors').unlink()
  sd = hf.load_state(str(folders['safetensors']))
  config = hf.read_config(str(folders['safetensors']), family)
  want = [p + k for p in hf.PREFIXES[family] for k in hf.checkpoint_keys(family, config) if 'encoder' in k]
  key = next(k for k in sd if k in want and k.endswith('weight'))
  with pytest.raises(UserError, match=re.escape(f"1 missing, e.g. ['encoder.{key.split('encoder.', 1)[1]}']")):
    hf.variables_from_state(family, config, {k: v for k, v in sd.items() if k != key}, 'test')
  (tmp_path / 'flax_model.msgpack').write_bytes((folders['msgpack'] / 'flax_model.msgpack').read_bytes()[:100])
  with pytest.raises(UserError, match='not a readable flax msgpack'):
    hf.load_state(str(tmp_path / 'flax_model.msgpack'))


def test_missing_weights_fail_offline_naming_the_folder(monkeypatch, tmp_path):
  monkeypatch.setenv('HF_HUB_OFFLINE', '1')
  monkeypatch.setenv('VISIM_JAX_WEIGHTS', str(tmp_path / 'w'))
  with pytest.raises(FileNotFoundError, match=str(tmp_path / 'w' / 'clip_vit_b32')):
    get_backbone('clip_vit_b32', weights='nobody-here/no-such-model')
  with pytest.raises(FileNotFoundError, match='no such folder'):
    get_backbone('clip_vit_b32', weights=str(tmp_path / 'nope'))
