"""The references of the miners: triplets, distance-weighted draws, pairs.

* the strategies and the disjoint mode as in :func:`mine_triplets`;
* a miner's output (index arrays and masks) is read back as a set of triplets by
  :func:`triplet_set`, and its random choices replayed by :func:`chooser_from`.
"""

from __future__ import annotations

import math

import numpy as np

from .core import (
    as_floats,
    as_label_list,
    least_similar,
    most_similar,
    negatives_of,
    positives_of,
    semihard_candidates,
    squared_distance,
)

# -- mining ---------------------------------------------------------------------------------------


def _pick(strategy, role, row, candidates, anchor, positive, chooser):
    """One index among ``candidates`` (None if there are none) by ``strategy``."""
    if not candidates:
        return None
    if strategy == "random":
        if chooser is None:
            raise ValueError("a random strategy needs a `chooser` (the choices under test)")
        choice = chooser(anchor, role, list(candidates), positive)
        if choice is not None and choice not in candidates:
            raise AssertionError(
                f"anchor {anchor}: random {role} {choice} is not a candidate {candidates}"
            )
        return choice
    if role == "positive":
        return most_similar(row, candidates) if strategy == "easy" else least_similar(
            row, candidates)
    if strategy in ("hard", "semihard"):
        return most_similar(row, candidates)
    return least_similar(row, candidates)  # easy negative


def _negative_candidates(row, negatives, p, negative):
    return semihard_candidates(row, negatives, p) if negative == "semihard" else list(negatives)


def mine_triplets(scores, labels, ref_labels=None, ref_offset=0, positive="easy",
                  negative="hard", disjoint=False, chooser=None):
    """The set of mined ``(anchor, positive, negative)`` triplets (reference rows).

    ``scores[a][r]``: larger is more similar. Strategies:

    * positive ``"easy"`` most similar positive, ``"hard"`` least similar,
      ``"random"`` any one, ``"all"`` every positive;
    * negative ``"hard"`` most similar negative, ``"easy"`` least similar,
      ``"random"`` any one, ``"semihard"`` the most similar negative with
      ``s_an <= s_ap`` of the chosen positive (per pair for positive "all"),
      ``"all"`` every negative.

    ``disjoint``: anchors in batch order; an anchor already used in an earlier
    triplet is skipped; the positive is picked among unused positives, then the
    negative among unused negatives; when both exist ``(a, p, n)`` is recorded
    and ``a``, ``p`` and ``n`` become used.

    Random choices cannot be reproduced, so they are delegated to
    ``chooser(anchor, role, candidates, positive)``, which returns the index the
    implementation under test chose; it is checked to be among ``candidates``.
    In disjoint mode the chooser may return None, meaning "the implementation
    made no triplet for this anchor": that is accepted only where it is
    possible (a random positive that leaves no valid negative).
    """
    scores = np.asarray(scores, dtype=np.float64)
    labels = as_label_list(labels)
    ref_labels = labels if ref_labels is None else as_label_list(ref_labels)
    triplets = set()
    if disjoint:
        if "all" in (positive, negative):
            raise ValueError("disjoint mining needs single-choice strategies")
        used = set()
        for a in range(len(labels)):
            row = scores[a].tolist()
            if ref_offset is not None and a + ref_offset in used:
                continue
            free_pos = [r for r in positives_of(a, labels, ref_labels, ref_offset)
                        if r not in used]
            free_neg = [r for r in negatives_of(a, labels, ref_labels) if r not in used]
            p = _pick(positive, "positive", row, free_pos, a, None, chooser)
            if p is None:
                if free_pos and all(_negative_candidates(row, free_neg, q, negative)
                                    for q in free_pos):
                    raise AssertionError(
                        f"anchor {a}: no triplet although every free positive "
                        "has a free negative"
                    )
                continue
            candidates = _negative_candidates(row, free_neg, p, negative)
            n = _pick(negative, "negative", row, candidates, a, p, chooser)
            if n is None:
                if candidates:
                    raise AssertionError(f"anchor {a}: no triplet although negatives exist")
                continue
            triplets.add((a, p, n))
            used.update({p, n})
            if ref_offset is not None:
                used.add(a + ref_offset)
        return triplets

    for a in range(len(labels)):
        row = scores[a].tolist()
        pos = positives_of(a, labels, ref_labels, ref_offset)
        neg = negatives_of(a, labels, ref_labels)
        if positive == "all":
            chosen_positives = pos
        else:
            p = _pick(positive, "positive", row, pos, a, None, chooser)
            chosen_positives = [] if p is None else [p]
        for p in chosen_positives:
            if negative == "all":
                chosen_negatives = neg
            else:
                candidates = _negative_candidates(row, neg, p, negative)
                n = _pick(negative, "negative", row, candidates, a, p, chooser)
                chosen_negatives = [] if n is None else [n]
            for n in chosen_negatives:
                triplets.add((a, p, n))
    return triplets


