"""The lifted structure losses: Song et al.'s in the hinge form of the LoOp paper
(:class:`LiftedStructureLoss`, over the disjoint same-class pairs of the batch, as the
LoOp losses) and the generalized one of Hermans, Beyer and Leibe ("In defense of the
triplet loss", :class:`GeneralizedLiftedStructureLoss`)."""

from __future__ import annotations

import keras
from keras import ops

from tfdml import ops as dml
from tfdml._argument_checks import check_number
from tfdml._docs import fill_doc
from tfdml._shims import dtype_name
from tfdml.losses._docstrings import REFERENCE_ARGS, shared_args
from tfdml.losses.base import MetricLoss, functional_loss
from tfdml.losses.inputs import mined_pairs, resolve_miner
from tfdml.losses.loop import PAIR_COMMON, PairBaseline, pair_baseline_loss
from tfdml.losses.terms import anchor_terms
from tfdml.miners import AllPairsMiner, Miner

__all__ = [
    "GeneralizedLiftedStructureLoss",
    "LiftedStructureLoss",
    "generalized_lifted_structure_loss",
    "lifted_structure_loss",
]


def lifted_structure_loss(y_true, y_pred, margin=0.2, normalize=True):
    """Functional form of :class:`LiftedStructureLoss`.

    Args:
        y_true: ``[B]`` or ``[B, 1]`` integer class ids.
        y_pred: ``[B, D]`` embeddings.
        margin, normalize: as in :class:`LiftedStructureLoss`.

    Returns:
        A scalar of the dtype of ``y_pred``.
    """
    return pair_baseline_loss(LiftedStructureLoss, y_true, y_pred, margin, normalize)


@keras.saving.register_keras_serializable(package="tfdml")
@fill_doc(SHARED_ARGS=shared_args("lifted_structure_loss", arguments=PAIR_COMMON))
class LiftedStructureLoss(PairBaseline):
    """The lifted structure loss in the hinge form of the LoOp paper's eq. 16.

    For each disjoint same-class pair ``(i, j)``::

        L_ij = max(d_ij + m - min(min_{c[k]!=c[i]} d_ik, min_{c[l]!=c[j]} d_jl), 0)

    averaged over the pairs that have a negative. (Song et al.'s original,
    and the LoOp authors' released code, use a log-sum-exp over the negatives
    instead of the hard minimum.) ``LoOpLoss("lifted_structure")`` is its
    LoOp form. It pairs the samples of the batch and takes no reference set.

    Args:
        margin: ``m >= 0``, the gap between ``d_ij`` and the closest
            negative. Defaults to `0.2`.
        {SHARED_ARGS}

    Reference:
        Oh Song, Xiang, Jegelka, Savarese, "Deep metric learning via lifted
        structured feature embedding", CVPR 2016; the LoOp paper, eq. 16.
    """

    pair_form = "lifted_structure"

    def __init__(self, margin=0.2, normalize=True, reduction="sum_over_batch_size",
                 name="lifted_structure_loss", dtype=None, average="anchors", block_size=None):
        super().__init__(margin, normalize, reduction, name, dtype, average, block_size)


# -- generalized lifted structure --------------------------------------------------------------


def _check_args(neg_margin: float = 1.0, pos_margin: float = 0.0, miner="default"):
    return {"neg_margin": check_number("neg_margin", neg_margin, finite=True),
            "pos_margin": check_number("pos_margin", pos_margin, finite=True),
            "miner": resolve_miner(miner, AllPairsMiner)}


def _generalized_lifted_terms(inputs, neg_margin, pos_margin, miner: Miner):
    x, ref = inputs.x, inputs.ref
    dist = dml.distance_matrix(x, ref, "l2")
    pairs = mined_pairs(inputs, -dist, miner)
    dtype = dtype_name(dist)
    positive, has_positive = dml.masked_logsumexp(
        dist - ops.convert_to_tensor(pos_margin, dtype), pairs.positive)
    negative, has_negative = dml.masked_logsumexp(
        ops.convert_to_tensor(neg_margin, dtype) - dist, pairs.negative)
    active = ops.logical_and(has_positive, has_negative)
    zero = ops.zeros((), dtype)
    losses = ops.relu(ops.where(active, positive, zero) + ops.where(active, negative, zero))
    return anchor_terms(losses, active)


