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
from keras import ops

from tfdml import _labels
from tfdml import ops as dml

__all__ = ["Lookup", "RetrievalResults"]

#: Query-by-gallery label comparisons made at a time when counting relevant items.
RELEVANCE_BLOCK = 1 << 22


class Lookup(NamedTuple):
    """The answer of :meth:`Index.lookup`, each ``[Q, k]``, nearest first.

    Attributes:
        scores: similarities (``"cosine"``, ``"dot"``) or distances (``"l2"``).
        indices: positions in the index (the order of :meth:`Index.add`).
        labels: the neighbours' labels (``[Q, k, L]`` for multi-hot labels), or
            None when the index has none.
        ids: the neighbours' ids, or None when the index has none.
    """

    scores: np.ndarray
    indices: np.ndarray
    labels: np.ndarray | None
    ids: np.ndarray | None


def gather(values, indices):
    """``values[indices]``, with the empty label or id where a position is ``-1`` (no item):
    ``-1``, ``""`` for string ids, the empty label set for ``[N, L]`` multi-hot labels
    (unsigned integer ids become int64). None for None."""
    if values is None:
        return None
    if values.ndim == 2:  # multi-hot rows: [Q, k, L]
        return values[np.maximum(indices, 0)] & (indices >= 0)[..., None]
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


def host_labels(labels, name="labels"):
    """``labels`` as NumPy: ``[N]`` int64 class ids, or ``[N, L]`` multi-hot as bool.

    Raises:
        ValueError: naming ``name``, for class ids that are not integers, or multi-hot
            labels with a value other than 0 and 1 or an empty label set.
    """
    if _labels.is_multi_label(labels):
        if ops.is_tensor(labels) and not isinstance(labels, np.ndarray):
            labels = ops.convert_to_numpy(labels)
        return _labels.check_multi_hot(labels, name)
    return ops.convert_to_numpy(dml.cast_labels(labels, name)).astype(np.int64)


def check_same_form(labels, reference, name, reference_name):
    """Raises a ValueError naming ``name`` unless ``labels`` and ``reference`` (NumPy, from
    :func:`host_labels`) are both class ids or both multi-hot with the same ``L``."""
    if labels is None or reference is None:
        return
    if labels.ndim != reference.ndim:
        form = "[N, L] multi-hot" if reference.ndim == 2 else "[N] class ids"
        raise ValueError(f"`{name}` must be labels of the form of `{reference_name}`: "
                         f"{form}. Received: {name}.shape={labels.shape}, "
                         f"{reference_name}.shape={reference.shape}")
    if labels.ndim == 2 and labels.shape[1] != reference.shape[1]:
        raise ValueError(f"`{name}` must have the number of labels L of `{reference_name}` "
                         f"({reference.shape[1]}). Received: {name}.shape={labels.shape}")


def added_labels(labels, n, stored=None):
    """The labels of ``n`` rows added to an index, as :func:`host_labels` (None for None),
    of the form of the ``stored`` ones (a block of the index's labels, or None).

    Raises:
        ValueError: as :func:`host_labels`, for labels not one per row, or of another
            form or ``L`` than those stored.
    """
    if labels is None:
        return None
    labels = host_labels(labels, "labels")
    if len(labels) != n:
        raise ValueError(f"`labels` must have one entry per embedding ({n}). "
                         f"Received: {len(labels)}")
    check_same_form(labels, stored, "labels", "the index's labels")
    return labels


def neighbour_relevance(query_labels, gallery_labels, indices, min_jaccard=None,
                        graded=False):
    """``[Q, k]``: whether gallery item ``indices[i, j]`` is relevant to query ``i`` (False
    for a position of ``-1``), by the rule of :func:`tfdml._labels.relevance`; with ``graded``, float64
    gains: the Jaccard similarity of the label sets of a relevant pair, else 0.

    Labels: ``[Q]`` and ``[G]`` class ids (relevant: equal), or ``[Q, L]`` and ``[G, L]``
    multi-hot (relevant: sharing a label, or a Jaccard similarity of at least
    ``min_jaccard``), each query against its own ``k`` neighbours only.
    """
    indices = np.asarray(indices)
    found = indices >= 0
    items = gallery_labels[np.maximum(indices, 0)]  # [Q, k] or [Q, k, L]
    out = _labels.row_relevance(query_labels, items, min_jaccard, graded)
    return np.where(found, out, 0.0) if graded else out & found


