"""Classification losses on cosines: normalized softmax, CosFace, ArcFace, sub-centre ArcFace,
SoftTriple, and P2SGrad's squared cosine error.

Each compares the unit embedding ``x`` of a sample of class ``y`` with ``C``
unit class vectors ``w_c`` (``k`` per class for sub-centre ArcFace and
SoftTriple) through ``cos_c = x . w_c`` and takes the softmax cross-entropy of
scaled, margin-adjusted cosines:

``L = -log( exp(s * f(cos_y)) / (exp(s * f(cos_y)) + sum_{c != y} exp(s * cos_c)) )``

with ``f(cos) = cos`` (normalized softmax, ``s = 1 / temperature``),
``cos - m`` (CosFace) or ``cos(theta + m)`` (ArcFace). The loss is the mean
over the batch. P2SGrad instead regresses the cosines onto the one-hot target. Computed in float32 (float64 for float64 embeddings) whatever
the dtype policy, so the large scales (``s = 64``) never overflow float16.
"""

from __future__ import annotations

import math

import keras
from keras import ops

from tfdml import ops as dml
from tfdml._checks import check_int, check_positive
from tfdml.losses.class_weights import (
    _LOGIT_LIMIT,
    CLASS_COMMON,
    CLASS_HEAD,
    ClassWeightLoss,
    check_scale,
    class_cosines,
    class_mask,
    softmax_cross_entropy,
)
from tfdml.losses.spec import loss_class

__all__ = [
    "ArcFaceLoss",
    "CosFaceLoss",
    "LargeMarginSoftmaxLoss",
    "NormalizedSoftmaxLoss",
    "P2SGradLoss",
    "SoftTripleLoss",
    "SphereFaceLoss",
    "SubCenterArcFaceLoss",
    "arcface_loss",
    "cosface_loss",
    "large_margin_softmax_loss",
    "normalized_softmax_loss",
    "p2s_grad_loss",
    "soft_triple_loss",
    "sphereface_loss",
    "subcenter_arcface_loss",
]


def _constant(value, like):
    return ops.convert_to_tensor(value, dml.dtype_name(like))


def _margin_logits(cosines, target, scale, modified_target):
    """``scale * cosines`` with the target column replaced by ``scale * modified_target``."""
    logits = ops.where(target, modified_target[:, None], cosines)
    return logits * _constant(scale, cosines)


def _target_cosine(cosines, target):
    dtype = dml.dtype_name(cosines)
    return ops.sum(ops.where(target, cosines, ops.zeros((), dtype)), axis=-1)


def _arcface_target(cos_y, margin):
    """``cos(theta + m)`` for ``theta = arccos(cos_y) <= pi - m``, else ``cos_y - m sin(m)``.

    The second branch keeps the target logit decreasing in ``theta`` past
    ``pi - m`` (Deng et al.'s code; pytorch-metric-learning does the same).
    ``cos(theta + m) = cos_y cos(m) - sin(theta) sin(m)`` with ``sin(theta) =
    sqrt(1 - cos_y^2)``, whose gradient stays finite at ``cos_y = +-1``.
    """
    one = _constant(1.0, cos_y)
    cos_y = dml.clip(cos_y, -one, one)
    sin_y = dml.safe_sqrt(one - ops.square(cos_y))
    plus = cos_y * _constant(math.cos(margin), cos_y) - sin_y * _constant(math.sin(margin), cos_y)
    past = cos_y - _constant(margin * math.sin(margin), cos_y)
    return ops.where(cos_y >= _constant(-math.cos(margin), cos_y), plus, past)


def _check_divisor(name, value):
    """A divisor of the cosines, ``>= 1e-6``."""
    value = check_positive(name, value)
    if value < 1.0 / _LOGIT_LIMIT:
        raise ValueError(
            f"`{name}` must be a number >= 1e-6: the cosines are divided by it into float32 "
            "logits, whose rounding makes a compiled (XLA) softmax Inf or NaN from about 1e9 "
            f"on. Received: {name}={value!r}")
    return value


def _check_cosine_margin(margin):
    """A margin subtracted from a cosine, in ``[0, 2]``."""
    margin = check_positive("margin", margin, allow_zero=True)
    if margin > 2:
        raise ValueError(
            "`margin` must be a number in [0, 2]: it is subtracted from a cosine, and cosines "
            "differ by at most 2, so a larger margin can never be met (and a large one makes "
            f"the logits overflow). Received: margin={margin!r}")
    return margin


