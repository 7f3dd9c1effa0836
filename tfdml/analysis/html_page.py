"""The retrieval results as one self-contained HTML page: :func:`retrieval_html`."""

from __future__ import annotations

import base64
import html
import os

from tfdml._files import write_text
from tfdml.analysis._display import display, png_bytes
from tfdml.analysis._tiles import describe, prepare, tile_rows

__all__ = ["retrieval_html"]

_STYLE = """
body { font-family: sans-serif; margin: 1em; }
table { border-collapse: separate; border-spacing: 6px; }
th { font-weight: normal; text-align: left; vertical-align: top; font-size: 0.85em; }
td.tile { vertical-align: top; text-align: center; font-size: 0.8em; width: 104px;
          border: 4px solid transparent; padding: 2px; }
td.query { border-color: #3a5a98; }
td.correct { border-color: #1b9e3e; }
td.wrong { border-color: #d62728; }
td.unknown { border-color: #8c8c8c; border-style: dashed; }
td.empty { border: 4px dotted #dddddd; color: #999999; }
img { height: 96px; width: auto; image-rendering: pixelated; display: block; margin: auto; }
.mark { font-weight: bold; }
.text { min-height: 3em; padding: 0.5em 0; overflow-wrap: anywhere; }
"""

_MARK_WORDS = {"query": "query", "correct": "\u2713 correct", "wrong": "\u2717 wrong",
               "unknown": "? unknown", "empty": "(empty)"}


def _html_tile(tile, images):
    esc = html.escape
    if tile.kind == "empty":
        return '<td class="tile empty"><span class="mark">(empty)</span></td>'
    lines = describe(tile)
    if images is not None:
        data = base64.b64encode(png_bytes(display(images[tile.position]))).decode("ascii")
        what = "query" if tile.kind == "query" else "gallery item"
        picture = f'<img src="data:image/png;base64,{data}" alt="{what} {tile.position}">'
    else:
        centre = lines or ["query" if tile.kind == "query" else f"item {tile.position}"]
        picture = f'<div class="text">{"<br>".join(esc(s) for s in centre)}</div>'
    head = [] if tile.kind == "query" else [f"score {tile.score}"]
    caption = "<br>".join(esc(s) for s in head + lines)
    return (f'<td class="tile {tile.kind}">{picture}<span class="mark">'
            f'{esc(_MARK_WORDS[tile.kind])}</span><br>{caption}</td>')


def retrieval_html(path, results, query_images=None, gallery_images=None, queries=None, k=None,
                   title: str = "Retrieval results"):
    """Writes queries and their nearest neighbours as one self-contained HTML page.

    The page has a table with one row per query, as
    :func:`tfdml.analysis.plot_retrieval`: the query, then its ``k`` nearest
    neighbours. Each neighbour's cell has a coloured border *and* a text mark:
    ``✓ correct`` (green), ``✗ wrong`` (red), ``? unknown`` (grey, dashed:
    ``results`` has no labels); empty slots say ``(empty)``. Under each: the
    score (``nan`` shown as such), the label and the id when ``results`` has
    them, HTML-escaped. Images are inline PNG data URIs (made with Pillow, else
    matplotlib), scaled as for :func:`tfdml.analysis.plot_retrieval` and shown
    96 pixels high; the page needs no other file, script or network access.
    Non-ASCII text is written as character references, so the file is ASCII.

    Args:
        path: the ``.html`` file to write (its directory is created). Written
            whole or not at all.
        results: a :class:`tfdml.search.RetrievalResults`.
        query_images: images of the queries, one per row of ``results``.
            Defaults to `None` (text cells).
        gallery_images: images of the gallery, indexed by
            ``results.indices``. Defaults to `None` (text cells).
        queries: the query rows, in this order. Defaults to `None` (the first
            8).
        k: neighbours per row. Defaults to `None` (``min(results.k, 5)``).
        title: the page title. Defaults to `"Retrieval results"`.

    Returns:
        ``path``.

    Raises:
        ValueError: as :func:`tfdml.analysis.plot_retrieval`.
        ImportError: images given and neither Pillow nor matplotlib installed.

    Examples:

    >>> rows = tfdml.analysis.worst_queries(results, n=20)
    >>> tfdml.analysis.retrieval_html("worst.html", results, x_query, x_gallery, queries=rows)
    """
    rows, k, query_images, gallery_images = prepare(results, query_images, gallery_images,
                                                    queries, k)
    esc = html.escape
    body = []
    for row, tiles in zip(rows, tile_rows(results, rows, k), strict=True):
        cells = [_html_tile(tiles[0], query_images)]
        cells += [_html_tile(tile, gallery_images) for tile in tiles[1:]]
        body.append(f'<tr><th scope="row">query {row}</th>{"".join(cells)}</tr>')
    header = "".join(f"<th>{rank}</th>" for rank in range(1, k + 1))
    nearer = "smaller" if results.metric == "l2" else "larger"
    page = (
        f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{esc(title)}</title>\n<style>{_STYLE}</style>\n</head>\n<body>\n"
        f"<h1>{esc(title)}</h1>\n<p>Each row: a query, then its nearest neighbours, nearest "
        f"first. Scores: {esc(str(results.metric))} ({nearer} is nearer). Marks: "
        f"\u2713 correct (green), \u2717 wrong (red), ? unknown (grey).</p>\n"
        f"<table>\n<thead><tr><th></th><th>query</th>{header}</tr></thead>\n<tbody>\n"
        + "\n".join(body) + "\n</tbody>\n</table>\n</body>\n</html>\n"
    )
    folder = os.path.dirname(os.fspath(path))
    if folder:
        os.makedirs(folder, exist_ok=True)
    write_text(path, page.encode("ascii", "xmlcharrefreplace").decode("ascii"))
    return path
