"""A training-time metric: the share of anchors a tfdml loss learns from."""

from __future__ import annotations

import warnings

import keras
from keras import ops

from tfdml import ops as dml

# -- training-time metric ---------------------------------------------------------------------


@keras.saving.register_keras_serializable(package="tfdml")
class ActiveAnchors(keras.metrics.Mean):
    """Fraction of anchors that have something to learn from under a tfdml loss.

    An anchor is *active* when the loss's miner finds it a triplet or pair (a
    positive and a negative in the batch, for most losses). A batch with no
    active anchor gives a loss of 0 and zero gradients, so training on such
    batches (e.g. shuffled batches over many classes with no two samples of
    a class) learns nothing without any error. Added to ``compile``, this
    metric puts the fraction into the ``fit`` logs (``active_anchors``,
    averaged over the anchors of the epoch so far), where the progress bar,
    ``History`` and ``tfdml.callbacks.ActiveAnchorsWarning`` see it.

    It mines once more with a copy of the loss (same configuration, its own
    random state, so the loss's random draws are not disturbed): about the
    cost of the loss's mining per step. For a
    :class:`tfdml.losses.CrossBatchMemory` it counts the anchors that the
    wrapped loss finds active within the batch. The proxy and classification
    losses have no mining (every sample is active) and are refused.

    Args:
        loss: the tfdml loss being trained (a :class:`tfdml.losses.MetricLoss`).
        name: the log name. Defaults to `"active_anchors"`.
        dtype: dtype of the result. Defaults to `None` (float32).

    Examples:

    >>> loss = tfdml.losses.TripletNCALoss()
    >>> model.compile(optimizer="adam", loss=loss,
    ...               metrics=[tfdml.metrics.ActiveAnchors(loss)])
    >>> model.fit(ds, epochs=3, callbacks=[tfdml.callbacks.ActiveAnchorsWarning()])
    """

    def __init__(self, loss, name="active_anchors", dtype=None):
        super().__init__(name=name, dtype=dtype)
        from tfdml.losses.base import resolve_loss
        from tfdml.losses.class_vectors import ClassVectorLoss
        from tfdml.losses.xbm import CrossBatchMemory

        loss = resolve_loss(loss)
        if isinstance(loss, CrossBatchMemory):
            loss = loss.loss
        if isinstance(loss, ClassVectorLoss):
            raise ValueError(
                f"ActiveAnchors: {type(loss).__name__} compares every sample with the class "
                "vectors, so every anchor is active; there is nothing to measure.")
        self._loss_config = keras.saving.serialize_keras_object(loss)
        self._probe = keras.saving.deserialize_keras_object(self._loss_config)

    def update_state(self, y_true, y_pred, sample_weight=None):
        with warnings.catch_warnings():  # the copy's own warnings (e.g. an unowned beta)
            warnings.simplefilter("ignore")
            terms = self._probe.per_anchor(dml.cast_labels(y_true, "y_true"), y_pred)
        return super().update_state(ops.cast(terms.active, self.dtype), sample_weight)

    def get_config(self):
        return {"loss": self._loss_config, "name": self.name, "dtype": self.dtype}
