"""hub/: where public weights and data sets come from (sources: URLs, sizes, checksums) and how they arrive (download).

The command that uses them is the face `python -m visim_jax.fetch`; imports core only.
"""
