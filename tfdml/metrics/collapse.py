"""Training-time collapse monitors as Keras metrics: :class:`OutputStd` and :class:`PCF`.

Both read the model's output (``y_pred``, ``[B, D]`` embeddings) and ignore the labels, so
they fit self-supervised training as well as supervised: added to ``model.compile(metrics=
[...])`` they put a collapse indicator into the ``fit`` logs at every step. Both are
written with ``keras.ops`` only and run under TensorFlow, JAX and PyTorch, inside compiled
train steps.

:class:`OutputStd` is defined in :mod:`tfdml.models.monitors` (``tfdml.models.
ContrastiveModel``, a layer below the metrics, reports it) and public as
``tfdml.metrics.OutputStd``: one class, one registered Keras name (``tfdml>OutputStd``).
"""

from __future__ import annotations

import numbers

import keras
import numpy as np
from keras import ops

__all__ = ["PCF"]


def _rows(y_pred, name):
    """``y_pred`` as float32 ``[B, D]``; a ValueError naming the metric for another rank."""
    x = ops.convert_to_tensor(y_pred)
    if len(x.shape) != 2:
        raise ValueError(f"{name} needs embeddings of shape [B, D] as `y_pred`. "
                         f"Received: y_pred.shape={tuple(x.shape)}")
    return ops.cast(x, "float32")


def check_share(explained_variance):
    """``explained_variance`` as a float in (0, 1]; a ValueError naming it otherwise."""
    value = explained_variance
    if (not isinstance(value, numbers.Real) or isinstance(value, bool)
            or not 0.0 < float(value) <= 1.0):
        raise ValueError("`explained_variance` must be a number in (0, 1]. "
                         f"Received: explained_variance={explained_variance!r}")
    return float(value)


