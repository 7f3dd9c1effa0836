"""Contrastive (pair) losses: Hadsell, Chopra and LeCun's, in the form of the class-collapse
paper, and its signal-to-noise ratio form (Yuan et al.)."""

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
from tfdml.losses.terms import split_pair_terms
from tfdml.miners import AllPairsMiner, Miner

__all__ = ["ContrastiveLoss", "SNRContrastiveLoss", "contrastive_loss", "snr_contrastive_loss"]


def _check_args(positive_margin: float = 0.0, negative_margin: float = 0.5, distance: str = "l2",
                miner="default"):
    return {"positive_margin": check_number("positive_margin", positive_margin, low=0),
            "negative_margin": check_number("negative_margin", negative_margin, low=0),
            "distance": dml.check_distance(distance), "miner": resolve_miner(miner, AllPairsMiner)}


def _hinge_terms(inputs, dist, positive_margin, negative_margin, miner: Miner):
    """Per pair ``max(d - positive_margin, 0)`` (positive) or ``max(negative_margin - d, 0)``
    (negative), over the pairs the miner keeps (mined on ``-dist``)."""
    pairs = mined_pairs(inputs, -dist, miner)
    positive = ops.relu(dist - ops.convert_to_tensor(positive_margin, dtype_name(dist)))
    negative = ops.relu(ops.convert_to_tensor(negative_margin, dtype_name(dist)) - dist)
    return split_pair_terms(positive, negative, pairs)


def _contrastive_terms(inputs, positive_margin, negative_margin, distance, miner: Miner):
    dist = dml.distance_matrix(inputs.x, inputs.ref, distance)
    return _hinge_terms(inputs, dist, positive_margin, negative_margin, miner)


