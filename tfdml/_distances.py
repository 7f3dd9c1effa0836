"""tfdml's vocabulary of distance names and its check (re-exported by :mod:`tfdml.ops`)."""

from __future__ import annotations

__all__ = ["DISTANCES", "LOSS_DISTANCES", "check_distance"]

#: tfdml's names of distances, the same in losses, miners, metrics, callbacks and search:
#: ``"cosine"`` (``1 - x.y`` of L2-normalized vectors; as a similarity, ``x.y``), ``"dot"``
#: (the dot product, a similarity), ``"l2"`` (the Euclidean distance) and ``"squared_l2"``
#: (its square). Each function takes those it computes.
DISTANCES = ("cosine", "dot", "l2", "squared_l2")

#: The distances of the losses (:func:`tfdml.ops.distance_matrix`,
#: :func:`tfdml.ops.paired_distance`).
LOSS_DISTANCES = ("squared_l2", "l2", "cosine")


def check_distance(value, accepted=LOSS_DISTANCES, name: str = "distance"):
    """``value`` as a name of :data:`DISTANCES`, if the argument ``name`` takes it.

    Args:
        value: the name given.
        accepted: the names the argument takes. Defaults to :data:`LOSS_DISTANCES`.
        name: the argument, for the messages. Defaults to `"distance"`.

    Raises:
        ValueError: naming ``name`` and the names of ``accepted``, when ``accepted``
            does not hold ``value``.
    """
    accepted = tuple(accepted)
    if not isinstance(value, str) or value not in accepted:
        raise ValueError(f"`{name}` must be one of {accepted}. Received: {name}={value!r}")
    return value
