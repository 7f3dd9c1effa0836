"""Labels: one class id per sample, or a set of labels per sample; every rule about them.

tfdml takes two forms of labels everywhere (losses, miners, metrics, search, samplers):

* **class ids**, ``[N]`` (or ``[N, 1]``) integers: two samples are positives when their
  ids are equal;
* **multi-label**, ``[N, L]`` multi-hot (0/1, ``L >= 2``): two samples are positives when
  their label sets share a label (or, with ``min_jaccard``, when the Jaccard similarity
  ``|A & B| / |A | B|`` of their sets reaches it), and negatives when they share none.

Here are their checks and casts, as NumPy arrays and as tensors: :func:`cast_labels`
(public as ``tfdml.ops.cast_labels``) casts both forms to tensors; a multi-hot value other
than 0 or 1, or an empty label set, is a ValueError where the values can be read
(:func:`check_multi_hot`) and, traced, a flag (:func:`multi_hot_ok`) that the losses turn
into NaN; class ids are checked against a class count by :func:`validate_class_ids`. A
padded ``[N, M]`` list of label ids (``-1`` for none) is turned into multi-hot by
:func:`multi_hot`. The ids the metrics take (class ids, cluster ids, group ids) must be
finite (:func:`check_finite_labeling`).

The rule of positives is here on the NumPy side (data, metrics and search read labels
here: :func:`relevance`, :func:`row_relevance`); :func:`tfdml.ops.label_masks` is the tensor
side, with the same rule.
"""
from __future__ import annotations

import numpy as np
from keras import ops

from tfdml._argument_checks import at_indices, check_int, is_number
from tfdml._shims import (
    backend_name,
    bitcast_to_int64,
    dtype_name,
    graph_assert,
    is_tensor,
    is_traced,
)

