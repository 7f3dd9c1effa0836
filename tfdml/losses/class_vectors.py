"""What the proxy and classification losses share: learned per-class vectors and cosines.

A loss of this family compares each embedding with ``C`` learned vectors, one
per class (proxies, class weights) or ``k`` per class (sub-centres, SoftTriple
centres), by the cosine of their angle. The functional forms take the vectors
explicitly (``[C, D]`` or ``[C, k, D]``); the loss classes
(:class:`ClassVectorLoss`) hold them in their :class:`ClassVectors` state, which
:class:`tfdml.models.MetricModel` trains. Both compute the ``[B]`` loss of each
sample with the same function of :class:`ClassInputs`.

Class ids must be in ``[0, C)``, in both forms: eagerly an id outside raises a
ValueError; in a compiled step (XLA, ``jax.jit``, ``torch.compile``), where nothing
can raise, the loss is NaN and its gradient 0, and a ``tf.function`` graph without
XLA also fails an assertion (:func:`prepare_class_inputs`).
"""

from __future__ import annotations

from typing import NamedTuple

import keras
from keras import ops

from tfdml import ops as dml
from tfdml._argument_checks import check_int, check_positive
from tfdml._embeddings import check_batch_sizes, check_embeddings, compute_dtype
from tfdml._labels import is_multi_label, validate_class_ids
from tfdml._shims import dtype_name
from tfdml.losses.base import MetricLoss, functional_value
from tfdml.losses.state import LossState
from tfdml.losses.terms import anchor_terms

__all__ = [
    "constant_like",
    "LOGIT_LIMIT",
    "ClassInputs",
    "ClassVectorLoss",
    "ClassVectors",
    "MarginSoftmaxLoss",
    "check_scale",
    "class_cosines",
    "class_inputs",
    "functional_class_loss",
    "functional_margin_loss",
    "prepare_class_inputs",
    "sample_terms",
    "softmax_cross_entropy",
    "target_cosine",
]


#: The largest magnitude of a cosine logit (scale times a cosine): float32 logits carry
#: rounding errors of 6e-8 of their size, and compiled (XLA) softmaxes, which may round the
#: largest logit differently in the maximum and in the exponentials, return Inf or NaN from
#: logits of about 1e9 on (eagerly, every value NaN from 3.4e38 on).
LOGIT_LIMIT = 1e6


def constant_like(value, like):
    """``value`` as a tensor of the dtype of ``like`` (the logits' compute dtype)."""
    return ops.convert_to_tensor(value, dtype_name(like))


def check_scale(name, value):
    """A factor of the cosines, in ``(0, 1e6]``."""
    value = check_positive(name, value)
    if value > LOGIT_LIMIT:
        raise ValueError(
            f"`{name}` must be a number in (0, 1e6]: it scales cosines into float32 logits, "
            "whose rounding makes a compiled (XLA) softmax Inf or NaN from about 1e9 on. "
            f"Received: {name}={value!r}")
    return value


def prepare_class_inputs(y_true, y_pred, vectors, rank, name="weights"):
    """Validates and casts the inputs of a class-vector loss.

    Args:
        y_true: ``[B]`` / ``[B, 1]`` integer class ids in ``[0, C)``.
        y_pred: ``[B, D]`` embeddings.
        vectors: the class vectors, ``[C, D]`` (``rank=2``) or ``[C, k, D]`` (``rank=3``).
        rank: the rank ``vectors`` must have.
        name: the argument name of ``vectors`` in error messages.

    Returns:
        ``(labels, x, w, valid)``: integer labels, the L2-normalized
        embeddings and class vectors in the compute dtype (float32; float64 for
        float64 embeddings), and whether the class ids are in ``[0, C)``:
        ``True`` when checked eagerly, else a scalar bool tensor that the loss
        value passes through :func:`tfdml.ops.nan_unless` (a compiled step
        cannot raise, so out-of-range ids give a NaN loss there).

    Raises:
        ValueError: for shapes that do not fit, multi-hot label sets, or
            (eagerly) class ids outside ``[0, C)``.
    """
    labels = dml.cast_labels(y_true, "y_true")
    if is_multi_label(labels):
        raise ValueError(
            "A class-vector loss needs one class id per sample (each sample is compared with "
            "the vector of its class); it does not take multi-hot label sets. Received: "
            f"y_true.shape={tuple(labels.shape)}")
    embeddings = check_embeddings(y_pred, "y_pred")
    check_batch_sizes(labels, embeddings, "y_true", "y_pred")
    w = ops.convert_to_tensor(vectors)
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
    dtype = compute_dtype(embeddings.dtype)
    x = dml.l2_normalize(ops.cast(embeddings, dtype))
    w = dml.l2_normalize(ops.cast(w, dtype))
    valid = True
    if shape[0] is not None:
        labels, valid = validate_class_ids(labels, shape[0], (
            f"Class ids (y_true) must index the rows of `{name}`: [0, {shape[0]})."))
    return labels, x, w, valid


