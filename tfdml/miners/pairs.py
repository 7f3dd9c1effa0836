"""Pair miners: which positive and negative pairs each anchor keeps.

:class:`AllPairsMiner` keeps every pair (what ``miner=None`` means for every loss),
:class:`MultiSimilarityMiner` the pairs of the multi-similarity loss's mining (with an
easy-positive option), and :class:`PairMarginMiner` the positive pairs farther and the
negative pairs closer than a margin (distances between the L2-normalized embeddings, as
pytorch-metric-learning's ``PairMarginMiner``). They return :class:`tfdml.miners.Pairs`.
"""

from __future__ import annotations

import keras
from keras import ops

from tfdml._argument_checks import check_choice, check_number, is_number
from tfdml._docs import fill_doc
from tfdml._labels import check_min_jaccard
from tfdml._shims import dtype_name
from tfdml.miners.base import (
    MAX_DISTANCE,
    MIN_JACCARD_DOC,
    Miner,
    Pairs,
    check_distance,
    embedding_distances,
    refuse,
)
from tfdml.miners.selection import multi_similarity_pairs

__all__ = ["AllPairsMiner", "MultiSimilarityMiner", "PairMarginMiner"]

MS_POSITIVE_STRATEGIES = ("hard", "easy", "all")


@keras.saving.register_keras_serializable(package="tfdml")
@fill_doc(MIN_JACCARD=MIN_JACCARD_DOC)
class AllPairsMiner(Miner):
    """No mining: every positive pair and every negative pair of each anchor.

    Returns :class:`tfdml.miners.Pairs` with the label masks: positives are the reference
    samples of the anchor's class (never the anchor itself), negatives all
    samples of other classes. Pair losses (contrastive, margin,
    multi-similarity) use each pair once; triplet losses use every
    (positive, negative) combination of an anchor (:func:`tfdml.miners.as_triplets`, a
    ``[B, R, R]`` mask). ``O(B R)`` memory for pair losses, ``O(B R^2)`` for
    triplet losses.

    It is what ``miner=None`` means for every tfdml loss (pytorch-metric-
    learning's reading of no miner); ``miner="default"`` is the loss's own
    miner.

    Args:
        {MIN_JACCARD}

    Examples:

    >>> loss = tfdml.losses.MultiSimilarityLoss(miner=tfdml.miners.AllPairsMiner())
    >>> loss = tfdml.losses.MultiSimilarityLoss(miner=None)  # the same
    """

    def __init__(self, min_jaccard: float | None = None):
        self.min_jaccard = check_min_jaccard(min_jaccard)

    def get_config(self):
        return self.with_min_jaccard({})

    def mine(self, scores, labels, ref_labels=None, ref_offset=0, embeddings=None,
             ref_embeddings=None) -> Pairs:
        return Pairs(*self.label_masks(labels, ref_labels, ref_offset))


