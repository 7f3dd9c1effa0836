"""The functional form of a loss class, built from the class so that the two cannot differ.

``contrastive_loss = functional_form(ContrastiveLoss)`` is a function with the class's own
arguments and defaults, read from its ``__init__``: ``(y_true, y_pred, <own arguments>,
normalize=, ref_embeddings=None, ref_labels=None, ref_offset=None, average=)`` (``normalize``
and ``average`` where the class takes them, the reference set where it mines from one). A call
makes the loss with those arguments, so the checks, the terms and the average are the class's,
and returns :meth:`tfdml.losses.MetricLoss.functional`: the loss of the batch with the default
reduction, in the dtype of ``y_pred``. The signature is the function's ``__signature__``
(``help()``, ``inspect`` and the API reference show it); its docstring is written from the
class's.
"""

from __future__ import annotations

import inspect

from tfdml.losses._docstrings import REFERENCE_ARGS, SHARED
from tfdml.losses.base import MetricLoss

__all__ = ["REFERENCE", "functional_form"]

#: The reference-set arguments of a functional form, in the order of its signature.
REFERENCE = ("ref_embeddings", "ref_labels", "ref_offset")

_POSITIONAL = inspect.Parameter.POSITIONAL_OR_KEYWORD
_KEYWORD = inspect.Parameter.KEYWORD_ONLY


def _signature(loss_class):
    """The functional form's signature, from ``loss_class.__init__``'s."""
    init = inspect.signature(loss_class.__init__).parameters
    own = [p.replace(kind=_POSITIONAL) for name, p in init.items()
           if name != "self" and name not in SHARED
           and p.kind in (_POSITIONAL, _KEYWORD)]
    tail = []
    if "normalize" in init:
        tail.append(init["normalize"].replace(kind=_KEYWORD))
    if loss_class.takes_reference_set:
        tail.extend(inspect.Parameter(name, _KEYWORD, default=None) for name in REFERENCE)
    if "average" in init:
        tail.append(init["average"].replace(kind=_KEYWORD))
    inputs = [inspect.Parameter(name, _POSITIONAL) for name in ("y_true", "y_pred")]
    return inspect.Signature(inputs + own + tail)


def _doc(loss_class, signature):
    own = [name for name in signature.parameters
           if name not in ("y_true", "y_pred", *REFERENCE)]
    labels = ("``[B]`` or ``[B, 1]`` integer class ids" if loss_class.multi_label is not True
              else "``[B]`` or ``[B, 1]`` integer class ids, or ``[B, L]`` multi-hot label sets")
    lines = [
        f"Functional form of :class:`{loss_class.__name__}`: the loss of one batch.",
        "",
        f"Makes a ``{loss_class.__name__}`` with these arguments and returns its value on the",
        "batch with the default reduction: the same checks, terms and average as the class.",
        "",
        "Args:",
        f"    y_true: {labels}.",
        "    y_pred: ``[B, D]`` embeddings.",
    ]
    if own:
        lines.append(f"    {', '.join(own)}: as in :class:`{loss_class.__name__}`.")
    if loss_class.takes_reference_set:
        lines.extend("    " + line for line in REFERENCE_ARGS.split("\n"))
    lines.extend([
        "",
        "Returns:",
        "    A scalar of the dtype of ``y_pred``; 0 when no anchor has anything to learn,",
        "    NaN when an embedding is NaN or Inf.",
        "",
        "Raises:",
        f"    ValueError: for an argument that ``{loss_class.__name__}`` refuses.",
    ])
    return "\n".join(lines)


def functional_form(loss_class, name=None):
    """The functional form of ``loss_class``: its arguments, checks, terms and average.

    Args:
        loss_class: a :class:`tfdml.losses.MetricLoss` subclass.
        name: the function's name. Defaults to the default ``name`` of the class's
            ``__init__`` (``"contrastive_loss"`` for ``ContrastiveLoss``).

    Returns:
        A function ``(y_true, y_pred, <the class's own arguments>, normalize=,
        ref_embeddings=None, ref_labels=None, ref_offset=None, average=)`` that returns a
        scalar of the dtype of ``y_pred``.

    Example:

    >>> cosine_hinge_loss = functional_form(CosineHingeLoss)
    >>> value = cosine_hinge_loss(labels, embeddings, margin=0.2)
    """
    if not (isinstance(loss_class, type) and issubclass(loss_class, MetricLoss)):
        raise ValueError(f"`loss_class` must be a subclass of tfdml.losses.MetricLoss. "
                         f"Received: loss_class={loss_class!r}")
    signature = _signature(loss_class)
    if name is None:
        name = inspect.signature(loss_class.__init__).parameters["name"].default

    def loss(*args, **kwargs):
        values = signature.bind(*args, **kwargs)
        values.apply_defaults()
        values = dict(values.arguments)
        y_true, y_pred = values.pop("y_true"), values.pop("y_pred")
        reference = [values.pop(key, None) for key in REFERENCE]
        return loss_class(**values).functional(y_true, y_pred, *reference)

    loss.__signature__ = signature
    loss.__name__ = loss.__qualname__ = name
    loss.__module__ = loss_class.__module__
    loss.__doc__ = _doc(loss_class, signature)
    loss.loss_class = loss_class
    return loss
