"""The references of the metrics: retrieval, clustering, verification, embedding spread."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from .core import dot, l2_normalize, squared_distance

# -- retrieval and clustering ---------------------------------------------------------------------


def recall_at_k(embeddings, labels, ks, gallery_embeddings=None, gallery_labels=None,
                metric="cosine"):
    """Share of queries with a same-label item among their K nearest gallery items."""
    labels = [int(v) for v in np.asarray(labels).reshape(-1)]
    if gallery_embeddings is None:
        gallery_labels = labels
    else:
        gallery_labels = [int(v) for v in np.asarray(gallery_labels).reshape(-1)]
    rankings = ranked_gallery(embeddings, gallery_embeddings, metric)
    return {
        k: sum(any(gallery_labels[g] == labels[q] for g in ranking[:k])
               for q, ranking in enumerate(rankings)) / len(labels)
        for k in ks
    }


def ranked_gallery(embeddings, gallery_embeddings=None, metric="cosine"):
    """For every query, the gallery indices nearest first (ties: lower index first).

    Without a gallery the queries are the gallery and each query's own index is left out.
    """
    queries = np.asarray(embeddings, dtype=np.float64)
    exclude_self = gallery_embeddings is None
    gallery = queries if exclude_self else np.asarray(gallery_embeddings, dtype=np.float64)
    if metric == "cosine":
        queries, gallery = l2_normalize(queries), l2_normalize(gallery)
    rankings = []
    for q in range(len(queries)):
        items = []
        for g in range(len(gallery)):
            if exclude_self and g == q:
                continue
            if metric == "cosine":
                closeness = dot(queries[q], gallery[g])
            else:
                closeness = -squared_distance(queries[q], gallery[g])
            items.append((closeness, g))
        items.sort(key=lambda item: -item[0])  # stable: equal scores keep index order
        rankings.append([g for _, g in items])
    return rankings


def _retrieval_setup(labels, gallery_embeddings, gallery_labels):
    labels = [int(v) for v in np.asarray(labels).reshape(-1)]
    if gallery_embeddings is None:
        return labels, labels, True
    return labels, [int(v) for v in np.asarray(gallery_labels).reshape(-1)], False


def match_count(q, labels, gallery_labels, exclude_self):
    """R of query ``q``: gallery items of its class, itself excluded when it is in the gallery."""
    count = 0
    for g, label in enumerate(gallery_labels):
        if label == labels[q] and not (exclude_self and g == q):
            count += 1
    return count


def _mean_over_queries(values, matched, unmatched):
    kept = []
    for value, ok in zip(values, matched, strict=True):
        if ok:
            kept.append(value)
        elif unmatched == "miss":
            kept.append(0.0)
    if not kept:
        return float("nan")
    return sum(kept) / len(kept)


def recall_at_k_unmatched(embeddings, labels, ks, gallery_embeddings=None, gallery_labels=None,
                          metric="cosine", unmatched="miss"):
    """Recall@K where queries with no same-class gallery item are excluded or count as misses."""
    labels, gallery_labels, exclude_self = _retrieval_setup(labels, gallery_embeddings,
                                                            gallery_labels)
    rankings = ranked_gallery(embeddings, gallery_embeddings, metric)
    matched = [match_count(q, labels, gallery_labels, exclude_self) > 0
               for q in range(len(labels))]
    result = {}
    for k in ks:
        values = []
        for q, ranking in enumerate(rankings):
            hit = any(gallery_labels[g] == labels[q] for g in ranking[:k])
            values.append(1.0 if hit else 0.0)
        result[k] = _mean_over_queries(values, matched, unmatched)
    return result


def map_at_r(embeddings, labels, gallery_embeddings=None, gallery_labels=None, metric="cosine",
             unmatched="exclude"):
    """MAP@R (Musgrave et al. 2020): mean over queries of (1/R) sum_{i<=R} P(i) * rel(i)."""
    labels, gallery_labels, exclude_self = _retrieval_setup(labels, gallery_embeddings,
                                                            gallery_labels)
    rankings = ranked_gallery(embeddings, gallery_embeddings, metric)
    values, matched = [], []
    for q, ranking in enumerate(rankings):
        r = match_count(q, labels, gallery_labels, exclude_self)
        matched.append(r > 0)
        total, correct = 0.0, 0
        for i in range(1, r + 1):
            if gallery_labels[ranking[i - 1]] == labels[q]:
                correct += 1
                total += correct / i
        values.append(total / r if r > 0 else 0.0)
    return _mean_over_queries(values, matched, unmatched)


def r_precision(embeddings, labels, gallery_embeddings=None, gallery_labels=None,
                metric="cosine", unmatched="exclude"):
    """R-precision: mean over queries of (same-class items among the R nearest) / R."""
    labels, gallery_labels, exclude_self = _retrieval_setup(labels, gallery_embeddings,
                                                            gallery_labels)
    rankings = ranked_gallery(embeddings, gallery_embeddings, metric)
    values, matched = [], []
    for q, ranking in enumerate(rankings):
        r = match_count(q, labels, gallery_labels, exclude_self)
        matched.append(r > 0)
        correct = sum(1 for g in ranking[:r] if gallery_labels[g] == labels[q])
        values.append(correct / r if r > 0 else 0.0)
    return _mean_over_queries(values, matched, unmatched)


def cmc(query_embeddings, query_labels, gallery_embeddings, gallery_labels, top_k,
        metric="cosine", unmatched="miss"):
    """CMC curve: entry k-1 is the share of queries with their identity among the k nearest."""
    recalls = recall_at_k_unmatched(query_embeddings, query_labels, range(1, top_k + 1),
                                    gallery_embeddings, gallery_labels, metric, unmatched)
    return [recalls[k] for k in range(1, top_k + 1)]


def vehicleid_match_rate(embeddings, labels, ks, num_draws, seed, metric="cosine"):
    """VehicleID protocol: per draw one gallery image per identity, the rest queries; mean CMC.

    The draw consumes ``numpy.random.default_rng(seed)`` as tfdml does: one
    ``rng.integers(0, counts)`` per draw, identities in increasing order, each picking the
    position among that identity's images in data order.
    """
    embeddings = np.asarray(embeddings, dtype=np.float64)
    labels = [int(v) for v in np.asarray(labels).reshape(-1)]
    classes = sorted(set(labels))
    members = {c: [i for i, label in enumerate(labels) if label == c] for c in classes}
    counts = np.array([len(members[c]) for c in classes])
    rng = np.random.default_rng(seed)
    totals = {k: 0.0 for k in ks}
    for _ in range(num_draws):
        picks = rng.integers(0, counts)
        chosen = [members[c][int(p)] for c, p in zip(classes, picks, strict=True)]
        queries = [i for i in range(len(labels)) if i not in chosen]
        curve = cmc(embeddings[queries], [labels[i] for i in queries], embeddings[chosen],
                    [labels[i] for i in chosen], max(ks), metric)
        for k in ks:
            totals[k] += curve[k - 1]
    return {k: totals[k] / num_draws for k in ks}


def _entropy_of(groups, n):
    total = 0.0
    for count in groups.values():
        p = count / n
        total -= p * math.log(p)
    return total


def nmi_score(labels, clusters):
    """NMI = I(Y; C) / ((H(Y) + H(C)) / 2), from counts (Manning et al. 2008, eq. 16.2)."""
    labels = [int(v) for v in np.asarray(labels).reshape(-1)]
    clusters = [int(v) for v in np.asarray(clusters).reshape(-1)]
    n = len(labels)
    by_label, by_cluster, joint = {}, {}, {}
    for y, c in zip(labels, clusters, strict=True):
        by_label[y] = by_label.get(y, 0) + 1
        by_cluster[c] = by_cluster.get(c, 0) + 1
        joint[(y, c)] = joint.get((y, c), 0) + 1
    mi = 0.0
    for (y, c), count in joint.items():
        mi += count / n * math.log(n * count / (by_label[y] * by_cluster[c]))
    h_y, h_c = _entropy_of(by_label, n), _entropy_of(by_cluster, n)
    if h_y == 0.0 and h_c == 0.0:
        return 1.0
    return mi / ((h_y + h_c) / 2.0)


def pairwise_f1_score(labels, clusters):
    """Pairwise F1 over all unordered pairs (Manning et al. 2008, Sec. 16.3): 0 if TP == 0."""
    labels = [int(v) for v in np.asarray(labels).reshape(-1)]
    clusters = [int(v) for v in np.asarray(clusters).reshape(-1)]
    tp = fp = fn = 0
    for i in range(len(labels)):
        for j in range(i + 1, len(labels)):
            same_class = labels[i] == labels[j]
            same_cluster = clusters[i] == clusters[j]
            if same_class and same_cluster:
                tp += 1
            elif same_cluster:
                fp += 1
            elif same_class:
                fn += 1
    if tp == 0:
        return 0.0
    precision, recall = tp / (tp + fp), tp / (tp + fn)
    return 2 * precision * recall / (precision + recall)


# -- metrics at scale: exclusions by group, Precision@K, MAP@K, FNMR@FMR, PCF ---------------------


def visible_rankings(embeddings, gallery_embeddings=None, metric="cosine", groups=None,
                     gallery_groups=None):
    """:func:`ranked_gallery` without the gallery items of each query's group (``groups`` on
    both sides without a gallery)."""
    rankings = ranked_gallery(embeddings, gallery_embeddings, metric)
    if groups is None:
        return rankings
    groups = [int(v) for v in groups]
    gallery_groups = groups if gallery_embeddings is None else [int(v) for v in gallery_groups]
    return [[g for g in ranking if gallery_groups[g] != groups[q]]
            for q, ranking in enumerate(rankings)]


def _average_precision(rel, cut, denominator):
    """(1 / denominator) * sum_{i <= cut} P(i) rel(i); 0 when the denominator is 0."""
    total, correct = 0.0, 0
    for i in range(1, cut + 1):
        if rel[i - 1]:
            correct += 1
            total += correct / i
    return total / denominator if denominator > 0 else 0.0


def _per_query(name, rel, k):
    """One query's value of ``name`` at ``k``, from its relevance list (all visible items)."""
    r = sum(rel)
    if name == "recall":
        return 1.0 if any(rel[:k]) else 0.0
    if name == "precision":
        return sum(rel[:k]) / k
    if name == "map_at_k":
        return _average_precision(rel, k, min(k, r))
    if name == "map_at_r":
        return _average_precision(rel, r, r)
    if name == "r_precision":
        return sum(rel[:r]) / r if r > 0 else 0.0
    raise ValueError(name)


