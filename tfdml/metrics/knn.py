"""k-NN classification accuracy: a labelled gallery votes for each query's class.

The evaluation of self-supervised embeddings without training a classifier (Wu et al.
2018, DINO): :func:`knn_accuracy`. Its inputs are checked and its neighbours found as
those of the retrieval metrics (:mod:`tfdml.metrics._neighbours`).
"""

from __future__ import annotations

import math
import numbers

import numpy as np
from keras import ops

from tfdml._argument_checks import check_int
from tfdml._docs import fill_doc, nonfinite_raises
from tfdml.metrics._neighbours import neighbour_chunks, prepare
from tfdml.metrics.retrieval import check_ks

__all__ = ["check_temperature", "knn_accuracy", "knn_predict"]

#: Entries of the ``[rows, k, k]`` vote comparison (and ``[rows, k, D]`` gathered
#: neighbours) held at a time.
_VOTE_ENTRIES = 1 << 22


def check_temperature(temperature):
    """``temperature`` as a positive finite float, or None; a ValueError naming it otherwise."""
    if temperature is None:
        return None
    if (not isinstance(temperature, numbers.Real) or isinstance(temperature, bool)
            or not math.isfinite(float(temperature)) or float(temperature) <= 0.0):
        raise ValueError("`temperature` must be None (a plain majority vote) or a positive "
                         f"finite number. Received: temperature={temperature!r}")
    return float(temperature)


