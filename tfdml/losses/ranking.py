"""Losses that optimize a smoothed average precision: FastAP, PNP and Smooth-AP.

Each anchor ranks the reference set (the other samples of the batch, or
``ref_embeddings``) by similarity and scores the ranks of its positives; the loss
of an anchor is one term (:func:`tfdml.losses.terms.anchor_terms`), or one term per
positive, so ``block_size`` splits the anchors as for any other loss.

* FastAP soft-bins the distances to the anchor: ``O(B R + B n)`` memory for
  ``n`` bins.
* PNP and Smooth-AP compare every pair of reference items per anchor through a
  sigmoid: a ``[B, R, R]`` tensor (``[block_size, R, R]`` with ``block_size``).
"""

from __future__ import annotations

import keras
from keras import ops

from tfdml import ops as dml
from tfdml._argument_checks import check_choice, check_int, check_positive
from tfdml._docs import fill_doc
from tfdml._shims import dtype_name
from tfdml.losses._docstrings import REFERENCE_ARGS, shared_args
from tfdml.losses.base import MetricLoss, functional_loss
from tfdml.losses.fappy import node_histograms
from tfdml.losses.terms import anchor_terms, triplet_terms

__all__ = [
    "PNP_VARIANTS",
    "FastAPLoss",
    "PNPLoss",
    "SmoothAPLoss",
    "fast_ap_loss",
    "pnp_loss",
    "smooth_ap_loss",
]

#: The variants of the PNP loss (:class:`PNPLoss`).
PNP_VARIANTS = ("O", "Ds", "Dq", "Iu", "Ib")


def _similarities(inputs):
    """``(s [B, R], positive, negative)``: cosine similarities and the label masks."""
    labels, x, ref_labels, ref, ref_offset = inputs
    positive, negative = dml.label_masks(labels, ref_labels, ref_offset)
    return dml.pairwise_similarity(x, ref), positive, negative


def _ranked_before(sim, mask, temperature):
    """``[B, R]``: per anchor ``a`` and item ``i``, ``sum_{j in mask[a]} sigmoid((s_aj - s_ai) / t)``,
    the smoothed number of the items of ``mask`` ranked before ``i`` (a ``[B, R, R]`` tensor)."""
    dtype = dtype_name(sim)
    before = ops.sigmoid((sim[:, None, :] - sim[:, :, None]) / temperature)
    return ops.einsum("aij,aj->ai", before, ops.cast(mask, dtype))


# -- FastAP ----------------------------------------------------------------------------------


def _check_fast_ap(num_bins=10):
    return {"num_bins": check_int("num_bins", num_bins, minimum=1)}


def _fast_ap_terms(inputs, num_bins):
    sim, positive, negative = _similarities(inputs)
    dtype = dtype_name(sim)
    # The squared distance 2 - 2 s on the nodes 4 k / num_bins is -s on the nodes
    # -1 + k (2 / num_bins): the same triangular kernel, on -s.
    width, nodes = 2.0 / num_bins, num_bins + 1
    h_pos = node_histograms(-sim, positive, width, nodes, normalize=False)
    h_neg = node_histograms(-sim, negative, width, nodes, normalize=False)
    # Every item spreads a unit weight over the nodes (sum_k h+_k = N+), so
    # 1 - FastAP = (1 / N+) sum_k h+_k H-_k / H_k with the cumulative histograms H:
    # exactly 0, with zero gradients, for an anchor without negatives.
    below = dml.cumsum(h_pos + h_neg, axis=1)
    per_node = dml.divide_no_nan(h_pos * dml.cumsum(h_neg, axis=1), below)
    num_pos = ops.sum(ops.cast(positive, dtype), axis=1)
    losses = dml.divide_no_nan(ops.sum(per_node, axis=1), num_pos)
    return anchor_terms(losses, ops.any(positive, axis=1))


