"""Retrieval metrics: Recall@K, Precision@K, MAP@K, MAP@R, R-precision, CMC, VehicleID.

The conventions (metric, self-exclusion, groups, non-finite rows, ties, unmatched
queries) are those of :mod:`tfdml.metrics`.
"""

from __future__ import annotations

import logging
import textwrap
import warnings
from typing import NamedTuple

import numpy as np
from keras import ops

from tfdml import ops as dml
from tfdml._checks import check_choice, check_int
from tfdml._docs import fill_doc
from tfdml.search import Index, neighbour_recall, neighbours
from tfdml.search import at_indices as _at_indices
from tfdml.search import check_finite as _check_finite
from tfdml.search.index import _host_normalize

#: The values of ``metric`` (names of :data:`tfdml.ops.DISTANCES`).
METRICS = ("cosine", "l2")
UNMATCHED = ("exclude", "miss")

# -- docstring text shared by the metrics --------------------------------------------------------

_QUERIES = """\
embeddings: ``[Q, D]`` query embeddings.
labels: ``[Q]`` integer class ids."""

_GALLERY = """\
gallery_embeddings: ``[G, D]`` gallery embeddings. Defaults to `None`
    (the queries themselves, self excluded).
gallery_labels: ``[G]`` class ids of the gallery. Defaults to `None`."""

_SEARCH = """\
metric: ``"cosine"`` or ``"l2"``. Defaults to `"cosine"`.
chunk_size: queries per matrix product. Defaults to `1024`.
gallery_chunk_size: gallery items per matrix product. Defaults to `65536`."""

_GROUPS = """\
groups: ``[Q]`` integer group ids of the queries (1-D; floats are refused).
    A gallery item of a query's group is left out of that query's ranking:
    neither a hit nor a miss, and not counted in ``R``. Without a gallery it
    gives the group of every item (the query's own group holds the query).
    Defaults to `None` (no exclusion but the query itself).
gallery_groups: ``[G]`` integer group ids of a separate gallery, required
    with ``groups`` and ``gallery_embeddings``. Defaults to `None`.
index: an approximate search instead of the exact one: a faiss index
    factory string (``"HNSW32"``, ``"IVF4096,Flat"``...) or an empty
    ``tfdml.search.Index(approximate=...)`` whose configuration is used (it
    stays empty), built over the gallery. Its
    recall of the exact neighbours on up to 1,000 sampled queries is logged
    (logger ``"tfdml"``), with a ``UserWarning`` below 0.9. Defaults to
    `None` (exact)."""


def _nonfinite_raises(*names):
    """The ``Raises`` entry of a metric that refuses non-finite rows of ``names``."""
    rows = " or ".join(f"``{name}``" for name in names)
    return textwrap.fill(f"ValueError: bad arguments, or a row of {rows} that holds a NaN or an "
                         "Inf (the message names the argument and the rows).", width=70,
                         subsequent_indent="    ")


_RETRIEVAL_DOCS = {"QUERIES": _QUERIES, "GALLERY": _GALLERY, "SEARCH": _SEARCH,
                   "GROUPS": _GROUPS,
                   "RAISES": _nonfinite_raises("embeddings", "gallery_embeddings")}


# -- validation ---------------------------------------------------------------------------------


def _check_ks(ks, gallery_size, name="ks"):
    if isinstance(ks, (int, np.integer)) and not isinstance(ks, bool):
        ks = (ks,)
    try:
        ks = tuple(ks)
    except TypeError:
        raise ValueError(
            f"`{name}` must be a non-empty sequence of integers >= 1. Received: {name}={ks!r}"
        ) from None
    if not ks or any(
        not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1 for k in ks
    ):
        raise ValueError(
            f"`{name}` must be a non-empty sequence of integers >= 1. Received: {name}={ks!r}"
        )
    if max(ks) > gallery_size:
        raise ValueError(
            f"`{name}` asks for {max(ks)} neighbours but the gallery offers {gallery_size} "
            f"per query. Received: {name}={ks!r}"
        )
    return tuple(int(k) for k in ks)


def _check_finite_labeling(values, name):
    """Raises a ValueError naming ``name`` when a float labeling holds a NaN or an Inf."""
    values = np.asarray(values)
    if np.issubdtype(values.dtype, np.floating):
        bad = np.flatnonzero(~np.isfinite(values.reshape(-1)))
        if len(bad):
            what = "value" if len(bad) == 1 else "values"
            raise ValueError(
                f"`{name}` contains {len(bad)} non-finite {what} (NaN or Inf); it must hold "
                f"integer ids. Received: {name} with non-finite {what} at {_at_indices(bad)}"
            )


def check_metric(metric):
    """``metric`` as one of :data:`METRICS` (``"euclidean"``: ``"l2"``, with a
    ``DeprecationWarning``); a ValueError naming it and the accepted values otherwise."""
    return dml.check_distance(metric, METRICS + tuple(dml.DEPRECATED_DISTANCES), "metric")


