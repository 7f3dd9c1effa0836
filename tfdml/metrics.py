"""Retrieval and clustering metrics on embeddings.

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
  (``"exclude"``, as in Musgrave et al. 2020 and pytorch-metric-learning).
  When every query is excluded the result is ``nan``.

:class:`ActiveAnchors` is a Keras metric for ``model.compile``: the fraction of
anchors of the training batches that a tfdml loss learns from.
"""

from __future__ import annotations

import textwrap
import warnings

import keras
import numpy as np
from keras import ops

from tfdml import ops as dml
from tfdml._checks import check_choice, check_int
from tfdml._docs import fill_doc
from tfdml.search import at_indices as _at_indices
from tfdml.search import check_finite as _check_finite
from tfdml.search import neighbours, score_scale

__all__ = [
    "ActiveAnchors",
    "cmc",
    "f1_clustering",
    "map_at_r",
    "nmi",
    "nmi_score",
    "pairwise_f1_score",
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


def _nonfinite_raises(*names):
    """The ``Raises`` entry of a metric that refuses non-finite rows of ``names``."""
    rows = " or ".join(f"``{name}``" for name in names)
    return textwrap.fill(f"ValueError: bad arguments, or a row of {rows} that holds a NaN or an "
                         "Inf (the message names the argument and the rows).", width=70,
                         subsequent_indent="    ")


_RETRIEVAL_DOCS = {"QUERIES": _QUERIES, "GALLERY": _GALLERY, "SEARCH": _SEARCH,
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


def _prepare(embeddings, labels, gallery_embeddings, gallery_labels, metric, chunk_size,
             gallery_chunk_size, unmatched, names=("embeddings", "labels")):
    """Validates the inputs; returns float32 queries/gallery, int64 label arrays, exclude_self
    and the metric (:func:`check_metric`)."""
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
    if metric == "cosine":
        queries = dml.l2_normalize(queries)
        gallery = queries if exclude_self else dml.l2_normalize(gallery)
    return (queries, gallery, ops.convert_to_numpy(labels).astype(np.int64),
            ops.convert_to_numpy(gallery_labels).astype(np.int64), exclude_self, metric)


# -- exact nearest neighbours: tfdml.search ------------------------------------------------------


def _neighbour_chunks(queries, gallery, k, exclude_self, metric, chunk_size, gallery_chunk_size):
    """``(start, indices)`` of :func:`tfdml.search.neighbours`."""
    for start, _, idx in neighbours(queries, gallery, k, metric, exclude_self,
                                    chunk_size, gallery_chunk_size):
        yield start, idx


def _average(values, matched, unmatched):
    """Mean of per-query ``values`` ([Q] or [Q, m]); unmatched queries left out or counted 0."""
    values = np.asarray(values, dtype=np.float64)
    if unmatched == "miss":
        values = np.where(matched.reshape((-1,) + (1,) * (values.ndim - 1)), values, 0.0)
        return values.mean(axis=0)
    if not matched.any():
        return np.full(values.shape[1:], np.nan)
    return values[matched].mean(axis=0)


def _match_counts(labels, gallery_labels, exclude_self):
    """``R`` per query: the number of gallery items of its class, itself excluded."""
    classes, counts = np.unique(gallery_labels, return_counts=True)
    pos = np.searchsorted(classes, labels)
    pos = np.minimum(pos, len(classes) - 1)
    found = classes[pos] == labels
    return np.where(found, counts[pos], 0) - int(exclude_self)


# -- retrieval metrics ---------------------------------------------------------------------------


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
) -> dict:
    """Recall@K of metric learning: the share of queries with a same-class item in their top K.

    A query is a hit at K when any of its K nearest gallery items has its label
    (Song et al. 2016; the FAPPY paper's footnote 1). Without a separate
    gallery every embedding is a query against all the others, itself excluded
    (CUB-200, Cars196, SOP); with ``gallery_embeddings`` the query and gallery
    sets are distinct and nothing is excluded (In-shop).

    Args:
        {QUERIES}
        ks: the values of K. Defaults to `(1, 2, 4, 8)`.
        {GALLERY}
        {SEARCH}
        unmatched: what a query with no same-class item in the gallery counts as:
            ``"miss"`` (a 0) or ``"exclude"`` (left out of the average).
            Defaults to `"miss"` (all queries count).

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
    queries, gallery, labels, gallery_labels, exclude_self, metric = _prepare(
        embeddings, labels, gallery_embeddings, gallery_labels, metric, chunk_size,
        gallery_chunk_size, unmatched)
    ks = _check_ks(ks, int(gallery.shape[0]) - int(exclude_self))
    kmax = max(ks)
    hits = np.zeros((len(labels), len(ks)), dtype=bool)
    for start, idx in _neighbour_chunks(queries, gallery, kmax, exclude_self, metric,
                                        chunk_size, gallery_chunk_size):
        same = gallery_labels[idx] == labels[start : start + len(idx), None]
        first = np.where(same.any(axis=1), same.argmax(axis=1), kmax)
        hits[start : start + len(idx)] = first[:, None] < np.array(ks)[None, :]
    matched = _match_counts(labels, gallery_labels, exclude_self) > 0
    values = _average(hits, matched, unmatched)
    return {k: float(v) for k, v in zip(ks, values, strict=True)}


def _r_metric(value, embeddings, labels, gallery_embeddings, gallery_labels, metric, chunk_size,
              gallery_chunk_size, unmatched):
    """The mean over queries of ``value``: ``"ap"`` (average precision at R, for MAP@R) or
    ``"rp"`` (R-precision)."""
    queries, gallery, labels, gallery_labels, exclude_self, metric = _prepare(
        embeddings, labels, gallery_embeddings, gallery_labels, metric, chunk_size,
        gallery_chunk_size, unmatched)
    r = _match_counts(labels, gallery_labels, exclude_self)
    matched = r > 0
    ap = np.zeros(len(labels))
    rp = np.zeros(len(labels))
    kmax = int(r.max())
    if kmax > 0:
        for start, idx in _neighbour_chunks(queries, gallery, kmax, exclude_self, metric,
                                            chunk_size, gallery_chunk_size):
            stop = start + len(idx)
            rel = gallery_labels[idx] == labels[start:stop, None]
            rank = np.arange(1, kmax + 1)
            within = rank[None, :] <= r[start:stop, None]
            rel = rel & within
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
             unmatched: str = "exclude") -> float:
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
                     chunk_size, gallery_chunk_size, unmatched)


@fill_doc(R_DOC=_r_doc("r_precision"), **_RETRIEVAL_DOCS)
def r_precision(embeddings, labels, gallery_embeddings=None, gallery_labels=None,
                metric: str = "cosine", chunk_size: int = 1024, gallery_chunk_size: int = 65536,
                unmatched: str = "exclude") -> float:
    """R-precision: the share of same-class items among a query's R nearest neighbours.

    ``R`` is the number of same-class items in the gallery for that query (itself
    excluded when the queries are the gallery), as in Musgrave et al. (2020).
    The result is the mean over queries. Arguments as in :func:`map_at_r`.

    {R_DOC}
    """
    return _r_metric("rp", embeddings, labels, gallery_embeddings, gallery_labels, metric,
                     chunk_size, gallery_chunk_size, unmatched)


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
) -> np.ndarray:
    """Cumulative match characteristic: top-k match rates for k = 1..``top_k``.

    ``cmc(...)[k - 1]`` is the share of queries whose nearest gallery item of
    their identity is among their ``k`` nearest gallery items (the top-k match
    rate of re-identification). Query and gallery sets are separate; nothing
    is excluded. Ties as in :func:`recall_at_k`.

    Args:
        query_embeddings: ``[Q, D]``.
        query_labels: ``[Q]`` integer identities.
        gallery_embeddings: ``[G, D]``.
        gallery_labels: ``[G]`` integer identities.
        top_k: length of the curve, at most ``G``. Defaults to `20`.
        {SEARCH}
        unmatched: queries whose identity is not in the gallery: ``"miss"``
            or ``"exclude"``. Defaults to `"miss"`.

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
    queries, gallery, labels, gallery_labels, _, metric = _prepare(
        query_embeddings, query_labels, gallery_embeddings, gallery_labels, metric, chunk_size,
        gallery_chunk_size, unmatched, names=("query_embeddings", "query_labels"))
    (top_k,) = _check_ks((top_k,), int(gallery.shape[0]), "top_k")
    first = np.full(len(labels), top_k)
    for start, idx in _neighbour_chunks(queries, gallery, top_k, False, metric, chunk_size,
                                        gallery_chunk_size):
        same = gallery_labels[idx] == labels[start : start + len(idx), None]
        first[start : start + len(idx)] = np.where(same.any(axis=1), same.argmax(axis=1), top_k)
    curve = first[:, None] < np.arange(1, top_k + 1)[None, :]
    matched = _match_counts(labels, gallery_labels, False) > 0
    return _average(curve, matched, unmatched)


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
