"""Figures, one module per paper: adapt (paper 001: aR@k, training curves, retrieval sheet), simnet (paper 002:
training curve, warm-up scatter, score vs cosine), histograms (paper 003), twoafc (paper 004: per-context
accuracy, Table 8 matrix, credibility maps, Table 6 rows, ensemble-size sweep). Each function takes arrays and
a path and saves a PNG through report.save_figure (atomic, process 0 only). matplotlib is imported by these
modules only (Agg backend).
"""
