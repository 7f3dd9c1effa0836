"""The neighbours of the retrieval metrics: their inputs checked, one chunked k-NN search
with the exclusions (the query itself, its group), and the approximate ``index=`` search.

Every retrieval metric, :func:`tfdml.metrics.fnmr_at_fmr` and
:class:`tfdml.callbacks.RecallAtK` get their neighbours here: :func:`prepare`
checks the inputs into a :class:`Retrieval`, :func:`neighbour_chunks` searches
(exactly with :func:`tfdml.search.neighbours`, or through an approximate
:class:`tfdml.search.Index` built over the gallery) and leaves out what a query
must not see, :func:`relevance` marks the relevant neighbours and
:func:`match_counts` counts ``R``.

Labels are ``[N]`` class ids (relevant: the same class) or, for the metrics that
take them (``multi_label=True`` in :func:`prepare`), ``[N, L]`` multi-hot label
sets (relevant: sharing a label, or a Jaccard similarity of the sets of at least
``min_jaccard``; :func:`tfdml._labels.relevance`). ``R`` of multi-hot labels is
counted by blocks of queries against the whole gallery
(:func:`tfdml.search.results.relevance_blocks`), never an ``N x N`` matrix at once. The approximate search measures its recall of
the exact neighbours on up to :data:`INDEX_SAMPLE` queries; :func:`report_index`
logs it and warns below :data:`INDEX_RECALL_WARNING`.
"""

from __future__ import annotations

import logging
import warnings
from typing import NamedTuple

import numpy as np
from keras import ops

from tfdml import _labels
from tfdml import ops as dml
from tfdml._argument_checks import check_choice, check_int
from tfdml._embeddings import check_batch_sizes, check_embeddings
from tfdml.search import Index, check_finite, neighbour_recall, neighbours
from tfdml.search.adding import host_normalize
from tfdml.search.results import (
    check_same_form,
    host_labels,
    neighbour_relevance,
    relevance_blocks,
)

#: The values of ``metric`` (names of :data:`tfdml.ops.DISTANCES`).
METRICS = ("cosine", "l2")

#: The values of ``unmatched``: queries without a same-class item left out, or counted 0.
UNMATCHED = ("exclude", "miss")


def check_metric(metric):
    """``metric`` as one of :data:`METRICS`; a ValueError naming it and the accepted values
    otherwise."""
    return dml.check_distance(metric, METRICS, "metric")


def _group_ids(values, name, rows, rows_name):
    """``values`` as a 1-D int64 NumPy array of ``rows`` group ids; a ValueError naming it
    otherwise (floats, even whole ones, are refused: a group id is an integer)."""
    if not isinstance(values, np.ndarray) and hasattr(values, "shape"):
        values = ops.convert_to_numpy(values)  # a tensor
    values = np.asarray(values)
    _labels.check_finite_labeling(values, name)
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


class Retrieval(NamedTuple):
    """What :func:`prepare` returns: the search inputs and the NumPy labels and groups."""

    queries: object  # float32 tensor, L2-normalized for "cosine"
    gallery: object  # the queries themselves without a gallery
    labels: np.ndarray  # int64 [Q], or bool [Q, L] multi-hot
    gallery_labels: np.ndarray  # int64 [G], or bool [G, L] multi-hot
    exclude_self: bool
    metric: str
    groups: np.ndarray | None  # int64 [Q], or None
    gallery_groups: np.ndarray | None  # int64 [G] (``groups`` without a gallery), or None
    index: object = None  # an approximate index (factory string or empty Index), or None
    report: dict | None = None  # what the approximate search reports (``index_recall``)
    min_jaccard: float | None = None  # multi-hot labels: the Jaccard similarity of positives


