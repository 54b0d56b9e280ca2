r"""Look-alike search: index a folder of images, answer query images with their top-k look-alikes.

  python -m visim_jax.search --folder=photos/ --query=me.jpg --k=8 --out=search_out
  python -m visim_jax.search --folder=photos/ --query=a.jpg,b.jpg --adapter=workdirs/demo/adapter.npz
  python -m visim_jax.search --folder=TLL/ --query=all --adapter=W/adapter.npz     # pairs folder: evaluate

Similarity is the cosine of the pooled backbone features (paper 001, Sec. 3) or, with --adapter, of the adapted
vectors relu(((x - mean) @ components * scale) @ w) (visim_jax/training/adapter_file.py). One file per idea:

  topk.py    the pure math: blocked exact top-k (ops.running_topk) and partner ranks over a sharded database
  index.py   the host side of the index: build_index (normalise, pad, shard over the local devices), search,
             partner_ranks in fixed-size query chunks, rank_metrics
  folder.py  a folder or pairs folder -> features (cache, adapter, bad images skipped and listed) -> outputs
  sheets.py  contact sheets (PNG, HTML)
  __main__   the command line (absl flags; user errors as one line `error: ...`, exit 1)

Outputs in --out: results.json (schema in docs/search.md), topk.npz (scores, indices, names), sheet.png and
sheet.html.
"""
from visim_jax.search.folder import features_of, run
from visim_jax.search.index import Index, build_index, partner_ranks, rank_metrics, search

__all__ = ['Index', 'build_index', 'features_of', 'partner_ranks', 'rank_metrics', 'run', 'search']
