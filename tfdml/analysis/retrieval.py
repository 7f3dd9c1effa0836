"""Pictures of retrieval results, and an export for TensorBoard's embedding projector.

A :class:`tfdml.search.RetrievalResults` holds each query's ranked neighbours
(scores, gallery positions, labels, ids). This module shows them to a person:

* :func:`worst_queries` orders the queries from worst to best (average
  precision over the retrieved list, or the rank of the first correct item);
* :func:`plot_retrieval` draws a matplotlib ``Figure``: one row per query, the
  query then its top-k neighbours, each framed green (correct), red (wrong) or
  grey (correctness unknown), with its score, label and id under it;
* :func:`plot_worst_queries` draws the worst queries, their value in each
  row's title;
* :func:`retrieval_html` writes the same rows as one self-contained HTML page
  (images inline);
* :func:`projector_export` writes the files TensorBoard's embedding projector
  reads (tensor TSV, metadata TSV, sprite image, ``projector_config.pbtxt``),
  without TensorFlow.

**Images** are ``[N, H, W]``, ``[N, H, W, 1]`` (grey) or ``[N, H, W, 3]`` (RGB)
arrays. ``uint8`` images are shown as they are; float images (any other dtype
too) whose finite values all lie in ``[0, 1]`` are shown as they are (``1`` is
white); any other range is min-max scaled per image (a constant image is shown
black), and NaN or Inf pixels are shown black.

Every file is written whole or not at all (a temporary file renamed over the
target), so a run killed during a write leaves the previous file or none.
matplotlib is needed for the figures only: ``pip install matplotlib``.
"""

from __future__ import annotations

import base64
import html
import io
import math
import os
from typing import NamedTuple

import numpy as np

from tfdml._checks import check_choice, check_int
from tfdml._files import atomic_path, write_text
from tfdml.search import at_indices, check_finite

__all__ = [
    "BY",
    "plot_retrieval",
    "plot_worst_queries",
    "projector_export",
    "retrieval_html",
    "worst_queries",
]

#: The orders of :func:`worst_queries`.
BY = ("average_precision", "first_correct")
#: Frame colours of the tiles: the query, a correct / wrong neighbour, correctness unknown.
COLORS = {"query": "#3a5a98", "correct": "#1b9e3e", "wrong": "#d62728", "unknown": "#8c8c8c"}
#: Text marks of the tiles (for readers who do not tell red from green).
MARKS = {"correct": "\u2713", "wrong": "\u2717", "unknown": "?"}
#: The largest sprite TensorBoard's projector shows, in pixels per side.
MAX_SPRITE = 8192
#: Queries drawn by default, and neighbours drawn by default (at most).
DEFAULT_QUERIES, DEFAULT_K = 8, 5


# -- arguments ----------------------------------------------------------------------------------


def _numpy(x):
    """``x`` as a NumPy array (a tensor of any Keras backend, a list...)."""
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        try:
            from keras import ops

            return ops.convert_to_numpy(x)
        except Exception:  # not a tensor of the backend: NumPy's own conversion
            pass
    return np.asarray(x)


def _check_results(results):
    indices = getattr(results, "indices", None)
    scores = getattr(results, "scores", None)
    if indices is None or scores is None or np.ndim(indices) != 2:
        raise ValueError(
            "`results` must be a tfdml.search.RetrievalResults (`Index.retrieve(...)` returns "
            f"one). Received: results of type {type(results).__name__}"
        )


def _has_labels(results):
    return results.labels is not None and results.query_labels is not None


def _correct(results):
    """``[Q, k]`` bool, or None without labels."""
    return results.correct if _has_labels(results) else None


def _check_queries(queries, num):
    if queries is None:
        return np.arange(min(DEFAULT_QUERIES, num), dtype=np.int64)
    rows = np.atleast_1d(_numpy(queries))
    if rows.ndim != 1 or rows.dtype == bool or not np.issubdtype(rows.dtype, np.integer):
        raise ValueError("`queries` must be a 1-D array of query row indices (integers). "
                         f"Received: queries={queries!r}")
    if len(rows) == 0:
        raise ValueError("`queries` is empty: give at least one query row.")
    bad = rows[(rows < 0) | (rows >= num)]
    if len(bad):
        raise ValueError(f"`queries` must be rows of `results`, in [0, {num}). Received: "
                         f"queries with {bad[0]} (results has {num} queries)")
    return rows.astype(np.int64)