def prepare(embeddings, labels, gallery_embeddings, gallery_labels, metric, chunk_size,
            gallery_chunk_size, unmatched, names=("embeddings", "labels"), groups=None,
            gallery_groups=None, index=None, *, multi_label=False, min_jaccard=None):
    """Validates the inputs of a retrieval metric; returns a :class:`Retrieval`.

    The queries and gallery become float32 (L2-normalized for ``"cosine"``), the
    labels and groups int64 NumPy arrays (multi-hot labels bool ``[N, L]``
    arrays); without ``gallery_embeddings`` the
    queries are the gallery (``exclude_self``). With ``index`` (an approximate
    search, on the host) the embeddings stay NumPy arrays: no device copy.

    Args:
        embeddings, labels: the queries and their class ids.
        gallery_embeddings, gallery_labels: a separate gallery, or None.
        metric: ``"cosine"`` or ``"l2"`` (:func:`check_metric`).
        chunk_size, gallery_chunk_size: positive integers.
        unmatched: one of :data:`UNMATCHED`.
        names: the names of the first two arguments in the errors.
            Defaults to `("embeddings", "labels")`.
        groups, gallery_groups: group ids of the queries and the gallery, or None.
        index: an approximate search (:func:`check_index`), or None.
        multi_label: whether ``[N, L]`` multi-hot labels are taken (else refused:
            the metric needs one class per sample). Defaults to `False`.
        min_jaccard: multi-hot labels: the Jaccard similarity of relevant label
            sets (:func:`tfdml._labels.check_min_jaccard`), or None (sharing a
            label). Defaults to `None`.

    Returns:
        A :class:`Retrieval`.

    Raises:
        ValueError: naming the argument, for any input that does not fit.
    """
    min_jaccard = _labels.check_min_jaccard(min_jaccard)
    data = _prepare_tensors(embeddings, labels, gallery_embeddings, gallery_labels, metric,
                            chunk_size, gallery_chunk_size, unmatched, names, groups,
                            gallery_groups, index, multi_label)
    data = data._replace(min_jaccard=min_jaccard)
    if index is None:
        return data
    return data._replace(index=check_index(index, data.metric), report={})


def _prepare_tensors(embeddings, labels, gallery_embeddings, gallery_labels, metric, chunk_size,
                     gallery_chunk_size, unmatched, names, groups, gallery_groups, index,
                     multi_label):
    metric = check_metric(metric)
    check_choice("unmatched", unmatched, UNMATCHED)
    check_int("chunk_size", chunk_size)
    check_int("gallery_chunk_size", gallery_chunk_size)
    emb_name, lab_name = names
    labels = _class_ids_or_sets(labels, lab_name, multi_label)
    queries = _embeddings(embeddings, emb_name, index)
    check_batch_sizes(labels, queries, lab_name, emb_name)
    if queries.shape[0] == 0:
        raise ValueError(f"`{emb_name}` is empty. Received: {emb_name}.shape={queries.shape}")
    check_finite(queries, emb_name)
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
        gallery_labels = _class_ids_or_sets(gallery_labels, "gallery_labels", multi_label)
        check_batch_sizes(gallery_labels, gallery, "gallery_labels", "gallery_embeddings")
        if gallery.shape[-1] != queries.shape[-1]:
            raise ValueError(
                f"`gallery_embeddings` and `{emb_name}` must have the same embedding size. "
                f"Received: gallery_embeddings.shape={gallery.shape}, "
                f"{emb_name}.shape={queries.shape}"
            )
        check_finite(gallery, "gallery_embeddings")
    groups, gallery_groups = _check_groups(groups, gallery_groups, exclude_self,
                                           int(queries.shape[0]), int(gallery.shape[0]),
                                           emb_name)
    if metric == "cosine":
        normalize = dml.l2_normalize if index is None else host_normalize
        queries = normalize(queries)
        gallery = queries if exclude_self else normalize(gallery)
    labels, gallery_labels = _host_labels(labels), _host_labels(gallery_labels)
    check_same_form(gallery_labels, labels, "gallery_labels", lab_name)
    return Retrieval(queries, gallery, labels, gallery_labels, exclude_self, metric, groups,
                     gallery_groups)


def _class_ids_or_sets(values, name, multi_label):
    """Class ids as an integer tensor (:func:`tfdml.ops.cast_labels`), or with
    ``multi_label`` ``[N, L]`` multi-hot labels as a checked bool NumPy array."""
    if not _labels.is_multi_label(values):
        return dml.cast_labels(values, name)
    if not multi_label:
        raise ValueError(f"`{name}` must be [N] integer class ids: this metric takes one class "
                         "per sample, not [N, L] multi-hot label sets. Received: "
                         f"{name}.shape={tuple(np.shape(values))}")
    return host_labels(values, name)


def _host_labels(labels):
    """Labels as NumPy: multi-hot (bool) as they are, class ids as int64."""
    if isinstance(labels, np.ndarray) and labels.ndim == 2:
        return labels
    return ops.convert_to_numpy(labels).astype(np.int64)


def _embeddings(values, name, index):
    """``values`` checked, as float32: a tensor, or with ``index`` a NumPy array (no copy of
    a float32 array)."""
    if index is None:
        return ops.cast(check_embeddings(values, name), "float32")
    if ops.is_tensor(values) and not isinstance(values, np.ndarray):
        values = ops.convert_to_numpy(check_embeddings(values, name))
    values = np.asarray(values)
    if values.ndim != 2 or values.dtype.kind not in "fiu":
        raise ValueError(f"`{name}` must be a rank-2 float array of shape [B, D]. Received: "
                         f"{name} of dtype {values.dtype} and shape {values.shape}")
    with np.errstate(over="ignore"):
        return values.astype(np.float32, copy=False)


