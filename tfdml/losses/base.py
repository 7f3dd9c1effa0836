"""The base class of tfdml losses and the plumbing their functional forms share.

A tfdml loss takes ``y_true`` = integer class ids ``[B]`` (or ``[B, 1]``) and
``y_pred`` = embeddings ``[B, D]``. Per anchor it computes the *terms* it
learns from (one per mined triplet, per mined pair, or one per anchor for
losses such as the multi-similarity loss that are defined per anchor) as an
:class:`AnchorTerms`: the sum of the anchor's term losses, the number of
terms and the number of non-zero terms. An anchor without terms (no
positive, no negative, nothing mined) is *inactive*.

**What a loss averages over** (``average=``; each loss's default follows its
paper and the authors' code, see docs/losses.md):

* ``"anchors"``: per anchor the mean over its terms, then the mean over the
  active anchors;
* ``"batch"``: per anchor the mean over its terms, then the sum divided by
  the batch size (inactive anchors count as 0; Wang et al.'s MS loss);
* ``"terms"``: the sum over all terms divided by their number (the mean over
  all mined triplets or pairs);
* ``"nonzero"``: the sum over all terms divided by the number of terms with
  a non-zero loss (Wu et al.'s margin loss).

**Reductions** (``reduction=``, Keras' names). With ``v_a`` the anchor's
value (its mean for ``"anchors"``/``"batch"``, its sum for
``"terms"``/``"nonzero"``), ``c_a`` its share of the denominator and ``w_a``
the sample weight (1 without one):

* ``"sum_over_batch_size"`` / ``"mean"`` (default):
  ``sum_a w_a v_a / sum_a c_a``;
* ``"mean_with_sample_weight"``: ``sum_a w_a v_a / sum_a w_a c_a``;
* ``"sum"``: ``sum_a w_a v_a``;
* ``"none"`` / ``None``: the ``[B]`` values ``w_a v_a`` (0 for inactive
  anchors).

**Why ``MetricLoss`` reduces itself** instead of leaving it to
``keras.losses.Loss.__call__``: Keras converts ``y_true`` to the loss's dtype
before ``call`` (class ids 256 and 257 are one bfloat16 number, and float32
merges ids above 2^24), and its mean reductions divide by the batch size or the
summed sample weights, where these losses divide by their shares ``c_a``
(active anchors, mined terms, non-zero terms). ``call`` still returns the
per-anchor values for code that uses Keras' plumbing directly.

A batch where no anchor is active gives 0 with zero gradients (eagerly the
loss warns once; ``tfdml.metrics.ActiveAnchors`` logs the fraction of active
anchors during ``fit``). A NaN or Inf anywhere in the embeddings (or the
reference set) gives a NaN loss, for every reduction, so that
``keras.callbacks.TerminateOnNaN`` fires. So do finite embeddings whose
distances overflow, for a loss that does not L2-normalize them
(``normalize=False``: float32 norms above about 9.2e18); normalization itself
is exact for every finite embedding (:func:`tfdml.ops.l2_normalize`).

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

import warnings
import weakref
from typing import NamedTuple

import keras
import numpy as np
from keras import ops

from tfdml import ops as dml
from tfdml.losses.blocks import _random_miners, blocked_terms, check_block_size
from tfdml.miners import AllPairsMiner, Miner, Pairs

__all__ = [
    "AVERAGES",
    "AnchorTerms",
    "MetricLoss",
    "anchor_terms",
    "average_terms",
    "check_average",
    "check_sample_weight",
    "functional_value",
    "pair_terms",
    "prepare_inputs",
    "reduce_anchor_losses",
    "resolve_loss",
    "resolve_miner",
    "triplet_terms",
]

_REDUCTIONS = ("sum_over_batch_size", "mean", "mean_with_sample_weight", "sum", "none", None)

#: What a loss can average over; see the module docstring.
AVERAGES = ("anchors", "batch", "terms", "nonzero")


class AnchorTerms(NamedTuple):
    """Per anchor: the loss terms it learns from, summed and counted.

    Attributes:
        total: ``[B]`` sum of the anchor's term losses.
        count: ``[B]`` number of terms (0: the anchor is inactive). May be
            fractional where a loss shares a term between two anchors.
        nonzero: ``[B]`` number of terms with a loss above 0.
    """

    total: object
    count: object
    nonzero: object

    @property
    def active(self):
        """``[B]`` bool: the anchor has at least one term."""
        return self.count > 0

    def plus(self, other: AnchorTerms) -> AnchorTerms:
        """Both sets of terms of each anchor (e.g. its positive and its negative pairs)."""
        return AnchorTerms(*(a + b for a, b in zip(self, other, strict=True)))


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
        ``(labels, x, ref_labels, ref, ref_offset)``: integer labels, the
        embeddings in the compute dtype (float32, or float64 for float64
        input), L2-normalized if ``normalize``, and the same for the reference
        set (the batch itself when ``ref_embeddings`` is None, with offset 0).

    Raises:
        ValueError: for embeddings that are not rank 2, labels that are not
            ``[B]``/``[B, 1]`` integer ids, batch sizes that differ, a
            reference set with embeddings but no labels (or the reverse), or
            a ``ref_offset`` that puts the anchors outside the reference set.
    """
    labels = dml.cast_labels(labels, "y_true")
    embeddings = dml.check_embeddings(embeddings, "y_pred")
    dml.check_batch_sizes(labels, embeddings, "y_true", "y_pred")
    dtype = dml.compute_dtype(embeddings.dtype)
    x = ops.cast(embeddings, dtype)
    if normalize:
        x = dml.l2_normalize(x)
    if ref_embeddings is None:
        if ref_labels is not None:
            raise ValueError(
                "`ref_labels` was given without `ref_embeddings`. Pass both or neither."
            )
        return labels, x, labels, x, 0
    if ref_labels is None:
        raise ValueError("`ref_embeddings` was given without `ref_labels`. Pass both or neither.")
    ref_labels = dml.cast_labels(ref_labels, "ref_labels")
    ref = dml.check_embeddings(ref_embeddings, "ref_embeddings")
    dml.check_batch_sizes(ref_labels, ref, "ref_labels", "ref_embeddings")
    if ref.shape[-1] is not None and x.shape[-1] is not None and ref.shape[-1] != x.shape[-1]:
        raise ValueError(
            "`ref_embeddings` must have the same embedding size as `y_pred`. "
            f"Received: ref_embeddings.shape={ref.shape}, y_pred.shape={embeddings.shape}"
        )
    batch = x.shape[0] if x.shape[0] is not None else ops.shape(x)[0]
    num_ref = ref.shape[0] if ref.shape[0] is not None else ops.shape(ref)[0]
    ref_offset = dml.check_ref_offset(ref_offset, batch, num_ref)
    ref = ops.cast(ref, dtype)
    if normalize:
        ref = dml.l2_normalize(ref)
    return labels, x, ref_labels, ref, ref_offset