def _group_ids(values, name, rows, rows_name):
    """``values`` as a 1-D int64 NumPy array of ``rows`` group ids; a ValueError naming it
    otherwise (floats, even whole ones, are refused: a group id is an integer)."""
    if not isinstance(values, np.ndarray) and hasattr(values, "shape"):
        values = ops.convert_to_numpy(values)  # a tensor
    values = np.asarray(values)
    _check_finite_labeling(values, name)
    if values.ndim != 1:
        raise ValueError(f"`{name}` must be a 1-D array of integer group ids. "
                         f"Received: {name}.shape={values.shape}")
    if values.dtype == bool or not np.issubdtype(values.dtype, np.integer):
        raise ValueError(f"`{name}` must hold integer group ids. "
                         f"Received: {name}.dtype={values.dtype}")
    if len(values) != rows:
        raise ValueError(f"`{name}` must have one group id per row of `{rows_name}` ({rows}). "
                         f"Received: {name}.shape={values.shape}")
    return values.astype(np.int64)


def _check_groups(groups, gallery_groups, exclude_self, num_queries, num_gallery, emb_name):
    """The query and gallery group arrays (the same array without a gallery), or Nones."""
    if groups is None:
        if gallery_groups is not None:
            raise ValueError("`gallery_groups` was given without `groups`. "
                             f"Received: gallery_groups with shape {np.shape(gallery_groups)}")
        return None, None
    groups = _group_ids(groups, "groups", num_queries, emb_name)
    if exclude_self:
        if gallery_groups is not None:
            raise ValueError(
                "`gallery_groups` was given without `gallery_embeddings`; without a gallery "
                "`groups` gives the group of every item. "
                f"Received: gallery_groups with shape {np.shape(gallery_groups)}")
        return groups, groups
    if gallery_groups is None:
        raise ValueError("`groups` was given with `gallery_embeddings` but without "
                         "`gallery_groups`. Received: gallery_groups=None")
    return groups, _group_ids(gallery_groups, "gallery_groups", num_gallery, "gallery_embeddings")


class _Retrieval(NamedTuple):
    """What :func:`_prepare` returns: the search inputs and the NumPy labels and groups."""

    queries: object  # float32 tensor, L2-normalized for "cosine"
    gallery: object  # the queries themselves without a gallery
    labels: np.ndarray  # int64 [Q]
    gallery_labels: np.ndarray  # int64 [G]
    exclude_self: bool
    metric: str
    groups: np.ndarray | None  # int64 [Q], or None
    gallery_groups: np.ndarray | None  # int64 [G] (``groups`` without a gallery), or None
    index: object = None  # an approximate index (factory string or empty Index), or None
    report: dict | None = None  # what the approximate search reports (``index_recall``)


def _prepare(embeddings, labels, gallery_embeddings, gallery_labels, metric, chunk_size,
             gallery_chunk_size, unmatched, names=("embeddings", "labels"), groups=None,
             gallery_groups=None, index=None):
    """Validates the inputs; returns a :class:`_Retrieval` (float32 queries/gallery, int64
    labels and groups, exclude_self, the metric of :func:`check_metric`). With ``index``
    (an approximate search, on the host) the embeddings are NumPy arrays: no device copy."""
    data = _prepare_tensors(embeddings, labels, gallery_embeddings, gallery_labels, metric,
                            chunk_size, gallery_chunk_size, unmatched, names, groups,
                            gallery_groups, index)
    if index is None:
        return data
    return data._replace(index=_check_index(index, data.metric), report={})


def _prepare_tensors(embeddings, labels, gallery_embeddings, gallery_labels, metric, chunk_size,
                     gallery_chunk_size, unmatched, names, groups, gallery_groups, index):
    metric = check_metric(metric)
    check_choice("unmatched", unmatched, UNMATCHED)
    check_int("chunk_size", chunk_size)
    check_int("gallery_chunk_size", gallery_chunk_size)
    emb_name, lab_name = names
    labels = dml.cast_labels(labels, lab_name)
    queries = _embeddings(embeddings, emb_name, index)
    dml.check_batch_sizes(labels, queries, lab_name, emb_name)
    if queries.shape[0] == 0:
        raise ValueError(f"`{emb_name}` is empty. Received: {emb_name}.shape={queries.shape}")
    _check_finite(queries, emb_name)
    exclude_self = gallery_embeddings is None
    if exclude_self:
        if gallery_labels is not None:
            raise ValueError(
                "`gallery_labels` was given without `gallery_embeddings`. "
                f"Received: gallery_labels with shape {np.shape(gallery_labels)}"
            )
        gallery, gallery_labels = queries, labels
    else:
        if gallery_labels is None:
            raise ValueError(
                "`gallery_embeddings` was given without `gallery_labels`. "
                "Received: gallery_labels=None"
            )
        gallery = _embeddings(gallery_embeddings, "gallery_embeddings", index)
        gallery_labels = dml.cast_labels(gallery_labels, "gallery_labels")
        dml.check_batch_sizes(gallery_labels, gallery, "gallery_labels", "gallery_embeddings")
        if gallery.shape[-1] != queries.shape[-1]:
            raise ValueError(
                f"`gallery_embeddings` and `{emb_name}` must have the same embedding size. "
                f"Received: gallery_embeddings.shape={gallery.shape}, "
                f"{emb_name}.shape={queries.shape}"
            )
        _check_finite(gallery, "gallery_embeddings")
    groups, gallery_groups = _check_groups(groups, gallery_groups, exclude_self,
                                           int(queries.shape[0]), int(gallery.shape[0]),
                                           emb_name)
    if metric == "cosine":
        normalize = dml.l2_normalize if index is None else _host_normalize
        queries = normalize(queries)
        gallery = queries if exclude_self else normalize(gallery)
    return _Retrieval(queries, gallery, ops.convert_to_numpy(labels).astype(np.int64),
                      ops.convert_to_numpy(gallery_labels).astype(np.int64), exclude_self,
                      metric, groups, gallery_groups)


