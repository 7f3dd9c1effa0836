"""The references of the softmax losses over pairs: SupCon, NT-Xent, circle, soft nearest
neighbour.

Cosine similarities s (dot products with ``normalize=False``) between the anchors (the
batch) and the reference set (the batch itself by default); positives and negatives of
an anchor as in :func:`references.core.positives_of` / :func:`references.core.negatives_of`.
Each returns ``(value, terms)`` with ``terms = {anchor: [term losses]}`` for the anchors that
have terms, and ``value = average_terms(terms, average, B)``.
"""

from __future__ import annotations

import numpy as np

from .core import (
    average_terms,
    logsumexp,
    margin_scores,
    nca_scores,
    negatives_of,
    positives_of,
    softplus,
    split_ref,
)


def supcon_loss(labels, embeddings, temperature=0.1, normalize=True, ref_embeddings=None,
                ref_labels=None, ref_offset=None, average="anchors", graded=False):
    """Supervised contrastive loss (Khosla et al. 2020).

    ``L_a = -1/|P(a)| sum_{p in P(a)} [s_ap / T - log sum_{j in A(a)} exp(s_aj / T)]`` with
    ``A(a) = P(a) + N(a)`` (every reference row but the anchor itself); one term per
    anchor that has a positive and a negative. ``graded`` (Multi-SupCon, multi-hot labels):
    each positive's term times the Jaccard similarity of the two label sets.
    """
    labels, ref_labels, ref_offset = split_ref(labels, ref_embeddings, ref_labels, ref_offset)
    s = nca_scores(embeddings, ref_embeddings, normalize)
    terms = {}
    for a in range(len(labels)):
        pos = positives_of(a, labels, ref_labels, ref_offset)
        neg = negatives_of(a, labels, ref_labels)
        if not pos or not neg:
            continue
        log_z = logsumexp([s[a, j] / temperature for j in pos + neg])
        weight = [len(labels[a] & ref_labels[p]) / len(labels[a] | ref_labels[p]) if graded
                  else 1.0 for p in pos]
        terms[a] = [-sum(w * (s[a, p] / temperature - log_z) for w, p in zip(weight, pos, strict=True))
                    / len(pos)]
    return average_terms(terms, average, len(labels)), terms


def ntxent_loss(labels, embeddings, temperature=0.07, normalize=True, ref_embeddings=None,
                ref_labels=None, ref_offset=None, average="terms"):
    """NT-Xent: one term per positive pair ``(a, p)``,
    ``-log(e^{s_ap/T} / (e^{s_ap/T} + sum_{n in N(a)} e^{s_an/T}))`` (0 without negatives)."""
    labels, ref_labels, ref_offset = split_ref(labels, ref_embeddings, ref_labels, ref_offset)
    s = nca_scores(embeddings, ref_embeddings, normalize)
    terms = {}
    for a in range(len(labels)):
        neg = negatives_of(a, labels, ref_labels)
        for p in positives_of(a, labels, ref_labels, ref_offset):
            u = s[a, p] / temperature
            terms.setdefault(a, []).append(
                logsumexp([u] + [s[a, n] / temperature for n in neg]) - u)
    return average_terms(terms, average, len(labels)), terms


def circle_alphas(embeddings, margin=0.4, normalize=True, ref_embeddings=None):
    """``(alpha_p, alpha_n)`` ``[B, R]``: ``max(1 + m - s, 0)`` and ``max(s + m, 0)`` of every
    pair, to hold fixed in :func:`circle_loss`."""
    s = nca_scores(embeddings, ref_embeddings, normalize)
    alpha_p, alpha_n = np.zeros_like(s), np.zeros_like(s)
    for a in range(s.shape[0]):
        for r in range(s.shape[1]):
            alpha_p[a, r] = max(1.0 + margin - s[a, r], 0.0)
            alpha_n[a, r] = max(s[a, r] + margin, 0.0)
    return alpha_p, alpha_n


def circle_loss(labels, embeddings, margin=0.4, gamma=80.0, normalize=True, ref_embeddings=None,
                ref_labels=None, ref_offset=None, average="anchors", alphas=None):
    """Circle loss (Sun et al. 2020) with ``O_p = 1 + m``, ``O_n = -m``, ``Delta_p = 1 - m``,
    ``Delta_n = m``:

    ``L_a = softplus(logsumexp_p(-gamma alpha_p (s_ap - Delta_p))
                     + logsumexp_n(gamma alpha_n (s_an - Delta_n)))``,

    one term per anchor with a positive and a negative. ``alphas``: ``(alpha_p, alpha_n)``
    from :func:`circle_alphas` to use instead of recomputing them from ``embeddings``
    (the weights are constants in the gradient: finite differences with them held).
    """
    labels, ref_labels, ref_offset = split_ref(labels, ref_embeddings, ref_labels, ref_offset)
    s = nca_scores(embeddings, ref_embeddings, normalize)
    if alphas is None:
        alphas = circle_alphas(embeddings, margin, normalize, ref_embeddings)
    alpha_p, alpha_n = alphas
    terms = {}
    for a in range(len(labels)):
        pos = positives_of(a, labels, ref_labels, ref_offset)
        neg = negatives_of(a, labels, ref_labels)
        if not pos or not neg:
            continue
        pull = logsumexp([-gamma * alpha_p[a, p] * (s[a, p] - (1.0 - margin)) for p in pos])
        push = logsumexp([gamma * alpha_n[a, n] * (s[a, n] - margin) for n in neg])
        terms[a] = [softplus(pull + push)]
    return average_terms(terms, average, len(labels)), terms


def soft_nearest_neighbor_loss(labels, embeddings, temperature=1.0, distance="squared_l2",
                               normalize=False, ref_embeddings=None, ref_labels=None,
                               ref_offset=None, average="anchors"):
    """Soft nearest neighbour loss (Frosst et al. 2019, eq. 1), one term per anchor with a
    positive: ``-log(sum_{p in P(a)} e^{-d_ap/T} / sum_{j in P(a) + N(a)} e^{-d_aj/T})``."""
    labels, ref_labels, ref_offset = split_ref(labels, ref_embeddings, ref_labels, ref_offset)
    d = -margin_scores(embeddings, ref_embeddings, distance, normalize)
    terms = {}
    for a in range(len(labels)):
        pos = positives_of(a, labels, ref_labels, ref_offset)
        if not pos:
            continue
        others = pos + negatives_of(a, labels, ref_labels)
        terms[a] = [logsumexp([-d[a, j] / temperature for j in others])
                    - logsumexp([-d[a, p] / temperature for p in pos])]
    return average_terms(terms, average, len(labels)), terms
