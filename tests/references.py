"""Plain-Python/NumPy reference implementations, written from the specification.

Everything here is deliberately naive: explicit loops over anchors, positives and
negatives, float64 throughout, no vectorised tricks. The point is to be obviously
correct, not fast; keep the inputs small.

Specification (see tfdml.miners / tfdml.losses.triplet docstrings and the
extreme-triplet paper, eqs. 1 and 16 and appendix E):

* scores: cosine similarity of L2-normalized embeddings (raw dot products with
  ``normalize=False``), or the negated distance for the margin loss;
* positives of anchor ``a``: reference rows of the same label except ``a``
  itself (row ``a + ref_offset``; none excluded when ``ref_offset`` is None);
  negatives: reference rows of another label;
* the strategies and the disjoint mode as in :func:`mine_triplets`;
* per anchor the loss is the mean over its triplets; the loss is the mean over
  the anchors that have at least one triplet, 0 when none has.
"""

from __future__ import annotations

import math

import numpy as np

# -- basic vector operations ---------------------------------------------------------------------


def _floats(u):
    # Plain Python floats: the loops below are much faster on them than on NumPy scalars.
    if isinstance(u, list):
        return u
    return u.tolist() if isinstance(u, np.ndarray) else [float(a) for a in u]


def dot(u, v):
    total = 0.0
    for a, b in zip(_floats(u), _floats(v), strict=True):
        total += a * b
    return total


def norm(u):
    return math.sqrt(dot(u, u))


def l2_normalize(x):
    """Row-wise L2 normalization; a zero row stays zero."""
    x = np.asarray(x, dtype=np.float64)
    out = np.zeros_like(x)
    for i in range(x.shape[0]):
        n = norm(x[i])
        if n > 0.0:
            for k in range(x.shape[1]):
                out[i, k] = x[i, k] / n
    return out


def squared_distance(u, v):
    total = 0.0
    for a, b in zip(_floats(u), _floats(v), strict=True):
        total += (a - b) ** 2
    return total


def pairwise_similarity(x, y=None):
    x = np.asarray(x, dtype=np.float64)
    y = x if y is None else np.asarray(y, dtype=np.float64)
    out = np.zeros((x.shape[0], y.shape[0]))
    xs, ys = x.tolist(), y.tolist()
    for i in range(x.shape[0]):
        for j in range(y.shape[0]):
            out[i, j] = dot(xs[i], ys[j])
    return out


def pairwise_distance(x, y=None, squared=False):
    x = np.asarray(x, dtype=np.float64)
    y = x if y is None else np.asarray(y, dtype=np.float64)
    out = np.zeros((x.shape[0], y.shape[0]))
    xs, ys = x.tolist(), y.tolist()
    for i in range(x.shape[0]):
        for j in range(y.shape[0]):
            sq = squared_distance(xs[i], ys[j])
            out[i, j] = sq if squared else math.sqrt(sq)
    return out


def distance(u, v, kind):
    """``"cosine"``: 1 - u.v; ``"squared_l2"``: |u - v|^2; ``"l2"``: |u - v|."""
    if kind == "cosine":
        return 1.0 - dot(u, v)
    if kind == "squared_l2":
        return squared_distance(u, v)
    if kind == "l2":
        return math.sqrt(squared_distance(u, v))
    raise ValueError(kind)


def softplus(z):
    # log(1 + e^z), computed without overflow.
    return max(z, 0.0) + math.log1p(math.exp(-abs(z)))


# -- labels and candidates -----------------------------------------------------------------------


def label_masks(labels, ref_labels=None, ref_offset=0):
    """Boolean ``(positive, negative)`` matrices ``[B, R]`` built pair by pair."""
    labels = [int(v) for v in np.asarray(labels).reshape(-1)]
    ref_labels = labels if ref_labels is None else [int(v) for v in np.asarray(ref_labels)]
    pos = np.zeros((len(labels), len(ref_labels)), dtype=bool)
    neg = np.zeros_like(pos)
    for a in range(len(labels)):
        for r in range(len(ref_labels)):
            is_self = ref_offset is not None and r == a + ref_offset
            if ref_labels[r] == labels[a]:
                pos[a, r] = not is_self
            else:
                neg[a, r] = True
    return pos, neg


def positives_of(a, labels, ref_labels, ref_offset):
    self_row = None if ref_offset is None else a + ref_offset
    return [r for r in range(len(ref_labels)) if ref_labels[r] == labels[a] and r != self_row]


def negatives_of(a, labels, ref_labels):
    return [r for r in range(len(ref_labels)) if ref_labels[r] != labels[a]]


def most_similar(row, candidates):
    best = None
    for c in candidates:
        if best is None or row[c] > row[best]:
            best = c
    return best


def least_similar(row, candidates):
    best = None
    for c in candidates:
        if best is None or row[c] < row[best]:
            best = c
    return best


def semihard_candidates(row, negatives, p):
    """Negatives not more similar to the anchor than the positive ``p``."""
    return [n for n in negatives if row[n] <= row[p]]


# -- mining --------------------------------------------------------------------------------------


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
    labels = [int(v) for v in np.asarray(labels).reshape(-1)]
    ref_labels = labels if ref_labels is None else [int(v) for v in np.asarray(ref_labels)]
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


