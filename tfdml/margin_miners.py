"""Miners that keep the pairs or triplets violating a distance margin (re-exported by
:mod:`tfdml.miners`).

:class:`PairMarginMiner` keeps the positive pairs farther than a margin and the negative
pairs closer than one; :class:`TripletMarginMiner` keeps the triplets by their margin
``d_an - d_ap``. Both measure distances between the L2-normalized embeddings they are
given (``distance=``), whatever scores the loss computes, as pytorch-metric-learning's
miners carry their own distance. Their comparisons are pytorch-metric-learning's, so they
select the same pairs and triplets on the same batch.
"""

from __future__ import annotations

import keras
from keras import ops

from tfdml import ops as dml
from tfdml._checks import check_choice, check_number
from tfdml.miners import Miner, Pairs, Triplets

__all__ = ["PairMarginMiner", "TripletMarginMiner"]

TRIPLET_MARGIN_TYPES = ("all", "hard", "semihard", "easy")


def _distances(embeddings, ref_embeddings, distance):
    """``[B, R]`` distances between the L2-normalized embeddings, without gradient."""
    if embeddings is None:
        raise ValueError("This miner measures distances between the embeddings: pass "
                         "`embeddings` (tfdml losses always do).")
    x = dml.l2_normalize(ops.stop_gradient(ops.convert_to_tensor(embeddings)))
    ref = x if ref_embeddings is None else dml.l2_normalize(
        ops.stop_gradient(ops.convert_to_tensor(ref_embeddings)))
    return dml.distance_matrix(x, ref, distance)


def _check_distance(distance):
    return dml.check_distance(distance, ("l2", "squared_l2", "cosine"))


@keras.saving.register_keras_serializable(package="tfdml")
class PairMarginMiner(Miner):
    """Keeps the positive pairs farther than ``pos_margin`` and the negative pairs closer
    than ``neg_margin``.

    With ``d`` the distance between L2-normalized embeddings: a positive pair
    ``(a, p)`` is kept if ``d_ap > pos_margin``, a negative pair ``(a, n)`` if
    ``d_an < neg_margin`` (strict, as pytorch-metric-learning). Returns
    :class:`tfdml.miners.Pairs`; every tfdml loss takes them.

    Args:
        pos_margin: positives closer than this are left out. Defaults to
            `0.2`.
        neg_margin: negatives farther than this are left out. Defaults to
            `0.8`.
        distance: ``"l2"``, ``"squared_l2"`` or ``"cosine"`` (``1 - x.y``).
            Defaults to `"l2"` (pytorch-metric-learning's default distance).
            pytorch-metric-learning's ``CosineSimilarity`` with margins
            ``m`` is ``"cosine"`` with margins ``1 - m``.

    Examples:

    >>> miner = tfdml.miners.PairMarginMiner(pos_margin=0.2, neg_margin=0.8)
    >>> loss = tfdml.losses.ContrastiveLoss(miner=miner)
    """

    def __init__(self, pos_margin: float = 0.2, neg_margin: float = 0.8, distance: str = "l2"):
        self.pos_margin = check_number("pos_margin", pos_margin, finite=True)
        self.neg_margin = check_number("neg_margin", neg_margin, finite=True)
        self.distance = _check_distance(distance)

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

    Args:
        margin: the margin. Defaults to `0.2`.
        type_of_triplets: ``"all"``, ``"hard"``, ``"semihard"`` or ``"easy"``.
            Defaults to `"all"`.
        distance: ``"l2"``, ``"squared_l2"`` or ``"cosine"`` (``1 - x.y``).
            Defaults to `"l2"`.

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
