"""Large-margin softmax losses with an angle multiplier: L-Softmax (Liu et al. 2016) and
SphereFace / A-Softmax (Liu et al. 2017).

The target class's cosine ``cos(theta_y)`` becomes ``psi(theta_y)``, a function of
``cos(m theta_y)`` for the integer margin ``m``; the other classes keep theirs. The norms of
the embeddings (and, for L-Softmax, of the class weights) stay in the logits. Computed in
float32 (float64 for float64 embeddings) whatever the dtype policy.
"""

from __future__ import annotations

import math

import keras
from keras import ops

from tfdml import ops as dml
from tfdml._argument_checks import check_int
from tfdml._docs import fill_doc
from tfdml.losses._docstrings import CLASS_LABELS, CLASS_MEAN, CLASS_VECTOR_ARGS, STATE_DOC
from tfdml.losses.class_vectors import (
    MarginSoftmaxLoss,
    class_cosines,
    class_mask,
    constant_like,
    functional_margin_loss,
    softmax_cross_entropy,
    target_cosine,
)

__all__ = [
    "MAX_ANGLE_MULTIPLIER",
    "LargeMarginSoftmaxLoss",
    "SphereFaceLoss",
    "large_margin_softmax_loss",
    "sphereface_loss",
]


#: The largest angle multiplier of :class:`LargeMarginSoftmaxLoss` and :class:`SphereFaceLoss`.
MAX_ANGLE_MULTIPLIER = 128


def _check_multiplier(margin):
    """The angle multiplier ``m``, an integer in ``[1, MAX_ANGLE_MULTIPLIER]``."""
    margin = check_int("margin", margin)
    if margin > MAX_ANGLE_MULTIPLIER:
        raise ValueError(
            f"`margin` must be an integer in [1, {MAX_ANGLE_MULTIPLIER}]: near theta = 0, "
            "cos(m theta) moves m^2 times as fast as cos(theta), so float32 cosines (spaced "
            "6e-8 below 1) resolve the target logit only to about m^2 * 6e-8 (1e-3 at "
            f"m = {MAX_ANGLE_MULTIPLIER}). Received: margin={margin!r}")
    return margin


def _multiple_angle_target(cos_y, margin):
    """``psi(theta) = (-1)^k cos(m theta) - 2k`` for ``theta`` in ``[k pi/m, (k+1) pi/m]``
    (Liu et al. 2016, eq. 6), ``cos(m theta) = T_m(cos theta)`` by the Chebyshev recurrence
    ``T_{n+1} = 2 c T_n - T_{n-1}``: a polynomial, with no ``arccos`` in the gradient.

    The recurrence stays within about ``m^2`` rounding errors for ``|c| <= 1`` (below
    1e-4 in float32 at ``m = 128``); the sum of the multiple-angle formula (the paper's
    eq. 7) cancels terms as large as ``2^(m/2)`` (off by 150 at ``m = 64`` in float32) and
    its binomial coefficients overflow float32 from ``m = 132``.
    """
    one = constant_like(1.0, cos_y)
    cos_y = dml.clip(cos_y, -one, one)
    previous, cos_m = ops.ones_like(cos_y), cos_y  # T_0, T_1
    for _ in range(margin - 1):
        previous, cos_m = cos_m, 2.0 * cos_y * cos_m - previous
    theta = ops.arccos(ops.stop_gradient(cos_y))
    k = ops.stop_gradient(dml.floor(theta * constant_like(margin / math.pi, cos_y)))
    sign = one - 2.0 * (k - 2.0 * dml.floor(k / 2.0))  # (-1)^k
    return sign * cos_m - 2.0 * k


def _large_margin_logits(labels, x, w, margin, scale, magnitudes):
    """``scale * magnitudes * [cos_c, psi(theta_y) at the target]`` and the target mask."""
    cosines = class_cosines(x, w)
    target = class_mask(labels, w.shape[0])
    modified = _multiple_angle_target(target_cosine(cosines, target), margin)
    logits = ops.where(target, modified[:, None], cosines)
    return logits * magnitudes * constant_like(scale, cosines), target


def _large_margin(inputs, margin, scale):
    labels, x, w = inputs.labels, inputs.x, inputs.vectors
    x_norm, w_norm = inputs.norms()
    logits, target = _large_margin_logits(labels, x, w, margin, scale,
                                          x_norm[:, None] * w_norm[None, :])
    return softmax_cross_entropy(logits, target)


def _sphereface(inputs, margin, scale):
    labels, x, w = inputs.labels, inputs.x, inputs.vectors
    logits, target = _large_margin_logits(labels, x, w, margin, scale, inputs.norms()[0][:, None])
    return softmax_cross_entropy(logits, target)


#: The functional forms' own arguments.
_MULTIPLIER_ARGS = """margin: the integer angle multiplier ``m`` in ``[1, 128]``. Defaults to
    `4`.
scale: ``s`` in ``(0, 1e6]``. Defaults to `1.0`."""


@fill_doc(CLASS_LABELS=CLASS_LABELS, CLASS_MEAN=CLASS_MEAN, MULTIPLIER_ARGS=_MULTIPLIER_ARGS)
def large_margin_softmax_loss(y_true, y_pred, weights, margin: int = 4, scale: float = 1.0):
    """Large-margin softmax (L-Softmax, Liu et al. 2016): the target logit
    ``|w_y| |x| psi(theta_y)``, the others ``|w_c| |x| cos(theta_c)``, times ``scale``.

    Args:
        {CLASS_LABELS}
        y_pred: ``[B, D]`` embeddings (their norms enter the logits).
        weights: ``[C, D]`` class weights (their norms enter the logits).
        {MULTIPLIER_ARGS}

    Returns:
        {CLASS_MEAN}
    """
    return functional_margin_loss(LargeMarginSoftmaxLoss, y_true, y_pred, weights, margin, scale)


