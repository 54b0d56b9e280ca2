"""Contact sheets of search results: a PNG (matplotlib) and an HTML page with image paths relative to it.

rows: [{'query': path, 'partner': path or None, 'partner_rank': int or None,
        'results': [{'path', 'name', 'score'}]}]; the partner, when known, is framed in green.
"""
from __future__ import annotations

import html
import os
import urllib.parse

import numpy as np

from visim_jax.core import ops, report


def _thumb(path: str, size: int = 128) -> np.ndarray:
  from visim_jax.data import images as images_lib
  im = images_lib.open_rgb(path)
  im.thumbnail((size, size))
  return np.asarray(im)


def _is_partner(row: dict, res: dict) -> bool:
  return row.get('partner') is not None and os.path.abspath(res['path']) == os.path.abspath(row['partner'])


def contact_sheet_png(rows: list[dict], path: str, title: str = '') -> None:
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  ncol = 1 + max(len(r['results']) for r in rows)
  fig, axes = plt.subplots(len(rows), ncol, figsize=(1.7 * ncol, 1.95 * len(rows)), squeeze=False)
  for ax in axes.flat:
    ax.axis('off')
  for r, row in enumerate(rows):
    ax = axes[r, 0]
    ax.imshow(_thumb(row['query']))
    label = os.path.basename(row['query'])
    if row.get('partner_rank') is not None:
      label += f'\npartner rank {row["partner_rank"]}'
    ax.set_title(f'query\n{label}', fontsize=7, color='navy')
    for c, res in enumerate(row['results'], start=1):
      ax = axes[r, c]
      ax.imshow(_thumb(res['path']))
      hit = _is_partner(row, res)
      ax.set_title(f'{c}. {os.path.basename(res["name"])}\n{res["score"]:.3f}', fontsize=7,
                   color='green' if hit else 'black')
      if hit:
        ax.axis('on')
        ax.set_xticks([]), ax.set_yticks([])
        for spine in ax.spines.values():
          spine.set_edgecolor('green'), spine.set_linewidth(3)
  fig.tight_layout()
  if title:  # after tight_layout, above the first row's titles
    fig.suptitle(title, fontsize=9, y=1.0, va='bottom')
  report.save_figure(fig, path)


def contact_sheet_html(rows: list[dict], path: str, title: str = '') -> None:
  folder = os.path.dirname(os.path.abspath(path))
  src = lambda p: urllib.parse.quote(os.path.relpath(os.path.abspath(p), folder).replace(os.sep, '/'))
  esc = html.escape
  out = ['<!doctype html><html><head><meta charset="utf-8"><title>look-alikes</title><style>',
         'body{font-family:sans-serif;font-size:12px} td{vertical-align:top;text-align:center;padding:4px}',
         'img{width:128px;height:128px;object-fit:contain;border:3px solid transparent}',
         '.q img{border-color:navy} .hit img{border-color:green}</style></head><body>',
         f'<h3>{esc(title)}</h3><table>']
  for row in rows:
    cells = [f'<td class="q"><img src="{src(row["query"])}"><br>query<br>{esc(os.path.basename(row["query"]))}'
             + (f'<br>partner rank {row["partner_rank"]}' if row.get('partner_rank') is not None else '') + '</td>']
    for c, res in enumerate(row['results'], start=1):
      cells.append(f'<td class="{"hit" if _is_partner(row, res) else ""}"><img src="{src(res["path"])}"><br>{c}. '
                   f'{esc(res["name"])}<br>{res["score"]:.3f}</td>')
    out.append('<tr>' + ''.join(cells) + '</tr>')
  out.append('</table></body></html>')
  if report.is_writer():
    ops.atomic_write_text(path, '\n'.join(out) + '\n')
