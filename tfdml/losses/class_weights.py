"""What the proxy and classification losses share: learned per-class vectors and cosines.

A loss of this family compares each embedding with ``C`` learned vectors, one
per class (proxies, class weights) or ``k`` per class (sub-centres, SoftTriple
centres), by the cosine of their angle. The functional forms take the vectors
explicitly (``[C, D]`` or ``[C, k, D]``); the loss classes hold them in their
:class:`ClassWeights` state, which :class:`tfdml.models.MetricModel` trains.

Class ids must be in ``[0, C)``, in both forms: eagerly an id outside raises a
ValueError; in a compiled step (XLA, ``jax.jit``, ``torch.compile``), where nothing
can raise, the loss is NaN and its gradient 0, and a ``tf.function`` graph without
XLA also fails an assertion (:func:`prepare_class_inputs`).
"""

from __future__ import annotations

import keras
from keras import ops

from tfdml import ops as dml
from tfdml._checks import check_int, check_positive
from tfdml.losses.base import LossState, MetricLoss, anchor_terms, functional_value

__all__ = [
    "ClassWeightLoss",
    "ClassWeights",
    "check_scale",
    "class_cosines",
    "prepare_class_inputs",
    "softmax_cross_entropy",
]


# The largest magnitude of a cosine logit (scale times a cosine): float32 logits carry
# rounding errors of 6e-8 of their size, and compiled (XLA) softmaxes, which may round the
# largest logit differently in the maximum and in the exponentials, return Inf or NaN from
# logits of about 1e9 on (eagerly, every value NaN from 3.4e38 on).
_LOGIT_LIMIT = 1e6


def check_scale(name, value):
    """A factor of the cosines, in ``(0, 1e6]``."""
    value = check_positive(name, value)
    if value > _LOGIT_LIMIT:
        raise ValueError(
            f"`{name}` must be a number in (0, 1e6]: it scales cosines into float32 logits, "
            "whose rounding makes a compiled (XLA) softmax Inf or NaN from about 1e9 on. "
            f"Received: {name}={value!r}")
    return value


def prepare_class_inputs(y_true, y_pred, weights, rank, name="weights"):
    """Validates and casts the inputs of a class-weight loss.

    Args:
        y_true: ``[B]`` / ``[B, 1]`` integer class ids in ``[0, C)``.
        y_pred: ``[B, D]`` embeddings.
        weights: ``[C, D]`` (``rank=2``) or ``[C, k, D]`` (``rank=3``).
        rank: the rank ``weights`` must have.
        name: the argument name of ``weights`` in error messages.

    Returns:
        ``(labels, x, w, valid)``: integer labels, the L2-normalized
        embeddings and weights in the compute dtype (float32; float64 for
        float64 embeddings), and whether the class ids are in ``[0, C)``:
        ``True`` when checked eagerly, else a scalar bool tensor that the loss
        value passes through :func:`tfdml.ops.nan_unless` (a compiled step
        cannot raise, so out-of-range ids give a NaN loss there).

    Raises:
        ValueError: for shapes that do not fit, or (eagerly) class ids
            outside ``[0, C)``.
    """
    labels = dml.cast_labels(y_true, "y_true")
    embeddings = dml.check_embeddings(y_pred, "y_pred")
    dml.check_batch_sizes(labels, embeddings, "y_true", "y_pred")
    w = ops.convert_to_tensor(weights)
    shape = tuple(w.shape)
    if len(shape) != rank:
        want = "[num_classes, embedding_dim]" if rank == 2 else (
            "[num_classes, centers_per_class, embedding_dim]")
        raise ValueError(f"`{name}` must have shape {want}. Received: {name}.shape={shape}")
    if shape[-1] is not None and embeddings.shape[-1] is not None and (
            shape[-1] != embeddings.shape[-1]):
        raise ValueError(
            f"`{name}` must have the embedding size of `y_pred` as its last axis. "
            f"Received: {name}.shape={shape}, y_pred.shape={tuple(embeddings.shape)}"
        )
    dtype = dml.compute_dtype(embeddings.dtype)
    x = dml.l2_normalize(ops.cast(embeddings, dtype))
    w = dml.l2_normalize(ops.cast(w, dtype))
    valid = True
    if shape[0] is not None:
        labels, valid = dml.validate_class_ids(labels, shape[0], (
            f"Class ids (y_true) must index the rows of `{name}`: [0, {shape[0]})."))
    return labels, x, w, valid


