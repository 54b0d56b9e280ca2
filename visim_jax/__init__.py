"""visim_jax: learning and measuring visual image similarity (four papers) in JAX.

The house, bottom to top (imports go one way): leaves (ops, errors, preprocess, safe_pickle) <- data/ (one
loader per source) and backbones/ (one module per family) <- features.py (pooling, extraction, cache, backbone
config glue) <- the pure math per paper (adaptation, pca, train, simnet, rmac, triplets, ensembles, metrics/)
<- runtime.py (the one training loop: lock, fingerprint, Orbax, resume), plots/, report.py <- experiments/
(wiring only) <- main.py and the other command-line tools (search/, classify, export). See README "Layout".
"""