def _embeddings(values, name, index):
    """``values`` checked, as float32: a tensor, or with ``index`` a NumPy array (no copy of
    a float32 array)."""
    if index is None:
        return ops.cast(dml.check_embeddings(values, name), "float32")
    if ops.is_tensor(values) and not isinstance(values, np.ndarray):
        values = ops.convert_to_numpy(dml.check_embeddings(values, name))
    values = np.asarray(values)
    if values.ndim != 2 or values.dtype.kind not in "fiu":
        raise ValueError(f"`{name}` must be a rank-2 float array of shape [B, D]. Received: "
                         f"{name} of dtype {values.dtype} and shape {values.shape}")
    with np.errstate(over="ignore"):
        return values.astype(np.float32, copy=False)


# -- nearest neighbours: tfdml.search, exact or approximate ----------------------------------------

#: Queries whose exact neighbours are computed to measure an approximate index's recall.
INDEX_SAMPLE = 1000

#: Below this recall of the exact neighbours, a metric through an approximate index warns.
INDEX_RECALL_WARNING = 0.9


def _check_index(index, metric):
    """``index``: a faiss factory string, or an empty approximate ``tfdml.search.Index`` of
    the metric (its configuration is used); a ValueError naming ``index`` otherwise."""
    if isinstance(index, str):
        return index
    if isinstance(index, Index) and index.approximate is not None and not len(index):
        if index.metric != metric:
            raise ValueError(f"`index` measures {index.metric!r}, the metric {metric!r}. "
                             f"Received: {index!r}")
        return index
    raise ValueError("`index` must be a faiss index factory string (\"HNSW32\", "
                     "\"IVF4096,Flat\"...) or an empty tfdml.search.Index(approximate=...). "
                     f"Received: index={index!r}")


def _approximate_neighbours(queries, gallery, k, metric, chunk_size, gallery_chunk_size, index,
                            report):
    """Yields ``(start, None, indices)`` as :func:`tfdml.search.neighbours`, from an
    approximate index built over ``gallery`` (``-1`` where it finds fewer items); then
    puts into ``report`` the recall of the exact ``k`` neighbours of up to
    :data:`INDEX_SAMPLE` evenly spread queries."""
    if isinstance(index, str):
        index = Index(metric, chunk_size=chunk_size, gallery_chunk_size=gallery_chunk_size,
                      query_buckets=False, approximate=index, vectors=None)
    else:  # the configuration of an empty Index, in a new one: the given one stays empty
        index = Index(metric, index.chunk_size, index.gallery_chunk_size, query_buckets=False,
                      approximate=index.approximate, parameters=index.parameters,
                      rerank=index.rerank, vectors=index.vectors, train_size=index.train_size,
                      seed=index.seed)
    index.add(gallery)
    for start in range(0, len(queries), chunk_size):
        yield start, None, index.search(queries[start : start + chunk_size], k)[1]
    sample = np.unique(np.linspace(0, len(queries) - 1, min(len(queries), INDEX_SAMPLE))
                       .astype(np.int64))
    exact = np.concatenate([idx for _, _, idx in neighbours(
        queries[sample], gallery, k, metric, False, chunk_size, gallery_chunk_size)])
    report["index_recall"] = neighbour_recall(index.search(queries[sample], k)[1], exact)
    report["index_k"] = k
    report["index_queries"] = len(sample)


