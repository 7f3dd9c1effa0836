"""Who owns a loss's state: the model that trains it.

A loss with state (learned variables, a memory bank, a random miner's seed)
trains one model at a time. Each loss carries its own :class:`Ownership`
record (``loss.ownership``): the model that claimed it (a weak reference:
the model refers to the loss already), whether its state was built by a call
rather than by a model, and whether it has warned. Nothing is kept outside the
loss. :class:`tfdml.models.MetricModel` claims its loss
(:func:`claim_loss`); every call of a loss checks its state first
(:func:`check_loss_state`).
"""

from __future__ import annotations

import warnings
import weakref

import keras

from tfdml._shims import is_traced

__all__ = ["Ownership", "check_loss_state", "claim_loss", "loss_owner", "losses_within"]


class Ownership:
    """What a loss knows of its owner: the model, how its state was built, the warnings given."""

    def __init__(self):
        self.owner = None  # weakref.ref to the model
        self.built_in_call = False  # the state was built by a call, not by a model
        self.warned = False


def losses_within(loss):
    """``loss`` and the losses it wraps, at any depth (through ``wrapped_losses``)."""
    found = [loss]
    for inner in getattr(loss, "wrapped_losses", ()):
        found.extend(losses_within(inner))
    return found


def loss_owner(loss):
    """The model that owns ``loss``'s state, or None."""
    owner = loss.ownership.owner
    return None if owner is None else owner()


def claim_loss(loss, model):
    """Makes ``model`` the owner of ``loss``'s state (and of the losses it wraps).

    Raises:
        ValueError: when another model owns it already.
    """
    losses = losses_within(loss)
    for inner in losses:
        owner = loss_owner(inner)
        if owner is not None and owner is not model:
            raise ValueError(
                f"Loss {inner.name!r} already belongs to the model {owner.name!r}: a "
                "loss with state (learned variables, a memory bank or a random miner's seed) "
                "can train one model at a time. Create another loss for another model."
            )
    for inner in losses:
        inner.ownership.owner = weakref.ref(model)


def _differentiated(y_pred) -> bool:
    """``y_pred`` is a PyTorch tensor in an autograd graph (a training step runs eagerly)."""
    if keras.backend.backend() != "torch":
        return False
    import torch

    return isinstance(y_pred, torch.Tensor) and y_pred.requires_grad and torch.is_grad_enabled()


def _unowned_state_error(loss, what):
    return ValueError(
        f"Loss {loss.name!r} {what}. Train with `tfdml.models.MetricModel(model, loss)`, "
        "which owns them, or call `loss.build_state(embedding_dim)` before the first step "
        "(and train `loss.trainable_variables` yourself)."
    )


def check_loss_state(loss, y_pred):
    """Before each call of a loss: builds its state on first use, eagerly; checks its owner.

    Raises:
        ValueError: for learned variables that would be created inside a
            compiled step, or, on PyTorch, created by a differentiated call
            outside any model (no optimizer would train them).
    """
    state = loss.state
    if state is None:
        return
    record = loss.ownership
    if not state.built:
        if is_traced(y_pred) and state.needs_embedding_dim:
            raise _unowned_state_error(loss, (
                "has variables (e.g. proxies or a memory bank) that do not exist yet, and "
                "they cannot be created inside a compiled step"))
        loss.build_state(y_pred.shape[-1])
        record.built_in_call = True
    owner = loss_owner(loss)
    if (record.built_in_call and state.needs_embedding_dim and owner is None
            and _differentiated(y_pred) and state.trainable_variables):
        # PyTorch trains eagerly (Keras builds the loss in a first call without gradients):
        # variables the loss created itself are in no model's optimizer.
        raise _unowned_state_error(loss, (
            "created its learned variables (e.g. proxies) on its first call, outside any "
            "model, and is trained by a model that does not own them: they would never "
            "change"))
    if owner is not None or record.warned or not is_traced(y_pred):
        return
    _warn_unowned(loss, state, record)


def _has_seeds(state) -> bool:
    return bool(state.seed_generators) or any(_has_seeds(c) for c in state.wrapped_states)


def _warn_unowned(loss, state, record):
    learned = bool(state.trainable_variables)
    seeds = _has_seeds(state)
    if learned or (keras.backend.backend() == "jax" and (
            state.needs_embedding_dim or seeds or state.non_trainable_variables)):
        record.warned = True
        what = ("learned variables that no model trains" if learned else
                "a memory bank that a compiled JAX step does not update" if
                state.needs_embedding_dim else
                "a random miner, whose seed state a compiled JAX step does not update: "
                "the same samples would be drawn at every step" if seeds else
                "a running state (e.g. a histogram) that a compiled JAX step does not update")
        warnings.warn(
            f"Loss {loss.name!r} has {what}. Train with "
            "`tfdml.models.MetricModel(model, loss)`, which owns the loss's state.",
            stacklevel=5,
        )