# -- an approximate search: the index= of the metrics -------------------------------------------

#: Queries whose exact neighbours are computed to measure an approximate index's recall.
INDEX_SAMPLE = 1000

#: Below this recall of the exact neighbours, a metric through an approximate index warns.
INDEX_RECALL_WARNING = 0.9


def check_index(index, metric):
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


def report_index(data):
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


# -- the neighbours of every query, its exclusions left out --------------------------------------


def _count_in(values, reference):
    """For each entry of ``values``, how many entries of ``reference`` equal it."""
    classes, counts = np.unique(reference, return_counts=True)
    if not len(classes):
        return np.zeros(len(values), np.int64)
    pos = np.minimum(np.searchsorted(classes, values), len(classes) - 1)
    return np.where(classes[pos] == values, counts[pos], 0).astype(np.int64)


def exclusion_counts(num_queries, exclude_self, groups=None, gallery_groups=None):
    """Per query, the gallery items left out of its ranking: itself (without a gallery) and
    the items of its group (which hold itself)."""
    if groups is None:
        return np.full(num_queries, int(exclude_self), np.int64)
    return _count_in(groups, gallery_groups)


def neighbour_chunks(queries, gallery, k, exclude_self, metric, chunk_size, gallery_chunk_size,
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
    most = int(exclusion_counts(int(queries.shape[0]), exclude_self, groups,
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


def relevance(data, k, chunk_size, gallery_chunk_size, graded=False):
    """Yields ``(start, relevant)``: whether each of the ``k`` neighbours of the queries
    ``start...`` of a :class:`Retrieval` is relevant to the query (has its label, or shares
    a label with its multi-hot set; False for padding), by
    :func:`~tfdml.search.results.neighbour_relevance`; with ``graded`` its gains (float64)."""
    for start, idx in neighbour_chunks(data.queries, data.gallery, k, data.exclude_self,
                                       data.metric, chunk_size, gallery_chunk_size,
                                       groups=data.groups, gallery_groups=data.gallery_groups,
                                       index=data.index, report=data.report):
        yield start, neighbour_relevance(data.labels[start : start + len(idx)],
                                         data.gallery_labels, idx, data.min_jaccard, graded)


def match_counts(labels, gallery_labels, exclude_self, groups=None, gallery_groups=None,
                 min_jaccard=None):
    """``R`` per query: the gallery items relevant to it (of its class, or sharing a label
    with its multi-hot set) left in its ranking (not itself, not of its group)."""
    if labels.ndim == 2:
        counts = np.zeros(len(labels), np.int64)
        for start, block in relevance_blocks(labels, gallery_labels, min_jaccard, False,
                                             exclude_self, groups, gallery_groups):
            counts[start : start + len(block)] = block.sum(axis=1)
        return counts
    counts = _count_in(labels, gallery_labels)
    if groups is None:
        return counts - int(exclude_self)
    # The items of the query's class and group: codes of (label, group) pairs.
    _, label_codes = np.unique(np.concatenate([labels, gallery_labels]), return_inverse=True)
    _, group_codes = np.unique(np.concatenate([groups, gallery_groups]), return_inverse=True)
    num_groups = int(group_codes.max()) + 1
    pairs = label_codes.reshape(-1).astype(np.int64) * num_groups + group_codes.reshape(-1)
    return counts - _count_in(pairs[: len(labels)], pairs[len(labels) :])


def data_match_counts(data):
    """:func:`match_counts` of a :class:`Retrieval`."""
    return match_counts(data.labels, data.gallery_labels, data.exclude_self, data.groups,
                        data.gallery_groups, data.min_jaccard)


def ideal_gains(data, k):
    """``(R, best)`` of a :class:`Retrieval` of multi-hot labels: ``R`` per query as
    :func:`data_match_counts`, and ``[Q, k]`` float64 the ``k`` largest gains (Jaccard
    similarities of the relevant label sets, 0 for the others) of the gallery items left
    in each query's ranking, in decreasing order: the gains of the ideal ranking."""
    counts = np.zeros(len(data.labels), np.int64)
    best = np.zeros((len(data.labels), k))
    for start, gains in relevance_blocks(data.labels, data.gallery_labels, data.min_jaccard,
                                         True, data.exclude_self, data.groups,
                                         data.gallery_groups):
        stop = start + len(gains)
        counts[start:stop] = (gains > 0).sum(axis=1)
        top = -np.partition(-gains, k - 1, axis=1)[:, :k] if k < gains.shape[1] else gains
        best[start:stop] = -np.sort(-top, axis=1)[:, :k]
    return counts, best
