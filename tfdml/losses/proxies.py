"""Proxy losses: Proxy-NCA and Proxy Anchor, with one learned proxy per class."""

from __future__ import annotations

import keras
from keras import ops

from tfdml import ops as dml
from tfdml._argument_checks import check_positive
from tfdml._docs import fill_doc
from tfdml._shims import dtype_name
from tfdml.losses._docstrings import CLASS_LABELS, CLASS_MEAN, CLASS_VECTOR_ARGS
from tfdml.losses.class_vectors import (
    ClassVectorLoss,
    check_scale,
    class_cosines,
    class_mask,
    functional_class_loss,
    prepare_class_inputs,
    sample_terms,
    softmax_cross_entropy,
)

__all__ = ["ProxyAnchorLoss", "ProxyNCALoss", "proxy_anchor_loss", "proxy_nca_loss"]


def _proxy_nca(inputs, scale):
    labels, x, proxies = inputs.labels, inputs.x, inputs.vectors
    cosines = class_cosines(x, proxies)
    dtype = dtype_name(cosines)
    two = ops.convert_to_tensor(2.0, dtype)
    squared = dml.maximum(two - two * cosines, ops.zeros((), dtype))  # |x - p|^2, unit vectors
    target = class_mask(labels, proxies.shape[0])
    return softmax_cross_entropy(-ops.convert_to_tensor(scale, dtype) * squared, target)


def _proxy_anchor_parts(labels, x, proxies, margin, alpha, sample_weight=None):
    """Per proxy: ``(positive_terms, negative_terms, has_positive)``, all ``[C]``."""
    cosines = class_cosines(x, proxies)  # [B, C]
    dtype = dtype_name(cosines)
    m = ops.convert_to_tensor(margin, dtype)
    a = ops.convert_to_tensor(alpha, dtype)
    positive = class_mask(labels, proxies.shape[0])
    negative = ops.logical_not(positive)
    pos_z, neg_z = -a * (cosines - m), a * (cosines + m)
    if sample_weight is not None:  # w * exp(z) = exp(z + log w); a zero weight drops the sample
        log_w = ops.log(ops.cast(sample_weight, dtype))[:, None]
        keep = (ops.cast(sample_weight, dtype) > 0)[:, None]
        positive, negative = ops.logical_and(positive, keep), ops.logical_and(negative, keep)
        pos_z, neg_z = pos_z + log_w, neg_z + log_w
    pos_terms, has_positive = dml.masked_logsumexp(pos_z, positive, axis=0, add_one=True)
    neg_terms, _ = dml.masked_logsumexp(neg_z, negative, axis=0, add_one=True)
    return pos_terms, neg_terms, has_positive


def _proxy_anchor_value(pos_terms, neg_terms, has_positive):
    dtype = dtype_name(pos_terms)
    count = ops.sum(ops.cast(has_positive, dtype))
    num_classes = ops.cast(ops.shape(neg_terms)[0], dtype)
    return dml.divide_no_nan(ops.sum(pos_terms), count) + ops.sum(neg_terms) / num_classes


@fill_doc(CLASS_LABELS=CLASS_LABELS, CLASS_MEAN=CLASS_MEAN)
def proxy_anchor_loss(y_true, y_pred, proxies, margin: float = 0.1, alpha: float = 32.0):
    """Proxy Anchor loss (Kim et al. 2020).

    With ``s(x, p)`` the cosine, ``X_p+`` the samples of proxy ``p``'s class,
    ``X_p-`` the others, ``P+`` the proxies with at least one sample in the
    batch and ``P`` all ``C`` proxies:

    ``L = 1/|P+| sum_{p in P+} log(1 + sum_{x in X_p+} exp(-alpha (s(x, p) - margin)))
        + 1/|P| sum_{p in P} log(1 + sum_{x in X_p-} exp(alpha (s(x, p) + margin)))``

    Args:
        {CLASS_LABELS}
        y_pred: ``[B, D]`` embeddings (normalized here).
        proxies: ``[C, D]`` (normalized here).
        margin: ``delta >= 0``. Defaults to `0.1`.
        alpha: ``alpha`` in ``(0, 1e6]``, the scale. Defaults to `32.0`.

    Returns:
        A scalar of the dtype of ``y_pred``; NaN when an embedding or a proxy
        is NaN or Inf.
    """
    margin = check_positive("margin", margin, allow_zero=True)
    alpha = check_scale("alpha", alpha)
    labels, x, p, valid = prepare_class_inputs(y_true, y_pred, proxies, 2, "proxies")
    value = _proxy_anchor_value(*_proxy_anchor_parts(labels, x, p, margin, alpha))
    value = dml.nan_unless(dml.nan_unless_finite(value, y_pred, p), valid)
    return ops.cast(value, dtype_name(ops.convert_to_tensor(y_pred)))


