"""Retrieval metrics: Recall@K, Precision@K, MAP@K, MAP@R, R-precision, CMC, VehicleID.

The conventions (metric, self-exclusion, groups, non-finite rows, ties, unmatched
queries, multi-hot labels) are those of :mod:`tfdml.metrics`. The metrics here turn neighbours into
scores; the inputs' checks and the neighbours themselves (exact, or through an
approximate ``index=``) come from :mod:`tfdml.metrics._neighbours`.
"""

from __future__ import annotations

import numpy as np
from keras import ops

from tfdml import ops as dml
from tfdml._argument_checks import check_int
from tfdml._docs import fill_doc, nonfinite_raises
from tfdml._embeddings import check_batch_sizes, check_embeddings
from tfdml._labels import is_multi_label
from tfdml.metrics._neighbours import (
    check_metric,
    data_match_counts,
    exclusion_counts,
    ideal_gains,
    prepare,
    relevance,
    report_index,
)
from tfdml.search import check_finite

# -- docstring text shared by the metrics --------------------------------------------------------

_QUERIES = """\
embeddings: ``[Q, D]`` query embeddings.
labels: ``[Q]`` integer class ids, or ``[Q, L]`` multi-hot label sets
    (0/1, ``L >= 2``): a gallery item is then relevant (a hit, counted in
    ``R``) when it shares a label with the query (see ``min_jaccard``)."""

_GALLERY = """\
gallery_embeddings: ``[G, D]`` gallery embeddings. Defaults to `None`
    (the queries themselves, self excluded).
gallery_labels: ``[G]`` class ids of the gallery (``[G, L]`` multi-hot with
    multi-hot ``labels``, the same ``L``). Defaults to `None`."""

_MIN_JACCARD = """\
min_jaccard: multi-hot labels: a gallery item is relevant when the Jaccard
    similarity ``|A & B| / |A | B|`` of its label set and the query's is at
    least this value in ``(0, 1]``; ignored for class ids. Defaults to
    `None` (relevant when the sets share a label)."""

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


_RETRIEVAL_DOCS = {"QUERIES": _QUERIES, "GALLERY": _GALLERY, "SEARCH": _SEARCH,
                   "GROUPS": _GROUPS, "MIN_JACCARD": _MIN_JACCARD,
                   "RAISES": nonfinite_raises("embeddings", "gallery_embeddings")}


# -- validation ---------------------------------------------------------------------------------


def check_ks(ks, gallery_size, name="ks"):
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


def _average(values, matched, unmatched):
    """Mean of per-query ``values`` ([Q] or [Q, m]); unmatched queries left out or counted 0."""
    values = np.asarray(values, dtype=np.float64)
    if unmatched == "miss":
        values = np.where(matched.reshape((-1,) + (1,) * (values.ndim - 1)), values, 0.0)
        return values.mean(axis=0)
    if not matched.any():
        return np.full(values.shape[1:], np.nan)
    return values[matched].mean(axis=0)


def _check_visible_ks(ks, data, name="ks"):
    """:func:`check_ks` against the gallery items every query can see: the gallery size
    minus the most items left out of one query's ranking."""
    num_gallery = int(data.gallery.shape[0])
    most = int(exclusion_counts(len(data.labels), data.exclude_self, data.groups,
                                data.gallery_groups).max())
    if data.groups is None:
        return check_ks(ks, num_gallery - most, name)
    ks = check_ks(ks, num_gallery, name)
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


def _graded_ap(gains, rank):
    """``[n, k]`` ``sum_{i <= K} (g_i / i) sum_{j <= i} g_j`` at every K of the gains
    ``g`` (``[n, k]``, in rank order): the sum of :func:`map_at_k` with ``graded=True``."""
    return np.cumsum(np.cumsum(gains, axis=1) / rank * gains, axis=1)