def relevance_blocks(query_labels, gallery_labels, min_jaccard=None, graded=False,
                     exclude_self=False, groups=None, gallery_groups=None):
    """Yields ``(start, block)``: the ``[n, G]`` relevance (bool) of every gallery item to
    the multi-hot queries ``start : start + n`` (or with ``graded`` the gains, as
    :func:`neighbour_relevance`), in blocks of about :data:`RELEVANCE_BLOCK` pairs.

    Pairs left out are False (0): query ``i`` and item ``i`` with ``exclude_self``, and a
    query and the items of its group (``groups`` ``[Q]`` and ``gallery_groups`` ``[G]``).
    """
    num_gallery = len(gallery_labels)
    step = max(1, RELEVANCE_BLOCK // max(num_gallery, 1))
    for start in range(0, len(query_labels), step):
        queries = query_labels[start : start + step]
        block = _labels.relevance(queries, gallery_labels, min_jaccard)
        rows = np.arange(len(queries))
        if exclude_self:
            block[rows, start + rows] = False
        if groups is not None:
            block &= gallery_groups[None, :] != groups[start : start + len(queries), None]
        if graded:
            block = np.where(block, _labels.label_jaccard(queries, gallery_labels), 0.0)
        yield start, block


def count_relevant(gallery_labels, query_labels, exclude_self=False, min_jaccard=None):
    """``[Q]`` int64: the gallery items relevant to each query (of its label, or sharing a
    label with its multi-hot set), less the query's own item with ``exclude_self`` (query
    ``i`` is item ``i``)."""
    if query_labels.ndim == 2:
        counts = np.zeros(len(query_labels), np.int64)
        for start, block in relevance_blocks(query_labels, gallery_labels, min_jaccard,
                                             exclude_self=exclude_self):
            counts[start : start + len(block)] = block.sum(axis=1)
        return counts
    classes, counts = np.unique(gallery_labels, return_counts=True)
    at = np.minimum(np.searchsorted(classes, query_labels), len(classes) - 1)
    relevant = np.where(classes[at] == query_labels, counts[at], 0)
    if exclude_self:  # the query's own item, where it is of the query's class
        relevant = relevant - (gallery_labels == query_labels)
    return relevant


def query_relevance(gallery_labels, query_labels, num_queries, exclude_self, min_jaccard):
    """``(query_labels, num_relevant)`` of :meth:`Index.retrieve`: the queries' labels
    checked against the index's, and :func:`count_relevant`.

    Raises:
        ValueError: for an index without labels, labels of another form or ``L`` than
            the index's, or not one per query.
    """
    if gallery_labels is None:
        raise ValueError("`query_labels` mark the correct neighbours by the index's "
                         "labels, and this index has none.")
    query_labels = host_labels(query_labels, "query_labels")
    check_same_form(query_labels, gallery_labels, "query_labels", "the index's labels")
    if len(query_labels) != num_queries:
        raise ValueError(f"`query_labels` must have one entry per query "
                         f"({num_queries}). Received: {len(query_labels)}")
    min_jaccard = _labels.check_min_jaccard(min_jaccard)
    return query_labels, count_relevant(gallery_labels, query_labels, exclude_self, min_jaccard)


def matched_labels(labels, near, unknown):
    """:meth:`Index.match`'s answer from the nearest items' ``labels`` (``[Q]``, or
    ``[Q, L]`` multi-hot) and whether each is ``near`` enough: ``unknown`` for class ids, the
    empty label set (a row of False) for multi-hot labels.

    Raises:
        ValueError: for multi-hot labels and an ``unknown`` other than ``-1``.
    """
    if labels.ndim == 1:
        return np.where(near, labels, np.int64(unknown))
    if not (isinstance(unknown, numbers.Integral) and unknown == -1):
        raise ValueError("With multi-hot labels a query without a match gets the empty label "
                         f"set (a row of 0): leave `unknown` at -1. Received: unknown={unknown!r}")
    return labels & np.asarray(near, bool)[:, None]


@dataclasses.dataclass(frozen=True, eq=False)
class RetrievalResults:
    """Each query's ranked neighbours in a gallery: scores, positions, labels, ids.

    Lists are nearest first and padded to a common length ``k``: a position of
    ``-1`` is an empty slot (an approximate index found fewer items, or a
    threshold cut the list there); its label is ``-1`` (the empty set for
    multi-hot labels), its id ``-1`` (or ``""`` for string ids) and its score
    the worst one (``-inf`` for similarities, ``inf`` for distances) in the
    lists :meth:`tfdml.search.Index.retrieve` and the cuts give. The score of an empty slot is never read (a list built by
    hand may hold NaN there).

    Attributes:
        metric: ``"cosine"``, ``"dot"`` or ``"l2"``: scores are similarities
            (larger is nearer) or Euclidean distances (smaller is nearer).
        scores: ``[Q, k]`` float32 scores.
        indices: ``[Q, k]`` int64 gallery positions (``-1``: no item).
        labels: ``[Q, k]`` int64 labels of the neighbours (``[Q, k, L]`` bool
            for multi-hot labels), or None.
        ids: ``[Q, k]`` ids of the neighbours (integers or strings), or None.
        query_labels: ``[Q]`` int64 labels of the queries (``[Q, L]`` bool
            multi-hot), or None.
        query_ids: ``[Q]`` ids of the queries, or None.
        num_relevant: ``[Q]`` int64: the gallery items that are correct for each
            query (relevant, not excluded), or None when unknown.
        min_jaccard: with multi-hot labels, a neighbour is correct when its label
            set shares a label with the query's (None) or when the Jaccard
            similarity of the two sets is at least ``min_jaccard``.

    Labels are ``[N]`` class ids (correct: the query's label) or ``[N, L]``
    multi-hot label sets (correct: relevant by :func:`tfdml._labels.relevance`).
    """

    metric: str
    scores: np.ndarray
    indices: np.ndarray
    labels: np.ndarray | None = None
    ids: np.ndarray | None = None
    query_labels: np.ndarray | None = None
    query_ids: np.ndarray | None = None
    num_relevant: np.ndarray | None = None
    min_jaccard: float | None = None

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
        """``[Q, k]`` bool: the slots that hold an item of the query's label (with
        multi-hot labels: an item relevant to the query, see ``min_jaccard``).

        Raises:
            ValueError: without labels for the queries and the gallery.
        """
        if self.labels is None or self.query_labels is None:
            raise ValueError("`correct` needs the labels of the queries and of the gallery: "
                             "retrieve with `query_labels=` from an index with labels.")
        if self.labels.ndim == 2:
            return self.kept & (self.labels == self.query_labels[:, None])
        num_labels = self.labels.shape[-1]
        slots = np.arange(self.indices.size).reshape(self.indices.shape)
        return self.kept & neighbour_relevance(self.query_labels,
                                               self.labels.reshape(-1, num_labels), slots,
                                               self.min_jaccard)

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
            if values is None:
                return None
            return np.take_along_axis(values, order if values.ndim == 2 else order[..., None], 1)

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
        if self.labels is not None and self.labels.ndim == 3:  # multi-hot: empty sets
            out = dataclasses.replace(out, labels=kept[..., None] & np.take_along_axis(
                self.labels, order[..., None], 1))
        elif self.labels is not None:
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
