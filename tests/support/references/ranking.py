"""The references of the ranking losses: FastAP, PNP, Smooth-AP."""

from __future__ import annotations

import numpy as np

from .core import dot, l2_normalize


def _cosines(embeddings):
    """Cosine similarities of the L2-normalized rows, pair by pair."""
    x = l2_normalize(embeddings)
    n = x.shape[0]
    return np.array([[dot(x[i], x[j]) for j in range(n)] for i in range(n)])


def _sigmoid(z, temperature):
    """1 / (1 + exp(-z / temperature)), without overflow."""
    z = np.asarray(z, np.float64) / temperature
    return np.exp(-np.logaddexp(0.0, -z))


def fast_ap_loss(labels, embeddings, num_bins=10):
    """Cakir et al.'s FastAP loss: per anchor with a positive, ``1 - FastAP`` from the
    triangular-kernel histograms (nodes ``k * 4 / num_bins``) of the squared Euclidean
    distances ``2 - 2 cos`` of the L2-normalized embeddings to its positives and its
    negatives; the mean over those anchors."""
    labels = np.asarray(labels).reshape(-1)
    d = 2.0 - 2.0 * _cosines(embeddings)
    delta = 4.0 / num_bins
    nodes = [k * delta for k in range(num_bins + 1)]
    losses = []
    for a in range(len(labels)):
        others = [j for j in range(len(labels)) if j != a]
        pos = [j for j in others if labels[j] == labels[a]]
        neg = [j for j in others if labels[j] != labels[a]]
        if not pos:
            continue

        def hist(js, row=d[a]):
            return np.array([sum(max(0.0, 1.0 - abs(row[j] - m) / delta) for j in js)
                             for m in nodes])

        h_pos, h_neg = hist(pos), hist(neg)
        big_pos, big = np.cumsum(h_pos), np.cumsum(h_pos + h_neg)
        ap = sum(h_pos[k] * big_pos[k] / big[k] for k in range(len(nodes)) if h_pos[k] > 0)
        losses.append(1.0 - ap / len(pos))
    return float(np.mean(losses)) if losses else 0.0


def _pnp_shape(rank, variant, b, alpha):
    """PNP's function of the number ``rank`` of negatives ranked before a positive."""
    if variant == "O":
        return rank
    if variant == "Ds":
        return np.log1p(rank)
    if variant == "Dq":
        return 1.0 - 1.0 / (1.0 + rank) ** alpha
    if variant == "Iu":
        return (1.0 + rank) * np.log1p(rank)
    return (b * rank - np.log1p(b * rank)) / b**2  # "Ib"


def pnp_loss(labels, embeddings, b=2.0, alpha=1.0, anneal=0.01, variant="O",
             anchor_as_positive=False):
    """Li et al.'s PNP loss: per anchor the mean over its positives ``i`` of
    ``f(sum_n sigmoid((s_an - s_ai) / anneal))`` over its negatives ``n`` (``f`` by
    ``variant``); the mean over the anchors with a positive. ``anchor_as_positive``:
    pytorch-metric-learning 2.9's reading, which counts each anchor with a positive among
    its own positives."""
    labels = np.asarray(labels).reshape(-1)
    s = _cosines(embeddings)
    losses = []
    for a in range(len(labels)):
        neg = labels != labels[a]
        pos = labels == labels[a]
        pos[a] = False
        if not pos.any():
            continue
        pos[a] = anchor_as_positive
        ranks = [np.sum(_sigmoid(s[a, neg] - s[a, i], anneal)) for i in np.flatnonzero(pos)]
        losses.append(np.mean(_pnp_shape(np.array(ranks), variant, b, alpha)))
    return float(np.mean(losses)) if losses else 0.0


def smooth_ap_loss(labels, embeddings, temperature=0.01, anchor_in_set=False, groups=None):
    """Brown et al.'s Smooth-AP loss: per anchor with a positive, ``1 - AP`` with the
    smoothed ranks of its positives ``i`` among its positives (``1 + sum_{j in P, j != i}
    G(s_aj - s_ai)``) and among the whole retrieval set (the same over ``P`` and the
    negatives); the mean over those anchors. The retrieval set is the other samples.

    ``anchor_in_set``: pytorch-metric-learning 2.9's reading (and the authors' code), in
    which the anchor is in its own retrieval set and one of its own positives, and every
    anchor is averaged. ``groups``: the positives are the rows of the same group
    (``groups[i]``) instead of the same label (pml groups the rows by position)."""
    labels = np.asarray(labels).reshape(-1)
    groups = labels if groups is None else np.asarray(groups)
    s = _cosines(embeddings)
    losses = []
    for a in range(len(labels)):
        in_set = np.ones(len(labels), bool)
        in_set[a] = anchor_in_set
        pos = (groups == groups[a]) & in_set
        if not pos.any():
            continue
        ap = 0.0
        for i in np.flatnonzero(pos):
            others = in_set.copy()
            others[i] = False
            g = _sigmoid(s[a] - s[a, i], temperature)
            ap += (1.0 + np.sum(g[others & pos])) / (1.0 + np.sum(g[others]))
        losses.append(1.0 - ap / pos.sum())
    return float(np.mean(losses)) if losses else 0.0