def _check_temperature(temperature: float = 0.05):
    return {"temperature": _check_divisor("temperature", temperature)}


def _check_margin_scale(margin: float = 0.35, scale: float = 64.0):
    return {"margin": _check_cosine_margin(margin), "scale": check_scale("scale", scale)}


def _check_arc_args(margin: float = 0.5, scale: float = 64.0):
    if not dml.is_number(margin) or not 0 <= margin < math.pi / 2:
        raise ValueError("`margin` must be an angle in radians in [0, pi/2). "
                         f"Received: margin={margin!r}")
    return {"margin": float(margin), "scale": check_scale("scale", scale)}


# -- the per-sample losses, from unit embeddings and weights ------------------------------------


def _normalized_softmax(labels, x, w, temperature):
    cosines = class_cosines(x, w)
    target = class_mask(labels, w.shape[0])
    return softmax_cross_entropy(cosines / _constant(temperature, cosines), target)


def _cosface(labels, x, w, margin, scale):
    cosines = class_cosines(x, w)
    target = class_mask(labels, w.shape[0])
    cos_y = _target_cosine(cosines, target)
    return softmax_cross_entropy(
        _margin_logits(cosines, target, scale, cos_y - _constant(margin, cos_y)), target)


def _arcface(labels, x, w, margin, scale):
    cosines = class_cosines(x, w)
    if len(cosines.shape) == 3:  # sub-centres: each class's nearest one
        cosines = ops.max(cosines, axis=-1)
    target = class_mask(labels, w.shape[0])
    cos_y = _target_cosine(cosines, target)
    return softmax_cross_entropy(
        _margin_logits(cosines, target, scale, _arcface_target(cos_y, margin)), target)


def _check_soft_triple_args(la: float = 20.0, gamma: float = 0.1, margin: float = 0.01):
    return {"la": check_scale("la", la), "gamma": _check_divisor("gamma", gamma),
            "margin": _check_cosine_margin(margin)}


def _soft_triple(labels, x, w, la, gamma, margin):
    cosines = class_cosines(x, w)  # [B, C, k]
    weights = ops.softmax(cosines / _constant(gamma, cosines), axis=-1)
    similarity = ops.sum(weights * cosines, axis=-1)  # [B, C]
    target = class_mask(labels, w.shape[0])
    logits = similarity - ops.where(target, _constant(margin, similarity),
                                     ops.zeros((), dml.dtype_name(similarity)))
    return softmax_cross_entropy(logits * _constant(la, logits), target)


#: The largest angle multiplier of :class:`LargeMarginSoftmaxLoss` and :class:`SphereFaceLoss`.
MAX_ANGLE_MULTIPLIER = 128


def _check_large_margin(margin: int = 4, scale: float = 1.0):
    margin = check_int("margin", margin)
    if margin > MAX_ANGLE_MULTIPLIER:
        raise ValueError(
            f"`margin` must be an integer in [1, {MAX_ANGLE_MULTIPLIER}]: near theta = 0, "
            "cos(m theta) moves m^2 times as fast as cos(theta), so float32 cosines (spaced "
            "6e-8 below 1) resolve the target logit only to about m^2 * 6e-8 (1e-3 at "
            f"m = {MAX_ANGLE_MULTIPLIER}). Received: margin={margin!r}")
    return {"margin": margin, "scale": check_scale("scale", scale)}


def _multiple_angle_target(cos_y, margin):
    """``psi(theta) = (-1)^k cos(m theta) - 2k`` for ``theta`` in ``[k pi/m, (k+1) pi/m]``
    (Liu et al. 2016, eq. 6), ``cos(m theta) = T_m(cos theta)`` by the Chebyshev recurrence
    ``T_{n+1} = 2 c T_n - T_{n-1}``: a polynomial, with no ``arccos`` in the gradient.

    The recurrence stays within about ``m^2`` rounding errors for ``|c| <= 1`` (below
    1e-4 in float32 at ``m = 128``); the sum of the multiple-angle formula (the paper's
    eq. 7) cancels terms as large as ``2^(m/2)`` (off by 150 at ``m = 64`` in float32) and
    its binomial coefficients overflow float32 from ``m = 132``.
    """
    one = _constant(1.0, cos_y)
    cos_y = dml.clip(cos_y, -one, one)
    previous, cos_m = ops.ones_like(cos_y), cos_y  # T_0, T_1
    for _ in range(margin - 1):
        previous, cos_m = cos_m, 2.0 * cos_y * cos_m - previous
    theta = ops.arccos(ops.stop_gradient(cos_y))
    k = ops.stop_gradient(dml.floor(theta * _constant(margin / math.pi, cos_y)))
    sign = one - 2.0 * (k - 2.0 * dml.floor(k / 2.0))  # (-1)^k
    return sign * cos_m - 2.0 * k