def class_cosines(x, w):
    """Cosines ``[B, C]`` of unit embeddings ``[B, D]`` and unit weights ``[C, D]``
    (``[B, C, k]`` for ``[C, k, D]``)."""
    if len(w.shape) == 2:
        return dml.matmul(x, ops.transpose(w))
    num_classes, k, dim = w.shape
    flat = dml.matmul(x, ops.transpose(ops.reshape(w, (num_classes * k, dim))))
    return ops.reshape(flat, (-1, num_classes, k))


def class_mask(labels, num_classes):
    """``[B, C]`` boolean: column ``y`` of each row."""
    columns = ops.arange(num_classes, dtype=dml.dtype_name(labels))
    return ops.equal(labels[:, None], columns[None, :])


def softmax_cross_entropy(logits, target):
    """Per row ``logsumexp(logits) - logits[target]`` (``target``: a ``[B, C]`` mask)."""
    dtype = dml.dtype_name(logits)
    picked = ops.sum(ops.where(target, logits, ops.zeros((), dtype)), axis=-1)
    return ops.logsumexp(logits, axis=-1) - picked


def per_sample_value(losses, x_raw, w, valid=True):
    """The functional forms' mean over the batch, NaN for a NaN/Inf embedding or weight, or
    where ``valid`` (from :func:`prepare_class_inputs`) is false."""
    active = ops.ones(ops.shape(losses), "bool")
    value = functional_value(anchor_terms(losses, active), "anchors", x_raw)
    return dml.nan_unless(dml.nan_unless_finite(value, w), valid)


class ClassWeights(LossState):
    """The learned per-class vectors of a loss: ``[C, D]``, or ``[C, k, D]`` with ``k``.

    Args:
        num_classes: ``C``.
        per_class: ``k``, or None for one vector per class (``[C, D]``).
        initializer: a Keras initializer, or None for a normal distribution
            with standard deviation ``1 / sqrt(D)`` (rows of norm about 1).
        variable_name: the variable's name (``"proxies"``, ``"weights"``,
            ``"centers"``).
    """

    def __init__(self, num_classes, per_class=None, initializer=None, variable_name="weights",
                 seed_generators=(), **kwargs):
        super().__init__(seed_generators, needs_embedding_dim=True, **kwargs)
        self.num_classes = num_classes
        self.per_class = per_class
        self.initializer = initializer
        self.variable_name = variable_name

    def make_variables(self, embedding_dim):
        shape = (self.num_classes, embedding_dim) if self.per_class is None else (
            self.num_classes, self.per_class, embedding_dim)
        initializer = self.initializer
        if initializer is None:
            initializer = keras.initializers.RandomNormal(stddev=embedding_dim ** -0.5)
        self.vectors = self.add_weight(shape=shape, initializer=initializer, trainable=True,
                                       name=self.variable_name)


#: The arguments of a class-weight loss before its own, and after them (:func:`loss_class`).
CLASS_HEAD = ("num_classes", "embedding_dim")
CLASS_COMMON = ("initializer", "reduction", "name", "dtype", "average")


