"""An optimizer that trains each variable at its own learning rate: :class:`LearningRateMultipliers`.

Keras optimizers take one learning rate. Scaling a variable's gradient scales its learning
rate for plain SGD, but not for Adam-type optimizers, which divide the gradient by its own
running magnitude: ``g`` and ``0.1 g`` give AdamW the same step. What layer-wise
learning-rate decay needs (:func:`tfdml.models.layerwise_lr_decay`) is each variable's
*update* scaled, weight decay included, and that is what the wrapper does: it lets the
wrapped optimizer take its step, then moves each variable by ``multiplier`` times that
step instead.
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Mapping

import keras
from keras import ops

__all__ = ["LearningRateMultipliers"]


class _Scaled:
    """The multipliers of the variables the optimizer was built with, by ``id``: held in a
    plain object, so that Keras does not take the model's variables for the optimizer's
    own."""

    def __init__(self, variables=(), values=()):
        self.pairs = [(v, m) for v, m in zip(variables, values, strict=True) if m != 1.0]
        self.by_id = {id(v): m for v, m in zip(variables, values, strict=True)}


def _check_multipliers(multipliers):
    if not isinstance(multipliers, Mapping):
        raise ValueError(
            "`multipliers` must be a dict {variable.path: multiplier}, e.g. from "
            f"tfdml.models.layerwise_lr_decay. Received: multipliers={multipliers!r}"
        )
    checked = {}
    for path, value in multipliers.items():
        ok = (isinstance(value, numbers.Real) and not isinstance(value, bool)
              and math.isfinite(value) and value >= 0)
        if not isinstance(path, str) or not ok:
            raise ValueError(
                "`multipliers` must map variable paths (str) to finite numbers >= 0. "
                f"Received: {path!r}: {value!r}"
            )
        checked[path] = float(value)
    return checked


@keras.saving.register_keras_serializable(package="tfdml")
class LearningRateMultipliers(keras.optimizers.Optimizer):
    """Wraps an optimizer so that each variable's update is scaled by its own multiplier.

    Each step, the wrapped optimizer updates every variable as usual (learning-rate
    schedule, weight decay, gradient clipping, gradient accumulation and its own state
    all included), then each variable ``v`` with multiplier ``m != 1`` is set to
    ``v_before + m * (v_after - v_before)``. For the optimizers whose step is
    proportional to the learning rate (SGD with or without momentum, Adam, AdamW,
    Nadam, Adamax, RMSprop, Adagrad, Lion, ...), that is exactly training ``v`` at
    ``m`` times the learning rate, its weight decay included (AdamW's decoupled decay
    is ``lr * weight_decay * v``, scaled as well), as per-parameter-group learning
    rates do in PyTorch. Scaling the gradients instead would do that for SGD only:
    Adam-type optimizers normalize the gradient's magnitude away.

    Variables without a multiplier train at ``1``; ``0`` freezes a variable (the
    wrapped optimizer still keeps its state). Multipliers are matched to the variables
    by path once, when the optimizer is built, and kept in the order of its variables
    (``ordered_multipliers``, saved in its config): a model loaded from a ``.keras``
    file, whose nested variables may have other paths, gets them back in that order,
    as Keras restores the optimizer's state. :meth:`multiplier` says which one a
    variable got. The step costs one copy of the variables whose multiplier is not
    ``1``.

    Everything else is the wrapped optimizer's: ``learning_rate`` (read and set,
    schedules included), ``iterations``, loss scaling; call
    ``exclude_from_weight_decay`` on it. The wrapper saves with the model (``.keras``,
    its config holds the wrapped optimizer's and the multipliers) and runs under the
    TensorFlow, JAX and PyTorch backends. The wrapped optimizer's ``use_ema`` is not
    supported (its averages would miss the scaling).

    Args:
        optimizer: the ``keras.optimizers.Optimizer`` instance to wrap, e.g.
            ``keras.optimizers.AdamW(5e-4, weight_decay=0.05)``.
        multipliers: ``{variable.path: multiplier}``, numbers ``>= 0``, e.g. from
            :func:`tfdml.models.layerwise_lr_decay`.
        name: the optimizer's name. Defaults to `None` (``"learning_rate_multipliers"``).
        ordered_multipliers: one multiplier per variable, in the order of the variables
            the optimizer is built with; set by ``build`` and restored from the config
            (used instead of the paths when the number of variables agrees). Defaults to
            `None`.

    Raises:
        ValueError: ``optimizer`` is not a Keras optimizer or averages weights
            (``use_ema``), or a multiplier is not a finite number ``>= 0``.

    Examples:

    >>> model = tfdml.models.build_embedding_model(backbone, embedding_dim=128)
    >>> optimizer = tfdml.models.LearningRateMultipliers(
    ...     keras.optimizers.AdamW(1e-4, weight_decay=0.05),
    ...     tfdml.models.layerwise_lr_decay(model, 0.65))
    >>> model.compile(optimizer=optimizer, loss=tfdml.losses.MultiSimilarityLoss())
    """

    def __init__(self, optimizer, multipliers, name=None, ordered_multipliers=None):
        super().__init__(learning_rate=0.0, name=name or "learning_rate_multipliers")
        if not isinstance(optimizer, keras.optimizers.Optimizer):
            raise ValueError(
                "`optimizer` must be a keras.optimizers.Optimizer instance, e.g. "
                f"keras.optimizers.AdamW(1e-4). Received: optimizer={optimizer!r}"
            )
        if optimizer.use_ema:
            raise ValueError(
                "LearningRateMultipliers does not support an optimizer with use_ema=True: "
                "its moving averages would be those of the unscaled updates."
            )
        self.inner_optimizer = optimizer
        self.multipliers = _check_multipliers(multipliers)
        self.ordered_multipliers = None if ordered_multipliers is None else list(
            _check_multipliers({str(i): m for i, m in enumerate(ordered_multipliers)}).values())
        self.scaled = _Scaled()

    def build(self, var_list):
        """Builds the wrapped optimizer and takes each variable's multiplier: by its path,
        or, for an optimizer restored from a file, in the order of the saved variables."""
        super().build(var_list)
        self.inner_optimizer.build(var_list)
        ordered = self.ordered_multipliers
        if ordered is not None and len(ordered) != len(var_list):
            warnings.warn(
                f"LearningRateMultipliers {self.name!r} was saved with {len(ordered)} variables "
                f"and is built with {len(var_list)}: its multipliers are matched to the "
                "variables by path (those of a model loaded from a file may differ).",
                stacklevel=2,
            )
            ordered = None
        if ordered is None:
            ordered = [self.multipliers.get(v.path, 1.0) for v in var_list]
        self.ordered_multipliers = list(ordered)
        self.scaled = _Scaled(var_list, ordered)

    def multiplier(self, variable) -> float:
        """The multiplier of ``variable``: the one taken at build time, or (before the
        optimizer is built) the one of its path."""
        if self.built:
            return self.scaled.by_id.get(id(variable), 1.0)
        return self.multipliers.get(variable.path, 1.0)

    @property
    def variables(self):
        return super().variables + self.inner_optimizer.variables

    def apply(self, grads, trainable_variables=None):
        """Applies the wrapped optimizer's step, then scales each variable's update.

        Args:
            grads: the gradients, one per variable.
            trainable_variables: the variables; `None` for those the optimizer was built
                with (as ``stateless_apply`` calls it).
        """
        pairs = self.scaled.pairs
        if trainable_variables is not None:
            trainable_variables = list(trainable_variables)
            if not self.built:
                self.build(trainable_variables)
            pairs = [(v, self.multiplier(v)) for v in trainable_variables
                     if self.multiplier(v) != 1.0]
        before = [ops.copy(v) for v, _ in pairs]
        self.inner_optimizer.apply(grads, trainable_variables)
        for (v, m), old in zip(pairs, before, strict=True):
            v.assign(ops.add(old, ops.multiply(ops.subtract(v, old), m)))

    @property
    def iterations(self):
        return self.inner_optimizer.iterations

    @property
    def learning_rate(self):
        return self.inner_optimizer.learning_rate

    @learning_rate.setter
    def learning_rate(self, learning_rate):
        if "inner_optimizer" in vars(self):
            self.inner_optimizer.learning_rate = learning_rate

    def scale_loss(self, loss):
        return self.inner_optimizer.scale_loss(loss)

    def finalize_variable_values(self, var_list):
        self.inner_optimizer.finalize_variable_values(var_list)

    def get_config(self):
        return {
            "name": self.name,
            "optimizer": keras.optimizers.serialize(self.inner_optimizer),
            "multipliers": dict(self.multipliers),
            "ordered_multipliers": (None if self.ordered_multipliers is None
                                    else list(self.ordered_multipliers)),
        }

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        config["optimizer"] = keras.optimizers.deserialize(
            config["optimizer"], custom_objects=custom_objects
        )
        return cls(**config)