@fill_doc(CLASS_LABELS=CLASS_LABELS, CLASS_MEAN=CLASS_MEAN)
def proxy_nca_loss(y_true, y_pred, proxies, scale: float = 1.0):
    """Proxy-NCA loss (Movshovitz-Attias et al. 2017), as a softmax over all proxies.

    ``L = -log( exp(-s |x - p_y|^2) / sum_c exp(-s |x - p_c|^2) )`` with unit
    ``x`` and ``p_c``, the mean over the batch. The denominator includes the
    sample's own proxy, as in pytorch-metric-learning and ProxyNCA++ (Teh et
    al. 2020); the paper's excludes it, which lets the loss fall below zero
    without bound.

    Args:
        {CLASS_LABELS}
        y_pred: ``[B, D]`` embeddings (normalized here).
        proxies: ``[C, D]`` (normalized here).
        scale: ``s`` in ``(0, 1e6]`` (pytorch-metric-learning's ``softmax_scale``).
            Defaults to `1.0`.

    Returns:
        {CLASS_MEAN}
    """
    return functional_class_loss(_proxy_nca, y_true, y_pred, proxies, vectors_name="proxies",
                                 scale=check_scale("scale", scale))


@keras.saving.register_keras_serializable(package="tfdml")
@fill_doc(CLASS_VECTOR_ARGS=CLASS_VECTOR_ARGS)
class ProxyNCALoss(ClassVectorLoss):
    """Proxy-NCA loss: softmax over negative squared distances to one proxy per class.

    ``L = -log softmax_y(-s |x - p_c|^2)`` with unit embeddings and proxies,
    the mean over the batch. The denominator includes the sample's own proxy
    (pytorch-metric-learning, ProxyNCA++); Movshovitz-Attias et al.'s
    excludes it, which makes the loss unbounded below.

    The proxies are a variable of the loss's state (``loss.class_vectors``,
    ``[C, D]``). Train with :class:`tfdml.models.MetricModel`, which owns it.

    Args:
        {CLASS_VECTOR_ARGS}
        scale: ``s`` in ``(0, 1e6]``. Defaults to `1.0`.
        name: name of the loss. Defaults to `"proxy_nca_loss"`.

    Examples:

    >>> loss = tfdml.losses.ProxyNCALoss(num_classes=100, scale=8.0)
    >>> model = tfdml.models.MetricModel(embedder, loss)

    Reference:
        Movshovitz-Attias, Toshev, Leung, Ioffe, Singh, "No fuss distance
        metric learning using proxies", ICCV 2017.
    """

    vector_name = "proxies"

    def __init__(self, num_classes, embedding_dim=None, initializer=None, scale: float = 1.0, *,
                 average="anchors", reduction="sum_over_batch_size", name="proxy_nca_loss",
                 dtype=None):
        super().__init__(num_classes, embedding_dim, initializer,
                         scale=check_scale("scale", scale), average=average, reduction=reduction,
                         name=name, dtype=dtype)

    def terms(self, inputs):
        return sample_terms(inputs, _proxy_nca(inputs, self.scale))


