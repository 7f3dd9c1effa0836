"""The rows an :class:`~tfdml.search.Index` takes: checks, float32 on the host, L2 normalization,
batches, and the sample its approximate structure is trained on.

An index prepares every row it adds and every query it answers here, in NumPy:
a new number of rows compiles nothing on the host (under JAX, even moving an
array of a new shape to the device compiles). Embeddings arrive as one array
(or tensor) or as an iterable of batches (:func:`is_batches`, :func:`unpack`);
each is checked (rank 2, a floating dtype, the index's number of columns, no
NaN or Inf after the conversion to float32) and, for ``"cosine"``, L2-normalized
(:func:`prepare`).
"""

from __future__ import annotations

import collections.abc

import keras
import numpy as np
from keras import ops

from tfdml import ops as dml
from tfdml._embeddings import check_embeddings
from tfdml.search import approximate as faiss_api
from tfdml.search import exact
from tfdml.search.exact import (
    check_finite,
    nonfinite_rows,
    padded,
    query_bucket,
    score_scale,
)


def is_batches(x) -> bool:
    """Whether ``x`` is an iterable of batches (a generator, an iterator, a ``tf.data``
    dataset) rather than one array-like of embeddings."""
    if isinstance(x, (np.ndarray, list, tuple)) or ops.is_tensor(x) or hasattr(x, "shape"):
        return False
    return isinstance(x, (collections.abc.Iterator, collections.abc.Iterable))


def unpack(batch):
    """``(embeddings, labels, ids)`` of one batch: an array, a tuple or a dict.

    Raises:
        ValueError: for a dict with other keys than ``embeddings``, ``labels`` and
            ``ids`` (or without ``embeddings``), or a tuple of more than three entries.
    """
    if isinstance(batch, dict):
        unknown = set(batch) - {"embeddings", "labels", "ids"}
        if unknown or "embeddings" not in batch:
            raise ValueError("A batch given as a dict must have the keys `embeddings` and "
                             f"optionally `labels` and `ids`. Received: keys {sorted(batch)}")
        return batch["embeddings"], batch.get("labels"), batch.get("ids")
    if isinstance(batch, tuple):
        if not 1 <= len(batch) <= 3:
            raise ValueError("A batch given as a tuple must be (embeddings,), (embeddings, "
                             f"labels) or (embeddings, labels, ids). Received: {len(batch)} "
                             "entries")
        return tuple(batch) + (None,) * (3 - len(batch))
    return batch, None, None


def progress(verbose, total):
    """A ``keras.utils.Progbar`` counting ``total`` rows (None: unknown) with ``verbose=1``,
    else None; a ValueError for another ``verbose`` than 0 or 1."""
    if verbose not in (0, 1) or isinstance(verbose, bool):
        raise ValueError(f"`verbose` must be 0 or 1. Received: verbose={verbose!r}")
    return keras.utils.Progbar(total, unit_name="row") if verbose else None


def host_normalize(x):
    """:func:`tfdml.ops.l2_normalize` of float32 rows in NumPy, on the host.

    No device round trip: an approximate index's rows and queries go to faiss, on
    the host. When every squared norm is safely inside the float32 range the rows
    are divided by their norms directly; otherwise each row is divided by its
    largest absolute entry, then by its norm, so that no square overflows or
    underflows. Zero rows stay zero.

    Args:
        x: ``[N, D]`` float32 NumPy rows.

    Returns:
        ``[N, D]`` float32 rows of norm 1 (or 0).

    Example:

    >>> host_normalize(np.array([[3.0, 4.0], [0.0, 0.0]], np.float32))
    array([[0.6, 0.8],
           [0. , 0. ]], dtype=float32)
    """
    squares = np.einsum("ij,ij->i", x, x)
    if np.all((squares > 1e-30) & (squares < 1e30)):  # no overflow, no underflow: directly
        return x / np.sqrt(squares)[:, None]
    top = np.abs(x).max(axis=1, keepdims=True)
    top[top == 0] = 1
    y = x / top  # the one copy
    norm = np.sqrt(np.einsum("ij,ij->i", y, y))[:, None]
    norm[norm == 0] = 1
    y /= norm
    return y.astype(np.float32, copy=False)


def _float32_rows(embeddings, name, dim):
    """``embeddings`` as ``[N, D]`` float32 NumPy rows, checked (rank, dtype, columns,
    finite after the conversion)."""
    if not isinstance(embeddings, np.ndarray) and ops.is_tensor(embeddings):
        x = np.asarray(ops.convert_to_numpy(check_embeddings(embeddings, name)))
    else:
        x = np.asarray(embeddings)
        if x.ndim != 2:
            raise ValueError(f"`{name}` must be a rank-2 tensor of shape [B, D]. "
                             f"Received: {name}.shape={tuple(x.shape)}")
        dtype = ("float" if x.dtype.kind == "f"  # NumPy's floats; others by name
                 else keras.backend.standardize_dtype(x.dtype))
        if not dtype.startswith(("float", "bfloat")):
            raise ValueError(f"`{name}` must have a floating dtype. Received: "
                             f"{name}.dtype={dtype}")
    if dim is not None and x.shape[-1] != dim:
        raise ValueError(f"`{name}` must have {dim} columns, the size of the index's "
                         f"embeddings. Received: {name}.shape={tuple(x.shape)}")
    # float32 as ops.cast rounds (to nearest; Inf beyond the range: check_finite says so).
    with np.errstate(over="ignore"):
        x = x.astype(np.float32, copy=False)
    check_finite(x, name)
    return x