# -- reading a miner's output (plain arrays) -----------------------------------------------------


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


# -- losses --------------------------------------------------------------------------------------


def _mean_over_anchors(per_triplet):
    """``per_triplet``: {(a, p, n): value}. Mean per anchor, then over anchors with any."""
    by_anchor = {}
    for (a, _, _), value in per_triplet.items():
        by_anchor.setdefault(a, []).append(value)
    if not by_anchor:
        return 0.0
    anchor_means = [sum(vals) / len(vals) for vals in by_anchor.values()]
    return sum(anchor_means) / len(anchor_means)


def _prepare(embeddings, ref_embeddings, normalize):
    x = np.asarray(embeddings, dtype=np.float64)
    ref = x if ref_embeddings is None else np.asarray(ref_embeddings, dtype=np.float64)
    if normalize:
        x, ref = l2_normalize(x), l2_normalize(ref)
    return x, ref


def nca_scores(embeddings, ref_embeddings=None, normalize=True):
    """Cosine similarities (dot products without normalization), ``[B, R]``."""
    x, ref = _prepare(embeddings, ref_embeddings, normalize)
    return pairwise_similarity(x, ref)


def margin_scores(embeddings, ref_embeddings=None, distance_kind="squared_l2", normalize=True):
    """Negated distances ``-d(a, r)``, ``[B, R]`` (larger is more similar)."""
    x, ref = _prepare(embeddings, ref_embeddings, normalize)
    out = np.zeros((x.shape[0], ref.shape[0]))
    xs, refs = x.tolist(), ref.tolist()
    for i in range(x.shape[0]):
        for j in range(ref.shape[0]):
            out[i, j] = -distance(xs[i], refs[j], distance_kind)
    return out


def nca_triplet_value(s_ap, s_an, order=1, temperature=1.0):
    """Eq. 1 (order 1) or eq. 16 (order 2) of the extreme-triplet paper, with temperature."""
    if order == 1:
        # -log(e^{s_ap/T} / (e^{s_ap/T} + e^{s_an/T}))
        return softplus((s_an - s_ap) / temperature)
    u = s_ap - 0.5 * s_ap * s_ap
    v = 0.5 * s_an * s_an
    return softplus((v - u) / temperature)


def margin_triplet_value(d_ap, d_an, margin):
    return max(d_ap - d_an + margin, 0.0)


def _split_ref(labels, ref_embeddings, ref_labels, ref_offset):
    labels = [int(v) for v in np.asarray(labels).reshape(-1)]
    if ref_embeddings is None:
        return labels, labels, 0
    return labels, [int(v) for v in np.asarray(ref_labels).reshape(-1)], ref_offset


def nca_loss(labels, embeddings, order=1, temperature=1.0, positive="easy", negative="hard",
             disjoint=False, normalize=True, ref_embeddings=None, ref_labels=None,
             ref_offset=None, chooser=None, triplets=None):
    """Reference triplet NCA loss. Returns ``(value, triplets)``.

    ``triplets``: use these instead of mining (for finite differences and for
    random strategies).
    """
    labels, ref_labels, ref_offset = _split_ref(labels, ref_embeddings, ref_labels, ref_offset)
    s = nca_scores(embeddings, ref_embeddings, normalize)
    if triplets is None:
        triplets = mine_triplets(s, labels, ref_labels, ref_offset, positive, negative,
                                 disjoint, chooser)
    per_triplet = {}
    for a, p, n in triplets:
        per_triplet[(a, p, n)] = nca_triplet_value(s[a, p], s[a, n], order, temperature)
    return _mean_over_anchors(per_triplet), triplets


def margin_loss(labels, embeddings, margin=0.2, distance_kind="squared_l2", positive="all",
                negative="semihard", disjoint=False, normalize=True, ref_embeddings=None,
                ref_labels=None, ref_offset=None, chooser=None, triplets=None):
    """Reference margin triplet loss ``max(d_ap - d_an + margin, 0)``. Returns ``(value, triplets)``."""
    labels, ref_labels, ref_offset = _split_ref(labels, ref_embeddings, ref_labels, ref_offset)
    s = margin_scores(embeddings, ref_embeddings, distance_kind, normalize)
    if triplets is None:
        triplets = mine_triplets(s, labels, ref_labels, ref_offset, positive, negative,
                                 disjoint, chooser)
    per_triplet = {}
    for a, p, n in triplets:
        per_triplet[(a, p, n)] = margin_triplet_value(-s[a, p], -s[a, n], margin)
    return _mean_over_anchors(per_triplet), triplets


def finite_difference_gradient(f, x, h=1e-6):
    """Central differences of the scalar function ``f`` at ``x`` (float64)."""
    x = np.array(x, dtype=np.float64)
    grad = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        old = x[idx]
        x[idx] = old + h
        up = f(x)
        x[idx] = old - h
        down = f(x)
        x[idx] = old
        grad[idx] = (up - down) / (2.0 * h)
    return grad


# -- metrics -------------------------------------------------------------------------------------


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


# -- metrics at scale: exclusions by group, Precision@K, MAP@K, FNMR@FMR, PCF -------------------


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


# -- test data -----------------------------------------------------------------------------------


