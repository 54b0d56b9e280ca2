"""losses/: the training objectives, pure functions of model outputs and targets.

symmetric_ce (paper 001, Eq. 1), odd_one_out (AligNet's hard / KL / JSD triplet losses), hinge (DreamSim's 2AFC hinge).
"""