def grouped_metric(name, embeddings, labels, ks=(1,), gallery_embeddings=None,
                   gallery_labels=None, metric="cosine", unmatched=None, groups=None,
                   gallery_groups=None):
    """``"recall"``, ``"precision"``, ``"map_at_k"`` (``{k: value}``), ``"map_at_r"``,
    ``"r_precision"`` (a value) over the rankings left by the exclusions: R is the number of
    same-label items a query's ranking holds. ``unmatched`` defaults to ``"miss"`` for recall,
    ``"exclude"`` otherwise."""
    if unmatched is None:
        unmatched = "miss" if name == "recall" else "exclude"
    labels, gallery_labels, _ = _retrieval_setup(labels, gallery_embeddings, gallery_labels)
    rankings = visible_rankings(embeddings, gallery_embeddings, metric, groups, gallery_groups)
    rels = [[gallery_labels[g] == labels[q] for g in ranking]
            for q, ranking in enumerate(rankings)]
    matched = [sum(rel) > 0 for rel in rels]
    if name in ("map_at_r", "r_precision"):
        return _mean_over_queries([_per_query(name, rel, 0) for rel in rels], matched, unmatched)
    return {k: _mean_over_queries([_per_query(name, rel, k) for rel in rels], matched, unmatched)
            for k in ks}