def _large_margin_logits(labels, x, w, margin, scale, magnitudes):
    """``scale * magnitudes * [cos_c, psi(theta_y) at the target]`` and the target mask."""
    cosines = class_cosines(x, w)
    target = class_mask(labels, w.shape[0])
    modified = _multiple_angle_target(_target_cosine(cosines, target), margin)
    logits = ops.where(target, modified[:, None], cosines)
    return logits * magnitudes * _constant(scale, cosines), target


def _large_margin(labels, x, w, margin, scale, norms):
    x_norm, w_norm = norms
    logits, target = _large_margin_logits(labels, x, w, margin, scale,
                                          x_norm[:, None] * w_norm[None, :])
    return softmax_cross_entropy(logits, target)


def _sphereface(labels, x, w, margin, scale, norms):
    logits, target = _large_margin_logits(labels, x, w, margin, scale, norms[0][:, None])
    return softmax_cross_entropy(logits, target)


def _check_p2s():
    return {}


def _p2s_grad(labels, x, w):
    """``1/2 sum_c (cos_c - [c = y])^2``: its gradient is P2SGrad's update (eq. 11)."""
    cosines = class_cosines(x, w)
    target = ops.cast(class_mask(labels, w.shape[0]), dml.dtype_name(cosines))
    return 0.5 * ops.sum(ops.square(cosines - target), axis=-1)


# -- functional forms --------------------------------------------------------------------------


def large_margin_softmax_loss(y_true, y_pred, weights, margin: int = 4, scale: float = 1.0):
    """Large-margin softmax (L-Softmax, Liu et al. 2016): the target logit
    ``|w_y| |x| psi(theta_y)``, the others ``|w_c| |x| cos(theta_c)``, times ``scale``.

    Args:
        y_true: ``[B]`` integer class ids in ``[0, C)``.
        y_pred: ``[B, D]`` embeddings (their norms enter the logits).
        weights: ``[C, D]`` class weights (their norms enter the logits).
        margin: the integer angle multiplier ``m`` in ``[1, 128]``. Defaults to
            `4`.
        scale: ``s`` in ``(0, 1e6]``. Defaults to `1.0`.

    Returns:
        The mean over the batch (dtype of ``y_pred``; NaN for NaN/Inf inputs).
    """
    return LargeMarginSoftmaxLoss.functional(y_true, y_pred, weights, margin=margin,
                                             scale=scale)


def sphereface_loss(y_true, y_pred, weights, margin: int = 4, scale: float = 1.0):
    """SphereFace / A-Softmax (Liu et al. 2017): L-Softmax with unit class weights, the
    logits ``|x| psi(theta_y)`` and ``|x| cos(theta_c)``, times ``scale``.

    Args:
        y_true: ``[B]`` integer class ids in ``[0, C)``.
        y_pred: ``[B, D]`` embeddings (their norms enter the logits).
        weights: ``[C, D]`` class weights (normalized here).
        margin: the integer angle multiplier ``m`` in ``[1, 128]``. Defaults to
            `4`.
        scale: ``s`` in ``(0, 1e6]``. Defaults to `1.0`.

    Returns:
        The mean over the batch (dtype of ``y_pred``; NaN for NaN/Inf inputs).
    """
    return SphereFaceLoss.functional(y_true, y_pred, weights, margin=margin, scale=scale)


