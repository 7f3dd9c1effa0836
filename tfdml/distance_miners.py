"""Miners that select by the distances between the embeddings (re-exported by
:mod:`tfdml.miners`): pytorch-metric-learning's margin and batch miners.

:class:`PairMarginMiner` keeps the positive pairs farther than a margin and the negative
pairs closer than one; :class:`TripletMarginMiner` keeps the triplets by their margin
``d_an - d_ap``; :class:`BatchEasyHardMiner` picks one easy or hard positive and negative
per anchor through :class:`tfdml.miners.TripletMiner`'s selection routine;
:class:`HDCMiner` keeps the hardest share of the batch's pairs; :class:`AngularMiner` the
triplets with a wide angle at the negative; :class:`UniformHistogramMiner` draws pairs
evenly over the range of their distances. They measure
distances between the L2-normalized embeddings they are given (``distance=``), whatever
scores the loss computes, as pytorch-metric-learning's miners carry their own distance.
Their comparisons are pytorch-metric-learning's, so they select the same pairs and
triplets on the same batch (the random :class:`UniformHistogramMiner`: the same bins).
"""

from __future__ import annotations

import math
import numbers

import keras
from keras import ops

from tfdml import ops as dml
from tfdml._checks import check_choice, check_int, check_number
from tfdml.miners import Miner, Pairs, Triplets, _pick

__all__ = ["AngularMiner", "BatchEasyHardMiner", "HDCMiner", "PairMarginMiner",
           "TripletMarginMiner", "UniformHistogramMiner", "histogram_bins", "sample_per_bin"]

TRIPLET_MARGIN_TYPES = ("all", "hard", "semihard", "easy")


def _unit(embeddings, ref_embeddings):
    """The L2-normalized embeddings and reference set (the embeddings for None), without
    gradient."""
    if embeddings is None:
        raise ValueError("This miner measures the embeddings: pass `embeddings` (tfdml losses "
                         "always do).")
    x = dml.l2_normalize(ops.stop_gradient(ops.convert_to_tensor(embeddings)))
    ref = x if ref_embeddings is None else dml.l2_normalize(
        ops.stop_gradient(ops.convert_to_tensor(ref_embeddings)))
    return x, ref


def _distances(embeddings, ref_embeddings, distance):
    """``[B, R]`` distances between the L2-normalized embeddings, without gradient."""
    return dml.distance_matrix(*_unit(embeddings, ref_embeddings), distance)


def _check_distance(distance):
    return dml.check_distance(distance, ("l2", "squared_l2", "cosine"))


#: The largest distance between two L2-normalized embeddings (antipodal unit vectors): the
#: miners' distances lie in ``[0, MAX_DISTANCE[distance]]``.
MAX_DISTANCE = {"l2": 2.0, "squared_l2": 4.0, "cosine": 2.0}


def _refuse(name, value, distance, requirement, reason):
    raise ValueError(f"`{name}` must be {requirement}: {reason} (distance={distance!r}). "
                     f"Received: {name}={value!r}")