def class_cosines(x, w):
    """Cosines ``[B, C]`` of unit embeddings ``[B, D]`` and unit class vectors ``[C, D]``
    (``[B, C, k]`` for ``[C, k, D]``)."""
    if len(w.shape) == 2:
        return dml.matmul(x, ops.transpose(w))
    num_classes, k, dim = w.shape
    flat = dml.matmul(x, ops.transpose(ops.reshape(w, (num_classes * k, dim))))
    return ops.reshape(flat, (-1, num_classes, k))


def class_mask(labels, num_classes):
    """``[B, C]`` boolean: column ``y`` of each row."""
    columns = ops.arange(num_classes, dtype=dtype_name(labels))
    return ops.equal(labels[:, None], columns[None, :])


def target_cosine(cosines, target):
    """Per row the cosine of the target class (``target``: a ``[B, C]`` mask)."""
    dtype = dtype_name(cosines)
    return ops.sum(ops.where(target, cosines, ops.zeros((), dtype)), axis=-1)


def softmax_cross_entropy(logits, target):
    """Per row ``logsumexp(logits) - logits[target]`` (``target``: a ``[B, C]`` mask)."""
    dtype = dtype_name(logits)
    picked = ops.sum(ops.where(target, logits, ops.zeros((), dtype)), axis=-1)
    return ops.logsumexp(logits, axis=-1) - picked


def per_sample_value(losses, x_raw, w, valid=True):
    """The functional forms' mean over the batch, NaN for a NaN/Inf embedding or weight, or
    where ``valid`` (from :func:`prepare_class_inputs`) is false."""
    active = ops.ones(ops.shape(losses), "bool")
    value = functional_value(anchor_terms(losses, active), "anchors", x_raw)
    return dml.nan_unless(dml.nan_unless_finite(value, w), valid)


class ClassVectors(LossState):
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


#: The arguments of a class-vector loss before its own, and after them.
CLASS_HEAD = ("num_classes", "embedding_dim")
CLASS_COMMON = ("initializer", "reduction", "name", "dtype", "average")


class ClassInputs(NamedTuple):
    """The checked inputs of a class-vector loss's terms (:func:`class_inputs`).

    Attributes:
        labels: ``[B]`` integer class ids.
        x: ``[B, D]`` L2-normalized embeddings in the compute dtype.
        vectors: ``[C, D]`` (or ``[C, k, D]``) L2-normalized class vectors.
        valid: whether the class ids are in ``[0, C)``, as
            :func:`prepare_class_inputs` gives it.
        embeddings: the embeddings as given.
        raw_vectors: the class vectors as given.
    """

    labels: object
    x: object
    vectors: object
    valid: object
    embeddings: object
    raw_vectors: object

    def norms(self):
        """``(|embeddings_b| [B], |raw_vectors_c| [C])`` in the compute dtype, for the losses
        whose logits keep the norms (large-margin softmax, SphereFace)."""
        dtype = dtype_name(self.x)
        return tuple(dml.safe_sqrt(ops.sum(ops.square(ops.cast(t, dtype)), axis=-1), epsilon=0.0)
                     for t in (self.embeddings, self.raw_vectors))


