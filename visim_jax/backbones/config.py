"""MOVED: the backbone config glue is part of visim_jax.features (add_fields, build, cache_dir, describe,
features_of). This shim only keeps not-yet-updated importers working and is deleted once none is left."""
from visim_jax.features import add_fields, build, cache_dir, describe, features_of  # noqa: F401
from visim_jax.features import backbone_kwargs as kwargs  # noqa: F401
