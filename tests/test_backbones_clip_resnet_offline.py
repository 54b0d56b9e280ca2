"""CLIP ResNet backbones without torch: random / tiny builds offline, paper dims, a clear error without weights."""
import pytest

from visim_jax.backbones import features
from visim_jax.backbones import clip_resnet, convert_clip, get_backbone


def test_random_and_tiny_build_offline_and_missing_weights_name_the_file(tmp_path, monkeypatch):
  b = get_backbone('clip_rn50x16', tiny=True, random_init=2)
  assert b.weights_id == 'random:2:tiny' and b.layers == clip_resnet.DEFAULT_LAYERS
  b = get_backbone('clip_rn50x4', random_init=0)
  assert b.preprocess.size == 288
  assert sum(features.layer_dims(b, b.layers).values()) == 5440  # paper 001 Table 1
  assert clip_resnet.ARCHS['clip_rn101'].output_dim + 3840 == 4352
  monkeypatch.setenv('VISIM_JAX_WEIGHTS', str(tmp_path))
  with pytest.raises(FileNotFoundError, match=str(tmp_path / 'clip_rn50.safetensors')):
    get_backbone('clip_rn50')


def test_converter_refuses_bad_input_before_writing(tmp_path):
  bad = tmp_path / 'x.pt'
  bad.write_bytes(b'not a checkpoint')
  assert convert_clip.main(['--input', str(bad), '--output', str(tmp_path / 'o.safetensors')]) == 1
  assert convert_clip.main(['--input', str(tmp_path / 'missing.pt'), '--output', str(tmp_path / 'o.safetensors')]) == 1
  assert not (tmp_path / 'o.safetensors').exists()
