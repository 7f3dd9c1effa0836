"""tfdml's vocabulary of distance names and its check (re-exported by :mod:`tfdml.ops`)."""

from __future__ import annotations

import inspect
import os
import warnings

__all__ = ["DEPRECATED_DISTANCES", "DISTANCES", "LOSS_DISTANCES", "check_distance"]

#: tfdml's names of distances, the same in losses, miners, metrics, callbacks and search:
#: ``"cosine"`` (``1 - x.y`` of L2-normalized vectors; as a similarity, ``x.y``), ``"dot"``
#: (the dot product, a similarity), ``"l2"`` (the Euclidean distance) and ``"squared_l2"``
#: (its square). Each function takes those it computes.
DISTANCES = ("cosine", "dot", "l2", "squared_l2")

#: The distances of the losses (:func:`tfdml.ops.distance_matrix`,
#: :func:`tfdml.ops.paired_distance`).
LOSS_DISTANCES = ("squared_l2", "l2", "cosine")

#: Old spellings and their names in :data:`DISTANCES`: where an argument still takes one
#: (it is in the ``accepted`` of :func:`check_distance`), it means the new name, with a
#: ``DeprecationWarning``.
DEPRECATED_DISTANCES = {"euclidean": "l2"}

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _caller_stacklevel() -> int:
    """The ``stacklevel`` of a warning raised by the caller of this function that points at
    the first frame outside tfdml (the user's call, however deep tfdml's own calls are)."""
    frame = inspect.currentframe().f_back  # the function that warns: stacklevel 1
    level = 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame = frame.f_back
        level += 1
    return level


def check_distance(value, accepted=LOSS_DISTANCES, name: str = "distance"):
    """``value`` as a name of :data:`DISTANCES`, if the argument ``name`` takes it.

    Args:
        value: the name given.
        accepted: the names the argument takes. An old spelling among them
            (:data:`DEPRECATED_DISTANCES`: ``"euclidean"``) is returned as its
            new name (``"l2"``) with a ``DeprecationWarning`` that names it.
            Defaults to :data:`LOSS_DISTANCES`.
        name: the argument, for the messages. Defaults to `"distance"`.

    Raises:
        ValueError: naming ``name`` and the (current) names of ``accepted``,
            when ``accepted`` does not hold ``value``.
    """
    current = tuple(a for a in accepted if a not in DEPRECATED_DISTANCES)
    if isinstance(value, str) and value in DEPRECATED_DISTANCES and value in accepted:
        new = DEPRECATED_DISTANCES[value]
        warnings.warn(f"`{name}={value!r}` is deprecated: use `{name}={new!r}`, the same "
                      "distance.", DeprecationWarning, stacklevel=_caller_stacklevel())
        return new
    if value not in current:
        raise ValueError(f"`{name}` must be one of {current}. Received: {name}={value!r}")
    return value
