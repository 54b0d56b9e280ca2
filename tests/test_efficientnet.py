"""The offline pretrained backbone reproduces the network: real ImageNet predictions on packaged photos."""
import jax
import numpy as np
from PIL import Image
from skimage import data

from visim_jax.data.images import resize

CAT_CLASSES = set(range(281, 286))  # tabby, tiger cat, Persian, Siamese, Egyptian cat
ESPRESSO = 967


def _probs(bb, arr):
  x = resize(Image.fromarray(arr).convert('RGB'), bb.preprocess)[None]
  logits, _ = jax.jit(bb.__call__)(x)
  return np.asarray(jax.nn.softmax(logits[0]))


def test_chelsea_is_a_cat_and_coffee_is_espresso(lite0):
  p = _probs(lite0, data.chelsea())
  assert CAT_CLASSES & set(np.argsort(-p)[:3].tolist())
  assert 'cat' in lite0.labels[int(np.argmax(p))]
  p = _probs(lite0, data.coffee())
  assert int(np.argmax(p)) == ESPRESSO and lite0.labels[ESPRESSO] == 'espresso'


def test_stages_and_labels(lite0):
  names = lite0.stage_names()
  assert {'stem', 'head', 'block1', 'block7'} <= set(names)
  assert len(lite0.labels) == 1000 and lite0.labels[0].startswith('tench')
  assert len(lite0.weights_id) == 64  # sha256 of the weights file


def test_bfloat16_close_to_float32(lite0):
  import jax.numpy as jnp
  x = resize(Image.fromarray(data.coffee()), lite0.preprocess)[None]
  f32, _ = jax.jit(lite0.__call__)(x)
  bf16, _ = jax.jit(lambda x: lite0(x, jnp.bfloat16))(x)
  assert int(np.argmax(f32)) == int(np.argmax(bf16))


def test_classify_cli_prints_top5(tmp_path):
  import subprocess
  import sys
  path = tmp_path / 'coffee.png'
  Image.fromarray(data.coffee()).save(path)
  out = subprocess.run([sys.executable, '-m', 'visim_jax.classify', str(path)], capture_output=True, text=True,
                       check=True, env={**__import__('os').environ, 'JAX_PLATFORMS': 'cpu'}).stdout
  lines = out.strip().splitlines()
  # first the model and what the numbers are, then the image and its five classes
  assert lines[0].startswith('efficientnet_lite0 (weights ') and 'softmax probabilit' in lines[0]
  assert lines[1] == 'coffee.png' and len(lines) == 7 and 'espresso' in lines[2]


def test_depthwise_implementations_agree(lite0):
  import jax.numpy as jnp
  from visim_jax.backbones import efficientnet_lite
  rng = np.random.RandomState(0)
  for k, s, h in ((3, 1, 9), (5, 2, 10), (3, 2, 7)):
    x = jnp.asarray(rng.randn(2, h, h + 1, 6).astype(np.float32))
    w = jnp.asarray(rng.randn(k, k, 1, 6).astype(np.float32))
    a = efficientnet_lite.depthwise_conv(x, w, s, 'conv')
    b = efficientnet_lite.depthwise_conv(x, w, s, 'shifted')
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)
  x = resize(Image.fromarray(data.coffee()), lite0.preprocess)[None]
  conv = efficientnet_lite.efficientnet_lite0(depthwise_impl='conv')
  np.testing.assert_allclose(np.asarray(jax.jit(conv.__call__)(x)[0]), np.asarray(jax.jit(lite0.__call__)(x)[0]),
                             atol=1e-3)
