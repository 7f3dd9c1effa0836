"""Two augmented views of each sample, stacked: the calling convention, the base of the
losses of the whole batch of views (:class:`WholeBatchViewsLoss`: VICReg and Barlow Twins,
in :mod:`tfdml.losses.self_supervised`) and :class:`SelfSupervisedLoss`, which trains any
tfdml loss on the views without labels.

**Calling convention.** In Keras' ``loss(y_true, y_pred)`` form, ``y_pred`` holds the two
views stacked along the batch axis: ``[2N, D] = concatenate([view1, view2], axis=0)``, so
that rows ``i`` and ``N + i`` are the two views of sample ``i`` (a model outputs
``keras.ops.concatenate([f(a), f(b)], axis=0)``). ``y_true`` is ignored: None, or any
labels (of ``2N`` or ``N`` rows) a dataset yields. An odd number of rows is a ValueError
eagerly (and wherever the batch size is known when the step is traced); in a compiled step
with a dynamic batch size the loss is NaN instead, which ``keras.callbacks.TerminateOnNaN``
stops.
"""

from __future__ import annotations

import keras
from keras import ops

from tfdml import ops as dml
from tfdml._embeddings import check_embeddings
from tfdml._shims import replica_context
from tfdml.losses.base import dtype_config, resolve_loss
from tfdml.losses.terms import AnchorTerms
from tfdml.losses.wrapper import LossWrapper

__all__ = ["SelfSupervisedLoss", "WholeBatchViewsLoss", "split_views"]


def split_views(y_pred, name: str = "y_pred"):
    """``(view1, view2, ok)``: the two halves of ``[2N, D]`` stacked views (module docstring).

    ``ok`` is ``True`` where the number of rows is known (an odd one raises), else a scalar
    bool tensor, false for an odd number of rows (pass the loss through
    :func:`tfdml.ops.nan_unless`).

    Raises:
        ValueError: for embeddings that are not ``[2N, D]`` floats with a known even ``2N``.
    """
    y_pred = check_embeddings(y_pred, name)
    rows = y_pred.shape[0]
    if rows is not None:
        if rows % 2:
            raise ValueError(
                f"`{name}` must hold two views stacked along the batch axis, [2N, D] = "
                f"concatenate([view1, view2], axis=0): an even number of rows. "
                f"Received: {name}.shape={tuple(y_pred.shape)}")
        half = rows // 2
        return y_pred[:half], y_pred[half:], True
    rows = ops.shape(y_pred)[0]
    half = rows // 2
    return y_pred[:half], y_pred[half:2 * half], ops.equal(rows % 2, 0)


class WholeBatchViewsLoss(keras.losses.Loss):
    """The base of the losses of the whole batch of two stacked views (VICReg, Barlow
    Twins): ``y_pred = [Z; Z']`` (the module's calling convention), ``y_true`` ignored, one
    number for the batch (no per-sample loss: no ``reduction``, no ``sample_weight``).

    A subclass checks its arguments, passes them to ``__init__`` as keywords (they become
    attributes and config entries), and implements ``value(z1, z2)``: the loss of two
    ``[N, D]`` views in their compute dtype (float32 for float16 and bfloat16 views),
    NaN for non-finite ones.
    """

    def __init__(self, *, name=None, dtype=None, **arguments):
        super().__init__(name=name, dtype=dtype)
        self._config_dtype = dtype
        self._argument_names = tuple(arguments)
        for key, value in arguments.items():
            setattr(self, key, value)

    @property
    def arguments(self) -> dict:
        return {key: getattr(self, key) for key in self._argument_names}

    def value(self, z1, z2):  # pragma: no cover - abstract
        raise NotImplementedError

    def __call__(self, y_true, y_pred, sample_weight=None):
        """The loss of the stacked views ``y_pred``; ``y_true`` is ignored.

        Raises:
            ValueError: for a ``sample_weight``, or ``y_pred`` that is not ``[2N, D]``.
        """
        if sample_weight is not None:
            raise ValueError(
                f"{type(self).__name__} takes no `sample_weight`: its terms are of the whole "
                "batch, not sums over samples.")
        with keras.name_scope(self.name):
            return self.call(y_true, y_pred)

    def call(self, y_true, y_pred):
        z1, z2, ok = split_views(y_pred)
        return dml.nan_unless(ops.cast(self.value(z1, z2), self.dtype), ok)

    def get_config(self):
        config = {"name": self.name, **self.arguments}
        config.update(dtype_config(self._config_dtype))
        return config


