"""The base class of tfdml losses and the plumbing their functional forms share.

A tfdml loss takes ``y_true`` = integer class ids ``[B]`` (or ``[B, 1]``) and
``y_pred`` = embeddings ``[B, D]``. It computes one loss value per anchor and a
flag saying whether the anchor had anything to learn from (a mined triplet,
a positive pair...), then reduces:

* ``"sum_over_batch_size"`` / ``"mean"`` (default): the mean over the anchors
  that have a triplet (weighted by ``sample_weight`` if given, divided by
  the number of such anchors, as Keras does for masked losses);
* ``"mean_with_sample_weight"``: sum divided by the sum of the weights of
  the anchors that have a triplet;
* ``"sum"``: the plain sum;
* ``"none"`` / ``None``: the ``[B]`` per-anchor values, 0 for anchors without
  a triplet.

A batch where no anchor has a triplet gives 0 with zero gradients.

**Several replicas** (``tf.distribute.MirroredStrategy``,
``MultiWorkerMirroredStrategy``): each replica sees a slice of the global
batch. By default (``loss.cross_replica = None``: whenever more than one
replica is in sync) a tfdml loss gathers the embeddings, labels and sample
weights of all replicas (``all_gather``), mines and computes the loss over the
*global* batch exactly as one device would, and returns that value divided by
the number of replicas, as Keras' own losses do; the gradient of the gather
sums the gradients of all replicas and hands each replica the part for its
own embeddings, so the summed update equals single-device training on the
global batch. Cost per step: every replica computes the loss (not the model)
over the global batch, i.e. the loss's time and memory of single-device
training at the global batch size, plus one all-gather of the ``[B, D]``
embeddings and one all-reduce of their gradient. With
``loss.cross_replica = False`` each replica mines within its own slice (the
mean reductions are then divided by the number of replicas as above).
Miners that draw at random draw independently on each replica. With
``reduction="none"`` a replica gets the values of its own anchors.
"""

from __future__ import annotations

import re

import keras
import tensorflow as tf

from tfdml import ops
from tfdml.miners import Miner, Pairs

__all__ = [
    "MetricLoss",
    "mean_over_valid",
    "pair_mean",
    "per_anchor_mean",
    "prepare_inputs",
    "reduce_anchor_losses",
    "resolve_miner",
]

_REDUCTIONS = ("sum_over_batch_size", "mean", "mean_with_sample_weight", "sum", "none", None)


def prepare_inputs(
    labels,
    embeddings,
    ref_embeddings=None,
    ref_labels=None,
    ref_offset=None,
    normalize: bool = True,
):
    """Validates and casts the inputs of a functional loss.

    Returns:
        ``(labels, x, ref_labels, ref, ref_offset)``: int32 labels, the
        embeddings in the compute dtype (float32, or float64 for float64
        input), L2-normalized if ``normalize``, and the same for the reference
        set (the batch itself when ``ref_embeddings`` is None, with offset 0).

    Raises:
        ValueError: for embeddings that are not rank 2, labels that are not
            ``[B]``/``[B, 1]``, batch sizes that differ, or a reference set
            with embeddings but no labels (or the reverse).
    """
    labels = ops.cast_labels(labels, "y_true")
    embeddings = ops.check_embeddings(embeddings, "y_pred")
    ops.check_batch_sizes(labels, embeddings, "y_true", "y_pred")
    dtype = ops.compute_dtype(embeddings.dtype)
    x = tf.cast(embeddings, dtype)
    if normalize:
        x = ops.l2_normalize(x)
    if ref_embeddings is None:
        if ref_labels is not None:
            raise ValueError(
                "`ref_labels` was given without `ref_embeddings`. Pass both or neither."
            )
        return labels, x, labels, x, 0
    if ref_labels is None:
        raise ValueError("`ref_embeddings` was given without `ref_labels`. Pass both or neither.")
    ref_labels = ops.cast_labels(ref_labels, "ref_labels")
    ref = ops.check_embeddings(ref_embeddings, "ref_embeddings")
    ops.check_batch_sizes(ref_labels, ref, "ref_labels", "ref_embeddings")
    if ref.shape[-1] is not None and x.shape[-1] is not None and ref.shape[-1] != x.shape[-1]:
        raise ValueError(
            "`ref_embeddings` must have the same embedding size as `y_pred`. "
            f"Received: ref_embeddings.shape={ref.shape}, y_pred.shape={embeddings.shape}"
        )
    ref = tf.cast(ref, dtype)
    if normalize:
        ref = ops.l2_normalize(ref)
    return labels, x, ref_labels, ref, ref_offset


