"""SigLIP / SigLIP 2 image towers vs transformers' torch SiglipVisionModel (tiny, random weights) through both
converters (HF safetensors, big_vision .npz written here with big_vision's parameter names), each weight source's
default preprocessing (open_clip #1068: the wrong transform loaded offline), and the full-size members by shape.

big_vision names and layouts written here from `big_vision/models/vit.py` (Encoder1DBlock: LayerNorm_0,
MultiHeadDotProductAttention_0 with query/key/value kernels (C, H, D) and out (H, D, C), LayerNorm_1,
MlpBlock_0/Dense_0..1; `encoderblock_{i}` or the scanned `encoderblock` with a leading depth axis; embedding conv
HWIO; pos_embedding (1, P, C); Transformer/encoder_norm; MAPHead_0 with probe, its own attention, LayerNorm_0 and
MlpBlock_0) and the two-tower checkpoint layout `params/img/...`, `params/txt/...`, `params/t`, `params/b`.
"""
import json

import jax
import numpy as np
import pytest
from PIL import Image

from torch_init import assert_stages_close, randomise, run_both
from visim_jax.backbones import convert, get_backbone, registry, siglip
from visim_jax.backbones import weights as weights_lib
from visim_jax.data import images as images_lib
from visim_jax.core.errors import UserError

torch = pytest.importorskip('torch')
transformers = pytest.importorskip('transformers')
A = siglip.TINY


def _hf_config(arch, **kw):
  return transformers.SiglipVisionConfig(
      hidden_size=arch.width, intermediate_size=arch.mlp_dim, num_hidden_layers=arch.depth,
      num_attention_heads=arch.heads, image_size=arch.image_size, patch_size=arch.patch, **kw)


@pytest.fixture(scope='module')
def reference():
  """A tiny random SiglipVisionModel and its state dict as a SiglipModel checkpoint would hold it."""
  ref = transformers.SiglipVisionModel(_hf_config(A, attn_implementation='eager'))
  ref = randomise(ref, 0, small=('probe', 'position_embedding'))
  # SiglipModel checkpoints hold the tower under 'vision_model.' (transformers 5's SiglipVisionModel has no such level)
  sd = {k if k.startswith('vision_model.') else f'vision_model.{k}': v.detach().numpy().copy()
        for k, v in ref.state_dict().items()}
  return ref, sd


@pytest.fixture(scope='module')
def converted(reference, tmp_path_factory):
  """The HF checkpoint (with a text tower and logit scale to drop) converted once: (path, sidecar)."""
  from safetensors.numpy import save_file
  _, sd = reference
  d = tmp_path_factory.mktemp('hf')
  save_file({**sd, 'text_model.embeddings.token_embedding.weight': np.zeros((8, 4), np.float32),
             'logit_scale': np.zeros((1,), np.float32)}, str(d / 'model.safetensors'))
  out = d / 'siglip_b16_224.safetensors'
  info = convert.convert('siglip_b16_224', str(d / 'model.safetensors'), str(out), tiny=True)
  return out, info


