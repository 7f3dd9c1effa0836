"""Miners that select triplets and pairs by the distances between the embeddings:
pytorch-metric-learning's margin, batch, cascade and angular miners.

:class:`TripletMarginMiner` keeps the triplets by their margin ``d_an - d_ap``;
:class:`BatchEasyHardMiner` picks one easy or hard positive and negative per anchor
through the selection routine of :class:`tfdml.miners.TripletMiner`
(:func:`tfdml.miners.selection.pick`); :class:`HDCMiner` keeps the hardest share of the
batch's pairs; :class:`AngularMiner` the triplets with a wide angle at the negative.
They measure distances between the L2-normalized embeddings they are given
(``distance=``), whatever scores the loss computes, as pytorch-metric-learning's miners
carry their own distance. Their comparisons are pytorch-metric-learning's, so they select
the same pairs and triplets on the same batch.
"""

from __future__ import annotations

import math

import keras
from keras import ops

from tfdml import ops as dml
from tfdml._argument_checks import check_choice, check_number
from tfdml._docs import fill_doc
from tfdml._labels import check_min_jaccard
from tfdml._shims import dtype_name
from tfdml.miners.base import (
    DISTANCE_DOC,
    MAX_DISTANCE,
    MIN_JACCARD_DOC,
    Miner,
    Pairs,
    Triplets,
    check_distance,
    embedding_distances,
    refuse,
    unit_embeddings,
)
from tfdml.miners.selection import pick

__all__ = ["AngularMiner", "BatchEasyHardMiner", "HDCMiner", "TripletMarginMiner"]

TRIPLET_MARGIN_TYPES = ("all", "hard", "semihard", "easy")


@keras.saving.register_keras_serializable(package="tfdml")
@fill_doc(DISTANCE=DISTANCE_DOC, MIN_JACCARD=MIN_JACCARD_DOC)
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
        {DISTANCE}
        {MIN_JACCARD}

    Raises:
        ValueError: for a margin that is not a finite number, or with which
            no triplet of ``type_of_triplets`` can be kept, naming it and the
            value received.

    Examples:

    >>> miner = tfdml.miners.TripletMarginMiner(margin=0.2, type_of_triplets="semihard")
    >>> loss = tfdml.losses.TripletMarginLoss(miner=miner)
    """

    def __init__(self, margin: float = 0.2, type_of_triplets: str = "all",
                 distance: str = "l2", min_jaccard: float | None = None):
        self.min_jaccard = check_min_jaccard(min_jaccard)
        self.margin = check_number("margin", margin, finite=True)
        self.type_of_triplets = check_choice("type_of_triplets", type_of_triplets,
                                             TRIPLET_MARGIN_TYPES)
        self.distance = check_distance(distance)
        top = MAX_DISTANCE[self.distance]
        kind = f"type_of_triplets={self.type_of_triplets!r}"
        if self.type_of_triplets in ("all", "hard") and not self.margin >= -top:
            refuse("margin", margin, self.distance, f">= {-top:g} with {kind}",
                   f"d_an - d_ap is never below {-top:g}, so no triplet would be kept")
        if self.type_of_triplets == "semihard" and not self.margin > 0:
            refuse("margin", margin, self.distance, f"> 0 with {kind}",
                   "the semi-hard triplets have 0 < d_an - d_ap <= margin")
        if self.type_of_triplets == "easy" and not self.margin < top:
            refuse("margin", margin, self.distance, f"< {top:g} with {kind}",
                   f"d_an - d_ap never exceeds {top:g}, so no triplet would be kept")

    def get_config(self):
        return self.with_min_jaccard({"margin": self.margin,
                                      "type_of_triplets": self.type_of_triplets,
                                      "distance": self.distance})

    def mine(self, scores, labels, ref_labels=None, ref_offset=0, embeddings=None,
             ref_embeddings=None) -> Triplets:
        dist = embedding_distances(embeddings, ref_embeddings, self.distance)
        positive, negative = self.label_masks(labels, ref_labels, ref_offset)
        exists = ops.logical_and(positive[:, :, None], negative[:, None, :])
        gap = dist[:, None, :] - dist[:, :, None]  # [a, p, n]: d_an - d_ap
        margin = ops.convert_to_tensor(self.margin, dtype_name(dist))
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
    low, high = (ops.convert_to_tensor(v, dtype_name(dist)) for v in allowed)
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
        refuse(name, allowed, distance, f"a range that meets [0, {top:g}]",
               f"the distances lie in [0, {top:g}], so no pair would be a candidate")
    return (low, high)


@keras.saving.register_keras_serializable(package="tfdml")
@fill_doc(DISTANCE=DISTANCE_DOC, MIN_JACCARD=MIN_JACCARD_DOC)
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
        {DISTANCE}
        {MIN_JACCARD}

    Examples:

    >>> miner = tfdml.miners.BatchEasyHardMiner("easy", "semihard")  # EPSHN
    >>> loss = tfdml.losses.TripletMarginLoss(miner=miner)

    Reference:
        Xuan, Stylianou, Liu, Pless, "Hard negative examples are hard, but
        useful", ECCV 2020 (easy positive, semi-hard negative).
    """

    def __init__(self, pos_strategy: str = "easy", neg_strategy: str = "semihard",
                 allowed_pos_range=None, allowed_neg_range=None, distance: str = "l2",
                 min_jaccard: float | None = None):
        self.min_jaccard = check_min_jaccard(min_jaccard)
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
        self.distance = check_distance(distance)
        self.allowed_pos_range = _check_range("allowed_pos_range", allowed_pos_range,
                                              self.distance)
        self.allowed_neg_range = _check_range("allowed_neg_range", allowed_neg_range,
                                              self.distance)

    def get_config(self):
        return self.with_min_jaccard({
            "pos_strategy": self.pos_strategy, "neg_strategy": self.neg_strategy,
            "allowed_pos_range": self.allowed_pos_range,
            "allowed_neg_range": self.allowed_neg_range, "distance": self.distance})

    def _choose(self, role, strategy, dist, candidates, threshold=None):
        """``(index [B], found [B], distance [B])`` of one choice per anchor."""
        if strategy == "semihard":  # strictly beyond the other choice, then the hardest
            beyond = dist < threshold[:, None] if role == "positive" else (
                dist > threshold[:, None])
            candidates = ops.logical_and(candidates, beyond)
            strategy = "hard"
        index, found = pick(role, strategy, -dist, candidates)
        chosen = ops.take_along_axis(dist, index[:, None], axis=1)[:, 0]
        return index, found, chosen

    def mine(self, scores, labels, ref_labels=None, ref_offset=0, embeddings=None,
             ref_embeddings=None):
        dist = embedding_distances(embeddings, ref_embeddings, self.distance)
        positive, negative = self.label_masks(labels, ref_labels, ref_offset)
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
                                                                    dtype_name(values)))
    order = dml.stable_argsort(-key)  # largest first, ties by position
    rank = dml.scatter_rows(ops.zeros((1, ops.shape(order)[0]), "int32"), order[None, :],
                            ops.arange(ops.shape(order)[0], dtype="int32")[None, :])[0]
    dtype = dtype_name(values)
    count = ops.sum(ops.cast(flat_mask, dtype))
    keep = ops.ceil(count * ops.convert_to_tensor(share, dtype))  # in the values' precision
    kept = ops.logical_and(flat_mask, ops.cast(rank, dtype) < keep)
    return ops.reshape(kept, ops.shape(mask))