def per_anchor_mean(values, mask):
    """Mean of ``values`` over each anchor's true ``mask`` entries.

    Args:
        values: per-triplet (or per-pair) losses, broadcastable to ``mask``,
            whose first axis is the anchor.
        mask: boolean, ``[B, ...]``.

    Returns:
        ``(losses, valid)``: ``[B]`` means (0 where the mask is empty) and
        ``[B]`` booleans, true where the anchor had at least one entry.
    """
    weights = tf.cast(mask, values.dtype)
    values = tf.broadcast_to(values, tf.shape(weights))
    axes = list(range(1, len(mask.shape)))
    count = tf.reduce_sum(weights, axis=axes)
    total = tf.reduce_sum(values * weights, axis=axes)
    return tf.math.divide_no_nan(total, count), count > 0


def pair_mean(positive_values, negative_values, pairs: Pairs):
    """Per anchor, the mean of a pair loss over its mined positive and negative pairs.

    Args:
        positive_values: ``[B, R]`` loss of each pair if it were a positive pair.
        negative_values: ``[B, R]`` loss of each pair if it were a negative pair.
        pairs: the mined :class:`tfdml.miners.Pairs`.

    Returns:
        ``(losses, valid)`` as in :func:`per_anchor_mean`; valid anchors have
        at least one mined pair.
    """
    positive = tf.cast(pairs.positive, positive_values.dtype)
    negative = tf.cast(pairs.negative, negative_values.dtype)
    total = tf.reduce_sum(positive_values * positive + negative_values * negative, axis=1)
    count = tf.reduce_sum(positive, axis=1) + tf.reduce_sum(negative, axis=1)
    return tf.math.divide_no_nan(total, count), count > 0


def mean_over_valid(losses, valid, like):
    """The scalar a functional loss returns: mean of ``losses`` over ``valid`` anchors.

    0 (with zero gradients) when no anchor is valid; cast to the dtype of ``like``.
    """
    count = tf.reduce_sum(tf.cast(valid, losses.dtype))
    value = tf.math.divide_no_nan(tf.reduce_sum(losses), count)
    return tf.cast(value, tf.convert_to_tensor(like).dtype)


def _scale_for_distribution(value):
    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    if replicas > 1:
        value = value * tf.cast(1.0 / replicas, value.dtype)
    return value


def reduce_anchor_losses(losses, valid, sample_weight=None, reduction="sum_over_batch_size"):
    """Reduces per-anchor losses as described in the module docstring."""
    _check_reduction(reduction)
    weights = tf.cast(valid, losses.dtype)
    count = tf.reduce_sum(weights)
    if sample_weight is not None:
        sample_weight = tf.cast(tf.convert_to_tensor(sample_weight), losses.dtype)
        if sample_weight.shape.rank == 2 and sample_weight.shape[-1] == 1:
            sample_weight = tf.squeeze(sample_weight, axis=-1)
        weights = weights * sample_weight
    values = losses * weights
    if reduction in ("none", None):
        return values
    total = tf.reduce_sum(values)
    if reduction == "sum":
        return total
    if reduction == "mean_with_sample_weight":
        return _scale_for_distribution(tf.math.divide_no_nan(total, tf.reduce_sum(weights)))
    return _scale_for_distribution(tf.math.divide_no_nan(total, count))