def _report_index(data):
    """Logs (and below :data:`INDEX_RECALL_WARNING` warns about) the approximate search's
    recall of the exact neighbours; returns it (None without an index)."""
    if not data.report or "index_recall" not in data.report:
        return None
    recall, k = data.report["index_recall"], data.report["index_k"]
    index = data.index
    name = repr(index) if isinstance(index, str) else (
        f"{index.approximate!r} with {index.parameters or 'faiss defaults'}")
    text = (f"The approximate index {name} found {recall:.4f} of the exact {k} nearest "
            f"neighbours of {data.report['index_queries']} sampled queries")
    logging.getLogger("tfdml").info(text)
    if recall < INDEX_RECALL_WARNING:
        warnings.warn(text + ": the metric reflects the index as much as the embeddings. "
                      "Search more of it (Index.tune, a larger nprobe or efSearch).",
                      UserWarning, stacklevel=3)
    return recall


# -- exact nearest neighbours: tfdml.search ------------------------------------------------------


def _count_in(values, reference):
    """For each entry of ``values``, how many entries of ``reference`` equal it."""
    classes, counts = np.unique(reference, return_counts=True)
    if not len(classes):
        return np.zeros(len(values), np.int64)
    pos = np.minimum(np.searchsorted(classes, values), len(classes) - 1)
    return np.where(classes[pos] == values, counts[pos], 0).astype(np.int64)


def _exclusion_counts(num_queries, exclude_self, groups=None, gallery_groups=None):
    """Per query, the gallery items left out of its ranking: itself (without a gallery) and
    the items of its group (which hold itself)."""
    if groups is None:
        return np.full(num_queries, int(exclude_self), np.int64)
    return _count_in(groups, gallery_groups)


def _neighbour_chunks(queries, gallery, k, exclude_self, metric, chunk_size, gallery_chunk_size,
                      *, groups=None, gallery_groups=None, index=None, report=None):
    """Yields ``(start, indices)``: the ``k`` nearest gallery items of the queries
    ``start : start + n`` that are not left out of their ranking, as an ``[n, k]`` int64 array.

    The one way the metrics get neighbours (:func:`tfdml.search.neighbours`, exact): it
    fetches ``k + m`` of them, ``m`` the most items left out of one query's ranking (the
    query itself with ``exclude_self``, where query ``i`` is gallery row ``i``; the gallery
    items whose ``gallery_groups`` equals the query's ``groups``), and drops the left-out
    ones by index, keeping the order (nearest first, ties by the lower gallery index). A
    row is padded with ``-1`` where fewer than ``k`` items are left for its query (only when
    ``k`` is above the gallery size minus ``m``, which the ``R``-based metrics may ask);
    ``k`` is at most the gallery size.

    With ``index`` the candidates come from an approximate index built over the gallery
    (:func:`_approximate_neighbours`, which fills ``report``); it may find fewer, padded
    with ``-1`` too.
    """
    num_gallery = int(gallery.shape[0])
    most = int(_exclusion_counts(int(queries.shape[0]), exclude_self, groups,
                                 gallery_groups).max(initial=0))
    fetch = min(k + most, num_gallery)
    if index is None:
        found = neighbours(queries, gallery, fetch, metric, False, chunk_size,
                           gallery_chunk_size)
    else:
        found = _approximate_neighbours(queries, gallery, fetch, metric, chunk_size,
                                        gallery_chunk_size, index, report)
    for start, _, idx in found:
        rows = np.arange(start, start + len(idx))
        drop = idx < 0
        if exclude_self:
            drop |= idx == rows[:, None]
        if groups is not None:
            drop |= (gallery_groups[np.maximum(idx, 0)] == groups[rows, None]) & (idx >= 0)
        if most or index is not None:
            # A stable sort moves the left-out items behind the others, in order.
            order = np.argsort(drop, axis=1, kind="stable")
            idx = np.where(np.take_along_axis(drop, order, axis=1), -1,
                           np.take_along_axis(idx, order, axis=1))
        yield start, idx[:, :k]


def _relevance(data, k, chunk_size, gallery_chunk_size):
    """Yields ``(start, relevant)``: whether each of the ``k`` neighbours of the queries
    ``start...`` of a :class:`_Retrieval` has the query's label (False for padding)."""
    for start, idx in _neighbour_chunks(data.queries, data.gallery, k, data.exclude_self,
                                        data.metric, chunk_size, gallery_chunk_size,
                                        groups=data.groups, gallery_groups=data.gallery_groups,
                                        index=data.index, report=data.report):
        same = data.gallery_labels[np.maximum(idx, 0)] == data.labels[start : start + len(idx),
                                                                       None]
        yield start, same & (idx >= 0)


def _average(values, matched, unmatched):
    """Mean of per-query ``values`` ([Q] or [Q, m]); unmatched queries left out or counted 0."""
    values = np.asarray(values, dtype=np.float64)
    if unmatched == "miss":
        values = np.where(matched.reshape((-1,) + (1,) * (values.ndim - 1)), values, 0.0)
        return values.mean(axis=0)
    if not matched.any():
        return np.full(values.shape[1:], np.nan)
    return values[matched].mean(axis=0)