def _similarities(queries, gallery, idx, metric):
    """``[n, k]`` float64 similarities of the queries to their neighbours ``idx``: the dot
    product of the normalized rows (``"cosine"``) or minus the Euclidean distance. The
    ``[rows, k, D]`` neighbours are gathered a few rows at a time."""
    out = np.empty(idx.shape)
    step = max(1, _VOTE_ENTRIES // (idx.shape[1] * gallery.shape[1]))
    for start in range(0, len(idx), step):
        rows = slice(start, start + step)
        neighbours = gallery[idx[rows]].astype(np.float64)  # [n, k, D]
        if metric == "cosine":
            out[rows] = np.einsum("nd,nkd->nk", queries[rows], neighbours)
        else:
            diff = neighbours - queries[rows, None, :]
            out[rows] = -np.sqrt(np.einsum("nkd,nkd->nk", diff, diff))
    return out


def _vote(codes, weights):
    """Per row, the class code with the largest total weight among its ``k`` neighbours'
    ``codes``; ties go to the smallest code."""
    k = codes.shape[1]
    out = np.empty(len(codes), np.int64)
    step = max(1, _VOTE_ENTRIES // (k * k))
    for start in range(0, len(codes), step):
        c, w = codes[start : start + step], weights[start : start + step]
        same = c[:, :, None] == c[:, None, :]  # [n, k, k]: neighbour j, neighbour j2 agree
        votes = (same * w[:, None, :]).sum(axis=2)  # the total of neighbour j's class
        best = votes.max(axis=1, keepdims=True)
        out[start : start + step] = np.where(votes >= best, c, np.iinfo(np.int64).max).min(1)
    return out


def knn_predict(data, k, temperature, chunk_size, gallery_chunk_size):
    """The class each query of a :class:`tfdml.metrics._neighbours.Retrieval` gets from the
    vote of its ``k`` nearest gallery items: an ``[Q]`` int64 array of gallery labels."""
    classes, codes = np.unique(data.gallery_labels, return_inverse=True)
    codes = codes.reshape(-1)
    predicted = np.empty(len(data.labels), np.int64)
    queries = gallery = None
    if temperature is not None:
        queries = np.asarray(ops.convert_to_numpy(data.queries), np.float32)
        gallery = np.asarray(ops.convert_to_numpy(data.gallery), np.float32)
    for start, idx in neighbour_chunks(data.queries, data.gallery, k, data.exclude_self,
                                       data.metric, chunk_size, gallery_chunk_size):
        if temperature is None:
            weights = np.ones(idx.shape)
        else:
            sims = _similarities(queries[start : start + len(idx)], gallery, idx, data.metric)
            # exp(s / T) up to a factor per query (its largest weight is 1): the same vote,
            # and no overflow or underflow to all zeros.
            weights = np.exp((sims - sims.max(axis=1, keepdims=True)) / temperature)
        predicted[start : start + len(idx)] = classes[_vote(codes[idx], weights)]
    return predicted


@fill_doc(RAISES=nonfinite_raises("embeddings", "gallery_embeddings"))
def knn_accuracy(embeddings, labels, gallery_embeddings, gallery_labels, k: int = 20,
                 metric: str = "cosine", temperature=None, chunk_size: int = 1024,
                 gallery_chunk_size: int = 65536) -> float:
    """k-NN classification accuracy: each query's class voted by its k nearest gallery items.

    The standard evaluation of self-supervised embeddings without a trained
    classifier: the gallery is the labelled training set, the queries the
    validation set. For a query, its ``k`` nearest gallery items ``N_k`` (exact
    search, ties to the lower gallery index, as in :func:`recall_at_k`) vote;
    the predicted class is

    ``argmax_c sum_{i in N_k, y_i = c} w_i``

    with ``w_i = 1`` (``temperature=None``: a plain majority vote) or
    ``w_i = exp(s_i / T)`` (``temperature=T``: the weighted vote of Wu et al.
    2018, used by DINO's k-NN evaluation with ``k = 20``, ``T = 0.07``),
    ``s_i`` the cosine similarity of the query and item ``i`` (with
    ``metric="l2"``, minus their Euclidean distance). Ties between classes go to
    the smallest label. The result is the share of queries whose predicted
    class is their label; a query whose class is not in the gallery is always
    wrong. Nothing is excluded: the query and gallery sets are separate.

    Args:
        embeddings: ``[Q, D]`` query embeddings.
        labels: ``[Q]`` integer class ids of the queries.
        gallery_embeddings: ``[G, D]`` embeddings of the labelled gallery.
        gallery_labels: ``[G]`` integer class ids of the gallery.
        k: neighbours that vote, at most ``G``. Defaults to `20`.
        metric: ``"cosine"`` or ``"l2"``. Defaults to `"cosine"`.
        temperature: ``None`` for a plain majority vote, or ``T > 0`` for
            votes weighted by ``exp(s / T)``. Defaults to `None`.
        chunk_size: queries per matrix product. Defaults to `1024`.
        gallery_chunk_size: gallery items per matrix product. Defaults to `65536`.

    Returns:
        A Python float in [0, 1].

    Raises:
        {RAISES}

    Examples:

    >>> gallery = np.array([[1.0, 0.0], [0.9, 0.2], [0.0, 1.0], [0.1, 0.9]])
    >>> queries = np.array([[0.8, 0.1], [0.2, 0.8]])
    >>> tfdml.metrics.knn_accuracy(queries, [0, 1], gallery, [0, 0, 1, 1], k=3)
    1.0
    >>> tfdml.metrics.knn_accuracy(model.predict(x_val), y_val, model.predict(x_train),
    ...                            y_train, k=20, temperature=0.07)

    Reference:
        Wu, Xiong, Yu, Lin. Unsupervised feature learning via non-parametric
        instance discrimination. CVPR 2018.
    """
    temperature = check_temperature(temperature)
    check_int("k", k)
    if gallery_embeddings is None:
        raise ValueError("`gallery_embeddings` is required: the labelled items that vote. "
                         "Received: gallery_embeddings=None")
    data = prepare(embeddings, labels, gallery_embeddings, gallery_labels, metric, chunk_size,
                   gallery_chunk_size, "miss")
    (k,) = check_ks((k,), int(data.gallery.shape[0]), "k")
    predicted = knn_predict(data, k, temperature, chunk_size, gallery_chunk_size)
    return float(np.mean(predicted == data.labels))