def _big_vision_npz(sd, scan):
  """The HF state dict written back in big_vision's names and layouts (module docstring)."""
  c, h = A.width, A.heads
  g = lambda k: sd[f'vision_model.{k}']  # noqa: E731
  img = {'embedding/kernel': g('embeddings.patch_embedding.weight').transpose(2, 3, 1, 0),
         'embedding/bias': g('embeddings.patch_embedding.bias'),
         'pos_embedding': g('embeddings.position_embedding.weight')[None],
         'Transformer/encoder_norm/scale': g('post_layernorm.weight'),
         'Transformer/encoder_norm/bias': g('post_layernorm.bias'),
         'MAPHead_0/probe': g('head.probe'),
         'MAPHead_0/LayerNorm_0/scale': g('head.layernorm.weight'),
         'MAPHead_0/LayerNorm_0/bias': g('head.layernorm.bias'),
         'MAPHead_0/MultiHeadDotProductAttention_0/out/kernel': g('head.attention.out_proj.weight').T.reshape(h, -1, c),
         'MAPHead_0/MultiHeadDotProductAttention_0/out/bias': g('head.attention.out_proj.bias')}
  for j, p in enumerate(('query', 'key', 'value')):
    w, b = g('head.attention.in_proj_weight')[j * c:(j + 1) * c], g('head.attention.in_proj_bias')[j * c:(j + 1) * c]
    img[f'MAPHead_0/MultiHeadDotProductAttention_0/{p}/kernel'] = w.T.reshape(c, h, -1)
    img[f'MAPHead_0/MultiHeadDotProductAttention_0/{p}/bias'] = b.reshape(h, -1)
  for i, fc in ((0, 'fc1'), (1, 'fc2')):
    img[f'MAPHead_0/MlpBlock_0/Dense_{i}/kernel'] = g(f'head.mlp.{fc}.weight').T
    img[f'MAPHead_0/MlpBlock_0/Dense_{i}/bias'] = g(f'head.mlp.{fc}.bias')
  blocks = []
  for layer in range(A.depth):
    e = lambda k: g(f'encoder.layers.{layer}.{k}')  # noqa: E731
    b = {'LayerNorm_0/scale': e('layer_norm1.weight'), 'LayerNorm_0/bias': e('layer_norm1.bias'),
         'LayerNorm_1/scale': e('layer_norm2.weight'), 'LayerNorm_1/bias': e('layer_norm2.bias'),
         'MultiHeadDotProductAttention_0/out/kernel': e('self_attn.out_proj.weight').T.reshape(h, -1, c),
         'MultiHeadDotProductAttention_0/out/bias': e('self_attn.out_proj.bias')}
    for p, t in (('query', 'q'), ('key', 'k'), ('value', 'v')):
      b[f'MultiHeadDotProductAttention_0/{p}/kernel'] = e(f'self_attn.{t}_proj.weight').T.reshape(c, h, -1)
      b[f'MultiHeadDotProductAttention_0/{p}/bias'] = e(f'self_attn.{t}_proj.bias').reshape(h, -1)
    for i, fc in ((0, 'fc1'), (1, 'fc2')):
      b[f'MlpBlock_0/Dense_{i}/kernel'] = e(f'mlp.{fc}.weight').T
      b[f'MlpBlock_0/Dense_{i}/bias'] = e(f'mlp.{fc}.bias')
    blocks.append(b)
  if scan:
    img.update({f'Transformer/encoderblock/{k}': np.stack([b[k] for b in blocks]) for k in blocks[0]})
  else:
    img.update({f'Transformer/encoderblock_{i}/{k}': v for i, b in enumerate(blocks) for k, v in b.items()})
  return {**{f'params/img/{k}': v for k, v in img.items()}, 'params/txt/Embed_0/embedding': np.zeros((8, 4)),
          'params/t': np.zeros((1,)), 'params/b': np.zeros((1,))}


def _open_clip_state_dict(sd):
  """The HF state dict in open_clip's SigLIP layout (timm VisionTransformer, global_pool='map', under
  `visual.trunk.`): fused qkv per block (rows q, k, v), attn_pool latent / q / kv (rows k, v) / proj / norm / mlp."""
  g = lambda k: sd[f'vision_model.{k}']  # noqa: E731
  t = {'patch_embed.proj.weight': g('embeddings.patch_embedding.weight'),
       'patch_embed.proj.bias': g('embeddings.patch_embedding.bias'),
       'pos_embed': g('embeddings.position_embedding.weight')[None],
       'norm.weight': g('post_layernorm.weight'), 'norm.bias': g('post_layernorm.bias'),
       'attn_pool.latent': g('head.probe')}
  c = A.width
  for leaf in ('weight', 'bias'):
    fused = g(f'head.attention.in_proj_{leaf}')
    t[f'attn_pool.q.{leaf}'], t[f'attn_pool.kv.{leaf}'] = fused[:c], fused[c:]
    t[f'attn_pool.proj.{leaf}'] = g(f'head.attention.out_proj.{leaf}')
    t[f'attn_pool.norm.{leaf}'] = g(f'head.layernorm.{leaf}')
    for fc in ('fc1', 'fc2'):
      t[f'attn_pool.mlp.{fc}.{leaf}'] = g(f'head.mlp.{fc}.{leaf}')
    for i in range(A.depth):
      e = lambda k: g(f'encoder.layers.{i}.{k}.{leaf}')  # noqa: E731
      t[f'blocks.{i}.attn.qkv.{leaf}'] = np.concatenate([e(f'self_attn.{p}_proj') for p in 'qkv'])
      t[f'blocks.{i}.attn.proj.{leaf}'] = e('self_attn.out_proj')
      t[f'blocks.{i}.norm1.{leaf}'], t[f'blocks.{i}.norm2.{leaf}'] = e('layer_norm1'), e('layer_norm2')
      t[f'blocks.{i}.mlp.fc1.{leaf}'], t[f'blocks.{i}.mlp.fc2.{leaf}'] = e('mlp.fc1'), e('mlp.fc2')
  return {**{f'visual.trunk.{k}': v for k, v in t.items()}, 'logit_scale': np.zeros((1,), np.float32),
          'text.token_embedding.weight': np.zeros((8, 4), np.float32), 'logit_bias': np.zeros((1,), np.float32)}


