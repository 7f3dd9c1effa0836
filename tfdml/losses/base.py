"""The base class of tfdml losses: a loss is a spec, a per-anchor function and its arguments.

A tfdml loss takes ``y_true`` = integer class ids ``[B]`` (or ``[B, 1]``) and
``y_pred`` = embeddings ``[B, D]``. Per anchor it computes the *terms* it
learns from as an :class:`tfdml.losses.terms.AnchorTerms`, averages them as
its paper does (``average=``) and reduces them (``reduction=``, Keras' names);
:mod:`tfdml.losses.terms` defines both, and is the one path from terms to a
value for the loss classes and their functional forms alike.

**One spec per loss.** A loss class sets

* ``terms``: its per-anchor function, ``terms(inputs, **arguments) ->
  AnchorTerms``, where ``inputs`` are the checked, cast and (with
  ``normalize``) L2-normalized embeddings and labels of :func:`prepare_inputs`;
* ``check_arguments(**arguments) -> dict``: validates its own arguments
  (a ValueError naming the argument) and returns the values to keep (a miner
  resolved, numbers as floats);

and its ``__init__`` passes its own arguments to ``MetricLoss.__init__`` as
keywords. The rest comes from the spec: :meth:`MetricLoss.per_anchor`,
``get_config`` (miners and wrapped losses serialized), blocks of anchors
(``block_size``) and :meth:`MetricLoss.functional`, which the functional form
(``tfdml.losses.triplet_nca_loss`` ...) calls, so that both forms validate,
compute and reduce the same way.

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

Under ``tf.distribute`` a loss mines over the global batch
(:mod:`tfdml.losses.replicas`). A loss's variables (learned, buffers, the seeds
of random miners) live in its :class:`tfdml.losses.state.LossState`, which the
:class:`tfdml.models.MetricModel` training it owns.
"""

from __future__ import annotations

import functools
import warnings
from typing import NamedTuple

import keras
from keras import ops

from tfdml import ops as dml
from tfdml.losses import replicas
from tfdml.losses.blocks import _random_miners, blocked_terms, check_block_size
from tfdml.losses.state import LossState
from tfdml.losses.terms import (
    AVERAGES,
    HALVES,
    AnchorTerms,
    anchor_terms,
    average_terms,
    check_average,
    check_reduction,
    check_sample_weight,
    pair_terms,
    reduce_anchor_losses,
    reduce_terms,
    split_pair_terms,
    triplet_terms,
)
from tfdml.miners import AllPairsMiner, Miner, Pairs, Triplets, as_pairs, as_triplets

__all__ = [
    "AVERAGES",
    "AnchorTerms",
    "Inputs",
    "LossState",
    "MetricLoss",
    "anchor_terms",
    "average_terms",
    "check_average",
    "check_sample_weight",
    "functional_value",
    "mined_pairs",
    "mined_triplets",
    "pair_terms",
    "prepare_inputs",
    "reduce_anchor_losses",
    "reduce_terms",
    "resolve_loss",
    "resolve_miner",
    "split_pair_terms",
    "triplet_terms",
]


class Inputs(NamedTuple):
    """The checked inputs of a per-anchor function (:func:`prepare_inputs`).

    Attributes:
        labels: ``[B]`` integer class ids of the anchors.
        x: ``[B, D]`` embeddings in the compute dtype.
        ref_labels: ``[R]`` class ids of the reference set.
        ref: ``[R, D]`` reference set (``x`` itself without one).
        ref_offset: anchor ``i`` is row ``i + ref_offset`` of ``ref`` (0 for
            the batch itself), or None when the anchors are not in it.
    """

    labels: object
    x: object
    ref_labels: object
    ref: object
    ref_offset: object

    @property
    def batch_is_reference(self) -> bool:
        """The reference set is the batch itself (no ``ref_embeddings`` were given)."""
        return self.ref is self.x


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
        :class:`Inputs` ``(labels, x, ref_labels, ref, ref_offset)``: integer
        labels, the embeddings in the compute dtype (float32, or float64 for
        float64 input), L2-normalized if ``normalize``, and the same for the
        reference set (the batch itself when ``ref_embeddings`` is None, with
        offset 0).

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
        return Inputs(labels, x, labels, x, 0)
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
    return Inputs(labels, x, ref_labels, ref, ref_offset)


def mined_pairs(inputs: Inputs, scores, miner: Miner) -> Pairs:
    """The pairs ``miner`` keeps, mined on the ``[B, R]`` ``scores`` (higher: more similar)."""
    labels, x, ref_labels, ref, ref_offset = inputs
    return as_pairs(miner.mine(scores, labels, ref_labels, ref_offset, x, ref),
                    num_ref=ops.shape(scores)[1])


