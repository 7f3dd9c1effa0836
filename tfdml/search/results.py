"""Retrieval results a person can act on: each query's neighbours, and what to do with them.

:class:`Lookup` is the answer of :meth:`~tfdml.search.Index.lookup` (scores,
positions, labels, ids); :class:`RetrievalResults` that of
:meth:`~tfdml.search.Index.retrieve`, which also knows which neighbours are
correct and can be thresholded, re-ranked and scored.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import NamedTuple

import numpy as np

__all__ = ["Lookup", "RetrievalResults"]


class Lookup(NamedTuple):
    """The answer of :meth:`Index.lookup`, each ``[Q, k]``, nearest first.

    Attributes:
        scores: similarities (``"cosine"``, ``"dot"``) or distances (``"l2"``).
        indices: positions in the index (the order of :meth:`Index.add`).
        labels: the neighbours' labels, or None when the index has none.
        ids: the neighbours' ids, or None when the index has none.
    """

    scores: np.ndarray
    indices: np.ndarray
    labels: np.ndarray | None
    ids: np.ndarray | None


def gather(values, indices):
    """``values[indices]``, with the empty label or id where a position is ``-1`` (no item):
    ``-1``, or ``""`` for string ids (unsigned integer ids become int64). None for None."""
    if values is None:
        return None
    fill = _empty_id(values)
    if values.dtype.kind == "u":  # unsigned ids: -1 marks a missing item
        values = values.astype(np.int64)
    out = values[np.maximum(indices, 0)]
    if (indices < 0).any():
        out = np.where(indices < 0, np.asarray(fill, out.dtype), out)
    return out


def without_self(scores, indices, k):
    """The first ``k`` of ``k + 1`` neighbours of the gallery's own items (query ``i`` is
    item ``i``), in order: the query's own position goes, or else the last candidate."""
    own = indices == np.arange(len(indices))[:, None]
    own[:, -1] |= ~own.any(axis=1)
    order = np.argsort(own, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(scores, order, 1), np.take_along_axis(indices, order, 1)


def count_relevant(gallery_labels, query_labels, exclude_self=False):
    """``[Q]`` int64: the gallery items of each query's label, less the query's own item
    with ``exclude_self`` (query ``i`` is item ``i``)."""
    classes, counts = np.unique(gallery_labels, return_counts=True)
    at = np.minimum(np.searchsorted(classes, query_labels), len(classes) - 1)
    relevant = np.where(classes[at] == query_labels, counts[at], 0)
    if exclude_self:  # the query's own item, where it is of the query's class
        relevant = relevant - (gallery_labels == query_labels)
    return relevant


@dataclasses.dataclass(frozen=True, eq=False)
class RetrievalResults:
    """Each query's ranked neighbours in a gallery: scores, positions, labels, ids.

    Lists are nearest first and padded to a common length ``k``: a position of
    ``-1`` is an empty slot (an approximate index found fewer items, or a
    threshold cut the list there); its label is ``-1``, its id ``-1`` (or ``""``
    for string ids) and its score the worst one (``-inf`` for similarities,
    ``inf`` for distances) in the lists :meth:`tfdml.search.Index.retrieve` and
    the cuts give. The score of an empty slot is never read (a list built by
    hand may hold NaN there).

    Attributes:
        metric: ``"cosine"``, ``"dot"`` or ``"l2"``: scores are similarities
            (larger is nearer) or Euclidean distances (smaller is nearer).
        scores: ``[Q, k]`` float32 scores.
        indices: ``[Q, k]`` int64 gallery positions (``-1``: no item).
        labels: ``[Q, k]`` int64 labels of the neighbours, or None.
        ids: ``[Q, k]`` ids of the neighbours (integers or strings), or None.
        query_labels: ``[Q]`` int64 labels of the queries, or None.
        query_ids: ``[Q]`` ids of the queries, or None.
        num_relevant: ``[Q]`` int64: the gallery items that are correct for each
            query (same label, not excluded), or None when unknown.
    """

    metric: str
    scores: np.ndarray
    indices: np.ndarray
    labels: np.ndarray | None = None
    ids: np.ndarray | None = None
    query_labels: np.ndarray | None = None
    query_ids: np.ndarray | None = None
    num_relevant: np.ndarray | None = None

    def __len__(self):
        return len(self.indices)

    @property
    def k(self) -> int:
        """The length of the (padded) lists."""
        return int(self.indices.shape[1])

    @property
    def kept(self) -> np.ndarray:
        """``[Q, k]`` bool: the slots that hold an item."""
        return self.indices >= 0

    @property
    def correct(self) -> np.ndarray:
        """``[Q, k]`` bool: the slots that hold an item of the query's label.

        Raises:
            ValueError: without labels for the queries and the gallery.
        """
        if self.labels is None or self.query_labels is None:
            raise ValueError("`correct` needs the labels of the queries and of the gallery: "
                             "retrieve with `query_labels=` from an index with labels.")
        return self.kept & (self.labels == self.query_labels[:, None])

    # -- building and cutting ----------------------------------------------------------------

    def reorder(self, order) -> RetrievalResults:
        """The lists with their slots in a new order (``[Q, k]``: each row a permutation
        of ``0 .. k-1``, e.g. from a re-ranker); scores, labels and ids move along.

        Raises:
            ValueError: for an ``order`` that is not ``[Q, k]`` integers, each row a
                permutation.
        """
        order = np.asarray(order)
        if order.shape != self.indices.shape or order.dtype.kind not in "iu" or not (
                np.sort(order, axis=1) == np.arange(self.k)).all():
            raise ValueError(f"`order` must hold a permutation of 0..{self.k - 1} for each of "
                             f"the {len(self)} queries. Received: shape {order.shape}, "
                             f"dtype {order.dtype}")
        order = order.astype(np.int64)

        def moved(values):
            return None if values is None else np.take_along_axis(values, order, 1)

        return dataclasses.replace(self, scores=moved(self.scores), indices=moved(self.indices),
                                   labels=moved(self.labels), ids=moved(self.ids))

    def cut(self, keep) -> RetrievalResults:
        """The lists with the slots where ``keep`` (``[Q, k]`` bool) is False emptied; the
        kept items move to the front in their order. Unsigned integer ids become int64,
        for the empty id ``-1``.

        Raises:
            ValueError: for a ``keep`` of another shape than the lists.
        """
        keep = np.asarray(keep)
        if keep.shape != self.indices.shape:
            raise ValueError(f"`keep` must be a [Q, k] = {list(self.indices.shape)} array of "
                             f"booleans. Received: shape {keep.shape}")
        keep = keep.astype(bool) & self.kept
        order = np.argsort(~keep, axis=1, kind="stable")
        kept = np.take_along_axis(keep, order, 1)
        indices = np.where(kept, np.take_along_axis(self.indices, order, 1), -1)
        scores = np.where(kept, np.take_along_axis(self.scores, order, 1),
                          np.float32(np.inf if self.metric == "l2" else -np.inf))
        out = dataclasses.replace(self, scores=scores.astype(np.float32), indices=indices)
        if self.labels is not None:
            out = dataclasses.replace(out, labels=np.where(
                kept, np.take_along_axis(self.labels, order, 1), -1))
        if self.ids is not None:
            ids = _signed(self.ids)
            out = dataclasses.replace(out, ids=np.where(
                kept, np.take_along_axis(ids, order, 1), _empty_id(ids)))
        return out

    def threshold(self, value: float) -> RetrievalResults:
        """Keeps the neighbours whose score reaches ``value``: a similarity ``>= value``
        (``"cosine"``, ``"dot"``) or a distance ``<= value`` (``"l2"``), a constant
        threshold such as :func:`tfdml.search.calibrate` finds.

        Raises:
            ValueError: for a ``value`` that is not a finite number.
        """
        if not _is_real(value) or not np.isfinite(value):
            raise ValueError(f"`value` must be a finite number. Received: value={value!r}")
        near = self.scores <= value if self.metric == "l2" else self.scores >= value
        return self.cut(near)

    def adaptive_threshold(self, n_std: float = 2.0, min_items: int = 1) -> RetrievalResults:
        """Cuts each list at its first unusually large gap between consecutive scores.

        For a query whose list holds scores ``s_1, ..., s_m`` (its items, nearest
        first, empty slots skipped), the gaps are ``g_i = |s_i - s_{i+1}|``,
        ``i = 1 .. m-1``. The list is cut after the first position
        ``i >= min_items`` whose gap exceeds ``mean(g) + n_std * std(g)`` strictly
        (over that query's gaps, ``std`` the population standard deviation, in
        float64): ``s_1 .. s_i`` are kept, the items beyond a clear drop in
        similarity are left out. A list without such a gap (or of fewer than 3
        items) is kept whole.
        The idea of open-metric-learning's adaptive thresholding (cut where the
        distances jump); this exact rule is tfdml's.

        Args:
            n_std: how many standard deviations above the mean gap a cut needs.
                Defaults to `2.0`.
            min_items: the fewest items a list keeps. Defaults to `1`.

        Raises:
            ValueError: for an ``n_std`` that is not a finite number >= 0, or a
                ``min_items`` that is not an integer >= 1.
        """
        if not _is_real(n_std) or not np.isfinite(n_std) or n_std < 0:
            raise ValueError(f"`n_std` must be a finite number >= 0. Received: n_std={n_std!r}")
        if isinstance(min_items, bool) or not isinstance(min_items, numbers.Integral) or \
                min_items < 1:
            raise ValueError(f"`min_items` must be an integer >= 1. Received: "
                             f"min_items={min_items!r}")
        keep = self.kept.copy()
        for row in range(len(self)):
            s = self.scores[row][self.kept[row]].astype(np.float64)
            if len(s) < 3:
                continue
            gaps = np.abs(np.diff(s))
            big = np.flatnonzero(gaps > gaps.mean() + n_std * gaps.std())
            big = big[big + 1 >= min_items]
            if len(big):
                positions = np.flatnonzero(self.kept[row])
                keep[row, positions[big[0] + 1:]] = False
        return self.cut(keep)

    # -- metrics of the lists -----------------------------------------------------------------

    def _ks(self, ks):
        if isinstance(ks, (numbers.Integral, str, bytes)):
            ks = (ks,)
        try:
            ks = tuple(ks)
        except TypeError:
            ks = (ks,)
        if not ks or any(isinstance(k, bool) or not isinstance(k, (int, np.integer)) or
                         not 1 <= k <= self.k for k in ks):
            raise ValueError(f"`ks` must be integers in [1, {self.k}] (the length of the "
                             f"lists). Received: ks={ks!r}")
        return tuple(int(k) for k in ks)

    def recall_at_k(self, ks=(1, 5, 10)) -> dict:
        """``{k: share of queries with a correct item among their first k}``, over all
        the queries (one without a correct item in the gallery counts as a miss, as in
        :func:`tfdml.metrics.recall_at_k`); ``nan`` without queries."""
        correct = self.correct
        return {k: float(correct[:, :k].any(axis=1).mean()) if len(self) else float("nan")
                for k in self._ks(ks)}

    def precision_at_k(self, ks=(1, 5, 10)) -> dict:
        """``{k: mean share of correct items among each query's first k slots}`` (an
        empty slot counts as not correct), over the queries with ``num_relevant > 0``
        when it is known (as :func:`tfdml.metrics.precision_at_k`), else over all;
        ``nan`` without such a query."""
        correct = self.correct
        ks = self._ks(ks)
        matched = (np.ones(len(self), bool) if self.num_relevant is None
                   else self.num_relevant > 0)
        return {k: float(correct[matched, :k].mean(axis=1).mean()) if matched.any()
                else float("nan") for k in ks}

    def map_at_k(self, ks=(1, 5, 10)) -> dict:
        """``{k: mean AP@k}``, ``AP@k = sum_{i<=k} P(i) rel(i) / min(k, R)``, over the
        queries with ``R = num_relevant > 0``.

        Raises:
            ValueError: without ``num_relevant``.
        """
        if self.num_relevant is None:
            raise ValueError("`map_at_k` needs `num_relevant` (the number of correct items "
                             "in the gallery for each query).")
        correct = self.correct
        rank = np.arange(1, self.k + 1)
        precision = np.cumsum(correct, axis=1) / rank
        matched = self.num_relevant > 0
        out = {}
        for k in self._ks(ks):
            ap = (precision[:, :k] * correct[:, :k]).sum(axis=1) / np.maximum(
                np.minimum(k, self.num_relevant), 1)
            out[k] = float(ap[matched].mean()) if matched.any() else float("nan")
        return out


def _is_real(value) -> bool:
    """Whether ``value`` is a real number (Python or NumPy), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def _signed(ids):
    """Unsigned integer ids as int64 (they need the empty id ``-1``), others as they are.

    Raises:
        ValueError: for unsigned ids beyond the int64 range.
    """
    if ids.dtype.kind != "u":
        return ids
    if ids.size and int(ids.max()) > np.iinfo(np.int64).max:
        raise ValueError("Unsigned integer `ids` beyond the int64 range leave no room for the "
                         f"empty id -1. Received: an id of {int(ids.max())}")
    return ids.astype(np.int64)


def _empty_id(ids):
    return "" if ids.dtype.kind == "U" else -1