def p2s_grad_loss(y_true, y_pred, weights):
    """P2SGrad (Zhang et al. 2019) as a loss: ``1/2 sum_c (cos(x, w_c) - [c = y])^2``.

    Its gradient is the paper's update (eq. 11), ``sum_c (cos_c - [c = y]) grad cos_c``.

    Args:
        y_true: ``[B]`` integer class ids in ``[0, C)``.
        y_pred: ``[B, D]`` embeddings (normalized here).
        weights: ``[C, D]`` class weights (normalized here).

    Returns:
        The mean over the batch (dtype of ``y_pred``; NaN for NaN/Inf inputs).
    """
    return P2SGradLoss.functional(y_true, y_pred, weights)


def normalized_softmax_loss(y_true, y_pred, weights, temperature: float = 0.05):
    """Normalized softmax loss (Zhai & Wu 2019): cross-entropy of ``cos(x, w_c) / T``.

    Args:
        y_true: ``[B]`` integer class ids in ``[0, C)``.
        y_pred: ``[B, D]`` embeddings (normalized here).
        weights: ``[C, D]`` class weights (normalized here).
        temperature: ``T >= 1e-6``. Defaults to `0.05`.

    Returns:
        The mean over the batch, a scalar of the dtype of ``y_pred``; NaN when
        an embedding or a weight is NaN or Inf.
    """
    return NormalizedSoftmaxLoss.functional(y_true, y_pred, weights, temperature=temperature)


def cosface_loss(y_true, y_pred, weights, margin: float = 0.35, scale: float = 64.0):
    """CosFace / large margin cosine loss (Wang et al. 2018): target logit ``s (cos_y - m)``.

    Args:
        y_true: ``[B]`` integer class ids in ``[0, C)``.
        y_pred: ``[B, D]`` embeddings (normalized here).
        weights: ``[C, D]`` class weights (normalized here).
        margin: ``m`` in ``[0, 2]``, subtracted from the target cosine. Defaults
            to `0.35`.
        scale: ``s`` in ``(0, 1e6]``. Defaults to `64.0`.

    Returns:
        The mean over the batch (dtype of ``y_pred``; NaN for NaN/Inf inputs).
    """
    return CosFaceLoss.functional(y_true, y_pred, weights, margin=margin, scale=scale)


def arcface_loss(y_true, y_pred, weights, margin: float = 0.5, scale: float = 64.0):
    """ArcFace / additive angular margin loss (Deng et al. 2019): target logit
    ``s cos(theta_y + m)``.

    Past ``theta_y > pi - m`` the target logit is ``s (cos_y - m sin m)``, as in
    the authors' code, so that it keeps decreasing with the angle.

    Args:
        y_true: ``[B]`` integer class ids in ``[0, C)``.
        y_pred: ``[B, D]`` embeddings (normalized here).
        weights: ``[C, D]`` class weights (normalized here).
        margin: ``m`` in radians, in ``[0, pi/2)``. Defaults to `0.5`
            (pytorch-metric-learning's default is 28.6 degrees = 0.4992).
        scale: ``s`` in ``(0, 1e6]``. Defaults to `64.0`.

    Returns:
        The mean over the batch (dtype of ``y_pred``; NaN for NaN/Inf inputs).
    """
    return ArcFaceLoss.functional(y_true, y_pred, weights, margin=margin, scale=scale)


def subcenter_arcface_loss(y_true, y_pred, weights, margin: float = 0.5, scale: float = 64.0):
    """Sub-centre ArcFace (Deng et al. 2020): ArcFace on each class's nearest sub-centre.

    ``cos_c = max_j cos(x, w_c^j)`` over the ``k`` sub-centres of class ``c``.

    Args:
        y_true: ``[B]`` integer class ids in ``[0, C)``.
        y_pred: ``[B, D]`` embeddings (normalized here).
        weights: ``[C, k, D]`` sub-centres (normalized here).
        margin: ``m`` in radians, in ``[0, pi/2)``. Defaults to `0.5`.
        scale: ``s`` in ``(0, 1e6]``. Defaults to `64.0`.

    Returns:
        The mean over the batch (dtype of ``y_pred``; NaN for NaN/Inf inputs).
    """
    return SubCenterArcFaceLoss.functional(y_true, y_pred, weights, weights_name="weights",
                                           margin=margin, scale=scale)