# -- reading a miner's output (plain arrays) ------------------------------------------------------


def triplet_set(positive, negative, mask):
    """The ``(anchor, positive, negative)`` triplets where ``mask`` is true.

    Follows the ``Triplets`` layout: ``positive``/``negative`` are ``[B, P]``
    index arrays or None (then positive ``i`` / negative ``j`` is reference
    row ``i`` / ``j``), ``mask`` is ``[B, P, N]``.
    """
    mask = np.asarray(mask)
    out = set()
    for a in range(mask.shape[0]):
        for i in range(mask.shape[1]):
            for j in range(mask.shape[2]):
                if mask[a, i, j]:
                    p = i if positive is None else int(positive[a, i])
                    n = j if negative is None else int(negative[a, i])
                    out.add((a, p, n))
    return out


def chooser_from(positive, negative, mask, disjoint=False):
    """A ``chooser`` for :func:`mine_triplets` that replays a miner's random choices.

    Without ``disjoint`` the miner's raw indices are returned (they are set
    even for pairs whose triplet does not exist). In disjoint mode an anchor
    without a triplet answers None.
    """
    mask = np.asarray(mask)

    def choose(anchor, role, candidates, p):
        if disjoint and not mask[anchor].any():
            return None
        if role == "positive":
            return int(positive[anchor, 0])
        if positive is None:  # positive="all": one negative per (anchor, positive j)
            return int(negative[anchor, p])
        return int(negative[anchor, 0])

    return choose


# -- distance-weighted sampling (Wu et al. 2017) --------------------------------------------------


def distance_weighted_probabilities(anchor, ref_embeddings, candidates, lower_cutoff=0.5,
                                    upper_cutoff=1.4):
    """Target distribution of a distance-weighted negative draw for one anchor: ``[R]``.

    ``candidates``: the reference rows the anchor may draw from (its negatives).
    For points spread uniformly on the unit sphere in ``n`` dimensions the
    pairwise distance has density ``q(d) ~ d^(n-2) (1 - d^2/4)^((n-3)/2)``;
    a negative is drawn with probability proportional to ``1 / q(d)``, with
    ``d`` clipped below at ``lower_cutoff`` and ``1 - d^2/4`` clipped below at
    1e-6. Only candidates with (unclipped) ``d < upper_cutoff`` are drawn; if
    none is that close, every candidate is equally likely. Rows that are not
    candidates get probability 0.
    """
    anchor = as_floats(np.asarray(anchor, dtype=np.float64))
    ref_rows = np.asarray(ref_embeddings, dtype=np.float64).tolist()
    n = len(anchor)
    probs = np.zeros(len(ref_rows))
    if not candidates:
        return probs
    dist = {r: math.sqrt(squared_distance(anchor, ref_rows[r])) for r in candidates}
    close = [r for r in candidates if upper_cutoff is None or dist[r] < upper_cutoff]
    if not close:
        for r in candidates:
            probs[r] = 1.0 / len(candidates)
        return probs
    log_w = {}
    for r in close:
        d = max(dist[r], lower_cutoff)
        log_q = (n - 2) * math.log(d) + 0.5 * (n - 3) * math.log(max(1.0 - d * d / 4.0, 1e-6))
        log_w[r] = -log_q  # w = 1 / q(d)
    top = max(log_w.values())
    total = sum(math.exp(v - top) for v in log_w.values())
    for r, v in log_w.items():
        probs[r] = math.exp(v - top) / total
    return probs


