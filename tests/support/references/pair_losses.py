"""The references of the pair losses: contrastive, margin (Wu et al.), multi-similarity, SNR,
generalized lifted structure, angular, tuplet margin and N-pair."""

from __future__ import annotations

import math

import numpy as np

from .core import (
    average_terms,
    distance,
    l2_normalize,
    nca_scores,
    pairwise_distance,
    plain_mean,
    prepare_embeddings,
)

# -- pair losses ----------------------------------------------------------------------------------


def _distances(embeddings, ref_embeddings, distance_kind, normalize):
    x, ref = prepare_embeddings(embeddings, ref_embeddings, normalize)
    out = np.zeros((x.shape[0], ref.shape[0]))
    xs, refs = x.tolist(), ref.tolist()
    for i in range(x.shape[0]):
        for j in range(ref.shape[0]):
            out[i, j] = distance(xs[i], refs[j], distance_kind)
    return out


def _pair_terms(pos_mask, neg_mask, pos_value, neg_value):
    """``{anchor: [loss of each kept pair]}`` for the anchors with at least one pair."""
    pos_mask, neg_mask = np.asarray(pos_mask), np.asarray(neg_mask)
    terms = {}
    for a in range(pos_mask.shape[0]):
        values = []
        for r in range(pos_mask.shape[1]):
            if pos_mask[a, r]:
                values.append(pos_value(a, r))
            if neg_mask[a, r]:
                values.append(neg_value(a, r))
        if values:
            terms[a] = values
    return terms


def _pair_loss(pos_mask, neg_mask, pos_value, neg_value):
    """``{anchor: mean over its kept pairs}`` for the anchors with at least one pair."""
    return {a: plain_mean(v) for a, v in _pair_terms(pos_mask, neg_mask, pos_value,
                                                neg_value).items()}


def hinge(z):
    return max(z, 0.0)


def contrastive_loss(embeddings, pos_mask, neg_mask, positive_margin=0.0, negative_margin=0.5,
                     distance_kind="l2", normalize=True, ref_embeddings=None, average="terms"):
    """Contrastive loss on given pairs. Returns ``(value, {anchor: mean of its pairs})``.

    Positive pair: ``max(d - positive_margin, 0)``; negative pair:
    ``max(negative_margin - d, 0)``; the value is :func:`average_terms` of the
    pair terms (default: the mean over all pairs).
    """
    d = _distances(embeddings, ref_embeddings, distance_kind, normalize)
    terms = _pair_terms(pos_mask, neg_mask,
                        lambda a, r: hinge(d[a, r] - positive_margin),
                        lambda a, r: hinge(negative_margin - d[a, r]))
    value = average_terms(terms, average, np.asarray(pos_mask).shape[0])
    return value, {a: plain_mean(v) for a, v in terms.items()}


def _anchor_beta(beta, label):
    """A scalar ``beta``, or the entry of a per-class ``beta`` for the anchor's class id."""
    if isinstance(beta, (int, float)):
        return float(beta)
    return float(beta[int(label)])


def margin_pair_loss(labels, embeddings, pos_mask, neg_mask, margin=0.2, beta=1.2,
                     distance_kind="l2", normalize=True, ref_embeddings=None,
                     average="nonzero"):
    """Margin loss of Wu et al. on given pairs. Returns ``(value, {anchor: mean of its pairs})``.

    Positive pair: ``max(d - beta_a + margin, 0)``; negative pair:
    ``max(beta_a - d + margin, 0)``; ``beta_a`` is ``beta`` or ``beta[label of a]``.
    The value is :func:`average_terms` of the pair terms (default: the sum over
    pairs divided by the number of non-zero ones, Wu et al.'s code).
    """
    labels = [int(v) for v in np.asarray(labels).reshape(-1)]
    d = _distances(embeddings, ref_embeddings, distance_kind, normalize)
    terms = _pair_terms(
        pos_mask, neg_mask,
        lambda a, r: hinge(d[a, r] - _anchor_beta(beta, labels[a]) + margin),
        lambda a, r: hinge(_anchor_beta(beta, labels[a]) - d[a, r] + margin),
    )
    value = average_terms(terms, average, len(labels))
    return value, {a: plain_mean(v) for a, v in terms.items()}