def class_inputs(y_true, y_pred, vectors, rank, name="weights") -> ClassInputs:
    """:func:`prepare_class_inputs` as :class:`ClassInputs`, with the raw inputs kept."""
    labels, x, w, valid = prepare_class_inputs(y_true, y_pred, vectors, rank, name)
    return ClassInputs(labels, x, w, valid, y_pred, vectors)


def sample_terms(inputs: ClassInputs, losses):
    """One term per sample: the ``[B]`` ``losses``, NaN for a NaN/Inf class vector or where
    the class ids are out of range (``inputs.valid``), as :class:`AnchorTerms`."""
    losses = dml.nan_unless(dml.nan_unless_finite(losses, inputs.vectors), inputs.valid)
    return anchor_terms(losses, ops.ones(ops.shape(losses), "bool"))


def functional_class_loss(sample_losses, y_true, y_pred, vectors, rank=2, vectors_name="weights",
                          **arguments):
    """The value of a class-vector loss's functional form: the mean over the batch.

    Args:
        sample_losses: ``sample_losses(inputs, **arguments) -> [B]``, the function the
            class's ``terms`` method calls.
        y_true: ``[B]`` / ``[B, 1]`` integer class ids in ``[0, C)``.
        y_pred: ``[B, D]`` embeddings.
        vectors: the class vectors, ``[C, D]`` (``rank=2``) or ``[C, k, D]`` (``rank=3``).
        rank: the rank ``vectors`` must have.
        vectors_name: the argument name of ``vectors``, for error messages.
        **arguments: the loss's own arguments, checked.

    Returns:
        A scalar of the dtype of ``y_pred``; NaN when an embedding or a vector is NaN or
        Inf, or (traced) a class id out of range.
    """
    inputs = class_inputs(y_true, y_pred, vectors, rank, vectors_name)
    return per_sample_value(sample_losses(inputs, **arguments), y_pred, inputs.vectors,
                            inputs.valid)


class ClassVectorLoss(MetricLoss):
    """Base class of the losses with learned per-class vectors (proxies, class weights).

    A subclass follows the contract of :class:`tfdml.losses.MetricLoss`: its
    ``__init__`` passes ``num_classes``, ``embedding_dim``, ``initializer`` and
    its own arguments on (all kept as attributes and in its config), and its
    ``terms(inputs)`` takes :class:`ClassInputs` (labels, unit embeddings and
    unit class vectors) and returns one term per sample (:func:`sample_terms`
    of the ``[B]`` losses that its functional form averages). ``vector_name``
    names the vectors' variable, ``vectors_per_class`` gives their number per
    class (``[C, k, D]``; None for ``[C, D]``). The vectors live in the loss's
    :class:`ClassVectors` state; train with :class:`tfdml.models.MetricModel`,
    which owns it. These losses compare embeddings with the vectors only: they
    take no reference set and no miner, and every sample is an anchor
    (``average="anchors"`` is the mean over the batch).

    Args:
        num_classes: ``C``; class ids must be in ``[0, C)``.
        embedding_dim: ``D``, or None (from the model or the first batch).
        initializer: a Keras initializer for the vectors, or None.
        average: see :mod:`tfdml.losses.terms`.
        reduction: see :mod:`tfdml.losses.terms`.
        name: name of the loss.
        dtype: dtype of the returned value.
        **arguments: the loss's own arguments, checked.
    """

    #: One learned vector per class: each sample has one class.
    multi_label = "each sample is compared with the vector of its class"


    #: The name of the vectors' variable (``"weights"``, ``"proxies"``, ``"centers"``).
    vector_name = "weights"

    takes_reference_set = False

    def __init__(self, num_classes, embedding_dim=None, initializer=None, *, average="anchors",
                 reduction="sum_over_batch_size", name=None, dtype=None, **arguments):
        num_classes = check_int("num_classes", num_classes)
        if embedding_dim is not None:
            embedding_dim = check_int("embedding_dim", embedding_dim)
        if initializer is not None:
            initializer = keras.initializers.get(initializer)
        super().__init__(num_classes=num_classes, embedding_dim=embedding_dim,
                         initializer=initializer, **arguments, normalize=True, average=average,
                         reduction=reduction, name=name, dtype=dtype)

    @property
    def vectors_per_class(self):
        """``k``, the vectors per class (``[C, k, D]``), or None for one (``[C, D]``)."""
        return None

    @property
    def vectors_rank(self) -> int:
        """The rank of the vectors: 2 (``[C, D]``) or 3 (``[C, k, D]``)."""
        return 2 if self.vectors_per_class is None else 3

    def make_state(self):
        return ClassVectors(self.num_classes, self.vectors_per_class, self.initializer,
                            self.vector_name, name=f"{self.name}_state")

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
    def class_vectors(self):
        """The learned vectors (a variable, ``[C, D]`` or ``[C, k, D]``); built on first use."""
        state = self.state
        if not state.built:
            self.build_state()
        return state.vectors

    def prepare(self, labels, embeddings, ref_embeddings=None, ref_labels=None,
                ref_offset=None) -> ClassInputs:
        """The :class:`ClassInputs` of a batch, with the loss's class vectors.

        Raises:
            ValueError: for a reference set, or the errors of
                :func:`prepare_class_inputs`.
        """
        if ref_embeddings is not None or ref_labels is not None:
            raise ValueError(
                f"Loss {self.name!r} compares embeddings with its learned class vectors and "
                "takes no reference set (`ref_embeddings`)."
            )
        return class_inputs(labels, embeddings, self.class_vectors, self.vectors_rank,
                            self.vector_name)