def make_labels(counts, seed, values=None):
    """Shuffled labels with ``counts[i]`` samples of class ``values[i]``."""
    rng = np.random.default_rng(seed)
    if values is None:
        values = [3 * i + 1 for i in range(len(counts))]  # non-contiguous ids
    labels = []
    for value, count in zip(values, counts, strict=True):
        labels.extend([value] * count)
    labels = np.array(labels, dtype=np.int32)
    rng.shuffle(labels)
    return labels


def make_batch(counts, dim, seed):
    """``(labels [B], embeddings [B, dim] float64)``, seeded."""
    labels = make_labels(counts, seed)
    rng = np.random.default_rng(seed + 1000)
    return labels, rng.normal(size=(len(labels), dim))


# -- distance-weighted sampling (Wu et al. 2017) -------------------------------------------------


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
    anchor = _floats(np.asarray(anchor, dtype=np.float64))
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


# -- pairs -----------------------------------------------------------------------------------------


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
    labels = [int(v) for v in np.asarray(labels).reshape(-1)]
    ref_labels = labels if ref_labels is None else [int(v) for v in np.asarray(ref_labels)]
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


# -- pair losses -----------------------------------------------------------------------------------


def _distances(embeddings, ref_embeddings, distance_kind, normalize):
    x, ref = _prepare(embeddings, ref_embeddings, normalize)
    out = np.zeros((x.shape[0], ref.shape[0]))
    xs, refs = x.tolist(), ref.tolist()
    for i in range(x.shape[0]):
        for j in range(ref.shape[0]):
            out[i, j] = distance(xs[i], refs[j], distance_kind)
    return out


def _mean(values):
    return sum(values) / len(values)


def mean_of_anchors(per_anchor, keep=None):
    """Mean of ``{anchor: value}`` over the anchors in ``keep`` (default: all); 0 if none."""
    values = [v for a, v in per_anchor.items() if keep is None or a in keep]
    return _mean(values) if values else 0.0


def average_terms(terms, average, batch_size):
    """The value of a loss from its terms, as tfdml's ``average=`` defines it.

    ``terms``: ``{anchor: [term losses]}`` for the anchors that have terms.

    * ``"anchors"``: mean over those anchors of the mean of their terms;
    * ``"batch"``: sum over anchors of the mean of their terms, divided by
      ``batch_size`` (anchors without terms count as 0);
    * ``"terms"``: sum of all terms divided by their number;
    * ``"nonzero"``: sum of all terms divided by the number of terms > 0.

    0 when the denominator is 0.
    """
    means = [_mean(v) for v in terms.values() if v]
    everything = [t for v in terms.values() for t in v]
    if average == "anchors":
        return _mean(means) if means else 0.0
    if average == "batch":
        return sum(means) / batch_size
    if average == "terms":
        return sum(everything) / len(everything) if everything else 0.0
    if average == "nonzero":
        count = sum(1 for t in everything if t > 0)
        return sum(everything) / count if count else 0.0
    raise ValueError(average)