def _nonzero(values):
    return values > ops.zeros((), dml.dtype_name(values))


def triplet_terms(values, mask) -> AnchorTerms:
    """Per anchor, the terms ``values`` where ``mask`` is true (one per triplet or pair).

    Args:
        values: per-term losses, broadcastable to ``mask``, whose first axis
            is the anchor.
        mask: boolean, ``[B, ...]``.
    """
    values = ops.broadcast_to(values, ops.shape(mask))
    axes = tuple(range(1, len(mask.shape)))
    dtype = dml.dtype_name(values)
    weights = ops.cast(mask, dtype)
    total = ops.sum(ops.where(mask, values, ops.zeros((), dtype)), axis=axes)
    nonzero = ops.sum(ops.cast(ops.logical_and(mask, _nonzero(values)), dtype), axis=axes)
    return AnchorTerms(total, ops.sum(weights, axis=axes), nonzero)


def pair_terms(positive_values, negative_values, pairs: Pairs) -> AnchorTerms:
    """Per anchor, one term per mined positive pair and per mined negative pair.

    Args:
        positive_values: ``[B, R]`` loss of each pair if it were a positive pair.
        negative_values: ``[B, R]`` loss of each pair if it were a negative pair.
        pairs: the mined :class:`tfdml.miners.Pairs`.
    """
    return triplet_terms(positive_values, pairs.positive).plus(
        triplet_terms(negative_values, pairs.negative))


def anchor_terms(losses, active) -> AnchorTerms:
    """One term per active anchor, for losses defined per anchor (MS, histogram, LoOp pairs)."""
    dtype = dml.dtype_name(losses)
    count = ops.cast(active, dtype)
    total = ops.where(active, losses, ops.zeros((), dtype))
    return AnchorTerms(total, count, ops.cast(ops.logical_and(active, _nonzero(losses)), dtype))