@keras.saving.register_keras_serializable(package="tfdml")
@fill_doc(SHARED_ARGS=shared_args("fast_ap_loss"))
class FastAPLoss(MetricLoss):
    """FastAP: average precision from soft histograms of the distances to each anchor.

    With ``d`` the squared Euclidean distance of the L2-normalized embeddings (in
    ``[0, 4]``), each other sample spreads a unit weight over the ``num_bins + 1``
    nodes ``z_k = 4 k / num_bins`` with the triangular kernel
    ``max(0, 1 - |d - z_k| / Delta)``, ``Delta = 4 / num_bins``. With ``h+_k`` and
    ``h_k`` the weight of the anchor's positives and of all its other samples on node
    ``k``, and ``H+_k``, ``H_k`` their sums over the nodes up to ``k``::

        FastAP_a = (1 / N+_a) sum_k h+_k H+_k / H_k
        L_a = 1 - FastAP_a

    **Averaged over** the anchors with a positive (``average="anchors"``), as the
    authors' code and pytorch-metric-learning; an anchor without negatives has
    ``FastAP = 1`` (loss 0) and still counts.

    Args:
        num_bins: the number of bins ``>= 1`` (``num_bins + 1`` nodes). Defaults to
            `10`.
        {SHARED_ARGS}

    Examples:

    >>> loss = tfdml.losses.FastAPLoss(num_bins=10)
    >>> model.compile(optimizer="adam", loss=loss)

    Reference:
        Cakir, He, Xia, Kulis, Sclaroff, "Deep metric learning to rank", CVPR 2019.
    """

    def __init__(self, num_bins=10, normalize=True, average="anchors",
                 reduction="sum_over_batch_size", name="fast_ap_loss", dtype=None, block_size=None):
        super().__init__(normalize=normalize, average=average, reduction=reduction, name=name,
                         dtype=dtype, block_size=block_size, **_check_fast_ap(num_bins))

    def terms(self, inputs):
        return _fast_ap_terms(inputs, **self.arguments)


@fill_doc(REFERENCE_ARGS=REFERENCE_ARGS)
def fast_ap_loss(y_true, y_pred, num_bins=10, normalize=True, ref_embeddings=None, ref_labels=None,
                 ref_offset=None, average="anchors"):
    """Functional form of :class:`FastAPLoss`: the mean of ``1 - FastAP`` over the anchors with a positive.

    Args:
        y_true: ``[B]`` or ``[B, 1]`` integer class ids.
        y_pred: ``[B, D]`` embeddings.
        num_bins, normalize, average: as in :class:`FastAPLoss`.
        {REFERENCE_ARGS}

    Returns:
        A scalar of the dtype of ``y_pred``; 0 without a positive pair, NaN when an
        embedding is NaN or Inf.
    """
    return functional_loss(FastAPLoss, _fast_ap_terms, y_true, y_pred, ref_embeddings, ref_labels,
                           ref_offset, normalize, average, **_check_fast_ap(num_bins))


# -- PNP ---------------------------------------------------------------------------------------


def _check_pnp(b=2, alpha=1, anneal=0.01, variant="O"):
    return {"b": check_positive("b", b), "alpha": check_positive("alpha", alpha),
            "anneal": check_positive("anneal", anneal),
            "variant": check_choice("variant", variant, PNP_VARIANTS)}


def _pnp_shape(rank, variant, b, alpha):
    """The loss of a positive with ``rank`` negatives (smoothed) ranked before it."""
    if variant == "O":
        return rank
    if variant == "Ds":
        return ops.log1p(rank)
    if variant == "Dq":  # 1 - (1 + rank)^-alpha
        return -ops.expm1(-alpha * ops.log1p(rank))
    if variant == "Iu":
        return (1.0 + rank) * ops.log1p(rank)
    return (b * rank - ops.log1p(b * rank)) / (b * b)  # "Ib"


def _pnp_terms(inputs, b, alpha, anneal, variant):
    sim, positive, negative = _similarities(inputs)
    rank = _ranked_before(sim, negative, anneal)
    return triplet_terms(_pnp_shape(rank, variant, b, alpha), positive)


