"""Retrieval, verification and clustering metrics on embeddings.

Nearest neighbours are exact. Queries are processed in chunks of ``chunk_size``
rows and the gallery in chunks of ``gallery_chunk_size`` rows; each query chunk
keeps a *running* top-k that is merged with every gallery chunk's scores, so
memory is ``chunk_size x (gallery_chunk_size + k)`` scores, whatever the number
of queries and gallery items (60,000 x 512 embeddings need well under 2 GiB).

Conventions shared by every retrieval metric:

* **Similarity.** ``metric="cosine"`` (default) ranks by the dot product of
  L2-normalized embeddings; ``metric="l2"`` by the Euclidean distance (the
  names of :data:`tfdml.ops.DISTANCES`; the old ``"euclidean"`` still means
  ``"l2"``, with a ``DeprecationWarning``). Scores are computed in float32.
* **Self-exclusion.** Without a separate gallery every embedding is a query
  against all the others, itself excluded (CUB-200, Cars196, SOP protocol).
  The query is excluded by its index, not by its score, so no score (equal to
  another row's, ``-inf``, NaN) can make a query its own neighbour. With a
  gallery nothing is excluded (In-shop protocol).
* **Exclusions by group.** ``groups`` (``[Q]`` integer ids of the queries) and,
  with a separate gallery, ``gallery_groups`` (``[G]``) leave out of a query's
  ranking every gallery item of its group, by index as the query itself: such
  an item is neither a hit nor a miss and does not count in ``R`` (the
  ``sequence_ids`` of open-metric-learning: frames of one video, photos of one
  session). Without a gallery ``groups`` gives the group of every item. The
  search fetches ``k + m`` neighbours, ``m`` the most items left out of one
  query's ranking, and drops the left-out ones; a ``k`` must be at most the
  gallery size minus ``m``.
* **Non-finite embeddings.** Every metric raises a ``ValueError`` naming the
  argument when an embedding row holds a NaN or an Inf (after the conversion
  to float32, so float64 values beyond the float32 range count as Inf): a
  score computed on such rows would be meaningless, and a diverged model must
  not get a good one. :class:`tfdml.callbacks.RecallAtK` turns this into NaN
  log values instead of stopping the training.
* **Ties.** Neighbours are ordered by decreasing similarity; items with equal
  scores are ordered by increasing gallery index (a stable sort). Results are
  therefore deterministic and do not depend on the chunk sizes.
* **Queries without a match** (no other item of their class in the gallery, e.g.
  a class with a single sample): ``unmatched="miss"`` counts them as 0,
  ``unmatched="exclude"`` leaves them out of the average. The defaults follow
  each metric's definition: Recall@K and CMC average over *all* queries
  (``"miss"``, as in Song et al. 2016 and the FAPPY paper), MAP@R and
  R-precision are undefined for ``R = 0`` and leave such queries out
  (``"exclude"``, as in Musgrave et al. 2020 and pytorch-metric-learning), as
  do Precision@K and MAP@K (``"exclude"``, as open-metric-learning's
  ``validate_dataset`` asks). When every query is excluded the result is ``nan``.

:func:`fnmr_at_fmr` (verification over all pairs) and :func:`pcf` (the
principal-components fraction, a collapse indicator) live in
:mod:`tfdml.verification` and are re-exported here.

:class:`ActiveAnchors` is a Keras metric for ``model.compile``: the fraction of
anchors of the training batches that a tfdml loss learns from.
"""

from __future__ import annotations

import textwrap
import warnings
from typing import NamedTuple

import keras
import numpy as np
from keras import ops

from tfdml import ops as dml
from tfdml._checks import check_choice, check_int
from tfdml._docs import fill_doc
from tfdml.search import at_indices as _at_indices
from tfdml.search import check_finite as _check_finite
from tfdml.search import neighbours, score_scale
from tfdml.verification import fnmr_at_fmr, pcf