def pair_scores(embeddings, labels, gallery_embeddings=None, gallery_labels=None,
                metric="cosine", groups=None, gallery_groups=None):
    """``(genuine, impostor)`` lists of pair scores, larger is nearer (cosine similarities, or
    minus squared distances): every (query, gallery item) pair, or without a gallery every
    pair ``i < j`` once, leaving out the pairs of one group."""
    queries = np.asarray(embeddings, dtype=np.float64)
    exclude_self = gallery_embeddings is None
    gallery = queries if exclude_self else np.asarray(gallery_embeddings, dtype=np.float64)
    labels, gallery_labels, _ = _retrieval_setup(labels, gallery_embeddings, gallery_labels)
    if groups is not None:
        groups = [int(v) for v in groups]
        gallery_groups = groups if exclude_self else [int(v) for v in gallery_groups]
    if metric == "cosine":
        queries, gallery = l2_normalize(queries), l2_normalize(gallery)
    genuine, impostor = [], []
    for q in range(len(queries)):
        for g in range(len(gallery)):
            if exclude_self and g <= q:
                continue
            if groups is not None and groups[q] == gallery_groups[g]:
                continue
            if metric == "cosine":
                score = dot(queries[q], gallery[g])
            else:
                score = -squared_distance(queries[q], gallery[g])
            (genuine if labels[q] == gallery_labels[g] else impostor).append(score)
    return genuine, impostor


