"""Losses on the statistics of a batch's pairs: the threshold-consistent margin loss (Zhang et
al.), the intra-pair variance loss (Yu & Tao) and the ranked list loss (Wang et al.).

The first two hinge each positive and each negative pair (their cosine similarity) against a
level, a fixed margin or the batch's mean similarity, and average the positive and the
negative pairs apart (``average="halves"`` / ``"halves_terms"``, :mod:`tfdml.losses.terms`).
The ranked list loss
weighs, per anchor, the positives beyond and the negatives within its boundaries.
"""

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
from tfdml.losses.terms import anchor_terms, split_pair_terms
from tfdml.miners import AllPairsMiner, Miner

__all__ = [
    "IntraPairVarianceLoss",
    "RankedListLoss",
    "ThresholdConsistentMarginLoss",
    "intra_pair_variance_loss",
    "ranked_list_loss",
    "threshold_consistent_margin_loss",
]


def _similarities(inputs, miner: Miner):
    """``(similarities [B, R], pairs)``: cosine similarities and the mined pairs."""
    sim = dml.pairwise_similarity(inputs.x, inputs.ref)
    return sim, mined_pairs(inputs, sim, miner)


# -- threshold-consistent margin loss -----------------------------------------------------------


def _check_tcm(lambda_plus: float = 1.0, lambda_minus: float = 1.0, margin_plus: float = 0.9,
               margin_minus: float = 0.5, miner="default"):
    checked = {"lambda_plus": check_number("lambda_plus", lambda_plus, low=0, finite=True),
               "lambda_minus": check_number("lambda_minus", lambda_minus, low=0, finite=True),
               "margin_plus": check_number("margin_plus", margin_plus, low=-1, high=1),
               "margin_minus": check_number("margin_minus", margin_minus, low=-1, high=1)}
    if not checked["margin_minus"] <= checked["margin_plus"]:
        raise ValueError(
            "`margin_minus` must be <= `margin_plus`: the negative pairs are pushed below "
            "margin_minus and the positive pairs above margin_plus, so that a threshold "
            "between them separates the two. Received: "
            f"margin_minus={margin_minus!r}, margin_plus={margin_plus!r}")
    if checked["lambda_plus"] == 0 and checked["lambda_minus"] == 0:
        raise ValueError(
            "`lambda_plus` and `lambda_minus` cannot both be 0: no pair would ever cost. "
            f"Received: lambda_plus={lambda_plus!r}, lambda_minus={lambda_minus!r}")
    return {**checked, "miner": resolve_miner(miner, AllPairsMiner)}


def _tcm_terms(inputs, lambda_plus, lambda_minus, margin_plus, margin_minus, miner: Miner):
    sim, pairs = _similarities(inputs, miner)
    dtype = dtype_name(sim)

    def constant(value):
        return ops.convert_to_tensor(value, dtype)

    positive = constant(lambda_plus) * ops.relu(constant(margin_plus) - sim)
    negative = constant(lambda_minus) * ops.relu(sim - constant(margin_minus))
    return split_pair_terms(positive, negative, pairs)


@keras.saving.register_keras_serializable(package="tfdml")
@fill_doc(SHARED_ARGS=shared_args("threshold_consistent_margin_loss", average="halves"))
class ThresholdConsistentMarginLoss(MetricLoss):
    """Threshold-consistent margin loss: hinge the pairs' cosine similarities on two margins.

    With ``s`` the cosine similarity of a pair, the positive pairs below
    ``margin_plus`` and the negative pairs above ``margin_minus`` cost::

        positive pair: lambda_plus  max(margin_plus - s, 0)
        negative pair: lambda_minus max(s - margin_minus, 0)

    **Averaged** as the paper (eq. 5): the positive-pair terms over the
    positive pairs that cost something, plus the negative-pair terms over
    the negative pairs that cost something (``average="halves"``); a half
    where no pair costs anything adds 0. The two margins make the
    similarities of the positive and of the negative pairs consistent
    across classes, so that one threshold separates them everywhere. The
    paper adds this loss to a base loss as a regularizer; combine it with
    one through :class:`tfdml.losses.MultipleLosses`.

    Args:
        lambda_plus: ``>= 0``, the weight of the positive pairs. Defaults to
            `1.0`.
        lambda_minus: ``>= 0``, the weight of the negative pairs. Defaults
            to `1.0`.
        margin_plus: in ``[-1, 1]``, the similarity below which a positive
            pair costs. Defaults to `0.9`.
        margin_minus: in ``[-1, margin_plus]``, the similarity above which a
            negative pair costs. Defaults to `0.5`.
        miner: a :class:`tfdml.miners.Miner` selecting the positive and
            negative pairs; `None` or `"default"` for every pair
            (:class:`tfdml.miners.AllPairsMiner`). Defaults to `"default"`.
        {SHARED_ARGS}

    Raises:
        ValueError: naming the argument and the value received, for an
            argument out of its range, inverted margins (``margin_minus >
            margin_plus``: the loss would be satisfied with the positive and
            the negative pairs overlapping), or both weights 0.

    Examples:

    >>> loss = tfdml.losses.MultipleLosses(
    ...     [tfdml.losses.MultiSimilarityLoss(),
    ...      tfdml.losses.ThresholdConsistentMarginLoss()])
    >>> model.compile(optimizer="adam", loss=loss)

    Reference:
        Zhang, Li, Wang, Xu, Ding, Yao, Ye, Zhou, "Threshold-consistent
        margin loss for open-world deep metric learning", arXiv 2307.04047,
        2023.
    """

    split_terms = True

    def __init__(self, lambda_plus: float = 1.0, lambda_minus: float = 1.0,
                 margin_plus: float = 0.9, margin_minus: float = 0.5, miner="default",
                 normalize=True, average="halves", reduction="sum_over_batch_size",
                 name="threshold_consistent_margin_loss", dtype=None, block_size=None):
        super().__init__(normalize=normalize, average=average, reduction=reduction, name=name,
                         dtype=dtype, block_size=block_size,
                         **_check_tcm(lambda_plus, lambda_minus, margin_plus, margin_minus, miner))

    def terms(self, inputs):
        return _tcm_terms(inputs, **self.arguments)