def soft_triple_loss(y_true, y_pred, centers, la: float = 20.0, gamma: float = 0.1,
                     margin: float = 0.01):
    """SoftTriple loss (Qian et al. 2019): softmax over ``k`` centres per class.

    ``S_c = sum_j softmax_j(cos(x, w_c^j) / gamma) cos(x, w_c^j)``, then the
    cross-entropy of ``la (S_c - margin [c = y])``. The paper's regularizer
    that merges similar centres (its ``tau``) is not included, as in
    pytorch-metric-learning.

    Args:
        y_true: ``[B]`` integer class ids in ``[0, C)``.
        y_pred: ``[B, D]`` embeddings (normalized here).
        centers: ``[C, k, D]`` centres (normalized here).
        la: ``lambda`` in ``(0, 1e6]``, the scale. Defaults to `20.0`.
        gamma: ``gamma >= 1e-6``, the softmax temperature over a class's centres.
            Defaults to `0.1`.
        margin: ``delta`` in ``[0, 2]``. Defaults to `0.01`.

    Returns:
        The mean over the batch (dtype of ``y_pred``; NaN for NaN/Inf inputs).
    """
    return SoftTripleLoss.functional(y_true, y_pred, centers, la=la, gamma=gamma, margin=margin)


# -- classes -----------------------------------------------------------------------------------

_STATE_DOC = """
    The class vectors are a variable of the loss's state (``loss.class_weights``,
    ``[C, D]``; ``[C, k, D]`` with centres), created with the embedding size.
    Train with :class:`tfdml.models.MetricModel`, which owns the state: its
    ``fit`` trains the vectors with the network and its ``save`` keeps them.
    They are normalized in the loss, so their initial norm sets how fast an
    adaptive optimizer such as Adam turns them (about ``lr / norm`` radians
    per step): the default initializer gives norm about 1; a smaller
    ``stddev`` trains them faster.
"""

_COMMON_ARGS = """
        num_classes: ``C``; class ids must be in ``[0, C)``.
        embedding_dim: ``D``. Defaults to `None`: taken from the model by
            :class:`tfdml.models.MetricModel` (or from the first batch when
            called eagerly).
        initializer: a Keras initializer for the vectors. Defaults to `None`:
            normal with standard deviation ``1 / sqrt(D)``.
        reduction: see :mod:`tfdml.losses.base`. Defaults to
            `"sum_over_batch_size"`.
        average: see :mod:`tfdml.losses.base` (every sample is one term).
            Defaults to `"anchors"`, the mean over the batch.
        dtype: dtype of the returned value. Defaults to `None` (floatx)."""


_LARGE_MARGIN_DOC = """
    With ``theta_c`` the angle between the embedding ``x`` and the class
    vector ``w_c`` and ``m`` the integer margin, the target class's cosine is
    replaced by

        psi(theta) = (-1)^k cos(m theta) - 2k,   theta in [k pi / m, (k + 1) pi / m]

    (monotonically decreasing on ``[0, pi]``; ``cos(m theta)`` as a
    polynomial of ``cos theta``, the Chebyshev polynomial ``T_m``, so no
    ``arccos`` enters the gradient). Then the softmax cross-entropy, the mean
    over the batch. ``m`` is at most 128: float32 cosines resolve
    ``cos(m theta)`` near ``theta = 0`` only to about ``m^2 * 6e-8``.
"""


def _doc(cls):
    cls.__doc__ = cls.__doc__.replace("    {STATE}\n", _STATE_DOC).replace(
        "{ARGS}", _COMMON_ARGS.strip("\n")).replace("    {MARGIN}\n", _LARGE_MARGIN_DOC)
    return cls


@_doc
@loss_class("normalized_softmax_loss", head=CLASS_HEAD, common=CLASS_COMMON, document=False)
class NormalizedSoftmaxLoss(ClassWeightLoss):
    """Normalized softmax loss: cross-entropy of cosines over a temperature.

    ``L = -log softmax_y(cos(x, w_c) / T)``, the mean over the batch.
    {STATE}
    Args:
{ARGS}
        temperature: ``T >= 1e-6``. Defaults to `0.05`.
        name: name of the loss. Defaults to `"normalized_softmax_loss"`.

    Examples:

    >>> model = tfdml.models.MetricModel(
    ...     embedder, tfdml.losses.NormalizedSoftmaxLoss(num_classes=100, temperature=0.05))
    >>> model.compile(optimizer="adam")

    Reference:
        Zhai, Wu, "Classification is a strong baseline for deep metric
        learning", BMVC 2019.
    """

    sample_losses = staticmethod(_normalized_softmax)
    check_arguments = staticmethod(_check_temperature)


