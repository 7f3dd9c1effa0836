"""The contrastive (pair) loss of Hadsell, Chopra and LeCun, in the form of the class-collapse paper."""

from __future__ import annotations

from keras import ops

from tfdml import ops as dml
from tfdml._checks import check_number
from tfdml.losses.base import (
    MetricLoss,
    pair_terms,
    resolve_miner,
)
from tfdml.losses.spec import functional_form, loss_class
from tfdml.miners import AllPairsMiner, Miner, as_pairs

__all__ = ["ContrastiveLoss", "contrastive_loss"]


def _check_args(positive_margin: float = 0.0, negative_margin: float = 0.5, distance: str = "l2",
                miner="default"):
    return {"positive_margin": check_number("positive_margin", positive_margin, low=0),
            "negative_margin": check_number("negative_margin", negative_margin, low=0),
            "distance": dml.check_distance(distance), "miner": resolve_miner(miner, AllPairsMiner)}


def _contrastive_terms(inputs, positive_margin, negative_margin, distance, miner: Miner):
    labels, x, ref_labels, ref, ref_offset = inputs
    dist = dml.distance_matrix(x, ref, distance)
    pairs = as_pairs(miner.mine(-dist, labels, ref_labels, ref_offset, x, ref),
                     num_ref=ops.shape(dist)[1])
    positive = ops.relu(dist - ops.convert_to_tensor(positive_margin, dml.dtype_name(dist)))
    negative = ops.relu(ops.convert_to_tensor(negative_margin, dml.dtype_name(dist)) - dist)
    return pair_terms(positive, negative, pairs)


@loss_class("contrastive_loss", average="terms")
class ContrastiveLoss(MetricLoss):
    """Contrastive loss: pull positive pairs within a margin, push negatives beyond one.

    With ``d`` the distance of a pair::

        positive pair: L = max(d - positive_margin, 0)
        negative pair: L = max(negative_margin - d, 0)

    The pairs are all same-class and all other-class reference samples of
    each anchor, or those a miner keeps (mined triplets contribute their
    positive and negative pairs, each pair once).

    **Averaged over** the pairs (``average="terms"``): the sum over all
    pairs divided by their number, the class-collapse paper's objective
    ``O_con = 1/n^2 sum_{i,j} L_con(x_i, x_j)`` (with the self-pairs, which
    cost nothing, left out). Without a miner every anchor of a batch has the
    same number of pairs, so this equals the mean over anchors of their
    means. pytorch-metric-learning averages over the pairs with a non-zero
    loss (``average="nonzero"``).

    With ``distance="squared_l2"`` and ``positive_margin=0`` this is the
    form the class-collapse paper writes (Section 3):
    ``delta D + (1 - delta) max(alpha - D, 0)`` with ``D`` the squared
    distance. Hadsell et al.'s original squares the hinges of the Euclidean
    distance instead (``D^2 / 2`` and ``max(m - D, 0)^2 / 2``); the
    ``positive_margin`` generalization (no pull once a positive is closer
    than it) follows common practice. With ``positive_margin=0`` every
    minimizer of the loss over all pairs collapses each class to a point,
    the class-collapse paper's starting observation (Section 4.1).

    Args:
        positive_margin: ``>= 0``. Defaults to `0.0`.
        negative_margin: ``>= 0``. Defaults to `0.5`.
        distance: ``"l2"``, ``"squared_l2"`` or ``"cosine"``. Defaults to
            `"l2"`.
        miner: a :class:`tfdml.miners.Miner`; `None` or `"default"` for
            every pair (:class:`tfdml.miners.AllPairsMiner`). Defaults to
            `"default"`.

    Examples:

    >>> loss = tfdml.losses.ContrastiveLoss(negative_margin=0.5)
    >>> loss = tfdml.losses.ContrastiveLoss(
    ...     miner=tfdml.miners.MultiSimilarityMiner(positive="easy"))

    Reference:
        Hadsell, Chopra, LeCun, "Dimensionality reduction by learning an
        invariant mapping", CVPR 2006; "Reducing class collapse in metric
        learning with easy positive sampling" (Section 3).
    """

    terms = staticmethod(_contrastive_terms)
    check_arguments = staticmethod(_check_args)


contrastive_loss = functional_form(
    ContrastiveLoss, "contrastive_loss",
    "Functional form of :class:`ContrastiveLoss`: by default the mean over all pairs.",
    "A scalar of the dtype of ``y_pred``; 0 when no anchor has a pair, NaN when an embedding "
    "is NaN or Inf.")