__all__ = [
    "ActiveAnchors",
    "cmc",
    "f1_clustering",
    "fnmr_at_fmr",
    "map_at_k",
    "map_at_r",
    "nmi",
    "nmi_score",
    "pairwise_f1_score",
    "pcf",
    "precision_at_k",
    "r_precision",
    "recall_at_k",
    "vehicleid_match_rate",
]

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
    with ``groups`` and ``gallery_embeddings``. Defaults to `None`."""


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


def _prepare(embeddings, labels, gallery_embeddings, gallery_labels, metric, chunk_size,
             gallery_chunk_size, unmatched, names=("embeddings", "labels"), groups=None,
             gallery_groups=None):
    """Validates the inputs; returns a :class:`_Retrieval` (float32 queries/gallery, int64
    labels and groups, exclude_self, the metric of :func:`check_metric`)."""
    metric = check_metric(metric)
    check_choice("unmatched", unmatched, UNMATCHED)
    check_int("chunk_size", chunk_size)
    check_int("gallery_chunk_size", gallery_chunk_size)
    emb_name, lab_name = names
    labels = dml.cast_labels(labels, lab_name)
    queries = ops.cast(dml.check_embeddings(embeddings, emb_name), "float32")
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
        gallery = ops.cast(dml.check_embeddings(gallery_embeddings, "gallery_embeddings"),
                            "float32")
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
        queries = dml.l2_normalize(queries)
        gallery = queries if exclude_self else dml.l2_normalize(gallery)
    return _Retrieval(queries, gallery, ops.convert_to_numpy(labels).astype(np.int64),
                      ops.convert_to_numpy(gallery_labels).astype(np.int64), exclude_self,
                      metric, groups, gallery_groups)


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
                      *, groups=None, gallery_groups=None):
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
    """
    num_gallery = int(gallery.shape[0])
    most = int(_exclusion_counts(int(queries.shape[0]), exclude_self, groups,
                                 gallery_groups).max(initial=0))
    fetch = min(k + most, num_gallery)
    for start, _, idx in neighbours(queries, gallery, fetch, metric, False, chunk_size,
                                    gallery_chunk_size):
        rows = np.arange(start, start + len(idx))
        drop = np.zeros(idx.shape, dtype=bool)
        if exclude_self:
            drop |= idx == rows[:, None]
        if groups is not None:
            drop |= gallery_groups[idx] == groups[rows, None]
        if most:
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
                                        groups=data.groups, gallery_groups=data.gallery_groups):
        same = data.gallery_labels[idx] == data.labels[start : start + len(idx), None]
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
                    gallery_chunk_size, unmatched, groups=groups, gallery_groups=gallery_groups)
    return _at_k("recall", data, ks, chunk_size, gallery_chunk_size, unmatched)


@fill_doc(**_RETRIEVAL_DOCS)
def precision_at_k(embeddings, labels, ks=(1, 5, 10), gallery_embeddings=None,
                   gallery_labels=None, metric: str = "cosine", chunk_size: int = 1024,
                   gallery_chunk_size: int = 65536, unmatched: str = "exclude", groups=None,
                   gallery_groups=None) -> dict:
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
                    gallery_chunk_size, unmatched, groups=groups, gallery_groups=gallery_groups)
    return _at_k("precision", data, ks, chunk_size, gallery_chunk_size, unmatched)


@fill_doc(**_RETRIEVAL_DOCS)
def map_at_k(embeddings, labels, ks=(1, 5, 10), gallery_embeddings=None,
             gallery_labels=None, metric: str = "cosine", chunk_size: int = 1024,
             gallery_chunk_size: int = 65536, unmatched: str = "exclude", groups=None,
             gallery_groups=None) -> dict:
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
                    gallery_chunk_size, unmatched, groups=groups, gallery_groups=gallery_groups)
    return _at_k("map", data, ks, chunk_size, gallery_chunk_size, unmatched)