def test_parity_with_transformers_siglip_vision_model(reference, converted):
  """Pooled MAP output, last hidden state and every block vs SiglipVisionModel, through the HF converter."""
  ref, sd = reference
  out, info = converted
  assert info['weights_source'] == 'hf' and info['interpolation'] == 'bicubic'
  assert info['num_tensors'] == sum(1 for k in sd if k.startswith('vision_model.'))
  backbone = get_backbone('siglip_b16_224', weights=str(out), tiny=True)
  assert backbone.weights_id == info['sha256'] and backbone.layers == ('pooled',)

  def run_ref(x):
    o = ref(pixel_values=x, output_hidden_states=True)
    hs = o.hidden_states
    return {'embeddings': hs[0], **{f'block{i}': hs[i] for i in range(1, A.depth + 1)},
            'tokens': o.last_hidden_state, 'mean': o.last_hidden_state.mean(1), 'pooled': o.pooler_output}

  final, stages, want = run_both(backbone, run_ref, A.image_size)
  assert_stages_close(stages, want, atol=2e-5, rtol=1e-5)
  np.testing.assert_allclose(final, want['pooled'], atol=2e-5, rtol=1e-5)
  mean = get_backbone('siglip_b16_224', weights=str(out), tiny=True, pooling='mean')
  assert mean.layers == ('mean',)
  with pytest.raises(UserError, match="pooling: 'cls'.*no CLS token"):
    get_backbone('siglip_b16_224', tiny=True, pooling='cls')


@pytest.mark.parametrize('scan', [False, True])
def test_big_vision_npz_converts_to_the_same_tensors(reference, converted, tmp_path, scan):
  _, sd = reference
  np.savez(tmp_path / 'webli.npz', **_big_vision_npz(sd, scan))
  out = tmp_path / 'bv.safetensors'
  info = convert.convert('siglip2_b16_224', str(tmp_path / 'webli.npz'), str(out), tiny=True)
  assert (info['weights_source'], info['interpolation'], info['source_format']) == ('big_vision', 'tf_bilinear', 'npz')
  got, want = weights_lib.read_tensors(str(out)), weights_lib.read_tensors(str(converted[0]))
  assert sorted(got) == sorted(want)
  for k in want:
    np.testing.assert_array_equal(got[k], want[k], err_msg=k)
  # the default transform follows the weight source (big_vision's resize|value_range(-1, 1))
  pre = get_backbone('siglip2_b16_224', weights=str(out), tiny=True).preprocess
  assert (pre.size, pre.resize, pre.interpolation, pre.mean, pre.std) == (32, 'squash', 'tf_bilinear', (127.5,) * 3,
                                                                           (127.5,) * 3)


def test_open_clip_checkpoint_converts_to_the_same_tensors(reference, converted, tmp_path):
  """open_clip's SigLIP (hf-hub timm/ViT-*-SigLIP*, open_clip_model.safetensors): same tensors, its transform."""
  from safetensors.numpy import save_file
  _, sd = reference
  save_file(_open_clip_state_dict(sd), str(tmp_path / 'open_clip_model.safetensors'))
  out = tmp_path / 'oc.safetensors'
  info = convert.convert('siglip2_b16_224', str(tmp_path / 'open_clip_model.safetensors'), str(out), tiny=True)
  assert (info['weights_source'], info['interpolation']) == ('open_clip', 'bicubic')
  got, want = weights_lib.read_tensors(str(out)), weights_lib.read_tensors(str(converted[0]))
  assert sorted(got) == sorted(want)
  for k in want:
    np.testing.assert_array_equal(got[k], want[k], err_msg=k)
  pre = get_backbone('siglip2_b16_224', weights=str(out), tiny=True).preprocess
  assert (pre.resize, pre.interpolation, pre.mean, pre.std) == ('squash', 'bicubic', (127.5,) * 3, (127.5,) * 3)