@fill_doc(REFERENCE_ARGS=REFERENCE_ARGS)
def threshold_consistent_margin_loss(y_true, y_pred, lambda_plus: float = 1.0,
                                     lambda_minus: float = 1.0, margin_plus: float = 0.9,
                                     margin_minus: float = 0.5, miner="default", normalize=True,
                                     ref_embeddings=None, ref_labels=None, ref_offset=None,
                                     average="halves"):
    """Functional form of :class:`ThresholdConsistentMarginLoss`: the halves' means added.

    Args:
        y_true: ``[B]`` or ``[B, 1]`` integer class ids.
        y_pred: ``[B, D]`` embeddings.
        lambda_plus, lambda_minus, margin_plus, margin_minus, miner, normalize, average:
            as in :class:`ThresholdConsistentMarginLoss`.
        {REFERENCE_ARGS}

    Returns:
        A scalar of the dtype of ``y_pred``; 0 when no pair costs anything, NaN when an
        embedding is NaN or Inf.
    """
    return functional_loss(ThresholdConsistentMarginLoss, _tcm_terms, y_true, y_pred,
                           ref_embeddings, ref_labels, ref_offset, normalize, average,
                           **_check_tcm(lambda_plus, lambda_minus, margin_plus, margin_minus, miner))


# -- intra-pair variance loss -------------------------------------------------------------------


def _check_ipv(pos_eps: float = 0.01, neg_eps: float = 0.01, miner="default"):
    return {"pos_eps": check_number("pos_eps", pos_eps, low=0, high=1),
            "neg_eps": check_number("neg_eps", neg_eps, low=0, finite=True),
            "miner": resolve_miner(miner, AllPairsMiner)}


def _ipv_terms(inputs, pos_eps, neg_eps, miner: Miner):
    sim, pairs = _similarities(inputs, miner)
    dtype = dtype_name(sim)
    zero = ops.zeros((), dtype)

    def mean(mask):  # over the batch's mined pairs of one kind (0 for none)
        count = ops.sum(ops.cast(mask, dtype))
        return dml.divide_no_nan(ops.sum(ops.where(mask, sim, zero)), count)

    below = ops.convert_to_tensor(1.0 - pos_eps, dtype) * mean(pairs.positive) - sim
    above = sim - ops.convert_to_tensor(1.0 + neg_eps, dtype) * mean(pairs.negative)
    return split_pair_terms(ops.square(ops.relu(below)), ops.square(ops.relu(above)), pairs)