def at_k(value, data, ks, chunk_size, gallery_chunk_size, unmatched, name="ks", graded=False):
    """``{k: mean over queries}`` of ``value`` at each K: ``"recall"`` (a relevant item in
    the top K), ``"precision"`` (their share of the top K) or ``"map"`` (AP@K; with
    ``graded`` and multi-hot labels, the graded AP@K of :func:`map_at_k`)."""
    ks = _check_visible_ks(ks, data, name)
    kmax = max(ks)
    graded = graded and value == "map" and data.labels.ndim == 2  # class ids: gains 0/1
    r, best = ideal_gains(data, kmax) if graded else (data_match_counts(data), None)
    cut = np.array(ks) - 1
    values = np.zeros((len(data.labels), len(ks)))
    rank = np.arange(1, kmax + 1)
    for start, rel in relevance(data, kmax, chunk_size, gallery_chunk_size, graded):
        stop = start + len(rel)
        correct = np.cumsum(rel, axis=1)
        if value == "recall":
            values[start:stop] = correct[:, cut] > 0
        elif value == "precision":
            values[start:stop] = correct[:, cut] / (cut + 1.0)
        elif graded:
            ideal = _graded_ap(best[start:stop], rank)[:, cut]
            values[start:stop] = np.divide(_graded_ap(rel, rank)[:, cut], ideal,
                                           out=np.zeros_like(ideal), where=ideal > 0)
        else:
            ap = np.cumsum(correct / rank * rel, axis=1)[:, cut]
            values[start:stop] = ap / np.maximum(np.minimum(cut + 1, r[start:stop, None]), 1)
    values = _average(values, r > 0, unmatched)
    return {k: float(v) for k, v in zip(ks, values, strict=True)}