def _match_counts(labels, gallery_labels, exclude_self, groups=None, gallery_groups=None):
    """``R`` per query: the gallery items of its class left in its ranking (not itself, not
    of its group)."""
    counts = _count_in(labels, gallery_labels)
    if groups is None:
        return counts - int(exclude_self)
    # The items of the query's class and group: codes of (label, group) pairs.
    _, label_codes = np.unique(np.concatenate([labels, gallery_labels]), return_inverse=True)
    _, group_codes = np.unique(np.concatenate([groups, gallery_groups]), return_inverse=True)
    num_groups = int(group_codes.max()) + 1
    pairs = label_codes.reshape(-1).astype(np.int64) * num_groups + group_codes.reshape(-1)
    return counts - _count_in(pairs[: len(labels)], pairs[len(labels) :])


def _data_match_counts(data):
    return _match_counts(data.labels, data.gallery_labels, data.exclude_self, data.groups,
                         data.gallery_groups)


def _check_visible_ks(ks, data, name="ks"):
    """:func:`_check_ks` against the gallery items every query can see: the gallery size
    minus the most items left out of one query's ranking."""
    num_gallery = int(data.gallery.shape[0])
    most = int(_exclusion_counts(len(data.labels), data.exclude_self, data.groups,
                                 data.gallery_groups).max())
    if data.groups is None:
        return _check_ks(ks, num_gallery - most, name)
    ks = _check_ks(ks, num_gallery, name)
    if max(ks) > num_gallery - most:
        raise ValueError(
            f"`{name}` asks for {max(ks)} neighbours but the gallery offers only "
            f"{num_gallery - most} to some query: {most} of its {num_gallery} items are in "
            "that query's group and left out of its ranking. With `groups`, every K must be "
            "at most the gallery size minus the largest number of items left out for one "
            f"query. Received: {name}={ks!r}"
        )
    return ks


# -- retrieval metrics ---------------------------------------------------------------------------


def _at_k(value, data, ks, chunk_size, gallery_chunk_size, unmatched, name="ks"):
    """``{k: mean over queries}`` of ``value`` at each K: ``"recall"`` (a same-class item in
    the top K), ``"precision"`` (their share of the top K) or ``"map"`` (AP@K)."""
    ks = _check_visible_ks(ks, data, name)
    kmax = max(ks)
    r = _data_match_counts(data)
    cut = np.array(ks) - 1
    values = np.zeros((len(data.labels), len(ks)))
    rank = np.arange(1, kmax + 1)
    for start, rel in _relevance(data, kmax, chunk_size, gallery_chunk_size):
        stop = start + len(rel)
        correct = np.cumsum(rel, axis=1)
        if value == "recall":
            values[start:stop] = correct[:, cut] > 0
        elif value == "precision":
            values[start:stop] = correct[:, cut] / (cut + 1.0)
        else:
            ap = np.cumsum(correct / rank * rel, axis=1)[:, cut]
            values[start:stop] = ap / np.maximum(np.minimum(cut + 1, r[start:stop, None]), 1)
    values = _average(values, r > 0, unmatched)
    return {k: float(v) for k, v in zip(ks, values, strict=True)}


@fill_doc(**_RETRIEVAL_DOCS)
def recall_at_k(
    embeddings,
    labels,
    ks=(1, 2, 4, 8),
    gallery_embeddings=None,
    gallery_labels=None,
    metric: str = "cosine",
    chunk_size: int = 1024,
    gallery_chunk_size: int = 65536,
    unmatched: str = "miss",
    groups=None,
    gallery_groups=None,
    index=None,
) -> dict:
    """Recall@K of metric learning: the share of queries with a same-class item in their top K.

    A query is a hit at K when any of its K nearest gallery items has its label
    (Song et al. 2016; the FAPPY paper's footnote 1). Without a separate
    gallery every embedding is a query against all the others, itself excluded
    (CUB-200, Cars196, SOP); with ``gallery_embeddings`` the query and gallery
    sets are distinct and nothing is excluded (In-shop). It is the CMC at K
    (open-metric-learning's ``cmc@k``).

    Args:
        {QUERIES}
        ks: the values of K. Defaults to `(1, 2, 4, 8)`.
        {GALLERY}
        {SEARCH}
        unmatched: what a query with no same-class item in the gallery counts as:
            ``"miss"`` (a 0) or ``"exclude"`` (left out of the average).
            Defaults to `"miss"` (all queries count).
        {GROUPS}

    Returns:
        ``{k: recall}`` with Python floats in [0, 1] (``nan`` if every query is
        excluded).

    Raises:
        {RAISES}

    Examples:

    >>> x = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.2, 0.9]])
    >>> tfdml.metrics.recall_at_k(x, [0, 0, 1, 1], ks=(1, 2))
    {1: 1.0, 2: 1.0}
    >>> tfdml.metrics.recall_at_k(model.predict(x_test), y_test, ks=(1, 10, 100, 1000))
    """
    data = _prepare(embeddings, labels, gallery_embeddings, gallery_labels, metric, chunk_size,
                    gallery_chunk_size, unmatched, groups=groups, gallery_groups=gallery_groups,
                    index=index)
    values = _at_k("recall", data, ks, chunk_size, gallery_chunk_size, unmatched)
    _report_index(data)
    return values