def _check_reduction(reduction):
    if reduction not in _REDUCTIONS:
        raise ValueError(f"`reduction` must be one of {_REDUCTIONS}. Received: reduction={reduction!r}")


def resolve_miner(miner, default_factory):
    """A Miner instance from ``miner`` (instance, serialized dict, or None for the default)."""
    if miner is None:
        return default_factory()
    if isinstance(miner, dict):
        miner = keras.saving.deserialize_keras_object(miner)
    if not isinstance(miner, Miner):
        raise ValueError(
            f"`miner` must be a tfdml.miners.Miner instance or None. Received: miner={miner!r}"
        )
    return miner


class MetricLoss(keras.losses.Loss):
    """Base class of tfdml losses: labels + embeddings in, one value per anchor, reduced.

    Subclasses implement :meth:`per_anchor`. ``__call__`` casts ``y_true`` to
    int32 (int64 stays int64) *before* any dtype conversion (Keras' base class
    converts labels to the loss dtype, which in bfloat16 merges class ids
    above 256), and computes in float32 whatever the dtype of ``y_pred``
    (float64 for float64).

    Args:
        normalize: L2-normalize the embeddings first. Defaults to `True`.
        reduction: see the module docstring. Defaults to
            `"sum_over_batch_size"`, the mean over anchors that have a triplet.
        name: name of the loss instance.
        dtype: dtype of the returned loss value. Defaults to `None`
            (``keras.config.floatx()``).
    """

    #: Mine over the global batch under a ``tf.distribute`` strategy: ``None``
    #: (default) whenever more than one replica is in sync, ``True`` the same,
    #: ``False`` never (each replica mines within its own slice). See the
    #: module docstring for what it costs.
    cross_replica = None

    def __init__(self, normalize=True, reduction="sum_over_batch_size", name=None, dtype=None):
        _check_reduction(reduction)
        super().__init__(name=name, reduction=reduction, dtype=dtype)
        self.normalize = bool(normalize)
        self._config_dtype = dtype

    def per_anchor(self, labels, embeddings, ref_embeddings=None, ref_labels=None, ref_offset=None):
        """Returns ``(losses [B], valid [B])`` in the compute dtype."""
        raise NotImplementedError

    # -- trainable state (e.g. the learnable boundary of MarginLoss) -------------------------

    def _state_layer(self):
        """A ``keras.layers.Layer`` owning the loss's variables, or None."""
        return None

    @property
    def trainable_variables(self):
        """The loss's own trainable variables (empty for most losses)."""
        layer = self._state_layer()
        return [] if layer is None else list(layer.trainable_variables)

    def attach(self, model):
        """Lets ``model`` own this loss's trainable variables, so ``model.fit`` trains them.

        Keras trains ``model.trainable_variables`` only; a loss is not part of
        the model. ``attach`` adds the layer that holds the loss's variables to
        the model as a tracked attribute (it is not part of the model's
        computation). Call it before the optimizer is built, i.e. before the
        first ``fit`` (calling it after ``compile`` is fine), or compile again
        with a new optimizer afterwards. A loss without variables leaves the
        model unchanged.

        A ``keras.Sequential`` model cannot hold state outside its stack of
        layers; wrap it first: ``model = keras.Model(seq.inputs, seq.outputs)``
        (the functional model shares the layers and weights).

        Args:
            model: a functional or subclassed ``keras.Model``.

        Returns:
            ``model``.

        Raises:
            ValueError: for a ``keras.Sequential`` model, or if ``model``'s
                optimizer was already built without these variables.
        """
        layer = self._state_layer()
        if layer is None:
            return model
        if isinstance(model, keras.Sequential):
            raise ValueError(
                f"Loss {self.name!r} cannot attach its variables to the Sequential model "
                f"{model.name!r}: Keras only tracks a Sequential model's stack of layers. "
                "Wrap it in a functional model that shares its layers, "
                "`model = keras.Model(seq.inputs, seq.outputs)`, and attach to that."
            )
        optimizer = getattr(model, "optimizer", None)
        if optimizer is not None and getattr(optimizer, "built", False):
            known = {id(v) for v in getattr(optimizer, "_trainable_variables", [])}
            if not all(id(v) in known for v in layer.trainable_variables):
                raise ValueError(
                    f"The optimizer of model {model.name!r} was already built without the "
                    f"variables of loss {self.name!r}. Call `loss.attach(model)` before the "
                    "first `fit`, or `model.compile(...)` again with a new optimizer after it."
                )
        tracker = getattr(model, "_tracker", None)
        locked = bool(getattr(tracker, "locked", False))
        if locked:
            tracker.unlock()
        try:
            setattr(model, "tfdml_" + re.sub(r"\W", "_", self.name) + "_state", layer)
        finally:
            if locked:
                tracker.lock()
        self._attached = True
        return model

    def _gathering_context(self):
        """The replica context to gather over, or None."""
        if self.cross_replica is not None and not isinstance(self.cross_replica, bool):
            raise ValueError("`cross_replica` must be None, True or False. Received: "
                             f"cross_replica={self.cross_replica!r}")
        if self.cross_replica is False or not tf.distribute.has_strategy():
            return None
        ctx = tf.distribute.get_replica_context()
        if ctx is None or ctx.num_replicas_in_sync <= 1:
            return None
        return ctx

    def __call__(self, y_true, y_pred, sample_weight=None):
        with tf.name_scope(self.name):
            labels = ops.cast_labels(y_true, "y_true")
            ctx = self._gathering_context()
            if ctx is not None:
                return self._cross_replica_call(ctx, labels, y_pred, sample_weight)
            losses, valid = self.per_anchor(labels, y_pred)
            value = reduce_anchor_losses(losses, valid, sample_weight, self.reduction)
            return tf.cast(value, self.dtype)

    def _cross_replica_call(self, ctx, labels, y_pred, sample_weight):
        """The loss over the global batch, gathered from all replicas (module docstring)."""
        labels = tf.reshape(labels, [-1])
        y_pred = tf.convert_to_tensor(y_pred)
        local = tf.shape(labels)[0]
        all_labels = ctx.all_gather(labels, axis=0)
        all_pred = ctx.all_gather(y_pred, axis=0)  # its gradient: summed, then this slice
        if sample_weight is not None:
            sample_weight = tf.cast(tf.convert_to_tensor(sample_weight), y_pred.dtype)
            if sample_weight.shape.rank == 0:
                sample_weight = tf.fill([local], sample_weight)
            sample_weight = ctx.all_gather(tf.reshape(sample_weight, [local]), axis=0)
        losses, valid = self.per_anchor(all_labels, all_pred)
        if self.reduction in ("none", None):
            sizes = ctx.all_gather(tf.reshape(local, [1]), axis=0)
            start = tf.reduce_sum(sizes[: ctx.replica_id_in_sync_group])
            values = reduce_anchor_losses(losses, valid, sample_weight, self.reduction)
            return tf.cast(values[start:start + local], self.dtype)
        value = reduce_anchor_losses(losses, valid, sample_weight, self.reduction)
        if self.reduction == "sum":  # the mean reductions are divided already
            value = _scale_for_distribution(value)
        return tf.cast(value, self.dtype)

    def call(self, y_true, y_pred):
        losses, valid = self.per_anchor(ops.cast_labels(y_true, "y_true"), y_pred)
        return losses * tf.cast(valid, losses.dtype)

    def get_config(self):
        config = super().get_config()
        config["normalize"] = self.normalize
        if self._config_dtype is not None:
            config["dtype"] = keras.dtype_policies.serialize(self._dtype_policy)
        if self.cross_replica is not None:
            config["cross_replica"] = self.cross_replica
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        cross_replica = config.pop("cross_replica", None)
        loss = super().from_config(config)
        loss.cross_replica = cross_replica
        return loss
