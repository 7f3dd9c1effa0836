"""Clustering metrics: NMI (and NMI+) and pairwise F1 of k-means clusters against classes."""

from __future__ import annotations

import numpy as np
from keras import ops

from tfdml import ops as dml
from tfdml._argument_checks import check_int
from tfdml._docs import fill_doc, nonfinite_raises
from tfdml._embeddings import check_batch_sizes, check_embeddings
from tfdml._labels import check_finite_labeling, is_multi_label
from tfdml.metrics._neighbours import check_metric
from tfdml.search import check_finite as _check_finite
from tfdml.search import score_scale

# -- k-means and the scores of a labeling --------------------------------------------------------------------------


def _one_class_each(labels, name="labels"):
    """Raises a ValueError naming ``name`` for ``[N, L]`` multi-hot labels: a clustering
    is scored against one class per sample."""
    if is_multi_label(labels):
        raise ValueError(
            f"`{name}` must be [N] integer class ids: a clustering score compares one class "
            "per sample with its cluster, and [N, L] multi-hot label sets give no single "
            f"class. Received: {name}.shape={tuple(np.shape(labels))}")


def _kmeans(embeddings, labels, num_clusters, seed, metric):
    """k-means cluster ids of the embeddings (scikit-learn, k-means++, one init)."""
    from sklearn.cluster import KMeans

    _one_class_each(labels)
    metric = check_metric(metric)
    labels = ops.convert_to_numpy(dml.cast_labels(labels)).astype(np.int64)
    x = ops.cast(check_embeddings(embeddings), "float32")
    check_batch_sizes(labels, x)
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
    """The ``[classes, clusters]`` counts of the samples of each class in each cluster, for
    two checked labelings (one class per sample, no NaN or Inf)."""
    _one_class_each(labels)
    _one_class_each(clusters, "clusters")
    check_finite_labeling(labels, "labels")
    check_finite_labeling(clusters, "clusters")
    _, li = np.unique(np.asarray(labels).reshape(-1), return_inverse=True)
    _, ci = np.unique(np.asarray(clusters).reshape(-1), return_inverse=True)
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
    A float labeling with a NaN or an Inf, or ``[N, L]`` multi-hot labels,
    raise a ``ValueError`` naming it.
    """
    table = _contingency(labels, clusters)
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
    A float labeling with a NaN or an Inf, or ``[N, L]`` multi-hot labels,
    raise a ``ValueError`` naming it.
    """
    table = _contingency(labels, clusters)

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
    labels: ``[N]`` integer class ids (one class per sample: ``[N, L]``
        multi-hot label sets are refused).
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


@fill_doc(CLUSTERING_DOC=_clustering_doc("nmi"), RAISES=nonfinite_raises("embeddings"))
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


@fill_doc(CLUSTERING_DOC=_clustering_doc("f1_clustering"), RAISES=nonfinite_raises("embeddings"))
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