@keras.saving.register_keras_serializable(package="tfdml")
class PairMarginMiner(Miner):
    """Keeps the positive pairs farther than ``pos_margin`` and the negative pairs closer
    than ``neg_margin``.

    With ``d`` the distance between L2-normalized embeddings: a positive pair
    ``(a, p)`` is kept if ``d_ap > pos_margin``, a negative pair ``(a, n)`` if
    ``d_an < neg_margin`` (strict, as pytorch-metric-learning). Returns
    :class:`tfdml.miners.Pairs`; every tfdml loss takes them.

    The distances lie in ``[0, d_max]``, ``d_max`` = 2 for ``"l2"`` and
    ``"cosine"``, 4 for ``"squared_l2"`` (antipodal unit vectors). A margin
    with which no pair can ever be kept is refused: ``neg_margin <= 0`` or
    ``pos_margin >= d_max``. A ``pos_margin`` below 0 keeps every positive
    pair and a ``neg_margin`` above ``d_max`` every negative pair, as in
    pytorch-metric-learning.

    Args:
        pos_margin: positives closer than this are left out; ``< d_max``.
            Defaults to `0.2`.
        neg_margin: negatives farther than this are left out; ``> 0``.
            Defaults to `0.8`.
        distance: ``"l2"``, ``"squared_l2"`` or ``"cosine"`` (``1 - x.y``).
            Defaults to `"l2"` (pytorch-metric-learning's default distance).
            pytorch-metric-learning's ``CosineSimilarity`` with margins
            ``m`` is ``"cosine"`` with margins ``1 - m``.

    Raises:
        ValueError: for a margin that is not a finite number, or with which
            no pair can be kept, naming it and the value received.

    Examples:

    >>> miner = tfdml.miners.PairMarginMiner(pos_margin=0.2, neg_margin=0.8)
    >>> loss = tfdml.losses.ContrastiveLoss(miner=miner)
    """

    def __init__(self, pos_margin: float = 0.2, neg_margin: float = 0.8, distance: str = "l2"):
        self.distance = _check_distance(distance)
        top = MAX_DISTANCE[self.distance]
        self.pos_margin = check_number("pos_margin", pos_margin, finite=True)
        self.neg_margin = check_number("neg_margin", neg_margin, finite=True)
        if not self.pos_margin < top:
            _refuse("pos_margin", pos_margin, self.distance, f"< {top:g}",
                    f"no distance exceeds {top:g}, so no positive pair would be kept")
        if not self.neg_margin > 0:
            _refuse("neg_margin", neg_margin, self.distance, "> 0",
                    "no distance is below 0, so no negative pair would be kept")

    def get_config(self):
        return {"pos_margin": self.pos_margin, "neg_margin": self.neg_margin,
                "distance": self.distance}

    def mine(self, scores, labels, ref_labels=None, ref_offset=0, embeddings=None,
             ref_embeddings=None) -> Pairs:
        dist = _distances(embeddings, ref_embeddings, self.distance)
        positive, negative = dml.label_masks(labels, ref_labels, ref_offset)
        dtype = dml.dtype_name(dist)
        far = dist > ops.convert_to_tensor(self.pos_margin, dtype)
        near = dist < ops.convert_to_tensor(self.neg_margin, dtype)
        return Pairs(ops.logical_and(positive, far), ops.logical_and(negative, near))


@keras.saving.register_keras_serializable(package="tfdml")
class TripletMarginMiner(Miner):
    """Keeps the triplets by their margin ``d_an - d_ap`` against ``margin``.

    With ``d`` the distance between L2-normalized embeddings and
    ``t = d_an - d_ap`` for every triplet ``(a, p, n)`` of the batch:

    * ``"all"``: the triplets that violate the margin, ``t <= margin``;
    * ``"hard"``: those of them with the negative at most as far as the
      positive, ``t <= 0``;
    * ``"semihard"``: those with the negative farther, ``0 < t <= margin``;
    * ``"easy"``: the others, ``t > margin``.

    These are pytorch-metric-learning's ``TripletMarginMiner`` types (not
    :class:`tfdml.miners.TripletMiner`'s strategies, which pick per anchor).
    Returns :class:`tfdml.miners.Triplets` with a ``[B, R, R]`` mask.

    ``t`` lies in ``[-d_max, d_max]``, ``d_max`` = 2 for ``"l2"`` and
    ``"cosine"``, 4 for ``"squared_l2"``. A margin with which no triplet can
    ever be kept is refused: ``margin < -d_max`` for ``"all"`` and
    ``"hard"``, ``margin <= 0`` for ``"semihard"``, ``margin >= d_max`` for
    ``"easy"``. A negative margin with ``"all"`` keeps the triplets whose
    negative is closer than the positive by at least ``-margin``.

    Args:
        margin: the margin. Defaults to `0.2`.
        type_of_triplets: ``"all"``, ``"hard"``, ``"semihard"`` or ``"easy"``.
            Defaults to `"all"`.
        distance: ``"l2"``, ``"squared_l2"`` or ``"cosine"`` (``1 - x.y``).
            Defaults to `"l2"`.

    Raises:
        ValueError: for a margin that is not a finite number, or with which
            no triplet of ``type_of_triplets`` can be kept, naming it and the
            value received.

    Examples:

    >>> miner = tfdml.miners.TripletMarginMiner(margin=0.2, type_of_triplets="semihard")
    >>> loss = tfdml.losses.TripletMarginLoss(miner=miner)
    """

    def __init__(self, margin: float = 0.2, type_of_triplets: str = "all",
                 distance: str = "l2"):
        self.margin = check_number("margin", margin, finite=True)
        self.type_of_triplets = check_choice("type_of_triplets", type_of_triplets,
                                             TRIPLET_MARGIN_TYPES)
        self.distance = _check_distance(distance)
        top = MAX_DISTANCE[self.distance]
        kind = f"type_of_triplets={self.type_of_triplets!r}"
        if self.type_of_triplets in ("all", "hard") and not self.margin >= -top:
            _refuse("margin", margin, self.distance, f">= {-top:g} with {kind}",
                    f"d_an - d_ap is never below {-top:g}, so no triplet would be kept")
        if self.type_of_triplets == "semihard" and not self.margin > 0:
            _refuse("margin", margin, self.distance, f"> 0 with {kind}",
                    "the semi-hard triplets have 0 < d_an - d_ap <= margin")
        if self.type_of_triplets == "easy" and not self.margin < top:
            _refuse("margin", margin, self.distance, f"< {top:g} with {kind}",
                    f"d_an - d_ap never exceeds {top:g}, so no triplet would be kept")

    def get_config(self):
        return {"margin": self.margin, "type_of_triplets": self.type_of_triplets,
                "distance": self.distance}

    def mine(self, scores, labels, ref_labels=None, ref_offset=0, embeddings=None,
             ref_embeddings=None) -> Triplets:
        dist = _distances(embeddings, ref_embeddings, self.distance)
        positive, negative = dml.label_masks(labels, ref_labels, ref_offset)
        exists = ops.logical_and(positive[:, :, None], negative[:, None, :])
        gap = dist[:, None, :] - dist[:, :, None]  # [a, p, n]: d_an - d_ap
        margin = ops.convert_to_tensor(self.margin, dml.dtype_name(dist))
        if self.type_of_triplets == "easy":
            keep = gap > margin
        else:
            keep = gap <= margin
            if self.type_of_triplets == "hard":
                keep = ops.logical_and(keep, gap <= 0)
            elif self.type_of_triplets == "semihard":
                keep = ops.logical_and(keep, gap > 0)
        return Triplets(None, None, ops.logical_and(exists, keep))


