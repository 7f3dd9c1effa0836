"""The inputs of losses, miners and metrics: class ids and embeddings, checked and cast.

The checks every loss, miner and metric makes on what it is given, and the
dtypes it computes in. ``cast_labels`` is public as ``tfdml.ops.cast_labels``;
the rest is plumbing for tfdml's own code.
"""

from __future__ import annotations

import numbers

import keras
import numpy as np
from keras import ops

from tfdml._labels import check_multi_hot, is_multi_label
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
    "check_batch_sizes",
    "check_embeddings",
    "check_label_array",
    "check_ref_offset",
    "compute_dtype",
    "multi_hot_ok",
    "same_label_dtype",
    "validate_class_ids",
]


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
    """Checks class ids given as a NumPy array (or a list) before anything converts them.

    What :func:`cast_labels` checks first, for labels that Keras converts to a
    tensor before a loss sees them (``fit(x, y)``): a ValueError for strings
    and objects, for float values that are not whole numbers and, under JAX
    without 64-bit mode (where Keras would hold them in 32 bits and merge
    distinct ids), for ids beyond int32. The shape is not checked.

    Raises:
        ValueError: as described above, naming ``name``.
    """
    _jax_int64(_numpy_labels(np.asarray(labels), name), name)


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


def cast_labels(labels, name: str = "labels"):
    """Returns integer class ids as an integer tensor of shape ``[B]`` (or multi-hot
    label sets as ``[B, L]`` int32 0/1).

    Labels of shape ``[B, L]`` with ``L >= 2`` are multi-hot label sets
    (:mod:`tfdml._labels`): checked eagerly (values 0 or 1, no empty set) and
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


def _static_int(x):
    """``x`` as a Python int when it is one or a readable scalar tensor, else None."""
    if isinstance(x, numbers.Integral) and not isinstance(x, bool):
        return int(x)
    if is_tensor(x) and not is_traced(x):
        return int(ops.convert_to_numpy(x))
    return None


def check_ref_offset(ref_offset, batch, num_ref):
    """Checks that anchors ``[ref_offset, ref_offset + B)`` lie inside a reference set of ``R``.

    ``ref_offset=None`` (anchors outside the reference set) passes. An
    offset whose value can be read (a Python int, an eager tensor) raises a
    ValueError when it is out of range; a traced offset is not checked.

    Returns:
        ``ref_offset``: a Python int, or an int32 tensor when traced.
    """
    if ref_offset is None:
        return None
    if not is_tensor(ref_offset) and (
        not isinstance(ref_offset, numbers.Integral) or isinstance(ref_offset, bool)
    ):
        raise ValueError(f"`ref_offset` must be an int or None. Received: ref_offset={ref_offset!r}")
    offset, b, r = _static_int(ref_offset), _static_int(batch), _static_int(num_ref)
    if offset is None:
        offset = ops.cast(ref_offset, "int32")
        ok = ops.logical_and(offset >= 0, offset + ops.cast(batch, "int32")
                              <= ops.cast(num_ref, "int32"))
        return graph_assert(offset, ok,
                             "`ref_offset` must be in [0, len(ref_embeddings) - len(y_pred)].")
    if b is not None and r is not None and not 0 <= offset <= r - b:
        raise ValueError(
            f"`ref_offset` must be in [0, {r - b}] so that the {b} anchors "
            f"are rows ref_offset .. ref_offset + {b} - 1 of the {r} reference "
            f"samples (None: the anchors are not in the reference set). "
            f"Received: ref_offset={offset}"
        )
    return offset


def same_label_dtype(a, b):
    """Casts two label tensors to a common dtype (int64 if either is int64)."""
    if dtype_name(a) == dtype_name(b):
        return a, b
    return ops.cast(a, "int64"), ops.cast(b, "int64")


def _is_floating(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat"))


def check_embeddings(embeddings, name: str = "embeddings"):
    """Converts to a tensor and checks that it is a rank-2 ``[B, D]`` float tensor."""
    embeddings = ops.convert_to_tensor(embeddings)
    if len(embeddings.shape) != 2:
        raise ValueError(
            f"`{name}` must be a rank-2 tensor of shape [B, D]. "
            f"Received: {name}.shape={tuple(embeddings.shape)}"
        )
    if not _is_floating(dtype_name(embeddings)):
        raise ValueError(
            f"`{name}` must have a floating dtype. Received: {name}.dtype={dtype_name(embeddings)}"
        )
    return embeddings


def check_batch_sizes(labels, embeddings, labels_name="labels", embeddings_name="embeddings"):
    """Raises ValueError when the static batch sizes of labels and embeddings differ."""
    n_labels = labels.shape[0]
    n_embeddings = embeddings.shape[0]
    if n_labels is not None and n_embeddings is not None and n_labels != n_embeddings:
        raise ValueError(
            f"`{labels_name}` and `{embeddings_name}` must have the same batch size. "
            f"Received: {labels_name}.shape={tuple(labels.shape)}, "
            f"{embeddings_name}.shape={tuple(embeddings.shape)}"
        )


def compute_dtype(dtype) -> str:
    """The dtype computations run in: ``"float64"`` stays, all else ``"float32"``."""
    return "float64" if keras.backend.standardize_dtype(dtype) == "float64" else "float32"


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
