"""The references of FAPPY and the histogram loss.

FAPPY paper, Section 3 (eqs. 3, 4, 5, 7) and Algorithm 1; the histogram loss of Ustinova and
Lempitsky (NIPS 2016). Nodes ``b_u = -1 + u * delta`` for ``u = 0 .. n-1``, ``n = 2/delta + 1``.
"""

from __future__ import annotations

import math

import numpy as np

from .core import l2_normalize, pairwise_similarity


def histogram_node(u, delta):
    """The node ``b_u = -1 + u * delta`` (0-based ``u``; also defined past both ends)."""
    return -1.0 + u * delta


def histogram_node_count(delta):
    return int(round(2.0 / delta)) + 1


def triangular_weight(s, u, delta):
    """Eq. 3, literally: the weight that similarity ``s`` puts on node ``u``."""
    b_prev = histogram_node(u - 1, delta)
    b_u = histogram_node(u, delta)
    b_next = histogram_node(u + 1, delta)
    if b_prev <= s <= b_u:
        return (s - b_prev) / delta
    if b_u <= s <= b_next:
        return (b_next - s) / delta
    return 0.0


def similarity_bin(s, delta):
    """``t`` with ``s`` in ``[b_t, b_{t+1}]``; ``s = 1`` is in the last bin (``t = n - 2``)."""
    n = histogram_node_count(delta)
    t = int(math.floor((s + 1.0) / delta))
    return min(max(t, 0), n - 2)


def node_weights(s, delta):
    """``{u: w^u}`` for the two nodes around ``s``: the non-zero values of eq. 3."""
    t = similarity_bin(s, delta)
    return {
        t: (histogram_node(t + 1, delta) - s) / delta,
        t + 1: (s - histogram_node(t, delta)) / delta,
    }


def clipped_similarities(embeddings):
    """Cosine similarities of the L2-normalized rows, clipped to [-1, 1], as nested lists."""
    sim = pairwise_similarity(l2_normalize(embeddings)).tolist()
    for row in sim:
        for k in range(len(row)):
            row[k] = min(1.0, max(-1.0, row[k]))
    return sim


def negative_histogram(sim_row, negatives, delta):
    """Eqs. 4/5: ``{u: h^u}``, ``h^u = 1/|N| sum_{k in N} w^u(sim_row[k])``."""
    h = {}
    for k in negatives:
        for u, w in node_weights(sim_row[k], delta).items():
            h[u] = h.get(u, 0.0) + w / len(negatives)
    return h


def fappy_pair_probability(sim, labels, i, j, delta):
    """``P_ij^Delta`` of eq. 7 from a similarity matrix (nested lists or array).

    Uses ``sim[i][j]`` for ``s_ij``, row ``i`` for the negatives of ``i`` and row ``j``
    for those of ``j``; the negatives are all samples whose label differs from
    ``labels[i]``. 0 when there are none.
    """
    negatives = [k for k in range(len(labels)) if labels[k] != labels[i]]
    if not negatives:
        return 0.0
    s_ij = sim[i][j]
    t = similarity_bin(s_ij, delta)
    h_left = (histogram_node(t + 1, delta) - s_ij) / delta  # eq. 1: w_ij^t
    h_right = (s_ij - histogram_node(t, delta)) / delta  # eq. 2: w_ij^{t+1}
    total = 0.0
    for a in (i, j):
        h = negative_histogram(sim[a], negatives, delta)
        from_t = 0.0  # sum over u >= t
        from_next = 0.0  # sum over u >= t + 1
        for u, height in h.items():
            if u >= t:
                from_t += height
            if u >= t + 1:
                from_next += height
        total += h_left * from_t + h_right * from_next
    return total


def positive_pairs(labels):
    """Unordered positive pairs ``(i, j)``, ``i < j``."""
    n = len(labels)
    return [(i, j) for i in range(n) for j in range(i + 1, n) if labels[i] == labels[j]]


def false_positive_probability(labels, embeddings, delta):
    """``[B, B]``: ``P_ij^Delta`` for ``i != j`` with the same label, 0 elsewhere."""
    labels = [int(v) for v in labels]
    sim = clipped_similarities(embeddings)
    n = len(labels)
    out = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            if i != j and labels[i] == labels[j]:
                out[i, j] = fappy_pair_probability(sim, labels, i, j, delta)
    return out


def fappy_scales(min_bin_width):
    """The bin widths Algorithm 1 visits: 2, 1, 1/2, ... (repeat ... until delta < min)."""
    scales = []
    delta = 2.0
    while True:
        scales.append(delta)
        delta /= 2.0
        if delta < min_bin_width:
            return scales


def fappy_loss_from_similarity(sim, labels, min_bin_width):
    """Algorithm 1 on a similarity matrix."""
    pairs = positive_pairs(labels)
    if not pairs:
        return 0.0
    loss = 0.0
    for delta in fappy_scales(min_bin_width):
        loss_delta = 0.0
        for i, j in pairs:
            if 1.0 - sim[i][j] >= delta:
                loss_delta += fappy_pair_probability(sim, labels, i, j, delta)
        loss = (loss + loss_delta / len(pairs)) / 2.0
    return loss


def fappy_loss(labels, embeddings, min_bin_width):
    """Algorithm 1 of the FAPPY paper on cosine similarities of ``embeddings``."""
    labels = [int(v) for v in labels]
    return fappy_loss_from_similarity(clipped_similarities(embeddings), labels, min_bin_width)


def histogram_loss(labels, embeddings, bin_width):
    """Ustinova and Lempitsky: ``sum_r h-_r sum_{q <= r} h+_q`` over unordered pairs."""
    labels = [int(v) for v in labels]
    sim = clipped_similarities(embeddings)
    positive, negative = [], []
    for i in range(len(labels)):
        for j in range(i + 1, len(labels)):
            (positive if labels[i] == labels[j] else negative).append(sim[i][j])
    if not positive or not negative:
        return 0.0
    n = histogram_node_count(bin_width)
    h_pos = [0.0] * n
    h_neg = [0.0] * n
    for values, h in ((positive, h_pos), (negative, h_neg)):
        for s in values:
            for u, w in node_weights(s, bin_width).items():
                h[u] += w / len(values)
    loss = 0.0
    for r in range(n):
        below = 0.0
        for q in range(r + 1):
            below += h_pos[q]
        loss += h_neg[r] * below
    return loss