BATCH_STRATEGIES = ("easy", "hard", "semihard", "all")


def _in_range(dist, allowed):
    """``[B, R]`` bool: the distances within ``allowed = (low, high)`` (all for None)."""
    if allowed is None:
        return ops.ones_like(dist, dtype="bool")
    low, high = (ops.convert_to_tensor(v, dml.dtype_name(dist)) for v in allowed)
    return ops.logical_and(dist >= low, dist <= high)


def _check_range(name, allowed, distance):
    if allowed is None:
        return None
    if not isinstance(allowed, (tuple, list)) or len(allowed) != 2:
        raise ValueError(f"`{name}` must be None or a pair (low, high). Received: "
                         f"{name}={allowed!r}")
    low, high = (check_number(name, v) for v in allowed)
    if not low <= high:
        raise ValueError(f"`{name}` must have low <= high. Received: {name}={allowed!r}")
    top = MAX_DISTANCE[distance]
    if high < 0 or low > top:
        _refuse(name, allowed, distance, f"a range that meets [0, {top:g}]",
                f"the distances lie in [0, {top:g}], so no pair would be a candidate")
    return (low, high)


@keras.saving.register_keras_serializable(package="tfdml")
class BatchEasyHardMiner(Miner):
    """One positive and one negative per anchor, each the easiest or the hardest in the batch.

    With ``d`` the distance between L2-normalized embeddings, per anchor:

    * ``pos_strategy``: ``"easy"`` the closest positive, ``"hard"`` the
      farthest, ``"semihard"`` the farthest positive closer than the chosen
      negative (``d_ap < d_an``), ``"all"`` every positive;
    * ``neg_strategy``: ``"hard"`` the closest negative, ``"easy"`` the
      farthest, ``"semihard"`` the closest negative farther than the chosen
      positive (``d_an > d_ap``), ``"all"`` every negative;
    * ``allowed_pos_range`` / ``allowed_neg_range``: ``(low, high)`` keeps
      only the positives (negatives) with ``low <= d <= high`` as
      candidates (not applied to ``"all"``). A range outside the distances'
      ``[0, d_max]`` (``d_max`` = 2 for ``"l2"`` and ``"cosine"``, 4 for
      ``"squared_l2"``) would keep no candidate and is refused.

    Ties go to the lowest index (tfdml's selection routine, as
    :class:`tfdml.miners.TripletMiner`). Both ``"semihard"``, or
    ``"semihard"`` with ``"all"``, are refused. pytorch-metric-learning's
    ``BatchEasyHardMiner``: the same pairs on the same batch. Returns
    :class:`tfdml.miners.Triplets` (an anchor with its positive and its
    negative) or, with an ``"all"``, :class:`tfdml.miners.Pairs`.

    Args:
        pos_strategy: Defaults to `"easy"`.
        neg_strategy: Defaults to `"semihard"`.
        allowed_pos_range: Defaults to `None`.
        allowed_neg_range: Defaults to `None`.
        distance: ``"l2"``, ``"squared_l2"`` or ``"cosine"``. Defaults to
            `"l2"`.

    Examples:

    >>> miner = tfdml.miners.BatchEasyHardMiner("easy", "semihard")  # EPSHN
    >>> loss = tfdml.losses.TripletMarginLoss(miner=miner)

    Reference:
        Xuan, Stylianou, Liu, Pless, "Hard negative examples are hard, but
        useful", ECCV 2020 (easy positive, semi-hard negative).
    """

    def __init__(self, pos_strategy: str = "easy", neg_strategy: str = "semihard",
                 allowed_pos_range=None, allowed_neg_range=None, distance: str = "l2"):
        check_choice("pos_strategy", pos_strategy, BATCH_STRATEGIES)
        check_choice("neg_strategy", neg_strategy, BATCH_STRATEGIES)
        strategies = {pos_strategy, neg_strategy}
        if pos_strategy == neg_strategy == "semihard" or strategies == {"semihard", "all"}:
            raise ValueError(
                "`pos_strategy` and `neg_strategy` cannot both be 'semihard', nor one "
                f"'semihard' and the other 'all'. Received: pos_strategy={pos_strategy!r}, "
                f"neg_strategy={neg_strategy!r}")
        self.pos_strategy = pos_strategy
        self.neg_strategy = neg_strategy
        self.distance = _check_distance(distance)
        self.allowed_pos_range = _check_range("allowed_pos_range", allowed_pos_range,
                                              self.distance)
        self.allowed_neg_range = _check_range("allowed_neg_range", allowed_neg_range,
                                              self.distance)

    def get_config(self):
        return {"pos_strategy": self.pos_strategy, "neg_strategy": self.neg_strategy,
                "allowed_pos_range": self.allowed_pos_range,
                "allowed_neg_range": self.allowed_neg_range, "distance": self.distance}

    def _choose(self, role, strategy, dist, candidates, threshold=None):
        """``(index [B], found [B], distance [B])`` of one choice per anchor."""
        if strategy == "semihard":  # strictly beyond the other choice, then the hardest
            beyond = dist < threshold[:, None] if role == "positive" else (
                dist > threshold[:, None])
            candidates = ops.logical_and(candidates, beyond)
            strategy = "hard"
        index, found = _pick(role, strategy, -dist, candidates)
        chosen = ops.take_along_axis(dist, index[:, None], axis=1)[:, 0]
        return index, found, chosen

    def mine(self, scores, labels, ref_labels=None, ref_offset=0, embeddings=None,
             ref_embeddings=None):
        dist = _distances(embeddings, ref_embeddings, self.distance)
        positive, negative = dml.label_masks(labels, ref_labels, ref_offset)
        chosen = {}
        roles = {"positive": (self.pos_strategy, ops.logical_and(
                     positive, _in_range(dist, self.allowed_pos_range))),
                 "negative": (self.neg_strategy, ops.logical_and(
                     negative, _in_range(dist, self.allowed_neg_range)))}
        # The semi-hard one is chosen against the other, so the other goes first.
        order = ("negative", "positive") if self.pos_strategy == "semihard" else (
            "positive", "negative")
        for role in order:
            strategy, candidates = roles[role]
            if strategy == "all":
                continue
            other = [v for k, v in chosen.items() if k != role]
            chosen[role] = self._choose(role, strategy, dist, candidates,
                                        other[0][2] if other else None)
        return self._result(chosen, positive, negative, ops.shape(dist)[1])

    @staticmethod
    def _result(chosen, positive, negative, width):
        if len(chosen) == 2:
            (p, p_found, _), (n, n_found, _) = chosen["positive"], chosen["negative"]
            keep = ops.logical_and(p_found, n_found)
            return Triplets(p[:, None], n[:, None], keep[:, None, None])

        def one_hot(role):
            index, found, _ = chosen[role]
            return ops.logical_and(ops.equal(ops.arange(width, dtype="int32")[None, :],
                                             ops.cast(index, "int32")[:, None]),
                                   found[:, None])

        return Pairs(one_hot("positive") if "positive" in chosen else positive,
                     one_hot("negative") if "negative" in chosen else negative)