def anchor_values(terms, average):
    """tfdml's per-anchor values (``reduction="none"``): means for ``"anchors"``/``"batch"``,
    sums for ``"terms"``/``"nonzero"``."""
    if average in ("anchors", "batch"):
        return {a: _mean(v) for a, v in terms.items() if v}
    return {a: sum(v) for a, v in terms.items() if v}


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
    return {a: _mean(v) for a, v in _pair_terms(pos_mask, neg_mask, pos_value,
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
    return value, {a: _mean(v) for a, v in terms.items()}


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
    return value, {a: _mean(v) for a, v in terms.items()}


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
    return value, {a: _mean(v) for a, v in terms.items()}


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


# -- trimming --------------------------------------------------------------------------------------


def trim_keep(losses, valid, trim):
    """The anchors a trimmed loss keeps (Shen & Sanghavi 2019), as a set of indices.

    Of the ``n`` valid anchors, the ``floor(trim * n)`` with the highest loss are
    dropped (``trim`` read as the exact decimal it is written as); among equal
    losses the later anchor is dropped first.
    """
    from fractions import Fraction

    valid_anchors = [a for a in range(len(losses)) if valid[a]]
    drop = math.floor(Fraction(repr(float(trim))) * len(valid_anchors))
    ranked = sorted(valid_anchors, key=lambda a: (float(losses[a]), a))
    return set(ranked[:len(ranked) - drop])


# -- LoOp (optimal hard negatives between pairs) -----------------------------------------------


def _arc_points(a, b, count):
    """``count`` points of the shorter great-circle arc from unit vector ``a`` to ``b``."""
    cos = float(np.clip(a @ b, -1.0, 1.0))
    angle = np.arccos(cos)
    ortho = b - cos * a
    norm = np.linalg.norm(ortho)
    if norm < 1e-12:  # a point (a == b) or undefined (a == -b): the two endpoints only
        return np.stack([a, b])
    ortho = ortho / norm
    t = np.linspace(0.0, angle, count)[:, None]
    return np.cos(t) * a + np.sin(t) * ortho


def brute_force_arc_distance(x1, x2, y1, y2, count=801):
    """Minimum distance between two arcs: dense sampling, then a bounded local refinement."""
    from scipy.optimize import minimize

    def point(a, b, t):
        cos = float(np.clip(a @ b, -1.0, 1.0))
        ortho = b - cos * a
        norm = np.linalg.norm(ortho)
        if norm < 1e-12:
            return a if t < 0.5 else b
        return np.cos(t * np.arccos(cos)) * a + np.sin(t * np.arccos(cos)) * ortho / norm

    p, q = _arc_points(x1, x2, count), _arc_points(y1, y2, count)
    d = np.linalg.norm(p[:, None, :] - q[None, :, :], axis=-1)
    i, j = np.unravel_index(np.argmin(d), d.shape)
    best = d[i, j]
    if len(p) > 2 and len(q) > 2:
        start = (i / (len(p) - 1), j / (len(q) - 1))
        res = minimize(lambda z: np.linalg.norm(point(x1, x2, z[0]) - point(y1, y2, z[1])),
                       start, bounds=[(0, 1), (0, 1)], method="L-BFGS-B",
                       options={"ftol": 1e-15, "gtol": 1e-12})
        best = min(best, float(res.fun))
    return best


def brute_force_segment_distance(x1, x2, y1, y2, count=801):
    """Minimum distance between two straight segments, by dense sampling + refinement."""
    from scipy.optimize import minimize

    t = np.linspace(0.0, 1.0, count)[:, None]
    p, q = x1 + t * (x2 - x1), y1 + t * (y2 - y1)
    d = np.linalg.norm(p[:, None, :] - q[None, :, :], axis=-1)
    i, j = np.unravel_index(np.argmin(d), d.shape)
    res = minimize(lambda z: np.linalg.norm(x1 + z[0] * (x2 - x1) - y1 - z[1] * (y2 - y1)),
                   (t[i, 0], t[j, 0]), bounds=[(0, 1), (0, 1)], method="L-BFGS-B",
                   options={"ftol": 1e-15, "gtol": 1e-12})
    return min(float(d[i, j]), float(res.fun))


def label_pairs(labels):
    """Disjoint same-class pairs: per class, in batch order, (1st, 2nd), (3rd, 4th), ..."""
    labels = np.asarray(labels).reshape(-1)
    pairs = []
    for c in sorted(set(labels.tolist())):
        members = [i for i in range(len(labels)) if labels[i] == c]
        pairs += [(members[t], members[t + 1]) for t in range(0, len(members) - 1, 2)]
    return pairs


def loop_losses(labels, embeddings, base, margin, normalized=True, alpha=2.0, beta=50.0,
                epsilon=0.1, loop=True):
    """The LoOp losses (and, with ``loop=False``, the HPHN / lifted-structure baselines).

    Loops over positive pairs and negative pairs; the LoOp distance is the
    brute-force minimum between the arcs (or segments). Returns ``(value, per_key)``
    where ``per_key`` maps a pair's first sample (a sample, for MS) to its loss.
    """
    labels = np.asarray(labels).reshape(-1)
    x = np.asarray(embeddings, np.float64)
    if normalized:
        x = x / np.linalg.norm(x, axis=1, keepdims=True)
    n = len(labels)
    d = np.array([[np.linalg.norm(x[i] - x[k]) for k in range(n)] for i in range(n)])
    pairs = label_pairs(labels)
    between = brute_force_arc_distance if normalized else brute_force_segment_distance
    loop_d = {}
    for (i, j) in pairs:
        for (k, m) in pairs:
            if labels[k] != labels[i]:
                loop_d[(i, j), (k, m)] = between(x[i], x[j], x[k], x[m])
    per_key = {}
    if base == "multi_similarity":
        sim = 1.0 - d**2 / 2.0
        for (i, j) in pairs:
            negs = [q for q in pairs if labels[q[0]] != labels[i]]
            for a in (i, j):
                same = [k for k in range(n) if k != a and labels[k] == labels[a]]
                other = [k for k in range(n) if labels[k] != labels[a]]
                if not same or not other:
                    continue
                pos = [sim[a, k] for k in same if sim[a, k] - epsilon < max(sim[a, o] for o in other)]
                neg = [1.0 - loop_d[(i, j), q] ** 2 / 2.0 for q in negs]
                neg = [s for s in neg if s > min(sim[a, k] for k in same) - epsilon]
                if not pos or not neg:
                    continue
                per_key[a] = (np.log1p(sum(np.exp(-alpha * (s - margin)) for s in pos)) / alpha
                              + np.log1p(sum(np.exp(beta * (s - margin)) for s in neg)) / beta)
    else:
        for (i, j) in pairs:
            negs = [q for q in pairs if labels[q[0]] != labels[i]]
            if loop:
                if not negs:
                    continue
                loop_values = [loop_d[(i, j), q] for q in negs]
                closest = min(loop_values)
            else:
                others = [d[a, k] for a in (i, j) for k in range(n) if labels[k] != labels[a]]
                if not others:
                    continue
                closest = min(others)
            if base == "triplet":
                per_key[i] = sum(max(d[i, j] - v + margin, 0.0) for v in loop_values)
            elif base == "hphn_triplet":
                far = max(d[a, k] for a in (i, j) for k in range(n) if labels[k] == labels[a])
                per_key[i] = max(far + margin - closest, 0.0)
            elif base == "lifted_structure":
                per_key[i] = max(d[i, j] + margin - closest, 0.0)
            else:
                raise ValueError(base)
    value = float(np.mean(list(per_key.values()))) if per_key else 0.0
    return value, per_key


# -- FAPPY and histogram loss --------------------------------------------------------------------
#
# FAPPY paper, Section 3 (eqs. 3, 4, 5, 7) and Algorithm 1; the histogram loss of Ustinova and
# Lempitsky (NIPS 2016). Nodes ``b_u = -1 + u * delta`` for ``u = 0 .. n-1``, ``n = 2/delta + 1``.


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


# -- TensorFlow Addons' metric-learning losses (tfdml.compat.tfa) -------------------------------


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


# == proxy and classification losses: learned class vectors =======================================
#
# Every loss below compares the L2-normalized embedding x_b with L2-normalized class vectors
# (one per class, [C, D], or k per class, [C, k, D]) by their cosine, loops over samples and
# classes, and returns ``(value, per_sample)`` with ``value`` the mean of the list
# ``per_sample`` (Proxy Anchor, a sum over proxies, returns its value only).


def logsumexp(values):
    """``log(sum exp(v))`` of a list of floats (the largest subtracted first); -inf if empty."""
    values = [float(v) for v in values]
    if not values:
        return -math.inf
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))


