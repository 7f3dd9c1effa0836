"""Classification losses on cosines: normalized softmax, CosFace, ArcFace, sub-centre ArcFace,
SoftTriple, and P2SGrad's squared cosine error.

Each compares the unit embedding ``x`` of a sample of class ``y`` with ``C``
unit class vectors ``w_c`` (``k`` per class for sub-centre ArcFace and
SoftTriple) through ``cos_c = x . w_c`` and takes the softmax cross-entropy of
scaled, margin-adjusted cosines:

``L = -log( exp(s * f(cos_y)) / (exp(s * f(cos_y)) + sum_{c != y} exp(s * cos_c)) )``

with ``f(cos) = cos`` (normalized softmax, ``s = 1 / temperature``),
``cos - m`` (CosFace) or ``cos(theta + m)`` (ArcFace). The loss is the mean
over the batch. P2SGrad instead regresses the cosines onto the one-hot target. The
large-margin softmax and SphereFace (an angle multiplier) are in
:mod:`tfdml.losses.large_margin`. Computed in float32 (float64 for float64 embeddings)
whatever the dtype policy, so the large scales (``s = 64``) never overflow float16.
"""

from __future__ import annotations

import math

import keras
from keras import ops

from tfdml import ops as dml
from tfdml._argument_checks import check_int, check_positive, is_number
from tfdml._docs import fill_doc
from tfdml._shims import dtype_name
from tfdml.losses._docstrings import CLASS_LABELS, CLASS_MEAN, CLASS_VECTOR_ARGS, STATE_DOC
from tfdml.losses.class_vectors import (
    LOGIT_LIMIT,
    ClassVectorLoss,
    MarginSoftmaxLoss,
    check_scale,
    class_cosines,
    class_mask,
    constant_like,
    functional_class_loss,
    functional_margin_loss,
    sample_terms,
    softmax_cross_entropy,
    target_cosine,
)

__all__ = [
    "ArcFaceLoss",
    "CosFaceLoss",
    "NormalizedSoftmaxLoss",
    "P2SGradLoss",
    "SoftTripleLoss",
    "SubCenterArcFaceLoss",
    "arcface_loss",
    "cosface_loss",
    "normalized_softmax_loss",
    "p2s_grad_loss",
    "soft_triple_loss",
    "subcenter_arcface_loss",
]


def _margin_logits(cosines, target, scale, modified_target):
    """``scale * cosines`` with the target column replaced by ``scale * modified_target``."""
    logits = ops.where(target, modified_target[:, None], cosines)
    return logits * constant_like(scale, cosines)


def _arcface_target(cos_y, margin):
    """``cos(theta + m)`` for ``theta = arccos(cos_y) <= pi - m``, else ``cos_y - m sin(m)``.

    The second branch keeps the target logit decreasing in ``theta`` past
    ``pi - m`` (Deng et al.'s code; pytorch-metric-learning does the same).
    ``cos(theta + m) = cos_y cos(m) - sin(theta) sin(m)`` with ``sin(theta) =
    sqrt(1 - cos_y^2)``, whose gradient stays finite at ``cos_y = +-1``.
    """
    one = constant_like(1.0, cos_y)
    cos_y = dml.clip(cos_y, -one, one)
    sin_y = dml.safe_sqrt(one - ops.square(cos_y))
    plus = cos_y * constant_like(math.cos(margin), cos_y) - sin_y * constant_like(math.sin(margin), cos_y)
    past = cos_y - constant_like(margin * math.sin(margin), cos_y)
    return ops.where(cos_y >= constant_like(-math.cos(margin), cos_y), plus, past)


def _check_divisor(name, value):
    """A divisor of the cosines, ``>= 1e-6``."""
    value = check_positive(name, value)
    if value < 1.0 / LOGIT_LIMIT:
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


def _check_arc_margin(margin):
    """An additive angular margin in radians, in ``[0, pi/2)``."""
    if not is_number(margin) or not 0 <= margin < math.pi / 2:
        raise ValueError("`margin` must be an angle in radians in [0, pi/2). "
                         f"Received: margin={margin!r}")
    return float(margin)