def _hardest_share(values, mask, share):
    """``[B, R]`` bool: the ``ceil(share * n)`` entries of largest ``values`` among the ``n``
    where ``mask`` holds, over the whole matrix (ties by position, row-major)."""
    flat_mask = ops.reshape(mask, (-1,))
    key = ops.where(flat_mask, ops.reshape(values, (-1,)), ops.cast(-float("inf"),
                                                                    dml.dtype_name(values)))
    order = dml.stable_argsort(-key)  # largest first, ties by position
    rank = dml.scatter_rows(ops.zeros((1, ops.shape(order)[0]), "int32"), order[None, :],
                            ops.arange(ops.shape(order)[0], dtype="int32")[None, :])[0]
    dtype = dml.dtype_name(values)
    count = ops.sum(ops.cast(flat_mask, dtype))
    keep = ops.ceil(count * ops.convert_to_tensor(share, dtype))  # in the values' precision
    kept = ops.logical_and(flat_mask, ops.cast(rank, dtype) < keep)
    return ops.reshape(kept, ops.shape(mask))


@keras.saving.register_keras_serializable(package="tfdml")
class HDCMiner(Miner):
    """The hardest share of the batch's positive and negative pairs (hard-aware cascades).

    Of all positive pairs of the batch, the ``ceil(filter_percentage * n+)``
    farthest are kept; of all negative pairs, the ``ceil(filter_percentage *
    n-)`` closest (distances between L2-normalized embeddings). The pairs are
    ranked over the whole batch, not per anchor. Returns
    :class:`tfdml.miners.Pairs`. pytorch-metric-learning's ``HDCMiner``: the
    same pairs on the same batch (one cascade level; the paper cascades
    several models, each training on the pairs the previous finds hard).

    Args:
        filter_percentage: the share kept, in ``(0, 1]``. Defaults to `0.5`.
        distance: ``"l2"``, ``"squared_l2"`` or ``"cosine"``. Defaults to
            `"l2"`.

    Examples:

    >>> loss = tfdml.losses.ContrastiveLoss(miner=tfdml.miners.HDCMiner(0.3))

    Reference:
        Yuan, Yang, Zhang, "Hard-aware deeply cascaded embedding", ICCV 2017.
    """

    blockwise = False  # the pairs of the whole batch are ranked (binned) together

    def __init__(self, filter_percentage: float = 0.5, distance: str = "l2"):
        self.filter_percentage = check_number("filter_percentage", filter_percentage, low=0,
                                              high=1, low_open=True)
        self.distance = _check_distance(distance)

    def get_config(self):
        return {"filter_percentage": self.filter_percentage, "distance": self.distance}

    def mine(self, scores, labels, ref_labels=None, ref_offset=0, embeddings=None,
             ref_embeddings=None) -> Pairs:
        dist = _distances(embeddings, ref_embeddings, self.distance)
        positive, negative = dml.label_masks(labels, ref_labels, ref_offset)
        return Pairs(_hardest_share(dist, positive, self.filter_percentage),
                     _hardest_share(-dist, negative, self.filter_percentage))