def _r_metric(value, embeddings, labels, gallery_embeddings, gallery_labels, metric, chunk_size,
              gallery_chunk_size, unmatched, groups, gallery_groups):
    """The mean over queries of ``value``: ``"ap"`` (average precision at R, for MAP@R) or
    ``"rp"`` (R-precision)."""
    data = _prepare(embeddings, labels, gallery_embeddings, gallery_labels, metric, chunk_size,
                    gallery_chunk_size, unmatched, groups=groups, gallery_groups=gallery_groups)
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
             unmatched: str = "exclude", groups=None, gallery_groups=None) -> float:
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
                     chunk_size, gallery_chunk_size, unmatched, groups, gallery_groups)


@fill_doc(R_DOC=_r_doc("r_precision"), **_RETRIEVAL_DOCS)
def r_precision(embeddings, labels, gallery_embeddings=None, gallery_labels=None,
                metric: str = "cosine", chunk_size: int = 1024, gallery_chunk_size: int = 65536,
                unmatched: str = "exclude", groups=None, gallery_groups=None) -> float:
    """R-precision: the share of same-class items among a query's R nearest neighbours.

    ``R`` is the number of same-class items in the gallery for that query (itself
    excluded when the queries are the gallery), as in Musgrave et al. (2020).
    The result is the mean over queries. Arguments as in :func:`map_at_r`.

    {R_DOC}
    """
    return _r_metric("rp", embeddings, labels, gallery_embeddings, gallery_labels, metric,
                     chunk_size, gallery_chunk_size, unmatched, groups, gallery_groups)


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
                    gallery_groups=gallery_groups)
    (top_k,) = _check_visible_ks((top_k,), data, "top_k")
    curve = _at_k("recall", data, range(1, top_k + 1), chunk_size, gallery_chunk_size,
                  unmatched, "top_k")
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


# -- clustering metrics --------------------------------------------------------------------------


def _kmeans(embeddings, labels, num_clusters, seed, metric):
    """k-means cluster ids of the embeddings (scikit-learn, k-means++, one init)."""
    from sklearn.cluster import KMeans

    metric = check_metric(metric)
    labels = ops.convert_to_numpy(dml.cast_labels(labels)).astype(np.int64)
    x = ops.cast(dml.check_embeddings(embeddings), "float32")
    dml.check_batch_sizes(labels, x)
    _check_finite(x, "embeddings")
    if metric == "cosine":
        x = dml.l2_normalize(x)
    n = len(labels)
    if num_clusters is None:
        num_clusters = len(np.unique(labels))
    num_clusters = check_int("num_clusters", num_clusters)
    if num_clusters > n:
        raise ValueError(
            f"`num_clusters` must be at most the number of samples ({n}). "
            f"Received: num_clusters={num_clusters}"
        )
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool):
        raise ValueError(f"`seed` must be an integer. Received: seed={seed!r}")
    x = ops.convert_to_numpy(x)
    if metric == "l2":
        # Multiplied by a power of two where float32 squared distances (or their sums over the
        # samples) could overflow: the same clusters (tfdml.search.score_scale).
        x = x * np.float32(score_scale(float(np.abs(x).max(initial=0.0)), x.shape[1] * n, "l2"))
    km = KMeans(n_clusters=num_clusters, n_init=1, random_state=int(seed))
    return labels, km.fit_predict(x)


def _contingency(labels, clusters):
    _, li = np.unique(labels, return_inverse=True)
    _, ci = np.unique(clusters, return_inverse=True)
    table = np.zeros((li.max() + 1, ci.max() + 1), dtype=np.int64)
    np.add.at(table, (li, ci), 1)
    return table