def _metric_at_k(value, embeddings, labels, ks, gallery_embeddings, gallery_labels, metric,
                 chunk_size, gallery_chunk_size, unmatched, groups, gallery_groups, index,
                 min_jaccard, graded=False):
    """Recall, precision or MAP at each K of ``ks``: the body of the three ``*_at_k``."""
    data = prepare(embeddings, labels, gallery_embeddings, gallery_labels, metric, chunk_size,
                   gallery_chunk_size, unmatched, groups=groups, gallery_groups=gallery_groups,
                   index=index, multi_label=True, min_jaccard=min_jaccard)
    values = at_k(value, data, ks, chunk_size, gallery_chunk_size, unmatched, graded=graded)
    report_index(data)
    return values


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
    min_jaccard=None,
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
        {MIN_JACCARD}

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
    >>> tfdml.metrics.recall_at_k(x, [[1, 0, 1], [0, 0, 1], [0, 1, 0], [1, 0, 0]], ks=(1,))
    {1: 0.5}
    """
    return _metric_at_k("recall", embeddings, labels, ks, gallery_embeddings, gallery_labels,
                        metric, chunk_size, gallery_chunk_size, unmatched, groups,
                        gallery_groups, index, min_jaccard)


@fill_doc(**_RETRIEVAL_DOCS)
def precision_at_k(embeddings, labels, ks=(1, 5, 10), gallery_embeddings=None,
                   gallery_labels=None, metric: str = "cosine", chunk_size: int = 1024,
                   gallery_chunk_size: int = 65536, unmatched: str = "exclude", groups=None,
                   gallery_groups=None, index=None, min_jaccard=None) -> dict:
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
        {MIN_JACCARD}

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
    return _metric_at_k("precision", embeddings, labels, ks, gallery_embeddings, gallery_labels,
                        metric, chunk_size, gallery_chunk_size, unmatched, groups,
                        gallery_groups, index, min_jaccard)


@fill_doc(**_RETRIEVAL_DOCS)
def map_at_k(embeddings, labels, ks=(1, 5, 10), gallery_embeddings=None,
             gallery_labels=None, metric: str = "cosine", chunk_size: int = 1024,
             gallery_chunk_size: int = 65536, unmatched: str = "exclude", groups=None,
             gallery_groups=None, index=None, min_jaccard=None, graded: bool = False) -> dict:
    """MAP@K: the mean average precision over a query's K nearest gallery items.

    For a query with ``R`` same-class items in the gallery (itself and its
    group left out), ``AP@K = (1 / min(K, R)) sum_{i=1..K} P(i) rel(i)``, where
    ``rel(i)`` is 1 when the ``i``-th neighbour has the query's class and
    ``P(i)`` is the precision at rank ``i``; MAP@K is its mean over queries. A
    perfect ranking scores 1 whatever ``R``. This is open-metric-learning's
    ``map@k``; with ``K = R`` for every query it is MAP@R (:func:`map_at_r`).
    Neighbours, self-exclusion and ties as in :func:`recall_at_k`.

    **Graded** (``graded=True``, multi-hot labels): the generalized average
    precision of Kishida (2005), with the gain ``g_i`` of the ``i``-th
    neighbour the Jaccard similarity ``|A & B| / |A | B|`` of its label set and
    the query's (0 when it is not relevant, see ``min_jaccard``):
    ``gAP@K = sum_{i=1..K} (g_i / i) sum_{j=1..i} g_j`` divided by the same sum
    over the ideal gains ``y_1 >= y_2 >= ...`` (the gains of all the gallery
    items the query ranks, sorted in decreasing order). A perfect ranking (by
    decreasing gain) scores 1; with 0/1 gains (class ids, or label sets that
    are equal or disjoint) it is AP@K above. Queries with ``R = 0`` are
    ``unmatched``.

    Args:
        {QUERIES}
        ks: the values of K. Defaults to `(1, 5, 10)`.
        {GALLERY}
        {SEARCH}
        unmatched: queries with ``R = 0`` (undefined AP): ``"exclude"`` or
            ``"miss"`` (a 0). Defaults to `"exclude"`.
        {GROUPS}
        {MIN_JACCARD}
        graded: the graded AP of multi-hot labels (above) instead of the
            binary one. Defaults to `False`.

    Returns:
        ``{k: map}`` with Python floats in [0, 1] (``nan`` if every query is
        excluded).

    Raises:
        {RAISES}

    Examples:

    >>> x = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.2, 0.9], [0.7, 0.7]])
    >>> tfdml.metrics.map_at_k(x, [0, 0, 1, 1, 1], ks=(1, 2))
    {1: 1.0, 2: 0.9}
    >>> sets = [[1, 1, 0], [1, 0, 0], [0, 1, 1], [0, 1, 1], [1, 1, 1]]  # multi-hot
    >>> tfdml.metrics.map_at_k(x, sets, ks=(2,))  # every neighbour shares a label
    {2: 1.0}
    >>> tfdml.metrics.map_at_k(x, sets, ks=(2,), graded=True)  # partial overlaps gain less
    {2: 0.9110849056603774}

    Reference:
        Kishida. Property of Average Precision and its Generalization: An
        Examination of Evaluation Indicator for Information Retrieval
        Experiments. NII Technical Report NII-2005-014E, 2005.
    """
    return _metric_at_k("map", embeddings, labels, ks, gallery_embeddings, gallery_labels,
                        metric, chunk_size, gallery_chunk_size, unmatched, groups,
                        gallery_groups, index, min_jaccard, graded)


def _r_metric(value, embeddings, labels, gallery_embeddings, gallery_labels, metric, chunk_size,
              gallery_chunk_size, unmatched, groups, gallery_groups, index, min_jaccard):
    """The mean over queries of ``value``: ``"ap"`` (average precision at R, for MAP@R) or
    ``"rp"`` (R-precision)."""
    data = prepare(embeddings, labels, gallery_embeddings, gallery_labels, metric, chunk_size,
                   gallery_chunk_size, unmatched, groups=groups, gallery_groups=gallery_groups,
                   index=index, multi_label=True, min_jaccard=min_jaccard)
    r = data_match_counts(data)
    matched = r > 0
    ap = np.zeros(len(data.labels))
    rp = np.zeros(len(data.labels))
    kmax = int(r.max())
    if kmax > 0:
        rank = np.arange(1, kmax + 1)
        for start, rel in relevance(data, kmax, chunk_size, gallery_chunk_size):
            stop = start + len(rel)
            # R <= the items left for a query, so its first R columns are never padding.
            rel = rel & (rank[None, :] <= r[start:stop, None])
            precision = np.cumsum(rel, axis=1) / rank[None, :]
            denom = np.maximum(r[start:stop], 1)
            ap[start:stop] = (precision * rel).sum(axis=1) / denom
            rp[start:stop] = rel.sum(axis=1) / denom
    report_index(data)
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
    {{MIN_JACCARD}}

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
             index=None, min_jaccard=None) -> float:
    """MAP@R, the mean average precision at R of Musgrave et al. (2020).

    For a query with ``R`` same-class items in the gallery (itself excluded
    when the queries are the gallery), ``MAP@R = (1/R) sum_{i=1..R} P(i)``,
    where ``P(i)`` is the precision at rank ``i`` if the ``i``-th neighbour has
    the query's class and 0 otherwise. The result is the mean over queries.
    Neighbours as in :func:`recall_at_k` (exact, ties to the lower gallery
    index). Memory grows with the largest ``R`` (``chunk_size x max R``). With
    multi-hot labels, "the query's class" reads "relevant to the query" (sharing
    a label, see ``min_jaccard``), for ``R`` as for the hits.

    {R_DOC}
    """
    return _r_metric("ap", embeddings, labels, gallery_embeddings, gallery_labels, metric,
                     chunk_size, gallery_chunk_size, unmatched, groups, gallery_groups, index,
                     min_jaccard)


@fill_doc(R_DOC=_r_doc("r_precision"), **_RETRIEVAL_DOCS)
def r_precision(embeddings, labels, gallery_embeddings=None, gallery_labels=None,
                metric: str = "cosine", chunk_size: int = 1024, gallery_chunk_size: int = 65536,
                unmatched: str = "exclude", groups=None, gallery_groups=None,
                index=None, min_jaccard=None) -> float:
    """R-precision: the share of same-class items among a query's R nearest neighbours.

    ``R`` is the number of same-class items in the gallery for that query (itself
    excluded when the queries are the gallery), as in Musgrave et al. (2020).
    The result is the mean over queries. Arguments as in :func:`map_at_r`;
    multi-hot labels count the relevant items instead of the same-class ones.

    {R_DOC}
    """
    return _r_metric("rp", embeddings, labels, gallery_embeddings, gallery_labels, metric,
                     chunk_size, gallery_chunk_size, unmatched, groups, gallery_groups, index,
                     min_jaccard)


@fill_doc(SEARCH=_SEARCH, MIN_JACCARD=_MIN_JACCARD,
          RAISES=nonfinite_raises("query_embeddings", "gallery_embeddings"))
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
    min_jaccard=None,
) -> np.ndarray:
    """Cumulative match characteristic: top-k match rates for k = 1..``top_k``.

    ``cmc(...)[k - 1]`` is the share of queries whose nearest gallery item of
    their identity is among their ``k`` nearest gallery items (the top-k match
    rate of re-identification). Query and gallery sets are separate; nothing
    is excluded but the gallery items of a query's group. Ties as in
    :func:`recall_at_k`.

    Args:
        query_embeddings: ``[Q, D]``.
        query_labels: ``[Q]`` integer identities, or ``[Q, L]`` multi-hot label
            sets (a gallery item matches when it is relevant: sharing a label).
        gallery_embeddings: ``[G, D]``.
        gallery_labels: ``[G]`` integer identities (``[G, L]`` multi-hot).
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
        {MIN_JACCARD}

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
    data = prepare(query_embeddings, query_labels, gallery_embeddings, gallery_labels, metric,
                   chunk_size, gallery_chunk_size, unmatched,
                   names=("query_embeddings", "query_labels"), groups=groups,
                   gallery_groups=gallery_groups, index=index, multi_label=True,
                   min_jaccard=min_jaccard)
    (top_k,) = _check_visible_ks((top_k,), data, "top_k")
    curve = at_k("recall", data, range(1, top_k + 1), chunk_size, gallery_chunk_size,
                  unmatched, "top_k")
    report_index(data)
    return np.array([curve[k] for k in range(1, top_k + 1)], dtype=np.float64)


@fill_doc(RAISES=nonfinite_raises("embeddings"))
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
        labels: ``[N]`` integer vehicle ids (one per image: multi-hot label
            sets are refused, the protocol draws one image per identity).
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
    if is_multi_label(labels):
        raise ValueError("`labels` must be [N] integer vehicle ids: the VehicleID protocol "
                         "draws one gallery image per identity, so each image has one. "
                         f"Received: labels.shape={tuple(np.shape(labels))}")
    labels_np = ops.convert_to_numpy(dml.cast_labels(labels)).astype(np.int64)
    x = check_embeddings(embeddings)
    check_batch_sizes(labels_np, x)
    check_finite(x, "embeddings")
    classes, inverse = np.unique(labels_np, return_inverse=True)
    ks = check_ks(ks, len(classes))
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

