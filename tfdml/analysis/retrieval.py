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
* :func:`tfdml.analysis.retrieval_html` (module :mod:`tfdml.analysis.html_page`)
  writes the same rows as one self-contained HTML page (images inline);
* :func:`tfdml.analysis.projector_export` (module :mod:`tfdml.analysis.projector`)
  writes the files TensorBoard's embedding projector reads (tensor TSV, metadata TSV,
  sprite image, ``projector_config.pbtxt``), without TensorFlow.

The figures and the page draw the same rows of tiles: the query, then its
neighbours.

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

import numpy as np

from tfdml._argument_checks import check_choice, check_int
from tfdml._pyplot import import_figure
from tfdml.analysis._display import display
from tfdml.analysis._tiles import (
    COLORS,
    MARKS,
    check_results,
    describe,
    has_labels,
    prepare,
    tile_rows,
)

__all__ = [
    "BY",
    "plot_retrieval",
    "plot_worst_queries",
    "worst_queries",
]

#: The orders of :func:`worst_queries`.
BY = ("average_precision", "first_correct")


# -- the order of the queries -------------------------------------------------------------------


def _query_values(results, by):
    """``[Q]`` float64: average precision (larger is better), or the rank of the first correct
    item (smaller is better; ``inf`` without one)."""
    check_choice("by", by, BY)
    check_results(results)
    if not has_labels(results):
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


# -- the figure ---------------------------------------------------------------------------------


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
        pixels = display(images[tile.position])
        ax.imshow(pixels, cmap="gray" if pixels.ndim == 2 else None, vmin=0, vmax=255,
                  interpolation="nearest")
    else:
        centre = describe(tile, short=True) or [
            "query" if tile.kind == "query" else f"item {tile.position}"]
        ax.text(0.5, 0.5, "\n".join(centre), ha="center", va="center", fontsize="small",
                transform=ax.transAxes, parse_math=False)
        ax.set_box_aspect(1.0)
    if tile.kind == "query":
        caption = [f"query {tile.position}", *describe(tile, short=True)]
    else:
        caption = [f"{MARKS[tile.kind]} {tile.score}", *describe(tile, short=True)]
    ax.set_xlabel("\n".join(caption), fontsize="x-small", parse_math=False)  # ids: "$" as is


def _figure(results, query_images, gallery_images, rows, k, figsize, titles):
    Figure = import_figure()
    tiles = tile_rows(results, rows, k)
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
    rows, k, query_images, gallery_images = prepare(results, query_images, gallery_images,
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
    rows, k, query_images, gallery_images = prepare(results, query_images, gallery_images,
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
