"""Figures, one module per paper: adapt (paper 001: aR@k, training curves, retrieval sheet), simnet (paper 002:
training curve, warm-up scatter, score vs cosine). Each function takes arrays and a path and saves a PNG through
report.save_figure (atomic, process 0 only). matplotlib is imported by these modules only (Agg backend).
"""