# -- pairs ----------------------------------------------------------------------------------------


def multi_similarity_pairs(scores, labels, ref_labels=None, ref_offset=0, epsilon=0.1,
                           positive="hard"):
    """Pair mining of the multi-similarity loss: boolean ``(positive, negative)`` ``[B, R]``.

    For anchor ``a``: a negative ``n`` is kept if ``S_an + epsilon > min_p S_ap``
    Positives: ``"hard"`` keeps ``p`` if ``S_ap - epsilon < max_n S_an``,
    ``"easy"`` only the most similar positive (first one on ties), ``"all"``
    every positive. An anchor without a positive or without a negative keeps
    no pair at all.
    """
    scores = np.asarray(scores, dtype=np.float64)
    labels = as_label_list(labels)
    ref_labels = labels if ref_labels is None else as_label_list(ref_labels)
    pos_mask = np.zeros(scores.shape, dtype=bool)
    neg_mask = np.zeros(scores.shape, dtype=bool)
    for a in range(len(labels)):
        row = scores[a].tolist()
        pos = positives_of(a, labels, ref_labels, ref_offset)
        neg = negatives_of(a, labels, ref_labels)
        if not pos or not neg:
            continue
        if pos:
            least_positive = min(row[p] for p in pos)
            for n in neg:
                if row[n] + epsilon > least_positive:
                    neg_mask[a, n] = True
        if positive == "hard":
            if neg:
                most_negative = max(row[n] for n in neg)
                for p in pos:
                    if row[p] - epsilon < most_negative:
                        pos_mask[a, p] = True
        elif positive == "easy":
            if pos:
                pos_mask[a, most_similar(row, pos)] = True
        elif positive == "all":
            for p in pos:
                pos_mask[a, p] = True
        else:
            raise ValueError(positive)
    return pos_mask, neg_mask


def pairs_from_triplets(triplets, batch, num_ref):
    """The positive and negative pairs used by a set of ``(a, p, n)`` triplets: ``[B, R]`` masks."""
    pos_mask = np.zeros((batch, num_ref), dtype=bool)
    neg_mask = np.zeros((batch, num_ref), dtype=bool)
    for a, p, n in triplets:
        pos_mask[a, p] = True
        neg_mask[a, n] = True
    return pos_mask, neg_mask


def triplets_from_pairs(pos_mask, neg_mask):
    """Every ``(a, p, n)`` with ``(a, p)`` a kept positive pair and ``(a, n)`` a kept negative pair."""
    pos_mask, neg_mask = np.asarray(pos_mask), np.asarray(neg_mask)
    out = set()
    for a in range(pos_mask.shape[0]):
        for p in range(pos_mask.shape[1]):
            for n in range(neg_mask.shape[1]):
                if pos_mask[a, p] and neg_mask[a, n]:
                    out.add((a, p, n))
    return out


def triplets_where(labels, keep):
    """The triplets ``(a, p, n)`` of a batch (``p != a`` of ``a``'s class, ``n`` of another)
    for which ``keep(a, p, n)`` holds, by loops."""
    labels = np.asarray(labels)
    n = len(labels)
    return {(a, p, k) for a in range(n) for p in range(n) for k in range(n)
            if p != a and labels[p] == labels[a] and labels[k] != labels[a] and keep(a, p, k)}