__all__ = [
    "cast_labels",
    "check_finite_labeling",
    "check_label_array",
    "check_min_jaccard",
    "check_multi_hot",
    "is_multi_label",
    "label_jaccard",
    "label_overlap",
    "multi_hot",
    "multi_hot_ok",
    "relevance",
    "row_relevance",
    "same_label_dtype",
    "validate_class_ids",
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


def _cast_multi_hot(labels, name):
    """``[B, L]`` multi-hot labels as int32 0/1; a value other than 0 or 1 becomes -1 when
    traced (:func:`multi_hot_ok` is then false), a ValueError eagerly."""
    if not is_tensor(labels):
        return ops.convert_to_tensor(check_multi_hot(labels, name).astype(np.int32))
    dtype = dtype_name(labels)
    if dtype == "string" or not (dtype.startswith(("int", "uint", "float", "bfloat"))
                                 or dtype == "bool"):
        raise ValueError(f"`{name}` must hold 0 and 1 (multi-hot). Received: "
                         f"{name}.dtype={dtype}")
    if not is_traced(labels):
        return ops.convert_to_tensor(
            check_multi_hot(ops.convert_to_numpy(labels), name).astype(np.int32))
    one, zero = ops.equal(labels, 1), ops.equal(labels, 0)
    return ops.where(one, 1, ops.where(zero, 0, -1))


def multi_hot_ok(labels):
    """For ``[B, L]`` multi-hot labels cast by :func:`cast_labels`: a scalar bool, true
    when every value is 0 or 1 and every sample has a label (``True``, a Python bool, for
    class ids and for labels checked eagerly already)."""
    if not is_multi_label(labels) or not is_traced(labels):
        return True
    valid = ops.all(ops.greater_equal(labels, 0))
    return ops.logical_and(valid, ops.all(ops.any(ops.equal(labels, 1), axis=1)))


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


def _string_labels_error(name, dtype):
    return ValueError(
        f"`{name}` must be integer class ids, not strings or objects. Map class names to "
        "integer ids first, e.g. `names, ids = np.unique(labels, return_inverse=True)` (or "
        f"keras.layers.StringLookup in a tf.data pipeline). Received: {name}.dtype={dtype}"
    )


def _numpy_labels(array, name):
    """Integer ids from a NumPy array (before any conversion to a backend tensor)."""
    if array.dtype.kind in "USO":
        raise _string_labels_error(name, array.dtype)
    if array.dtype.kind not in "iufb":
        raise ValueError(f"`{name}` must be integer class ids. Received: {name}.dtype={array.dtype}")
    if array.dtype == np.uint64:
        return array.view(np.int64)
    if array.dtype == np.uint32:
        return array.astype(np.int64)
    if array.dtype.kind == "f":
        bad = array[~(np.isfinite(array) & (array == np.round(array)))]
        if bad.size:
            raise ValueError(
                f"`{name}` holds float values that are not whole numbers (or NaN/Inf); class ids "
                f"must be integers. Received e.g. {bad[:3].tolist()}"
            )
        return array.astype(np.int64)
    if array.dtype in (np.int32, np.int64):
        return array
    return array.astype(np.int32)


def _fits_int32(array) -> bool:
    info = np.iinfo(np.int32)
    return array.size == 0 or (array.min() >= info.min and array.max() <= info.max)


def _jax_int64(array, name):
    """JAX without ``jax_enable_x64`` holds integers in 32 bits: cast ids that fit, refuse others."""
    if array.dtype != np.int64 or backend_name() != "jax":
        return array
    import jax

    if jax.config.jax_enable_x64:
        return array
    if not _fits_int32(array):
        raise ValueError(
            f"`{name}` holds class ids beyond int32, which JAX cannot hold without 64-bit mode "
            '(`jax.config.update("jax_enable_x64", True)`); distinct ids would be merged. '
            "Enable it or map the ids to a smaller range."
        )
    return array.astype(np.int32)


def check_label_array(labels, name: str = "y"):
    """Checks class ids given as arrays (NumPy, lists, pandas) before anything converts them.

    What :func:`cast_labels` checks first, for labels that Keras converts to a
    tensor before a loss sees them (``fit(x, y)``): a ValueError for strings
    and objects, for float values that are not whole numbers and, under JAX
    without 64-bit mode (where Keras would hold them in 32 bits and merge
    distinct ids), for ids beyond int32. The shape is not checked. Anything else
    passes: None, tensors and datasets (checked where they are read), and ragged
    lists (Keras says what is wrong with them).

    Raises:
        ValueError: as described above, naming ``name``.
    """
    if labels is None or ops.is_tensor(labels):
        return
    if hasattr(labels, "to_numpy") and hasattr(labels, "dtype"):  # pandas
        labels = labels.to_numpy()
    if not isinstance(labels, (np.ndarray, list, tuple)):
        return
    try:
        array = np.asarray(labels)
    except ValueError:  # ragged
        return
    _jax_int64(_numpy_labels(array, name), name)


def _check_label_shape(shape, name):
    rank = len(shape)
    if rank == 2 and shape[-1] == 1:
        return True
    if rank != 1:
        raise ValueError(
            f"`{name}` must be integer class ids of shape [B] or [B, 1], or multi-hot label "
            f"sets of shape [B, L] with L >= 2. Received: {name}.shape={tuple(shape)}"
        )
    return False


def cast_labels(labels, name: str = "labels"):
    """Returns integer class ids as an integer tensor of shape ``[B]`` (or multi-hot
    label sets as ``[B, L]`` int32 0/1).

    Labels of shape ``[B, L]`` with ``L >= 2`` are multi-hot label sets
    (:func:`check_multi_hot`): checked eagerly (values 0 or 1, no empty set) and
    cast to int32; when traced, a value other than 0 or 1 becomes -1, which
    :func:`multi_hot_ok` reports. Class ids: accepts shape ``[B]`` or
    ``[B, 1]``, any integer dtype, and floats that hold whole numbers. The result is ``int32`` for integer types of at most
    32 bits (``uint32``: ``int64``) and ``int64`` for 64-bit ids and for
    floats, so that no two distinct ids are merged: ``uint64`` ids are
    reinterpreted bit for bit (ids at or above 2**63 become negative, still
    distinct), and float ids beyond 2**31 keep their value. Ids already
    rounded by a ``bfloat16`` conversion cannot be recovered, so pass integer
    labels. Under JAX, 64-bit ids need ``jax.config.update("jax_enable_x64",
    True)``; without it JAX holds every integer in 32 bits.

    Raises:
        ValueError: if the labels are not of rank 1, or rank 2 with a last
            dimension of 1; if they are strings or another non-numeric
            dtype; or if float labels hold a value that is not a whole
            number (checked where the values can be read, i.e. not inside a
            compiled function).
    """
    if is_multi_label(labels):
        return _cast_multi_hot(labels, name)
    if not is_tensor(labels):
        given = labels
        array = _numpy_labels(np.asarray(labels), name)
        if _check_label_shape(array.shape, name):
            array = array[:, 0]
        if not isinstance(given, np.ndarray) and array.dtype == np.int64 and _fits_int32(array):
            array = array.astype(np.int32)  # Python ints: int32 where they fit, as TensorFlow
        return ops.convert_to_tensor(_jax_int64(array, name))
    dtype = dtype_name(labels)
    if dtype == "string":
        raise _string_labels_error(name, dtype)
    if not (dtype.startswith(("int", "uint", "float", "bfloat")) or dtype == "bool"):
        raise ValueError(f"`{name}` must be integer class ids. Received: {name}.dtype={dtype}")
    if _check_label_shape(labels.shape, name):
        labels = ops.squeeze(labels, axis=-1)
    if dtype in ("int32", "int64"):
        # Traced: a tensor of this graph, not the caller's own (a captured tensor, e.g.
        # labels closed over by a tf.function): TensorFlow cannot differentiate a loop that
        # captures the function's capture itself (row blocks: "... is in list of
        # internal_captures but not in internal_capture_to_output").
        return ops.reshape(labels, (-1,)) if is_traced(labels) else labels
    if dtype == "uint64":
        return bitcast_to_int64(labels)
    if dtype == "uint32":
        return ops.cast(labels, "int64")
    if dtype.startswith(("float", "bfloat")):
        if not is_traced(labels):
            _numpy_labels(ops.convert_to_numpy(ops.cast(labels, "float64")), name)
            return ops.cast(labels, "int64")
        whole = ops.logical_and(ops.isfinite(labels), ops.equal(labels, ops.round(labels)))
        return graph_assert(ops.cast(labels, "int64"), ops.all(whole),
                             f"`{name}` holds float values that are not whole numbers (or "
                             "NaN/Inf); class ids must be integers.")
    return ops.cast(labels, "int32")


def same_label_dtype(a, b):
    """Casts two label tensors to a common dtype (int64 if either is int64)."""
    if dtype_name(a) == dtype_name(b):
        return a, b
    return ops.cast(a, "int64"), ops.cast(b, "int64")


def validate_class_ids(labels, num_classes: int, message: str | None = None):
    """Class ids must be in ``[0, num_classes)``: ``(labels, valid)``.

    Eagerly, ids out of range raise a ValueError and ``valid`` is ``True``.
    When traced, ``valid`` is a scalar bool tensor (false when an id is out
    of range) that the loss turns into a NaN value with :func:`nan_unless`,
    since XLA, JAX and PyTorch tracing cannot raise; a ``tf.function`` graph
    without XLA also fails an assertion.

    Args:
        labels: integer ids.
        num_classes: the number of classes.
        message: what the error says first. Defaults to `None`
            ("Class ids (y_true) must be in [0, num_classes).").

    Raises:
        ValueError: eagerly, for an id outside ``[0, num_classes)``.
    """
    if message is None:
        message = f"Class ids (y_true) must be in [0, {num_classes}) (num_classes={num_classes})."
    if is_traced(labels):
        ok = ops.logical_and(ops.all(labels >= 0), ops.all(labels < num_classes))
        return graph_assert(labels, ok, message), ok
    values = ops.convert_to_numpy(labels)
    if values.size and (values.min() < 0 or values.max() >= num_classes):
        raise ValueError(f"{message} Received ids from {values.min()} to {values.max()}.")
    return labels, True


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
    """``[Q, k]``: the rule of :func:`relevance` between query ``i`` (``labels[i]``) and each
    of its own ``k`` items (``items[i]``): ``[Q]`` and ``[Q, k]`` class ids, or ``[Q, L]`` and
    ``[Q, k, L]`` multi-hot; with ``graded``, the Jaccard similarity of the relevant pairs
    (float64; 1 for class ids) and 0 elsewhere."""
    if np.ndim(labels) == 1:
        same = np.asarray(items) == np.asarray(labels)[:, None]
        return same.astype(np.float64) if graded else same
    a, b = np.asarray(labels, dtype=bool), np.asarray(items, dtype=bool)
    inter = np.einsum("ql,qkl->qk", a.astype(np.float32), b.astype(np.float32))
    inter = np.rint(inter).astype(np.int64)
    if min_jaccard is None and not graded:
        return inter > 0
    jaccard = _jaccard(inter, a.sum(axis=1)[:, None], b.sum(axis=2))
    relevant = inter > 0 if min_jaccard is None else _reaches(jaccard, min_jaccard)
    return np.where(relevant, jaccard, 0.0) if graded else relevant