def fnmr_at_fmr(embeddings, labels, fmrs, gallery_embeddings=None, gallery_labels=None,
                metric="cosine", groups=None, gallery_groups=None):
    """For each ``f``: among the thresholds ``t`` (every pair score, and +inf) that accept the
    pairs with a score ``>= t``, the lowest one whose share of impostor pairs accepted is at
    most ``f``; the share of genuine pairs it rejects (score ``< t``)."""
    genuine, impostor = pair_scores(embeddings, labels, gallery_embeddings, gallery_labels,
                                    metric, groups, gallery_groups)
    return fnmr_from_pair_scores(genuine, impostor, fmrs)


def fnmr_from_pair_scores(genuine, impostor, fmrs):
    """:func:`fnmr_at_fmr` from the lists of genuine and impostor pair scores."""
    genuine, impostor = np.array(genuine), np.array(impostor)
    candidates = sorted(set(genuine.tolist()) | set(impostor.tolist())) + [math.inf]
    result = {}
    for f in fmrs:
        for t in candidates:  # the most lenient first
            if np.sum(impostor >= t) / len(impostor) <= f:
                result[f] = float(np.sum(genuine < t) / len(genuine))
                break
    return result


def oml_fnmr_at_fmr(genuine_distances, impostor_distances, fmrs):
    """open-metric-learning's definition: the threshold is the ``f``-quantile of the impostor
    distances (linear interpolation); genuine pairs at a distance >= it are rejected."""
    genuine = np.asarray(genuine_distances, dtype=np.float64)
    thresholds = np.quantile(np.asarray(impostor_distances, dtype=np.float64), fmrs)
    return {f: float(np.mean(genuine >= t)) for f, t in zip(fmrs, thresholds, strict=True)}


def pcf(embeddings, shares):
    """Principal-components fraction: the fewest components whose eigenvalues (of the
    covariance, those below D * eps * the largest counted as 0) reach ``r`` of their sum,
    over D; ``nan`` when all rows are equal."""
    x = np.asarray(embeddings, dtype=np.float32).astype(np.float64)
    dim = x.shape[1]
    if all((row == x[0]).all() for row in x):
        return {r: math.nan for r in shares}
    centred = x - x.mean(axis=0)
    eig = sorted(np.linalg.eigvalsh(centred.T @ centred / len(x)).tolist(), reverse=True)
    eig = [e if e > dim * np.finfo(np.float64).eps * eig[0] else 0.0 for e in eig]
    total = 0.0
    for e in eig:
        total += e
    result = {}
    for r in shares:
        running = 0.0
        for n, e in enumerate(eig, start=1):
            running += e
            if running >= r * total:
                result[r] = n / dim
                break
    return result


# -- multi-hot labels: relevant = the label sets share a label (or a Jaccard >= min_jaccard) ---


def label_set(row):
    """The set of the labels of a multi-hot row: the positions of its ones."""
    return {j for j, value in enumerate(row) if value}


def set_jaccard(a, b):
    """|A & B| / |A | B| of two label sets, as an exact fraction."""
    return Fraction(len(a & b), len(a | b))


def sets_relevant(a, b, min_jaccard=None):
    """Two label sets are relevant to each other when they share a label, or with
    ``min_jaccard`` when their Jaccard similarity is at least ``min_jaccard``."""
    if min_jaccard is None:
        return len(a & b) > 0
    return set_jaccard(a, b) >= Fraction(min_jaccard)


def _set_rankings(embeddings, labels, gallery_embeddings, gallery_labels, metric, groups,
                  gallery_groups):
    """(rankings left by the exclusions, query label sets, gallery label sets)."""
    query_sets = [label_set(row) for row in np.asarray(labels)]
    gallery_sets = (query_sets if gallery_embeddings is None
                    else [label_set(row) for row in np.asarray(gallery_labels)])
    rankings = visible_rankings(embeddings, gallery_embeddings, metric, groups, gallery_groups)
    return rankings, query_sets, gallery_sets