@keras.saving.register_keras_serializable(package="tfdml")
class ProxyAnchorLoss(ClassVectorLoss):
    """Proxy Anchor loss: each proxy pulls its class's samples and pushes the others.

    ``L = 1/|P+| sum_{p in P+} log(1 + sum_{x in X_p+} exp(-alpha (s(x, p) - delta)))
        + 1/|P| sum_{p in P} log(1 + sum_{x in X_p-} exp(alpha (s(x, p) + delta)))``

    with cosine ``s``, ``P+`` the proxies of the classes in the batch and
    ``P`` all ``C`` proxies (the two divisors of Kim et al.'s code and of
    pytorch-metric-learning). The loss is a sum over proxies, not over
    samples: ``reduction="none"`` is not available. A sample weight ``w``
    multiplies the sample's exponentials (``w = 1`` everywhere is the
    unweighted loss; ``w = 0`` leaves the sample out).

    The proxies are a variable of the loss's state (``loss.class_vectors``,
    ``[C, D]``). Train with :class:`tfdml.models.MetricModel`, which owns it.
    Kim et al. train the proxies with a learning rate 100 times the
    network's; here their initial norm plays that role (see the
    classification losses): ``initializer=keras.initializers.RandomNormal(
    stddev=0.01 / sqrt(D))`` comes close under Adam.

    Args:
        num_classes: ``C``; class ids must be in ``[0, C)``.
        embedding_dim: ``D``. Defaults to `None` (from the model).
        margin: ``delta >= 0``. Defaults to `0.1`.
        alpha: ``alpha`` in ``(0, 1e6]``. Defaults to `32.0`.
        initializer: a Keras initializer for the proxies. Defaults to `None`:
            normal with standard deviation ``1 / sqrt(D)``.
        reduction: ``"sum_over_batch_size"``, ``"mean"``,
            ``"mean_with_sample_weight"`` or ``"sum"`` (all the same here).
            Defaults to `"sum_over_batch_size"`.
        name: name of the loss. Defaults to `"proxy_anchor_loss"`.
        dtype: dtype of the returned value. Defaults to `None` (floatx).

    Examples:

    >>> loss = tfdml.losses.ProxyAnchorLoss(num_classes=100)
    >>> model = tfdml.models.MetricModel(embedder, loss)
    >>> model.compile(optimizer="adam")
    >>> model.fit(train_ds, epochs=10)

    Reference:
        Kim, Kim, Cho, Kwak, "Proxy anchor loss for deep metric learning",
        CVPR 2020.
    """

    vector_name = "proxies"

    def __init__(self, num_classes, embedding_dim=None, initializer=None, margin: float = 0.1,
                 alpha: float = 32.0, *, reduction="sum_over_batch_size",
                 name="proxy_anchor_loss", dtype=None):
        if reduction in ("none", None):
            raise ValueError(
                "ProxyAnchorLoss is a sum over proxies, with no value per sample: "
                f"`reduction` cannot be 'none'. Received: reduction={reduction!r}"
            )
        super().__init__(num_classes, embedding_dim, initializer,
                         margin=check_positive("margin", margin, allow_zero=True),
                         alpha=check_scale("alpha", alpha), reduction=reduction, name=name,
                         dtype=dtype)

    def terms(self, inputs):
        raise ValueError(
            "ProxyAnchorLoss is a sum over proxies and has no terms per anchor: it cannot be "
            "wrapped by a loss that reweights anchors (TrimmedLoss) or take a reference set.")

    def loss_value(self, labels, y_pred, sample_weight=None, training=True):
        """The loss of a batch: a sum over the proxies, not a reduction of terms per anchor."""
        labels, x, p, valid, _, _ = self.prepare(labels, y_pred)
        if sample_weight is not None:
            sample_weight = ops.reshape(ops.cast(sample_weight, dtype_name(x)), (-1,))
            sample_weight = ops.broadcast_to(sample_weight, ops.shape(labels))
        value = _proxy_anchor_value(
            *_proxy_anchor_parts(labels, x, p, self.margin, self.alpha, sample_weight))
        return dml.nan_unless(dml.nan_unless_finite(value, y_pred, p), valid)

    def call(self, y_true, y_pred):
        raise NotImplementedError("ProxyAnchorLoss has no value per sample; call the loss.")
