"""Instance loss (Zheng et al.): a softmax over the batch's scaled cosine similarities, each
anchor classified as its own instance (or as any sample of its class)."""

from __future__ import annotations

import keras
from keras import ops

from tfdml import ops as dml
from tfdml._argument_checks import check_positive
from tfdml._docs import fill_doc
from tfdml._shims import dtype_name
from tfdml.losses._docstrings import REFERENCE_ARGS, shared_args
from tfdml.losses.base import MetricLoss, functional_loss
from tfdml.losses.terms import anchor_terms

__all__ = ["InstanceLoss", "instance_loss"]


def _check_instance(gamma: float = 64.0):
    return {"gamma": check_positive("gamma", gamma)}


def _instance_terms(inputs, gamma):
    labels, x, ref_labels, ref, _ = inputs
    logits = ops.convert_to_tensor(gamma, dtype_name(x)) * dml.pairwise_similarity(x, ref)
    # The anchor's targets: every reference sample of its class (sharing a label, for label
    # sets), the anchor itself included (it is its own reference row when the reference set
    # is the batch); the others: every sample of another class (sharing none).
    targets, others_mask = dml.label_masks(labels, ref_labels, None)
    own, found = dml.masked_logsumexp(logits, targets)
    others, has_other = dml.masked_logsumexp(logits, others_mask)
    zero = ops.zeros((), dtype_name(logits))
    # -log sum_{j: y_j = y_a} softmax_j(gamma s_a.) = softplus(lse_others - lse_own): exact
    # where the loss is tiny (no cancellation), 0 without another class. An anchor without a
    # target (a reference set without its class) has no term.
    both = ops.logical_and(found, has_other)
    margin = ops.where(has_other, others, zero) - ops.where(found, own, zero)
    losses = ops.where(both, ops.softplus(ops.where(both, margin, zero)), zero)
    return anchor_terms(losses, found)


@keras.saving.register_keras_serializable(package="tfdml")
@fill_doc(SHARED_ARGS=shared_args("instance_loss"))
class InstanceLoss(MetricLoss):
    """Instance loss: each anchor classified among the batch by a softmax over ``gamma s``.

    With ``s`` the cosine similarity and ``gamma`` the scale, per anchor
    ``a``::

        L_a = -log sum_{j: y_j = y_a} softmax_j(gamma s_a.)

    over the samples ``j`` of the batch (the reference set), the anchor among
    its own targets. With every label distinct (each sample its own
    instance: the unsupervised reading of the paper, labels ``arange(B)``) it
    is the softmax cross-entropy of ``gamma s_a.`` with the anchor's own
    column as the target, the paper's instance classification with the batch's
    normalized embeddings as the class weights. Samples of the same class are
    targets together, so two views of one instance (or a class) are not
    pushed apart.

    **Averaged over** the anchors (``average="anchors"``). pytorch-metric-
    learning's ``InstanceLoss`` targets column ``rank(y_a)`` among the
    batch's sorted unique labels, which is the anchor itself only for distinct
    labels in ascending batch order (such as ``arange(B)``), where the two are
    equal; docs/losses.md.

    Args:
        gamma: the scale of the similarities, ``> 0``. Defaults to `64.0`.
        {SHARED_ARGS}

    Examples:

    >>> loss = tfdml.losses.InstanceLoss(gamma=64.0)
    >>> model.compile(optimizer="adam", loss=loss)  # y_true: one id per instance

    Reference:
        Zheng, Zheng, Garrett, Yang, Xu, Shen, "Dual-path convolutional
        image-text embeddings with instance loss", ACM TOMM 2020.
    """

    def __init__(self, gamma: float = 64.0, normalize=True, average="anchors",
                 reduction="sum_over_batch_size", name="instance_loss", dtype=None, block_size=None):
        super().__init__(normalize=normalize, average=average, reduction=reduction, name=name,
                         dtype=dtype, block_size=block_size, **_check_instance(gamma))

    def terms(self, inputs):
        return _instance_terms(inputs, **self.arguments)


@fill_doc(REFERENCE_ARGS=REFERENCE_ARGS)
def instance_loss(y_true, y_pred, gamma: float = 64.0, normalize=True, ref_embeddings=None,
                  ref_labels=None, ref_offset=None, average="anchors"):
    """Functional form of :class:`InstanceLoss`: the mean over the anchors.

    Args:
        y_true: ``[B]`` or ``[B, 1]`` integer class ids.
        y_pred: ``[B, D]`` embeddings.
        gamma, normalize, average: as in :class:`InstanceLoss`.
        {REFERENCE_ARGS}

    Returns:
        A scalar of the dtype of ``y_pred``; NaN when an embedding is NaN or Inf.
    """
    return functional_loss(InstanceLoss, _instance_terms, y_true, y_pred, ref_embeddings,
                           ref_labels, ref_offset, normalize, average, **_check_instance(gamma))