@_doc
@loss_class("cosface_loss", head=CLASS_HEAD, common=CLASS_COMMON, document=False)
class CosFaceLoss(ClassWeightLoss):
    """CosFace (large margin cosine) loss: the target logit is ``s (cos_y - m)``.

    ``L = -log softmax_y(s [cos_c - m [c = y]])``, the mean over the batch.
    {STATE}
    Args:
{ARGS}
        margin: ``m`` in ``[0, 2]``. Defaults to `0.35`.
        scale: ``s`` in ``(0, 1e6]``. Defaults to `64.0`.
        name: name of the loss. Defaults to `"cosface_loss"`.

    Examples:

    >>> loss = tfdml.losses.CosFaceLoss(num_classes=10_000, margin=0.35, scale=64.0)
    >>> model = tfdml.models.MetricModel(embedder, loss)

    Reference:
        Wang et al., "CosFace: Large margin cosine loss for deep face
        recognition", CVPR 2018.
    """

    sample_losses = staticmethod(_cosface)
    check_arguments = staticmethod(_check_margin_scale)

    _variable_name = "weights"


@_doc
@loss_class("arcface_loss", head=CLASS_HEAD, common=CLASS_COMMON, document=False)
class ArcFaceLoss(ClassWeightLoss):
    """ArcFace (additive angular margin) loss: the target logit is ``s cos(theta_y + m)``.

    ``theta_y = arccos(cos_y)``; past ``theta_y > pi - m`` the target logit is
    ``s (cos_y - m sin m)`` so that it keeps decreasing (Deng et al.'s code,
    pytorch-metric-learning). The mean over the batch. The margin is in
    radians (pytorch-metric-learning takes degrees: its default 28.6 is
    0.4992 rad).
    {STATE}
    Args:
{ARGS}
        margin: ``m`` in radians, in ``[0, pi/2)``. Defaults to `0.5`.
        scale: ``s`` in ``(0, 1e6]``. Defaults to `64.0`.
        name: name of the loss. Defaults to `"arcface_loss"`.

    Examples:

    >>> loss = tfdml.losses.ArcFaceLoss(num_classes=10_000)
    >>> model = tfdml.models.MetricModel(embedder, loss)
    >>> model.compile(optimizer="adam")

    Reference:
        Deng, Guo, Xue, Zafeiriou, "ArcFace: Additive angular margin loss for
        deep face recognition", CVPR 2019.
    """

    sample_losses = staticmethod(_arcface)
    check_arguments = staticmethod(_check_arc_args)


@_doc
@keras.saving.register_keras_serializable(package="tfdml")
class SubCenterArcFaceLoss(ArcFaceLoss):
    """Sub-centre ArcFace: ``k`` sub-centres per class, ArcFace on the nearest one.

    ``cos_c = max_j cos(x, w_c^j)``; then as :class:`ArcFaceLoss`. Samples of
    a class gather around a dominant sub-centre, and noisy ones around the
    others.
    {STATE}
    Args:
{ARGS}
        sub_centers: ``k >= 1``. Defaults to `3`.
        margin: ``m`` in radians, in ``[0, pi/2)``. Defaults to `0.5`.
        scale: ``s`` in ``(0, 1e6]``. Defaults to `64.0`.
        name: name of the loss. Defaults to `"subcenter_arcface_loss"`.

    Examples:

    >>> loss = tfdml.losses.SubCenterArcFaceLoss(num_classes=10_000, sub_centers=3)

    Reference:
        Deng, Guo, Liu, Zafeiriou, "Sub-center ArcFace: Boosting face
        recognition by large-scale noisy web faces", ECCV 2020.
    """

    weights_rank = 3

    _variable_name = "centers"

    def __init__(self, num_classes, embedding_dim=None, sub_centers: int = 3,
                 margin: float = 0.5, scale: float = 64.0, initializer=None,
                 reduction="sum_over_batch_size", name="subcenter_arcface_loss", dtype=None,
                 average="anchors"):
        self.sub_centers = check_int("sub_centers", sub_centers)
        super().__init__(num_classes, embedding_dim, margin, scale, initializer, reduction,
                         name, dtype, average)

    @property
    def _per_class(self):
        return self.sub_centers

    def get_config(self):
        return {**super().get_config(), "sub_centers": self.sub_centers}


