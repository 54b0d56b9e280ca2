"""zoo/: every model by its spec string (cosine:, adapter:, simnet:, context:, triplets:, lpips:): `similarity`.

It sits above training/ because a spec may name what a run wrote (a workdir, adapter.npz, head.npz); the library
(`visim_jax.load`), the leaderboard and the search all build their models here.
"""
