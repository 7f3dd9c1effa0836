"""Match thresholds: calibrate on labelled queries, match, plot the curve.

The functions take any :class:`~tfdml.search.Index` (its public methods and
attributes only); the index uses :func:`copies` to refuse tuning queries that are
copies of its items.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import numpy as np

from tfdml._argument_checks import is_number
from tfdml._labels import check_min_jaccard
from tfdml._pyplot import import_pyplot
from tfdml.search.adding import prepare
from tfdml.search.results import check_same_form, host_labels, neighbour_relevance


class Calibration(NamedTuple):
    """The answer of :func:`calibrate`.

    Attributes:
        threshold: the score a match must reach (a similarity for ``"cosine"``
            and ``"dot"``, a distance for ``"l2"``).
        precision: the share of correct matches (the nearest item relevant to
            the query: of its label, or sharing a label with its multi-hot set)
            among the calibration queries it accepts.
        recall: the share of the queries whose nearest item is relevant that it
            accepts.
        reached: whether ``precision >= target_precision``.
        thresholds, precisions, recalls: the curve, one point per distinct
            score of the nearest items, from the strictest threshold to the
            loosest (for :func:`plot_calibration`).
    """

    threshold: float
    precision: float
    recall: float
    reached: bool
    thresholds: np.ndarray
    precisions: np.ndarray
    recalls: np.ndarray


#: :func:`calibrate` warns when at least this share of its queries are copies of their
#: nearest item in the index.
SELF_MATCH_SHARE = 0.1

#: The relative distance below which :func:`calibrate` counts a nearest item as a copy
#: of its query: ``|q - g| <= COPY_TOLERANCE * max(|q|, |g|)``.
COPY_TOLERANCE = 1e-5


def copies(index, queries, nearest):
    """Whether each query (prepared as the index stores it) is a copy of its nearest item
    (``nearest``: positions, ``-1`` for none); all False when the index keeps no embeddings."""
    nearest = np.asarray(nearest, np.int64)
    if index.vectors is None:
        return np.zeros(len(nearest), bool)
    q = prepare(queries, "queries", index.metric, index.dim, index.approximate is not None,
                index.query_buckets, index.chunk_size).astype(np.float64)
    g = index.rows(np.maximum(nearest, 0)).astype(np.float64)
    size = np.maximum(np.linalg.norm(q, axis=1), np.linalg.norm(g, axis=1))
    return (np.linalg.norm(q - g, axis=1) <= COPY_TOLERANCE * size) & (nearest >= 0)


def calibrate(index, queries, labels, target_precision: float = 0.99,
              min_jaccard=None) -> Calibration:
    """The loosest match threshold whose precision on labelled queries reaches a target.

    Each query is matched to its nearest item in ``index``; the match is
    *correct* when that item has the query's label (multi-hot labels: when
    their label sets share a label, or with ``min_jaccard`` when the Jaccard
    similarity of the sets reaches it). A threshold accepts the
    matches whose score reaches it. Over all thresholds (one per distinct
    nearest score), the one returned is the loosest, hence the highest recall,
    whose precision (correct among accepted) is at least ``target_precision``.
    Recall is the share of the correct matches that are accepted. Calibrate on
    queries that are not in the index (a query finds itself at distance 0).

    A query counts as a *copy* of its nearest item when their embeddings, as the
    index stores them (float32, L2-normalized for ``"cosine"``), are within a
    relative distance of :data:`COPY_TOLERANCE`: ``|q - g| <= 1e-5 max(|q|, |g|)``
    (an exact copy, or the same input embedded again). When at least
    :data:`SELF_MATCH_SHARE` (10 %) of the queries are copies, a ``UserWarning``
    says so: those queries match themselves at the best possible score, with their
    own label, and the threshold fitted to them will not hold for new queries. A
    few duplicates in held-out data stay below that share.

    When no threshold reaches the target, the most precise one is returned
    (ties: the loosest) with ``reached=False``.

    Args:
        index: an :class:`Index` with labels.
        queries: ``[Q, D]`` embeddings.
        labels: ``[Q]`` their class ids, or ``[Q, L]`` multi-hot label sets
            when the index holds ``[N, L]`` multi-hot labels.
        target_precision: in ``(0, 1]``. Defaults to `0.99`.
        min_jaccard: multi-hot labels: the Jaccard similarity in ``(0, 1]`` a
            correct match reaches. Defaults to `None` (sharing a label).

    Returns:
        A :class:`Calibration`.

    Raises:
        ValueError: for an index without labels, a bad target, no query,
            queries and labels of different lengths, or labels of another form
            (or ``L``) than the index's.

    Warns:
        UserWarning: when at least :data:`SELF_MATCH_SHARE` of the queries are
            copies of their nearest item in the index.

    Examples:

    >>> calibration = tfdml.search.calibrate(index, val_embeddings, val_labels, 0.99)
    >>> index.match(new_embeddings, calibration.threshold)   # label, or -1 (unknown)
    """
    if not is_number(target_precision) or not 0 < target_precision <= 1:
        raise ValueError("`target_precision` must be a number in (0, 1]. "
                         f"Received: target_precision={target_precision!r}")
    if index.labels is None:
        raise ValueError("`calibrate` needs an index with labels.")
    labels = host_labels(labels, "labels")
    check_same_form(labels, index.labels, "labels", "the index's labels")
    min_jaccard = check_min_jaccard(min_jaccard)
    found = index.lookup(queries, 1)
    if len(labels) != len(found.indices):
        raise ValueError(f"`labels` must have one entry per query ({len(found.indices)}). "
                         f"Received: {len(labels)}")
    if not len(labels):
        raise ValueError("`calibrate` needs at least one query: a precision of no match is "
                         "undefined. Received: 0 queries")
    same = int(copies(index, queries, found.indices[:, 0]).sum())
    if same >= SELF_MATCH_SHARE * len(labels):
        warnings.warn(
            f"{same} of the {len(labels)} calibration queries ({same / len(labels):.0%}) "
            "are copies of their nearest item in the index (the same embedding, at "
            "distance 0), most likely because they were added to the index: each then "
            "matches itself at the best possible score, and a threshold fitted to such "
            "matches does not hold for new queries. Calibrate on held-out queries that "
            "are not in the index (a validation split), or remove the copies from "
            "`queries`.",
            UserWarning, stacklevel=2)
    # A query for which an approximate index found no item (position -1) matches at no
    # threshold: it is left out of the curve (its correct match, if any, is missed).
    found_one = found.indices[:, 0] >= 0
    if not found_one.any():
        raise ValueError("The index found no neighbour for any calibration query (an "
                         "approximate index searching too little of itself: see `tune`).")
    scores = found.scores[found_one, 0].astype(np.float64)
    correct = neighbour_relevance(labels, index.labels, found.indices[:, :1],
                                  min_jaccard)[found_one, 0]
    # Strictest first: the best scores first (smallest distances for "l2").
    order = np.argsort(scores if index.metric == "l2" else -scores, kind="stable")
    scores, correct = scores[order], correct[order]
    accepted = np.arange(1, len(scores) + 1)
    hits = np.cumsum(correct)
    last = np.r_[scores[1:] != scores[:-1], True]  # a threshold accepts all equal scores
    thresholds, accepted, hits = scores[last], accepted[last], hits[last]
    precisions = hits / accepted
    recalls = hits / max(int(correct.sum()), 1)
    ok = precisions >= target_precision
    if ok.any():
        best = int(np.flatnonzero(ok)[-1])
    else:
        best = int(np.flatnonzero(precisions == precisions.max())[-1])
    return Calibration(float(thresholds[best]), float(precisions[best]), float(recalls[best]),
                       bool(ok.any()), thresholds, precisions, recalls)


def match(index, queries, threshold, unknown=-1):
    """:meth:`Index.match`: the nearest item's label within ``threshold``, else ``unknown``."""
    return index.match(queries, threshold, unknown)


def plot_calibration(calibration: Calibration, ax=None, target_precision=None):
    """Precision and recall against the threshold, the chosen threshold marked.

    Args:
        calibration: from :func:`calibrate`.
        ax: a matplotlib axis. Defaults to `None` (a new figure).
        target_precision: drawn as a horizontal line when given.

    Returns:
        The matplotlib axis.

    Raises:
        ImportError: without matplotlib, naming the command that installs it.
    """
    plt = import_pyplot()

    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(calibration.thresholds, calibration.precisions, label="precision")
    ax.plot(calibration.thresholds, calibration.recalls, label="recall")
    ax.axvline(calibration.threshold, color="gray", linestyle="--",
               label=f"threshold {calibration.threshold:.3g}")
    if target_precision is not None:
        ax.axhline(target_precision, color="gray", linestyle=":", label="target precision")
    ax.set_xlabel("threshold")
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=7)
    return ax
