"""The references of the pair-statistics losses (tfdml.losses.pair_statistics), the ranked
list loss and the manifold loss."""

from __future__ import annotations

import numpy as np

from .core import l2_normalize, label_masks, norm


def _unit_cosines(embeddings, ref=None):
    """``[B, R]`` cosine similarities of the L2-normalized rows, pair by pair."""
    x = l2_normalize(embeddings)
    y = x if ref is None else l2_normalize(ref)
    return np.array([[float(np.dot(a, b)) for b in y] for a in x])


def _halves_mean(pos_terms, neg_terms, nonzero=True):
    """pml's AvgNonZeroReducer per half: the mean of the terms above 0 (0 for none), added;
    ``nonzero=False``: its MeanReducer, the mean of all the terms of each half."""
    out = 0.0
    for terms in (pos_terms, neg_terms):
        kept = [t for t in terms if t > 0 or not nonzero]
        out += sum(kept) / len(kept) if kept else 0.0 * sum(terms, 0.0)
    return out


def threshold_consistent_margin_loss(labels, embeddings, lambda_plus=1.0, lambda_minus=1.0,
                                     margin_plus=0.9, margin_minus=0.5, pml=False):
    """Zhang et al.'s TCM loss over every pair: ``lambda_plus`` times the mean of
    ``m+ - s`` over the positive pairs with ``s < m+`` plus ``lambda_minus`` times the mean of
    ``s - m-`` over the negative pairs with ``s > m-``. ``pml=True``: pytorch-metric-learning
    2.9's reading, whose means count the pairs with ``s <= m+`` (``s >= m-``), ties included."""
    s = _unit_cosines(embeddings)
    pos, neg = label_masks(labels)
    pos_s = [s[a, r] for a, r in zip(*np.nonzero(pos), strict=True)]
    neg_s = [s[a, r] for a, r in zip(*np.nonzero(neg), strict=True)]
    if pml:
        below = [margin_plus - v for v in pos_s if v <= margin_plus]
        above = [v - margin_minus for v in neg_s if v >= margin_minus]
        return (lambda_plus * (sum(below) / len(below) if below else 0.0)
                + lambda_minus * (sum(above) / len(above) if above else 0.0))
    return _halves_mean([lambda_plus * max(margin_plus - v, 0.0) for v in pos_s],
                        [lambda_minus * max(v - margin_minus, 0.0) for v in neg_s])


def intra_pair_variance_loss(labels, embeddings, pos_eps=0.01, neg_eps=0.01, nonzero=False):
    """Yu & Tao's intra-pair variance loss over every pair: ``max((1 - pos_eps) mu_p - s,
    0)^2`` per positive pair and ``max(s - (1 + neg_eps) mu_n, 0)^2`` per negative pair, each
    kind averaged over its pairs (``nonzero``: over its terms above 0), the two means added
    (``mu``: the mean similarity of the kind over the batch)."""
    s = _unit_cosines(embeddings)
    pos, neg = label_masks(labels)
    pos_s = [s[a, r] for a, r in zip(*np.nonzero(pos), strict=True)]
    neg_s = [s[a, r] for a, r in zip(*np.nonzero(neg), strict=True)]
    mu_p = sum(pos_s) / len(pos_s) if pos_s else 0.0
    mu_n = sum(neg_s) / len(neg_s) if neg_s else 0.0
    return _halves_mean([max((1.0 - pos_eps) * mu_p - v, 0.0) ** 2 for v in pos_s],
                        [max(v - (1.0 + neg_eps) * mu_n, 0.0) ** 2 for v in neg_s], nonzero)