@keras.saving.register_keras_serializable(package="tfdml")
@fill_doc(SHARED_ARGS=shared_args("generalized_lifted_structure_loss"))
class GeneralizedLiftedStructureLoss(MetricLoss):
    """Generalized lifted structure loss: a soft hardest positive against a soft hardest negative.

    With ``d`` the Euclidean distance (between L2-normalized embeddings by
    default), per anchor ``a`` with a positive and a negative::

        L_a = max(log sum_p exp(d_ap - pos_margin) + log sum_n exp(neg_margin - d_an), 0)

    over its positives ``p`` and negatives ``n`` (all of them, or those a
    miner keeps). The log-sum-exps are smooth upper bounds of the largest
    positive and the smallest negative distance, so the loss is a smooth
    batch-hard triplet loss with margin ``neg_margin - pos_margin``.

    **Averaged over** the anchors that have a positive and a negative
    (``average="anchors"``). The paper sums over anchors, and a log over an
    empty set of positives (or negatives) is ``-inf``, so such an anchor
    costs 0. pytorch-metric-learning reads that empty log-sum-exp as 0 (a
    singleton anchor then costs ``max(log sum_n exp(neg_margin - d_an), 0)``)
    and averages over all anchors: on batches where every anchor has a
    positive and a negative (P x K batches), the two agree.

    Args:
        neg_margin: the margin of the negatives. Defaults to `1.0`.
        pos_margin: subtracted from the positive distances. Defaults to
            `0.0` (the paper's form).
        miner: a :class:`tfdml.miners.Miner` selecting the pairs; `None` or
            `"default"` for every pair (:class:`tfdml.miners.AllPairsMiner`).
            Defaults to `"default"`.
        {SHARED_ARGS}

    Examples:

    >>> loss = tfdml.losses.GeneralizedLiftedStructureLoss(neg_margin=1.0)
    >>> model.compile(optimizer="adam", loss=loss)

    Reference:
        Hermans, Beyer, Leibe, "In defense of the triplet loss for person
        re-identification", arXiv:1703.07737, 2017 (Section 2, the
        generalized lifted embedding).
    """

    def __init__(self, neg_margin: float = 1.0, pos_margin: float = 0.0, miner="default",
                 normalize=True, average="anchors", reduction="sum_over_batch_size",
                 name="generalized_lifted_structure_loss", dtype=None, block_size=None):
        super().__init__(normalize=normalize, average=average, reduction=reduction, name=name,
                         dtype=dtype, block_size=block_size,
                         **_check_args(neg_margin, pos_margin, miner))

    def terms(self, inputs):
        return _generalized_lifted_terms(inputs, **self.arguments)


@fill_doc(REFERENCE_ARGS=REFERENCE_ARGS)
def generalized_lifted_structure_loss(y_true, y_pred, neg_margin: float = 1.0,
                                      pos_margin: float = 0.0, miner="default", normalize=True,
                                      ref_embeddings=None, ref_labels=None, ref_offset=None,
                                      average="anchors"):
    """Functional form of :class:`GeneralizedLiftedStructureLoss`: the mean over anchors.

    Args:
        y_true: ``[B]`` or ``[B, 1]`` integer class ids.
        y_pred: ``[B, D]`` embeddings.
        neg_margin, pos_margin, miner, normalize, average: as in
            :class:`GeneralizedLiftedStructureLoss`.
        {REFERENCE_ARGS}

    Returns:
        A scalar of the dtype of ``y_pred``; 0 when no anchor has a positive and a
        negative, NaN when an embedding is NaN or Inf.
    """
    return functional_loss(GeneralizedLiftedStructureLoss, _generalized_lifted_terms, y_true,
                           y_pred, ref_embeddings, ref_labels, ref_offset, normalize, average,
                           **_check_args(neg_margin, pos_margin, miner))
