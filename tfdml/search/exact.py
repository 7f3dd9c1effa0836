"""Exact nearest-neighbour search: the one implementation in tfdml.

See :mod:`tfdml.search` for the conventions (metrics, huge embeddings, ties, non-finite rows,
query buckets).
"""

from __future__ import annotations

import math

import keras
import numpy as np
from keras import ops

from tfdml import ops as dml
from tfdml._argument_checks import at_indices

#: The metrics an :class:`Index` and :func:`neighbours` take (names of :data:`tfdml.ops.DISTANCES`).
METRICS = ("cosine", "dot", "l2")


def check_metric(metric):
    """``metric`` as one of :data:`METRICS`; a ValueError naming it and the accepted values
    otherwise."""
    return dml.check_distance(metric, METRICS, "metric")


def largest_abs(x) -> float:
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


def check_finite(embeddings, name):
    """Raises a ValueError naming ``name`` when a row of ``embeddings`` is not finite."""
    if isinstance(embeddings, np.ndarray) and embeddings.dtype == np.float32 and np.isfinite(
            embeddings).all():
        return
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


def block_scores(queries, gallery, metric):
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
        scores, cols = _block_candidates(block_scores(chunk, block[lo:hi], metric), keep)
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


_PROGRAMS = {}


def compiled(name):
    """:func:`_merge_block` (``"merge"``) or :func:`tfdml.ops.l2_normalize` (``"normalize"``)
    as one ``jax.jit`` program: what a search with query buckets runs under JAX.

    Run operation by operation, JAX compiles each operation of a new shape on its own (some
    70 of them for a query chunk); here one program is compiled per shape. Elsewhere the
    plain functions (TensorFlow and PyTorch run them eagerly, compiling nothing).
    """
    if keras.backend.backend() != "jax":
        return _merge_block if name == "merge" else dml.l2_normalize
    if name not in _PROGRAMS:
        import jax

        # keep and metric are Python values that select the program; g_start is traced.
        _PROGRAMS[name] = (jax.jit(_merge_block, static_argnums=(5, 6)) if name == "merge"
                           else jax.jit(dml.l2_normalize))
    return _PROGRAMS[name]


def padded(rows, size):
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
    metric = check_metric(metric)
    num_queries = int(queries.shape[0])
    num_gallery = int(gallery.shape[0])
    keep = k + 1 if exclude_self else k
    scale = 1.0
    merge = compiled("merge") if query_buckets else _merge_block
    if metric != "cosine":
        if max_abs is None:
            max_abs = max(largest_abs(queries), largest_abs(gallery))
        scale = score_scale(max_abs, int(queries.shape[-1]), metric)
    for start in range(0, num_queries, chunk_size):
        chunk = queries[start : start + chunk_size]
        num = int(chunk.shape[0])
        if query_buckets:
            chunk = padded(np.asarray(ops.convert_to_numpy(chunk), np.float32),
                           query_bucket(num, chunk_size))
        chunk = scaled(chunk, scale)
        best_scores = best_idx = None
        for g_start in range(0, num_gallery, gallery_chunk_size):
            block = scaled(gallery[g_start : g_start + gallery_chunk_size], scale)
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


def scaled(x, scale):
    return x if scale == 1.0 else ops.convert_to_tensor(x, "float32") * scale


def _unscaled(scores, factor):
    """``scores / factor`` in float64, as float32 (Inf beyond its range)."""
    with np.errstate(over="ignore"):
        return (scores.astype(np.float64) / factor).astype(np.float32)
