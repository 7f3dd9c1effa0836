"""A loss from its spec: the class's ``__init__``, its docs and its functional form.

A loss of the pair and triplet family is written once, as a spec
(:mod:`tfdml.losses.base`): its per-anchor function ``terms`` and
``check_arguments``, whose signature lists the loss's own arguments and their
defaults. :func:`loss_class` builds the class's ``__init__`` from that
signature (the loss's own arguments first, then the ones every loss takes:
``normalize``, ``average``, ``reduction``, ``name``, ``dtype``,
``block_size``), registers the class for Keras serialization and completes
its docstring with the shared arguments; :func:`functional_form` builds the
functional form (``y_true, y_pred``, the loss's own arguments, ``normalize``,
the reference set, ``average``), which computes through
:meth:`MetricLoss.functional`. ``get_config`` and ``per_anchor`` come from
:class:`tfdml.losses.base.MetricLoss`.
"""

from __future__ import annotations

import inspect
import textwrap

import keras

__all__ = ["COMMON_ARGUMENTS", "functional_form", "loss_class"]

#: The arguments every loss of this family takes after its own, in this order.
COMMON_ARGUMENTS = ("normalize", "average", "reduction", "name", "dtype", "block_size")

_DOCS = {
    "normalize": "normalize: L2-normalize the embeddings first. Defaults to `{}`.",
    "average": ("average: what the loss averages over: ``\"anchors\"``, ``\"batch\"``,\n"
                "    ``\"terms\"``, ``\"nonzero\"`` or, for a pair loss whose terms split,\n"
                "    ``\"halves\"``/``\"halves_terms\"`` (:mod:`tfdml.losses.terms`).\n"
                "    Defaults to `\"{}\"`."),
    "reduction": ("reduction: see :mod:`tfdml.losses.terms`. Defaults to\n"
                  "    `\"sum_over_batch_size\"`."),
    "name": "name: name of the loss. Defaults to `\"{}\"`.",
    "dtype": "dtype: dtype of the returned value. Defaults to `None` (floatx).",
    "block_size": (
        "block_size: compute the loss over blocks of this many anchors, each\n"
        "    against the whole batch, recomputing each block in the backward\n"
        "    pass: memory ``O(block_size x B)`` instead of ``O(B^2)``, the same\n"
        "    values and gradients (docs/losses.md, \"Large batches\"). Defaults\n"
        "    to `None` (the whole batch at once)."),
}

_REFERENCE_DOCS = """
        ref_embeddings: ``[R, D]`` embeddings to mine positives and negatives
            from instead of the batch. Defaults to `None` (the batch).
        ref_labels: ``[R]`` class ids of ``ref_embeddings``.
        ref_offset: anchor ``i`` is row ``i + ref_offset`` of the reference
            set (excluded from its positives); `None` when the anchors are not
            in it. Ignored without ``ref_embeddings``."""


def _parameter(name, default):
    return inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default)


def _own_parameters(cls):
    """The loss's own arguments: the parameters of its ``check_arguments``."""
    return list(inspect.signature(cls.check_arguments).parameters.values())


def _document(cls, defaults, common):
    """Appends the shared arguments, with this loss's defaults, to the Args of its docstring."""
    lines = []
    for key in common:
        text = _DOCS[key].format(defaults[key])
        lines.extend("        " + line for line in text.split("\n"))
    doc = cls.__doc__
    start = doc.index("    Args:\n")
    end = doc.find("\n\n", start)
    end = len(doc.rstrip()) if end < 0 else end
    cls.__doc__ = doc[:end] + "\n" + "\n".join(lines) + doc[end:]


def loss_class(name, average="anchors", normalize=True, common=COMMON_ARGUMENTS, head=(),
               document=True, package="tfdml"):
    """Class decorator: a loss class from its spec (module docstring).

    Args:
        name: the loss's default ``name``.
        average: its default ``average`` (its paper's).
        normalize: its default ``normalize``; None for a loss that always
            normalizes (no ``normalize`` argument).
        common: the shared arguments it takes, in the order of its
            signature after its own.
        head: arguments of its base class before its own (``num_classes``,
            ``embedding_dim`` for the class-weight losses; ``num_classes``
            without a default).
        document: append the shared arguments to its docstring (the
            class-weight losses document theirs themselves).
        package: the package it is registered under for Keras
            serialization (``keras.saving.register_keras_serializable``).
    """
    defaults = {"normalize": normalize, "average": average, "reduction": "sum_over_batch_size",
                "name": name, "dtype": None, "block_size": None, "embedding_dim": None,
                "initializer": None, "num_classes": inspect.Parameter.empty}

    def decorate(cls):
        own = _own_parameters(cls)
        first = [_parameter(key, defaults[key]) for key in head]
        tail = [_parameter(key, defaults[key]) for key in common]
        signature = inspect.Signature(
            [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD), *first, *own,
             *tail])
        own_names = [p.name for p in own]

        def __init__(self, *args, **kwargs):
            bound = signature.bind(self, *args, **kwargs)
            bound.apply_defaults()
            values = dict(bound.arguments)
            values.pop("self")
            super(cls, self).__init__(**values)  # noqa: UP008 (cls is the decorated class)
            self.check_spec()

        __init__.__signature__ = signature
        __init__.__doc__ = f"Arguments: {', '.join([*head, *own_names, *common])}."
        __init__.__qualname__ = f"{cls.__qualname__}.__init__"
        cls.__init__ = __init__
        if cls.__doc__ and document:
            _document(cls, defaults, common)
        return keras.saving.register_keras_serializable(package=package)(cls)

    return decorate


def functional_form(cls, name, summary, returns):
    """The functional form of a loss class built by :func:`loss_class`.

    ``name(y_true, y_pred, <own arguments>, normalize, ref_embeddings,
    ref_labels, ref_offset, average)``, with the class's defaults: the value
    of the class's default reduction, computed by :meth:`MetricLoss.functional`.

    Args:
        cls: the loss class.
        name: the function's name.
        summary: the first line of its docstring.
        returns: what it returns, for its docstring.
    """
    init = inspect.signature(cls.__init__).parameters
    own = _own_parameters(cls)
    tail = [_parameter("normalize", init["normalize"].default),
            _parameter("ref_embeddings", None), _parameter("ref_labels", None),
            _parameter("ref_offset", None), _parameter("average", init["average"].default)]
    signature = inspect.Signature(
        [_parameter("y_true", inspect.Parameter.empty),
         _parameter("y_pred", inspect.Parameter.empty), *own, *tail])

    def loss(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        values = dict(bound.arguments)
        positional = [values.pop(k) for k in ("y_true", "y_pred", "ref_embeddings",
                                             "ref_labels", "ref_offset")]
        return cls.functional(*positional, **values)

    loss.__signature__ = signature
    loss.__name__ = loss.__qualname__ = name
    loss.__module__ = cls.__module__
    own_names = ", ".join(p.name for p in own)
    as_in = textwrap.fill(f"{own_names}, normalize, average: as in :class:`{cls.__name__}`.",
                          88, initial_indent=" " * 8, subsequent_indent=" " * 12)
    returns = textwrap.fill(returns, 88, initial_indent=" " * 8, subsequent_indent=" " * 8)
    loss.__doc__ = (
        f"{summary}\n\n    Args:\n        y_true: ``[B]`` or ``[B, 1]`` integer class ids.\n"
        f"        y_pred: ``[B, D]`` embeddings.\n{as_in}"
        f"{_REFERENCE_DOCS}\n\n    Returns:\n{returns}\n    ")
    return loss
