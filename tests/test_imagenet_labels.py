"""ImageNet labels ship with the package (paper_data/imagenet_labels.txt): read without tensorflow_datasets."""
import ast
import importlib.util
import os
import sys

import pytest

from visim_jax.backbones import efficientnet_lite


def test_labels_without_tensorflow_datasets(monkeypatch):
  monkeypatch.setitem(sys.modules, 'tensorflow_datasets', None)  # `import tensorflow_datasets` raises ImportError
  efficientnet_lite.imagenet_labels.cache_clear()
  try:
    labels = efficientnet_lite.imagenet_labels()
    bb = efficientnet_lite.efficientnet_lite0(abstract=True)
    from visim_jax import classify
    with pytest.raises(ImportError):
      import tensorflow_datasets  # noqa: F401
  finally:
    efficientnet_lite.imagenet_labels.cache_clear()
  assert len(labels) == 1000 and len(set(labels)) == 1000
  assert labels[0].startswith('tench') and labels[285] == 'Egyptian cat' and labels[999].startswith('toilet tissue')
  assert bb.labels == labels and callable(classify.top_classes)


def test_labels_equal_the_tfds_list_they_were_written_from():
  spec = importlib.util.find_spec('tensorflow_datasets')
  if spec is None:
    pytest.skip('tensorflow_datasets not installed')
  path = os.path.join(list(spec.submodule_search_locations)[0], 'datasets', 'siscore', 'labels.py')
  if not os.path.exists(path):
    pytest.skip('this tensorflow_datasets has no siscore/labels.py')
  tree = ast.parse(open(path).read())
  want = next(tuple(ast.literal_eval(n.value)) for n in tree.body
              if isinstance(n, ast.Assign) and getattr(n.targets[0], 'id', '') == 'IMAGENET_LABELS_LIST')
  assert efficientnet_lite.imagenet_labels() == want