@fill_doc(**_RETRIEVAL_DOCS)
def precision_at_k(embeddings, labels, ks=(1, 5, 10), gallery_embeddings=None,
                   gallery_labels=None, metric: str = "cosine", chunk_size: int = 1024,
                   gallery_chunk_size: int = 65536, unmatched: str = "exclude", groups=None,
                   gallery_groups=None, index=None) -> dict:
    """Precision@K: the share of same-class items among a query's K nearest gallery items.

    ``P@K = (1/K) sum_{i=1..K} rel(i)``, ``rel(i)`` 1 when the ``i``-th nearest
    gallery item has the query's class, averaged over queries; neighbours,
    self-exclusion and ties as in :func:`recall_at_k`. This is the plain
    definition: a query with ``R < K`` same-class items scores at most ``R/K``.
    open-metric-learning's ``precision@k`` divides by ``min(K, R)`` instead, so
    that such a query can score 1; the two agree for queries with ``R >= K``.

    Args:
        {QUERIES}
        ks: the values of K. Defaults to `(1, 5, 10)`.
        {GALLERY}
        {SEARCH}
        unmatched: queries with no same-class item in the gallery (``R = 0``):
            ``"exclude"`` (left out of the average) or ``"miss"`` (a 0).
            Defaults to `"exclude"`.
        {GROUPS}

    Returns:
        ``{k: precision}`` with Python floats in [0, 1] (``nan`` if every query
        is excluded).

    Raises:
        {RAISES}

    Examples:

    >>> x = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.2, 0.9], [0.7, 0.7]])
    >>> tfdml.metrics.precision_at_k(x, [0, 0, 1, 1, 1], ks=(1, 2))
    {1: 1.0, 2: 0.7}
    """
    data = _prepare(embeddings, labels, gallery_embeddings, gallery_labels, metric, chunk_size,
                    gallery_chunk_size, unmatched, groups=groups, gallery_groups=gallery_groups,
                    index=index)
    values = _at_k("precision", data, ks, chunk_size, gallery_chunk_size, unmatched)
    _report_index(data)
    return values


@fill_doc(**_RETRIEVAL_DOCS)
def map_at_k(embeddings, labels, ks=(1, 5, 10), gallery_embeddings=None,
             gallery_labels=None, metric: str = "cosine", chunk_size: int = 1024,
             gallery_chunk_size: int = 65536, unmatched: str = "exclude", groups=None,
             gallery_groups=None, index=None) -> dict:
    """MAP@K: the mean average precision over a query's K nearest gallery items.

    For a query with ``R`` same-class items in the gallery (itself and its
    group left out), ``AP@K = (1 / min(K, R)) sum_{i=1..K} P(i) rel(i)``, where
    ``rel(i)`` is 1 when the ``i``-th neighbour has the query's class and
    ``P(i)`` is the precision at rank ``i``; MAP@K is its mean over queries. A
    perfect ranking scores 1 whatever ``R``. This is open-metric-learning's
    ``map@k``; with ``K = R`` for every query it is MAP@R (:func:`map_at_r`).
    Neighbours, self-exclusion and ties as in :func:`recall_at_k`.

    Args:
        {QUERIES}
        ks: the values of K. Defaults to `(1, 5, 10)`.
        {GALLERY}
        {SEARCH}
        unmatched: queries with ``R = 0`` (undefined AP): ``"exclude"`` or
            ``"miss"`` (a 0). Defaults to `"exclude"`.
        {GROUPS}

    Returns:
        ``{k: map}`` with Python floats in [0, 1] (``nan`` if every query is
        excluded).

    Raises:
        {RAISES}

    Examples:

    >>> x = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.2, 0.9], [0.7, 0.7]])
    >>> tfdml.metrics.map_at_k(x, [0, 0, 1, 1, 1], ks=(1, 2))
    {1: 1.0, 2: 0.9}
    """
    data = _prepare(embeddings, labels, gallery_embeddings, gallery_labels, metric, chunk_size,
                    gallery_chunk_size, unmatched, groups=groups, gallery_groups=gallery_groups,
                    index=index)
    values = _at_k("map", data, ks, chunk_size, gallery_chunk_size, unmatched)
    _report_index(data)
    return values