@keras.saving.register_keras_serializable(package="tfdml")
@fill_doc(MIN_JACCARD=MIN_JACCARD_DOC)
class MultiSimilarityMiner(Miner):
    """Pair mining of the multi-similarity loss, with an easy-positive option.

    For anchor ``a`` with scores ``S`` (cosine similarities for
    :class:`tfdml.losses.MultiSimilarityLoss`):

    * a negative pair ``(a, n)`` is kept if ``S_an > min_p S_ap - epsilon``,
      i.e. it is more similar than the anchor's least similar positive minus
      ``epsilon``;
    * ``positive="hard"``: a positive pair ``(a, p)`` is kept if
      ``S_ap < max_n S_an + epsilon``, less similar than the anchor's most
      similar negative plus ``epsilon`` (Wang et al. 2019);
      ``positive="easy"``: only the most similar positive is kept (easy
      positive sampling, EPS, of the class-collapse paper, which replaces the
      positive mining and keeps the same negative mining);
      ``positive="all"``: every positive pair is kept.

    The comparisons are strict, as in the authors' code. An anchor keeps
    pairs only if it has at least one positive and one negative in the
    reference set (the mining compares the two). ``epsilon`` is in the units
    of the scores. The authors' code also drops positive pairs with similarity
    above ``1 - 1e-5`` (to skip the anchor itself); tfdml excludes the anchor
    by index instead and keeps exact duplicates.

    EPS needs more than two samples per class in a batch: with two, the one
    positive is the easy one too.

    Args:
        epsilon: the mining margin, ``>= 0``. Defaults to `0.1` (Wang et al.).
        positive: ``"hard"``, ``"easy"`` or ``"all"``. Defaults to `"hard"`.
        {MIN_JACCARD}

    Returns (from :meth:`mine`):
        :class:`tfdml.miners.Pairs`.

    Examples:

    >>> miner = tfdml.miners.MultiSimilarityMiner(epsilon=0.05, positive="easy")
    >>> loss = tfdml.losses.ContrastiveLoss(miner=miner)  # any pair loss

    Reference:
        The pair mining of Wang et al.'s multi-similarity loss (CVPR 2019) and
        the easy positives of the class-collapse paper; see
        :class:`tfdml.losses.MultiSimilarityLoss`.
    """

    def __init__(self, epsilon: float = 0.1, positive: str = "hard",
                 min_jaccard: float | None = None):
        self.min_jaccard = check_min_jaccard(min_jaccard)
        if not is_number(epsilon) or not epsilon >= 0:
            raise ValueError(f"`epsilon` must be a number >= 0. Received: epsilon={epsilon!r}")
        check_choice("positive", positive, MS_POSITIVE_STRATEGIES)
        self.epsilon = float(epsilon)
        self.positive = positive

    def get_config(self):
        return self.with_min_jaccard({"epsilon": self.epsilon, "positive": self.positive})

    def mine(self, scores, labels, ref_labels=None, ref_offset=0, embeddings=None,
             ref_embeddings=None) -> Pairs:
        scores = ops.stop_gradient(ops.convert_to_tensor(scores))
        positive_mask, negative_mask = self.label_masks(labels, ref_labels, ref_offset)
        return multi_similarity_pairs(scores, positive_mask, negative_mask, self.epsilon,
                                      self.positive)


@keras.saving.register_keras_serializable(package="tfdml")
@fill_doc(MIN_JACCARD=MIN_JACCARD_DOC)
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
        {MIN_JACCARD}

    Raises:
        ValueError: for a margin that is not a finite number, or with which
            no pair can be kept, naming it and the value received.

    Examples:

    >>> miner = tfdml.miners.PairMarginMiner(pos_margin=0.2, neg_margin=0.8)
    >>> loss = tfdml.losses.ContrastiveLoss(miner=miner)
    """

    def __init__(self, pos_margin: float = 0.2, neg_margin: float = 0.8, distance: str = "l2",
                 min_jaccard: float | None = None):
        self.min_jaccard = check_min_jaccard(min_jaccard)
        self.distance = check_distance(distance)
        top = MAX_DISTANCE[self.distance]
        self.pos_margin = check_number("pos_margin", pos_margin, finite=True)
        self.neg_margin = check_number("neg_margin", neg_margin, finite=True)
        if not self.pos_margin < top:
            refuse("pos_margin", pos_margin, self.distance, f"< {top:g}",
                   f"no distance exceeds {top:g}, so no positive pair would be kept")
        if not self.neg_margin > 0:
            refuse("neg_margin", neg_margin, self.distance, "> 0",
                   "no distance is below 0, so no negative pair would be kept")

    def get_config(self):
        return self.with_min_jaccard({"pos_margin": self.pos_margin,
                                      "neg_margin": self.neg_margin, "distance": self.distance})

    def mine(self, scores, labels, ref_labels=None, ref_offset=0, embeddings=None,
             ref_embeddings=None) -> Pairs:
        dist = embedding_distances(embeddings, ref_embeddings, self.distance)
        positive, negative = self.label_masks(labels, ref_labels, ref_offset)
        dtype = dtype_name(dist)
        far = dist > ops.convert_to_tensor(self.pos_margin, dtype)
        near = dist < ops.convert_to_tensor(self.neg_margin, dtype)
        return Pairs(ops.logical_and(positive, far), ops.logical_and(negative, near))