def cross_entropy(logits, target):
    """``-log softmax(logits)[target]`` of a list of floats."""
    return logsumexp(logits) - logits[target]


def unit_class_vectors(weights):
    """``[C, D]`` or ``[C, k, D]`` class vectors, each vector L2-normalized (float64)."""
    w = np.asarray(weights, dtype=np.float64)
    flat = l2_normalize(w.reshape(-1, w.shape[-1]))
    return flat.reshape(w.shape)


def class_cosines(embeddings, weights):
    """``cos[b][c]`` (``[C, D]`` weights) or ``cos[b][c][j]`` (``[C, k, D]``), nested lists."""
    x = l2_normalize(embeddings).tolist()
    w = unit_class_vectors(weights)
    out = []
    for b in range(len(x)):
        row = []
        for c in range(w.shape[0]):
            if w.ndim == 2:
                row.append(dot(x[b], w[c]))
            else:
                row.append([dot(x[b], w[c, j]) for j in range(w.shape[1])])
        out.append(row)
    return out


def _class_ids(labels):
    return [int(v) for v in np.asarray(labels).reshape(-1)]


def _mean_of_samples(per_sample):
    return _mean(per_sample), per_sample


def proxy_anchor_loss(labels, embeddings, proxies, margin=0.1, alpha=32.0, sample_weight=None):
    """Proxy Anchor loss (Kim et al. 2020). Returns the value.

    Per proxy ``c``: ``pos_c = log(1 + sum_{b: y_b = c} w_b exp(-alpha (cos_bc - margin)))``
    and ``neg_c = log(1 + sum_{b: y_b != c} w_b exp(alpha (cos_bc + margin)))``; the
    value is ``sum_c pos_c / #(classes with a sample) + sum_c neg_c / C``. ``w_b`` is
    the sample weight (1 without); a sample of weight 0 is left out altogether.
    """
    labels = _class_ids(labels)
    cos = class_cosines(embeddings, proxies)
    num_classes = np.asarray(proxies).shape[0]
    weights = [1.0] * len(labels) if sample_weight is None else [
        float(w) for w in np.asarray(sample_weight).reshape(-1)]
    positive_total, present, negative_total = 0.0, 0, 0.0
    for c in range(num_classes):
        pull, push, has_sample = 0.0, 0.0, False
        for b in range(len(labels)):
            if weights[b] == 0.0:
                continue
            if labels[b] == c:
                pull += weights[b] * math.exp(-alpha * (cos[b][c] - margin))
                has_sample = True
            else:
                push += weights[b] * math.exp(alpha * (cos[b][c] + margin))
        if has_sample:
            positive_total += math.log1p(pull)
            present += 1
        negative_total += math.log1p(push)
    return (positive_total / present if present else 0.0) + negative_total / num_classes


def proxy_nca_loss(labels, embeddings, proxies, scale=1.0):
    """Proxy-NCA: per sample ``-log softmax_y(-scale |x - p_c|^2)`` over all ``C`` proxies."""
    labels = _class_ids(labels)
    x = l2_normalize(embeddings)
    p = unit_class_vectors(proxies)
    per_sample = []
    for b in range(len(labels)):
        logits = [-scale * squared_distance(x[b], p[c]) for c in range(p.shape[0])]
        per_sample.append(cross_entropy(logits, labels[b]))
    return _mean_of_samples(per_sample)


def normalized_softmax_loss(labels, embeddings, weights, temperature=0.05):
    """Normalized softmax: per sample the cross-entropy of ``cos_c / temperature``."""
    labels = _class_ids(labels)
    cos = class_cosines(embeddings, weights)
    per_sample = [cross_entropy([c / temperature for c in cos[b]], labels[b])
                  for b in range(len(labels))]
    return _mean_of_samples(per_sample)


def _target_margin_loss(labels, cos, scale, target_logit):
    """Cross-entropy of ``scale * cos_c``, the target column ``scale * target_logit(cos_y)``."""
    per_sample = []
    for b in range(len(labels)):
        y = labels[b]
        logits = [scale * target_logit(cos[b][c]) if c == y else scale * cos[b][c]
                  for c in range(len(cos[b]))]
        per_sample.append(cross_entropy(logits, y))
    return _mean_of_samples(per_sample)