# -- the per-sample losses, from unit embeddings and weights ------------------------------------


def _normalized_softmax(inputs, temperature):
    labels, x, w = inputs.labels, inputs.x, inputs.vectors
    cosines = class_cosines(x, w)
    target = class_mask(labels, w.shape[0])
    return softmax_cross_entropy(cosines / constant_like(temperature, cosines), target)


def _cosface(inputs, margin, scale):
    labels, x, w = inputs.labels, inputs.x, inputs.vectors
    cosines = class_cosines(x, w)
    target = class_mask(labels, w.shape[0])
    cos_y = target_cosine(cosines, target)
    return softmax_cross_entropy(
        _margin_logits(cosines, target, scale, cos_y - constant_like(margin, cos_y)), target)


def _arcface(inputs, margin, scale):
    labels, x, w = inputs.labels, inputs.x, inputs.vectors
    cosines = class_cosines(x, w)
    if len(cosines.shape) == 3:  # sub-centres: each class's nearest one
        cosines = ops.max(cosines, axis=-1)
    target = class_mask(labels, w.shape[0])
    cos_y = target_cosine(cosines, target)
    return softmax_cross_entropy(
        _margin_logits(cosines, target, scale, _arcface_target(cos_y, margin)), target)


def _soft_triple(inputs, la, gamma, margin):
    labels, x, w = inputs.labels, inputs.x, inputs.vectors
    cosines = class_cosines(x, w)  # [B, C, k]
    weights = ops.softmax(cosines / constant_like(gamma, cosines), axis=-1)
    similarity = ops.sum(weights * cosines, axis=-1)  # [B, C]
    target = class_mask(labels, w.shape[0])
    logits = similarity - ops.where(target, constant_like(margin, similarity),
                                     ops.zeros((), dtype_name(similarity)))
    return softmax_cross_entropy(logits * constant_like(la, logits), target)


def _p2s_grad(inputs):
    """``1/2 sum_c (cos_c - [c = y])^2``: its gradient is P2SGrad's update (eq. 11)."""
    labels, x, w = inputs.labels, inputs.x, inputs.vectors
    cosines = class_cosines(x, w)
    target = ops.cast(class_mask(labels, w.shape[0]), dtype_name(cosines))
    return 0.5 * ops.sum(ops.square(cosines - target), axis=-1)


# -- functional forms --------------------------------------------------------------------------


@fill_doc(CLASS_LABELS=CLASS_LABELS, CLASS_MEAN=CLASS_MEAN)
def p2s_grad_loss(y_true, y_pred, weights):
    """P2SGrad (Zhang et al. 2019) as a loss: ``1/2 sum_c (cos(x, w_c) - [c = y])^2``.

    Its gradient is the paper's update (eq. 11), ``sum_c (cos_c - [c = y]) grad cos_c``.

    Args:
        {CLASS_LABELS}
        y_pred: ``[B, D]`` embeddings (normalized here).
        weights: ``[C, D]`` class weights (normalized here).

    Returns:
        {CLASS_MEAN}
    """
    return functional_class_loss(_p2s_grad, y_true, y_pred, weights)


@fill_doc(CLASS_LABELS=CLASS_LABELS, CLASS_MEAN=CLASS_MEAN)
def normalized_softmax_loss(y_true, y_pred, weights, temperature: float = 0.05):
    """Normalized softmax loss (Zhai & Wu 2019): cross-entropy of ``cos(x, w_c) / T``.

    Args:
        {CLASS_LABELS}
        y_pred: ``[B, D]`` embeddings (normalized here).
        weights: ``[C, D]`` class weights (normalized here).
        temperature: ``T >= 1e-6``. Defaults to `0.05`.

    Returns:
        The mean over the batch, a scalar of the dtype of ``y_pred``; NaN when
        an embedding or a weight is NaN or Inf.
    """
    return functional_class_loss(_normalized_softmax, y_true, y_pred, weights,
                                 temperature=_check_divisor("temperature", temperature))


