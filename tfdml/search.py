"""Exact nearest-neighbour search: the one implementation in tfdml, and an index to query.

:func:`neighbours` is the search every part of tfdml uses (the retrieval metrics
and callbacks too): queries are processed in chunks of ``chunk_size`` rows and
the gallery in chunks of ``gallery_chunk_size`` rows; each query chunk keeps a
*running* top-k that is merged with every gallery chunk's scores, so memory is
``chunk_size x (gallery_chunk_size + k)`` scores, whatever the number of queries
and gallery items. It is written in ``keras.ops`` and runs on the backend's
device.

:class:`Index` holds a gallery (embeddings, and optionally labels and ids) that
grows with :meth:`Index.add`, answers :meth:`Index.search` (scores and gallery
indices) and :meth:`Index.lookup` (with labels and ids), and saves to one
``.npz`` file.

Conventions:

* **Metrics.** ``"cosine"``: the dot product of L2-normalized vectors, larger
  is nearer; ``"dot"``: the plain dot product, larger is nearer; ``"l2"``:
  the Euclidean distance, smaller is nearer (the names of
  :data:`tfdml.ops.DISTANCES`; the old ``"euclidean"`` still means ``"l2"``,
  with a ``DeprecationWarning``). Scores are computed in float32.
* **Huge embeddings.** ``"cosine"`` normalizes every finite row exactly
  (:func:`tfdml.ops.l2_normalize`). For ``"l2"`` and ``"dot"``, rows so large
  that a float32 score could overflow (entries of about ``9e18 / sqrt(D)`` and
  above) are searched multiplied by a power of two (:func:`score_scale`),
  which changes no neighbour; their scores are scaled back in float64 and are
  Inf beyond the float32 range.
* **Ties.** Neighbours are ordered nearest first; items at equal scores by
  increasing gallery index. Results are exact and do not depend on the chunk
  sizes.
* **Non-finite embeddings** raise a ``ValueError`` that names the argument and
  the rows: a NaN would otherwise rank anywhere.
* **Query buckets.** JAX compiles every operation again for every new input
  shape (about a second and a half per new number of queries, on a CPU). With
  ``query_buckets`` each chunk of queries is padded with zero rows to
  :func:`query_bucket` rows (a power of two, at least :data:`MIN_BUCKET`, at
  most ``chunk_size``), so a service answering batches of varying sizes
  compiles a handful of shapes once, each as one program (``jax.jit``); the
  padding rows are dropped from the answers. :class:`Index` does this by
  default under JAX only: TensorFlow and PyTorch run these operations eagerly,
  without compiling (no ``tf.function``, no ``torch.compile``), so padding
  would only add work there.
"""

from __future__ import annotations

import math
import os
import warnings
import zipfile
from typing import NamedTuple

import keras
import numpy as np
from keras import ops

from tfdml import ops as dml
from tfdml._checks import check_int
from tfdml._files import atomic_path

__all__ = ["BACKENDS", "COPY_TOLERANCE", "METRICS", "MIN_BUCKET", "SELF_MATCH_SHARE", "Calibration",
           "Index", "Lookup", "calibrate", "match", "neighbours", "plot_calibration", "query_bucket",
           "score_scale"]

#: The metrics an :class:`Index` and :func:`neighbours` take (names of :data:`tfdml.ops.DISTANCES`).
METRICS = ("cosine", "dot", "l2")

#: The search backends of an :class:`Index`.
BACKENDS = ("keras", "faiss")

FAISS_INSTALL = ("Index(backend=\"faiss\") needs the faiss package: `pip install faiss-cpu` "
                 "(or faiss-gpu). The default backend (\"keras\") needs nothing else and gives "
                 "the same answers.")


def _import_faiss():
    try:
        import faiss
    except ImportError as err:
        raise ImportError(FAISS_INSTALL) from err
    return faiss


PLOT_INSTALL = ("plot_calibration needs matplotlib: `pip install matplotlib` (or, in a clone "
                "of tfdml, `pip install \".[plot]\"`).")


def _import_pyplot():
    try:
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise ImportError(PLOT_INSTALL) from err
    return plt


def _check_metric(metric):
    """``metric`` as one of :data:`METRICS` (``"euclidean"``: ``"l2"``, with a
    ``DeprecationWarning``); a ValueError naming it and the accepted values otherwise."""
    return dml.check_distance(metric, METRICS + tuple(dml.DEPRECATED_DISTANCES), "metric")


def _max_abs(x) -> float:
    """The largest absolute entry of a tensor or array (0 when it is empty)."""
    if int(np.prod(x.shape)) == 0:
        return 0.0
    return float(ops.convert_to_numpy(ops.max(ops.abs(x))))