def cosface_loss(labels, embeddings, weights, margin=0.35, scale=64.0):
    """CosFace: target logit ``scale (cos_y - margin)``, the others ``scale cos_c``."""
    return _target_margin_loss(_class_ids(labels), class_cosines(embeddings, weights), scale,
                               lambda cos_y: cos_y - margin)


def arcface_target(cos_y, margin):
    """``cos(theta + m)`` with ``theta = arccos(cos_y)`` if ``theta <= pi - m``, else
    ``cos_y - m sin(m)``."""
    theta = math.acos(min(max(cos_y, -1.0), 1.0))
    if theta <= math.pi - margin:
        return math.cos(theta + margin)
    return cos_y - margin * math.sin(margin)


def arcface_loss(labels, embeddings, weights, margin=0.5, scale=64.0):
    """ArcFace: target logit ``scale * arcface_target(cos_y)``, the others ``scale cos_c``."""
    return _target_margin_loss(_class_ids(labels), class_cosines(embeddings, weights), scale,
                               lambda cos_y: arcface_target(cos_y, margin))


def subcenter_arcface_loss(labels, embeddings, weights, margin=0.5, scale=64.0):
    """Sub-centre ArcFace: ``cos_c`` = the largest cosine of class ``c``'s ``k`` sub-centres."""
    nearest = [[max(centres) for centres in row] for row in class_cosines(embeddings, weights)]
    return _target_margin_loss(_class_ids(labels), nearest, scale,
                               lambda cos_y: arcface_target(cos_y, margin))


def soft_triple_loss(labels, embeddings, centers, la=20.0, gamma=0.1, margin=0.01):
    """SoftTriple: ``S_c = sum_j softmax_j(cos_cj / gamma) cos_cj``; per sample the
    cross-entropy of ``la (S_c - margin [c = y])``."""
    labels = _class_ids(labels)
    cos = class_cosines(embeddings, centers)
    per_sample = []
    for b in range(len(labels)):
        logits = []
        for c, centres in enumerate(cos[b]):
            log_z = logsumexp([v / gamma for v in centres])
            similarity = sum(math.exp(v / gamma - log_z) * v for v in centres)
            logits.append(la * (similarity - (margin if c == labels[b] else 0.0)))
        per_sample.append(cross_entropy(logits, labels[b]))
    return _mean_of_samples(per_sample)


# == softmax losses over pairs: SupCon, NT-Xent, circle ============================================
#
# Cosine similarities s (dot products with ``normalize=False``) between the anchors (the
# batch) and the reference set (the batch itself by default); positives and negatives of
# an anchor as in :func:`positives_of` / :func:`negatives_of`. Each returns
# ``(value, terms)`` with ``terms = {anchor: [term losses]}`` for the anchors that have
# terms, and ``value = average_terms(terms, average, B)``.


def supcon_loss(labels, embeddings, temperature=0.1, normalize=True, ref_embeddings=None,
                ref_labels=None, ref_offset=None, average="anchors"):
    """Supervised contrastive loss (Khosla et al. 2020).

    ``L_a = -1/|P(a)| sum_{p in P(a)} [s_ap / T - log sum_{j in A(a)} exp(s_aj / T)]`` with
    ``A(a) = P(a) + N(a)`` (every reference row but the anchor itself); one term per
    anchor that has a positive and a negative.
    """
    labels, ref_labels, ref_offset = _split_ref(labels, ref_embeddings, ref_labels, ref_offset)
    s = nca_scores(embeddings, ref_embeddings, normalize)
    terms = {}
    for a in range(len(labels)):
        pos = positives_of(a, labels, ref_labels, ref_offset)
        neg = negatives_of(a, labels, ref_labels)
        if not pos or not neg:
            continue
        log_z = logsumexp([s[a, j] / temperature for j in pos + neg])
        terms[a] = [-sum(s[a, p] / temperature - log_z for p in pos) / len(pos)]
    return average_terms(terms, average, len(labels)), terms


def ntxent_loss(labels, embeddings, temperature=0.07, normalize=True, ref_embeddings=None,
                ref_labels=None, ref_offset=None, average="terms"):
    """NT-Xent: one term per positive pair ``(a, p)``,
    ``-log(e^{s_ap/T} / (e^{s_ap/T} + sum_{n in N(a)} e^{s_an/T}))`` (0 without negatives)."""
    labels, ref_labels, ref_offset = _split_ref(labels, ref_embeddings, ref_labels, ref_offset)
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
    labels, ref_labels, ref_offset = _split_ref(labels, ref_embeddings, ref_labels, ref_offset)
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
    labels, ref_labels, ref_offset = _split_ref(labels, ref_embeddings, ref_labels, ref_offset)
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


def pn_loss(labels, embeddings, margin=None, distance_kind="cosine",
            positive="hard", negative="semihard", normalize=True, average="anchors"):
    """PN triplet loss on the batch: ``max(d_ap - min(d_an, d_pn) + margin, 0)`` (or the
    softplus for ``margin=None``), one term per mined triplet. Returns ``(value, terms)``."""
    x, _ = _prepare(embeddings, None, normalize)
    s = margin_scores(x, None, distance_kind, normalize=False)
    terms = {}
    for a, p, n in sorted(mine_triplets(s, labels, positive=positive, negative=negative)):
        z = -s[a, p] - min(-s[a, n], -s[p, n])
        terms.setdefault(a, []).append(softplus(z) if margin is None else max(z + margin, 0.0))
    return average_terms(terms, average, len(labels)), terms


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