def _r_metric(value, embeddings, labels, gallery_embeddings, gallery_labels, metric, chunk_size,
              gallery_chunk_size, unmatched, groups, gallery_groups, index):
    """The mean over queries of ``value``: ``"ap"`` (average precision at R, for MAP@R) or
    ``"rp"`` (R-precision)."""
    data = _prepare(embeddings, labels, gallery_embeddings, gallery_labels, metric, chunk_size,
                    gallery_chunk_size, unmatched, groups=groups, gallery_groups=gallery_groups,
                    index=index)
    r = _data_match_counts(data)
    matched = r > 0
    ap = np.zeros(len(data.labels))
    rp = np.zeros(len(data.labels))
    kmax = int(r.max())
    if kmax > 0:
        rank = np.arange(1, kmax + 1)
        for start, rel in _relevance(data, kmax, chunk_size, gallery_chunk_size):
            stop = start + len(rel)
            # R <= the items left for a query, so its first R columns are never padding.
            rel = rel & (rank[None, :] <= r[start:stop, None])
            precision = np.cumsum(rel, axis=1) / rank[None, :]
            denom = np.maximum(r[start:stop], 1)
            ap[start:stop] = (precision * rel).sum(axis=1) / denom
            rp[start:stop] = rel.sum(axis=1) / denom
    _report_index(data)
    return float(_average(ap if value == "ap" else rp, matched, unmatched))


def _r_doc(name):
    """The arguments, results and example of :func:`map_at_r` and :func:`r_precision`."""
    return f"""\
Args:
    {{QUERIES}}
    {{GALLERY}}
    {{SEARCH}}
    unmatched: queries with ``R = 0``: ``"exclude"`` or ``"miss"`` (a 0).
        Defaults to `"exclude"`.
    {{GROUPS}}

Returns:
    A Python float in [0, 1] (``nan`` if every query is excluded).

Raises:
    {{RAISES}}

Examples:

>>> x = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.2, 0.9], [0.7, 0.7]])
>>> tfdml.metrics.{name}(x, [0, 0, 1, 1, 1])
0.9

Reference:
    Musgrave, Belongie, Lim. A Metric Learning Reality Check. ECCV 2020."""


@fill_doc(R_DOC=_r_doc("map_at_r"), **_RETRIEVAL_DOCS)
def map_at_r(embeddings, labels, gallery_embeddings=None, gallery_labels=None,
             metric: str = "cosine", chunk_size: int = 1024, gallery_chunk_size: int = 65536,
             unmatched: str = "exclude", groups=None, gallery_groups=None,
             index=None) -> float:
    """MAP@R, the mean average precision at R of Musgrave et al. (2020).

    For a query with ``R`` same-class items in the gallery (itself excluded
    when the queries are the gallery), ``MAP@R = (1/R) sum_{i=1..R} P(i)``,
    where ``P(i)`` is the precision at rank ``i`` if the ``i``-th neighbour has
    the query's class and 0 otherwise. The result is the mean over queries.
    Neighbours as in :func:`recall_at_k` (exact, ties to the lower gallery
    index). Memory grows with the largest ``R`` (``chunk_size x max R``).

    {R_DOC}
    """
    return _r_metric("ap", embeddings, labels, gallery_embeddings, gallery_labels, metric,
                     chunk_size, gallery_chunk_size, unmatched, groups, gallery_groups, index)


@fill_doc(R_DOC=_r_doc("r_precision"), **_RETRIEVAL_DOCS)
def r_precision(embeddings, labels, gallery_embeddings=None, gallery_labels=None,
                metric: str = "cosine", chunk_size: int = 1024, gallery_chunk_size: int = 65536,
                unmatched: str = "exclude", groups=None, gallery_groups=None,
             index=None) -> float:
    """R-precision: the share of same-class items among a query's R nearest neighbours.

    ``R`` is the number of same-class items in the gallery for that query (itself
    excluded when the queries are the gallery), as in Musgrave et al. (2020).
    The result is the mean over queries. Arguments as in :func:`map_at_r`.

    {R_DOC}
    """
    return _r_metric("rp", embeddings, labels, gallery_embeddings, gallery_labels, metric,
                     chunk_size, gallery_chunk_size, unmatched, groups, gallery_groups, index)