def margin_triplet_terms(labels, embeddings, triplets, margin=0.2, beta=1.2,
                         distance_kind="l2", normalize=True, ref_embeddings=None):
    """``{anchor: [pair terms]}``: a triplet ``(a, p, n)`` adds its positive-pair term and
    its negative-pair term (Wu et al.: a negative drawn twice counts twice)."""
    labels = [int(v) for v in np.asarray(labels).reshape(-1)]
    d = _distances(embeddings, ref_embeddings, distance_kind, normalize)
    terms = {}
    for a, p, n in triplets:
        b = _anchor_beta(beta, labels[a])
        terms.setdefault(a, []).extend([hinge(d[a, p] - b + margin), hinge(b - d[a, n] + margin)])
    return terms


def margin_triplet_input_loss(labels, embeddings, triplets, margin=0.2, beta=1.2,
                              distance_kind="l2", normalize=True, ref_embeddings=None,
                              average="nonzero"):
    """Margin loss of Wu et al. on triplets. Returns ``(value, {anchor: mean of its terms})``.

    The anchor's mean equals the mean over its triplets of the mean of the
    triplet's two pair terms.
    """
    terms = margin_triplet_terms(labels, embeddings, triplets, margin, beta, distance_kind,
                                 normalize, ref_embeddings)
    value = average_terms(terms, average, np.asarray(embeddings).shape[0])
    return value, {a: plain_mean(v) for a, v in terms.items()}


def multi_similarity_loss(embeddings, pos_mask, neg_mask, alpha=2.0, beta=50.0, base=0.5,
                          normalize=True, ref_embeddings=None, average="batch"):
    """Multi-similarity loss (Wang et al. 2019, eq. 12) on given pairs. Returns ``(value, {anchor: loss})``.

    ``L_a = 1/alpha log(1 + sum_P exp(-alpha (S_ap - base)))
          + 1/beta log(1 + sum_N exp(beta (S_an - base)))`` (an empty sum gives
    log 1 = 0) for the anchors that keep at least one pair; the value is
    ``1/B sum_a L_a`` (eq. 12, ``average="batch"``) or another
    :func:`average_terms` with one term per anchor.
    """
    s = nca_scores(embeddings, ref_embeddings, normalize)
    pos_mask, neg_mask = np.asarray(pos_mask), np.asarray(neg_mask)
    per_anchor = {}
    for a in range(s.shape[0]):
        pos = [r for r in range(s.shape[1]) if pos_mask[a, r]]
        neg = [r for r in range(s.shape[1]) if neg_mask[a, r]]
        if not pos and not neg:
            continue
        pull = 1.0 + sum(math.exp(-alpha * (s[a, p] - base)) for p in pos)
        push = 1.0 + sum(math.exp(beta * (s[a, n] - base)) for n in neg)
        per_anchor[a] = math.log(pull) / alpha + math.log(push) / beta
    value = average_terms({a: [v] for a, v in per_anchor.items()}, average, s.shape[0])
    return value, per_anchor


def snr_contrastive_loss(labels, embeddings, pos_margin=0.0, neg_margin=1.0, average="terms",
                         halves=False):
    """The contrastive loss on the SNR distance ``var(x_j - x_i) / var(x_i)`` (Yuan et al.)
    of L2-normalized embeddings, by loops. ``average``: ``"terms"`` (every pair) or
    ``"nonzero"``. ``halves``: pytorch-metric-learning's reduction, the positive and the
    negative pairs each averaged over their non-zero terms, and the two means added."""
    x = l2_normalize(np.asarray(embeddings, np.float64))
    labels = np.asarray(labels)
    # d[i, j] = var(x_j - x_i) / var(x_i), each pair by its definition (broadcast over pairs).
    d = np.var(x[None, :, :] - x[:, None, :], axis=2, ddof=1) / np.var(x, axis=1, ddof=1)[:, None]
    same = labels[:, None] == labels[None, :]
    off_diagonal = ~np.eye(len(labels), dtype=bool)
    positive = list(np.maximum(d[same & off_diagonal] - pos_margin, 0.0))
    negative = list(np.maximum(neg_margin - d[~same], 0.0))

    def mean(values, nonzero):
        kept = [v for v in values if v > 0] if nonzero else values
        return float(np.sum(values) / len(kept)) if kept else 0.0

    if halves:
        return mean(positive, True) + mean(negative, True)
    return mean(positive + negative, average == "nonzero")


# -- lifted structure, angular, tuplet margin and N-pair losses -----------------------------------