def score_scale(max_abs: float, dim: int, metric: str) -> float:
    """The power of two that queries and gallery are multiplied by before a search.

    1 unless ``metric`` is ``"l2"`` or ``"dot"`` and an entry of size
    ``max_abs`` in ``dim`` dimensions could make a float32 score overflow
    (``4 * dim * max_abs^2``, a bound of the squared distances and dot
    products, beyond the float32 range); then the largest power of two that
    keeps it in range. A power of two scales every score exactly, so the
    neighbours are those of an exact-range computation (entries smaller than
    about ``1e-38`` of the largest one may underflow to 0).
    """
    if metric == "cosine" or not dim:
        return 1.0
    limit = math.sqrt(float(np.finfo(np.float32).max) / (4.0 * dim))
    if max_abs <= limit:
        return 1.0
    # max_abs < 2^top and 2^(bound - 1) <= limit: the scaled entries stay below limit.
    _, top = math.frexp(max_abs)
    _, bound = math.frexp(limit)
    return math.ldexp(1.0, bound - 1 - top)


def nonfinite_rows(embeddings) -> np.ndarray:
    """Indices (int64 NumPy array) of the rows of ``embeddings`` with a NaN or an Inf.

    ``embeddings`` is anything with a leading row axis (a NumPy array or a tensor);
    values are converted to float32 first, as the search computes in float32.
    """
    host = isinstance(embeddings, np.ndarray)  # a NumPy array is checked on the host
    x = embeddings if host else ops.convert_to_tensor(embeddings)
    dtype = keras.backend.standardize_dtype(x.dtype)
    if not dtype.startswith(("float", "bfloat")) or len(x.shape) == 0 or x.shape[0] == 0:
        return np.zeros(0, np.int64)
    if host:  # no device operation to compile for each new shape (JAX)
        with np.errstate(over="ignore"):
            x = x.astype(np.float32).reshape(len(x), -1)
        return np.flatnonzero(~np.isfinite(x).all(axis=1)).astype(np.int64)
    x = ops.cast(x, "float32")
    finite = ops.all(ops.isfinite(ops.reshape(x, (ops.shape(x)[0], -1))), axis=1)
    return np.flatnonzero(~ops.convert_to_numpy(finite)).astype(np.int64)


def at_indices(bad):
    """``"index 3"`` or ``"indices 3, 9, 17, ..."`` (at most five shown)."""
    if len(bad) == 1:
        return f"index {bad[0]}"
    return "indices " + ", ".join(str(i) for i in bad[:5]) + (", ..." if len(bad) > 5 else "")


def check_finite(embeddings, name):
    """Raises a ValueError naming ``name`` when a row of ``embeddings`` is not finite."""
    bad = nonfinite_rows(embeddings)
    if len(bad):
        rows = "row" if len(bad) == 1 else "rows"
        raise ValueError(
            f"`{name}` contains {len(bad)} non-finite {rows} (NaN or Inf) out of "
            f"{int(embeddings.shape[0])}; nearest neighbours of such rows, and any metric "
            "computed on them, would be meaningless (a diverged model gives such "
            "embeddings). Values beyond the float32 range count as Inf. Received: "
            f"{name} with non-finite {rows} at {at_indices(bad)}"
        )


def _scores(queries, gallery, metric):
    """``[n, m]`` scores, larger is nearer: dot products, or minus squared distances."""
    if metric == "l2":
        return -dml.pairwise_distance(queries, gallery, squared=True)
    return dml.pairwise_similarity(queries, gallery)


#: Gallery columns per group in the exact pre-selection of :func:`_block_candidates`.
GROUP = 16


def _preselects(width, keep):
    """Whether a block of ``width`` columns goes through the group pre-selection."""
    return width % GROUP == 0 and width >= 8 * GROUP * keep