@keras.saving.register_keras_serializable(package="tfdml")
class AngularMiner(Miner):
    """The triplets whose angle at the negative exceeds ``angle`` (the angular loss's angle).

    For a triplet ``(a, p, n)`` of unit embeddings with ``c = (x_a + x_p) / 2``,
    the angle at the negative is ``arctan(|x_a - x_p| / (2 |x_n - c|))``
    (Wang et al. 2017, Section 3); the triplets with an angle above ``angle``
    violate the angular constraint and are kept. Returns
    :class:`tfdml.miners.Triplets` with a ``[B, R, R]`` mask.

    pytorch-metric-learning's ``AngularMiner`` measures the same angle on the
    embeddings as given, without normalizing them (and with
    ``torch.nn.functional.pairwise_distance``'s 1e-6 offset); on unit-norm
    embeddings the two select the same triplets.

    Args:
        angle: in radians, in ``(0, pi/2)``. Defaults to `radians(20)`.

    Examples:

    >>> miner = tfdml.miners.AngularMiner(angle=math.radians(20))
    >>> loss = tfdml.losses.AngularLoss(miner=miner)

    Reference:
        Wang, Zhou, Wen, Liu, Lin, "Deep metric learning with angular loss",
        ICCV 2017.
    """

    def __init__(self, angle: float = math.radians(20)):
        self.angle = check_number("angle", angle, low=0, high=math.pi / 2, low_open=True,
                                  high_open=True)

    def get_config(self):
        return {"angle": self.angle}

    def mine(self, scores, labels, ref_labels=None, ref_offset=0, embeddings=None,
             ref_embeddings=None) -> Triplets:
        x, ref = _unit(embeddings, ref_embeddings)
        s_ar = dml.pairwise_similarity(x, ref)  # [B, R]
        s_rr = dml.pairwise_similarity(ref, ref)  # [R, R]
        # |x_a - x_p|^2 = 2 - 2 s_ap; |c|^2 = (2 + 2 s_ap) / 4; |x_n - c|^2 = 1 + |c|^2 - s_an - s_pn.
        ap = 2.0 - 2.0 * s_ar[:, :, None]
        nc = 1.0 + 0.5 * (1.0 + s_ar[:, :, None]) - s_ar[:, None, :] - s_rr[None, :, :]
        tan2 = ops.convert_to_tensor(math.tan(self.angle) ** 2, dml.dtype_name(s_ar))
        wide = ap > 4.0 * tan2 * ops.relu(nc)
        positive, negative = dml.label_masks(labels, ref_labels, ref_offset)
        exists = ops.logical_and(positive[:, :, None], negative[:, None, :])
        return Triplets(None, None, ops.logical_and(exists, wide))


