"""Retrieval results a person can act on: each query's neighbours, and what to do with them."""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["RetrievalResults"]


@dataclasses.dataclass(frozen=True, eq=False)
class RetrievalResults:
    """Each query's ranked neighbours in a gallery: scores, positions, labels, ids.

    Lists are nearest first and padded to a common length ``k``: a position of
    ``-1`` is an empty slot (the gallery had fewer items, or a threshold cut
    the list there); its score is NaN, its label ``-1`` and its id empty.

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
