"""`DatasetSplit`: what the data set readers return and the P x K sampler consumes.

The readers of a source (`tfdml.data.pk_batches`, `eval_batches`, `PKDataset`,
`EvalDataset`) take its arrays from :func:`source_arrays` and check their image arguments
with :func:`check_source`.
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass, field

import numpy as np

from tfdml._argument_checks import check_int
from tfdml._labels import check_multi_hot, is_multi_label
from tfdml.data._categories import class_categories

__all__ = [
    "CATEGORIES_DOC",
    "DatasetSplit",
    "check_bboxes",
    "check_channels",
    "check_in_memory_channels",
    "check_source",
    "source_arrays",
    "source_categories",
    "takes_argument",
]

#: The ``Args`` lines of ``categories`` and ``categories_per_batch`` of the P x K readers
#: (`tfdml.data.pk_batches`, `tfdml.data.PKDataset`), for ``fill_doc``'s ``{CATEGORIES}``.
CATEGORIES_DOC = """\
categories: the category of each class (`{class id: category}`, or one per
    distinct class id in sorted order; one per label for multi-hot labels), as
    `PKSampler` takes them. Defaults to `None`: the `categories` of a
    `DatasetSplit` source (e.g. SOP's super-classes), if it has them.
categories_per_batch: draw the P classes of each batch from this many
    categories (see `PKSampler`). Defaults to `None` (any classes)."""


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
            (not re-numbered per split), so query and gallery ids match. Or, for
            multi-label data, ``[N, L]`` multi-hot labels (0 or 1, at least one label per
            example; kept as int64), where the "classes" are the L labels.
        class_names: name of each class id present, ``{id: name}``.
        bboxes: optional ``[N, 4]`` float32 boxes ``(ymin, xmin, ymax, xmax)`` in
            pixels of the original image (CUB, Cars196, In-shop), or None. Boxes must be
            finite with ``ymin <= ymax`` and ``xmin <= xmax``: a ValueError naming
            ``bboxes``, the rows and their files otherwise.
        categories: optional ``{class id: category id}`` for every class present (SOP's
            super-classes, In-shop's garment types), in the form
            `tfdml.data.PKSampler(categories=...)` takes (for multi-hot labels,
            ``{label index: category id}`` for every label), or None. A class without
            one is a ValueError naming ``categories``.
        category_names: name of each category id, ``{category id: name}``, where the
            data set gives them.
    """

    name: str
    split: str
    labels: np.ndarray
    paths: np.ndarray | None = None
    encoded: np.ndarray | None = None
    images: np.ndarray | None = None
    class_names: dict = field(default_factory=dict)
    bboxes: np.ndarray | None = None
    categories: dict | None = None
    category_names: dict = field(default_factory=dict)

    def __post_init__(self):
        given = [k for k in ("paths", "encoded", "images") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                "DatasetSplit needs exactly one of `paths`, `encoded`, `images`. "
                f"Received: {given or 'none'}"
            )
        multi = is_multi_label(self.labels)
        self.labels = (check_multi_hot(self.labels, "labels").astype(np.int64) if multi
                       else _class_ids(self.labels))
        items = getattr(self, given[0])
        if np.ndim(items) == 0:
            raise ValueError(
                f"`{given[0]}` must hold one item per example ([N, ...]). Received: "
                f"{given[0]} of type {type(items).__name__} and shape {np.shape(items)}"
            )
        n = len(items)
        if multi and len(self.labels) != n:
            raise ValueError(
                f"`labels` must have shape [{n}, L] to match `{given[0]}`. "
                f"Received: labels.shape={self.labels.shape}"
            )
        if not multi and self.labels.shape != (n,):
            raise ValueError(
                f"`labels` must have shape [{n}] to match `{given[0]}`. "
                f"Received: labels.shape={self.labels.shape}"
            )
        if given[0] in ("paths", "encoded"):
            kinds = (str, os.PathLike) if given[0] == "paths" else (bytes,)
            bad = next((i for i, x in enumerate(items) if not isinstance(x, kinds)), None)
            if bad is not None:
                what = "file paths (str or os.PathLike)" if given[0] == "paths" else (
                    "encoded images (bytes)")
                raise ValueError(
                    f"`{given[0]}` must hold {what}. Received: {given[0]}[{bad}] of type "
                    f"{type(items[bad]).__name__}: {items[bad]!r:.80}"
                )
        if self.bboxes is not None:
            if np.shape(self.bboxes) != (n, 4):
                raise ValueError(f"`bboxes` must have shape [{n}, 4]. "
                                 f"Received: bboxes.shape={np.shape(self.bboxes)}")
            check_bboxes(self.bboxes, self.paths)
        if self.categories is not None:
            self._check_categories()

    def _check_categories(self):
        if not isinstance(self.categories, dict):
            raise ValueError("`categories` must be a {class id: category id} dict or None. "
                             f"Received: categories of type {type(self.categories).__name__}")
        multi = self.labels.ndim == 2
        ids = np.arange(self.labels.shape[1]) if multi else np.unique(self.labels)
        class_categories(self.categories, ids, "label" if multi else "class")

    def __len__(self):
        return int(self.labels.shape[0])

    @property
    def num_classes(self) -> int:
        """The number of classes present (of labels carried, for multi-hot labels)."""
        return len(self.class_counts())

    def class_counts(self) -> dict:
        """``{class id: number of images}`` (``{label index: number of images carrying
        it}`` for multi-hot labels, the labels carried by at least one image)."""
        if self.labels.ndim == 2:
            counts = self.labels.sum(axis=0)
            return {int(i): int(counts[i]) for i in np.flatnonzero(counts)}
        ids, counts = np.unique(self.labels, return_counts=True)
        return {int(i): int(c) for i, c in zip(ids, counts, strict=True)}

    def __repr__(self):
        kind = "paths" if self.paths is not None else "encoded" if self.encoded is not None else "images"
        return (f"DatasetSplit(name={self.name!r}, split={self.split!r}, images={len(self)}, "
                f"classes={self.num_classes}, source={kind})")


def check_bboxes(bboxes, paths=None):
    """Raises a ValueError naming `bboxes` unless every `(ymin, xmin, ymax, xmax)` row is
    finite with `ymin <= ymax` and `xmin <= xmax`.

    An inverted box would otherwise be clipped to a 1 x 1 crop. The message gives the first
    bad rows, their boxes and (with `paths`) their files.
    """
    boxes = np.asarray(bboxes, dtype=np.float64).reshape(-1, 4)
    finite = np.isfinite(boxes).all(axis=1)
    if not finite.all():
        bad = np.flatnonzero(~finite)
        raise ValueError(
            "`bboxes` must be finite (ymin, xmin, ymax, xmax) pixel boxes. Received: "
            f"NaN or Inf in the rows {bad[:5].tolist()}"
        )
    inverted = (boxes[:, 2] < boxes[:, 0]) | (boxes[:, 3] < boxes[:, 1])
    if inverted.any():
        bad = np.flatnonzero(inverted)[:3]
        rows = ", ".join(
            f"bboxes[{i}]={boxes[i].tolist()}"
            + ("" if paths is None else f" ({os.fspath(paths[i])})") for i in bad)
        raise ValueError(
            "`bboxes` must be (ymin, xmin, ymax, xmax) boxes with ymin <= ymax and "
            f"xmin <= xmax. Received: {int(inverted.sum())} inverted box(es), e.g. {rows}"
        )


def _class_ids(labels):
    """``labels`` as int64 class ids, or a ValueError naming ``labels``: integers, or floats
    that hold whole numbers (a float id such as 0.5 used to be truncated without a word)."""
    array = np.asarray(labels)
    kind = array.dtype.kind
    if kind in "iu":
        if kind == "u" and array.size and int(array.max()) > np.iinfo(np.int64).max:
            raise ValueError("`labels` must be class ids below 2**63. Received: labels with "
                             f"the value {int(array.max())}")
        return array.astype(np.int64)
    if kind == "f" or (array.size == 0 and kind != "b"):
        values = array.astype(np.float64)
        whole = np.isfinite(values) & (values == np.round(values)) & (np.abs(values) < 2.0 ** 63)
        if not whole.all():
            raise ValueError(
                "`labels` must be integer class ids: float labels must hold whole numbers "
                "(of magnitude below 2**63). "
                f"Received: labels with the values {values[~whole][:3].tolist()}"
            )
        return values.astype(np.int64)
    raise ValueError(
        f"`labels` must be integer class ids, not {array.dtype} values; map class names to "
        "ids first: `names, ids = np.unique(labels, return_inverse=True)`. Received: labels "
        f"of dtype {array.dtype}, e.g. {array.reshape(-1)[:3].tolist()}"
    )


def _features(features):
    """`(kind, items)` for the features of a `(features, labels)` source."""
    if isinstance(features, np.ndarray) and features.dtype != object and features.dtype.kind not in "US":
        return "images", features
    seq = list(features)
    if seq and all(isinstance(x, (str, os.PathLike)) for x in seq):
        return "paths", np.asarray([os.fspath(x) for x in seq], dtype=object)
    if seq and all(isinstance(x, bytes) for x in seq):
        return "encoded", np.asarray(seq, dtype=object)
    shapes = {np.shape(x) for x in seq}
    if len(shapes) > 1:
        raise ValueError(
            "`source` features must be file paths, encoded images, or arrays of one shape "
            "(in-memory images are stacked into one [N, ...] array). Received: features of "
            f"{len(shapes)} different shapes, e.g. {sorted(shapes, key=str)[:3]}; resize them "
            "first, or pass their files"
        )
    items = np.asarray(seq)
    if items.dtype == object or items.dtype.kind in "US":
        raise ValueError(
            "`source` features must be file paths (str or os.PathLike), encoded images "
            "(bytes) or a numeric array. Received: features of dtype "
            f"{items.dtype} ({type(seq[0]).__name__} elements)")
    return "images", items


def source_arrays(source):
    """Returns `(kind, items, labels, bboxes, name)` for the sources the samplers take.

    `kind` is `"paths"`, `"encoded"` or `"images"`. Raises a ValueError naming `source` for
    an unsupported type, an empty source, features and labels of different lengths, or
    features that cannot be stacked.
    """
    if isinstance(source, DatasetSplit):
        if source.paths is not None:
            kind, items = "paths", np.asarray([os.fspath(p) for p in source.paths], dtype=object)
        elif source.encoded is not None:
            kind, items = "encoded", np.asarray(source.encoded, dtype=object)
        else:
            kind, items = "images", np.asarray(source.images)
        labels, bboxes, name = source.labels, source.bboxes, f"{source.name}/{source.split}"
        if bboxes is not None:  # checked again: the split's fields may have been replaced
            check_bboxes(bboxes, source.paths)
    elif isinstance(source, (tuple, list)) and len(source) == 2:
        features, labels = source
        labels = np.asarray(labels)
        if labels.ndim == 0:
            raise ValueError(
                "`source` labels must be an array of class ids, one per example. Received: "
                f"labels={labels!r}"
            )
        kind, items = _features(features)
        if len(items) != len(labels):
            raise ValueError(
                f"`source` features and labels must have the same length. Received: "
                f"{len(items)} features and {len(labels)} labels"
            )
        bboxes, name = None, "source"
    else:
        raise ValueError(
            "`source` must be a tfdml.data.DatasetSplit, a (features, labels) tuple or a "
            f"(paths, labels) tuple. Received: source of type {type(source).__name__}"
        )
    if len(items) == 0:
        raise ValueError(f"`source` must hold at least one example. Received: {name} with 0")
    return kind, items, labels, bboxes, name


def check_in_memory_channels(items, channels):
    """Raises unless in-memory images `items` can be given `channels` channels."""
    if channels is None:
        return
    if items.ndim != 4:
        raise ValueError(
            "`channels` applies to in-memory images of shape [N, H, W, C]; leave it None for "
            f"other features. Received: channels={channels} with features of shape {items.shape}"
        )
    have = items.shape[-1]
    if have != channels and (have, channels) not in ((1, 3), (3, 1)):
        raise ValueError(
            "`channels` can convert in-memory images from 1 channel to 3 (grayscale to RGB) "
            f"and from 3 to 1 (RGB to grayscale) only. Received: channels={channels} for "
            f"images with {have} channels (shape {items.shape})"
        )


def source_categories(source, categories):
    """``categories``, or for None the ``categories`` of a `DatasetSplit` source (None for a
    source of arrays)."""
    if categories is None and isinstance(source, DatasetSplit):
        return source.categories
    return categories


def check_channels(value, choices=None):
    """``channels`` checked: None or a positive int, one of ``choices`` when given (a
    ValueError naming ``channels`` otherwise)."""
    if value is None:
        return None
    checked = check_int("channels", value)
    if choices is not None and checked not in choices:
        allowed = ", ".join(str(c) for c in (None, *choices[:-1]))
        raise ValueError(
            f"`channels` must be {allowed} or {choices[-1]}. Received: channels={value!r}")
    return checked


def takes_argument(fn, name):
    """Whether ``fn`` (a ``map_fn``) has a parameter ``name`` (False when its signature
    cannot be read)."""
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def check_source(source, map_fn, channels, crop_to_bbox, channel_choices=None):
    """The arguments about the images of a source, checked: ``(channels, kind, items,
    labels, bboxes, name)`` with the arrays of :func:`source_arrays`; ``channel_choices``:
    the channels other than None a reader can give (None: any)."""
    if map_fn is not None and not callable(map_fn):
        raise ValueError(f"`map_fn` must be callable or None. Received: map_fn={map_fn!r}")
    channels = check_channels(channels, channel_choices)
    kind, items, labels, bboxes, name = source_arrays(source)
    if kind == "images":
        check_in_memory_channels(items, channels)
    if crop_to_bbox and bboxes is None:
        raise ValueError(
            "`crop_to_bbox=True` needs a DatasetSplit with `bboxes`. Received: source "
            "without bounding boxes"
        )
    return channels, kind, items, labels, bboxes, name
