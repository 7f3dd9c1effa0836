"""The collapse monitor that :class:`tfdml.models.ContrastiveModel` reports (exported as
``tfdml.metrics.OutputStd``)."""

from __future__ import annotations

import keras
from keras import ops

from tfdml import ops as dml

__all__ = ["OutputStd"]


@keras.saving.register_keras_serializable(package="tfdml")
class OutputStd(keras.metrics.Metric):
    """The spread of L2-normalized outputs: a collapse monitor.

    For a batch ``Y`` of ``[B, D]`` outputs, each row L2-normalized to ``u_i``::

        s(Y) = (1 / D) sum_d std_i(u_id)        (population std over the batch)

    ``result()`` is the mean of ``s`` over the batches seen, weighted by their sizes.
    Outputs spread over the sphere give about ``1 / sqrt(D)``; outputs collapsed to one
    point give 0 (SimSiam's Fig. 2 and TensorFlow Similarity's
    ``ActivationStdLoggingLayer``). ``y_true`` and ``sample_weight`` are ignored. A NaN or
    Inf output makes the result NaN. :class:`tfdml.models.ContrastiveModel` reports it for
    its projections as ``output_std``.

    Args:
        name: name of the metric. Defaults to `"output_std"`.
        dtype: dtype of the result. Defaults to `None` (float32).

    Examples:

    >>> model.compile(optimizer="adam", loss=loss, metrics=[tfdml.metrics.OutputStd()])

    Reference:
        Chen, He, "Exploring simple Siamese representation learning", CVPR 2021 (Sec. 4.1,
        the standard deviation of the l2-normalized output).
    """

    def __init__(self, name="output_std", dtype=None):
        super().__init__(name=name, dtype=dtype or "float32")
        self.total = self.add_variable(shape=(), initializer="zeros", dtype="float32",
                                       name="total")
        self.count = self.add_variable(shape=(), initializer="zeros", dtype="float32",
                                       name="count")

    def update_state(self, y_true, y_pred, sample_weight=None):
        y = ops.cast(ops.convert_to_tensor(y_pred), "float32")
        y = ops.reshape(y, (-1, ops.shape(y)[-1]))
        finite = ops.all(ops.isfinite(y))
        u = dml.l2_normalize(ops.where(finite, y, ops.zeros_like(y)))
        spread = ops.mean(ops.std(u, axis=0))
        spread = ops.where(finite, spread, float("nan"))
        rows = ops.cast(ops.shape(y)[0], "float32")
        self.total.assign(self.total + spread * rows)
        self.count.assign(self.count + rows)

    def result(self):
        return ops.cast(ops.divide_no_nan(self.total, self.count), self.dtype)

    def reset_state(self):
        self.total.assign(0.0)
        self.count.assign(0.0)
