"""Tuning an approximate :class:`~tfdml.search.Index`: its recall of the exact neighbours,
and the walk over its structure's search parameters, cheapest first.

:meth:`~tfdml.search.Index.tune` computes the exact neighbours of held-out
queries from the stored embeddings, then :func:`walk` tries the settings of
:func:`~tfdml.search.approximate.grid` (each searches more of the structure than
the one before) until one reaches the target recall (:func:`neighbour_recall`).
"""

from __future__ import annotations

import time
from typing import NamedTuple

import numpy as np

from tfdml._argument_checks import is_number
from tfdml.search import approximate as faiss_api


class Tuning(NamedTuple):
    """The answer of :meth:`Index.tune`.

    Attributes:
        parameters: the search parameters chosen (``{"nprobe": 16}``,
            ``{"efSearch": 64}``...), now set on the index.
        recall: their recall@k of the exact neighbours on the tuning queries.
        reached: whether ``recall >= target_recall``.
        seconds_per_query: the measured search time per query with them.
        tried: ``(parameters, recall, seconds_per_query)`` of each setting tried,
            cheapest first.
    """

    parameters: dict
    recall: float
    reached: bool
    seconds_per_query: float
    tried: list


def neighbour_recall(found, exact) -> float:
    """The approximation's recall@k: the mean share of each query's exact ``k`` nearest
    neighbours (``exact``, ``[Q, k]`` positions) among those found (``found``, ``[Q, k']``).

    faiss's intersection measure; ``-1`` (no item) matches nothing. Equal scores at the
    ``k``-th place make the exact set one of several; a search that returns another of
    them counts those items as misses.
    """
    found, exact = np.asarray(found), np.asarray(exact)
    if not exact.size:
        return float("nan")
    hits = sum(len(np.intersect1d(f[f >= 0], e)) for f, e in zip(found, exact, strict=True))
    return hits / exact.size


def check_target_recall(target_recall):
    """``target_recall``, a number in ``(0, 1]``; a ValueError naming it otherwise."""
    if not is_number(target_recall) or not 0 < target_recall <= 1:
        raise ValueError("`target_recall` must be a number in (0, 1]. "
                         f"Received: target_recall={target_recall!r}")
    return target_recall


def walk(structure, search, queries, truth, target_recall) -> Tuning:
    """Tries the search parameters of :func:`~tfdml.search.approximate.grid`, cheapest first,
    until one reaches ``target_recall``, and sets the chosen one on ``structure``.

    The first setting that reaches the target is the fastest that does (each step
    searches more); when none does, the one with the best recall is chosen, with
    ``reached=False``.

    Args:
        structure: the approximate faiss structure.
        search: ``search(queries, k)`` returning ``(scores, positions)`` with the
            structure's present parameters.
        queries: ``[Q, D]`` prepared query rows (``Q >= 1``).
        truth: ``[Q, k]`` positions of their exact ``k`` nearest neighbours.
        target_recall: in ``(0, 1]``.

    Returns:
        A :class:`Tuning`.
    """
    k = int(np.shape(truth)[1])
    tried = []
    for setting in faiss_api.grid(structure, k) or [{}]:
        faiss_api.set_parameters(structure, setting)
        began = time.perf_counter()
        _, found = search(queries, k)
        seconds = (time.perf_counter() - began) / len(queries)
        tried.append((dict(setting), neighbour_recall(found, truth), seconds))
        if tried[-1][1] >= target_recall:
            break
    best = next((t for t in tried if t[1] >= target_recall), None)
    if best is None:
        best = max(tried, key=lambda t: t[1])
    faiss_api.set_parameters(structure, best[0])
    return Tuning(dict(best[0]), best[1], best[1] >= target_recall, best[2], tried)
