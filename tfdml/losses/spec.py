"""Deprecated: a loss declared as a *spec*, its class and functional form generated from it.

A loss is now plain source (:mod:`tfdml.losses.base`): an ``__init__`` with named
arguments that passes its own on to ``MetricLoss.__init__``, a ``terms(inputs)`` method,
and a functional form that calls :func:`tfdml.losses.base.functional_loss`. This module
still turns a loss written the former way (a static ``terms(inputs, **arguments)``
function, a static ``check_arguments(**arguments) -> dict`` whose signature lists the
loss's own arguments, and an optional ``check_spec`` method) into that contract, with a
DeprecationWarning.
"""

from __future__ import annotations

import inspect
import textwrap
import warnings

import keras

from tfdml._docs import fill_doc
from tfdml.losses._docstrings import REFERENCE_ARGS, SHARED, shared_args
from tfdml.losses.base import functional_loss

__all__ = ["COMMON_ARGUMENTS", "functional_form", "loss_class"]

#: The arguments every loss of the pair and triplet family takes after its own, in this order.
COMMON_ARGUMENTS = SHARED

_DEPRECATED = ("tfdml.losses.spec.{} is deprecated: write the loss's __init__ and its "
               "terms(inputs) method, and its functional form with "
               "tfdml.losses.base.functional_loss (docs/losses.md, \"Writing a loss\").")


def _parameter(name, default):
    return inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default)


def _own_parameters(cls):
    """The loss's own arguments: the parameters of its ``check_arguments``."""
    return list(inspect.signature(cls.check_arguments).parameters.values())


def _with_placeholder(doc):
    """``doc`` with a ``{SHARED_ARGS}`` line at the end of its ``Args:`` section."""
    start = doc.index("    Args:\n")
    end = doc.find("\n\n", start)
    end = len(doc.rstrip()) if end < 0 else end
    return doc[:end] + "\n        {SHARED_ARGS}" + doc[end:]


def loss_class(name, average="anchors", normalize=True, common=COMMON_ARGUMENTS, head=(),
               document=True, package="tfdml"):
    """Deprecated class decorator: a loss class from its spec (module docstring).

    Args:
        name: the loss's default ``name``.
        average: its default ``average`` (its paper's).
        normalize: its default ``normalize``; None for a loss that always
            normalizes (no ``normalize`` argument).
        common: the shared arguments it takes, in the order of its signature.
        head: arguments of its base class before its own.
        document: append the shared arguments to its docstring.
        package: the package it is registered under for Keras serialization.
    """
    warnings.warn(_DEPRECATED.format("loss_class"), DeprecationWarning, stacklevel=2)
    defaults = {"normalize": normalize, "average": average, "reduction": "sum_over_batch_size",
                "name": name, "dtype": None, "block_size": None, "embedding_dim": None,
                "initializer": None, "num_classes": inspect.Parameter.empty}

    def decorate(cls):
        own = _own_parameters(cls)
        check = cls.check_arguments
        spec_terms = inspect.getattr_static(cls, "terms")
        spec_terms = getattr(spec_terms, "__func__", spec_terms)
        signature = inspect.Signature(
            [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
             *(_parameter(key, defaults[key]) for key in head), *own,
             *(_parameter(key, defaults[key]) for key in common)])

        def __init__(self, *args, **kwargs):
            values = signature.bind(self, *args, **kwargs)
            values.apply_defaults()
            values = dict(values.arguments)
            values.pop("self")
            arguments = check(**{p.name: values.pop(p.name) for p in own})
            super(cls, self).__init__(**values, **arguments)  # noqa: UP008 (the decorated class)
            if hasattr(self, "check_spec"):
                self.check_spec()

        def terms(self, inputs):
            return spec_terms(inputs, **self.arguments)

        __init__.__signature__ = signature
        __init__.__qualname__ = f"{cls.__qualname__}.__init__"
        cls.__init__ = __init__
        cls.terms = terms
        cls.spec_terms = staticmethod(spec_terms)
        if cls.__doc__ and document:
            cls.__doc__ = _with_placeholder(cls.__doc__)
            fill_doc(SHARED_ARGS=shared_args(name, average, normalize, common))(cls)
        return keras.saving.register_keras_serializable(package=package)(cls)

    return decorate


def functional_form(cls, name, summary, returns):
    """Deprecated: the functional form of a loss class built by :func:`loss_class`.

    ``name(y_true, y_pred, <own arguments>, normalize, ref_embeddings, ref_labels,
    ref_offset, average)``, with the class's defaults, computed by
    :func:`tfdml.losses.base.functional_loss`.

    Args:
        cls: the loss class.
        name: the function's name.
        summary: the first line of its docstring.
        returns: what it returns, for its docstring.
    """
    warnings.warn(_DEPRECATED.format("functional_form"), DeprecationWarning, stacklevel=2)
    init = inspect.signature(cls.__init__).parameters
    own = _own_parameters(cls)
    tail = [_parameter("normalize", init["normalize"].default),
            _parameter("ref_embeddings", None), _parameter("ref_labels", None),
            _parameter("ref_offset", None), _parameter("average", init["average"].default)]
    signature = inspect.Signature(
        [_parameter("y_true", inspect.Parameter.empty),
         _parameter("y_pred", inspect.Parameter.empty), *own, *tail])

    def loss(*args, **kwargs):
        values = signature.bind(*args, **kwargs)
        values.apply_defaults()
        values = dict(values.arguments)
        inputs = [values.pop(k) for k in ("y_true", "y_pred", "ref_embeddings", "ref_labels",
                                          "ref_offset", "normalize", "average")]
        return functional_loss(cls, cls.spec_terms, *inputs, **cls.check_arguments(**values))

    loss.__signature__ = signature
    loss.__name__ = loss.__qualname__ = name
    loss.__module__ = cls.__module__
    own_names = ", ".join(p.name for p in own)
    as_in = textwrap.fill(f"{own_names}, normalize, average: as in :class:`{cls.__name__}`.",
                          88, subsequent_indent="    ")
    loss.__doc__ = (
        f"{summary}\n\n    Args:\n        y_true: ``[B]`` or ``[B, 1]`` integer class ids.\n"
        f"        y_pred: ``[B, D]`` embeddings.\n        {{AS_IN}}\n        {{REFERENCE_ARGS}}\n"
        f"\n    Returns:\n        {{RETURNS}}\n    ")
    fill_doc(AS_IN=as_in, REFERENCE_ARGS=REFERENCE_ARGS,
             RETURNS=textwrap.fill(returns, 88))(loss)
    return loss
