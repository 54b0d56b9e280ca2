"""training/: the jitted programs and the runtime that drives them.

runtime (lock, fingerprint, Orbax checkpoints, resume, the record written last) and workdir; the programs:
adaptation_runs (paper 001, every run vmapped), head_step (heads on triplets, AligNet's chain), human_heads (heads on
NIGHTS votes); the files runs write (adapter_file, head_file); compile_cache, distributed, collapse.
"""