def check_average(average):
    if average not in AVERAGES:
        raise ValueError(f"`average` must be one of {AVERAGES}. Received: average={average!r}")
    return average


def average_terms(terms: AnchorTerms, average: str):
    """``(values, shares)``: per anchor ``v_a`` and ``c_a`` of the module docstring."""
    check_average(average)
    if average in ("anchors", "batch"):
        values = dml.divide_no_nan(terms.total, terms.count)
        if average == "anchors":
            return values, ops.cast(terms.active, dml.dtype_name(values))
        return values, ops.ones_like(values)
    return terms.total, terms.count if average == "terms" else terms.nonzero


def functional_value(terms: AnchorTerms, average, y_pred, ref_embeddings=None,
                     normalized: bool = True):
    """The scalar a functional loss returns: ``sum v_a / sum c_a`` (0 without active anchor).

    NaN when ``y_pred`` or ``ref_embeddings`` holds a NaN or Inf, and, for a
    loss that did not L2-normalize them (``normalized=False``), when their
    distances or dot products could overflow
    (:func:`tfdml.ops.nan_unless_finite` with ``distances=True``); cast to the
    dtype of ``y_pred``.
    """
    values, shares = average_terms(terms, average)
    value = dml.divide_no_nan(ops.sum(values), ops.sum(shares))
    value = dml.nan_unless_finite(value, y_pred, ref_embeddings, distances=not normalized)
    return ops.cast(value, dml.dtype_name(ops.convert_to_tensor(y_pred)))


def _differentiated(y_pred) -> bool:
    """``y_pred`` is a PyTorch tensor in an autograd graph (a training step runs eagerly)."""
    if keras.backend.backend() != "torch":
        return False
    import torch

    return isinstance(y_pred, torch.Tensor) and y_pred.requires_grad and torch.is_grad_enabled()


def _tf_replicas() -> int:
    """Replicas in sync under a ``tf.distribute`` strategy (1 on other backends)."""
    if keras.backend.backend() != "tensorflow":
        return 1
    import tensorflow as tf

    return tf.distribute.get_strategy().num_replicas_in_sync


def _scale_for_distribution(value):
    replicas = _tf_replicas()
    if replicas > 1:
        value = value * ops.cast(1.0 / replicas, dml.dtype_name(value))
    return value


def reduce_anchor_losses(values, shares, sample_weight=None, reduction="sum_over_batch_size"):
    """Reduces per-anchor values and denominator shares as described in the module docstring."""
    _check_reduction(reduction)
    weights = ops.ones_like(values)
    if sample_weight is not None:
        sample_weight = ops.cast(sample_weight, dml.dtype_name(values))
        if len(sample_weight.shape) == 2 and sample_weight.shape[-1] == 1:
            sample_weight = ops.squeeze(sample_weight, axis=-1)
        weights = weights * sample_weight
    weighted = values * weights
    if reduction in ("none", None):
        return weighted
    total = ops.sum(weighted)
    if reduction == "sum":
        return total
    if reduction == "mean_with_sample_weight":
        denominator = ops.sum(shares * weights)
    else:
        denominator = ops.sum(shares)
    return _scale_for_distribution(dml.divide_no_nan(total, denominator))


def check_sample_weight(sample_weight):
    """``(sample_weight, valid)``: sample weights must be finite and ``>= 0``.

    A weight scales a sample's share of the loss (0 leaves it out); a negative
    one would turn the loss around. Eagerly a negative weight raises a
    ValueError; when traced (a compiled step cannot raise) ``valid`` is a
    scalar bool tensor, false for a negative weight, that the loss value
    passes through :func:`tfdml.ops.nan_unless`: a NaN loss, which
    ``keras.callbacks.TerminateOnNaN`` stops. A NaN or Inf weight gives a NaN
    loss in both cases. ``valid`` is ``True`` for no weights or weights
    checked eagerly.

    Raises:
        ValueError: eagerly, for a negative weight.
    """
    if sample_weight is None:
        return None, True
    sample_weight = ops.convert_to_tensor(sample_weight)
    if dml.is_traced(sample_weight):
        return sample_weight, ops.logical_and(ops.all(sample_weight >= 0),
                                               dml.all_finite(sample_weight))
    values = ops.convert_to_numpy(sample_weight)
    if np.any(values < 0):
        raise ValueError(
            "`sample_weight` must be >= 0: a weight scales a sample's share of the loss "
            "(0 leaves it out). Received: sample_weight="
            f"{np.array2string(np.asarray(values), threshold=8)}"
        )
    return sample_weight, True if np.all(np.isfinite(values)) else dml.all_finite(sample_weight)


