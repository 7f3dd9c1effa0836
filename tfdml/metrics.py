"""Retrieval metrics on embeddings.

Nearest neighbours are exact: the queries are processed in chunks, each chunk
multiplied against the whole gallery and reduced to its top-k, so memory is
``chunk_size x gallery size`` rather than ``queries x gallery``.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfdml import ops

__all__ = ["recall_at_k"]

METRICS = ("cosine", "euclidean")


def _check_ks(ks, gallery_size):
    ks = tuple(ks)
    if not ks or any(not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1 for k in ks):
        raise ValueError(f"`ks` must be a non-empty sequence of integers >= 1. Received: ks={ks!r}")
    if max(ks) > gallery_size:
        raise ValueError(
            f"`ks` asks for {max(ks)} neighbours but the gallery offers {gallery_size} "
            f"per query. Received: ks={ks!r}"
        )
    return tuple(int(k) for k in ks)


def _neighbour_labels(queries, gallery, gallery_labels, k, exclude_self, metric, chunk_size):
    """Labels of the ``k`` nearest gallery items of every query, ``[Q, k]`` int32."""
    if metric == "cosine":
        queries = ops.l2_normalize(queries)
        gallery = ops.l2_normalize(gallery)
    num_queries = int(queries.shape[0])
    out = []
    for start in range(0, num_queries, chunk_size):
        chunk = queries[start : start + chunk_size]
        if metric == "cosine":
            scores = ops.pairwise_similarity(chunk, gallery)
        else:
            scores = -ops.pairwise_distance(chunk, gallery, squared=True)
        if exclude_self:
            rows = tf.range(start, start + int(chunk.shape[0]))
            cols = tf.range(int(gallery.shape[0]))
            is_self = tf.equal(rows[:, None], cols[None, :])
            scores = tf.where(is_self, tf.constant(-np.inf, scores.dtype), scores)
        _, idx = tf.math.top_k(scores, k=k)
        out.append(tf.gather(gallery_labels, idx))
    return tf.concat(out, axis=0)


def recall_at_k(
    embeddings,
    labels,
    ks=(1, 2, 4, 8),
    gallery_embeddings=None,
    gallery_labels=None,
    metric: str = "cosine",
    chunk_size: int = 1024,
) -> dict:
    """Recall@K of metric learning: the share of queries with a same-class item in their top K.

    A query counts as a hit at K when any of its K nearest gallery items has
    its label. Without a separate gallery, every embedding is a query against
    all the others (itself excluded), as for CUB-200, Cars196 and SOP; with
    ``gallery_embeddings`` the query and gallery sets are distinct (In-shop).

    Args:
        embeddings: ``[Q, D]`` query embeddings.
        labels: ``[Q]`` integer class ids.
        ks: the values of K. Defaults to `(1, 2, 4, 8)`.
        gallery_embeddings: ``[G, D]`` gallery embeddings. Defaults to `None`
            (the queries themselves, self excluded).
        gallery_labels: ``[G]`` class ids of the gallery.
        metric: ``"cosine"`` or ``"euclidean"``. Defaults to `"cosine"`.
        chunk_size: queries per matrix product. Defaults to `1024`.

    Returns:
        ``{k: recall}`` with Python floats in [0, 1].

    Examples:

    >>> tfdml.metrics.recall_at_k(model.predict(x_test), y_test, ks=(1, 2, 4, 8))
    {1: 0.62, 2: 0.74, 4: 0.83, 8: 0.89}
    """
    if metric not in METRICS:
        raise ValueError(f"`metric` must be one of {METRICS}. Received: metric={metric!r}")
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"`chunk_size` must be an integer >= 1. Received: chunk_size={chunk_size!r}")
    labels = ops.cast_labels(labels)
    queries = tf.cast(ops.check_embeddings(embeddings), tf.float32)
    ops.check_batch_sizes(labels, queries)
    exclude_self = gallery_embeddings is None
    if exclude_self:
        if gallery_labels is not None:
            raise ValueError("`gallery_labels` was given without `gallery_embeddings`.")
        gallery, gallery_labels = queries, labels
    else:
        if gallery_labels is None:
            raise ValueError("`gallery_embeddings` was given without `gallery_labels`.")
        gallery = tf.cast(ops.check_embeddings(gallery_embeddings, "gallery_embeddings"), tf.float32)
        gallery_labels = ops.cast_labels(gallery_labels, "gallery_labels")
        ops.check_batch_sizes(gallery_labels, gallery, "gallery_labels", "gallery_embeddings")
        if gallery.shape[-1] != queries.shape[-1]:
            raise ValueError(
                "`gallery_embeddings` and `embeddings` must have the same embedding size. "
                f"Received: {gallery.shape} and {queries.shape}"
            )
    labels, gallery_labels = ops.same_label_dtype(labels, gallery_labels)
    ks = _check_ks(ks, int(gallery.shape[0]) - int(exclude_self))
    neighbours = _neighbour_labels(
        queries, gallery, gallery_labels, max(ks), exclude_self, metric, chunk_size
    )
    hits = tf.equal(neighbours, labels[:, None]).numpy()
    return {k: float(np.mean(hits[:, :k].any(axis=1))) for k in ks}