def prepare(embeddings, name, metric, dim=None, approximate=False, query_buckets=False,
            chunk_size=1024):
    """``[N, D]`` float32 NumPy rows, checked, L2-normalized for ``"cosine"``: a row as an
    :class:`~tfdml.search.Index` stores or searches it.

    Everything but the normalization runs on the host. The rows for an approximate
    structure are normalized on the host too (:func:`host_normalize`: faiss searches
    there); otherwise by :func:`tfdml.ops.l2_normalize`, with ``query_buckets`` in
    chunks padded to :func:`~tfdml.search.query_bucket` rows (a few shapes, each
    compiled once under JAX).

    Args:
        embeddings: ``[N, D]`` floating array or tensor.
        name: the argument's name in the errors.
        metric: ``"cosine"``, ``"dot"`` or ``"l2"``.
        dim: the number of columns the rows must have. Defaults to `None` (any).
        approximate: the rows go to a faiss structure, which scores them in float32
            as given: rows whose scores could overflow are refused (:func:`check_range`).
            Defaults to `False`.
        query_buckets: normalize in padded chunks. Defaults to `False`.
        chunk_size: the rows of a chunk. Defaults to `1024`.

    Returns:
        ``[N, D]`` float32 NumPy rows.

    Raises:
        ValueError: for a rank other than 2, a dtype that is not floating, another
            number of columns than ``dim``, a row with a NaN or an Inf, or (with
            ``approximate``) entries too large for float32 scores.
    """
    x = _float32_rows(embeddings, name, dim)
    if approximate:
        check_range(x, name, metric)
    if metric != "cosine" or not len(x):
        return x
    if approximate:
        return host_normalize(x)
    if not query_buckets:
        return np.asarray(ops.convert_to_numpy(dml.l2_normalize(x)), np.float32)
    normalize = exact.compiled("normalize")
    out = np.empty_like(x)  # row by row the same formula, in chunks of a few shapes
    for start in range(0, len(x), chunk_size):
        rows = x[start : start + chunk_size]
        chunk = padded(rows, query_bucket(len(rows), chunk_size))
        out[start : start + len(rows)] = ops.convert_to_numpy(normalize(chunk))[: len(rows)]
    return out


def check_range(x, name, metric):
    """Refuses rows whose ``"l2"`` or ``"dot"`` scores could overflow float32 in an
    approximate structure, which scores them as given (the exact search scales them).

    Raises:
        ValueError: naming ``name`` and the largest entry.
    """
    if metric == "cosine" or not x.size:
        return
    top = float(np.abs(x).max())
    if score_scale(top, int(x.shape[1]), metric) != 1.0:
        raise ValueError(
            f"`{name}` has entries up to {top:.3g}, whose {metric!r} scores can "
            "overflow float32 in an approximate (faiss) index, which scores the rows as "
            "given. Search such embeddings with the exact index (it rescales them "
            "exactly), or normalize them (metric=\"cosine\").")


def check_blocks(x, name, metric, approximate, block):
    """Checks a large NumPy array ``block`` rows at a time, without a float32 copy of all of
    it: every row finite (the error names every bad row) and, with ``approximate``, no
    score that could overflow (:func:`check_range`).

    Raises:
        ValueError: naming ``name``, as :func:`prepare`.
    """
    for start in range(0, len(x), block):
        if nonfinite_rows(x[start : start + block]).size:
            check_finite(x, name)  # the error naming every bad row
        if approximate:
            check_range(np.asarray(x[start : start + block], np.float32), name, metric)


def check_labels_ids(n, labels, ids):
    """``(labels, ids)`` of ``n`` rows, checked: labels as int64 (or None), ids a 1-D array
    of integers or strings (or None).

    Raises:
        ValueError: for labels that are not integer class ids, or labels or ids that do
            not have one entry per row.
    """
    if labels is not None:
        labels = ops.convert_to_numpy(dml.cast_labels(labels, "labels")).astype(np.int64)
        if len(labels) != n:
            raise ValueError(f"`labels` must have one entry per embedding ({n}). "
                             f"Received: {len(labels)}")
    if ids is not None:
        ids = np.asarray(ids)
        if ids.ndim != 1 or len(ids) != n or ids.dtype.kind not in "iuU":
            raise ValueError("`ids` must be a 1-D array of integers or strings with one "
                             f"entry per embedding ({n}). Received: shape {ids.shape}, "
                             f"dtype {ids.dtype}")
    return labels, ids


def sample(n, size, seed):
    """The sorted positions of a random ``min(n, size)`` of ``n`` rows, drawn without
    replacement from ``numpy.random.default_rng(seed)``."""
    return np.sort(np.random.default_rng(seed).choice(n, min(n, size), replace=False))


def fit(structure, rows, size, seed, description, name):
    """Trains a faiss ``structure`` on ``rows``, or on a random ``size`` of them
    (:func:`sample`) when there are more.

    Raises:
        ValueError: naming ``name`` and quoting faiss when it cannot train
            ``description`` on them (too few rows).
    """
    if len(rows) > size:
        rows = rows[sample(len(rows), size, seed)]
    try:
        structure.train(np.ascontiguousarray(rows))
    except RuntimeError as err:
        raise ValueError(f"`{name}`: faiss cannot train {description!r} on {len(rows)} rows: "
                         f"{faiss_api.reason(err)} Add more rows at once, or call `train` "
                         "with a larger sample first.") from None