class MarginSoftmaxLoss(ClassVectorLoss):
    """Base class of the margin-softmax losses of a margin and a scale (CosFace, ArcFace,
    L-Softmax, SphereFace).

    A subclass names its per-sample losses ``sample_losses(inputs, margin, scale) -> [B]``
    (the function its functional form averages) and its margin check
    ``check_margin(margin)``, as static methods, and writes its own ``__init__`` with its
    defaults, which passes them on: this ``__init__`` checks the margin and the scale, and
    ``terms`` is :func:`sample_terms` of the per-sample losses.

    Args:
        num_classes, embedding_dim, initializer: as in :class:`ClassVectorLoss`.
        margin: the margin, checked by ``check_margin``.
        scale: the scale, in ``(0, 1e6]`` (:func:`check_scale`).
        average, reduction, name, dtype: as in :class:`ClassVectorLoss`.
        **arguments: the loss's other arguments, checked.
    """

    def __init__(self, num_classes, embedding_dim, initializer, margin, scale, *, average,
                 reduction, name, dtype, **arguments):
        super().__init__(num_classes, embedding_dim, initializer, **arguments,
                         margin=self.check_margin(margin), scale=check_scale("scale", scale),
                         average=average, reduction=reduction, name=name, dtype=dtype)

    @staticmethod
    def check_margin(margin):
        """The checked margin (a subclass's rule)."""
        raise NotImplementedError

    @staticmethod
    def sample_losses(inputs: ClassInputs, margin, scale):
        """The ``[B]`` losses of the samples (a subclass's function)."""
        raise NotImplementedError

    def terms(self, inputs):
        return sample_terms(inputs, self.sample_losses(inputs, self.margin, self.scale))


def functional_margin_loss(loss_class, y_true, y_pred, weights, margin, scale, rank=2):
    """The value of a :class:`MarginSoftmaxLoss` subclass's functional form: its margin
    check, the scale's and its per-sample losses, the mean over the batch
    (:func:`functional_class_loss`)."""
    return functional_class_loss(loss_class.sample_losses, y_true, y_pred, weights, rank=rank,
                                 margin=loss_class.check_margin(margin),
                                 scale=check_scale("scale", scale))
