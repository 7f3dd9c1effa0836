"""Labels as NumPy arrays: one class id per sample, or a set of labels per sample.

tfdml takes two forms of labels everywhere (losses, miners, metrics, search, samplers):

* **class ids**, ``[N]`` (or ``[N, 1]``) integers: two samples are positives when their
  ids are equal;
* **multi-label**, ``[N, L]`` multi-hot (0/1, ``L >= 2``): two samples are positives when
  their label sets share a label (or, with ``min_jaccard``, when the Jaccard similarity
  ``|A & B| / |A | B|`` of their sets reaches it), and negatives when they share none.

A padded ``[N, M]`` list of label ids (``-1`` for none) is turned into multi-hot by
:func:`multi_hot`. This module is the NumPy side (data, metrics and search read labels
here); :func:`tfdml.ops.label_masks` is the tensor side, with the same rule. The ids the
metrics take (class ids, cluster ids, group ids) must be finite
(:func:`check_finite_labeling`).
"""

from __future__ import annotations

import numpy as np

from tfdml._argument_checks import at_indices, check_int, is_number

__all__ = [
    "check_finite_labeling",
    "check_min_jaccard",
    "check_multi_hot",
    "is_multi_label",
    "label_jaccard",
    "label_overlap",
    "multi_hot",
    "relevance",
    "row_relevance",
]


def is_multi_label(labels) -> bool:
    """``labels`` (an array or a tensor) is ``[N, L]`` multi-hot: rank 2 with ``L >= 2``.

    ``[N, 1]`` is one class id per sample.
    """
    shape = getattr(labels, "shape", None)
    if shape is None:
        shape = np.shape(labels)
    return len(shape) == 2 and shape[-1] != 1


def check_multi_hot(labels, name: str = "labels"):
    """``[N, L]`` multi-hot labels as a bool array, checked.

    Raises:
        ValueError: naming ``name``, for values other than 0 and 1 (NaN
            included), strings, or a sample whose label set is empty.
    """
    array = np.asarray(labels)
    if array.ndim != 2 or array.shape[1] < 2:
        raise ValueError(f"`{name}` must be [N, L] multi-hot labels with L >= 2. "
                         f"Received: {name}.shape={array.shape}")
    if array.dtype.kind not in "biuf":
        raise ValueError(f"`{name}` must hold 0 and 1 (multi-hot). Received: "
                         f"{name}.dtype={array.dtype}")
    bad = ~((array == 0) | (array == 1))
    if bad.any():
        rows, cols = np.nonzero(bad)
        raise ValueError(
            f"`{name}` must be multi-hot: every value 0 or 1 (a padded list of label ids "
            f"converts with tfdml.ops.multi_hot). Received {array[rows[0], cols[0]].item()!r} at "
            f"{name}[{rows[0]}, {cols[0]}]")
    hot = array.astype(bool)
    empty = np.flatnonzero(~hot.any(axis=1))
    if empty.size:
        raise ValueError(
            f"`{name}` has samples with an empty label set (no label set to 1), e.g. rows "
            f"{empty[:5].tolist()}: such a sample is nobody's positive. Give it a label or "
            "leave it out.")
    return hot


def multi_hot(label_ids, num_labels: int, name: str = "label_ids"):
    """``[N, num_labels]`` multi-hot (bool) from label ids.

    Args:
        label_ids: a padded ``[N, M]`` integer array with ``-1`` for "no label", or a
            list of ``N`` lists (or sets) of label ids.
        num_labels: ``L``; every id must be in ``[0, L)``.
        name: the argument's name, for errors.

    Raises:
        ValueError: for an id outside ``[0, num_labels)`` (other than the ``-1``
            padding of an array), a sample with no label, or a ``num_labels`` that is
            not an integer >= 2.
    """
    num_labels = check_int("num_labels", num_labels, minimum=2)
    if isinstance(label_ids, np.ndarray) or (
            isinstance(label_ids, (list, tuple)) and label_ids
            and all(np.ndim(row) == 1 for row in label_ids)
            and len({len(row) for row in label_ids}) == 1
            and not isinstance(label_ids[0], (set, frozenset))):
        ids = np.asarray(label_ids)
        if ids.ndim != 2 or ids.dtype.kind not in "iu":
            raise ValueError(f"`{name}` must be a padded [N, M] array of integer label ids "
                             f"(-1 for none). Received: shape={ids.shape}, dtype={ids.dtype}")
        rows = [row[row != -1] for row in ids]
    else:
        rows = [np.asarray(sorted(row), dtype=np.int64).reshape(-1) for row in label_ids]
    out = np.zeros((len(rows), num_labels), dtype=bool)
    for i, row in enumerate(rows):
        if row.size and (row.min() < 0 or row.max() >= num_labels):
            bad = row[(row < 0) | (row >= num_labels)][0]
            raise ValueError(f"`{name}` has label id {int(bad)} in sample {i}, outside "
                             f"[0, num_labels={num_labels}).")
        out[i, row] = True
    return check_multi_hot(out, name)


