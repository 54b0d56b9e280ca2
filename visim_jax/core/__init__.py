"""core/: the leaves every layer uses; imports nothing else of visim_jax.

errors (UserError, one-line reports), native_log, paths, checks (config-field checks), ops (small array helpers),
readers (bad bytes -> one line), safe_pickle (the only unpickler), memory (estimates before allocation), precision,
report (console tables, JSON, process 0), device_rows and sharding (rows and meshes over devices), pca.
"""