@fill_doc(CLASS_LABELS=CLASS_LABELS, CLASS_MEAN=CLASS_MEAN)
def cosface_loss(y_true, y_pred, weights, margin: float = 0.35, scale: float = 64.0):
    """CosFace / large margin cosine loss (Wang et al. 2018): target logit ``s (cos_y - m)``.

    Args:
        {CLASS_LABELS}
        y_pred: ``[B, D]`` embeddings (normalized here).
        weights: ``[C, D]`` class weights (normalized here).
        margin: ``m`` in ``[0, 2]``, subtracted from the target cosine. Defaults
            to `0.35`.
        scale: ``s`` in ``(0, 1e6]``. Defaults to `64.0`.

    Returns:
        {CLASS_MEAN}
    """
    return functional_margin_loss(CosFaceLoss, y_true, y_pred, weights, margin, scale)


@fill_doc(CLASS_LABELS=CLASS_LABELS, CLASS_MEAN=CLASS_MEAN)
def arcface_loss(y_true, y_pred, weights, margin: float = 0.5, scale: float = 64.0):
    """ArcFace / additive angular margin loss (Deng et al. 2019): target logit
    ``s cos(theta_y + m)``.

    Past ``theta_y > pi - m`` the target logit is ``s (cos_y - m sin m)``, as in
    the authors' code, so that it keeps decreasing with the angle.

    Args:
        {CLASS_LABELS}
        y_pred: ``[B, D]`` embeddings (normalized here).
        weights: ``[C, D]`` class weights (normalized here).
        margin: ``m`` in radians, in ``[0, pi/2)``. Defaults to `0.5`
            (pytorch-metric-learning's default is 28.6 degrees = 0.4992).
        scale: ``s`` in ``(0, 1e6]``. Defaults to `64.0`.

    Returns:
        {CLASS_MEAN}
    """
    return functional_margin_loss(ArcFaceLoss, y_true, y_pred, weights, margin, scale)


@fill_doc(CLASS_LABELS=CLASS_LABELS, CLASS_MEAN=CLASS_MEAN)
def subcenter_arcface_loss(y_true, y_pred, weights, margin: float = 0.5, scale: float = 64.0):
    """Sub-centre ArcFace (Deng et al. 2020): ArcFace on each class's nearest sub-centre.

    ``cos_c = max_j cos(x, w_c^j)`` over the ``k`` sub-centres of class ``c``.

    Args:
        {CLASS_LABELS}
        y_pred: ``[B, D]`` embeddings (normalized here).
        weights: ``[C, k, D]`` sub-centres (normalized here).
        margin: ``m`` in radians, in ``[0, pi/2)``. Defaults to `0.5`.
        scale: ``s`` in ``(0, 1e6]``. Defaults to `64.0`.

    Returns:
        {CLASS_MEAN}
    """
    return functional_margin_loss(SubCenterArcFaceLoss, y_true, y_pred, weights, margin, scale,
                                  rank=3)


@fill_doc(CLASS_LABELS=CLASS_LABELS, CLASS_MEAN=CLASS_MEAN)
def soft_triple_loss(y_true, y_pred, centers, la: float = 20.0, gamma: float = 0.1,
                     margin: float = 0.01):
    """SoftTriple loss (Qian et al. 2019): softmax over ``k`` centres per class.

    ``S_c = sum_j softmax_j(cos(x, w_c^j) / gamma) cos(x, w_c^j)``, then the
    cross-entropy of ``la (S_c - margin [c = y])``. The paper's regularizer
    that merges similar centres (its ``tau``) is not included, as in
    pytorch-metric-learning.

    Args:
        {CLASS_LABELS}
        y_pred: ``[B, D]`` embeddings (normalized here).
        centers: ``[C, k, D]`` centres (normalized here).
        la: ``lambda`` in ``(0, 1e6]``, the scale. Defaults to `20.0`.
        gamma: ``gamma >= 1e-6``, the softmax temperature over a class's centres.
            Defaults to `0.1`.
        margin: ``delta`` in ``[0, 2]``. Defaults to `0.01`.

    Returns:
        {CLASS_MEAN}
    """
    return functional_class_loss(_soft_triple, y_true, y_pred, centers, rank=3,
                                 vectors_name="centers", la=check_scale("la", la),
                                 gamma=_check_divisor("gamma", gamma),
                                 margin=_check_cosine_margin(margin))