class ClassWeightLoss(MetricLoss):
    """Base class of the losses with learned per-class vectors (proxies, class weights).

    A subclass is a spec: ``sample_losses`` (``sample_losses(labels, x, w,
    **arguments)``: the ``[B]`` loss of each sample from integer labels and
    unit embeddings and vectors) and ``check_arguments``, as
    :class:`tfdml.losses.MetricLoss`; ``_variable_name``, ``weights_rank``
    (3 for ``k`` vectors per class) and ``_per_class`` describe the vectors.
    The vectors live in the loss's :class:`ClassWeights` state;
    train with :class:`tfdml.models.MetricModel`, which owns it. These losses
    compare embeddings with the vectors only: they take no reference set and
    no miner, and every sample is an anchor (``average="anchors"`` is the
    mean over the batch).
    """

    _variable_name = "weights"
    #: The rank of the vectors: 2 (``[C, D]``) or 3 (``[C, k, D]``).
    weights_rank = 2
    #: ``sample_losses(labels, x, w, **arguments) -> [B]`` losses.
    sample_losses = None
    #: ``sample_losses`` also takes ``norms``: the norms of the raw embeddings ``[B]`` and
    #: vectors ``[C]`` (losses whose logits keep them: large-margin softmax, SphereFace).
    uses_norms = False

    def __init__(self, num_classes, embedding_dim=None, initializer=None,
                 reduction="sum_over_batch_size", name=None, dtype=None, average="anchors",
                 **arguments):
        self.num_classes = check_int("num_classes", num_classes)
        self.embedding_dim = None if embedding_dim is None else check_int(
            "embedding_dim", embedding_dim)
        self.initializer = keras.initializers.get(initializer) if initializer is not None else None
        super().__init__(normalize=True, reduction=reduction, name=name, dtype=dtype,
                         average=average, **arguments)

    @classmethod
    def functional(cls, y_true, y_pred, weights, weights_name=None, **arguments):
        """The functional form: the mean over the batch, with the vectors given.

        ``weights_name`` names ``weights`` in error messages (the class's
        variable name by default).
        """
        arguments = cls.check_arguments(**arguments)
        labels, x, w, valid = prepare_class_inputs(y_true, y_pred, weights, cls.weights_rank,
                                                   weights_name or cls._variable_name)
        losses = cls.sample_losses(labels, x, w, **arguments,
                                   **cls._norms(y_pred, weights, dml.dtype_name(x)))
        return per_sample_value(losses, y_pred, w, valid)

    @classmethod
    def _norms(cls, y_pred, weights, dtype):
        """``{"norms": (|y_pred_b| [B], |weights_c| [C])}`` for ``uses_norms``, else ``{}``."""
        if not cls.uses_norms:
            return {}
        return {"norms": tuple(
            dml.safe_sqrt(ops.sum(ops.square(ops.cast(t, dtype)), axis=-1), epsilon=0.0)
            for t in (y_pred, weights))}

    @property
    def _per_class(self):
        return None

    def _make_state(self):
        return ClassWeights(self.num_classes, self._per_class, self.initializer,
                            self._variable_name, name=f"{self.name}_state")

    def build_state(self, embedding_dim=None):
        if embedding_dim is None:
            embedding_dim = self.embedding_dim
        elif self.embedding_dim is not None and int(embedding_dim) != self.embedding_dim:
            raise ValueError(
                f"Loss {self.name!r} was built for embeddings of size {self.embedding_dim}; "
                f"the model's are of size {embedding_dim}."
            )
        return super().build_state(embedding_dim)

    @property
    def class_weights(self):
        """The learned vectors (a variable, ``[C, D]`` or ``[C, k, D]``); built on first use."""
        state = self.state
        if not state.built:
            self.build_state()
        return state.vectors

    def per_anchor(self, labels, embeddings, ref_embeddings=None, ref_labels=None, ref_offset=None):
        if ref_embeddings is not None or ref_labels is not None:
            raise ValueError(
                f"Loss {self.name!r} compares embeddings with its learned class vectors and "
                "takes no reference set (`ref_embeddings`)."
            )
        raw_w = self.class_weights
        labels, x, w, valid = prepare_class_inputs(
            labels, embeddings, raw_w, self.weights_rank, self._variable_name)
        losses = self.sample_losses(labels, x, w, **self.arguments,
                                    **self._norms(embeddings, raw_w, dml.dtype_name(x)))
        losses = dml.nan_unless(dml.nan_unless_finite(losses, w), valid)
        active = ops.ones(ops.shape(losses), "bool")
        return anchor_terms(losses, active)

    def get_config(self):
        config = super().get_config()
        config.pop("normalize", None)
        config.update(
            num_classes=self.num_classes,
            embedding_dim=self.embedding_dim,
            initializer=(None if self.initializer is None
                         else keras.initializers.serialize(self.initializer)),
        )
        return config