def check_finite_labeling(values, name):
    """Raises a ValueError naming ``name`` when a float labeling holds a NaN or an Inf.

    Args:
        values: an array-like of ids (class ids, cluster ids, group ids).
        name: the argument's name, for the message.

    Raises:
        ValueError: ``values`` has a floating dtype and holds a NaN or an Inf; the
            message gives their number and positions.
    """
    values = np.asarray(values)
    if np.issubdtype(values.dtype, np.floating):
        bad = np.flatnonzero(~np.isfinite(values.reshape(-1)))
        if len(bad):
            what = "value" if len(bad) == 1 else "values"
            raise ValueError(
                f"`{name}` contains {len(bad)} non-finite {what} (NaN or Inf); it must hold "
                f"integer ids. Received: {name} with non-finite {what} at {at_indices(bad)}"
            )


def check_min_jaccard(min_jaccard):
    """``min_jaccard`` as a float in ``(0, 1]``, or None (positives share a label)."""
    if min_jaccard is None:
        return None
    if not is_number(min_jaccard) or not 0.0 < float(min_jaccard) <= 1.0:
        raise ValueError("`min_jaccard` must be None (positives share a label) or a number in "
                         f"(0, 1]. Received: min_jaccard={min_jaccard!r}")
    return float(min_jaccard)


def label_overlap(labels, ref_labels):
    """``[N, R]`` number of labels each pair shares (1/0 for class ids), as int64.

    Both must be of one form (class ids or multi-hot of the same ``L``).
    """
    a, b = np.asarray(labels), np.asarray(ref_labels)
    if is_multi_label(a) != is_multi_label(b):
        raise ValueError("`labels` and `ref_labels` must both be class ids or both multi-hot. "
                         f"Received shapes {a.shape} and {b.shape}")
    if not is_multi_label(a):
        return (a.reshape(-1)[:, None] == b.reshape(-1)[None, :]).astype(np.int64)
    if a.shape[1] != b.shape[1]:
        raise ValueError("Multi-hot `labels` and `ref_labels` must have the same number of "
                         f"labels L. Received {a.shape[1]} and {b.shape[1]}")
    # A float32 product (BLAS) is exact for counts below 2**24 and ten times faster than
    # NumPy's integer one.
    return np.rint(a.astype(np.float32) @ b.astype(np.float32).T).astype(np.int64)


def _jaccard(inter, size_a, size_b):
    """The Jaccard similarity from ``|A & B|`` and the two set sizes (broadcast), float64."""
    inter = inter.astype(np.float64)
    union = size_a + size_b - inter
    return np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)


def _reaches(jaccard, min_jaccard):
    """A Jaccard similarity at least ``min_jaccard`` (up to rounding: 1/3 reaches 1/3)."""
    return jaccard >= min_jaccard - 1e-12


def label_jaccard(labels, ref_labels):
    """``[N, R]`` Jaccard similarity of the label sets (1/0 for class ids), as float64."""
    inter = label_overlap(labels, ref_labels)
    if not is_multi_label(np.asarray(labels)):
        return inter.astype(np.float64)
    size_a = np.asarray(labels).astype(np.float64).sum(axis=1)
    size_b = np.asarray(ref_labels).astype(np.float64).sum(axis=1)
    return _jaccard(inter, size_a[:, None], size_b[None, :])


def relevance(labels, ref_labels, min_jaccard=None):
    """``[N, R]`` bool: the pair are positives (same class; shared label or Jaccard >=
    ``min_jaccard`` for multi-label)."""
    if min_jaccard is None or not is_multi_label(np.asarray(labels)):
        return label_overlap(labels, ref_labels) > 0
    return _reaches(label_jaccard(labels, ref_labels), min_jaccard)


def row_relevance(labels, items, min_jaccard=None, graded=False):
    """``[Q, k]``: the rule of :func:`relevance` between query ``i`` (``labels[i]``,
    ``[Q, L]`` multi-hot) and each of its own ``k`` items (``items[i]``, ``[Q, k, L]``); with
    ``graded``, the Jaccard similarity of the relevant pairs (float64) and 0 elsewhere."""
    a, b = np.asarray(labels, dtype=bool), np.asarray(items, dtype=bool)
    inter = np.einsum("ql,qkl->qk", a.astype(np.float32), b.astype(np.float32))
    inter = np.rint(inter).astype(np.int64)
    if min_jaccard is None and not graded:
        return inter > 0
    jaccard = _jaccard(inter, a.sum(axis=1)[:, None], b.sum(axis=2))
    relevant = inter > 0 if min_jaccard is None else _reaches(jaccard, min_jaccard)
    return np.where(relevant, jaccard, 0.0) if graded else relevant