# -- classes ---------------------------------------------------------------------------------


@keras.saving.register_keras_serializable(package="tfdml")
@fill_doc(STATE=STATE_DOC, CLASS_VECTOR_ARGS=CLASS_VECTOR_ARGS)
class NormalizedSoftmaxLoss(ClassVectorLoss):
    """Normalized softmax loss: cross-entropy of cosines over a temperature.

    ``L = -log softmax_y(cos(x, w_c) / T)``, the mean over the batch.

    {STATE}

    Args:
        {CLASS_VECTOR_ARGS}
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

    def __init__(self, num_classes, embedding_dim=None, initializer=None,
                 temperature: float = 0.05, *, average="anchors",
                 reduction="sum_over_batch_size", name="normalized_softmax_loss", dtype=None):
        super().__init__(num_classes, embedding_dim, initializer,
                         temperature=_check_divisor("temperature", temperature),
                         average=average, reduction=reduction, name=name, dtype=dtype)

    def terms(self, inputs):
        return sample_terms(inputs, _normalized_softmax(inputs, self.temperature))


@keras.saving.register_keras_serializable(package="tfdml")
@fill_doc(STATE=STATE_DOC, CLASS_VECTOR_ARGS=CLASS_VECTOR_ARGS)
class CosFaceLoss(MarginSoftmaxLoss):
    """CosFace (large margin cosine) loss: the target logit is ``s (cos_y - m)``.

    ``L = -log softmax_y(s [cos_c - m [c = y]])``, the mean over the batch.

    {STATE}

    Args:
        {CLASS_VECTOR_ARGS}
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
    check_margin = staticmethod(_check_cosine_margin)

    def __init__(self, num_classes, embedding_dim=None, initializer=None, margin: float = 0.35,
                 scale: float = 64.0, *, average="anchors", reduction="sum_over_batch_size",
                 name="cosface_loss", dtype=None):
        super().__init__(num_classes, embedding_dim, initializer, margin, scale, average=average,
                         reduction=reduction, name=name, dtype=dtype)


@keras.saving.register_keras_serializable(package="tfdml")
@fill_doc(STATE=STATE_DOC, CLASS_VECTOR_ARGS=CLASS_VECTOR_ARGS)
class ArcFaceLoss(MarginSoftmaxLoss):
    """ArcFace (additive angular margin) loss: the target logit is ``s cos(theta_y + m)``.

    ``theta_y = arccos(cos_y)``; past ``theta_y > pi - m`` the target logit is
    ``s (cos_y - m sin m)`` so that it keeps decreasing (Deng et al.'s code,
    pytorch-metric-learning). The mean over the batch. The margin is in
    radians (pytorch-metric-learning takes degrees: its default 28.6 is
    0.4992 rad).

    {STATE}

    Args:
        {CLASS_VECTOR_ARGS}
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
    check_margin = staticmethod(_check_arc_margin)

    def __init__(self, num_classes, embedding_dim=None, initializer=None, margin: float = 0.5,
                 scale: float = 64.0, *, average="anchors", reduction="sum_over_batch_size",
                 name="arcface_loss", dtype=None):
        super().__init__(num_classes, embedding_dim, initializer, margin, scale, average=average,
                         reduction=reduction, name=name, dtype=dtype)


@keras.saving.register_keras_serializable(package="tfdml")
@fill_doc(STATE=STATE_DOC, CLASS_VECTOR_ARGS=CLASS_VECTOR_ARGS)
class SubCenterArcFaceLoss(ArcFaceLoss):
    """Sub-centre ArcFace: ``k`` sub-centres per class, ArcFace on the nearest one.

    ``cos_c = max_j cos(x, w_c^j)``; then as :class:`ArcFaceLoss`. Samples of
    a class gather around a dominant sub-centre, and noisy ones around the
    others.

    {STATE}

    Args:
        {CLASS_VECTOR_ARGS}
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

    vector_name = "centers"

    def __init__(self, num_classes, embedding_dim=None, initializer=None, sub_centers: int = 3,
                 margin: float = 0.5, scale: float = 64.0, *, average="anchors",
                 reduction="sum_over_batch_size", name="subcenter_arcface_loss", dtype=None):
        # ArcFaceLoss's arguments and the sub-centres, which ArcFaceLoss.__init__ does not take.
        MarginSoftmaxLoss.__init__(
            self, num_classes, embedding_dim, initializer, margin, scale,
            sub_centers=check_int("sub_centers", sub_centers), average=average,
            reduction=reduction, name=name, dtype=dtype)

    @property
    def vectors_per_class(self):
        return self.sub_centers


