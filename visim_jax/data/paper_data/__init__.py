"""Published numbers the experiments print beside ours, as package data with their source.

table1.csv: paper 001 (Risser-Maroix et al., "Learning an adaptation function to assess image visual
similarities", arXiv 2206.01417), annex, Table 1: 37 frozen backbones on TLL_obj, 20 runs. Every cell
equals the same table printed in the ORASIS 2021 version (paper 000), which we follow for the one cell the
arXiv text garbles: resnet18 / resnet34 'Concatenated Size' 960 (arXiv text: '096'; 64+128+256+512). Columns:
  name                 our registry name (Table 1's lower case, '-' -> '_', ss1/sws1/ws1 -> ssl/swsl/wsl,
                       clip_vit32_b -> clip_vit_b32); paper_name as printed (clip_rm* read as clip_rn*)
  last_layer_only      1 for the rows marked '*' (only one of the last layers pooled)
  concatenated_size    length of the concatenated pooled vector
  pca_variance_sum     explained variance ratio kept by the 256 PCA components
  concatenated_score   aR@1 of cosine on the concatenated vectors (+- concatenated_std over runs)
  pca_score            aR@1 of cosine on the 256-d PCA vectors (no std printed)
  ar1_sigma1/15        aR@1 after adaptation at sigma = 1 / 15 (+- *_std: one standard deviation over runs)
"""
from __future__ import annotations

import csv
import functools
import importlib.resources

SOURCE = 'paper 001 (arXiv 2206.01417) annex Table 1 = paper 000 (ORASIS 2021) annex A Table 1'
_TEXT = ('name', 'paper_name', 'learning_type', 'dataset')
_INT = ('last_layer_only', 'concatenated_size')


@functools.lru_cache(maxsize=None)
def _table1() -> tuple[tuple[str, dict], ...]:
  text = importlib.resources.files(__name__).joinpath('table1.csv').read_text()
  rows = []
  for row in csv.DictReader(text.splitlines()):
    typed = {k: (v if k in _TEXT else int(v) if k in _INT else float(v)) for k, v in row.items()}
    rows.append((typed['name'], typed))
  return tuple(rows)


def table1() -> dict[str, dict]:
  """Table 1's rows in the paper's order, keyed by our backbone name (a fresh copy)."""
  return {name: dict(row) for name, row in _table1()}


# human_judgements.csv: published scores on the human-judgement protocols, one row a (protocol, subset, model),
# each with its source. Columns: protocol (nights | bapps_2afc | bapps_jnd | things | the quality sets),
# subset (the leaderboard's:
# a NIGHTS split, a BAPPS set...), model (as the source names it), spec (our config.models spec of the same
# model and weights, '' when we have none: the row is listed under "published", not beside one of ours), score
# (a fraction), source. NIGHTS: the DreamSim README's "updated NIGHTS performance table" (DreamSim models tuned
# on NIGHTS train; val and test 2AFC); `cosine:dreamsim_*` are the same models (backbones/dreamsim.py: DreamSim's
# distance is 1 - cos of its embedding; the patch models' embedding is cat(CLS, mean patch token)).
# `nights@linf:4/255` / `nights@l2:3`: attacked 2AFC accuracy (docs/robustness.md), from Croce et al.'s README table.
# csiq / live / tid2013 (the quality protocol, subset SRCC | KRCC): pyiqa's FR benchmark table (docs/metrics.md says
# which of its models are ours: psnr, fsim, lpips:alex, lpips:vgg, dists); its PLCC is linear, ours after the
# five-parameter logistic (metrics/quality.py), so its PLCC is not stored. tid2013 / kadid / pipal SRCC: piq's
# README benchmark table, its PIQ column (piq's code = our default variants: `spec` set) and its Reference column
# (the metrics' papers and surveys as piq cites them, two decimals: `spec` '').

@functools.lru_cache(maxsize=None)
def _human() -> tuple[dict, ...]:
  text = importlib.resources.files(__name__).joinpath('human_judgements.csv').read_text()
  return tuple({**r, 'score': float(r['score'])} for r in csv.DictReader(text.splitlines()))


def human_judgements() -> list[dict]:
  """Published scores on NIGHTS / BAPPS / THINGS (fresh copies), with their source."""
  return [dict(r) for r in _human()]
