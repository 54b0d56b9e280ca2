"""models/: pure functions of params and arrays that turn features or images into similarities.

adaptation (paper 001's a = ReLU(W d)), simnet (paper 002), context (paper 004's context-sensitive models),
ensembles (paper 004's fused distances), heads (linear / MLP heads on frozen features), lpips (LPIPS v0.1 on a
backbone's stages). No I/O, no config.
"""