@keras.saving.register_keras_serializable(package="tfdml")
@fill_doc(SHARED_ARGS=shared_args("contrastive_loss", average="terms"))
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
    means. pytorch-metric-learning averages the positive and the negative
    pairs each over their own non-zero terms and adds the two means:
    ``average="halves"`` gives its values.

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
        {SHARED_ARGS}

    Examples:

    >>> loss = tfdml.losses.ContrastiveLoss(negative_margin=0.5)
    >>> loss = tfdml.losses.ContrastiveLoss(
    ...     miner=tfdml.miners.MultiSimilarityMiner(positive="easy"))

    Reference:
        Hadsell, Chopra, LeCun, "Dimensionality reduction by learning an
        invariant mapping", CVPR 2006; "Reducing class collapse in metric
        learning with easy positive sampling" (Section 3).
    """

    split_terms = True

    def __init__(self, positive_margin: float = 0.0, negative_margin: float = 0.5,
                 distance: str = "l2", miner="default", normalize=True, average="terms",
                 reduction="sum_over_batch_size", name="contrastive_loss", dtype=None,
                 block_size=None):
        super().__init__(normalize=normalize, average=average, reduction=reduction, name=name,
                         dtype=dtype, block_size=block_size,
                         **_check_args(positive_margin, negative_margin, distance, miner))

    def terms(self, inputs):
        return _contrastive_terms(inputs, **self.arguments)


@fill_doc(REFERENCE_ARGS=REFERENCE_ARGS)
def contrastive_loss(y_true, y_pred, positive_margin: float = 0.0, negative_margin: float = 0.5,
                     distance: str = "l2", miner="default", normalize=True, ref_embeddings=None,
                     ref_labels=None, ref_offset=None, average="terms"):
    """Functional form of :class:`ContrastiveLoss`: by default the mean over all pairs.

    Args:
        y_true: ``[B]`` or ``[B, 1]`` integer class ids.
        y_pred: ``[B, D]`` embeddings.
        positive_margin, negative_margin, distance, miner, normalize, average: as in
            :class:`ContrastiveLoss`.
        {REFERENCE_ARGS}

    Returns:
        A scalar of the dtype of ``y_pred``; 0 when no anchor has a pair, NaN when an
        embedding is NaN or Inf.
    """
    return functional_loss(ContrastiveLoss, _contrastive_terms, y_true, y_pred, ref_embeddings,
                           ref_labels, ref_offset, normalize, average,
                           **_check_args(positive_margin, negative_margin, distance, miner))


# -- signal-to-noise ratio ----------------------------------------------------------------------

#: The smallest anchor variance (times D - 1) the SNR distance divides by.
SNR_MIN_VARIANCE = 1e-12


def snr_distance(x, y=None):
    """``[B, R]`` signal-to-noise ratio distances ``var(y_j - x_i) / var(x_i)`` (Yuan et al.).

    Computed from the row-centred vectors ``c``: ``|c_i - c_j|^2 / |c_i|^2`` (the
    ``1 / (D - 1)`` of both variances cancels), with no ``[B, R, D]`` tensor. An anchor of
    (near) zero variance, a constant vector, divides by ``SNR_MIN_VARIANCE`` instead of 0.
    """
    x = ops.convert_to_tensor(x)
    y = x if y is None else ops.convert_to_tensor(y)
    centred_x = x - ops.mean(x, axis=1, keepdims=True)
    centred_y = centred_x if y is x else y - ops.mean(y, axis=1, keepdims=True)
    noise = dml.pairwise_distance(centred_x, centred_y, squared=True)
    signal = ops.sum(ops.square(centred_x), axis=1, keepdims=True)
    return noise / dml.maximum(signal, SNR_MIN_VARIANCE)


def _check_snr(pos_margin: float = 0.0, neg_margin: float = 1.0, miner="default"):
    return {"pos_margin": check_number("pos_margin", pos_margin, low=0, finite=True),
            "neg_margin": check_number("neg_margin", neg_margin, low=0, finite=True),
            "miner": resolve_miner(miner, AllPairsMiner)}


def _snr_terms(inputs, pos_margin, neg_margin, miner: Miner):
    return _hinge_terms(inputs, snr_distance(inputs.x, inputs.ref), pos_margin, neg_margin,
                        miner)


@keras.saving.register_keras_serializable(package="tfdml")
@fill_doc(SHARED_ARGS=shared_args("snr_contrastive_loss", average="terms"))
class SNRContrastiveLoss(MetricLoss):
    """The contrastive loss on the signal-to-noise ratio distance of Yuan et al.

    The SNR distance from an anchor ``x_i`` to ``x_j`` is the variance of the
    "noise" ``x_j - x_i`` over the variance of the "signal" ``x_i`` (over the
    embedding's entries; asymmetric)::

        d_ij = var(x_j - x_i) / var(x_i)

    and the pairs are hinged as in :class:`ContrastiveLoss`: positive pairs
    ``max(d - pos_margin, 0)``, negative pairs ``max(neg_margin - d, 0)``.

    **Averaged over** the pairs (``average="terms"``), as
    :class:`ContrastiveLoss`. pytorch-metric-learning averages the positive
    and the negative pairs separately over their non-zero terms and adds the
    two means: ``average="halves"`` gives its values. The
    paper's regularizer on the mean of the embeddings is not applied (nor is
    it in pytorch-metric-learning).

    Args:
        pos_margin: ``>= 0``. Defaults to `0.0`.
        neg_margin: ``>= 0``. Defaults to `1.0`.
        miner: a :class:`tfdml.miners.Miner`; `None` or `"default"` for
            every pair (:class:`tfdml.miners.AllPairsMiner`). Defaults to
            `"default"`.
        {SHARED_ARGS}

    Examples:

    >>> loss = tfdml.losses.SNRContrastiveLoss(neg_margin=1.0)
    >>> model.compile(optimizer="adam", loss=loss)

    Reference:
        Yuan, Chen, Wang, Yu, Shi, Zhang, "Signal-to-noise ratio: a robust
        distance metric for deep metric learning", CVPR 2019.
    """

    split_terms = True

    def __init__(self, pos_margin: float = 0.0, neg_margin: float = 1.0, miner="default",
                 normalize=True, average="terms", reduction="sum_over_batch_size",
                 name="snr_contrastive_loss", dtype=None, block_size=None):
        super().__init__(normalize=normalize, average=average, reduction=reduction, name=name,
                         dtype=dtype, block_size=block_size,
                         **_check_snr(pos_margin, neg_margin, miner))

    def terms(self, inputs):
        return _snr_terms(inputs, **self.arguments)


@fill_doc(REFERENCE_ARGS=REFERENCE_ARGS)
def snr_contrastive_loss(y_true, y_pred, pos_margin: float = 0.0, neg_margin: float = 1.0,
                         miner="default", normalize=True, ref_embeddings=None, ref_labels=None,
                         ref_offset=None, average="terms"):
    """Functional form of :class:`SNRContrastiveLoss`: by default the mean over all pairs.

    Args:
        y_true: ``[B]`` or ``[B, 1]`` integer class ids.
        y_pred: ``[B, D]`` embeddings.
        pos_margin, neg_margin, miner, normalize, average: as in
            :class:`SNRContrastiveLoss`.
        {REFERENCE_ARGS}

    Returns:
        A scalar of the dtype of ``y_pred``; 0 when no anchor has a pair, NaN when an
        embedding is NaN or Inf.
    """
    return functional_loss(SNRContrastiveLoss, _snr_terms, y_true, y_pred, ref_embeddings,
                           ref_labels, ref_offset, normalize, average,
                           **_check_snr(pos_margin, neg_margin, miner))
