"""A loss over the global batch under ``tf.distribute``: the one wrapper around the loss call.

Under ``tf.distribute.MirroredStrategy`` or ``MultiWorkerMirroredStrategy``
each replica sees a slice of the global batch. By default (``loss.cross_replica
= None``: whenever more than one replica is in sync) a tfdml loss gathers the
embeddings, labels and sample weights of all replicas (``all_gather``), mines
and computes the loss over the *global* batch exactly as one device would, and
returns that value divided by the number of replicas, as Keras' own losses do;
the gradient of the gather sums the gradients of all replicas and hands each
replica the part for its own embeddings, so the summed update equals
single-device training on the global batch. Cost per step: every replica
computes the loss (not the model) over the global batch, i.e. the loss's time
and memory of single-device training at the global batch size, plus one
all-gather of the ``[B, D]`` embeddings and one all-reduce of their gradient.
With ``loss.cross_replica = False`` each replica mines within its own slice
(the mean reductions are then divided by the number of replicas as above).
Miners that draw at random draw independently on each replica. With
``reduction="none"`` a replica gets the values of its own anchors.

Only TensorFlow has replicas in sync; on the other backends :func:`context`
is None and :func:`num_replicas` is 1. The TensorFlow calls (the replica
context, ``all_gather``) are shims of ``tfdml._shims``; this module holds
the policy.
"""

from __future__ import annotations

from keras import ops

from tfdml import _shims

__all__ = ["call_over_replicas", "context", "num_replicas", "scale"]


def num_replicas() -> int:
    """Replicas in sync under a ``tf.distribute`` strategy (1 on other backends)."""
    return _shims.num_replicas()


def scale(value):
    """``value`` divided by the number of replicas in sync (as Keras' losses do)."""
    replicas = num_replicas()
    if replicas > 1:
        value = value * ops.cast(1.0 / replicas, _shims.dtype_name(value))
    return value


def context(cross_replica):
    """The replica context to gather over, or None (one replica, ``cross_replica=False``)."""
    if cross_replica is not None and not isinstance(cross_replica, bool):
        raise ValueError("`cross_replica` must be None, True or False. Received: "
                         f"cross_replica={cross_replica!r}")
    return None if cross_replica is False else _shims.replica_context()


def call_over_replicas(loss_value, cross_replica, labels, y_pred, sample_weight, reduction):
    """``loss_value(labels, y_pred, sample_weight)`` over the global batch, scaled per replica.

    Without replicas to gather over (:func:`context` is None) this is
    ``loss_value`` on the replica's own batch, the mean reductions divided by
    the number of replicas. With them, ``loss_value`` sees the gathered
    global batch; a replica returns its share (module docstring).
    """
    ctx = context(cross_replica)
    if ctx is None:
        value = loss_value(labels, y_pred, sample_weight)
        return value if reduction in ("sum", "none", None) else scale(value)
    all_labels, all_pred, all_weights, local = _shims.gather_replicas(ctx, labels, y_pred,
                                                                   sample_weight)
    value = loss_value(all_labels, all_pred, all_weights)
    if reduction in ("none", None):
        return _shims.replica_rows(ctx, value, local)
    return scale(value)
