"""MoCo (He et al. 2020; Chen et al. 2020, 2021): InfoNCE of queries against the keys of a
momentum encoder, with a queue of past keys as negatives.

**Calling convention.** ``loss(y_true=keys, y_pred=queries)``, both the two views stacked
along the batch axis, ``[2N, D] = [view1; view2]``: the queries from the online network
(after its predictor, if any), the keys from the momentum encoder (constants in the
gradient). The query of view 1 of sample ``i`` has as positive the key of view 2 of sample
``i`` and the other way round (the symmetrized loss of MoCo v3 and of the symmetric
MoCo v2 in its appendix).
"""

from __future__ import annotations

import keras
from keras import ops

from tfdml import ops as dml
from tfdml._argument_checks import check_int, check_positive
from tfdml._embeddings import check_embeddings, compute_dtype
from tfdml._shims import dtype_name, replica_context
from tfdml.losses.base import dtype_config
from tfdml.losses.ownership import Ownership, check_loss_state
from tfdml.losses.state import LossState
from tfdml.losses.two_views import split_views

__all__ = ["KeyQueue", "MoCoLoss", "moco_loss"]


def _even_rows(x, name):
    """``([x1; x2], ok)``: the two views of ``x`` (a dynamic odd last row dropped)."""
    x1, x2, ok = split_views(x, name)
    return (x, ok) if ok is True else (ops.concatenate([x1, x2], axis=0), ok)


def _swap_views(keys, name="y_true"):
    """``[k2; k1]`` from ``[k1; k2]``: each query's positive key in its row."""
    k1, k2, _ = split_views(keys, name)
    return ops.concatenate([k2, k1], axis=0)


def _check_same_dim(a, b, names):
    if a.shape[-1] is not None and b.shape[-1] is not None and a.shape[-1] != b.shape[-1]:
        raise ValueError(f"`{names[0]}` and `{names[1]}` must have the same embedding size. "
                         f"Received: {tuple(a.shape)} and {tuple(b.shape)}")


def _moco_values(queries, keys, queue, temperature, names=("y_pred", "y_true")):
    """Per-query InfoNCE terms, one per row of ``queries`` (compute dtype): NaN where an
    input is not finite, everywhere for an odd number of rows."""
    q = check_embeddings(queries, names[0])
    k = check_embeddings(keys, names[1])
    if any(s is not None and t is not None and s != t
           for s, t in zip(q.shape, k.shape, strict=True)):
        raise ValueError(f"`{names[0]}` (queries) and `{names[1]}` (keys) must have the same "
                         f"shape [2N, D]. Received: {tuple(q.shape)} and {tuple(k.shape)}")
    rows = ops.shape(q)[0]
    q, ok = _even_rows(q, names[0])
    k, _ = _even_rows(k, names[1])
    dtype = compute_dtype(q.dtype)
    q = dml.l2_normalize(ops.cast(q, dtype))
    positives = dml.l2_normalize(ops.stop_gradient(ops.cast(_swap_views(k, names[1]), dtype)))
    positive = ops.sum(q * positives, axis=-1) / temperature
    if queue is not None:
        _check_same_dim(q, queue, (names[0], "queue"))
        past = dml.l2_normalize(ops.stop_gradient(ops.cast(queue, dtype)))
        negatives = dml.matmul(q, ops.transpose(past)) / temperature
        logits = ops.concatenate([positive[:, None], negatives], axis=1)
    else:  # MoCo v3: the keys of the other view of every sample of the batch
        q1, q2, _ = split_views(q, names[0])
        p1, p2, _ = split_views(positives, names[1])
        logits = ops.concatenate([dml.matmul(q1, ops.transpose(p1)),
                                  dml.matmul(q2, ops.transpose(p2))], axis=0) / temperature
    values = dml.nan_unless_finite(ops.logsumexp(logits, axis=1) - positive, q, positives)
    if ok is not True:  # a dynamic odd batch: NaN, with one value per row still
        values = ops.concatenate([values, ops.zeros((rows % 2,), dtype)], axis=0)
        values = dml.nan_unless(values, ok)
    return values