@keras.saving.register_keras_serializable(package="tfdml")
@fill_doc(SHARED_ARGS=shared_args("intra_pair_variance_loss", average="halves_terms"))
class IntraPairVarianceLoss(MetricLoss):
    """Intra-pair variance loss: keep each pair's cosine similarity near its kind's batch mean.

    With ``s`` the cosine similarity of a pair and ``mu_pos`` / ``mu_neg``
    the means over the batch's positive / negative pairs::

        positive pair: max((1 - pos_eps) mu_pos - s, 0)^2
        negative pair: max(s - (1 + neg_eps) mu_neg, 0)^2

    A positive pair much less similar than the positives' mean, or a
    negative pair much more similar than the negatives' mean, costs: the
    similarities of each kind are pulled together (their variance shrinks).
    The gradient flows through the means too, as in
    pytorch-metric-learning.

    **Averaged** over the positive pairs plus over the negative pairs
    (``average="halves_terms"``: the mean positive-pair term plus the mean
    negative-pair term, the pairs that cost nothing included), as the
    paper's expectations and pytorch-metric-learning (its default
    ``MeanReducer`` on each half). ``average="halves"`` averages each half
    over the pairs that cost something instead.
    Yu & Tao add it to their :class:`TupletMarginLoss` (combine the two
    through :class:`tfdml.losses.MultipleLosses`).

    The means couple every pair of the batch, so the loss cannot run in
    blocks of anchors: ``block_size`` must be None.

    Args:
        pos_eps: in ``[0, 1]``. Defaults to `0.01`.
        neg_eps: ``>= 0``. Defaults to `0.01`.
        miner: a :class:`tfdml.miners.Miner` selecting the positive and
            negative pairs (the means are over the mined pairs); `None` or
            `"default"` for every pair (:class:`tfdml.miners.AllPairsMiner`).
            Defaults to `"default"`.
        {SHARED_ARGS}

    Examples:

    >>> loss = tfdml.losses.MultipleLosses(
    ...     [tfdml.losses.TupletMarginLoss(), tfdml.losses.IntraPairVarianceLoss()],
    ...     weights=[1.0, 0.5])
    >>> model.compile(optimizer="adam", loss=loss)

    Reference:
        Yu, Tao, "Deep metric learning with tuplet margin loss", ICCV 2019.
    """

    split_terms = True

    def __init__(self, pos_eps: float = 0.01, neg_eps: float = 0.01, miner="default",
                 normalize=True, average="halves_terms", reduction="sum_over_batch_size",
                 name="intra_pair_variance_loss", dtype=None, block_size=None):
        super().__init__(normalize=normalize, average=average, reduction=reduction, name=name,
                         dtype=dtype, block_size=block_size, **_check_ipv(pos_eps, neg_eps, miner))
        if self.block_size is not None:
            raise ValueError(
                "IntraPairVarianceLoss cannot run in blocks of anchors: its terms compare each "
                "pair with the mean similarity over every pair of the batch. Use "
                f"block_size=None. Received: block_size={self.block_size!r}")

    def terms(self, inputs):
        return _ipv_terms(inputs, **self.arguments)


@fill_doc(REFERENCE_ARGS=REFERENCE_ARGS)
def intra_pair_variance_loss(y_true, y_pred, pos_eps: float = 0.01, neg_eps: float = 0.01,
                             miner="default", normalize=True, ref_embeddings=None, ref_labels=None,
                             ref_offset=None, average="halves_terms"):
    """Functional form of :class:`IntraPairVarianceLoss`: the halves' means added.

    Args:
        y_true: ``[B]`` or ``[B, 1]`` integer class ids.
        y_pred: ``[B, D]`` embeddings.
        pos_eps, neg_eps, miner, normalize, average: as in
            :class:`IntraPairVarianceLoss`.
        {REFERENCE_ARGS}

    Returns:
        A scalar of the dtype of ``y_pred``; 0 when no pair costs anything, NaN when an
        embedding is NaN or Inf.
    """
    return functional_loss(IntraPairVarianceLoss, _ipv_terms, y_true, y_pred, ref_embeddings,
                           ref_labels, ref_offset, normalize, average,
                           **_check_ipv(pos_eps, neg_eps, miner))


# -- ranked list loss ---------------------------------------------------------------------------


def _check_rll(margin: float, tn: float, imbalance: float = 0.5, alpha=None, tp: float = 0.0):
    margin = check_number("margin", margin, low=0, finite=True)
    if alpha is not None:
        alpha = check_number("alpha", alpha, low=0, finite=True)
    return {"margin": margin, "tn": check_number("tn", tn, low=0, finite=True),
            "imbalance": check_number("imbalance", imbalance, low=0, high=1),
            "alpha": alpha, "tp": check_number("tp", tp, low=0, finite=True)}


def _weighted_mean(values, weights_exponent, mask):
    """Per row ``sum_mask e^{t_j} v_j / sum_mask e^{t_j}`` (0 for an empty mask), stable: the
    exponents are shifted by their row maximum over the mask."""
    dtype = dtype_name(values)
    zero = ops.zeros((), dtype)
    top, found = dml.masked_max(ops.stop_gradient(weights_exponent), mask)
    weights = ops.where(mask, ops.exp(ops.where(mask, weights_exponent - top[:, None], zero)),
                        zero)
    total = ops.sum(weights, axis=1)
    mean = ops.sum(weights * values, axis=1) / ops.where(found, total, ops.ones((), dtype))
    return ops.where(found, mean, zero)