def test_default_transform_is_the_weight_sources(converted, tmp_path):
  """open_clip #1068: offline weights must not silently get another transform. HF: equal to transformers'
  SiglipImageProcessor on a real photo; the processor's own resample is honoured; no sidecar -> loud failure."""
  out, _ = converted
  photo = Image.fromarray(np.random.default_rng(0).integers(0, 256, (45, 61, 3), dtype=np.uint8))
  backbone = get_backbone('siglip_b16_224', weights=str(out), tiny=True)
  ours = np.asarray(backbone.preprocess.normalise(images_lib.resize(photo, backbone.preprocess)[None]))[0]
  proc = transformers.SiglipImageProcessor(size={'height': A.image_size, 'width': A.image_size})
  want = proc(images=photo, return_tensors='np')['pixel_values'][0].transpose(1, 2, 0)
  np.testing.assert_allclose(ours, want, atol=1e-6)
  # a preprocessor_config.json beside the checkpoint decides the kernel (2 = bilinear)
  from safetensors.numpy import save_file
  save_file(weights_lib.read_tensors(str(out)), str(tmp_path / 'model.safetensors'))
  cfg = {'image_processor_type': 'SiglipImageProcessor', 'resample': 2, 'image_mean': [0.5] * 3,
         'image_std': [0.5] * 3, 'size': {'height': A.image_size, 'width': A.image_size}}
  (tmp_path / 'preprocessor_config.json').write_text(json.dumps(cfg))
  out2 = tmp_path / 'o.safetensors'
  info = convert.convert('siglip_b16_224', str(tmp_path / 'model.safetensors'), str(out2), tiny=True)
  assert info['interpolation'] == 'bilinear'
  assert get_backbone('siglip_b16_224', weights=str(out2), tiny=True).preprocess.interpolation == 'bilinear'
  (tmp_path / 'preprocessor_config.json').write_text(json.dumps({**cfg, 'image_mean': [0.485, 0.456, 0.406]}))
  with pytest.raises(UserError, match='preprocessor_config.json: not a SigLIP FixRes image processor: image_mean'):
    convert.convert('siglip_b16_224', str(tmp_path / 'model.safetensors'), str(out2), tiny=True)
  # a sharded save (model.safetensors.index.json + shards) reads as one checkpoint
  tensors = weights_lib.read_tensors(str(tmp_path / 'model.safetensors'))
  names = sorted(tensors)
  shards = {'model-00001-of-00002.safetensors': names[:5], 'model-00002-of-00002.safetensors': names[5:]}
  for f, keys in shards.items():
    save_file({k: tensors[k] for k in keys}, str(tmp_path / f))
  (tmp_path / 'model.safetensors.index.json').write_text(json.dumps(
      {'weight_map': {k: f for f, keys in shards.items() for k in keys}}))
  (tmp_path / 'preprocessor_config.json').write_text(json.dumps(cfg))
  info = convert.convert('siglip_b16_224', str(tmp_path / 'model.safetensors.index.json'), str(out2), tiny=True)
  assert info['source_format'] == 'safetensors (sharded)' and info['interpolation'] == 'bilinear'
  (tmp_path / 'o.safetensors.json').unlink()
  with pytest.raises(UserError, match=r'o.safetensors: its sidecar .* is missing'):
    get_backbone('siglip_b16_224', weights=str(out2), tiny=True)
  assert get_backbone('siglip_b16_224', weights=str(out2), tiny=True,
                      preprocessing='big_vision').preprocess.interpolation == 'tf_bilinear'


