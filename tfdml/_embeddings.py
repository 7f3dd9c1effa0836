"""The embeddings given to losses, miners and metrics, checked, and the dtype they compute in.

:func:`check_embeddings` (a ``[B, D]`` floating tensor), :func:`check_batch_sizes` (as many
rows as labels), :func:`check_ref_offset` (where a batch sits in its reference set) and
:func:`compute_dtype`. The labels' checks and casts are in :mod:`tfdml._labels`.
"""

from __future__ import annotations

import numbers

import keras
from keras import ops

from tfdml._shims import dtype_name, graph_assert, is_tensor, is_traced

__all__ = [
    "check_batch_sizes",
    "check_embeddings",
    "check_ref_offset",
    "compute_dtype",
]


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
