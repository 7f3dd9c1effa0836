"""Layers of the embedding head: generalized-mean (GeM) pooling and L2 normalization."""

from __future__ import annotations

import keras
from keras import ops

from tfdml import ops as dml
from tfdml._argument_checks import check_number
from tfdml._embeddings import compute_dtype

__all__ = ["GeneralizedMeanPooling2D", "L2Normalization"]


def _check_data_format(data_format):
    if data_format is None:
        return keras.config.image_data_format()
    if data_format not in ("channels_last", "channels_first"):
        raise ValueError(
            "`data_format` must be 'channels_last', 'channels_first' or None. "
            f"Received: data_format={data_format!r}"
        )
    return data_format


@keras.saving.register_keras_serializable(package="tfdml")
class GeneralizedMeanPooling2D(keras.layers.Layer):
    """Generalized-mean (GeM) global pooling over the spatial axes of a 4D tensor.

    For each channel, with ``x`` the ``N = H * W`` spatial values:

    ``GeM(x) = (1/N * sum_i max(x_i, eps)^p)^(1/p)``

    ``p = 1`` is average pooling (of the values clamped at ``eps``), and as
    ``p`` grows the result approaches max pooling. ``p`` is a scalar weight of
    the layer: learned with the rest of the network when ``learnable=True``,
    fixed otherwise. It is clipped to ``p >= 1`` in the forward pass.

    The mean is computed as ``m * (1/N * sum_i (x_i / m)^p)^(1/p)`` with ``m``
    the per-channel maximum, which is the same number but never overflows,
    even for ``p`` in the hundreds. Computed in float32 (float64 for float64
    inputs) and returned in the layer's compute dtype.

    Args:
        p: the initial (or fixed) exponent, a number ``>= 1``. Defaults to `3.0`.
        learnable: whether ``p`` is trained. Defaults to `True`.
        epsilon: values below it are clamped to it (keeps ``x^p`` defined for
            negative inputs and the gradient finite at 0), ``> 0``. Defaults
            to `1e-6`.
        keepdims: keep the spatial axes as size-1 axes. Defaults to `False`.
        data_format: ``"channels_last"`` or ``"channels_first"``. Defaults to
            `None` (``keras.config.image_data_format()``).
        **kwargs: base layer arguments (``name``, ``dtype``, ...).

    Examples:

    >>> pool = tfdml.layers.GeneralizedMeanPooling2D(p=3.0)
    >>> pool(np.ones((2, 7, 7, 512), "float32")).shape
    (2, 512)

    Reference:
        Radenović, Tolias, Chum, "Fine-tuning CNN image retrieval with no human
        annotation", TPAMI 2018.
    """

    def __init__(
        self,
        p: float = 3.0,
        learnable: bool = True,
        epsilon: float = 1e-6,
        keepdims: bool = False,
        data_format=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_number("p", p, low=1)
        check_number("epsilon", epsilon, low=0, low_open=True)
        if not isinstance(learnable, bool):
            raise ValueError(
                f"`learnable` must be True or False. Received: learnable={learnable!r}"
            )
        self.initial_p = float(p)
        self.learnable = learnable
        self.epsilon = float(epsilon)
        self.keepdims = bool(keepdims)
        self.data_format = _check_data_format(data_format)
        self.input_spec = keras.layers.InputSpec(ndim=4)

    def build(self, input_shape):
        self.p = self.add_weight(
            name="p",
            shape=(),
            initializer=keras.initializers.Constant(self.initial_p),
            trainable=self.learnable,
            dtype="float64" if self.compute_dtype == "float64" else "float32",
        )

    def _axes(self):
        return (1, 2) if self.data_format == "channels_last" else (2, 3)

    def call(self, inputs):
        work = compute_dtype(inputs.dtype)
        x = dml.maximum(ops.cast(inputs, work), ops.cast(self.epsilon, work))
        axes = self._axes()
        p = dml.maximum(ops.cast(self.p, work), ops.cast(1.0, work))
        # d/dm of m * mean((x/m)^p)^(1/p) is exactly 0: stopping its gradient is exact.
        m = ops.stop_gradient(ops.max(x, axis=axes, keepdims=True))
        mean = ops.mean(ops.power(x / m, p), axis=axes, keepdims=True)
        out = m * ops.power(mean, 1.0 / p)
        if not self.keepdims:
            out = ops.squeeze(out, axis=axes)
        return ops.cast(out, self.compute_dtype)

    def compute_output_shape(self, input_shape):
        shape = list(input_shape)
        axes = self._axes()
        if self.keepdims:
            for a in axes:
                shape[a] = 1
            return tuple(shape)
        return tuple(d for i, d in enumerate(shape) if i not in axes)

    def get_config(self):
        config = super().get_config()
        config.update(
            p=self.initial_p,
            learnable=self.learnable,
            epsilon=self.epsilon,
            keepdims=self.keepdims,
            data_format=self.data_format,
        )
        return config


@keras.saving.register_keras_serializable(package="tfdml")
class L2Normalization(keras.layers.Layer):
    """Scales each vector along ``axis`` to unit L2 norm; zero vectors stay zero.

    ``y = x / sqrt(max(sum(x^2), epsilon))``, as ``tf.math.l2_normalize``:
    a vector of norm below ``sqrt(epsilon)`` (1e-6 by default) is scaled by
    ``1 / sqrt(epsilon)`` instead of to unit norm. The norm is that of
    :func:`tfdml.ops.l2_normalize`: each vector is divided by its largest
    absolute entry before squaring, so no finite vector overflows (a float32
    vector of norm 1e20, whose ``sum(x^2)`` is Inf, still gets unit norm) or
    underflows. The gradient is finite everywhere, at the zero vector
    included. It computes in float32 (float64 for float64 inputs); the result
    has the layer's compute dtype.

    Args:
        axis: the axis (or tuple of axes) to normalize. Defaults to `-1`.
        epsilon: lower bound of the squared norm, ``> 0``. Defaults to `1e-12`.
        **kwargs: base layer arguments (``name``, ``dtype``, ...).

    Examples:

    >>> layer = tfdml.layers.L2Normalization()
    >>> layer(np.array([[3.0, 4.0], [0.0, 0.0]], "float32"))
    array([[0.6, 0.8], [0. , 0. ]], dtype=float32)
    """

    def __init__(self, axis=-1, epsilon: float = 1e-12, **kwargs):
        super().__init__(**kwargs)
        if isinstance(axis, list | tuple):
            if not axis or not all(isinstance(a, int) and not isinstance(a, bool) for a in axis):
                raise ValueError(
                    f"`axis` must be an int or a tuple of ints. Received: axis={axis!r}"
                )
            axis = tuple(axis)
        elif not isinstance(axis, int) or isinstance(axis, bool):
            raise ValueError(f"`axis` must be an int or a tuple of ints. Received: axis={axis!r}")
        check_number("epsilon", epsilon, low=0, low_open=True)
        self.axis = axis
        self.epsilon = float(epsilon)
        self.supports_masking = True

    def call(self, inputs):
        work = compute_dtype(inputs.dtype)
        out = dml.l2_normalize(ops.cast(inputs, work), axis=self.axis, epsilon=self.epsilon)
        return ops.cast(out, self.compute_dtype)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        axis = list(self.axis) if isinstance(self.axis, tuple) else self.axis
        config.update(axis=axis, epsilon=self.epsilon)
        return config
