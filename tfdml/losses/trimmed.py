"""Trimmed loss: train only on the anchors with the lowest current loss (Shen & Sanghavi 2019)."""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from tfdml import ops as dml
from tfdml._argument_checks import check_number
from tfdml._shims import dtype_name
from tfdml.losses.base import resolve_loss
from tfdml.losses.terms import AnchorTerms
from tfdml.losses.wrapper import LossWrapper

__all__ = ["TrimmedLoss", "trim_mask"]


def trim_mask(losses, valid, trim: float):
    """Which anchors a trimmed loss keeps: the valid ones, minus the ``floor(trim * n)`` worst.

    Args:
        losses: ``[B]`` per-anchor losses.
        valid: ``[B]`` bool, the anchors that have a loss (``n`` of them).
        trim: fraction in ``[0, 1)`` of the valid anchors to drop, those
            with the highest loss (ties: the later anchor is dropped).

    Returns:
        ``[B]`` bool. Never differentiated; at least one valid anchor is kept.
    """
    losses = ops.stop_gradient(ops.convert_to_tensor(losses))
    valid = ops.convert_to_tensor(valid)
    count = ops.sum(ops.cast(valid, "int32"))
    keep = count - _num_dropped(count, trim, losses.shape[0])
    inf = ops.convert_to_tensor(float("inf"), dtype_name(losses))
    ranked = ops.where(valid, losses, inf)
    order = dml.stable_argsort(ranked)
    # The inverse permutation of `order`: the rank of each anchor.
    rank = dml.stable_argsort(order)
    return ops.logical_and(valid, rank < keep)


def _num_dropped(count, trim: float, size):
    """``floor(trim * count + 1e-9)`` as int32, computed in float64 as before the port.

    The small tolerance makes 0.2 * 5 drop exactly one anchor. JAX has no
    float64 by default, so with a static batch size ``size`` the values for
    every possible ``count`` are tabulated in NumPy float64 instead.
    """
    if size is not None:
        table = np.floor(float(trim) * np.arange(size + 1, dtype=np.float64) + 1e-9)
        return ops.take(ops.convert_to_tensor(table.astype(np.int32)), count)
    drop = dml.floor(float(trim) * ops.cast(count, "float64") + 1e-9)
    return ops.cast(drop, "int32")


@keras.saving.register_keras_serializable(package="tfdml")
class TrimmedLoss(LossWrapper):
    """Wraps any tfdml loss and back-propagates only its lowest per-anchor losses.

    Per batch, the wrapped loss gives one value per anchor; the ``trim``
    fraction of anchors with the highest values (``floor(trim * n)`` of the
    ``n`` anchors that have a loss) is left out, and the rest are reduced as
    averaged as the wrapped loss averages (its ``average``) over the kept
    anchors' terms, so ``trim=0`` is the wrapped loss itself. This is the iterative trimmed loss of
    Shen & Sanghavi (2019), the comparison of appendix C of the class-collapse
    paper: it treats a positive from another mode of the class as a noisy
    label, but trims whole anchors rather than positives only (which is what
    easy positive sampling does), and the paper found it helps little.

    Args:
        loss: a tfdml loss (a :class:`tfdml.losses.MetricLoss`), or its
            serialized config. Its reduction is ignored.
        trim: fraction of anchors to drop, in ``[0, 1)``. Defaults to `0.2`.
        reduction: see :mod:`tfdml.losses.base`. Defaults to
            `"sum_over_batch_size"`.
        average: see :mod:`tfdml.losses.base`. Defaults to `None`, the
            wrapped loss's.
        name: name of the loss. Defaults to `"trimmed_" + loss.name`.
        dtype: dtype of the returned value. Defaults to `None` (floatx).

    Examples:

    >>> base = tfdml.losses.TripletMarginLoss(
    ...     miner=tfdml.miners.TripletMiner("random", "random"))
    >>> loss = tfdml.losses.TrimmedLoss(base, trim=0.2)
    >>> model.compile(optimizer="adam", loss=loss)

    Reference:
        Shen, Sanghavi, "Learning with bad training data via iterative
        trimmed loss minimization", ICML 2019; appendix C of "Reducing class
        collapse in metric learning with easy positive sampling".
    """

    def __init__(self, loss, trim: float = 0.2, *, average=None, reduction="sum_over_batch_size",
                 name=None, dtype=None):
        loss = resolve_loss(loss)
        super().__init__(loss=loss, trim=float(check_number("trim", trim, low=0, high=1,
                                                            high_open=True)),
                         normalize=loss.normalize,
                         average=loss.average if average is None else average,
                         reduction=reduction, name=name or f"trimmed_{loss.name}", dtype=dtype)

    def compute_terms(self, labels, embeddings, ref_embeddings=None, ref_labels=None,
                      ref_offset=None, training=True):
        """The wrapped loss's terms (its blocks, its buffers) on the anchors kept."""
        terms = self.loss.compute_terms(labels, embeddings, ref_embeddings, ref_labels, ref_offset,
                                        training=training)
        merged = terms.merged()
        keep = trim_mask(dml.divide_no_nan(merged.total, merged.count), merged.active, self.trim)
        if terms.split:  # [B, 2]: both halves of an anchor kept or dropped
            keep = ops.expand_dims(keep, -1)
        return AnchorTerms(*(ops.where(keep, t, ops.zeros_like(t)) for t in terms))