def _check_k(k, results):
    if k is None:
        return min(results.k, DEFAULT_K)
    k = check_int("k", k, 1)
    if k > results.k:
        raise ValueError(f"`k` must be at most the length of the lists, results.k = {results.k}. "
                         f"Received: k={k}")
    return k


def _check_images(name, images, rows, exact):
    """``images`` as a NumPy array of ``[N, H, W(, 1 or 3)]`` images with enough rows."""
    if images is None:
        return None
    images = _numpy(images)
    shape = images.shape
    if not (images.ndim == 3 or (images.ndim == 4 and shape[-1] in (1, 3))):
        raise ValueError(f"`{name}` must be [N, H, W], [N, H, W, 1] or [N, H, W, 3] images. "
                         f"Received: {name}.shape={shape}")
    if not (images.dtype == bool or np.issubdtype(images.dtype, np.number)):
        raise ValueError(f"`{name}` must hold numbers. Received: {name}.dtype={images.dtype}")
    if exact and len(images) != rows:
        raise ValueError(f"`{name}` must have one image per query row of `results` ({rows}). "
                         f"Received: {name}.shape={shape}")
    if not exact and len(images) < rows:
        raise ValueError(f"`{name}` must hold every gallery position in `results.indices` (up "
                         f"to {rows - 1}, so at least {rows} images). Received: {name}.shape="
                         f"{shape}")
    return images


def _prepare(results, query_images, gallery_images, queries, k):
    _check_results(results)
    rows = _check_queries(queries, len(results))
    k = _check_k(k, results)
    query_images = _check_images("query_images", query_images, len(results), exact=True)
    largest = int(np.max(results.indices, initial=-1))
    gallery_images = _check_images("gallery_images", gallery_images, largest + 1, exact=False)
    return rows, k, query_images, gallery_images


# -- the order of the queries -------------------------------------------------------------------


def _query_values(results, by):
    """``[Q]`` float64: average precision (larger is better), or the rank of the first correct
    item (smaller is better; ``inf`` without one)."""
    check_choice("by", by, BY)
    _check_results(results)
    if not _has_labels(results):
        raise ValueError(
            "Ordering queries needs the labels of the queries and of their neighbours: "
            "`results` has no labels (retrieve with `query_labels=` from an index with "
            f"labels). Received: results.labels is None: {results.labels is None}, "
            f"results.query_labels is None: {results.query_labels is None}"
        )
    hits = results.correct.astype(np.float64)
    if by == "first_correct":
        found = hits.any(axis=1)
        return np.where(found, np.argmax(hits, axis=1) + 1.0, np.inf)
    cumulative = np.cumsum(hits, axis=1)
    ranks = np.arange(1, hits.shape[1] + 1, dtype=np.float64)
    total = cumulative[:, -1] if hits.shape[1] else np.zeros(len(hits))
    precision_sum = (hits * cumulative / ranks).sum(axis=1)
    return np.where(total > 0, precision_sum / np.maximum(total, 1.0), 0.0)


def worst_queries(results, n: int = 8, by: str = "average_precision") -> np.ndarray:
    """The rows of the ``n`` worst queries of ``results``, worst first.

    ``by="average_precision"``: the average precision over the retrieved list,
    ``AP = (1 / H) * sum_j j / r_j`` where ``r_1 < r_2 < ... < r_H`` are the
    ranks (1-based positions in the list) of the ``H`` correct items retrieved:
    the mean of the precisions at the ranks of the correct items. Only the
    retrieved list counts (``H`` is not the number of relevant items in the
    gallery); a query without a correct item in its list scores 0, the worst.

    ``by="first_correct"``: the rank of the first correct item; a query without
    one is worse than any that has one.

    Ties go to the lower row. A slot is correct when it holds an item (not an
    empty slot, position ``-1``) of the query's label.

    Args:
        results: a :class:`tfdml.search.RetrievalResults` with labels (of the
            queries and of the neighbours).
        n: number of queries (all of them when ``results`` has fewer).
            Defaults to `8`.
        by: ``"average_precision"`` or ``"first_correct"``. Defaults to
            `"average_precision"`.

    Returns:
        ``[min(n, Q)]`` int64 query rows, worst first.

    Raises:
        ValueError: ``results`` without labels, an unknown ``by``, ``n < 1``.

    Examples:

    >>> rows = tfdml.analysis.worst_queries(results, n=8)
    >>> tfdml.analysis.plot_retrieval(results, x_query, x_gallery, queries=rows)
    """
    n = check_int("n", n, 1)
    values = _query_values(results, by)
    order = np.argsort(values if by == "average_precision" else -values, kind="stable")
    return order[:n].astype(np.int64)