@keras.saving.register_keras_serializable(package="tfdml")
@fill_doc(STATE=STATE_DOC, CLASS_VECTOR_ARGS=CLASS_VECTOR_ARGS)
class SoftTripleLoss(ClassVectorLoss):
    """SoftTriple loss: a softmax loss with ``k`` centres per class.

    ``S_c = sum_j softmax_j(cos(x, w_c^j) / gamma) cos(x, w_c^j)`` and
    ``L = -log softmax_y(la (S_c - delta [c = y]))``, the mean over the
    batch. The paper's regularizer that merges centres (``tau``) is not
    included, as in pytorch-metric-learning.

    {STATE}

    Args:
        {CLASS_VECTOR_ARGS}
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

    vector_name = "centers"

    def __init__(self, num_classes, embedding_dim=None, initializer=None,
                 centers_per_class: int = 10, la: float = 20.0, gamma: float = 0.1,
                 margin: float = 0.01, *, average="anchors", reduction="sum_over_batch_size",
                 name="soft_triple_loss", dtype=None):
        super().__init__(num_classes, embedding_dim, initializer, la=check_scale("la", la),
                         gamma=_check_divisor("gamma", gamma),
                         margin=_check_cosine_margin(margin),
                         centers_per_class=check_int("centers_per_class", centers_per_class),
                         average=average, reduction=reduction, name=name, dtype=dtype)

    @property
    def vectors_per_class(self):
        return self.centers_per_class

    def terms(self, inputs):
        return sample_terms(inputs, _soft_triple(inputs, self.la, self.gamma, self.margin))


@keras.saving.register_keras_serializable(package="tfdml")
@fill_doc(STATE=STATE_DOC, CLASS_VECTOR_ARGS=CLASS_VECTOR_ARGS)
class P2SGradLoss(ClassVectorLoss):
    """P2SGrad: the cosines to the class weights regressed onto the one-hot target.

    ``L = 1/2 sum_c (cos(x, w_c) - [c = y])^2``, the mean over the batch. Zhang
    et al. define P2SGrad by its update (eq. 11), ``sum_c (cos_c - [c = y])
    grad cos_c``, free of the scale and margin hyperparameters of the
    margin-softmax losses; this loss has exactly that gradient.
    pytorch-metric-learning takes the mean squared error over the batch and
    the classes instead, ``2 / C`` times this loss (and its gradients).

    {STATE}

    Args:
        {CLASS_VECTOR_ARGS}
        name: name of the loss. Defaults to `"p2s_grad_loss"`.

    Examples:

    >>> loss = tfdml.losses.P2SGradLoss(num_classes=10_000)
    >>> model = tfdml.models.MetricModel(embedder, loss)
    >>> model.compile(optimizer="sgd")

    Reference:
        Zhang, Zhao, Qiao, Wang, Li, Liu, "P2SGrad: Refined gradients for
        optimizing deep face models", CVPR 2019.
    """

    def __init__(self, num_classes, embedding_dim=None, initializer=None, *, average="anchors",
                 reduction="sum_over_batch_size", name="p2s_grad_loss", dtype=None):
        super().__init__(num_classes, embedding_dim, initializer, average=average,
                         reduction=reduction, name=name, dtype=dtype)

    def terms(self, inputs):
        return sample_terms(inputs, _p2s_grad(inputs))