@_doc
@keras.saving.register_keras_serializable(package="tfdml")
class SoftTripleLoss(ClassWeightLoss):
    """SoftTriple loss: a softmax loss with ``k`` centres per class.

    ``S_c = sum_j softmax_j(cos(x, w_c^j) / gamma) cos(x, w_c^j)`` and
    ``L = -log softmax_y(la (S_c - delta [c = y]))``, the mean over the
    batch. The paper's regularizer that merges centres (``tau``) is not
    included, as in pytorch-metric-learning.
    {STATE}
    Args:
{ARGS}
        centers_per_class: ``k >= 1``. Defaults to `10`.
        la: ``lambda`` in ``(0, 1e6]``, the scale. Defaults to `20.0`.
        gamma: ``gamma >= 1e-6``, the temperature of the softmax over centres.
            Defaults to `0.1`.
        margin: ``delta`` in ``[0, 2]``. Defaults to `0.01`.
        name: name of the loss. Defaults to `"soft_triple_loss"`.

    Examples:

    >>> loss = tfdml.losses.SoftTripleLoss(num_classes=100, centers_per_class=10)

    Reference:
        Qian, Shang, Sun, Hu, Li, Jin, "SoftTriple loss: Deep metric learning
        without triplet sampling", ICCV 2019.
    """

    sample_losses = staticmethod(_soft_triple)
    check_arguments = staticmethod(_check_soft_triple_args)
    weights_rank = 3

    _variable_name = "centers"

    def __init__(self, num_classes, embedding_dim=None, centers_per_class: int = 10,
                 la: float = 20.0, gamma: float = 0.1, margin: float = 0.01, initializer=None,
                 reduction="sum_over_batch_size", name="soft_triple_loss", dtype=None,
                 average="anchors"):
        self.centers_per_class = check_int("centers_per_class", centers_per_class)
        super().__init__(num_classes, embedding_dim, initializer, reduction, name, dtype, average,
                         la=la, gamma=gamma, margin=margin)

    @property
    def _per_class(self):
        return self.centers_per_class

    def get_config(self):
        return {**super().get_config(), "centers_per_class": self.centers_per_class}


@_doc
@loss_class("p2s_grad_loss", head=CLASS_HEAD, common=CLASS_COMMON, document=False)
class P2SGradLoss(ClassWeightLoss):
    """P2SGrad: the cosines to the class weights regressed onto the one-hot target.

    ``L = 1/2 sum_c (cos(x, w_c) - [c = y])^2``, the mean over the batch. Zhang
    et al. define P2SGrad by its update (eq. 11), ``sum_c (cos_c - [c = y])
    grad cos_c``, free of the scale and margin hyperparameters of the
    margin-softmax losses; this loss has exactly that gradient.
    pytorch-metric-learning takes the mean squared error over the batch and
    the classes instead, ``2 / C`` times this loss (and its gradients).
    {STATE}
    Args:
{ARGS}
        name: name of the loss. Defaults to `"p2s_grad_loss"`.

    Examples:

    >>> loss = tfdml.losses.P2SGradLoss(num_classes=10_000)
    >>> model = tfdml.models.MetricModel(embedder, loss)
    >>> model.compile(optimizer="sgd")

    Reference:
        Zhang, Zhao, Qiao, Wang, Li, Liu, "P2SGrad: Refined gradients for
        optimizing deep face models", CVPR 2019.
    """

    sample_losses = staticmethod(_p2s_grad)
    check_arguments = staticmethod(_check_p2s)




@_doc
@loss_class("large_margin_softmax_loss", head=CLASS_HEAD, common=CLASS_COMMON, document=False)
class LargeMarginSoftmaxLoss(ClassWeightLoss):
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
{ARGS}
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
    check_arguments = staticmethod(_check_large_margin)
    uses_norms = True


@_doc
@loss_class("sphereface_loss", head=CLASS_HEAD, common=CLASS_COMMON, document=False)
class SphereFaceLoss(ClassWeightLoss):
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
{ARGS}
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
    check_arguments = staticmethod(_check_large_margin)
    uses_norms = True