# -- the tiles ----------------------------------------------------------------------------------


class _Tile(NamedTuple):
    """What one tile shows. ``kind``: ``"query"``, ``"correct"``, ``"wrong"``, ``"unknown"``
    or ``"empty"``; ``position``: the row of the query or gallery images."""

    kind: str
    position: int
    score: str
    label: str | None
    ident: str | None


def _text(value) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value.item() if isinstance(value, np.generic) else value)


def _score_text(score) -> str:
    """The score with 4 significant digits; NaN as ``"nan"`` (never hidden)."""
    score = float(score)
    return "nan" if math.isnan(score) else f"{score:.4g}"


def _rows(results, rows, k):
    """One list of :class:`_Tile` per query row: the query, then ``k`` neighbours."""
    correct = _correct(results)
    out = []
    for row in rows:
        label = None if results.query_labels is None else _text(results.query_labels[row])
        ident = None if results.query_ids is None else _text(results.query_ids[row])
        tiles = [_Tile("query", int(row), "", label, ident)]
        for slot in range(k):
            position = int(results.indices[row, slot])
            if position < 0:
                tiles.append(_Tile("empty", -1, "", None, None))
                continue
            kind = "unknown" if correct is None else (
                "correct" if correct[row, slot] else "wrong")
            label = None if results.labels is None else _text(results.labels[row, slot])
            ident = None if results.ids is None else _text(results.ids[row, slot])
            tiles.append(_Tile(kind, position, _score_text(results.scores[row, slot]), label,
                               ident))
        out.append(tiles)
    return out


def _display(image):
    """One image as ``uint8`` ``[H, W]`` (grey) or ``[H, W, 3]``, scaled as the module says."""
    image = np.asarray(image)
    if image.ndim == 3 and image.shape[-1] == 1:
        image = image[..., 0]
    if image.dtype == np.uint8:
        return image
    x = image.astype(np.float64)
    finite = np.isfinite(x)
    values = x[finite]
    if values.size and (values.min() < 0.0 or values.max() > 1.0):
        low, high = values.min(), values.max()
        x = (x - low) / (high - low) if high > low else np.zeros_like(x)
    x = np.where(finite, x, 0.0)
    return np.clip(np.rint(x * 255.0), 0, 255).astype(np.uint8)


def _shorten(text, width=24):
    return text if len(text) <= width else text[:width - 1] + "\u2026"


def _describe(tile, short=False):
    """The label and id lines of a tile."""
    lines = []
    if tile.label is not None:
        lines.append(f"label {tile.label}")
    if tile.ident is not None:
        lines.append(f"id {_shorten(tile.ident) if short else tile.ident}")
    return lines


# -- the figure ---------------------------------------------------------------------------------


def _import_figure():
    try:
        from matplotlib.figure import Figure
    except ImportError as err:
        raise ImportError(
            "Plotting needs matplotlib: `pip install matplotlib` (or, in a clone of tfdml, "
            "`pip install \".[plot]\"`)."
        ) from err
    return Figure


def _draw_tile(ax, tile, images):
    ax.set_xticks([])
    ax.set_yticks([])
    if tile.kind == "empty":
        ax.set_axis_off()
        return
    for spine in ax.spines.values():
        spine.set_edgecolor(COLORS[tile.kind])
        spine.set_linewidth(2.0 if tile.kind == "query" else 3.0)
    if images is not None:
        pixels = _display(images[tile.position])
        ax.imshow(pixels, cmap="gray" if pixels.ndim == 2 else None, vmin=0, vmax=255,
                  interpolation="nearest")
    else:
        centre = _describe(tile, short=True) or [
            "query" if tile.kind == "query" else f"item {tile.position}"]
        ax.text(0.5, 0.5, "\n".join(centre), ha="center", va="center", fontsize="small",
                transform=ax.transAxes, parse_math=False)
        ax.set_box_aspect(1.0)
    if tile.kind == "query":
        caption = [f"query {tile.position}", *_describe(tile, short=True)]
    else:
        caption = [f"{MARKS[tile.kind]} {tile.score}", *_describe(tile, short=True)]
    ax.set_xlabel("\n".join(caption), fontsize="x-small", parse_math=False)  # ids: "$" as is