def p2s_grad_loss(labels, embeddings, weights):
    """P2SGrad as a loss: per sample ``1/2 sum_c (cos_c - [c = y])^2``."""
    labels = _class_ids(labels)
    cos = class_cosines(embeddings, weights)
    per_sample = [0.5 * sum((cos[b][c] - (1.0 if c == labels[b] else 0.0)) ** 2
                            for c in range(len(cos[b]))) for b in range(len(labels))]
    return _mean_of_samples(per_sample)


def _psi(cos, margin):
    """L-Softmax's ``(-1)^k cos(m theta) - 2k`` for ``theta`` in ``[k pi/m, (k+1) pi/m]``."""
    theta = math.acos(min(max(cos, -1.0), 1.0))
    k = math.floor(theta * margin / math.pi)
    return (-1) ** k * math.cos(margin * theta) - 2 * k


def large_margin_softmax_loss(labels, embeddings, weights, margin=4, scale=1.0,
                              weight_norms=True):
    """L-Softmax (Liu et al. 2016): logits ``scale |w_c| |x| cos``, the target's with
    ``psi`` instead of ``cos``. ``weight_norms=False``: SphereFace (unit weights)."""
    labels = _class_ids(labels)
    x = np.asarray(embeddings, np.float64)
    w = np.asarray(weights, np.float64)
    cos = class_cosines(x, w)
    per_sample = []
    for b in range(len(labels)):
        logits = []
        for c in range(w.shape[0]):
            magnitude = np.linalg.norm(x[b]) * (np.linalg.norm(w[c]) if weight_norms else 1.0)
            f = _psi(cos[b][c], margin) if c == labels[b] else cos[b][c]
            logits.append(scale * magnitude * f)
        per_sample.append(cross_entropy(logits, labels[b]))
    return _mean_of_samples(per_sample)


def sphereface_loss(labels, embeddings, weights, margin=4, scale=1.0):
    """SphereFace (Liu et al. 2017): L-Softmax with unit class weights."""
    return large_margin_softmax_loss(labels, embeddings, weights, margin, scale,
                                     weight_norms=False)


def triplets_where(labels, keep):
    """The triplets ``(a, p, n)`` of a batch (``p != a`` of ``a``'s class, ``n`` of another)
    for which ``keep(a, p, n)`` holds, by loops."""
    labels = np.asarray(labels)
    n = len(labels)
    return {(a, p, k) for a in range(n) for p in range(n) for k in range(n)
            if p != a and labels[p] == labels[a] and labels[k] != labels[a] and keep(a, p, k)}


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


# -- ranking losses: FastAP, PNP, Smooth-AP ------------------------------------------------------


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


# -- InstanceLoss and VICRegLoss -------------------------------------------------------------


def _lse(values):
    values = np.asarray(values, np.float64)
    top = values.max()
    return float(top + np.log(np.sum(np.exp(values - top))))


def instance_loss(labels, x, gamma=64.0, ref=None, ref_labels=None):
    """tfdml's InstanceLoss by loops: per anchor ``-log sum_{j: y_j = y_a} softmax_j(gamma
    s_aj)`` over the reference set (the batch by default), the mean over the anchors with
    a target."""
    x = l2_normalize(np.asarray(x, np.float64))
    ref = x if ref is None else l2_normalize(np.asarray(ref, np.float64))
    ref_labels = labels if ref_labels is None else ref_labels
    losses = []
    for a in range(len(labels)):
        logits = gamma * (ref @ x[a])
        targets = np.asarray(ref_labels) == labels[a]
        if targets.all():
            losses.append(0.0)
        elif targets.any():  # log(1 + e^{lse_others - lse_own}), exact for tiny losses
            losses.append(float(np.logaddexp(0.0, _lse(logits[~targets]) - _lse(logits[targets]))))
    return float(np.mean(losses)) if losses else 0.0


def pml_instance_loss(labels, x, gamma=64.0):
    """pytorch-metric-learning 2.9's reading: the cross-entropy of ``gamma s_a.`` with target
    column ``rank(y_a)`` among the sorted unique labels, averaged over the batch."""
    x = l2_normalize(np.asarray(x, np.float64))
    _, target = np.unique(labels, return_inverse=True)
    logits = gamma * (x @ x.T)
    return float(np.mean([_lse(logits[a]) - logits[a, target[a]] for a in range(len(x))]))


def vicreg_loss(z1, z2, invariance_lambda=25.0, variance_mu=25.0, covariance_v=1.0, eps=1e-4):
    """VICReg (Bardes et al.) as the authors' code computes it: the mean squared difference,
    the hinge on the standard deviations (each view's mean halved) and the squared
    off-diagonal covariances over D, per view; a batch of one has variance 0."""
    z1, z2 = np.asarray(z1, np.float64), np.asarray(z2, np.float64)
    n, d = z1.shape
    invariance = np.mean((z1 - z2) ** 2)
    variance = covariance = 0.0
    for z in (z1, z2):
        centered = z - z.mean(axis=0)
        cov = centered.T @ centered / max(n - 1, 1)
        std = np.sqrt(np.diag(cov) + eps)
        variance += np.mean(np.maximum(1.0 - std, 0.0)) / 2
        covariance += (np.sum(cov ** 2) - np.sum(np.diag(cov) ** 2)) / d
    return invariance_lambda * invariance + variance_mu * variance + covariance_v * covariance