@keras.saving.register_keras_serializable(package="tfdml")
@fill_doc(SHARED_ARGS=shared_args("pnp_loss"))
class PNPLoss(MetricLoss):
    """PNP: penalizes the negatives ranked before each positive.

    With ``s`` the cosine similarities and ``tau = anneal``, the smoothed number of
    negatives ``n`` of anchor ``a`` ranked before its positive ``p`` is
    ``R_ap = sum_n sigmoid((s_an - s_ap) / tau)``, and per anchor::

        L_a = (1 / |P_a|) sum_{p in P_a} f(R_ap)

    over its positives ``P_a`` (the other samples of its class), with ``f`` by
    ``variant``: ``"O"``: ``R``; ``"Ds"``: ``log(1 + R)``; ``"Dq"``:
    ``1 - (1 + R)^-alpha``; ``"Iu"``: ``(1 + R) log(1 + R)``; ``"Ib"``:
    ``(b R - log(1 + b R)) / b^2``. The ``D`` variants (decreasing derivative) are
    the paper's best (PNP-D).

    **Averaged over** the anchors with a positive (``average="anchors"``).
    pytorch-metric-learning 2.9 also counts each such anchor among its own positives
    (an extra term ``f(R_aa)``, with ``s_aa = 1``, and ``|P_a| + 1`` in the
    denominator); tfdml follows the paper (docs/losses.md).

    Builds a ``[B, R, R]`` tensor (``[block_size, R, R]`` with ``block_size``).

    Args:
        b: ``b > 0`` of the ``"Ib"`` variant. Defaults to `2`.
        alpha: ``alpha > 0`` of the ``"Dq"`` variant. Defaults to `1`.
        anneal: the sigmoid's temperature ``tau > 0``. Defaults to `0.01`.
        variant: one of ``"O"``, ``"Ds"``, ``"Dq"``, ``"Iu"``, ``"Ib"``. Defaults to
            `"O"`.
        {SHARED_ARGS}

    Examples:

    >>> loss = tfdml.losses.PNPLoss(variant="Ds")
    >>> model.compile(optimizer="adam", loss=loss)

    Reference:
        Li, Min, Song, Zhu, Kang, Wei, Wei, Jiang, "Rethinking the optimization of
        average precision: only penalizing negative instances before positive ones is
        enough", AAAI 2022.
    """

    def __init__(self, b=2, alpha=1, anneal=0.01, variant="O", normalize=True, average="anchors",
                 reduction="sum_over_batch_size", name="pnp_loss", dtype=None, block_size=None):
        super().__init__(normalize=normalize, average=average, reduction=reduction, name=name,
                         dtype=dtype, block_size=block_size,
                         **_check_pnp(b, alpha, anneal, variant))

    def terms(self, inputs):
        return _pnp_terms(inputs, **self.arguments)


@fill_doc(REFERENCE_ARGS=REFERENCE_ARGS)
def pnp_loss(y_true, y_pred, b=2, alpha=1, anneal=0.01, variant="O", normalize=True,
             ref_embeddings=None, ref_labels=None, ref_offset=None, average="anchors"):
    """Functional form of :class:`PNPLoss`: the mean over the anchors with a positive.

    Args:
        y_true: ``[B]`` or ``[B, 1]`` integer class ids.
        y_pred: ``[B, D]`` embeddings.
        b, alpha, anneal, variant, normalize, average: as in :class:`PNPLoss`.
        {REFERENCE_ARGS}

    Returns:
        A scalar of the dtype of ``y_pred``; 0 without a positive pair, NaN when an
        embedding is NaN or Inf.
    """
    return functional_loss(PNPLoss, _pnp_terms, y_true, y_pred, ref_embeddings, ref_labels,
                           ref_offset, normalize, average, **_check_pnp(b, alpha, anneal, variant))