def _entropy(counts):
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def nmi_score(labels, clusters) -> float:
    """NMI of two labelings: ``I(Y; C) / ((H(Y) + H(C)) / 2)`` (Manning et al. 2008).

    The arithmetic-mean normalization, the same as scikit-learn's
    ``normalized_mutual_info_score``. 1.0 when both labelings have a single group.
    A float labeling with a NaN or an Inf raises a ``ValueError`` naming it.
    """
    _check_finite_labeling(labels, "labels")
    _check_finite_labeling(clusters, "clusters")
    table = _contingency(np.asarray(labels).reshape(-1), np.asarray(clusters).reshape(-1))
    n = table.sum()
    h_y, h_c = _entropy(table.sum(axis=1)), _entropy(table.sum(axis=0))
    if h_y == 0.0 and h_c == 0.0:
        return 1.0
    nz = table > 0
    outer = np.outer(table.sum(axis=1), table.sum(axis=0))
    mi = float((table[nz] / n * np.log(table[nz] * n / outer[nz])).sum())
    return float(max(mi, 0.0) / ((h_y + h_c) / 2.0))


def pairwise_f1_score(labels, clusters) -> float:
    """Pairwise F1 of a clustering against classes (Manning et al. 2008, Sec. 16.3).

    Over all unordered pairs of samples: TP = same class and same cluster,
    FP = same cluster but different classes, FN = same class but different
    clusters; ``F1 = 2PR / (P + R)`` with ``P = TP/(TP+FP)``, ``R = TP/(TP+FN)``.
    0.0 when there is no pair in the same cluster or no pair in the same class.
    A float labeling with a NaN or an Inf raises a ``ValueError`` naming it.
    """
    _check_finite_labeling(labels, "labels")
    _check_finite_labeling(clusters, "clusters")
    table = _contingency(np.asarray(labels).reshape(-1), np.asarray(clusters).reshape(-1))

    def pairs(c):
        return float((c * (c - 1) // 2).sum())

    tp = pairs(table)
    same_cluster, same_class = pairs(table.sum(axis=0)), pairs(table.sum(axis=1))
    if tp == 0.0:
        return 0.0
    precision, recall = tp / same_cluster, tp / same_class
    return 2.0 * precision * recall / (precision + recall)


def _clustering_doc(name):
    """The arguments, results and example of :func:`nmi` and :func:`f1_clustering`."""
    return f"""\
Args:
    embeddings: ``[N, D]`` embeddings.
    labels: ``[N]`` integer class ids.
    num_clusters: number of k-means clusters. Defaults to `None` (the
        number of classes).
    seed: k-means random state. Defaults to `0`.
    metric: ``"cosine"`` (cluster L2-normalized embeddings) or
        ``"l2"`` (as given). Defaults to `"cosine"`.

Returns:
    A Python float in [0, 1].

Raises:
    {{RAISES}}

Examples:

>>> x = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]])
>>> tfdml.metrics.{name}(x, [0, 0, 1, 1])
1.0"""


@fill_doc(CLUSTERING_DOC=_clustering_doc("nmi"), RAISES=_nonfinite_raises("embeddings"))
def nmi(embeddings, labels, num_clusters=None, seed: int = 0, metric: str = "cosine") -> float:
    """Normalized mutual information between k-means clusters and classes.

    Runs scikit-learn's k-means (k-means++ init, one run, ``random_state=seed``)
    on the embeddings (L2-normalized first with ``metric="cosine"``) and
    returns ``I(Y; C) / ((H(Y) + H(C)) / 2)`` (Manning et al. 2008), equal to
    scikit-learn's ``normalized_mutual_info_score``. With ``num_clusters``
    above the number of classes it is the NMI+ of the easy-positive paper
    (Levi et al. 2021), which does not penalize classes split into
    sub-clusters as heavily. Singleton classes are ordinary classes here.

    {CLUSTERING_DOC}
    >>> nmi_plus = tfdml.metrics.nmi(emb, y, num_clusters=30 * len(np.unique(y)))
    """
    labels, clusters = _kmeans(embeddings, labels, num_clusters, seed, metric)
    return nmi_score(labels, clusters)


@fill_doc(CLUSTERING_DOC=_clustering_doc("f1_clustering"), RAISES=_nonfinite_raises("embeddings"))
def f1_clustering(embeddings, labels, num_clusters=None, seed: int = 0,
                  metric: str = "cosine") -> float:
    """Pairwise F1 of k-means clusters against classes (the F1 of LoOp and lifted structure).

    The k-means run is the one of :func:`nmi` (same arguments, same clusters).
    Over all unordered pairs of samples: TP = same class and same cluster,
    FP = same cluster, different classes, FN = same class, different clusters;
    ``P = TP / (TP + FP)``, ``R = TP / (TP + FN)``, ``F1 = 2PR / (P + R)``
    (Manning et al. 2008, Section 16.3, cited by the LoOp paper). It is 0.0 when
    no pair shares both class and cluster (e.g. every class a singleton).

    {CLUSTERING_DOC}
    """
    labels, clusters = _kmeans(embeddings, labels, num_clusters, seed, metric)
    return pairwise_f1_score(labels, clusters)


# -- training-time metric ---------------------------------------------------------------------


@keras.saving.register_keras_serializable(package="tfdml")
class ActiveAnchors(keras.metrics.Mean):
    """Fraction of anchors that have something to learn from under a tfdml loss.

    An anchor is *active* when the loss's miner finds it a triplet or pair (a
    positive and a negative in the batch, for most losses). A batch with no
    active anchor gives a loss of 0 and zero gradients, so training on such
    batches (e.g. shuffled batches over many classes with no two samples of
    a class) learns nothing without any error. Added to ``compile``, this
    metric puts the fraction into the ``fit`` logs (``active_anchors``,
    averaged over the anchors of the epoch so far), where the progress bar,
    ``History`` and ``tfdml.callbacks.ActiveAnchorsWarning`` see it.

    It mines once more with a copy of the loss (same configuration, its own
    random state, so the loss's random draws are not disturbed): about the
    cost of the loss's mining per step. For a
    :class:`tfdml.losses.CrossBatchMemory` it counts the anchors that the
    wrapped loss finds active within the batch. The proxy and classification
    losses have no mining (every sample is active) and are refused.

    Args:
        loss: the tfdml loss being trained (a :class:`tfdml.losses.MetricLoss`).
        name: the log name. Defaults to `"active_anchors"`.
        dtype: dtype of the result. Defaults to `None` (float32).

    Examples:

    >>> loss = tfdml.losses.TripletNCALoss()
    >>> model.compile(optimizer="adam", loss=loss,
    ...               metrics=[tfdml.metrics.ActiveAnchors(loss)])
    >>> model.fit(ds, epochs=3, callbacks=[tfdml.callbacks.ActiveAnchorsWarning()])
    """

    def __init__(self, loss, name="active_anchors", dtype=None):
        super().__init__(name=name, dtype=dtype)
        from tfdml.losses.base import resolve_loss
        from tfdml.losses.class_weights import ClassWeightLoss
        from tfdml.losses.xbm import CrossBatchMemory

        loss = resolve_loss(loss)
        if isinstance(loss, CrossBatchMemory):
            loss = loss.loss
        if isinstance(loss, ClassWeightLoss):
            raise ValueError(
                f"ActiveAnchors: {type(loss).__name__} compares every sample with the class "
                "vectors, so every anchor is active; there is nothing to measure.")
        self._loss_config = keras.saving.serialize_keras_object(loss)
        self._probe = keras.saving.deserialize_keras_object(self._loss_config)

    def update_state(self, y_true, y_pred, sample_weight=None):
        with warnings.catch_warnings():  # the copy's own warnings (e.g. an unowned beta)
            warnings.simplefilter("ignore")
            terms = self._probe.per_anchor(dml.cast_labels(y_true, "y_true"), y_pred)
        return super().update_state(ops.cast(terms.active, self.dtype), sample_weight)

    def get_config(self):
        return {"loss": self._loss_config, "name": self.name, "dtype": self.dtype}