def test_tf_bilinear_resize_matches_a_plain_loop():
  """big_vision's resize: TF2 resize_bilinear, half-pixel centres, no antialias, float32, then clip and truncate
  to uint8 (ops_image.get_resize casts back to the input dtype); written per pixel from TF's kernel."""
  rng = np.random.default_rng(3)
  for (h, w), size in (((45, 61), 32), ((20, 13), 32)):  # down- and up-sampling
    x = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    got = images_lib.resize(Image.fromarray(x), siglip.preprocess_for(siglip.Arch(8, 32, 1, 4, 48, size), 'big_vision'))
    want = np.zeros((size, size, 3), np.uint8)
    xf = x.astype(np.float32)
    for i in range(size):
      sy = (np.float32(i) + np.float32(0.5)) * (np.float32(h) / np.float32(size)) - np.float32(0.5)
      y0, y1, ly = max(int(np.floor(sy)), 0), min(int(np.ceil(sy)), h - 1), sy - np.floor(sy)
      for j in range(size):
        sx = (np.float32(j) + np.float32(0.5)) * (np.float32(w) / np.float32(size)) - np.float32(0.5)
        x0, x1, lx = max(int(np.floor(sx)), 0), min(int(np.ceil(sx)), w - 1), sx - np.floor(sx)
        top = xf[y0, x0] + (xf[y0, x1] - xf[y0, x0]) * lx
        bottom = xf[y1, x0] + (xf[y1, x1] - xf[y1, x0]) * lx
        want[i, j] = np.clip(top + (bottom - top) * ly, 0, 255).astype(np.uint8)
    np.testing.assert_array_equal(got, want)


def test_converter_refusals(reference, tmp_path, monkeypatch):
  _, sd = reference
  from safetensors.numpy import save_file
  save_file(sd, str(tmp_path / 'model.safetensors'))
  with pytest.raises(UserError, match='model.safetensors: the weights do not fit siglip_b16_384'):
    convert.convert('siglip_b16_384', str(tmp_path / 'model.safetensors'), str(tmp_path / 'o.safetensors'))
  assert not (tmp_path / 'o.safetensors').exists()
  np.savez(tmp_path / 'txt.npz', **{'params/txt/Embed_0/embedding': np.zeros((8, 4))})
  with pytest.raises(UserError, match=r'txt.npz: no image tower'):
    convert.convert('siglip_b16_224', str(tmp_path / 'txt.npz'), str(tmp_path / 'o.safetensors'), tiny=True)
  np.savez(tmp_path / 'raw.npz', **_big_vision_npz(sd, scan=False))
  with pytest.raises(UserError, match=r'raw.npz: a big_vision checkpoint .*convert it once'):
    get_backbone('siglip_b16_224', weights=str(tmp_path / 'raw.npz'), tiny=True)
  monkeypatch.setenv('VISIM_JAX_WEIGHTS', str(tmp_path / 'w'))
  with pytest.raises(UserError, match=r'siglip2_so400m14_384.safetensors.*convert --backbone=siglip2_so400m14_384'):
    get_backbone('siglip2_so400m14_384')


def test_full_size_members_by_shape():
  """Every registered size by jax.eval_shape (no weights made): token count, pooled size (= the registry's data),
  default transform; parameter counts equal to transformers' SiglipVisionModel of the same config (built on the
  meta device: no memory) for B/16 and So400m/14. (registry.shape_dim of the abstract backbone: test_registry.)"""
  nets = {}
  for name, arch in siglip.ARCHS.items():
    if arch not in nets:  # SigLIP and SigLIP 2 members of one size are the same network: one trace each
      x = jax.ShapeDtypeStruct((1, arch.image_size, arch.image_size, 3), np.float32)
      nets[arch] = jax.eval_shape(
          lambda x, a=arch: siglip.SiglipVisionTower(a).init_with_output(jax.random.PRNGKey(0), x), x)
    (pooled, stages), variables = nets[arch]
    assert stages['tokens'].shape == (1, arch.grid ** 2, arch.width), name
    assert pooled.shape == (1, registry.pooled_dim(name)) == (1, arch.width), name
    b = get_backbone(name, abstract=True)
    assert b.layers == ('pooled',), name
    pre = b.preprocess
    assert (pre.size, pre.resize, pre.interpolation) == (arch.image_size, 'squash', 'bicubic'), name
  assert len(nets) == 5
  assert siglip.ARCHS['siglip_so400m14_384'].grid ** 2 == 729  # 384 // 14 = 27 (VALID patches)
  for name in ('siglip_b16_224', 'siglip_so400m14_384'):
    arch = siglip.ARCHS[name]
    with torch.device('meta'):
      want = sum(p.numel() for p in transformers.SiglipVisionModel(_hf_config(arch)).parameters())
    assert sum(int(np.prod(s.shape)) for s in jax.tree.leaves(nets[arch][1])) == want, name