# -- SelfSupervisedLoss -------------------------------------------------------------------------


def _view_labels(rows):
    """``[2N]`` int32 ids ``[0..N-1, 0..N-1]`` for ``rows = 2N`` stacked rows."""
    half = rows // 2
    ids = ops.arange(half, dtype="int32")
    return ops.concatenate([ids, ids], axis=0)


@keras.saving.register_keras_serializable(package="tfdml")
class SelfSupervisedLoss(LossWrapper):
    """Any tfdml loss on two views of each sample, the views of a sample its only positives.

    ``y_pred`` is the two views stacked, ``[2N, D]`` (module docstring); ``y_true`` is
    ignored. Sample ``i`` gets id ``i`` in both views:

    * ``symmetric=True``: the wrapped loss on all ``2N`` rows with labels
      ``[0..N-1, 0..N-1]``: every row is an anchor, its other view its positive and the
      other ``2N - 2`` rows its negatives (SimCLR's setting with
      :class:`NTXentLoss`);
    * ``symmetric=False``: the first view's rows are the anchors and the second view is
      the reference set (``ref_embeddings``, ``ref_offset=None``): anchor ``i``'s positive
      is row ``i`` of the second view, its negatives the other ``N - 1`` rows. The
      second view's rows are no anchors (0 under ``reduction="none"``).

    The value is the wrapped loss's, averaged as it averages (``average``, its own by
    default). The wrapped loss's state (learned variables, a miner's seed) is this
    loss's: train it with :class:`tfdml.models.MetricModel`. Under ``tf.distribute`` each
    replica gathers every replica's views (``symmetric=True``; see :meth:`__call__`).

    Args:
        loss: a tfdml loss (a :class:`tfdml.losses.MetricLoss`), or its serialized config.
            Its reduction is ignored.
        symmetric: see above. Defaults to `True`.
        reduction: see :mod:`tfdml.losses.terms`. Defaults to `"sum_over_batch_size"`.
        average: Defaults to `None`, the wrapped loss's.
        name: name of the loss. Defaults to `"self_supervised_" + loss.name`.
        dtype: dtype of the returned value. Defaults to `None` (floatx).

    Examples:

    >>> loss = tfdml.losses.SelfSupervisedLoss(tfdml.losses.NTXentLoss(temperature=0.1))
    >>> model = tfdml.models.MetricModel(two_view_embedder, loss)  # outputs [2N, D]
    >>> model.fit([first_views, second_views], np.zeros(n))  # MetricModel wants a y

    Reference:
        pytorch-metric-learning's ``SelfSupervisedLoss``; Chen, Kornblith, Norouzi,
        Hinton, "A simple framework for contrastive learning of visual representations",
        ICML 2020 (the symmetric setting).
    """

    #: It makes its own reference set from the views (``symmetric=False``).
    takes_reference_set = False

    @property
    def cross_replica(self):
        """Gather the views of every replica (``None``: whenever more than one is in sync)
        when ``symmetric``; False otherwise (the reference set is the replica's own second
        view)."""
        return None if self.symmetric else False

    @cross_replica.setter
    def cross_replica(self, value):
        if value and not self.symmetric:
            raise ValueError("SelfSupervisedLoss(symmetric=False) computes over each replica's "
                             f"own views: `cross_replica` must be False or None. "
                             f"Received: {value!r}")

    def __init__(self, loss, symmetric: bool = True, *, average=None,
                 reduction="sum_over_batch_size", name=None, dtype=None):
        loss = resolve_loss(loss)
        if not isinstance(symmetric, bool):
            raise ValueError(f"`symmetric` must be True or False. Received: symmetric={symmetric!r}")
        super().__init__(loss=loss, symmetric=symmetric, normalize=loss.normalize,
                         average=loss.average if average is None else average,
                         reduction=reduction, name=name or f"self_supervised_{loss.name}",
                         dtype=dtype)

    @staticmethod
    def _even(y_pred, sample_weight=None):
        """``(y_pred, labels, sample_weight, ok)``: the views' ids; with an odd dynamic batch
        size (``ok`` false: the loss is NaN) the last row is dropped, so shapes agree."""
        y_pred = check_embeddings(y_pred, "y_pred")
        _, _, ok = split_views(y_pred)
        if ok is not True:
            rows = 2 * (ops.shape(y_pred)[0] // 2)
            y_pred = y_pred[:rows]
            if sample_weight is not None and len(ops.shape(sample_weight)) > 0:
                sample_weight = ops.convert_to_tensor(sample_weight)[:rows]
        rows = y_pred.shape[0] if y_pred.shape[0] is not None else ops.shape(y_pred)[0]
        return y_pred, _view_labels(rows), sample_weight, ok

    def __call__(self, y_true, y_pred, sample_weight=None, training=True):
        """The loss of the stacked views ``y_pred`` (``y_true`` is ignored); see
        :meth:`MetricLoss.__call__` for ``sample_weight`` (``[2N]``) and ``training``.

        Under a ``tf.distribute`` strategy with ``symmetric=True``, each replica's samples
        get ids of their own (offset by the replica's id), and the loss sees every
        replica's views: each row's negatives are the other ``2 N_global - 2`` rows, as on
        one device with the global batch.
        """
        y_pred, labels, sample_weight, ok = self._even(y_pred, sample_weight)
        ctx = replica_context() if self.symmetric else None
        if ctx is not None:
            rows = ops.shape(labels)[0]
            labels = labels + ops.cast(ctx.replica_id_in_sync_group * rows, labels.dtype)
        return dml.nan_unless(super().__call__(labels, y_pred, sample_weight, training), ok)

    def loss_value(self, labels, y_pred, sample_weight=None, training=True):
        """With ``symmetric=True``, the wrapped loss on the rows with the ids ``__call__``
        gave them (every replica's views under a strategy); else :meth:`compute_terms`."""
        if not self.symmetric:
            return super().loss_value(labels, y_pred, sample_weight, training)
        return self.reduced(self.loss.compute_terms(labels, y_pred, training=training), y_pred,
                            sample_weight)

    def call(self, y_true, y_pred):
        y_pred, labels, _, ok = self._even(y_pred)
        return dml.nan_unless(super().call(labels, y_pred), ok)

    def compute_terms(self, labels, embeddings, ref_embeddings=None, ref_labels=None,
                      ref_offset=None, training=True):
        """The wrapped loss's terms on the views (``labels`` are made from the rows)."""
        if ref_embeddings is not None:
            raise ValueError("SelfSupervisedLoss makes its own reference set from the two "
                             "views; it takes no `ref_embeddings`.")
        embeddings = check_embeddings(embeddings, "y_pred")
        z1, z2, _ = split_views(embeddings)
        rows = embeddings.shape[0] if embeddings.shape[0] is not None else ops.shape(
            embeddings)[0]
        labels = _view_labels(rows)
        if self.symmetric:
            return self.loss.compute_terms(labels, embeddings, training=training)
        half = labels[:rows // 2]
        terms = self.loss.compute_terms(half, z1, z2, half, None, training=training)
        return AnchorTerms(*(ops.concatenate([t, ops.zeros_like(t)], axis=0) for t in terms))