def histogram_bins(values, mask, num_bins):
    """The bin of each masked entry among ``num_bins`` equal bins of ``[min, max]`` of them.

    pytorch-metric-learning's ``UniformHistogramMiner`` bins: the edges are
    ``linspace(min, max, num_bins + 1)`` (computed as ``torch.linspace`` does, from both
    ends), bin ``i`` holds ``edge_i <= v < edge_i+1``, the last bin is closed.

    Args:
        values: ``[B, R]`` (distances).
        mask: ``[B, R]`` bool, the entries to bin.
        num_bins: the number of bins.

    Returns:
        ``(bins, edges)``: ``[B, R]`` int32 bins (``num_bins`` outside ``mask``) and the
        ``num_bins + 1`` edges (zeros without any masked entry).
    """
    values = ops.convert_to_tensor(values)
    dtype = dml.dtype_name(values)
    found = ops.any(mask)
    inf = ops.convert_to_tensor(float("inf"), dtype)
    low = ops.where(found, ops.min(ops.where(mask, values, inf)), ops.zeros((), dtype))
    high = ops.where(found, ops.max(ops.where(mask, values, -inf)), ops.zeros((), dtype))
    step = (high - low) / float(num_bins)
    index = ops.arange(num_bins + 1, dtype="int32")
    count = ops.cast(index, dtype)
    edges = ops.where(index < (num_bins + 1) // 2, low + step * count,
                      high - step * (float(num_bins) - count))
    # The bin by division, then moved to the one whose edges hold the value (at most one
    # off by rounding).
    safe = ops.where(step > 0, step, ops.ones((), dtype))
    guess = ops.where(step > 0, ops.floor((values - low) / safe), float(num_bins - 1))
    guess = ops.cast(ops.clip(ops.where(mask, guess, 0.0), 0.0, float(num_bins - 1)), "int32")
    below = values < ops.take(edges, guess)
    guess = ops.where(ops.logical_and(below, guess > 0), guess - 1, guess)
    above = ops.logical_and(values >= ops.take(edges, guess + 1), guess < num_bins - 1)
    guess = ops.where(above, guess + 1, guess)
    return ops.where(mask, guess, num_bins), edges