def mined_triplets(inputs: Inputs, scores, miner: Miner) -> Triplets:
    """The triplets ``miner`` keeps, mined on the ``[B, R]`` ``scores`` (higher: more
    similar)."""
    labels, x, ref_labels, ref, ref_offset = inputs
    return as_triplets(miner.mine(scores, labels, ref_labels, ref_offset, x, ref))


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


def functional_value(terms: AnchorTerms, average, y_pred, ref_embeddings=None,
                     normalized: bool = True):
    """The value a functional form returns: :func:`reduce_terms` with the default reduction.

    NaN when ``y_pred`` or ``ref_embeddings`` holds a NaN or Inf (and, for a
    loss that did not L2-normalize them, when their distances could
    overflow); cast to the dtype of ``y_pred``.
    """
    value = reduce_terms(terms, average, (y_pred, ref_embeddings), normalized)
    return ops.cast(value, dml.dtype_name(ops.convert_to_tensor(y_pred)))


def _check_loss_average(cls, average):
    """:func:`check_average`, and the :data:`HALVES` averages only for a loss whose terms
    split (a wrapper, without a ``terms`` function of its own, is checked when it reduces)."""
    check_average(average)
    if average in HALVES and cls.terms is not None and not cls.split_terms:
        raise ValueError(
            f"{cls.__name__} cannot take `average={average!r}`: it averages the positive and "
            "the negative pairs of a pair loss apart, and this loss's terms do not split into "
            f"the two. Received: average={average!r}")


def _config_value(value):
    """A loss argument as its config holds it: miners and losses serialized."""
    if isinstance(value, (Miner, keras.losses.Loss)):
        return keras.saving.serialize_keras_object(value)
    return value