def generalized_lifted_structure_loss(labels, embeddings, neg_margin=1.0, pos_margin=0.0,
                                      empty="paper", average="anchors"):
    """Hermans et al.'s generalized lifted structure loss, by loops over anchors.

    ``empty="paper"``: a log-sum-exp over no positive (or no negative) is ``-inf``, so
    the anchor costs 0 and is not averaged over (``average="anchors"``; ``"batch"``
    divides by every anchor). ``empty="pml"``: pytorch-metric-learning's reading, the
    empty log-sum-exp is 0 and the mean is over every anchor.
    """
    x = l2_normalize(np.asarray(embeddings, np.float64))
    labels = np.asarray(labels)
    d = pairwise_distance(x)
    n = len(labels)
    total, count = 0.0, 0
    for a in range(n):
        pos = [d[a, p] - pos_margin for p in range(n) if p != a and labels[p] == labels[a]]
        neg = [neg_margin - d[a, k] for k in range(n) if labels[k] != labels[a]]
        if empty == "paper" and not (pos and neg):
            continue

        def lse(v):
            return float(np.log(np.sum(np.exp(v)))) if v else 0.0

        total += max(lse(pos) + lse(neg), 0.0)
        count += 1
    if empty == "pml" or average == "batch":
        return total / n
    return total / count if count else 0.0


def _positive_pair_softplus(labels, embeddings, logit, raw_negatives=False):
    """The mean over positive pairs ``(a, p)`` of ``log(1 + sum_n exp(logit(s_ap, s_an,
    s_pn)))`` over the negatives ``n`` of ``a`` (cosine similarities ``s``), by loops.
    ``raw_negatives``: ``s_an`` and ``s_pn`` are dot products with the embeddings of the
    negatives as given (not normalized)."""
    raw = np.asarray(embeddings, np.float64)
    x = l2_normalize(raw)
    labels = np.asarray(labels)
    s = x @ x.T
    to_negatives = x @ (raw if raw_negatives else x).T
    n = len(labels)
    values = []
    for a in range(n):
        for p in range(n):
            if p == a or labels[p] != labels[a]:
                continue
            z = [logit(s[a, p], to_negatives[a, k], to_negatives[p, k])
                 for k in range(n) if labels[k] != labels[a]]
            values.append(float(np.log1p(np.sum(np.exp(z)))) if z else 0.0)
    return float(np.mean(values)) if values else 0.0


ANGULAR_ALPHA = math.radians(40)
TUPLET_MARGIN = math.radians(5.73)


def angular_loss(labels, embeddings, alpha=ANGULAR_ALPHA, raw_negatives=False):
    """Wang et al.'s angular loss (eq. 8), averaged over the positive pairs.
    ``raw_negatives``: pytorch-metric-learning 2.9's reading, whose negatives enter
    ``(x_a + x_p)^T x_n`` without being L2-normalized."""
    t2 = math.tan(alpha) ** 2
    return _positive_pair_softplus(
        labels, embeddings,
        lambda ap, an, pn: 4 * t2 * (an + pn) - 2 * (1 + t2) * ap, raw_negatives)


def tuplet_margin_loss(labels, embeddings, margin=TUPLET_MARGIN, scale=64.0):
    """Yu & Tao's tuplet margin loss, averaged over the positive pairs."""
    return _positive_pair_softplus(
        labels, embeddings,
        lambda ap, an, pn: scale * (an - math.cos(math.acos(min(ap, 1.0)) - margin)))


def n_pairs_pairs(labels):
    """The N-pair loss's pairs: per class with two samples or more, its first and second
    sample in batch order (pytorch-metric-learning 2.9's choice)."""
    pairs = []
    for c in dict.fromkeys(labels.tolist()):
        members = np.flatnonzero(labels == c)
        if len(members) >= 2:
            pairs.append((members[0], members[1]))
    return sorted(pairs)


def n_pairs_loss(labels, embeddings, normalize=True):
    """Mean over the pairs of the cross-entropy of the anchors' dot products with the positives."""
    x = l2_normalize(np.asarray(embeddings, np.float64)) if normalize else np.asarray(
        embeddings, np.float64)
    pairs = n_pairs_pairs(np.asarray(labels))
    if not pairs:
        return 0.0
    anchors = x[[a for a, _ in pairs]]
    positives = x[[p for _, p in pairs]]
    logits = anchors @ positives.T
    top = logits.max(axis=1, keepdims=True)
    lse = top[:, 0] + np.log(np.exp(logits - top).sum(axis=1))
    return float(np.mean(lse - np.diag(logits)))
