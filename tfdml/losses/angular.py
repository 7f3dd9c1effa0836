"""Angle-based pair losses: the angular loss (Wang et al.) and the tuplet margin loss (Yu & Tao).

Both are, per positive pair ``(a, p)``, ``log(1 + sum_n exp(z_apn))`` over the negatives
``n`` of the anchor, averaged over the positive pairs. Each ``z_apn`` splits into a term of
the pair and terms of the negatives, so neither builds a ``[B, R, R]`` tensor: the tuplet
margin loss is ``softplus(lse_n(.) - .)`` of ``[B, R]`` matrices, and the angular loss's sum
over negatives is one matrix product.
"""

from __future__ import annotations

import math

import keras
from keras import ops

from tfdml import ops as dml
from tfdml._argument_checks import check_number, check_positive
from tfdml._docs import fill_doc
from tfdml._shims import dtype_name
from tfdml.losses._docstrings import REFERENCE_ARGS, shared_args
from tfdml.losses.base import MetricLoss, functional_loss
from tfdml.losses.inputs import mined_pairs, resolve_miner
from tfdml.losses.terms import triplet_terms
from tfdml.miners import AllPairsMiner, Miner

__all__ = ["AngularLoss", "TupletMarginLoss", "angular_loss", "tuplet_margin_loss"]


def _pairs(inputs, miner: Miner):
    """``(similarities [B, R], pairs)``: cosine similarities and the mined pairs."""
    sim = dml.pairwise_similarity(inputs.x, inputs.ref)
    return sim, mined_pairs(inputs, sim, miner)


# -- angular loss -------------------------------------------------------------------------------


def _check_angular(alpha: float = math.radians(40), miner="default"):
    return {"alpha": check_number("alpha", alpha, low=0, high=math.pi / 2, low_open=True,
                                  high_open=True),
            "miner": resolve_miner(miner, AllPairsMiner)}


def _angular_terms(inputs, alpha, miner: Miner):
    sim, pairs = _pairs(inputs, miner)
    ref = inputs.ref
    dtype = dtype_name(sim)
    t2 = math.tan(alpha) ** 2
    c = ops.convert_to_tensor(4.0 * t2, dtype)
    # sum_n exp(c (s_an + s_pn)) = exp(2 c) [(N_a o e^{c (s_a. - 1)}) @ e^{c (s_.p - 1)}]_ap:
    # shifted by the largest similarity (1), the exponentials cannot overflow.
    to_negatives = ops.where(pairs.negative, ops.exp(c * (sim - 1.0)), ops.zeros((), dtype))
    among_ref = sim if inputs.batch_is_reference else dml.pairwise_similarity(ref, ref)
    sums = dml.matmul(to_negatives, ops.exp(c * (among_ref - 1.0)))  # [B, R]: sum over n
    # 0 without a negative (or when every term underflows, for alpha near pi/2): no loss.
    found = sums > 0
    safe = ops.where(found, sums, ops.ones((), dtype))
    logits = 2.0 * c + ops.log(safe) - ops.convert_to_tensor(2.0 * (1.0 + t2), dtype) * sim
    values = ops.where(found, ops.softplus(logits), ops.zeros((), dtype))
    return triplet_terms(values, pairs.positive)


@keras.saving.register_keras_serializable(package="tfdml")
@fill_doc(SHARED_ARGS=shared_args("angular_loss", average="terms"))
class AngularLoss(MetricLoss):
    """Angular loss: the angle at the negative of each (anchor, positive, negative) triangle.

    With ``x`` the L2-normalized embeddings and ``t = tan(alpha)``, per
    positive pair ``(a, p)`` (eq. 8 of the paper, its N-pair form)::

        L_ap = log(1 + sum_n exp(4 t^2 (x_a + x_p)^T x_n - 2 (1 + t^2) x_a^T x_p))

    over the negatives ``n`` of the anchor. It bounds the angle at ``x_n``
    of the triangle ``(x_a, x_p, x_n)`` by ``alpha``, a constraint that does
    not depend on the scale of the distances.

    **Averaged over** the positive pairs (``average="terms"``), as
    pytorch-metric-learning; with two samples per class (the paper's N-pair
    batches) that is the paper's mean over anchors. A positive pair whose
    anchor has no negative costs 0 and still counts. The paper adds an
    N-pair loss (``lambda = 2``); combine the two losses for that.

    Args:
        alpha: the angle in radians, in ``(0, pi/2)``. Defaults to
            `radians(40)` (the paper's best on CUB and Cars; 36 on SOP).
        miner: a :class:`tfdml.miners.Miner` selecting the positive and
            negative pairs; `None` or `"default"` for every pair
            (:class:`tfdml.miners.AllPairsMiner`). Defaults to `"default"`.
        {SHARED_ARGS}

    Examples:

    >>> loss = tfdml.losses.AngularLoss(alpha=math.radians(45))
    >>> model.compile(optimizer="adam", loss=loss)

    Reference:
        Wang, Zhou, Wen, Liu, Lin, "Deep metric learning with angular loss",
        ICCV 2017.
    """

    def __init__(self, alpha: float = math.radians(40), miner="default", normalize=True,
                 average="terms", reduction="sum_over_batch_size", name="angular_loss", dtype=None,
                 block_size=None):
        super().__init__(normalize=normalize, average=average, reduction=reduction, name=name,
                         dtype=dtype, block_size=block_size, **_check_angular(alpha, miner))

    def terms(self, inputs):
        return _angular_terms(inputs, **self.arguments)