def ranked_list_loss(labels, embeddings, margin, tn, imbalance=0.5, alpha=None, tp=0.0,
                     pml=False):
    """Wang et al.'s ranked list loss, anchor by anchor, then the mean over the batch.

    Per anchor, over the positives farther than ``alpha - margin`` and the negatives closer
    than ``alpha`` (Euclidean distances of unit vectors): the ``e^{tp (d - alpha + margin)}``-
    weighted mean of ``d - alpha + margin`` and the ``e^{tn (alpha - d)}``-weighted mean of
    ``alpha - d`` (0 without such a pair), mixed ``(1 - imbalance)``/``imbalance``.
    ``pml=True``: pytorch-metric-learning 2.9's reading: each normalizer adds ``1e-5`` per
    reference sample (the whole row, the anchor itself included), and pairs at distance 0
    are left out.
    """
    labels = [int(v) for v in np.asarray(labels).reshape(-1)]
    x = l2_normalize(embeddings)
    alpha = 1.0 + margin / 2.0 if alpha is None else alpha
    n = len(labels)
    total = 0.0
    for a in range(n):
        dist = [norm(x[a] - x[j]) if j != a else 0.0 for j in range(n)]
        keep_p = [j for j in range(n) if j != a and labels[j] == labels[a]
                  and dist[j] > alpha - margin and (not pml or dist[j] > 0)]
        keep_n = [j for j in range(n) if labels[j] != labels[a] and dist[j] < alpha
                  and (not pml or dist[j] > 0)]
        parts = []
        for keep, gap, t in ((keep_p, lambda d: d - (alpha - margin), tp),
                             (keep_n, lambda d: alpha - d, tn)):
            w = {j: np.exp(t * gap(dist[j])) for j in keep}
            denominator = sum(w.values()) + (1e-5 * n if pml else 0.0)
            parts.append(sum(w[j] * gap(dist[j]) for j in keep) / denominator
                         if denominator > 0 else 0.0)
        total += (1.0 - imbalance) * parts[0] + imbalance * parts[1]
    return total / n


def manifold_random_walk(embeddings, proxies, alpha=0.8):
    """``F = (1 - alpha) (I - alpha D^-1/2 S D^-1/2)^-1`` over the unit embeddings and proxies,
    with ``S_ij = exp(max(cos_ij, 0) / 0.5)`` off the diagonal, 0 on it."""
    nodes = l2_normalize(np.concatenate([np.asarray(embeddings, np.float64),
                                         np.asarray(proxies, np.float64)]))
    m = len(nodes)
    s = np.zeros((m, m))
    for i in range(m):
        for j in range(m):
            if i != j:
                s[i, j] = np.exp(max(float(nodes[i] @ nodes[j]), 0.0) / 0.5)
    d = s.sum(axis=1) ** -0.5
    s_bar = d[:, None] * s * d[None, :]
    return (1.0 - alpha) * np.linalg.inv(np.eye(m) - alpha * s_bar)


def _manifold_hinge(scores, own, margin):
    """``log(1 + sum_{j != own, z_j >= 0} exp(z_j))``, ``z_j = scores_j - scores_own + margin``."""
    total = 0.0
    for j, score in enumerate(scores):
        z = score - scores[own] + margin
        if j != own and z >= 0:
            total += np.exp(z)
    return float(np.log1p(total))


def manifold_loss(meta, embeddings, proxies, lambda_c=1.0, alpha=0.8, margin=5e-4):
    """Aziere & Todorovic's manifold loss as pytorch-metric-learning 2.9 computes it (in float64,
    and ``lambda_c = inf`` as the context loss alone): ``(mean, per-sample losses)``."""
    n = len(embeddings)
    f = manifold_random_walk(embeddings, proxies, alpha)
    per_sample = []
    for i in range(n):
        y = int(meta[i])
        context = [float(f[i] @ f[n + j] / (norm(f[i]) * norm(f[n + j])))
                   for j in range(len(proxies))]
        ctx = _manifold_hinge(context, y, margin)
        if np.isinf(lambda_c):
            per_sample.append(ctx)
        else:
            per_sample.append(_manifold_hinge(f[i, n:], y, margin) + lambda_c * ctx)
    return float(np.mean(per_sample)) if per_sample else 0.0, np.array(per_sample)