def _check_reduction(reduction):
    if reduction not in _REDUCTIONS:
        raise ValueError(f"`reduction` must be one of {_REDUCTIONS}. Received: reduction={reduction!r}")


def resolve_miner(miner, default_factory):
    """A Miner instance from ``miner``.

    ``"default"`` gives the loss's own miner (``default_factory()``, the
    paper's); ``None`` gives :class:`tfdml.miners.AllPairsMiner` (no mining:
    every positive and negative pair), for every loss alike; a serialized
    dict is deserialized.
    """
    if isinstance(miner, str) and miner == "default":
        return default_factory()
    if miner is None:
        return AllPairsMiner()
    if isinstance(miner, dict):
        miner = keras.saving.deserialize_keras_object(miner)
    if not isinstance(miner, Miner):
        raise ValueError(
            "`miner` must be a tfdml.miners.Miner instance, \"default\" (the loss's own "
            f"miner) or None (no mining: every pair). Received: miner={miner!r}"
        )
    return miner


def resolve_loss(loss):
    """A tfdml loss from ``loss`` (an instance, or its serialized config).

    Raises:
        ValueError: for anything but a :class:`MetricLoss`.
    """
    if isinstance(loss, dict):
        loss = keras.saving.deserialize_keras_object(loss)
    if not isinstance(loss, MetricLoss):
        raise ValueError(
            f"`loss` must be a tfdml loss (tfdml.losses.MetricLoss). Received: loss={loss!r}"
        )
    return loss