def _rll_terms(inputs, margin, tn, imbalance, alpha, tp):
    labels, x, ref_labels, ref, ref_offset = inputs
    dist = dml.distance_matrix(x, ref, "l2")
    dtype = dtype_name(dist)
    alpha = 1.0 + margin / 2.0 if alpha is None else alpha
    positive, negative = dml.label_masks(labels, ref_labels, ref_offset)
    beyond = dist - ops.convert_to_tensor(alpha - margin, dtype)  # > 0: a violating positive
    within = ops.convert_to_tensor(alpha, dtype) - dist  # > 0: a violating negative
    zero = ops.zeros((), dtype)
    loss_p = _weighted_mean(beyond, tp * beyond, ops.logical_and(positive, beyond > zero))
    loss_n = _weighted_mean(within, tn * within, ops.logical_and(negative, within > zero))
    loss = (1.0 - imbalance) * loss_p + imbalance * loss_n
    active = ops.logical_or(ops.any(positive, axis=1), ops.any(negative, axis=1))
    return anchor_terms(loss, active)


@keras.saving.register_keras_serializable(package="tfdml")
@fill_doc(SHARED_ARGS=shared_args("ranked_list_loss", average="batch"))
class RankedListLoss(MetricLoss):
    """Ranked list loss: per anchor, push the positives within ``alpha - margin`` and the
    negatives beyond ``alpha``, weighing the violators.

    With ``d`` the Euclidean distance of L2-normalized embeddings, per anchor
    over the positives ``P*`` farther than ``alpha - margin`` and the
    negatives ``N*`` closer than ``alpha`` (eqs. 4-8 of the paper)::

        L_P = sum_{P*} w_p (d - (alpha - margin)) / sum_{P*} w_p,  w_p = e^{tp (d - (alpha - margin))}
        L_N = sum_{N*} w_n (alpha - d) / sum_{N*} w_n,             w_n = e^{tn (alpha - d)}
        L   = (1 - imbalance) L_P + imbalance L_N

    (``L_P = 0`` without a violating positive, ``L_N = 0`` without a
    violating negative). ``tp = 0`` weighs the positives equally, the
    paper's RLL-Simpler. Each weighted mean is computed with its exponents
    shifted by their largest, so large temperatures cannot overflow.

    **Averaged over** the batch (``average="batch"``): the sum over the
    anchors divided by the batch size, as the paper and
    pytorch-metric-learning. pytorch-metric-learning adds ``1e-5`` per
    reference sample to each normalizer and leaves out pairs at distance 0
    (docs/losses.md, "Coming from pytorch-metric-learning").

    Args:
        margin: ``>= 0``, the gap between the positives' and the negatives'
            boundaries.
        tn: ``>= 0``, the temperature of the negatives' weights.
        imbalance: in ``[0, 1]``, the weight of ``L_N``. Defaults to `0.5`.
        alpha: ``>= 0``, the negatives' boundary; `None` for
            ``1 + margin / 2``. Defaults to `None`.
        tp: ``>= 0``, the temperature of the positives' weights. Defaults
            to `0.0`.
        {SHARED_ARGS}

    Examples:

    >>> loss = tfdml.losses.RankedListLoss(margin=0.4, tn=10.0)
    >>> model.compile(optimizer="adam", loss=loss)

    Reference:
        Wang, Hua, Kodirov, Hu, Garnier, Robertson, "Ranked list loss for
        deep metric learning", CVPR 2019.
    """

    def __init__(self, margin: float, tn: float, imbalance: float = 0.5, alpha=None,
                 tp: float = 0.0, normalize=True, average="batch", reduction="sum_over_batch_size",
                 name="ranked_list_loss", dtype=None, block_size=None):
        super().__init__(normalize=normalize, average=average, reduction=reduction, name=name,
                         dtype=dtype, block_size=block_size,
                         **_check_rll(margin, tn, imbalance, alpha, tp))

    def terms(self, inputs):
        return _rll_terms(inputs, **self.arguments)


@fill_doc(REFERENCE_ARGS=REFERENCE_ARGS)
def ranked_list_loss(y_true, y_pred, margin: float, tn: float, imbalance: float = 0.5, alpha=None,
                     tp: float = 0.0, normalize=True, ref_embeddings=None, ref_labels=None,
                     ref_offset=None, average="batch"):
    """Functional form of :class:`RankedListLoss`: the mean over the batch.

    Args:
        y_true: ``[B]`` or ``[B, 1]`` integer class ids.
        y_pred: ``[B, D]`` embeddings.
        margin, tn, imbalance, alpha, tp, normalize, average: as in
            :class:`RankedListLoss`.
        {REFERENCE_ARGS}

    Returns:
        A scalar of the dtype of ``y_pred``; 0 when no pair violates its boundary, NaN
        when an embedding is NaN or Inf.
    """
    return functional_loss(RankedListLoss, _rll_terms, y_true, y_pred, ref_embeddings, ref_labels,
                           ref_offset, normalize, average,
                           **_check_rll(margin, tn, imbalance, alpha, tp))