class MetricLoss(keras.losses.Loss):
    """Base class of tfdml losses: labels + embeddings in, terms per anchor, averaged, reduced.

    A subclass is a spec (module docstring): ``terms``, ``check_arguments``
    and an ``__init__`` that passes its own arguments on as keywords. Losses
    that compute their terms otherwise (wrappers, losses with learned class
    vectors) override :meth:`per_anchor` or :meth:`compute_terms` instead.
    ``__call__`` casts ``y_true`` to integer ids *before* any dtype conversion
    (Keras' base class converts labels to the loss dtype, which in bfloat16
    merges class ids above 256), and computes in float32 whatever the dtype of
    ``y_pred`` (float64 for float64).

    Args:
        normalize: L2-normalize the embeddings first. Defaults to `True`.
        reduction: see :mod:`tfdml.losses.terms`. Defaults to
            `"sum_over_batch_size"`.
        name: name of the loss instance.
        dtype: dtype of the returned loss value. Defaults to `None`
            (``keras.config.floatx()``).
        average: what the loss averages over: ``"anchors"``, ``"batch"``,
            ``"terms"``, ``"nonzero"`` or, for a pair loss whose terms split,
            ``"halves"`` / ``"halves_terms"`` (:mod:`tfdml.losses.terms`).
            Defaults to `"anchors"`; each loss sets its paper's.
        block_size: compute the loss over blocks of this many anchors, each
            against the whole batch, recomputing each block in the backward
            pass (:mod:`tfdml.losses.blocks`): peak memory ``O(block_size x
            B)`` instead of ``O(B^2)``, same values and gradients. `None`
            computes the whole batch at once. Defaults to `None`.
        **arguments: the loss's own arguments (its spec's), checked by
            ``check_arguments`` and kept as attributes of the same names.
    """

    #: The per-anchor function of the loss: ``terms(inputs, **arguments) -> AnchorTerms``.
    terms = None

    _miner = None

    #: The loss's terms split into its positive and its negative pairs (``[B, 2]`` fields,
    #: :func:`tfdml.losses.terms.split_pair_terms`), so that it takes ``average="halves"``.
    split_terms = False

    #: Mine over the global batch under a ``tf.distribute`` strategy: ``None``
    #: (default) whenever more than one replica is in sync, ``True`` the same,
    #: ``False`` never (each replica mines within its own slice). See
    #: :mod:`tfdml.losses.replicas` for what it costs.
    cross_replica = None

    @staticmethod
    def check_arguments(**arguments) -> dict:
        """The loss's own arguments, checked, as the loss keeps them (subclasses)."""
        return arguments

    def __init__(self, normalize=True, reduction="sum_over_batch_size", name=None, dtype=None,
                 average="anchors", block_size=None, **arguments):
        check_reduction(reduction)
        block_size = check_block_size(block_size)
        _check_loss_average(type(self), average)
        arguments = self.check_arguments(**arguments)
        super().__init__(name=name, reduction=reduction, dtype=dtype)
        self.block_size = block_size
        self.normalize = bool(normalize)
        self.average = average
        self._config_dtype = dtype
        self._warned_inactive = False
        self._state = None
        self._state_made = False
        self._argument_names = tuple(arguments)
        for key, value in arguments.items():
            setattr(self, key, value)

    def check_spec(self):
        """Checks that need the whole loss (its arguments and ``block_size``); subclasses."""

    @property
    def arguments(self) -> dict:
        """The loss's own arguments (those of its spec), as ``terms`` takes them."""
        return {key: getattr(self, key) for key in self._argument_names}

    @classmethod
    def functional(cls, y_true, y_pred, ref_embeddings=None, ref_labels=None, ref_offset=None,
                   *, normalize=True, average="anchors", **arguments):
        """The loss's functional form: the default reduction, without a loss object.

        The same checks, terms and reduction as the class; the value has the
        dtype of ``y_pred``. ``ref_embeddings`` (``[R, D]``) and ``ref_labels``
        (``[R]``) replace the batch as the set positives and negatives are
        mined from; anchor ``i`` is row ``i + ref_offset`` of it (excluded
        from its positives), or not in it for ``ref_offset=None``.
        """
        _check_loss_average(cls, average)
        arguments = cls.check_arguments(**arguments)
        inputs = prepare_inputs(y_true, y_pred, ref_embeddings, ref_labels, ref_offset, normalize)
        return functional_value(cls.terms(inputs, **arguments), average, y_pred, ref_embeddings,
                                normalize)

    def per_anchor(self, labels, embeddings, ref_embeddings=None, ref_labels=None, ref_offset=None):
        """Returns the :class:`AnchorTerms` of each anchor, in the compute dtype."""
        if type(self).terms is None:
            raise NotImplementedError(f"{type(self).__name__} sets no `terms` function.")
        inputs = prepare_inputs(labels, embeddings, ref_embeddings, ref_labels, ref_offset,
                                self.normalize)
        return self.terms(inputs, **self.arguments)

    @property
    def miner(self):
        """The loss's :class:`tfdml.miners.Miner`, or None for a loss without one."""
        return self._miner

    @miner.setter
    def miner(self, miner):
        if miner is not None and self.block_size is not None and not getattr(
                miner, "blockwise", True):
            raise ValueError(
                f"{type(self).__name__} cannot run in blocks with {type(miner).__name__}: it "
                "selects over the whole batch (it ranks or bins all pairs, or visits the "
                "anchors in order), so blocks of anchors would select other pairs than the "
                "whole batch does. Remove `block_size` or use a per-anchor miner. "
                f"Received: block_size={self.block_size!r}, miner={miner!r}")
        self._miner = miner

    def compute_terms(self, labels, embeddings, ref_embeddings=None, ref_labels=None,
                      ref_offset=None, training=True):
        """:meth:`per_anchor`, over blocks of ``block_size`` anchors when it is set.

        Wrapping losses (:class:`CrossBatchMemory`, :class:`TrimmedLoss`) call
        this on the loss they wrap, so the wrapped loss's ``block_size`` holds.
        A batch no larger than ``block_size`` is one block: :meth:`per_anchor`.
        ``training=False`` (evaluation) leaves buffers such as a memory bank
        unchanged; a loss without buffers ignores it.
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
                             self.trainable_variables, split=self.split_terms)

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

    # -- the loss value ----------------------------------------------------------------------

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
                stacklevel=5,
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
        from tfdml.metric_model import check_loss_state  # the model owns the loss's state

        check_loss_state(self, y_pred)
        with keras.name_scope(self.name):
            labels = dml.cast_labels(y_true, "y_true")
            sample_weight, weights_ok = check_sample_weight(sample_weight)
            value = replicas.call_over_replicas(
                functools.partial(self.loss_value, training=training), self.cross_replica,
                labels, y_pred, sample_weight, self.reduction)
            return dml.nan_unless(ops.cast(value, self.dtype), weights_ok)

    def loss_value(self, labels, y_pred, sample_weight=None, training=True):
        """The reduced loss of a batch (the global batch under a strategy), not cast."""
        terms = self.compute_terms(labels, y_pred, training=training)
        self._warn_if_inactive(terms)
        return reduce_terms(terms, self.average, (y_pred,), self.normalize, sample_weight,
                            self.reduction)

    def call(self, y_true, y_pred):
        terms = self.compute_terms(dml.cast_labels(y_true, "y_true"), y_pred, training=False)
        values, _ = average_terms(terms, self.average)
        return dml.nan_unless_finite(values, y_pred, distances=not self.normalize)

    def get_config(self):
        config = super().get_config()
        config["normalize"] = self.normalize
        config["average"] = self.average
        if self._config_dtype is not None:
            config["dtype"] = keras.dtype_policies.serialize(
                keras.dtype_policies.get(self._config_dtype))
        if self.cross_replica is not None:
            config["cross_replica"] = self.cross_replica
        if self.block_size is not None:
            config["block_size"] = self.block_size
        config.update({key: _config_value(value) for key, value in self.arguments.items()})
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        cross_replica = config.pop("cross_replica", None)
        loss = super().from_config(config)
        loss.cross_replica = cross_replica
        return loss