def _figure(results, query_images, gallery_images, rows, k, figsize, titles):
    Figure = _import_figure()
    tiles = _rows(results, rows, k)
    if figsize is None:
        figsize = (1.45 * (k + 1) + 0.3, 2.05 * len(rows) + 0.3)
    fig = Figure(figsize=figsize, layout="constrained")
    axes = fig.subplots(len(rows), k + 1, squeeze=False)
    for r, row_tiles in enumerate(tiles):
        for c, tile in enumerate(row_tiles):
            _draw_tile(axes[r, c], tile, query_images if c == 0 else gallery_images)
        axes[r, 0].set_title(titles[r], fontsize="small", loc="left")
    return fig


def plot_retrieval(results, query_images=None, gallery_images=None, queries=None, k=None,
                   figsize=None):
    """Draws queries and their nearest neighbours: one row per query.

    Each row shows the query (blue frame), then its ``k`` nearest neighbours,
    nearest first, each framed green and marked ``✓`` when it is correct (an
    item of the query's label), red and marked ``✗`` when it is not, grey and
    marked ``?`` when ``results`` has no labels. Under each tile: the score
    (``"nan"`` for a NaN score, never hidden), the label and the id when
    ``results`` has them (ids longer than 24 characters are cut). Empty slots
    (position ``-1``) are left blank. Without images the tiles show the label
    and id (or the gallery position) as text.

    Images (see :mod:`tfdml.analysis.retrieval`): ``[N, H, W]``,
    ``[N, H, W, 1]`` or ``[N, H, W, 3]``; ``uint8`` shown as they are, floats
    in ``[0, 1]`` shown as they are, any other range min-max scaled per image.

    Args:
        results: a :class:`tfdml.search.RetrievalResults`.
        query_images: images of the queries, one per row of ``results``.
            Defaults to `None` (text tiles).
        gallery_images: images of the gallery, indexed by the positions in
            ``results.indices``. Defaults to `None` (text tiles).
        queries: the query rows to draw, in this order. Defaults to `None`
            (the first 8 rows).
        k: neighbours per row, ``1 <= k <= results.k``. Defaults to `None`
            (``min(results.k, 5)``).
        figsize: matplotlib figure size in inches. Defaults to `None` (about
            1.5 x 2 inches per tile).

    Returns:
        A matplotlib ``Figure`` (made without pyplot: nothing is shown or kept
        open; save it with ``fig.savefig(...)``).

    Raises:
        ImportError: matplotlib is not installed.
        ValueError: ``results`` that is not a ``RetrievalResults``, a query row
            out of range, ``k`` out of range, images of a wrong shape or with
            too few rows.

    Examples:

    >>> results = index.retrieve(x_query_embeddings, k=10, query_labels=y_query)
    >>> fig = tfdml.analysis.plot_retrieval(results, x_query, x_gallery, k=5)
    >>> fig.savefig("neighbours.png", dpi=150)
    """
    rows, k, query_images, gallery_images = _prepare(results, query_images, gallery_images,
                                                     queries, k)
    titles = [f"query {row}" for row in rows]
    return _figure(results, query_images, gallery_images, rows, k, figsize, titles)


def plot_worst_queries(results, query_images=None, gallery_images=None, n: int = 8,
                       by: str = "average_precision", k=None):
    """:func:`plot_retrieval` of the ``n`` :func:`worst_queries`, worst first, each row's
    title giving its value (average precision, or the rank of the first correct item).

    Args:
        results: a :class:`tfdml.search.RetrievalResults` with labels.
        query_images: images of the queries. Defaults to `None`.
        gallery_images: images of the gallery. Defaults to `None`.
        n: number of queries. Defaults to `8`.
        by: ``"average_precision"`` or ``"first_correct"``. Defaults to
            `"average_precision"`.
        k: neighbours per row. Defaults to `None` (``min(results.k, 5)``).

    Returns:
        A matplotlib ``Figure``.

    Raises:
        ImportError: matplotlib is not installed.
        ValueError: as :func:`worst_queries` and :func:`plot_retrieval`.
    """
    rows = worst_queries(results, n=n, by=by)
    values = _query_values(results, by)
    rows, k, query_images, gallery_images = _prepare(results, query_images, gallery_images,
                                                     rows, k)
    titles = []
    for row in rows:
        value = values[row]
        if by == "average_precision":
            titles.append(f"query {row}: AP {value:.3f}")
        elif np.isfinite(value):
            titles.append(f"query {row}: first correct at rank {int(value)}")
        else:
            titles.append(f"query {row}: no correct item in the top {results.k}")
    return _figure(results, query_images, gallery_images, rows, k, None, titles)