def moco_loss(queries, keys, queue=None, temperature=0.2):
    """Functional form of :class:`MoCoLoss`: the mean over the ``2N`` queries.

    Args:
        queries: ``[2N, D]``, the online network's outputs for ``[view1; view2]``.
        keys: ``[2N, D]``, the momentum encoder's outputs for ``[view1; view2]``
            (constants in the gradient).
        queue: ``[K, D]`` past keys, the negatives (MoCo v2); `None`: the keys of the other
            samples' other view (MoCo v3). Defaults to `None`.
        temperature: ``T > 0``. Defaults to `0.2`.

    Returns:
        A scalar of the dtype of ``queries``; NaN when an input is NaN or Inf.

    Raises:
        ValueError: for bad arguments or shapes (an odd number of rows).
    """
    temperature = check_positive("temperature", temperature)
    if queue is not None:
        queue = check_embeddings(queue, "queue")
    values = _moco_values(queries, keys, queue, temperature, names=("queries", "keys"))
    return ops.cast(dml.mean(values), dtype_name(check_embeddings(queries, "queries")))


def _unit_normal(seed):
    normal = keras.initializers.RandomNormal(seed=seed)

    def initializer(shape, dtype=None):
        return dml.l2_normalize(normal(shape, dtype=dtype))

    return initializer


class KeyQueue(LossState):
    """MoCo's queue: ``queue_size`` past keys, oldest out first.

    Variables (non-trainable, float32 / int32): ``keys [K, D]``, initialized with random
    unit vectors (seeded by ``seed``), as the authors' code does, and ``position`` (the
    next row to write). Under a ``tf.distribute`` strategy the first replica's write is
    kept.
    """

    def __init__(self, queue_size, seed=None, **kwargs):
        super().__init__(needs_embedding_dim=True, **kwargs)
        self.queue_size = queue_size
        self.seed = seed

    def make_variables(self, embedding_dim):
        self.keys = self.add_weight(
            shape=(self.queue_size, embedding_dim), initializer=_unit_normal(self.seed),
            dtype="float32", trainable=False, name="keys", aggregation="only_first_replica")
        self.position = self.add_weight(shape=(), initializer="zeros", dtype="int32",
                                        trainable=False, name="position",
                                        aggregation="only_first_replica")

    def enqueue(self, keys):
        """Writes ``keys`` at ``position`` (wrapping around); a batch with a NaN or Inf key
        is not written (it would make the next ``K / 2N`` losses NaN too)."""
        rows = ops.shape(keys)[0]
        keys = ops.cast(ops.stop_gradient(keys), "float32")
        finite = ops.all(ops.isfinite(keys))
        index = (ops.cast(self.position, "int32") + ops.arange(rows, dtype="int32")) % (
            self.queue_size)
        written = ops.scatter_update(self.keys, index[:, None], dml.l2_normalize(
            ops.where(finite, keys, ops.zeros_like(keys))))
        self.keys.assign(ops.where(finite, written, self.keys.value))
        moved = (self.position + ops.cast(rows, "int32")) % self.queue_size
        self.position.assign(ops.where(finite, moved, self.position.value))