@fill_doc(SEARCH=_SEARCH, RAISES=_nonfinite_raises("query_embeddings", "gallery_embeddings"))
def cmc(
    query_embeddings,
    query_labels,
    gallery_embeddings,
    gallery_labels,
    top_k: int = 20,
    metric: str = "cosine",
    chunk_size: int = 1024,
    gallery_chunk_size: int = 65536,
    unmatched: str = "miss",
    groups=None,
    gallery_groups=None,
    index=None,
) -> np.ndarray:
    """Cumulative match characteristic: top-k match rates for k = 1..``top_k``.

    ``cmc(...)[k - 1]`` is the share of queries whose nearest gallery item of
    their identity is among their ``k`` nearest gallery items (the top-k match
    rate of re-identification). Query and gallery sets are separate; nothing
    is excluded but the gallery items of a query's group. Ties as in
    :func:`recall_at_k`.

    Args:
        query_embeddings: ``[Q, D]``.
        query_labels: ``[Q]`` integer identities.
        gallery_embeddings: ``[G, D]``.
        gallery_labels: ``[G]`` integer identities.
        top_k: length of the curve, at most ``G`` (minus the most gallery items
            of one query's group). Defaults to `20`.
        {SEARCH}
        unmatched: queries whose identity is not in the gallery: ``"miss"``
            or ``"exclude"``. Defaults to `"miss"`.
        groups: ``[Q]`` integer group ids of the queries; a gallery item of
            the query's group is left out of its ranking (e.g. the ids of
            (identity, camera) pairs, for the same-camera rule of Market-1501).
            Defaults to `None`.
        gallery_groups: ``[G]`` integer group ids of the gallery, required
            with ``groups``. Defaults to `None`.
        index: an approximate search, as in :func:`recall_at_k`. Defaults to
            `None` (exact).

    Returns:
        A float64 NumPy array of shape ``[top_k]``, non-decreasing.

    Raises:
        {RAISES}

    Examples:

    >>> curve = tfdml.metrics.cmc(q, q_ids, g, g_ids, top_k=5)
    >>> top1, top5 = curve[0], curve[4]
    """
    if gallery_embeddings is None:
        raise ValueError("`gallery_embeddings` is required. Received: gallery_embeddings=None")
    data = _prepare(query_embeddings, query_labels, gallery_embeddings, gallery_labels, metric,
                    chunk_size, gallery_chunk_size, unmatched,
                    names=("query_embeddings", "query_labels"), groups=groups,
                    gallery_groups=gallery_groups, index=index)
    (top_k,) = _check_visible_ks((top_k,), data, "top_k")
    curve = _at_k("recall", data, range(1, top_k + 1), chunk_size, gallery_chunk_size,
                  unmatched, "top_k")
    _report_index(data)
    return np.array([curve[k] for k in range(1, top_k + 1)], dtype=np.float64)


@fill_doc(RAISES=_nonfinite_raises("embeddings"))
def vehicleid_match_rate(
    embeddings,
    labels,
    ks=(1, 5),
    num_draws: int = 10,
    seed: int = 0,
    metric: str = "cosine",
    chunk_size: int = 1024,
) -> dict:
    """Top-k match rates under the VehicleID protocol (Liu et al. 2016), averaged over draws.

    Each draw puts one randomly chosen image of every identity in the gallery
    and uses all the other images as queries; the top-k match rate is the share
    of queries whose identity is among their ``k`` nearest gallery images (the
    CMC at ``k``). The result is the mean over ``num_draws`` draws from
    ``numpy.random.default_rng(seed)``. An identity with a single image is
    only a gallery item (a distractor for the other queries); every query's
    identity is in the gallery, so no query is excluded.

    Args:
        embeddings: ``[N, D]`` embeddings of a test split (e.g. the small,
            medium or large VehicleID test list).
        labels: ``[N]`` integer vehicle ids.
        ks: the values of k. Defaults to `(1, 5)`.
        num_draws: how many random galleries to average over. Defaults to `10`
            (the FAPPY paper repeats the query 10 times).
        seed: seed of the draws. Defaults to `0`.
        metric: ``"cosine"`` or ``"l2"``. Defaults to `"cosine"`.
        chunk_size: queries per matrix product. Defaults to `1024`.

    Returns:
        ``{k: mean match rate}`` with Python floats in [0, 1].

    Raises:
        {RAISES}

    Examples:

    >>> rates = tfdml.metrics.vehicleid_match_rate(model.predict(x_small), ids_small)
    >>> rates[1], rates[5]  # mean top-1 and top-5 match rates over 10 draws
    """
    num_draws = check_int("num_draws", num_draws)
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool):
        raise ValueError(f"`seed` must be an integer. Received: seed={seed!r}")
    labels_np = ops.convert_to_numpy(dml.cast_labels(labels)).astype(np.int64)
    x = dml.check_embeddings(embeddings)
    dml.check_batch_sizes(labels_np, x)
    _check_finite(x, "embeddings")
    classes, inverse = np.unique(labels_np, return_inverse=True)
    ks = _check_ks(ks, len(classes))
    if len(classes) == len(labels_np):
        raise ValueError(
            "`labels` has one image per identity, so no image is left as a query. "
            f"Received: {len(labels_np)} images of {len(classes)} identities"
        )
    order = np.argsort(inverse, kind="stable")
    starts = np.searchsorted(inverse[order], np.arange(len(classes)))
    counts = np.bincount(inverse)
    rng = np.random.default_rng(seed)
    totals = np.zeros(len(ks))
    metric = check_metric(metric)  # once, not once per draw
    for _ in range(num_draws):
        chosen = order[starts + rng.integers(0, counts)]
        is_query = np.ones(len(labels_np), dtype=bool)
        is_query[chosen] = False
        curve = cmc(ops.take(x, np.flatnonzero(is_query), axis=0), labels_np[is_query],
                    ops.take(x, chosen, axis=0), labels_np[chosen], top_k=max(ks),
                    metric=metric, chunk_size=chunk_size)
        totals += np.array([curve[k - 1] for k in ks])
    return {k: float(v / num_draws) for k, v in zip(ks, totals, strict=True)}