@fill_doc(CLASS_LABELS=CLASS_LABELS, CLASS_MEAN=CLASS_MEAN, MULTIPLIER_ARGS=_MULTIPLIER_ARGS)
def sphereface_loss(y_true, y_pred, weights, margin: int = 4, scale: float = 1.0):
    """SphereFace / A-Softmax (Liu et al. 2017): L-Softmax with unit class weights, the
    logits ``|x| psi(theta_y)`` and ``|x| cos(theta_c)``, times ``scale``.

    Args:
        {CLASS_LABELS}
        y_pred: ``[B, D]`` embeddings (their norms enter the logits).
        weights: ``[C, D]`` class weights (normalized here).
        {MULTIPLIER_ARGS}

    Returns:
        {CLASS_MEAN}
    """
    return functional_margin_loss(SphereFaceLoss, y_true, y_pred, weights, margin, scale)


_LARGE_MARGIN_DOC = """    With ``theta_c`` the angle between the embedding ``x`` and the class
vector ``w_c`` and ``m`` the integer margin, the target class's cosine is
replaced by

    psi(theta) = (-1)^k cos(m theta) - 2k,   theta in [k pi / m, (k + 1) pi / m]

(monotonically decreasing on ``[0, pi]``; ``cos(m theta)`` as a
polynomial of ``cos theta``, the Chebyshev polynomial ``T_m``, so no
``arccos`` enters the gradient). Then the softmax cross-entropy, the mean
over the batch. ``m`` is at most 128: float32 cosines resolve
``cos(m theta)`` near ``theta = 0`` only to about ``m^2 * 6e-8``."""


@keras.saving.register_keras_serializable(package="tfdml")
@fill_doc(STATE=STATE_DOC, MARGIN=_LARGE_MARGIN_DOC, CLASS_VECTOR_ARGS=CLASS_VECTOR_ARGS)
class LargeMarginSoftmaxLoss(MarginSoftmaxLoss):
    """Large-margin softmax (L-Softmax): an angular margin by an angle multiplier.

    The logits are ``s |w_c| |x| cos(theta_c)``, and ``s |w_y| |x| psi(theta_y)``
    for the target: the norms of the embeddings and of the class weights stay
    in the logits (eq. 5 of the paper), so the weights' scale matters here.

    {MARGIN}

    Liu et al. anneal from the softmax to this loss during training (logit
    ``(lambda |w||x| cos + |w||x| psi) / (1 + lambda)``, ``lambda`` decreasing);
    pytorch-metric-learning leaves that out, and so does this loss.

    {STATE}

    Args:
        {CLASS_VECTOR_ARGS}
        margin: the integer multiplier ``m`` in ``[1, 128]`` (1 is the
            softmax). Defaults to `4`.
        scale: ``s`` in ``(0, 1e6]``. Defaults to `1.0`.
        name: name of the loss. Defaults to `"large_margin_softmax_loss"`.

    Examples:

    >>> loss = tfdml.losses.LargeMarginSoftmaxLoss(num_classes=100, margin=2)
    >>> model = tfdml.models.MetricModel(embedder, loss)

    Reference:
        Liu, Wen, Yu, Yang, "Large-margin softmax loss for convolutional
        neural networks", ICML 2016.
    """

    sample_losses = staticmethod(_large_margin)
    check_margin = staticmethod(_check_multiplier)

    def __init__(self, num_classes, embedding_dim=None, initializer=None, margin: int = 4,
                 scale: float = 1.0, *, average="anchors", reduction="sum_over_batch_size",
                 name="large_margin_softmax_loss", dtype=None):
        super().__init__(num_classes, embedding_dim, initializer, margin, scale, average=average,
                         reduction=reduction, name=name, dtype=dtype)


@keras.saving.register_keras_serializable(package="tfdml")
@fill_doc(STATE=STATE_DOC, MARGIN=_LARGE_MARGIN_DOC, CLASS_VECTOR_ARGS=CLASS_VECTOR_ARGS)
class SphereFaceLoss(MarginSoftmaxLoss):
    """SphereFace (A-Softmax): L-Softmax with unit class weights.

    The logits are ``s |x| cos(theta_c)``, and ``s |x| psi(theta_y)`` for the
    target: the class weights are normalized, the embedding's norm stays
    (eq. 6 of the paper).

    {MARGIN}

    Liu et al. anneal from the softmax to this loss during training
    (``lambda``, their code); pytorch-metric-learning leaves that out, and so
    does this loss.

    {STATE}

    Args:
        {CLASS_VECTOR_ARGS}
        margin: the integer multiplier ``m`` in ``[1, 128]``. Defaults to
            `4`.
        scale: ``s`` in ``(0, 1e6]``. Defaults to `1.0`.
        name: name of the loss. Defaults to `"sphereface_loss"`.

    Examples:

    >>> loss = tfdml.losses.SphereFaceLoss(num_classes=10_000)
    >>> model = tfdml.models.MetricModel(embedder, loss)

    Reference:
        Liu, Wen, Yu, Li, Raj, Song, "SphereFace: Deep hypersphere embedding
        for face recognition", CVPR 2017.
    """

    sample_losses = staticmethod(_sphereface)
    check_margin = staticmethod(_check_multiplier)

    def __init__(self, num_classes, embedding_dim=None, initializer=None, margin: int = 4,
                 scale: float = 1.0, *, average="anchors", reduction="sum_over_batch_size",
                 name="sphereface_loss", dtype=None):
        super().__init__(num_classes, embedding_dim, initializer, margin, scale, average=average,
                         reduction=reduction, name=name, dtype=dtype)