class LossState(keras.layers.Layer):
    """The variables of a loss, in a layer that a model owns (:class:`tfdml.models.MetricModel`).

    A loss's state is everything that changes while it trains: the seed of a
    random miner (``keras.random.SeedGenerator``, a non-trainable variable),
    learned variables (:class:`MarginLoss`'s beta, the proxies and class
    weights of the proxy and classification losses) and buffers
    (:class:`CrossBatchMemory`'s bank). Each loss keeps them in one
    ``LossState``, which holds the states of wrapped losses as sublayers. The
    layer is not part of any computation (``call`` returns its input): it is
    the one place where the variables live, so that a model that tracks it
    trains, saves, restores and (under JAX) updates them like its own.

    Subclasses create their variables in ``build_state(embedding_dim)``,
    called once by :meth:`build` with ``input_shape = (None, embedding_dim)``.

    Args:
        seed_generators: the ``keras.random.SeedGenerator`` of the loss's
            miners.
        children: the ``LossState`` of wrapped losses.
        needs_embedding_dim: the variables' shapes depend on the embedding
            size (proxies, memory banks).
    """

    def __init__(self, seed_generators=(), children=(), needs_embedding_dim=False, **kwargs):
        kwargs.setdefault("dtype", "float32")
        super().__init__(**kwargs)
        self.seed_generators = list(seed_generators)
        self.wrapped_states = [c for c in children if c is not None]
        self.needs_embedding_dim = bool(needs_embedding_dim) or any(
            c.needs_embedding_dim for c in self.wrapped_states)
        self.embedding_dim = None

    def build(self, input_shape=None):
        dim = None if input_shape is None else input_shape[-1]
        if self.needs_embedding_dim:
            if dim is None:
                raise ValueError(
                    f"The state of loss {self.name!r} depends on the embedding size, which "
                    "is not known: build the embedding model first (give it an Input) or "
                    "pass `embedding_dim` to the loss."
                )
            self.embedding_dim = int(dim)
        for child in self.wrapped_states:
            if not child.built:
                child.build(input_shape)
        self.build_state(self.embedding_dim)
        self.built = True

    def build_state(self, embedding_dim):
        """Creates the variables (subclasses); ``embedding_dim`` may be None."""

    def call(self, inputs):
        return inputs

    # -- saving and loading: a state loads only into the state of the same loss -------------------

    #: The entry of a saved state that names the class of its loss.
    LOSS_CLASS_KEY = "loss_class"
    #: The class name of the loss that owns this state (set by ``MetricLoss.state``).
    loss_class_name = None

    def save_own_variables(self, store):
        """Saves the variables as Keras does, and the class name of the loss."""
        super().save_own_variables(store)
        if self.loss_class_name:
            store[self.LOSS_CLASS_KEY] = np.frombuffer(self.loss_class_name.encode(), np.uint8)

    def load_own_variables(self, store):
        """Loads the variables as Keras does, after checking that they fit.

        Raises:
            ValueError: when ``store`` holds the state of another loss class
                (files written since the class is saved), or other variables:
                another number, or other shapes (e.g. another ``num_classes``
                or embedding size). The message says what differs; it is also
                kept in ``load_problem`` (``None`` after a successful load),
                where :meth:`tfdml.models.MetricModel.load_weights` reads it to
                name the file.
        """
        mine = {}
        super().save_own_variables(mine)  # this state's variables, keyed as Keras saves them
        keys = [k for k in store.keys() if k != self.LOSS_CLASS_KEY]
        if not keys and mine and getattr(self, "load_problem", None):
            # Keras tries the other paths to this layer after a failure (with nothing there):
            # keep the first, real, problem.
            raise ValueError(f"Cannot load the state of loss {self.loss_class_name or self.name}: "
                             f"{self.load_problem}.")
        problems = []
        saved_class = None
        if self.LOSS_CLASS_KEY in store.keys():
            saved_class = bytes(np.asarray(store[self.LOSS_CLASS_KEY], np.uint8)).decode(
                errors="replace")
        if saved_class and self.loss_class_name and saved_class != self.loss_class_name:
            problems.append(f"it holds the state of {saved_class}, and this model's loss is "
                            f"{self.loss_class_name}")
        if sorted(keys) != sorted(mine):
            names = [v.name for v in mine.values()]
            problems.append(f"it holds {len(keys)} variable(s) for the state {self.name!r} of "
                            f"{saved_class or 'its loss'}, and this model's has {len(mine)} "
                            f"{names}")
        else:
            for key, variable in mine.items():
                saved, own = tuple(store[key].shape), tuple(variable.shape)
                if saved != own:
                    problems.append(f"variable {variable.name!r} of {self.name!r} has shape "
                                    f"{saved} in the file and {own} in this model"
                                    f"{self._shape_note(saved, own)}")
        if problems:
            self.load_problem = "; ".join(problems)
            raise ValueError(f"Cannot load the state of loss {self.loss_class_name or self.name}: "
                             f"{self.load_problem}.")
        self.load_problem = None
        super().load_own_variables({k: store[k] for k in keys})

    def _shape_note(self, saved, own):
        """What a shape difference means: the number of classes or the embedding size."""
        notes = []
        num_classes = getattr(self, "num_classes", None)
        if num_classes is not None and saved[:1] != own[:1] and own[:1] == (num_classes,):
            notes.append(f"num_classes={saved[0]} in the file, {num_classes} here")
        if (self.needs_embedding_dim and saved[-1:] != own[-1:]
                and own[-1:] == (self.embedding_dim,)):
            notes.append(f"embedding size {saved[-1]} in the file, {self.embedding_dim} here")
        return f" ({'; '.join(notes)})" if notes else ""


