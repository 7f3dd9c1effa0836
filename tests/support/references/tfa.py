"""The references of TensorFlow Addons' metric-learning losses (tfdml.compat.tfa)."""

from __future__ import annotations

import numpy as np


def tfa_distances(embeddings, metric):
    """TFA's distance metrics, with plain loops: "L2", "squared-L2", "angular"."""
    x = np.asarray(embeddings, np.float64)
    n = len(x)
    d = np.zeros((n, n))
    for a in range(n):
        for b in range(n):
            if a == b:
                continue
            if metric == "angular":
                cos = x[a] @ x[b] / (np.linalg.norm(x[a]) * np.linalg.norm(x[b]))
                d[a, b] = max(1.0 - cos, 0.0)
            else:
                sq = float(np.sum((x[a] - x[b]) ** 2))
                d[a, b] = sq if metric == "squared-L2" else np.sqrt(sq)
    return d


def tfa_triplet_semihard(labels, embeddings, margin=1.0, metric="L2", dist=None):
    """Semi-hard triplet loss as TFA documents it, with its fallbacks.

    For each (anchor, positive): the closest negative strictly farther than the
    positive; else the farthest negative; with no negative, the smallest entry
    of the anchor's distance row. Mean of the hinge over all (anchor, positive);
    0 without positive pairs.
    """
    labels = np.asarray(labels).reshape(-1)
    d = tfa_distances(embeddings, metric) if dist is None else np.asarray(dist, np.float64)
    n = len(labels)
    total, count = 0.0, 0
    for a in range(n):
        negs = [d[a, k] for k in range(n) if labels[k] != labels[a]]
        for p in range(n):
            if p == a or labels[p] != labels[a]:
                continue
            farther = [v for v in negs if v > d[a, p]]
            if farther:
                d_an = min(farther)
            elif negs:
                d_an = max(negs)
            else:
                d_an = min(d[a])
            total += max(margin + d[a, p] - d_an, 0.0)
            count += 1
    return total / count if count else 0.0


def tfa_triplet_hard(labels, embeddings, margin=1.0, soft=False, metric="L2", dist=None):
    """Batch-hard triplet loss as TFA documents it: mean over every anchor.

    An anchor without positives uses its row's smallest distance as the
    hardest positive; one without negatives its row's largest as the hardest
    negative.
    """
    labels = np.asarray(labels).reshape(-1)
    d = tfa_distances(embeddings, metric) if dist is None else np.asarray(dist, np.float64)
    n = len(labels)
    values = []
    for a in range(n):
        pos = [d[a, p] for p in range(n) if p != a and labels[p] == labels[a]]
        neg = [d[a, k] for k in range(n) if labels[k] != labels[a]]
        hp = max(pos) if pos else min(d[a])
        hn = min(neg) if neg else max(d[a])
        values.append(np.log1p(np.exp(hp - hn)) if soft else max(hp - hn + margin, 0.0))
    return float(np.mean(values))


def tfa_lifted_struct(labels, embeddings, margin=1.0):
    """Lifted structured loss as TFA documents it: over unordered positive pairs (i, j),
    ``J = log(sum_{k neg of i} e^{m - D_ik} + sum_{l neg of j} e^{m - D_jl}) + D_ij`` and
    ``sum max(J, 0)^2 / (2 #pairs)``; pairs without negatives count 0 (TFA: NaN)."""
    labels = np.asarray(labels).reshape(-1)
    d = tfa_distances(embeddings, "L2")
    n = len(labels)
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n) if labels[i] == labels[j]]
    total = 0.0
    for i, j in pairs:
        terms = [np.exp(margin - d[a, k]) for a in (i, j) for k in range(n)
                 if labels[k] != labels[a]]
        if terms:
            total += max(np.log(sum(terms)) + d[i, j], 0.0) ** 2
    return total / (2 * len(pairs)) if pairs else 0.0


def tfa_contrastive(y_true, distances, margin=1.0):
    """Per pair: ``y d^2 + (1 - y) max(margin - d, 0)^2``."""
    return np.array([y * d * d + (1 - y) * max(margin - d, 0.0) ** 2
                     for y, d in zip(np.asarray(y_true, float), np.asarray(distances, float),
                                     strict=True)])


def tfa_npairs(labels, similarities):
    """Mean over rows of the softmax cross-entropy against the row's same-label columns."""
    labels = np.asarray(labels).reshape(-1)
    s = np.asarray(similarities, np.float64)
    out = []
    for a in range(len(labels)):
        same = [c for c in range(len(labels)) if labels[c] == labels[a]]
        log_z = np.log(np.sum(np.exp(s[a] - s[a].max()))) + s[a].max()
        out.append(-sum((s[a, c] - log_z) / len(same) for c in same))
    return float(np.mean(out))
