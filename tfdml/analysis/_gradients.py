"""The gradients of one training step of a Keras model, on whichever backend Keras runs:
``tf.GradientTape``, ``jax.grad`` or ``torch.autograd``."""

from __future__ import annotations

import keras

from tfdml.models import plus_model_losses

__all__ = ["training_gradients"]


def _training_loss(model, x, y, loss):
    """``loss(y, model(x, training=True))`` plus the model's own losses."""
    pred = model(x, training=True)
    return plus_model_losses(loss(y, pred), model.losses)


def _tensorflow_gradients(model, x, y, loss, variables):
    import tensorflow as tf

    with tf.GradientTape() as tape:
        value = _training_loss(model, x, y, loss)
    return tape.gradient(value, variables)


def _jax_gradients(model, x, y, loss, variables):
    import jax

    others = model.non_trainable_variables

    def value_and_state(trainable, non_trainable):
        mapping = list(zip(variables, trainable, strict=True))
        mapping += list(zip(others, non_trainable, strict=True))
        with keras.StatelessScope(state_mapping=mapping, collect_losses=True) as scope:
            pred = model(x, training=True)
            extras = model.losses
        value = plus_model_losses(loss(y, pred), extras)
        return value, [scope.get_current_value(v) for v in others]

    grads, state = jax.grad(value_and_state, has_aux=True)(
        [v.value for v in variables], [v.value for v in others])
    for v, new in zip(others, state, strict=True):
        if new is not None:
            v.assign(new)
    return grads


def _torch_gradients(model, x, y, loss, variables):
    import torch

    value = _training_loss(model, x, y, loss)
    params = [v.value for v in variables]
    if not value.requires_grad:
        return [None] * len(params)
    return list(torch.autograd.grad(value, params, allow_unused=True))


_BY_BACKEND = {"tensorflow": _tensorflow_gradients, "jax": _jax_gradients,
               "torch": _torch_gradients}


def training_gradients(model, x, y, loss):
    """Gradients of the training loss w.r.t. ``model.trainable_variables``.

    The training loss is ``loss(y, model(x, training=True))`` plus the model's own
    losses. The forward pass updates the model's non-trainable state (batch-norm
    statistics, random seeds) as ``model(x, training=True)`` does; under JAX it runs
    in a ``keras.StatelessScope`` and the updates are assigned afterwards.

    Args:
        model: a ``keras.Model``.
        x: one batch of inputs.
        y: the batch's labels, as ``loss`` takes them.
        loss: a callable ``loss(y_true, y_pred)``.

    Returns:
        One gradient per trainable variable, in order (None where the loss does not
        depend on it).

    Raises:
        NotImplementedError: a Keras backend other than TensorFlow, JAX or PyTorch.
    """
    backend = keras.backend.backend()
    if backend not in _BY_BACKEND:
        raise NotImplementedError(f"triplet_movement does not support the {backend} backend.")
    return _BY_BACKEND[backend](model, x, y, loss, model.trainable_variables)