class MetricLoss(keras.losses.Loss):
    """Base class of tfdml losses: labels + embeddings in, terms per anchor, averaged, reduced.

    Subclasses implement :meth:`per_anchor`. ``__call__`` casts ``y_true`` to
    integer ids *before* any dtype conversion (Keras' base class converts
    labels to the loss dtype, which in bfloat16 merges class ids above 256),
    and computes in float32 whatever the dtype of ``y_pred`` (float64 for
    float64).

    Args:
        normalize: L2-normalize the embeddings first. Defaults to `True`.
        average: what the loss averages over: ``"anchors"``, ``"batch"``,
            ``"terms"`` or ``"nonzero"`` (module docstring). Defaults to
            `"anchors"`; each loss sets its paper's.
        reduction: see the module docstring. Defaults to
            `"sum_over_batch_size"`.
        name: name of the loss instance.
        dtype: dtype of the returned loss value. Defaults to `None`
            (``keras.config.floatx()``).
        block_size: compute the loss over blocks of this many anchors, each
            against the whole batch, recomputing each block in the backward
            pass (:mod:`tfdml.losses.blocks`): peak memory ``O(block_size x
            B)`` instead of ``O(B^2)``, same values and gradients. `None`
            computes the whole batch at once. Defaults to `None`.
    """

    _miner = None

    #: Mine over the global batch under a ``tf.distribute`` strategy: ``None``
    #: (default) whenever more than one replica is in sync, ``True`` the same,
    #: ``False`` never (each replica mines within its own slice). See the
    #: module docstring for what it costs.
    cross_replica = None

    def __init__(self, normalize=True, reduction="sum_over_batch_size", name=None, dtype=None,
                 average="anchors", block_size=None):
        _check_reduction(reduction)
        block_size = check_block_size(block_size)
        super().__init__(name=name, reduction=reduction, dtype=dtype)
        self.block_size = block_size
        self.normalize = bool(normalize)
        self.average = check_average(average)
        self._config_dtype = dtype
        self._warned_inactive = False
        self._warned_state = False
        self._owner_ref = None  # a weak reference: the model refers to the loss already
        self._state = None
        self._state_made = False
        self._state_built_in_call = False  # by _prepare_state, not by build_state or a model
        self._training = True

    def per_anchor(self, labels, embeddings, ref_embeddings=None, ref_labels=None, ref_offset=None):
        """Returns the :class:`AnchorTerms` of each anchor, in the compute dtype."""
        raise NotImplementedError

    @property
    def miner(self):
        """The loss's :class:`tfdml.miners.Miner`, or None for a loss without one."""
        return self._miner

    @miner.setter
    def miner(self, miner):
        if miner is not None and self.block_size is not None and getattr(miner, "disjoint", False):
            raise ValueError(
                f"{type(self).__name__} cannot run in blocks with a disjoint miner: it visits "
                "the anchors of the whole batch in order. Remove `block_size` or use "
                f"`disjoint=False`. Received: block_size={self.block_size!r}, miner={miner!r}")
        self._miner = miner

    def compute_terms(self, labels, embeddings, ref_embeddings=None, ref_labels=None,
                      ref_offset=None):
        """:meth:`per_anchor`, over blocks of ``block_size`` anchors when it is set.

        Wrapping losses (:class:`CrossBatchMemory`, :class:`TrimmedLoss`) call
        this on the loss they wrap, so the wrapped loss's ``block_size`` holds.
        A batch no larger than ``block_size`` is one block: :meth:`per_anchor`.
        """
        rows = getattr(embeddings, "shape", (None,))[0]
        if self.block_size is None or (rows is not None and rows <= self.block_size):
            return self.per_anchor(labels, embeddings, ref_embeddings, ref_labels, ref_offset)
        return self.per_anchor_in_blocks(labels, embeddings, ref_embeddings, ref_labels,
                                         ref_offset)

    def per_anchor_in_blocks(self, labels, embeddings, ref_embeddings=None, ref_labels=None,
                             ref_offset=None):
        """:meth:`per_anchor` over blocks of anchors, each against the whole reference set.

        The generic form (:func:`tfdml.losses.blocks.blocked_terms`) calls
        :meth:`per_anchor` on each block with ``ref_offset``; losses whose terms
        couple the whole batch (histograms, label pairs) override it.
        """
        return blocked_terms(self.per_anchor, labels, embeddings, self.block_size,
                             ref_embeddings, ref_labels, ref_offset, _random_miners(self),
                             self.trainable_variables)

    # -- state: learned variables, buffers and the random miners' seeds ------------------------

    def _make_state(self):
        """The :class:`LossState` of this loss, or None (subclasses add their variables).

        By default it holds the seed generators of the loss's random miners (a
        deterministic loss has no state).
        """
        generators = self._seed_generators()
        if not generators:
            return None
        return LossState(generators, name=f"{self.name}_state")

    def _seed_generators(self):
        """The ``keras.random.SeedGenerator`` of the miners this loss uses (wrapped losses too)."""
        found = []
        miner = getattr(self, "miner", None)
        if isinstance(miner, Miner) and miner.seed_generator is not None:
            found.append(miner.seed_generator)
        wrapped = getattr(self, "loss", None)
        if isinstance(wrapped, MetricLoss):
            found.extend(g for g in wrapped._seed_generators() if all(g is not f for f in found))
        return found

    @property
    def state(self):
        """The :class:`LossState` layer holding this loss's variables, or None without state."""
        if not self._state_made:
            self._state = self._make_state()
            self._state_made = True
            if self._state is not None and self._state.loss_class_name is None:
                # Saved with the variables, which then load into this class only. A wrapper
                # that shares its wrapped loss's state (TrimmedLoss) keeps the wrapped class.
                self._state.loss_class_name = type(self).__name__
        return self._state

    def build_state(self, embedding_dim=None):
        """Creates the loss's variables (once) and returns its :class:`LossState` (or None).

        :class:`tfdml.models.MetricModel` calls it with the embedding size of
        its model; call it yourself in a custom training loop before the first
        compiled step.

        Args:
            embedding_dim: the size ``D`` of the embeddings. Needed by losses
                whose variables have that size (proxies, class weights, a
                memory bank).

        Raises:
            ValueError: when the loss needs ``embedding_dim`` and none is known.
        """
        state = self.state
        if state is not None and not state.built:
            state.build(None if embedding_dim is None else (None, int(embedding_dim)))
        return state

    @property
    def trainable_variables(self):
        """The loss's learned variables (empty for most losses)."""
        state = self.state
        return [] if state is None or not state.built else list(state.trainable_variables)

    @property
    def variables(self):
        """All of the loss's variables: learned ones, buffers and seed states."""
        state = self.state
        return [] if state is None or not state.built else list(state.variables)

    def _owner(self):
        """The :class:`tfdml.models.MetricModel` that owns this loss's state, or None."""
        return None if self._owner_ref is None else self._owner_ref()

    def _set_owner(self, model):
        owner = self._owner()
        if owner is not None and owner is not model:
            raise ValueError(
                f"Loss {self.name!r} already belongs to the model {owner.name!r}: a "
                "loss with state (learned variables, a memory bank or a random miner's seed) "
                "can train one model at a time. Create another loss for another model."
            )
        self._owner_ref = weakref.ref(model)
        wrapped = getattr(self, "loss", None)
        if isinstance(wrapped, MetricLoss):
            wrapped._set_owner(model)

    def _set_training(self, training):
        self._training = bool(training)
        wrapped = getattr(self, "loss", None)
        if isinstance(wrapped, MetricLoss):
            wrapped._set_training(training)

    def _prepare_state(self, y_pred):
        """Builds the state on first use eagerly; checks who trains it when traced."""
        state = self.state
        if state is None:
            return
        if not state.built:
            if dml.is_traced(y_pred) and state.needs_embedding_dim:
                raise self._unowned_state_error(
                    "has variables (e.g. proxies or a memory bank) that do not exist yet, and "
                    "they cannot be created inside a compiled step")
            self.build_state(y_pred.shape[-1])
            self._state_built_in_call = True
        if (self._state_built_in_call and state.needs_embedding_dim and self._owner() is None
                and _differentiated(y_pred) and state.trainable_variables):
            # PyTorch trains eagerly (Keras builds the loss in a first call without gradients):
            # variables the loss created itself are in no model's optimizer.
            raise self._unowned_state_error(
                "created its learned variables (e.g. proxies) on its first call, outside any "
                "model, and is trained by a model that does not own them: they would never "
                "change")
        if self._owner() is not None or self._warned_state or not dml.is_traced(y_pred):
            return
        learned = bool(state.trainable_variables)
        if learned or (keras.backend.backend() == "jax" and (
                state.needs_embedding_dim or self._seed_generators())):
            self._warned_state = True
            what = ("learned variables that no model trains" if learned else
                    "a memory bank that a compiled JAX step does not update" if
                    state.needs_embedding_dim else
                    "a random miner, whose seed state a compiled JAX step does not update: "
                    "the same samples would be drawn at every step")
            warnings.warn(
                f"Loss {self.name!r} has {what}. Train with "
                "`tfdml.models.MetricModel(model, loss)`, which owns the loss's state.",
                stacklevel=4,
            )

    def _unowned_state_error(self, what):
        return ValueError(
            f"Loss {self.name!r} {what}. Train with `tfdml.models.MetricModel(model, loss)`, "
            "which owns them, or call `loss.build_state(embedding_dim)` before the first step "
            "(and train `loss.trainable_variables` yourself)."
        )

    def _gathering_context(self):
        """The replica context to gather over, or None."""
        if self.cross_replica is not None and not isinstance(self.cross_replica, bool):
            raise ValueError("`cross_replica` must be None, True or False. Received: "
                             f"cross_replica={self.cross_replica!r}")
        if self.cross_replica is False or keras.backend.backend() != "tensorflow":
            return None
        import tensorflow as tf

        if not tf.distribute.has_strategy():
            return None
        ctx = tf.distribute.get_replica_context()
        if ctx is None or ctx.num_replicas_in_sync <= 1:
            return None
        return ctx

    def _reduce(self, terms, sample_weight, inputs):
        values, shares = average_terms(terms, self.average)
        value = reduce_anchor_losses(values, shares, sample_weight, self.reduction)
        return dml.nan_unless_finite(value, inputs, distances=not self.normalize)

    def _warn_if_inactive(self, terms):
        """Eagerly, once per loss: say so when no anchor of a batch has anything to learn."""
        if self._warned_inactive or dml.is_traced(terms.count):
            return
        if not bool(ops.convert_to_numpy(ops.any(terms.active))):
            self._warned_inactive = True
            warnings.warn(
                f"Loss {self.name!r}: no anchor of this batch has a positive and a negative "
                "(or nothing was mined), so the loss is 0 and nothing is learned. Batches need "
                "several samples of each class, e.g. tfdml.data.pk_batches; "
                "tfdml.metrics.ActiveAnchors logs the fraction of active anchors in fit.",
                stacklevel=3,
            )

    def __call__(self, y_true, y_pred, sample_weight=None, training=True):
        """The reduced loss; ``training=False`` (evaluation) leaves buffers such as a
        memory bank unchanged. :class:`tfdml.models.MetricModel` passes it.

        ``sample_weight`` (a scalar, ``[B]`` or ``[B, 1]``) must be finite and
        ``>= 0`` (:func:`check_sample_weight`): a compiled step returns NaN
        otherwise.

        Raises:
            ValueError: eagerly, for a negative ``sample_weight`` or labels
                that are not integer class ids; for learned variables (proxies,
                class weights) that would be created inside a compiled or
                differentiated step without a :class:`tfdml.models.MetricModel`
                to train them.
        """
        self._prepare_state(y_pred)
        self._set_training(training)
        with keras.name_scope(self.name):
            labels = dml.cast_labels(y_true, "y_true")
            sample_weight, weights_ok = check_sample_weight(sample_weight)
            ctx = self._gathering_context()
            if ctx is not None:
                value = self._cross_replica_call(ctx, labels, y_pred, sample_weight)
            else:
                value = ops.cast(self._loss_value(labels, y_pred, sample_weight), self.dtype)
            return dml.nan_unless(value, weights_ok)

    def _loss_value(self, labels, y_pred, sample_weight):
        """The reduced loss of a batch (the global batch under a strategy)."""
        terms = self.compute_terms(labels, y_pred)
        self._warn_if_inactive(terms)
        return self._reduce(terms, sample_weight, y_pred)

    def _cross_replica_call(self, ctx, labels, y_pred, sample_weight):
        """The loss over the global batch, gathered from all replicas (module docstring)."""
        import tensorflow as tf  # only reached under a tf.distribute strategy

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
        value = self._loss_value(all_labels, all_pred, sample_weight)
        if self.reduction in ("none", None):
            sizes = ctx.all_gather(tf.reshape(local, [1]), axis=0)
            start = tf.reduce_sum(sizes[: ctx.replica_id_in_sync_group])
            return tf.cast(value[start:start + local], self.dtype)
        if self.reduction == "sum":  # the mean reductions are divided already
            value = _scale_for_distribution(value)
        return tf.cast(value, self.dtype)

    def call(self, y_true, y_pred):
        terms = self.compute_terms(dml.cast_labels(y_true, "y_true"), y_pred)
        values, _ = average_terms(terms, self.average)
        return dml.nan_unless_finite(values, y_pred, distances=not self.normalize)

    def get_config(self):
        config = super().get_config()
        config["normalize"] = self.normalize
        config["average"] = self.average
        if self._config_dtype is not None:
            config["dtype"] = keras.dtype_policies.serialize(self._dtype_policy)
        if self.cross_replica is not None:
            config["cross_replica"] = self.cross_replica
        if self.block_size is not None:
            config["block_size"] = self.block_size
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        cross_replica = config.pop("cross_replica", None)
        loss = super().from_config(config)
        loss.cross_replica = cross_replica
        return loss