@fill_doc(REFERENCE_ARGS=REFERENCE_ARGS)
def angular_loss(y_true, y_pred, alpha: float = math.radians(40), miner="default", normalize=True,
                 ref_embeddings=None, ref_labels=None, ref_offset=None, average="terms"):
    """Functional form of :class:`AngularLoss`: the mean over the positive pairs.

    Args:
        y_true: ``[B]`` or ``[B, 1]`` integer class ids.
        y_pred: ``[B, D]`` embeddings.
        alpha, miner, normalize, average: as in :class:`AngularLoss`.
        {REFERENCE_ARGS}

    Returns:
        A scalar of the dtype of ``y_pred``; 0 without a positive pair, NaN when an
        embedding is NaN or Inf.
    """
    return functional_loss(AngularLoss, _angular_terms, y_true, y_pred, ref_embeddings, ref_labels,
                           ref_offset, normalize, average, **_check_angular(alpha, miner))


# -- tuplet margin loss -------------------------------------------------------------------------


def _check_tuplet(margin: float = math.radians(5.73), scale: float = 64.0, miner="default"):
    return {"margin": check_number("margin", margin, low=-math.pi / 2, high=math.pi / 2),
            "scale": check_positive("scale", scale),
            "miner": resolve_miner(miner, AllPairsMiner)}


def _tuplet_terms(inputs, margin, scale, miner: Miner):
    sim, pairs = _pairs(inputs, miner)
    dtype = dtype_name(sim)
    scale = ops.convert_to_tensor(scale, dtype)
    # cos(theta_ap - margin), with sin(theta) = sqrt(1 - cos^2) (finite gradient at 0).
    sine = dml.safe_sqrt(ops.relu(1.0 - ops.square(sim)))
    shifted = sim * math.cos(margin) + sine * math.sin(margin)
    negatives, has_negative = dml.masked_logsumexp(scale * sim, pairs.negative)
    zero = ops.zeros((), dtype)
    logits = ops.where(has_negative, negatives, zero)[:, None] - scale * shifted
    values = ops.where(has_negative[:, None], ops.softplus(logits), zero)
    return triplet_terms(values, pairs.positive)


@keras.saving.register_keras_serializable(package="tfdml")
@fill_doc(SHARED_ARGS=shared_args("tuplet_margin_loss", average="terms"))
class TupletMarginLoss(MetricLoss):
    """Tuplet margin loss: a scaled softmax of each positive pair against the negatives.

    With ``theta_ap`` the angle between the anchor and the positive, ``beta``
    the margin and ``s`` the scale, per positive pair ``(a, p)``::

        L_ap = log(1 + sum_n exp(s (cos theta_an - cos(theta_ap - beta))))

    over the negatives ``n`` of the anchor. The margin ``beta`` makes the
    positive look farther than it is, so that hard positives keep a
    gradient.

    **Averaged over** the positive pairs (``average="terms"``), as
    pytorch-metric-learning; a positive pair whose anchor has no negative
    costs 0 and still counts. The paper's intra-pair variance term is
    :class:`IntraPairVarianceLoss` in pytorch-metric-learning (not part of
    this loss).

    Args:
        margin: ``beta`` in radians. Defaults to `radians(5.73)` (0.1,
            the paper's).
        scale: ``s > 0``. Defaults to `64.0`.
        miner: a :class:`tfdml.miners.Miner` selecting the positive and
            negative pairs; `None` or `"default"` for every pair
            (:class:`tfdml.miners.AllPairsMiner`). Defaults to `"default"`.
        {SHARED_ARGS}

    Examples:

    >>> loss = tfdml.losses.TupletMarginLoss(margin=0.1, scale=64.0)
    >>> model.compile(optimizer="adam", loss=loss)

    Reference:
        Yu, Tao, "Deep metric learning with tuplet margin loss", ICCV 2019.
    """

    def __init__(self, margin: float = math.radians(5.73), scale: float = 64.0, miner="default",
                 normalize=True, average="terms", reduction="sum_over_batch_size",
                 name="tuplet_margin_loss", dtype=None, block_size=None):
        super().__init__(normalize=normalize, average=average, reduction=reduction, name=name,
                         dtype=dtype, block_size=block_size, **_check_tuplet(margin, scale, miner))

    def terms(self, inputs):
        return _tuplet_terms(inputs, **self.arguments)


@fill_doc(REFERENCE_ARGS=REFERENCE_ARGS)
def tuplet_margin_loss(y_true, y_pred, margin: float = math.radians(5.73), scale: float = 64.0,
                       miner="default", normalize=True, ref_embeddings=None, ref_labels=None,
                       ref_offset=None, average="terms"):
    """Functional form of :class:`TupletMarginLoss`: the mean over the positive pairs.

    Args:
        y_true: ``[B]`` or ``[B, 1]`` integer class ids.
        y_pred: ``[B, D]`` embeddings.
        margin, scale, miner, normalize, average: as in :class:`TupletMarginLoss`.
        {REFERENCE_ARGS}

    Returns:
        A scalar of the dtype of ``y_pred``; 0 without a positive pair, NaN when an
        embedding is NaN or Inf.
    """
    return functional_loss(TupletMarginLoss, _tuplet_terms, y_true, y_pred, ref_embeddings,
                           ref_labels, ref_offset, normalize, average,
                           **_check_tuplet(margin, scale, miner))