# -- the HTML page ------------------------------------------------------------------------------


def _png_bytes(pixels) -> bytes:
    """``uint8`` ``[H, W]`` or ``[H, W, 3]`` pixels as a PNG file, with Pillow, else
    matplotlib."""
    buffer = io.BytesIO()
    try:
        from PIL import Image
    except ImportError:
        try:
            from matplotlib import image as mpl_image
        except ImportError as err:
            raise ImportError("Writing images needs Pillow or matplotlib: `pip install "
                              "pillow`.") from err
        mpl_image.imsave(buffer, pixels, format="png", cmap="gray", vmin=0, vmax=255)
    else:
        Image.fromarray(np.ascontiguousarray(pixels)).save(buffer, format="PNG")
    return buffer.getvalue()


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
    lines = _describe(tile)
    if images is not None:
        data = base64.b64encode(_png_bytes(_display(images[tile.position]))).decode("ascii")
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

    The page has a table with one row per query, as :func:`plot_retrieval`: the
    query, then its ``k`` nearest neighbours. Each neighbour's cell has a
    coloured border *and* a text mark: ``✓ correct`` (green), ``✗ wrong``
    (red), ``? unknown`` (grey, dashed: ``results`` has no labels); empty slots
    say ``(empty)``. Under each: the score (``nan`` shown as such), the label
    and the id when ``results`` has them, HTML-escaped. Images are inline PNG
    data URIs (made with Pillow, else matplotlib), scaled as for
    :func:`plot_retrieval` and shown 96 pixels high; the page needs no other
    file, script or network access. Non-ASCII text is written as character
    references, so the file is ASCII.

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
        ValueError: as :func:`plot_retrieval`.
        ImportError: images given and neither Pillow nor matplotlib installed.

    Examples:

    >>> rows = tfdml.analysis.worst_queries(results, n=20)
    >>> tfdml.analysis.retrieval_html("worst.html", results, x_query, x_gallery, queries=rows)
    """
    rows, k, query_images, gallery_images = _prepare(results, query_images, gallery_images,
                                                     queries, k)
    esc = html.escape
    body = []
    for row, tiles in zip(rows, _rows(results, rows, k), strict=True):
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


# -- the TensorBoard projector ------------------------------------------------------------------


def _write_bytes(path, data):
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(data)


def _check_name(name):
    if (not isinstance(name, str) or not name or name in (".", "..", "metadata", "sprite")
            or any(c in name for c in '/\\"\t\n\r') or name != name.strip()):
        raise ValueError(
            "`name` must be a non-empty file stem without slashes, quotes, tabs or line "
            "breaks, other than 'metadata' and 'sprite' (the other files' names). "
            f"Received: name={name!r}"
        )
    return name


def _check_embeddings(embeddings):
    x = _numpy(embeddings)
    if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] == 0 or not (
            np.issubdtype(x.dtype, np.number) and not np.iscomplexobj(x)):
        raise ValueError("`embeddings` must be a non-empty [N, D] array of real numbers. "
                         f"Received: embeddings.shape={x.shape}, dtype={x.dtype}")
    check_finite(x, "embeddings")
    return x.astype(np.float32)


def _metadata_column(name, values, n, single):
    values = _numpy(values)
    if values.ndim != 1 or len(values) != n:
        raise ValueError(f"`{name}` must have one entry per row of `embeddings` ({n}). "
                         f"Received: {name}.shape={values.shape}")
    texts = [_text(v) for v in values]
    bad = [i for i, t in enumerate(texts) if any(c in t for c in "\t\n\r")]
    if bad:
        raise ValueError(
            f"`{name}` contains tabs or line breaks (at {at_indices(bad)}): TensorBoard's "
            "metadata.tsv has one line per row and tab-separated columns, without escapes, so "
            "they are refused rather than rewritten. Replace them first. Received: "
            f"{name}[{bad[0]}]={texts[bad[0]]!r}"
        )
    blank = [i for i, t in enumerate(texts) if not t.strip()] if single else []
    if blank:
        raise ValueError(
            f"`{name}` has empty (or blank) entries (at {at_indices(blank)}): TensorBoard "
            "skips blank lines of metadata.tsv, which would shift every later row. Give them "
            f"a placeholder. Received: {name}[{blank[0]}]={texts[blank[0]]!r}"
        )
    return texts


def _metadata_text(labels, ids, n):
    """The text of ``metadata.tsv``, or None without labels and ids."""
    given = [(key, v) for key, v in (("label", labels), ("id", ids)) if v is not None]
    if not given:
        return None
    columns = [_metadata_column(name + "s", v, n, len(given) == 1) for name, v in given]
    if len(columns) == 1:
        return "".join(t + "\n" for t in columns[0])
    lines = ["label\tid", *(f"{a}\t{b}" for a, b in zip(*columns, strict=True))]
    return "".join(line + "\n" for line in lines)


def _thumbnail_size(thumbnail_size, side, height, width):
    """``(height, width)`` of a sprite thumbnail."""
    if thumbnail_size is None:
        longest = max(height, width)
        if side * longest <= MAX_SPRITE:
            return height, width
        scale = (MAX_SPRITE // side) / longest
        return max(1, int(height * scale)), max(1, int(width * scale))
    if isinstance(thumbnail_size, (tuple, list)) and len(thumbnail_size) == 2:
        size = (check_int("thumbnail_size", thumbnail_size[0]),
                check_int("thumbnail_size", thumbnail_size[1]))
    else:
        longest = check_int("thumbnail_size", thumbnail_size)
        scale = longest / max(height, width)
        size = (max(1, round(height * scale)), max(1, round(width * scale)))
    if side * max(size) > MAX_SPRITE:
        raise ValueError(
            f"`thumbnail_size` is too large: {side} x {side} thumbnails of {size[0]} x "
            f"{size[1]} pixels exceed TensorBoard's {MAX_SPRITE} x {MAX_SPRITE} sprite; at most "
            f"{MAX_SPRITE // side} pixels a side. Received: thumbnail_size={thumbnail_size!r}"
        )
    return size


def _resize(pixels, height, width):
    """``uint8`` RGB pixels resized to ``(height, width)``: Pillow's bilinear filter (which
    averages when it shrinks), else nearest neighbours."""
    if pixels.shape[:2] == (height, width):
        return pixels
    try:
        from PIL import Image
    except ImportError:
        rows = (np.arange(height) * pixels.shape[0]) // height
        cols = (np.arange(width) * pixels.shape[1]) // width
        return pixels[rows][:, cols]
    image = Image.fromarray(np.ascontiguousarray(pixels)).resize(
        (width, height), Image.Resampling.BILINEAR)
    return np.asarray(image)


def _sprite(images, n, thumbnail_size):
    """``(pixels, (height, width))``: the ``uint8`` RGB sprite and its thumbnail size."""
    images = _check_images("images", images, n, exact=True)
    side = math.ceil(math.sqrt(n))
    if side > MAX_SPRITE:
        raise ValueError(f"Too many images for a {MAX_SPRITE} x {MAX_SPRITE} sprite: {n}. "
                         f"Received: images.shape={images.shape}")
    th, tw = _thumbnail_size(thumbnail_size, side, images.shape[1], images.shape[2])
    sprite = np.full((side * th, side * tw, 3), 255, np.uint8)
    for i, image in enumerate(images):
        pixels = _display(image)
        if pixels.ndim == 2:
            pixels = np.repeat(pixels[..., None], 3, axis=-1)
        r, c = divmod(i, side)
        sprite[r * th:(r + 1) * th, c * tw:(c + 1) * tw] = _resize(pixels, th, tw)
    return sprite, (th, tw)


def _projector_config(name, shape, metadata, thumbnail):
    lines = ["embeddings {", f'  tensor_name: "{name}"', f"  tensor_shape: {shape[0]}",
             f"  tensor_shape: {shape[1]}", f'  tensor_path: "{name}.tsv"']
    if metadata:
        lines.append('  metadata_path: "metadata.tsv"')
    if thumbnail is not None:
        th, tw = thumbnail
        lines += ["  sprite {", '    image_path: "sprite.png"', f"    single_image_dim: {tw}",
                  f"    single_image_dim: {th}", "  }"]
    return "\n".join([*lines, "}"]) + "\n"


def projector_export(logdir, embeddings, labels=None, ids=None, images=None,
                     name: str = "embeddings", thumbnail_size=None) -> list:
    """Writes the files TensorBoard's embedding projector reads, without TensorFlow.

    In ``logdir`` (created if needed):

    * ``<name>.tsv``: one line per embedding, the values tab-separated, as
      float32 written with 9 significant digits (``%.9g``: read back, every
      value is the same float32);
    * ``metadata.tsv`` (with ``labels`` or ``ids``): one line per embedding.
      With only one of them, a single column without a header line (the
      projector's convention); with both, a header line ``label<TAB>id`` then
      the two columns. Labels and ids are written with ``str`` (bytes decoded
      as UTF-8). Tabs, newlines and carriage returns inside them are
      **refused** (a ``ValueError``): the format has no escapes. So are empty
      or blank entries of a single column, as the projector skips blank lines;
    * ``sprite.png`` (with ``images``): the images as RGB thumbnails on a
      square grid of ``ceil(sqrt(N))`` thumbnails a side, row by row from the
      top left, unused cells white; grey images become RGB. The whole sprite is
      at most 8192 x 8192 pixels (the projector's limit): the images keep
      their size when they fit, else they are shrunk (aspect kept) to fit;
    * ``projector_config.pbtxt``: the projector's ``ProjectorConfig`` in
      protobuf text format (``tensor_name``, ``tensor_shape``,
      ``tensor_path``, ``metadata_path``, ``sprite { image_path
      single_image_dim }``, the paths relative to ``logdir``).

    The config describes this one embedding: it replaces any
    ``projector_config.pbtxt`` already in ``logdir`` (export several
    embeddings into separate directories, e.g. ``logs/epoch_5``). Each file is
    written whole or not at all, the config last. Open it with ``tensorboard
    --logdir <logdir>`` and the Projector tab (TensorBoard's projector reads
    the config in the log directory itself; no event file is needed).

    Args:
        logdir: the directory to write to.
        embeddings: ``[N, D]`` real numbers (an array or a tensor).
        labels: ``[N]`` labels (integers or strings). Defaults to `None`.
        ids: ``[N]`` ids (integers or strings). Defaults to `None`.
        images: ``[N, H, W]``, ``[N, H, W, 1]`` or ``[N, H, W, 3]`` images of
            the embeddings, scaled as for :func:`plot_retrieval`. Defaults to
            `None` (no sprite).
        name: the tensor's name in the projector and the stem of its file.
            Defaults to `"embeddings"`.
        thumbnail_size: the size of a thumbnail in the sprite: an int (its
            longer side, the aspect kept) or ``(height, width)``; the grid
            must fit in 8192 x 8192 pixels. Defaults to `None` (the images'
            size, shrunk to fit when needed).

    Returns:
        The list of written paths, the config last.

    Raises:
        ValueError: embeddings that are not ``[N, D]`` real numbers or contain
            NaN or Inf (the message names ``embeddings`` and the rows),
            ``labels``, ``ids`` or ``images`` whose length is not ``N``, tabs
            or line breaks in labels or ids, a bad ``name`` or
            ``thumbnail_size``.
        ImportError: images given and neither Pillow nor matplotlib installed.

    Examples:

    >>> tfdml.analysis.projector_export("logs/projector", model.predict(x_test),
    ...                                 labels=y_test, images=x_test)
    """
    name = _check_name(name)
    x = _check_embeddings(embeddings)
    metadata = _metadata_text(labels, ids, len(x))
    sprite = None if images is None else _sprite(images, len(x), thumbnail_size)
    logdir = os.fspath(logdir)
    os.makedirs(logdir, exist_ok=True)
    written = [os.path.join(logdir, f"{name}.tsv")]
    with atomic_path(written[0]) as tmp, open(tmp, "wb") as f:
        np.savetxt(f, x, fmt="%.9g", delimiter="\t", newline="\n")
    if metadata is not None:
        written.append(os.path.join(logdir, "metadata.tsv"))
        _write_bytes(written[-1], metadata.encode("utf-8"))
    if sprite is not None:
        written.append(os.path.join(logdir, "sprite.png"))
        _write_bytes(written[-1], _png_bytes(sprite[0]))
    config = _projector_config(name, x.shape, metadata is not None,
                               None if sprite is None else sprite[1])
    written.append(os.path.join(logdir, "projector_config.pbtxt"))
    _write_bytes(written[-1], config.encode("utf-8"))
    return written