# -- Smooth-AP --------------------------------------------------------------------------------


def _check_smooth_ap(temperature=0.01):
    return {"temperature": check_positive("temperature", temperature)}


def _smooth_ap_terms(inputs, temperature):
    sim, positive, negative = _similarities(inputs)
    # rank among the positives 1 + sum_{j in P, j != i} G = 0.5 + sum_{j in P} G (G_ii = 1/2).
    positives_before = 0.5 + _ranked_before(sim, positive, temperature)
    negatives_before = _ranked_before(sim, negative, temperature)
    # 1 - rank_P / rank_all = negatives before / rank_all: 0 without negatives.
    values = negatives_before / (positives_before + negatives_before)
    return triplet_terms(values, positive)


@keras.saving.register_keras_serializable(package="tfdml")
@fill_doc(SHARED_ARGS=shared_args("smooth_ap_loss"))
class SmoothAPLoss(MetricLoss):
    """Smooth-AP: average precision with the ranks smoothed by a sigmoid.

    With ``s`` the cosine similarities, ``G(x) = sigmoid(x / temperature)``, and for
    anchor ``a`` its positives ``P_a`` (the other samples of its class) and its
    retrieval set ``O_a`` (every other sample), the smoothed rank of a positive ``i``
    among ``S`` is ``1 + sum_{j in S, j != i} G(s_aj - s_ai)``, and::

        AP_a = (1 / |P_a|) sum_{i in P_a} rank_{P_a}(i) / rank_{O_a}(i)
        L_a = 1 - AP_a

    **Averaged over** the anchors with a positive (``average="anchors"``; each
    positive is one term of its anchor, so ``"terms"`` averages over the positive
    pairs). An anchor without negatives has ``AP = 1`` (loss 0).
    pytorch-metric-learning 2.9 puts the anchor in its own retrieval set and among
    its positives, and needs classes of equal size in class order
    (docs/losses.md); tfdml follows the paper and takes any batch.

    Builds a ``[B, R, R]`` tensor (``[block_size, R, R]`` with ``block_size``).

    Args:
        temperature: ``> 0``. Defaults to `0.01` (the paper's).
        {SHARED_ARGS}

    Examples:

    >>> loss = tfdml.losses.SmoothAPLoss(temperature=0.01)
    >>> model.compile(optimizer="adam", loss=loss)

    Reference:
        Brown, Xie, Kalogeiton, Zisserman, "Smooth-AP: smoothing the path towards
        large-scale image retrieval", ECCV 2020.
    """

    def __init__(self, temperature=0.01, normalize=True, average="anchors",
                 reduction="sum_over_batch_size", name="smooth_ap_loss", dtype=None,
                 block_size=None):
        super().__init__(normalize=normalize, average=average, reduction=reduction, name=name,
                         dtype=dtype, block_size=block_size, **_check_smooth_ap(temperature))

    def terms(self, inputs):
        return _smooth_ap_terms(inputs, **self.arguments)


@fill_doc(REFERENCE_ARGS=REFERENCE_ARGS)
def smooth_ap_loss(y_true, y_pred, temperature=0.01, normalize=True, ref_embeddings=None,
                   ref_labels=None, ref_offset=None, average="anchors"):
    """Functional form of :class:`SmoothAPLoss`: the mean of ``1 - AP`` over the anchors with a positive.

    Args:
        y_true: ``[B]`` or ``[B, 1]`` integer class ids.
        y_pred: ``[B, D]`` embeddings.
        temperature, normalize, average: as in :class:`SmoothAPLoss`.
        {REFERENCE_ARGS}

    Returns:
        A scalar of the dtype of ``y_pred``; 0 without a positive pair, NaN when an
        embedding is NaN or Inf.
    """
    return functional_loss(SmoothAPLoss, _smooth_ap_terms, y_true, y_pred, ref_embeddings,
                           ref_labels, ref_offset, normalize, average,
                           **_check_smooth_ap(temperature))
