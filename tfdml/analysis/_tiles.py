"""The rows of tiles that the retrieval pictures draw (a figure, an HTML page): the
checked arguments, and what each tile shows (the query, then its neighbours)."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from tfdml._argument_checks import check_int
from tfdml.analysis._display import as_numpy, as_text, check_images

__all__ = ["COLORS", "DEFAULT_K", "DEFAULT_QUERIES", "MARKS", "Tile", "check_results", "describe",
           "has_labels", "prepare", "tile_rows"]

#: Frame colours of the tiles: the query, a correct / wrong neighbour, correctness unknown.
COLORS = {"query": "#3a5a98", "correct": "#1b9e3e", "wrong": "#d62728", "unknown": "#8c8c8c"}
#: Text marks of the tiles (for readers who do not tell red from green).
MARKS = {"correct": "\u2713", "wrong": "\u2717", "unknown": "?"}
#: Queries drawn by default, and neighbours drawn by default (at most).
DEFAULT_QUERIES, DEFAULT_K = 8, 5


def check_results(results):
    """A ValueError unless ``results`` looks like a :class:`tfdml.search.RetrievalResults`."""
    indices = getattr(results, "indices", None)
    scores = getattr(results, "scores", None)
    if indices is None or scores is None or np.ndim(indices) != 2:
        raise ValueError(
            "`results` must be a tfdml.search.RetrievalResults (`Index.retrieve(...)` returns "
            f"one). Received: results of type {type(results).__name__}"
        )


def has_labels(results):
    """Whether ``results`` has the labels of its queries and of their neighbours."""
    return results.labels is not None and results.query_labels is not None


def _correct(results):
    """``[Q, k]`` bool, or None without labels."""
    return results.correct if has_labels(results) else None


def _check_queries(queries, num):
    if queries is None:
        return np.arange(min(DEFAULT_QUERIES, num), dtype=np.int64)
    rows = np.atleast_1d(as_numpy(queries))
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


def prepare(results, query_images, gallery_images, queries, k):
    """The checked arguments of a picture: ``(rows, k, query_images, gallery_images)``.

    ``rows``: the query rows (the first :data:`DEFAULT_QUERIES` by default); ``k``: the
    neighbours per row (at most :data:`DEFAULT_K` by default); the images as NumPy arrays
    (or None), with a row for each query and for each gallery position in the lists.
    """
    check_results(results)
    rows = _check_queries(queries, len(results))
    k = _check_k(k, results)
    query_images = check_images("query_images", query_images, len(results), exact=True)
    largest = int(np.max(results.indices, initial=-1))
    gallery_images = check_images("gallery_images", gallery_images, largest + 1, exact=False)
    return rows, k, query_images, gallery_images


class Tile(NamedTuple):
    """What one tile shows. ``kind``: ``"query"``, ``"correct"``, ``"wrong"``, ``"unknown"``
    or ``"empty"``; ``position``: the row of the query or gallery images."""

    kind: str
    position: int
    score: str
    label: str | None
    ident: str | None


def _score_text(score) -> str:
    """The score with 4 significant digits; NaN as ``"nan"`` (never hidden)."""
    score = float(score)
    return "nan" if math.isnan(score) else f"{score:.4g}"


def tile_rows(results, rows, k):
    """One list of :class:`Tile` per query row: the query, then ``k`` neighbours."""
    correct = _correct(results)
    out = []
    for row in rows:
        label = None if results.query_labels is None else as_text(results.query_labels[row])
        ident = None if results.query_ids is None else as_text(results.query_ids[row])
        tiles = [Tile("query", int(row), "", label, ident)]
        for slot in range(k):
            position = int(results.indices[row, slot])
            if position < 0:
                tiles.append(Tile("empty", -1, "", None, None))
                continue
            kind = "unknown" if correct is None else (
                "correct" if correct[row, slot] else "wrong")
            label = None if results.labels is None else as_text(results.labels[row, slot])
            ident = None if results.ids is None else as_text(results.ids[row, slot])
            tiles.append(Tile(kind, position, _score_text(results.scores[row, slot]), label,
                              ident))
        out.append(tiles)
    return out


def _shorten(text, width=24):
    return text if len(text) <= width else text[:width - 1] + "\u2026"


def describe(tile, short=False):
    """The label and id lines of a tile."""
    lines = []
    if tile.label is not None:
        lines.append(f"label {tile.label}")
    if tile.ident is not None:
        lines.append(f"id {_shorten(tile.ident) if short else tile.ident}")
    return lines