def _block_candidates(scores, keep):
    """``(values, columns)``: a subset of each row of ``scores`` that holds its top ``keep``.

    A row of ``m`` scores is cut into groups of :data:`GROUP` consecutive columns.
    The ``keep`` groups with the largest maxima (equal maxima: the lower group)
    contain the row's top ``keep`` scores with ties to the lower column: a score
    outside them is beaten by each of those ``keep`` maxima, which are larger or
    equal and, when equal, in a group of lower columns. Their columns, in
    increasing order, are the candidates, so a top-k of them that puts the lower
    position first among equal values orders ties by column. A max per group and
    a top-k of ``m / GROUP`` maxima cost less than a top-k of all ``m`` scores,
    the more so the wider the block; narrow blocks (and a width that is not a
    multiple of ``GROUP``) pass whole, with ``columns`` None (the identity).
    """
    num, width = int(scores.shape[0]), int(scores.shape[1])
    if not _preselects(width, keep):
        return scores, None
    maxima = ops.max(ops.reshape(scores, (num, width // GROUP, GROUP)), axis=2)
    _, groups = dml.top_k(maxima, keep)
    groups = ops.sort(groups, axis=1)
    cols = ops.reshape(groups[:, :, None] * GROUP + ops.arange(GROUP, dtype="int32"),
                        (num, keep * GROUP))
    return dml.take_along_axis(scores, cols, axis=1), cols


def _merge_block(chunk, block, g_start, best_scores, best_idx, keep, metric):
    """The running top-``keep`` of a query chunk merged with gallery rows ``g_start...``.

    ``best_scores`` and ``best_idx`` are the kept ``[n, <=keep]`` scores and gallery
    indices (``None`` before the first block); returns the new ones. The block's
    whole groups of :data:`GROUP` rows and its remainder are scored separately, so
    that a wide block can be pre-selected (:func:`_block_candidates`). Positions
    in ``[kept; candidates]`` are mapped back to gallery indices after the top-k,
    so no index array of the block's size is built.
    """
    width = int(block.shape[0])
    split = width - width % GROUP
    if not _preselects(split, keep):
        split = width
    for lo, hi in ((0, split), (split, width)):
        if hi == lo:
            continue
        scores, cols = _block_candidates(_scores(chunk, block[lo:hi], metric), keep)
        kept = 0 if best_scores is None else int(best_scores.shape[1])
        if kept:
            scores = ops.concatenate([best_scores, scores], axis=1)
        values, pos = dml.top_k(scores, min(keep, int(scores.shape[1])))
        in_block = ops.maximum(pos - kept, 0)
        if cols is not None:
            in_block = dml.take_along_axis(cols, in_block, axis=1)
        idx = in_block + (g_start + lo)
        if kept:
            earlier = dml.take_along_axis(best_idx, ops.minimum(pos, kept - 1), axis=1)
            idx = ops.where(pos < kept, earlier, idx)
        best_scores, best_idx = values, idx
    return best_scores, best_idx


#: The fewest rows a padded chunk of queries has (see :func:`query_bucket`).
MIN_BUCKET = 16


def query_bucket(num: int, chunk_size: int) -> int:
    """The rows a chunk of ``num`` queries is padded to when searched with ``query_buckets``.

    The next power of two from ``num`` on, at least :data:`MIN_BUCKET` and at most
    ``chunk_size`` (a chunk holds at most ``chunk_size`` queries): with the default
    ``chunk_size`` of 1024, one of the 7 sizes 16, 32, ..., 1024. Padding costs at
    most twice the rows of the last chunk, and a backend that compiles each shape
    (JAX) compiles these few shapes once, whatever the numbers of queries.
    """
    return min(chunk_size, max(MIN_BUCKET, 1 << max(num - 1, 0).bit_length()))


_COMPILED = {}


def _compiled(name):
    """:func:`_merge_block` (``"merge"``) or :func:`tfdml.ops.l2_normalize` (``"normalize"``)
    as one ``jax.jit`` program: what a search with query buckets runs under JAX.

    Run operation by operation, JAX compiles each operation of a new shape on its own (some
    70 of them for a query chunk); here one program is compiled per shape. Elsewhere the
    plain functions (TensorFlow and PyTorch run them eagerly, compiling nothing).
    """
    if keras.backend.backend() != "jax":
        return _merge_block if name == "merge" else dml.l2_normalize
    if name not in _COMPILED:
        import jax

        # keep and metric are Python values that select the program; g_start is traced.
        _COMPILED[name] = (jax.jit(_merge_block, static_argnums=(5, 6)) if name == "merge"
                           else jax.jit(dml.l2_normalize))
    return _COMPILED[name]


def _padded(rows, size):
    """``rows`` (a ``[n, D]`` NumPy array) followed by zero rows up to ``size`` rows."""
    if len(rows) == size:
        return rows
    return np.concatenate([rows, np.zeros((size - len(rows),) + rows.shape[1:], rows.dtype)])


def neighbours(queries, gallery, k, metric="cosine", exclude_self=False, chunk_size=1024,
               gallery_chunk_size=65536, max_abs=None, query_buckets=False):
    """Yields ``(start, scores, indices)``: the ``k`` nearest gallery rows of each query chunk.

    ``queries`` and ``gallery`` are float32 tensors (or NumPy arrays), already L2-normalized for
    ``"cosine"`` (the caller normalizes once). For the query rows ``start :
    start + n``, ``indices`` is an ``[n, k]`` int64 NumPy array, nearest first, ties
    broken by the lower gallery index, and ``scores`` the matching ``[n, k]``
    float32 NumPy scores (similarities; for ``"l2"`` the Euclidean distances).
    The top-k is a running one over gallery chunks: merging the kept ``k`` (all of
    lower index) with a new chunk and taking a top-k that puts the lower position
    first among equal values keeps that order.

    With ``exclude_self`` (query ``i`` is gallery row ``i``) the search keeps
    ``k + 1`` candidates and then removes row ``i`` by its index, or the last
    candidate when row ``i`` is not among them. The query's own score plays no
    part, so no score (a tie, ``-inf``, NaN) can make a query its own neighbour;
    ``k`` must then be below the gallery size.

    For ``"l2"`` and ``"dot"``, rows whose scores could overflow float32 are
    searched multiplied by :func:`score_scale` (chunk by chunk), and the scores
    scaled back in float64 (Inf beyond the float32 range). ``max_abs``: the
    largest absolute entry of ``queries`` and ``gallery`` when the caller knows
    it (computed otherwise).

    With ``query_buckets``, each query chunk of ``n`` rows is copied to the host and
    padded with zero rows to :func:`query_bucket` rows before it is searched, and
    the padding rows' answers are dropped: every chunk then has one of a few shapes,
    so that a backend that compiles each new shape (JAX) does not compile again for
    each new number of queries; under JAX each merge of a chunk with a gallery block
    is then one compiled program (``jax.jit``). A query's neighbours do not depend on the other
    rows of its chunk; its scores are those of the same matrix product with more
    rows, equal up to float32 rounding (the product of a few rows may add in
    another order than that of many; exact where every product and sum is exact).
    """
    metric = _check_metric(metric)
    num_queries = int(queries.shape[0])
    num_gallery = int(gallery.shape[0])
    keep = k + 1 if exclude_self else k
    scale = 1.0
    merge = _compiled("merge") if query_buckets else _merge_block
    if metric != "cosine":
        if max_abs is None:
            max_abs = max(_max_abs(queries), _max_abs(gallery))
        scale = score_scale(max_abs, int(queries.shape[-1]), metric)
    for start in range(0, num_queries, chunk_size):
        chunk = queries[start : start + chunk_size]
        num = int(chunk.shape[0])
        if query_buckets:
            chunk = _padded(np.asarray(ops.convert_to_numpy(chunk), np.float32),
                            query_bucket(num, chunk_size))
        chunk = _scaled(chunk, scale)
        best_scores = best_idx = None
        for g_start in range(0, num_gallery, gallery_chunk_size):
            block = _scaled(gallery[g_start : g_start + gallery_chunk_size], scale)
            best_scores, best_idx = merge(chunk, block, g_start, best_scores, best_idx, keep,
                                          metric)
        # The padding rows (from row num on) are dropped here, before anything reads them.
        idx = ops.convert_to_numpy(best_idx)[:num].astype(np.int64)
        scores = ops.convert_to_numpy(best_scores)[:num].astype(np.float32)
        if exclude_self:
            is_self = idx == np.arange(start, start + len(idx))[:, None]
            # A stable sort moves the query's own index (if present) behind the others.
            order = np.argsort(is_self, axis=1, kind="stable")
            idx = np.take_along_axis(idx, order, axis=1)[:, :k]
            scores = np.take_along_axis(scores, order, axis=1)[:, :k]
        if metric == "l2":
            scores = np.sqrt(np.maximum(-scores, 0.0))
        if scale != 1.0:
            scores = _unscaled(scores, scale if metric == "l2" else scale * scale)
        yield start, scores, idx


def _scaled(x, scale):
    return x if scale == 1.0 else ops.convert_to_tensor(x, "float32") * scale


def _unscaled(scores, factor):
    """``scores / factor`` in float64, as float32 (Inf beyond its range)."""
    with np.errstate(over="ignore"):
        return (scores.astype(np.float64) / factor).astype(np.float32)


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


class Index:
    """An exact nearest-neighbour index over embeddings, with optional labels and ids.

    Add embeddings (as often as needed), then search: every query is compared
    with every stored embedding, in chunks, so answers are exact and memory is
    bounded by ``chunk_size x (gallery_chunk_size + k)`` scores. Ties go to the
    item added first.

    **Backends.** ``"keras"`` (default) is :func:`neighbours`, in ``keras.ops``
    on the Keras backend's device. ``"faiss"`` searches an exact faiss index
    (``IndexFlatIP`` for ``"cosine"`` and ``"dot"``, ``IndexFlatL2`` for
    ``"l2"``) when ``faiss-cpu`` (or ``faiss-gpu``) is installed, and puts
    equal scores in index order too (faiss does not), fetching more
    candidates until the ties at the ``k``-th place are complete: the same
    answers as the default backend (up to float32 rounding of the scores).
    A search whose ``"l2"`` or ``"dot"`` scores could overflow float32
    (:func:`score_scale`) runs on the default backend.

    **Query buckets.** Under JAX, which compiles each operation again for each
    new input shape, the queries (and added embeddings) are prepared and
    searched in chunks padded with zero rows to one of a few sizes
    (:func:`query_bucket`), each size compiled once as one program, so that
    batches of varying sizes do not compile again; the padding rows never
    reach an answer.

    Args:
        metric: ``"cosine"``, ``"dot"`` or ``"l2"``. Defaults to `"cosine"`.
        chunk_size: queries per matrix product. Defaults to `1024`.
        gallery_chunk_size: stored items per matrix product. Defaults to
            `65536`.
        backend: ``"keras"`` or ``"faiss"``. Defaults to `"keras"`.
        query_buckets: pad each chunk of queries to :func:`query_bucket`
            rows; ``None`` pads under the JAX backend only (TensorFlow and
            PyTorch do not compile these operations). Not saved by
            :meth:`save`. Defaults to `None`.

    Examples:

    >>> index = tfdml.search.Index()
    >>> index.add(model.predict(gallery_images), labels=gallery_labels, ids=file_names)
    >>> lookup = index.lookup(model.predict(query_images), k=5)
    >>> lookup.labels[:, 0]      # the nearest item's label for each query
    >>> index.save("gallery.npz")
    >>> index = tfdml.search.Index.load("gallery.npz")
    """

    def __init__(self, metric: str = "cosine", chunk_size: int = 1024,
                 gallery_chunk_size: int = 65536, backend: str = "keras",
                 query_buckets: bool | None = None):
        if backend not in BACKENDS:
            raise ValueError(f"`backend` must be one of {BACKENDS}. Received: backend={backend!r}")
        if query_buckets is None:
            query_buckets = keras.backend.backend() == "jax"
        if not isinstance(query_buckets, (bool, np.bool_)):
            raise ValueError("`query_buckets` must be True, False or None. "
                             f"Received: query_buckets={query_buckets!r}")
        self.query_buckets = bool(query_buckets)
        self.backend = backend
        self._faiss = None  # the faiss index, built on the first search after an add
        if backend == "faiss":
            _import_faiss()
        self.metric = _check_metric(metric)
        self.chunk_size = check_int("chunk_size", chunk_size)
        self.gallery_chunk_size = check_int("gallery_chunk_size", gallery_chunk_size)
        self._parts = []  # float32 NumPy blocks as added (normalized for "cosine")
        self._labels = None  # list of int64 blocks, or None
        self._ids = None  # list of blocks, or None
        self._gallery = None  # the concatenated backend tensor, rebuilt after an add
        self._max_abs = None  # the largest |entry| stored, for score_scale; reset by add
        self.dim = None

    def __len__(self):
        return sum(len(p) for p in self._parts)

    def __repr__(self):
        return (f"Index(metric={self.metric!r}, backend={self.backend!r}, size={len(self)}, "
                f"dim={self.dim}, "
                f"labels={self._labels is not None}, ids={self._ids is not None})")

    def _prepare(self, embeddings, name):
        """``[N, D]`` float32 NumPy rows, checked, L2-normalized for ``"cosine"``.

        Everything but the normalization runs on the host, where a new number of rows
        compiles nothing (under JAX, even moving an array of a new shape to the device
        compiles).
        """
        if ops.is_tensor(embeddings):
            x = np.asarray(ops.convert_to_numpy(dml.check_embeddings(embeddings, name)))
        else:
            x = np.asarray(embeddings)
            if x.ndim != 2:
                raise ValueError(f"`{name}` must be a rank-2 tensor of shape [B, D]. "
                                 f"Received: {name}.shape={tuple(x.shape)}")
            dtype = keras.backend.standardize_dtype(x.dtype)
            if not dtype.startswith(("float", "bfloat")):
                raise ValueError(f"`{name}` must have a floating dtype. Received: "
                                 f"{name}.dtype={dtype}")
        if self.dim is not None and x.shape[-1] != self.dim:
            raise ValueError(f"`{name}` must have {self.dim} columns, the size of the index's "
                             f"embeddings. Received: {name}.shape={tuple(x.shape)}")
        # float32 as ops.cast rounds (to nearest; Inf beyond the range: check_finite says so).
        with np.errstate(over="ignore"):
            x = x.astype(np.float32)
        check_finite(x, name)
        if self.metric != "cosine" or not len(x):
            return x
        if not self.query_buckets:
            return np.asarray(ops.convert_to_numpy(dml.l2_normalize(x)), np.float32)
        normalize = _compiled("normalize")
        out = np.empty_like(x)  # row by row the same formula, in chunks of a few shapes
        for start in range(0, len(x), self.chunk_size):
            rows = x[start : start + self.chunk_size]
            padded = _padded(rows, query_bucket(len(rows), self.chunk_size))
            out[start : start + len(rows)] = ops.convert_to_numpy(normalize(padded))[: len(rows)]
        return out

    def add(self, embeddings, labels=None, ids=None):
        """Appends embeddings ``[N, D]``, with their labels ``[N]`` and ids ``[N]``.

        Labels (integer class ids) and ids (any integers or strings, e.g. file
        names) are optional, but once the index has them every ``add`` must
        give them, and the other way round.

        Raises:
            ValueError: for a row with a NaN or an Inf, another embedding size,
                lengths that differ, or labels/ids given for some adds only.
        """
        x = self._prepare(embeddings, "embeddings")
        n = int(x.shape[0])
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
        for name, given, stored in (("labels", labels, self._labels), ("ids", ids, self._ids)):
            if self._parts and (given is None) != (stored is None):
                state = "has" if stored is not None else "has no"
                raise ValueError(f"The index {state} {name}: give `{name}` to every add or "
                                 "to none.")
        self._parts.append(x)
        if labels is not None:
            self._labels = (self._labels or []) + [labels]
        if ids is not None:
            self._ids = (self._ids or []) + [ids]
        self.dim = int(x.shape[-1])
        self._gallery = None
        self._faiss = None
        self._max_abs = None

    @property
    def embeddings(self) -> np.ndarray:
        """The stored ``[N, D]`` float32 embeddings (L2-normalized for ``"cosine"``)."""
        if not self._parts:
            return np.zeros((0, self.dim or 0), np.float32)
        return np.concatenate(self._parts)

    @property
    def labels(self) -> np.ndarray | None:
        """The stored ``[N]`` labels, or None."""
        return None if self._labels is None else np.concatenate(self._labels)

    @property
    def ids(self) -> np.ndarray | None:
        """The stored ``[N]`` ids, or None."""
        return None if self._ids is None else np.concatenate(self._ids)

    def search(self, queries, k: int = 1):
        """The ``k`` nearest stored items of each query, exactly.

        Args:
            queries: ``[Q, D]`` embeddings.
            k: neighbours per query, at most ``len(index)``. Defaults to `1`.

        Returns:
            ``(scores, indices)``: ``[Q, k]`` float32 scores (similarities for
            ``"cosine"`` and ``"dot"``, Euclidean distances for ``"l2"``) and
            int64 positions in the index, nearest first, ties by position.

        Raises:
            ValueError: for an empty index, a bad ``k``, or a query row with a
                NaN or an Inf.
        """
        if not self._parts:
            raise ValueError("The index is empty: `add` embeddings before searching.")
        k = check_int("k", k)
        if k > len(self):
            raise ValueError(f"`k` must be at most the size of the index ({len(self)}). "
                             f"Received: k={k}")
        # On the host: neighbours() moves one chunk at a time to the device.
        q = self._prepare(queries, "queries")
        if len(q) == 0:  # no query: no neighbour
            return np.zeros((0, k), np.float32), np.zeros((0, k), np.int64)
        if self._max_abs is None:
            self._max_abs = max(float(np.abs(p).max(initial=0.0)) for p in self._parts)
        max_abs = max(self._max_abs, float(np.abs(q).max(initial=0.0)))
        # faiss scores in float32 as given: rows that need scaling take the keras path.
        if self.backend == "faiss" and score_scale(max_abs, self.dim, self.metric) == 1.0:
            return self._faiss_search(q, k)
        if self._gallery is None:
            self._gallery = ops.convert_to_tensor(self.embeddings)
        num = int(q.shape[0])
        scores = np.zeros((num, k), np.float32)
        indices = np.zeros((num, k), np.int64)
        for start, s, idx in neighbours(q, self._gallery, k, self.metric, False,
                                        self.chunk_size, self.gallery_chunk_size, max_abs,
                                        self.query_buckets):
            scores[start:start + len(idx)] = s
            indices[start:start + len(idx)] = idx
        return scores, indices

    def _faiss_search(self, queries, k):
        """faiss's exact search, re-sorted so that equal scores come in index order."""
        faiss = _import_faiss()
        if self._faiss is None:
            self._faiss = (faiss.IndexFlatL2 if self.metric == "l2" else faiss.IndexFlatIP)(
                self.dim)
            self._faiss.add(self.embeddings)
        size = len(self)
        fetch = min(size, k + 8)
        while True:
            scores, indices = self._faiss.search(queries, fetch)
            key = scores if self.metric == "l2" else -scores  # smaller is nearer
            order = np.lexsort((indices, key), axis=-1)
            key = np.take_along_axis(key, order, axis=1)
            # Ties at the k-th place may continue past the fetched candidates: fetch more.
            if fetch == size or not np.any(key[:, k - 1] == key[:, fetch - 1]):
                break
            fetch = min(size, 2 * fetch)
        order = order[:, :k]
        scores = np.take_along_axis(scores, order, axis=1).astype(np.float32)
        if self.metric == "l2":
            scores = np.sqrt(np.maximum(scores, 0.0))
        return scores, np.take_along_axis(indices, order, axis=1).astype(np.int64)

    def lookup(self, queries, k: int = 1) -> Lookup:
        """:meth:`search` with the neighbours' labels and ids (see :class:`Lookup`)."""
        scores, indices = self.search(queries, k)
        labels, ids = self.labels, self.ids
        return Lookup(scores, indices, None if labels is None else labels[indices],
                      None if ids is None else ids[indices])

    def match(self, queries, threshold, unknown=-1):
        """The label of each query's nearest item when it is near enough, else ``unknown``.

        Near enough: a similarity ``>= threshold`` (``"cosine"``, ``"dot"``) or a
        distance ``<= threshold`` (``"l2"``); :func:`calibrate` picks a threshold
        for a target precision.

        Args:
            queries: ``[Q, D]`` embeddings.
            threshold: the score a match must reach.
            unknown: the label of a query without a match. Defaults to `-1`.

        Returns:
            ``[Q]`` int64 labels.

        Raises:
            ValueError: when the index has no labels, or for a ``threshold``
                that is not a finite number.
        """
        if not dml.is_number(threshold) or not np.isfinite(threshold):
            raise ValueError(f"`threshold` must be a finite number. Received: threshold={threshold!r}")
        if self._labels is None:
            raise ValueError("`match` needs labels: `add` the embeddings with `labels=`.")
        found = self.lookup(queries, 1)
        return np.where(_accepts(found.scores[:, 0], threshold, self.metric),
                        found.labels[:, 0], np.int64(unknown))

    def save(self, path):
        """Writes the index to one ``.npz`` file (no pickled objects)."""
        arrays = {
            "metric": np.array(self.metric),
            "chunk_sizes": np.array([self.chunk_size, self.gallery_chunk_size], np.int64),
            "backend": np.array(self.backend),
            "embeddings": self.embeddings,
        }
        if self._labels is not None:
            arrays["labels"] = self.labels
        if self._ids is not None:
            arrays["ids"] = self.ids
        # Whole or not at all: a temporary file beside it, renamed over it once written.
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            np.savez(f, **arrays)  # a file object: np.savez would append ".npz" to a name

    @classmethod
    def load(cls, path, backend=None) -> Index:
        """An index saved with :meth:`save` (with its backend, unless ``backend`` is given).

        Raises:
            ValueError: naming the file and the field, for a file that is not a
                complete index: unreadable or truncated, a missing field, or a
                field that does not hold what :meth:`save` writes (2-D finite
                float32 embeddings, unit rows for ``"cosine"``, one integer
                label and one id per row).
        """
        path = os.fspath(path)
        try:
            with np.load(path, allow_pickle=False) as data:
                fields = {name: data[name] for name in data.files}
        except FileNotFoundError:
            raise
        except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as err:
            raise ValueError(f"{path}: not a readable index file ({type(err).__name__}: "
                             f"{err})") from err
        return cls._from_fields(fields, path, backend)

    @classmethod
    def _from_fields(cls, fields, path, backend):
        def bad(name, why):
            return ValueError(f"{path}: field `{name}` {why}.")

        for name in ("metric", "chunk_sizes", "embeddings"):
            if name not in fields:
                raise bad(name, "is missing")
        metric = str(fields["metric"])
        if metric not in METRICS:
            raise bad("metric", f"must be one of {METRICS}, not {metric!r}")
        sizes = fields["chunk_sizes"]
        if sizes.shape != (2,) or sizes.dtype.kind not in "iu" or (sizes < 1).any():
            raise bad("chunk_sizes", f"must be two positive integers, not {sizes!r}")
        if backend is None:
            backend = str(fields["backend"]) if "backend" in fields else "keras"
        index = cls(metric, int(sizes[0]), int(sizes[1]), backend)
        embeddings = fields["embeddings"]
        if embeddings.ndim != 2 or embeddings.dtype.kind != "f":
            raise bad("embeddings", f"must be a 2-D float array, not {embeddings.dtype} of "
                                    f"shape {embeddings.shape}")
        bad_rows = nonfinite_rows(embeddings)
        if len(bad_rows):
            raise bad("embeddings", f"holds NaN or Inf at {at_indices(bad_rows)}")
        if metric == "cosine" and len(embeddings):
            norms = np.linalg.norm(embeddings.astype(np.float64), axis=1)
            off = np.flatnonzero((np.abs(norms - 1.0) > 1e-3) & (norms > 0))
            if len(off):
                raise bad("embeddings", "must hold unit rows in a cosine index; rows "
                                        f"{off[:5].tolist()} have norms {norms[off[:5]].tolist()}")
        n = len(embeddings)
        for name, kinds in (("labels", "iu"), ("ids", "iuU")):
            if name in fields and (fields[name].ndim != 1 or len(fields[name]) != n
                                   or fields[name].dtype.kind not in kinds):
                what = "integers" if name == "labels" else "integers or strings"
                raise bad(name, f"must hold {n} {what} (one per row), not {fields[name].dtype} "
                                f"of shape {fields[name].shape}")
        index.dim = int(embeddings.shape[1]) if embeddings.shape[1] else None
        if n:
            index._parts = [embeddings.astype(np.float32)]
            index._labels = [fields["labels"].astype(np.int64)] if "labels" in fields else None
            index._ids = [fields["ids"]] if "ids" in fields else None
        return index


# -- calibration -------------------------------------------------------------------------------


def _accepts(scores, threshold, metric):
    return scores <= threshold if metric == "l2" else scores >= threshold


class Calibration(NamedTuple):
    """The answer of :func:`calibrate`.

    Attributes:
        threshold: the score a match must reach (a similarity for ``"cosine"``
            and ``"dot"``, a distance for ``"l2"``).
        precision: the share of correct labels among the calibration queries
            it accepts.
        recall: the share of the queries whose nearest item has their label
            that it accepts.
        reached: whether ``precision >= target_precision``.
        thresholds, precisions, recalls: the curve, one point per distinct
            score of the nearest items, from the strictest threshold to the
            loosest (for :func:`plot_calibration`).
    """

    threshold: float
    precision: float
    recall: float
    reached: bool
    thresholds: np.ndarray
    precisions: np.ndarray
    recalls: np.ndarray


#: :func:`calibrate` warns when at least this share of its queries are copies of their
#: nearest item in the index.
SELF_MATCH_SHARE = 0.1

#: The relative distance below which :func:`calibrate` counts a nearest item as a copy
#: of its query: ``|q - g| <= COPY_TOLERANCE * max(|q|, |g|)``.
COPY_TOLERANCE = 1e-5


def _stored_rows(index, positions):
    """The stored embeddings at ``positions``, gathered from the added blocks one by one
    (no copy of the whole index)."""
    rows = np.zeros((len(positions), index.dim), np.float32)
    end = 0
    for part in index._parts:
        begin, end = end, end + len(part)
        here = (positions >= begin) & (positions < end)
        rows[here] = part[positions[here] - begin]
    return rows


def _copies(index, queries, nearest):
    """Whether each query (prepared as the index stores it) is a copy of its nearest item."""
    q = index._prepare(queries, "queries").astype(np.float64)
    g = _stored_rows(index, nearest).astype(np.float64)
    size = np.maximum(np.linalg.norm(q, axis=1), np.linalg.norm(g, axis=1))
    return np.linalg.norm(q - g, axis=1) <= COPY_TOLERANCE * size


def calibrate(index: Index, queries, labels, target_precision: float = 0.99) -> Calibration:
    """The loosest match threshold whose precision on labelled queries reaches a target.

    Each query is matched to its nearest item in ``index``; the match is
    *correct* when that item has the query's label. A threshold accepts the
    matches whose score reaches it. Over all thresholds (one per distinct
    nearest score), the one returned is the loosest, hence the highest recall,
    whose precision (correct among accepted) is at least ``target_precision``.
    Recall is the share of the correct matches that are accepted. Calibrate on
    queries that are not in the index (a query finds itself at distance 0).

    A query counts as a *copy* of its nearest item when their embeddings, as the
    index stores them (float32, L2-normalized for ``"cosine"``), are within a
    relative distance of :data:`COPY_TOLERANCE`: ``|q - g| <= 1e-5 max(|q|, |g|)``
    (an exact copy, or the same input embedded again). When at least
    :data:`SELF_MATCH_SHARE` (10 %) of the queries are copies, a ``UserWarning``
    says so: those queries match themselves at the best possible score, with their
    own label, and the threshold fitted to them will not hold for new queries. A
    few duplicates in held-out data stay below that share.

    When no threshold reaches the target, the most precise one is returned
    (ties: the loosest) with ``reached=False``.

    Args:
        index: an :class:`Index` with labels.
        queries: ``[Q, D]`` embeddings.
        labels: ``[Q]`` their labels.
        target_precision: in ``(0, 1]``. Defaults to `0.99`.

    Returns:
        A :class:`Calibration`.

    Raises:
        ValueError: for an index without labels, a bad target, no query, or
            queries and labels of different lengths.

    Warns:
        UserWarning: when at least :data:`SELF_MATCH_SHARE` of the queries are
            copies of their nearest item in the index.

    Examples:

    >>> calibration = tfdml.search.calibrate(index, val_embeddings, val_labels, 0.99)
    >>> index.match(new_embeddings, calibration.threshold)   # label, or -1 (unknown)
    """
    if not dml.is_number(target_precision) or not 0 < target_precision <= 1:
        raise ValueError("`target_precision` must be a number in (0, 1]. "
                         f"Received: target_precision={target_precision!r}")
    if index.labels is None:
        raise ValueError("`calibrate` needs an index with labels.")
    labels = ops.convert_to_numpy(dml.cast_labels(labels, "labels")).astype(np.int64)
    found = index.lookup(queries, 1)
    if len(labels) != len(found.indices):
        raise ValueError(f"`labels` must have one entry per query ({len(found.indices)}). "
                         f"Received: {len(labels)}")
    if not len(labels):
        raise ValueError("`calibrate` needs at least one query: a precision of no match is "
                         "undefined. Received: 0 queries")
    copies = int(_copies(index, queries, found.indices[:, 0]).sum())
    if copies >= SELF_MATCH_SHARE * len(labels):
        warnings.warn(
            f"{copies} of the {len(labels)} calibration queries ({copies / len(labels):.0%}) "
            "are copies of their nearest item in the index (the same embedding, at "
            "distance 0), most likely because they were added to the index: each then "
            "matches itself at the best possible score, and a threshold fitted to such "
            "matches does not hold for new queries. Calibrate on held-out queries that "
            "are not in the index (a validation split), or remove the copies from "
            "`queries`.",
            UserWarning, stacklevel=2)
    scores = found.scores[:, 0].astype(np.float64)
    correct = found.labels[:, 0] == labels
    # Strictest first: the best scores first (smallest distances for "l2").
    order = np.argsort(scores if index.metric == "l2" else -scores, kind="stable")
    scores, correct = scores[order], correct[order]
    accepted = np.arange(1, len(scores) + 1)
    hits = np.cumsum(correct)
    last = np.r_[scores[1:] != scores[:-1], True]  # a threshold accepts all equal scores
    thresholds, accepted, hits = scores[last], accepted[last], hits[last]
    precisions = hits / accepted
    recalls = hits / max(int(correct.sum()), 1)
    ok = precisions >= target_precision
    if ok.any():
        best = int(np.flatnonzero(ok)[-1])
    else:
        best = int(np.flatnonzero(precisions == precisions.max())[-1])
    return Calibration(float(thresholds[best]), float(precisions[best]), float(recalls[best]),
                       bool(ok.any()), thresholds, precisions, recalls)


def match(index: Index, queries, threshold, unknown=-1):
    """:meth:`Index.match`: the nearest item's label within ``threshold``, else ``unknown``."""
    return index.match(queries, threshold, unknown)


def plot_calibration(calibration: Calibration, ax=None, target_precision=None):
    """Precision and recall against the threshold, the chosen threshold marked.

    Args:
        calibration: from :func:`calibrate`.
        ax: a matplotlib axis. Defaults to `None` (a new figure).
        target_precision: drawn as a horizontal line when given.

    Returns:
        The matplotlib axis.

    Raises:
        ImportError: without matplotlib, naming the command that installs it.
    """
    plt = _import_pyplot()

    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(calibration.thresholds, calibration.precisions, label="precision")
    ax.plot(calibration.thresholds, calibration.recalls, label="recall")
    ax.axvline(calibration.threshold, color="gray", linestyle="--",
               label=f"threshold {calibration.threshold:.3g}")
    if target_precision is not None:
        ax.axhline(target_precision, color="gray", linestyle=":", label="target precision")
    ax.set_xlabel("threshold")
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=7)
    return ax