def sample_per_bin(bins, num_bins, per_bin, seed):
    """``[B, R]`` bool: in every bin, ``min(per_bin, size)`` distinct entries drawn uniformly
    (a uniformly random subset); entries of bin ``num_bins`` (outside) are never drawn.

    The entries are shuffled by random keys, sorted by bin (stably: in key order within a
    bin), and the first ``per_bin`` of each bin kept.
    """
    shape = ops.shape(bins)
    flat = ops.reshape(ops.cast(bins, "int32"), (1, -1))
    size = ops.shape(flat)[1]
    keys = keras.random.uniform(ops.shape(flat), dtype="float32", seed=seed)
    shuffle = dml.stable_argsort(keys, axis=1)
    order = dml.take_along_axis(shuffle, dml.stable_argsort(
        dml.take_along_axis(flat, shuffle, axis=1), axis=1), axis=1)
    ordered = dml.take_along_axis(flat, order, axis=1)
    counts = dml.scatter_rows(ops.zeros((1, num_bins + 1), "int32"), flat, ops.ones_like(flat),
                              mode="add")
    starts = ops.cumsum(counts, axis=1) - counts
    rank = ops.arange(size, dtype="int32")[None, :] - dml.take_along_axis(starts, ordered,
                                                                          axis=1)
    keep = ops.logical_and(rank < per_bin, ordered < num_bins)
    kept = dml.scatter_rows(ops.zeros((1, size), "int32"), order, ops.cast(keep, "int32"))
    return ops.reshape(ops.cast(kept, "bool"), shape)


@keras.saving.register_keras_serializable(package="tfdml")
class UniformHistogramMiner(Miner):
    """Positive and negative pairs spread uniformly over their range of distances.

    The positive pairs' distances (L2-normalized embeddings) are split into ``num_bins``
    equal bins from their minimum to their maximum (:func:`histogram_bins`), and
    ``pos_per_bin`` pairs are drawn uniformly from every bin, without replacement: a bin
    with fewer pairs gives all of them. The same for the negative pairs with
    ``neg_per_bin``. The pairs are binned over the whole batch, not per anchor. Returns
    :class:`tfdml.miners.Pairs`; every tfdml loss takes them.

    pytorch-metric-learning's ``UniformHistogramMiner`` bins the same way and draws with
    replacement (a pair may come several times, and a bin with fewer pairs than asked
    repeats them); a pair mask holds a pair once, so tfdml draws distinct pairs. The
    draws come from a ``keras.random.SeedGenerator``, which a loss holding the miner keeps
    in its state (``loss.state``, owned by :class:`tfdml.models.MetricModel`).

    Args:
        num_bins: the number of bins, ``>= 1``. Defaults to `100`.
        pos_per_bin: positive pairs drawn per bin, ``>= 1``. Defaults to `10`.
        neg_per_bin: negative pairs drawn per bin, ``>= 1``. Defaults to `10`.
        distance: ``"l2"``, ``"squared_l2"`` or ``"cosine"`` (``1 - x.y``). Defaults to
            `"l2"` (pytorch-metric-learning's default distance).
        seed: seed of the draws; the same seed gives the same sequence of draws.
            Defaults to `None` (unseeded).

    Examples:

    >>> miner = tfdml.miners.UniformHistogramMiner(num_bins=50, pos_per_bin=5, seed=0)
    >>> loss = tfdml.losses.ContrastiveLoss(miner=miner)
    """

    blockwise = False  # the pairs of the whole batch are ranked (binned) together

    def __init__(self, num_bins: int = 100, pos_per_bin: int = 10, neg_per_bin: int = 10,
                 distance: str = "l2", seed: int | None = None):
        self.num_bins = check_int("num_bins", num_bins)
        self.pos_per_bin = check_int("pos_per_bin", pos_per_bin)
        self.neg_per_bin = check_int("neg_per_bin", neg_per_bin)
        self.distance = _check_distance(distance)
        if seed is not None and (not isinstance(seed, numbers.Integral) or isinstance(seed, bool)):
            raise ValueError(f"`seed` must be an int or None. Received: seed={seed!r}")
        self.seed = None if seed is None else int(seed)
        self._seed_generator = keras.random.SeedGenerator(self.seed)

    def get_config(self):
        return {"num_bins": self.num_bins, "pos_per_bin": self.pos_per_bin,
                "neg_per_bin": self.neg_per_bin, "distance": self.distance, "seed": self.seed}

    def mine(self, scores, labels, ref_labels=None, ref_offset=0, embeddings=None,
             ref_embeddings=None) -> Pairs:
        dist = _distances(embeddings, ref_embeddings, self.distance)
        positive, negative = dml.label_masks(labels, ref_labels, ref_offset)
        chosen = []
        for mask, per_bin in ((positive, self.pos_per_bin), (negative, self.neg_per_bin)):
            bins, _ = histogram_bins(dist, mask, self.num_bins)
            chosen.append(sample_per_bin(bins, self.num_bins, per_bin, self._seed_generator))
        return Pairs(*chosen)