@keras.saving.register_keras_serializable(package="tfdml")
class PCF(keras.metrics.Metric):
    """Principal-components fraction of the embeddings seen: a dimensional-collapse monitor.

    The Keras-metric form of :func:`tfdml.metrics.pcf`. With ``lambda_1 >= ... >=
    lambda_D`` the eigenvalues of the covariance (divided by ``N``) of all the
    rows of ``y_pred`` seen since the last reset (the epoch, under ``fit``),
    ``PCF(r) = n / D`` with ``n`` the smallest number of principal components
    whose explained variance ``(lambda_1 + ... + lambda_n) / (lambda_1 + ... +
    lambda_D)`` reaches ``r``. A value that falls during training means the
    embeddings crowd into a subspace of few dimensions (a dimensional collapse),
    even while their spread (:class:`OutputStd`) looks healthy.

    **What it keeps.** The row count, the ``[D]`` sum of the rows and the
    ``[D, D]`` sum of their outer products, in float32 (``D * D`` floats: 1 MiB
    for ``D = 512``), all taken about the first row seen (a shift: float32 sums
    of raw rows would lose the small variance of a nearly collapsed model to
    cancellation, and identical rows give exactly zero). ``result()`` forms the
    covariance, its eigenvalues (``keras.ops.eigh``, float32) and the count ``n``;
    eigenvalues below ``D * eps * lambda_1`` (float32 ``eps``) count as 0. The
    result is that of :func:`tfdml.metrics.pcf` on all the rows seen (which works
    in float64), except when a share falls within float32 rounding of ``r``.
    The count is exact up to 2**24 rows per reset. Under a ``tf.distribute``
    strategy with several replicas the replicas' sums are taken about different
    first rows and cannot be added: compute :func:`tfdml.metrics.pcf` on
    predictions there.

    Fewer than 2 rows, rows without any variance (all equal) and a NaN or an Inf
    in ``y_pred`` give ``nan``, not a score. ``y_true`` and ``sample_weight`` are
    ignored.

    Args:
        explained_variance: the share ``r`` in (0, 1]. Defaults to `0.5`.
        name: the log name. Defaults to `"pcf"`.
        dtype: dtype of the result. Defaults to `None` (float32).

    Raises:
        ValueError: ``explained_variance`` outside (0, 1]; ``y_pred`` not of rank
            2 or without a known dimension ``D``.

    Examples:

    >>> model.compile(optimizer="adam", loss=loss,
    ...               metrics=[tfdml.metrics.PCF(0.5), tfdml.metrics.OutputStd()])
    >>> metric = tfdml.metrics.PCF(0.5)
    >>> x = np.random.default_rng(0).normal(size=(1000, 8)) * [10, 10, 1, 1, 1, 1, 1, 1]
    >>> metric.update_state(None, x[:500]); metric.update_state(None, x[500:])
    >>> float(metric.result())  # tfdml.metrics.pcf(x, 0.5)
    0.125

    Reference:
        open-metric-learning, ``oml.functional.metrics.calc_pcf`` (the ``pcf``
        of its embedding metrics).
    """

    def __init__(self, explained_variance=0.5, name="pcf", dtype=None):
        share = check_share(explained_variance)
        super().__init__(name=name, dtype=dtype)
        self.explained_variance = share
        self._dim = None

    def _build(self, dim):
        """The variables, once ``D`` is known (at the first update, as ``keras.metrics.AUC``)."""
        if dim is None:
            raise ValueError("PCF needs `y_pred` of a known embedding size D (its last "
                             "dimension). Received: y_pred with an unknown last dimension")
        self._dim = int(dim)
        self.count = self.add_variable(shape=(), initializer="zeros", dtype="float32",
                                       name="count")
        self.shift = self.add_variable(shape=(self._dim,), initializer="zeros",
                                       dtype="float32", name="shift")
        self.row_sum = self.add_variable(shape=(self._dim,), initializer="zeros",
                                         dtype="float32", name="row_sum")
        self.outer_sum = self.add_variable(shape=(self._dim, self._dim), initializer="zeros",
                                           dtype="float32", name="outer_sum")

    def update_state(self, y_true, y_pred, sample_weight=None):
        del y_true, sample_weight  # the rows' covariance: labels and weights play no part
        x = _rows(y_pred, type(self).__name__)
        if self._dim is None:
            self._build(x.shape[-1])
        elif x.shape[-1] is not None and int(x.shape[-1]) != self._dim:
            raise ValueError(f"PCF has seen embeddings of size {self._dim}. "
                             f"Received: y_pred.shape={tuple(x.shape)}")
        first = ops.sum(x[:1], axis=0)  # the first row (zeros for an empty batch)
        shift = ops.where(self.count.value > 0, self.shift.value, first)
        self.shift.assign(shift)
        centred = x - shift
        self.row_sum.assign_add(ops.sum(centred, axis=0))
        self.outer_sum.assign_add(ops.matmul(ops.transpose(centred), centred))
        self.count.assign_add(ops.cast(ops.shape(x)[0], "float32"))

    def result(self):
        if self._dim is None:
            return ops.convert_to_tensor(float("nan"), dtype=self.dtype)
        dim, n = self._dim, self.count.value
        mean = self.row_sum.value / ops.maximum(n, 1.0)
        cov = self.outer_sum.value / ops.maximum(n, 1.0) - ops.outer(mean, mean)
        cov = (cov + ops.transpose(cov)) / 2.0
        finite = ops.all(ops.isfinite(cov))
        eig = ops.flip(ops.sort(ops.eigh(ops.where(finite, cov, 0.0))[0]), axis=0)
        top = eig[0]
        eig = ops.where(eig > dim * float(np.finfo(np.float32).eps) * top, eig, 0.0)
        cumulative = ops.cumsum(eig)
        explained = cumulative / ops.maximum(cumulative[-1], float(np.finfo(np.float32).tiny))
        below = ops.sum(ops.cast(explained < self.explained_variance, "float32"))
        value = ops.minimum(below + 1.0, float(dim)) / dim
        valid = finite & (n >= 2) & (top > 0)
        return ops.cast(ops.where(valid, value, float("nan")), self.dtype)

    def reset_state(self):
        for variable in self.variables:
            variable.assign(ops.zeros(variable.shape, variable.dtype))

    def get_config(self):
        return {"explained_variance": self.explained_variance, "name": self.name,
                "dtype": self.dtype}