def dynamic_soft_margin(labels, embeddings, histogram, min_val=-2.0, momentum=0.01,
                        reading="paper"):
    """DynamicSoftMarginLoss on one batch, by loops: ``(value, new_histogram, weights, gaps)``.

    ``gaps`` are ``d_ap - d_an`` of every triplet (sorted ``(a, p, n)``), ``weights`` the CDF
    read at the node below each (the loss is their product's mean). ``reading="paper"`` is
    tfdml's: the batch histogram divided by its number of triplets before the momentum mix,
    values clipped to the nodes. ``reading="pml"`` is pytorch-metric-learning 2.9's: raw
    counts mixed in, ``torch.frac`` shares and no clipping (an IndexError outside
    ``[min_val, -min_val - delta)``, where its ``scatter_add`` fails).
    """
    gaps = _dsm_gaps(labels, embeddings)
    hist = np.asarray(histogram, np.float64)
    if len(gaps) == 0:
        return 0.0, hist.copy(), gaps, gaps
    num_bins = len(hist)
    v = (gaps - min_val) / (2.0 * abs(min_val) / num_bins)
    m = momentum if hist.sum() != 0 else 1.0
    if reading == "pml":
        low = np.floor(v).astype(np.int64)
        frac = v - np.trunc(v)
        if np.any(low < 0) or np.any(low + 1 >= num_bins):
            raise IndexError("pml's scatter_add: a node index outside the histogram")
        new = (1.0 - m) * hist
        np.add.at(new, low, m * (1.0 - frac))
        np.add.at(new, low + 1, m * frac)
    else:
        v = np.clip(v, 0.0, num_bins - 1.0)
        low = np.floor(v).astype(np.int64)
        frac = v - low
        counts = np.zeros(num_bins)
        np.add.at(counts, low, 1.0 - frac)
        np.add.at(counts, np.minimum(low + 1, num_bins - 1), frac)
        new = (1.0 - m) * hist + m * counts / len(gaps)
    new = new / new.sum()
    weights = np.cumsum(new)[low]
    return float(np.mean(weights * gaps)), new, weights, gaps


def dynamic_soft_margin_weighted(labels, embeddings, weights):
    """The mean of ``weights * (d_ap - d_an)`` over the triplets (in the order of
    :func:`dynamic_soft_margin`): the loss with its weights held constant."""
    gaps = _dsm_gaps(labels, embeddings)
    return float(np.mean(np.asarray(weights) * gaps)) if len(gaps) else 0.0


def _dsm_gaps(labels, embeddings):
    """``d_ap - d_an`` of every triplet (sorted ``(a, p, n)``, from :func:`triplets_where`),
    Euclidean distances of the L2-normalized embeddings."""
    triplets = np.array(sorted(triplets_where(labels, lambda a, p, n: True)),
                        np.int64).reshape(-1, 3)
    x = np.asarray(embeddings, np.float64)
    x = x / np.sqrt(np.sum(x * x, axis=1, keepdims=True))
    dist = np.sqrt(np.sum((x[:, None, :] - x[None, :, :]) ** 2, axis=-1))
    a, p, n = triplets.T
    return dist[a, p] - dist[a, n]


def dynamic_soft_margin_pml_slopes(labels, embeddings, histogram, min_val=-2.0, momentum=0.01):
    """pytorch-metric-learning 2.9's ``d value / d x_j`` for each triplet's ``x_j = d_ap - d_an``
    (times the number of triplets ``T``), its histogram carrying a gradient.

    Its histogram ``u / S`` has ``u = (1 - m) h + m sum_i [(1 - f_i) e_low_i + f_i e_low_i+1]``
    and ``S = (1 - m) sum(h) + m T`` (free of the shares ``f_i = frac((x_i - min_val) /
    delta)``), so ``d CDF[k] / d f_j = -(m / S) [k == low_j]`` and the slope is
    ``CDF[low_j] - m / (S delta) * sum of x_i over the triplets of node low_j``. With these
    slopes as constant weights, :func:`dynamic_soft_margin_weighted` has pml's gradient.
    """
    _, _, weights, gaps = dynamic_soft_margin(labels, embeddings, histogram, min_val, momentum,
                                              "pml")
    hist = np.asarray(histogram, np.float64)
    num_bins = len(hist)
    delta = 2.0 * abs(min_val) / num_bins
    low = np.floor((gaps - min_val) / delta).astype(np.int64)
    m = momentum if hist.sum() != 0 else 1.0
    total = (1.0 - m) * hist.sum() + m * len(gaps)
    per_node = np.zeros(num_bins)
    np.add.at(per_node, low, gaps)
    return weights - m / (total * delta) * per_node[low]


# -- pair statistics and ranked lists (tfdml.losses.pair_statistics) ---------------------------


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
