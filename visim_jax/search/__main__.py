"""python -m visim_jax.search --folder=F --query=all|FILES [--adapter=A] [...]: see visim_jax/search/__init__.py
and docs/search.md. User errors end with one line `error: <flag or file>: <what to do>` on stderr, exit 1."""
from absl import flags

from visim_jax.core import errors
from visim_jax.search import folder

_FOLDER = flags.DEFINE_string('folder', None, 'Image folder to index, or a pairs folder (left/, right/).')
_QUERY = flags.DEFINE_list('query', None, "Query image files or folders (comma-separated), or 'all'.")
_ADAPTER = flags.DEFINE_string('adapter', None, 'adapter.npz of a trained adaptation (visim_jax/training/adapter_file.py).')
_BACKBONE = flags.DEFINE_string('backbone', None, "Default: the adapter's backbone, else efficientnet_lite0.")
_LAYERS = flags.DEFINE_string('layers', None, "Comma-separated stages (default: the adapter's / backbone's).")
_K = flags.DEFINE_integer('k', 10, 'Look-alikes per query.')
_OUT = flags.DEFINE_string('out', 'search_out', 'Output folder.')
_CACHE = flags.DEFINE_string('cache_dir', None, "Feature cache (default ~/.cache/visim_jax/features; 'none').")
_BATCH = flags.DEFINE_integer('batch_size', 32, 'Images per extraction batch.')
_DTYPE = flags.DEFINE_enum('dtype', 'float32', ['float32', 'bfloat16'], 'Backbone compute dtype.')
_INDEX_DTYPE = flags.DEFINE_enum('index_dtype', 'float32', ['float32', 'bfloat16'], 'Stored index dtype.')
_BLOCK = flags.DEFINE_integer('block', 4096, 'At most this many database rows per index block on each device.')
_QBLOCK = flags.DEFINE_integer('query_block', 256, 'Queries per device call.')
_SHEET_Q = flags.DEFINE_integer('sheet_queries', 12, 'Queries shown in the contact sheets.')
_SHEET_K = flags.DEFINE_integer('sheet_k', 8, 'Results shown per query in the sheets.')
_FORMAT = flags.DEFINE_list('format', ['png', 'html'], 'Contact sheet formats: png, html, both or none.')
_PROGRESS = flags.DEFINE_bool('progress', True, 'Progress bars (--noprogress: none).')
_STRICT = flags.DEFINE_bool('strict', False, 'Abort on the first image that cannot be decoded (default: skip '
                            'it and list it in the output and results.json).')


def main(argv):
  if len(argv) > 1:
    raise errors.UserError(f'unexpected arguments {argv[1:]}: several query files go as --query=a.jpg,b.jpg')
  if not _FOLDER.value:
    raise errors.UserError('--folder: required: the folder of images to index')
  folder.run(_FOLDER.value, _QUERY.value, _ADAPTER.value, _BACKBONE.value, _LAYERS.value, _K.value, _OUT.value,
             _CACHE.value, _BATCH.value, _DTYPE.value, _INDEX_DTYPE.value, _BLOCK.value, _QBLOCK.value,
             _SHEET_Q.value, _SHEET_K.value, tuple(_FORMAT.value), _PROGRESS.value, strict=_STRICT.value)


if __name__ == '__main__':
  errors.run(main)  # user errors and bad flags as one line `error: ...`, exit 1