@keras.saving.register_keras_serializable(package="tfdml")
class MoCoLoss(keras.losses.Loss):
    """MoCo: InfoNCE of the online queries against the momentum encoder's keys.

    With ``q`` a query (``y_pred``, the module's calling convention), ``k+`` the key of
    the same sample's other view and the negatives ``k-`` (all L2-normalized)::

        L_q = -log( exp(q . k+ / T) / (exp(q . k+ / T) + sum_{k-} exp(q . k- / T)) )

    **averaged over** the ``2N`` queries (``reduction``; ``sample_weight`` per query).

    * ``queue_size > 0`` (MoCo v2): the negatives are a queue of the keys of the last
      ``queue_size / 2N`` batches. The queue starts with random unit vectors, as the
      authors' code does, and every training call writes the batch's ``2N`` keys into it
      after computing the loss (``training=False`` leaves it). It is the loss's state:
      train with :class:`tfdml.models.ContrastiveModel`, which owns, updates (under every
      backend) and saves it.
    * ``queue_size=0`` (MoCo v3): the negatives are the keys of the other view of the other
      samples of the batch; no state. MoCo v3's code multiplies each direction's mean
      by ``2 T`` and sums the two: ``4 T`` times this value, a constant factor.

    MoCo v2 takes ``T = 0.2`` and ``K = 65536``; v3 ``T = 1.0`` (ResNet) or ``0.2``
    (ViT). Under ``keras.distribution`` (JAX) the loss sees the global batch; under a
    ``tf.distribute`` strategy with several replicas it raises a ValueError (it does
    not gather the replicas' keys). NaN or Inf in the queries or keys gives NaN; computed in float32 for float16 and
    bfloat16 inputs.

    Args:
        temperature: ``T > 0``. Defaults to `0.2`.
        queue_size: ``K``, the keys kept (at least the ``2N`` keys of a batch), or 0.
            Defaults to `65536`.
        embedding_dim: ``D``, for the queue. Defaults to `None` (from the model).
        seed: seed of the queue's initial random keys. Defaults to `None`.
        reduction: Keras' reduction of the per-query values. Defaults to
            `"sum_over_batch_size"`.
        name: name of the loss. Defaults to `"moco_loss"`.
        dtype: dtype of the returned value. Defaults to `None` (floatx).

    Examples:

    >>> model = tfdml.models.ContrastiveModel(
    ...     backbone, projector, algorithm="moco",
    ...     loss=tfdml.losses.MoCoLoss(temperature=0.2, queue_size=16384), momentum=0.999)

    Reference:
        He, Fan, Wu, Xie, Girshick, "Momentum contrast for unsupervised visual
        representation learning", CVPR 2020; Chen, Fan, Girshick, He, "Improved baselines
        with momentum contrastive learning", 2020 (v2); Chen, Xie, He, "An empirical study
        of training self-supervised vision transformers", ICCV 2021 (v3).
    """

    def __init__(self, temperature=0.2, queue_size=65536, embedding_dim=None, seed=None, *,
                 reduction="sum_over_batch_size", name="moco_loss", dtype=None):
        self.temperature = check_positive("temperature", temperature)
        self.queue_size = check_int("queue_size", queue_size, minimum=0)
        self.embedding_dim = (None if embedding_dim is None
                              else check_int("embedding_dim", embedding_dim))
        if seed is not None:
            seed = check_int("seed", seed, minimum=0)
        self.seed = seed
        super().__init__(name=name, reduction=reduction, dtype=dtype)
        self._config_dtype = dtype
        self.ownership = Ownership()
        self._state = (KeyQueue(self.queue_size, seed, name=f"{name}_state")
                       if self.queue_size else None)
        if self._state is not None:
            self._state.loss_class_name = type(self).__name__
            if self.embedding_dim is not None:
                self.build_state(self.embedding_dim)

    @property
    def state(self):
        """The :class:`KeyQueue` (``queue_size > 0``), or None."""
        return self._state

    def build_state(self, embedding_dim=None):
        """Creates the queue (once) for keys of size ``embedding_dim``; returns the state.

        Raises:
            ValueError: when no embedding size is known.
        """
        state = self._state
        dim = self.embedding_dim if embedding_dim is None else embedding_dim
        if state is not None and not state.built:
            state.build(None if dim is None else (None, int(dim)))
        elif state is not None and dim is not None and int(dim) != state.embedding_dim:
            raise ValueError(f"The queue of {self.name!r} holds keys of size "
                             f"{state.embedding_dim}; they cannot be compared with embeddings "
                             f"of size {dim}.")
        return state

    def __call__(self, y_true, y_pred, sample_weight=None, training=True):
        """The loss of the queries ``y_pred`` against the keys ``y_true``; ``training``
        writes the keys into the queue.

        Raises:
            ValueError: for bad shapes, a batch of more keys than the queue holds, a
                queue that does not exist yet inside a compiled step, or a call in a
                replica of a ``tf.distribute`` strategy with several replicas.
        """
        check_loss_state(self, y_pred)
        if replica_context() is not None:
            raise ValueError(
                f"{self.name!r}: MoCoLoss does not gather the keys of the replicas of a "
                "tf.distribute strategy (each replica would contrast with its own keys and "
                "the queue would hold the first replica's only). Train MoCo on one device, "
                "or under keras.distribution (JAX), where the loss sees the global batch.")
        if self._state is not None:
            self.build_state(getattr(y_pred, "shape", (None,))[-1])
        rows = getattr(y_true, "shape", (None,))[0]
        if self.queue_size and rows is not None and rows > self.queue_size:
            raise ValueError(f"`queue_size` ({self.queue_size}) must be at least the number "
                             f"of keys of a batch (2N = {rows}).")
        value = super().__call__(y_true, y_pred, sample_weight)
        if training and self._state is not None:
            self._state.enqueue(check_embeddings(y_true, "y_true"))
        return value

    def call(self, y_true, y_pred):
        if self._state is None:
            return _moco_values(y_pred, y_true, None, self.temperature)
        values = _moco_values(y_pred, y_true, self._state.keys, self.temperature)
        # More keys than the queue holds (a batch size known only when the step runs).
        return dml.nan_unless(values, ops.shape(y_true)[0] <= self.queue_size)

    def get_config(self):
        config = {"name": self.name, "reduction": self.reduction,
                  "temperature": self.temperature, "queue_size": self.queue_size,
                  "embedding_dim": self.embedding_dim, "seed": self.seed}
        config.update(dtype_config(self._config_dtype))
        return config