def multilabel_metric(name, embeddings, labels, ks=(1,), gallery_embeddings=None,
                      gallery_labels=None, metric="cosine", unmatched=None, groups=None,
                      gallery_groups=None, min_jaccard=None):
    """:func:`grouped_metric` of multi-hot labels: a gallery item is a hit (and counts in
    R) when its label set is relevant to the query's (:func:`sets_relevant`)."""
    if unmatched is None:
        unmatched = "miss" if name == "recall" else "exclude"
    rankings, query_sets, gallery_sets = _set_rankings(
        embeddings, labels, gallery_embeddings, gallery_labels, metric, groups, gallery_groups)
    rels = [[sets_relevant(query_sets[q], gallery_sets[g], min_jaccard) for g in ranking]
            for q, ranking in enumerate(rankings)]
    matched = [sum(rel) > 0 for rel in rels]
    if name in ("map_at_r", "r_precision"):
        return _mean_over_queries([_per_query(name, rel, 0) for rel in rels], matched, unmatched)
    return {k: _mean_over_queries([_per_query(name, rel, k) for rel in rels], matched, unmatched)
            for k in ks}


def _kishida_sum(gains, k):
    """sum_{i=1..k} (g_i / i) sum_{j=1..i} g_j."""
    total = 0.0
    for i in range(1, min(k, len(gains)) + 1):
        cumulative = 0.0
        for j in range(1, i + 1):
            cumulative += gains[j - 1]
        total += gains[i - 1] / i * cumulative
    return total


def graded_map_at_k(embeddings, labels, ks, gallery_embeddings=None, gallery_labels=None,
                    metric="cosine", unmatched="exclude", groups=None, gallery_groups=None,
                    min_jaccard=None):
    """Mean graded AP@K (Kishida 2005): gain = the Jaccard similarity of a relevant pair's
    label sets (0 otherwise); gAP@K = _kishida_sum(gains, K) / _kishida_sum(ideal, K), the
    ideal gains those of every ranked item sorted in decreasing order."""
    rankings, query_sets, gallery_sets = _set_rankings(
        embeddings, labels, gallery_embeddings, gallery_labels, metric, groups, gallery_groups)
    result = {}
    for k in ks:
        values, matched = [], []
        for q, ranking in enumerate(rankings):
            gains = []
            for g in ranking:
                relevant = sets_relevant(query_sets[q], gallery_sets[g], min_jaccard)
                gains.append(float(set_jaccard(query_sets[q], gallery_sets[g]))
                             if relevant else 0.0)
            ideal = sorted(gains, reverse=True)
            matched.append(any(gain > 0 for gain in gains))
            best = _kishida_sum(ideal, k)
            values.append(_kishida_sum(gains, k) / best if best > 0 else 0.0)
        result[k] = _mean_over_queries(values, matched, unmatched)
    return result


def multilabel_fnmr_at_fmr(embeddings, labels, fmrs, gallery_embeddings=None,
                           gallery_labels=None, metric="cosine", min_jaccard=None):
    """:func:`fnmr_at_fmr` where a pair is genuine when its label sets are relevant."""
    queries = np.asarray(embeddings, dtype=np.float64)
    exclude_self = gallery_embeddings is None
    gallery = queries if exclude_self else np.asarray(gallery_embeddings, dtype=np.float64)
    query_sets = [label_set(row) for row in np.asarray(labels)]
    gallery_sets = (query_sets if exclude_self
                    else [label_set(row) for row in np.asarray(gallery_labels)])
    if metric == "cosine":
        queries, gallery = l2_normalize(queries), l2_normalize(gallery)
    genuine, impostor = [], []
    for q in range(len(queries)):
        for g in range(len(gallery)):
            if exclude_self and g <= q:
                continue
            if metric == "cosine":
                score = dot(queries[q], gallery[g])
            else:
                score = -squared_distance(queries[q], gallery[g])
            relevant = sets_relevant(query_sets[q], gallery_sets[g], min_jaccard)
            (genuine if relevant else impostor).append(score)
    return fnmr_from_pair_scores(genuine, impostor, fmrs)
