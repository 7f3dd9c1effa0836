"""The references of the triplet losses: triplet NCA, margin, PN, trimmed, dynamic soft margin.

Specification (see tfdml.miners / tfdml.losses.triplet docstrings and the
extreme-triplet paper, eqs. 1 and 16 and appendix E): the triplets are mined as in
:func:`references.mining.mine_triplets`; per anchor the loss is the mean over its
triplets; the loss is the mean over the anchors that have at least one triplet, 0 when
none has.
"""

from __future__ import annotations

import math

import numpy as np

from .core import average_terms, margin_scores, nca_scores, prepare_embeddings, softplus, split_ref
from .mining import mine_triplets, triplets_where

# -- triplet NCA and margin losses ----------------------------------------------------------------


def _mean_over_anchors(per_triplet):
    """``per_triplet``: {(a, p, n): value}. Mean per anchor, then over anchors with any."""
    by_anchor = {}
    for (a, _, _), value in per_triplet.items():
        by_anchor.setdefault(a, []).append(value)
    if not by_anchor:
        return 0.0
    anchor_means = [sum(vals) / len(vals) for vals in by_anchor.values()]
    return sum(anchor_means) / len(anchor_means)


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


def nca_loss(labels, embeddings, order=1, temperature=1.0, positive="easy", negative="hard",
             disjoint=False, normalize=True, ref_embeddings=None, ref_labels=None,
             ref_offset=None, chooser=None, triplets=None):
    """Reference triplet NCA loss. Returns ``(value, triplets)``.

    ``triplets``: use these instead of mining (for finite differences and for
    random strategies).
    """
    labels, ref_labels, ref_offset = split_ref(labels, ref_embeddings, ref_labels, ref_offset)
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
    labels, ref_labels, ref_offset = split_ref(labels, ref_embeddings, ref_labels, ref_offset)
    s = margin_scores(embeddings, ref_embeddings, distance_kind, normalize)
    if triplets is None:
        triplets = mine_triplets(s, labels, ref_labels, ref_offset, positive, negative,
                                 disjoint, chooser)
    per_triplet = {}
    for a, p, n in triplets:
        per_triplet[(a, p, n)] = margin_triplet_value(-s[a, p], -s[a, n], margin)
    return _mean_over_anchors(per_triplet), triplets


def pn_loss(labels, embeddings, margin=None, distance_kind="cosine",
            positive="hard", negative="semihard", normalize=True, average="anchors"):
    """PN triplet loss on the batch: ``max(d_ap - min(d_an, d_pn) + margin, 0)`` (or the
    softplus for ``margin=None``), one term per mined triplet. Returns ``(value, terms)``."""
    x, _ = prepare_embeddings(embeddings, None, normalize)
    s = margin_scores(x, None, distance_kind, normalize=False)
    terms = {}
    for a, p, n in sorted(mine_triplets(s, labels, positive=positive, negative=negative)):
        z = -s[a, p] - min(-s[a, n], -s[p, n])
        terms.setdefault(a, []).append(softplus(z) if margin is None else max(z + margin, 0.0))
    return average_terms(terms, average, len(labels)), terms


# -- trimming -------------------------------------------------------------------------------------


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


# -- dynamic soft margin --------------------------------------------------------------------------


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
    gaps = dynamic_soft_margin_gaps(labels, embeddings)
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
    gaps = dynamic_soft_margin_gaps(labels, embeddings)
    return float(np.mean(np.asarray(weights) * gaps)) if len(gaps) else 0.0


def dynamic_soft_margin_gaps(labels, embeddings):
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