@keras.saving.register_keras_serializable(package="tfdml")
@fill_doc(DISTANCE=DISTANCE_DOC, MIN_JACCARD=MIN_JACCARD_DOC)
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
        {DISTANCE}
        {MIN_JACCARD}

    Examples:

    >>> loss = tfdml.losses.ContrastiveLoss(miner=tfdml.miners.HDCMiner(0.3))

    Reference:
        Yuan, Yang, Zhang, "Hard-aware deeply cascaded embedding", ICCV 2017.
    """

    blockwise = False  # the pairs of the whole batch are ranked (binned) together

    def __init__(self, filter_percentage: float = 0.5, distance: str = "l2",
                 min_jaccard: float | None = None):
        self.min_jaccard = check_min_jaccard(min_jaccard)
        self.filter_percentage = check_number("filter_percentage", filter_percentage, low=0,
                                              high=1, low_open=True)
        self.distance = check_distance(distance)

    def get_config(self):
        return self.with_min_jaccard({"filter_percentage": self.filter_percentage,
                                      "distance": self.distance})

    def mine(self, scores, labels, ref_labels=None, ref_offset=0, embeddings=None,
             ref_embeddings=None) -> Pairs:
        dist = embedding_distances(embeddings, ref_embeddings, self.distance)
        positive, negative = self.label_masks(labels, ref_labels, ref_offset)
        return Pairs(_hardest_share(dist, positive, self.filter_percentage),
                     _hardest_share(-dist, negative, self.filter_percentage))


@keras.saving.register_keras_serializable(package="tfdml")
@fill_doc(MIN_JACCARD=MIN_JACCARD_DOC)
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
        {MIN_JACCARD}

    Examples:

    >>> miner = tfdml.miners.AngularMiner(angle=math.radians(20))
    >>> loss = tfdml.losses.AngularLoss(miner=miner)

    Reference:
        Wang, Zhou, Wen, Liu, Lin, "Deep metric learning with angular loss",
        ICCV 2017.
    """

    def __init__(self, angle: float = math.radians(20), min_jaccard: float | None = None):
        self.min_jaccard = check_min_jaccard(min_jaccard)
        self.angle = check_number("angle", angle, low=0, high=math.pi / 2, low_open=True,
                                  high_open=True)

    def get_config(self):
        return self.with_min_jaccard({"angle": self.angle})

    def mine(self, scores, labels, ref_labels=None, ref_offset=0, embeddings=None,
             ref_embeddings=None) -> Triplets:
        x, ref = unit_embeddings(embeddings, ref_embeddings)
        s_ar = dml.pairwise_similarity(x, ref)  # [B, R]
        s_rr = dml.pairwise_similarity(ref, ref)  # [R, R]
        # |x_a - x_p|^2 = 2 - 2 s_ap; |c|^2 = (2 + 2 s_ap) / 4; |x_n - c|^2 = 1 + |c|^2 - s_an - s_pn.
        ap = 2.0 - 2.0 * s_ar[:, :, None]
        nc = 1.0 + 0.5 * (1.0 + s_ar[:, :, None]) - s_ar[:, None, :] - s_rr[None, :, :]
        tan2 = ops.convert_to_tensor(math.tan(self.angle) ** 2, dtype_name(s_ar))
        wide = ap > 4.0 * tan2 * ops.relu(nc)
        positive, negative = self.label_masks(labels, ref_labels, ref_offset)
        exists = ops.logical_and(positive[:, :, None], negative[:, None, :])
        return Triplets(None, None, ops.logical_and(exists, wide))
