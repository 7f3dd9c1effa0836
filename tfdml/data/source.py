"""`DatasetSplit`: what the data set readers return and the P x K sampler consumes."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["DatasetSplit"]


@dataclass
class DatasetSplit:
    """One split of a metric-learning data set, as lists in memory (never the decoded images
    of a large data set).

    Exactly one of ``paths``, ``encoded`` and ``images`` is set:

    * ``paths``: ``[N]`` str, image files decoded lazily in a ``tf.data`` map step;
    * ``encoded``: ``[N]`` object array of encoded image bytes (e.g. read through TFDS);
    * ``images``: ``[N, H, W, C]`` decoded array, for small in-memory data (digits).

    Attributes:
        name: data set name, e.g. ``"cub200"``.
        split: split name, e.g. ``"train"``, ``"test"``, ``"query"``, ``"gallery"``.
        labels: ``[N]`` int64 class ids. Ids are the data set's own class indices
            (not re-numbered per split), so query and gallery ids match.
        class_names: name of each class id present, ``{id: name}``.
        bboxes: optional ``[N, 4]`` float32 boxes ``(ymin, xmin, ymax, xmax)`` in
            pixels of the original image (CUB, Cars196, In-shop), or None.
    """

    name: str
    split: str
    labels: np.ndarray
    paths: np.ndarray | None = None
    encoded: np.ndarray | None = None
    images: np.ndarray | None = None
    class_names: dict = field(default_factory=dict)
    bboxes: np.ndarray | None = None

    def __post_init__(self):
        given = [k for k in ("paths", "encoded", "images") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                "DatasetSplit needs exactly one of `paths`, `encoded`, `images`. "
                f"Received: {given or 'none'}"
            )
        self.labels = np.asarray(self.labels, dtype=np.int64)
        n = len(getattr(self, given[0]))
        if self.labels.shape != (n,):
            raise ValueError(
                f"`labels` must have shape [{n}] to match `{given[0]}`. "
                f"Received: labels.shape={self.labels.shape}"
            )
        if self.bboxes is not None and np.shape(self.bboxes) != (n, 4):
            raise ValueError(f"`bboxes` must have shape [{n}, 4]. Received: {np.shape(self.bboxes)}")

    def __len__(self):
        return int(self.labels.shape[0])

    @property
    def num_classes(self) -> int:
        return int(np.unique(self.labels).size)

    def class_counts(self) -> dict:
        """``{class id: number of images}``."""
        ids, counts = np.unique(self.labels, return_counts=True)
        return {int(i): int(c) for i, c in zip(ids, counts, strict=True)}

    def __repr__(self):
        kind = "paths" if self.paths is not None else "encoded" if self.encoded is not None else "images"
        return (f"DatasetSplit(name={self.name!r}, split={self.split!r}, images={len(self)}, "
                f"classes={self.num_classes}, source={kind})")
