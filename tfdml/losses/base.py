"""The base class of tfdml losses, and the one contract every loss is written to.

A tfdml loss takes ``y_true`` = integer class ids ``[B]`` (or ``[B, 1]``) and
``y_pred`` = embeddings ``[B, D]``. Per anchor it computes the *terms* it
learns from as an :class:`tfdml.losses.terms.AnchorTerms`, averages them as
its paper does (``average=``) and reduces them (``reduction=``, Keras' names);
:mod:`tfdml.losses.terms` defines both, and is the one path from terms to a
value for the loss classes and their functional forms alike.

**The contract.** A loss class (a :class:`MetricLoss`) has

* an ``__init__`` with named arguments: its own first (checked there, a
  ValueError naming the argument), then after a ``*`` the shared ones
  (``normalize``, ``average``, ``reduction``, ``name``, ``dtype``,
  ``block_size``: those it takes), all passed on to ``MetricLoss.__init__`` as
  keywords. Its own arguments become attributes of the same names and entries
  of its config;
* a ``terms(inputs) -> AnchorTerms`` method: its terms per anchor, from the
  checked, cast and (with ``normalize``) L2-normalized embeddings and labels
  (:class:`Inputs`, from :func:`prepare_inputs`).

Optional, each named for what it does:

* ``make_state()``: the loss's :class:`tfdml.losses.state.LossState` (learned
  variables, buffers), made once at the end of ``MetricLoss.__init__``. By
  default the seeds of its random miners, or None;
* ``blockwise = False``: the loss's terms couple the whole batch (histograms,
  pairs of samples), so that blocks of anchors against the batch would change
  them; its ``terms`` then runs over blocks itself when
  :meth:`MetricLoss.uses_blocks` says so. Otherwise ``block_size`` computes
  the terms of blocks of anchors (:mod:`tfdml.losses.row_blocks`), with no code
  in the loss;
* ``split_terms = True``: a pair loss whose terms split into its positive and
  negative pairs (``[B, 2]`` fields), so that it takes ``average="halves"``;
* ``takes_reference_set = False``: a loss that works on the batch alone;
* ``prepare(...)``: the inputs of ``terms``, for a family of losses that
  takes other ones (:class:`tfdml.losses.class_vectors.ClassVectorLoss`: the
  unit embeddings and the loss's unit class vectors, :class:`ClassInputs
  <tfdml.losses.class_vectors.ClassInputs>`);
* a check that needs the whole loss (a miner with a ``block_size``): at the end
  of its ``__init__``.

Everything else comes from the base class: :meth:`MetricLoss.per_anchor` and
:meth:`MetricLoss.compute_terms` (the entry points other code calls), blocks,
``get_config`` (miners and wrapped losses serialized), the state's ownership and
the reduction. The functional form of a loss (``tfdml.losses.triplet_nca_loss``
...) is built from the class by :func:`tfdml.losses.functional_form`: the same
arguments and defaults, and a call makes the loss and returns
:meth:`MetricLoss.functional`, so that both forms validate, compute and reduce the
same way.

Losses that wrap other losses (:class:`tfdml.losses.wrapper.LossWrapper`:
trimmed, cross-batch memory, two views, sums) compute their terms from those
of the losses they wrap, in ``compute_terms``; a loss whose buffer a training
step updates (the dynamic soft margin loss's histogram) does too. A loss whose
value is not a reduction of terms per anchor (Proxy Anchor: a sum over
proxies) computes it in ``loss_value``.

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
import inspect
import warnings

import keras
from keras import ops

from tfdml import ops as dml
from tfdml._argument_checks import check_int
from tfdml._labels import is_multi_label, multi_hot_ok
from tfdml._shims import dtype_name, is_traced
from tfdml.losses.inputs import Inputs, prepare_inputs
from tfdml.losses.ownership import Ownership, check_loss_state, loss_owner
from tfdml.losses.replicas import call_over_replicas
from tfdml.losses.row_blocks import blocked_terms
from tfdml.losses.state import LossState
from tfdml.losses.terms import (
    HALVES,
    AnchorTerms,
    average_terms,
    check_average,
    check_reduction,
    check_sample_weight,
    reduce_terms,
)
from tfdml.miners import Miner

__all__ = [
    "MetricLoss",
    "check_loss_average",
    "dtype_config",
    "functional_value",
    "random_miners",
    "resolve_loss",
]


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
    return ops.cast(value, dtype_name(ops.convert_to_tensor(y_pred)))


def check_loss_average(cls, average):
    """:func:`check_average`, and the :data:`HALVES` averages only for a loss whose terms
    split (``cls.split_terms``; None for a wrapper, whose wrapped loss is checked when it
    reduces)."""
    check_average(average)
    if average in HALVES and cls.split_terms is False:
        raise ValueError(
            f"{cls.__name__} cannot take `average={average!r}`: it averages the positive and "
            "the negative pairs apart, and this loss's terms do not split into the two. Use "
            f"'anchors', 'batch', 'terms' or 'nonzero'. Received: average={average!r}")
    return average


def refuse_label_sets(loss_class, labels):
    """Raises a ValueError for multi-hot ``[B, L]`` labels given to a loss class that needs
    one class id per sample (:attr:`MetricLoss.multi_label` is a string saying why)."""
    if loss_class.multi_label is not True and is_multi_label(labels):
        raise ValueError(
            f"{loss_class.__name__} needs one class id per sample ({loss_class.multi_label}); "
            f"it does not take multi-hot label sets. Received: y_true.shape="
            f"{tuple(labels.shape)}. Use a pair or triplet loss (e.g. "
            "MultiSimilarityLoss, SupConLoss), which take them.")


def random_miners(loss):
    """The miners of ``loss`` and of the losses it wraps (at any depth) that draw with a seed
    generator, each once."""
    found = []
    miner = loss.miner
    if miner is not None and getattr(miner, "seed_generator", None) is not None:
        found.append(miner)
    for inner in loss.wrapped_losses:
        found.extend(m for m in random_miners(inner) if all(m is not f for f in found))
    return found


def _config_value(value):
    """A loss argument as its config holds it: miners, losses and initializers serialized."""
    if isinstance(value, (Miner, keras.losses.Loss, keras.initializers.Initializer)):
        return keras.saving.serialize_keras_object(value)
    return value


@functools.cache
def _init_parameters(cls):
    """The names of the parameters of ``cls.__init__``; None when it takes ``**kwargs``."""
    parameters = inspect.signature(cls.__init__).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return frozenset(p.name for p in parameters)


def dtype_config(dtype) -> dict:
    """``{"dtype": ...}``, the serialized dtype policy of a loss made with ``dtype``, or
    ``{}`` for ``dtype=None`` (floatx when loaded): what a loss's config holds of it."""
    if dtype is None:
        return {}
    return {"dtype": keras.dtype_policies.serialize(keras.dtype_policies.get(dtype))}


class MetricLoss(keras.losses.Loss):
    """Base class of tfdml losses: labels + embeddings in, terms per anchor, averaged, reduced.

    A subclass follows the contract of the module docstring: an ``__init__``
    that passes its own arguments on as keywords, and a ``terms(inputs)``
    method. ``__call__`` casts ``y_true`` to integer ids *before* any dtype
    conversion (Keras' base class converts labels to the loss dtype, which in
    bfloat16 merges class ids above 256), and computes in float32 whatever the
    dtype of ``y_pred`` (float64 for float64).

    Args:
        normalize: L2-normalize the embeddings first. Defaults to `True`.
        average: what the loss averages over: ``"anchors"``, ``"batch"``,
            ``"terms"``, ``"nonzero"`` or, for a pair loss whose terms split,
            ``"halves"`` / ``"halves_terms"`` (:mod:`tfdml.losses.terms`).
            Defaults to `"anchors"`; each loss sets its paper's.
        reduction: see :mod:`tfdml.losses.terms`. Defaults to
            `"sum_over_batch_size"`.
        name: name of the loss instance.
        dtype: dtype of the returned loss value. Defaults to `None`
            (``keras.config.floatx()``).
        block_size: compute the loss over blocks of this many anchors, each
            against the whole batch, recomputing each block in the backward
            pass (:mod:`tfdml.losses.row_blocks`): peak memory ``O(block_size x
            B)`` instead of ``O(B^2)``, same values and gradients. `None`
            computes the whole batch at once. Defaults to `None`.
        **arguments: the loss's own arguments, checked by its ``__init__``;
            kept as attributes of the same names and in its config.

    Raises:
        ValueError: for a ``reduction``, ``average`` or ``block_size`` it does
            not take.

    Example:

    >>> from tfdml.losses.extend import check_number, resolve_miner, triplet_terms
    >>> from tfdml.losses.extend import mined_triplets, gather_triplet_scores
    >>> class CosineHingeLoss(MetricLoss):
    ...     def __init__(self, margin=0.1, miner="default", *, normalize=True,
    ...                  average="anchors", reduction="sum_over_batch_size",
    ...                  name="cosine_hinge_loss", dtype=None, block_size=None):
    ...         super().__init__(
    ...             margin=check_number("margin", margin, low=0),
    ...             miner=resolve_miner(miner, tfdml.miners.TripletMiner),
    ...             normalize=normalize, average=average, reduction=reduction, name=name,
    ...             dtype=dtype, block_size=block_size)
    ...
    ...     def terms(self, inputs):
    ...         scores = tfdml.ops.pairwise_similarity(inputs.x, inputs.ref)
    ...         triplets = mined_triplets(inputs, scores, self.miner)
    ...         s_ap, s_an = gather_triplet_scores(scores, triplets)
    ...         return triplet_terms(keras.ops.relu(s_an - s_ap + self.margin), triplets.mask)

    A pair or triplet loss writes only its maths with :class:`tfdml.losses.extend.PairLoss`
    or :class:`tfdml.losses.extend.TripletLoss`.
    """

    _miner = None

    #: The loss's terms split into its positive and its negative pairs (``[B, 2]`` fields,
    #: :func:`tfdml.losses.terms.split_pair_terms`), so that it takes ``average="halves"``.
    split_terms = False

    #: The terms of a block of anchors against the whole batch are those anchors' terms, so
    #: that ``block_size`` computes them in blocks by itself (:mod:`tfdml.losses.row_blocks`).
    #: False for a loss whose terms couple the whole batch: its ``terms`` runs over blocks
    #: itself when :meth:`uses_blocks` says so.
    blockwise = True

    #: The loss mines from a reference set (``ref_embeddings``) as well as from the batch.
    takes_reference_set = True

    #: The loss takes multi-hot label sets ``[B, L]`` as ``y_true`` (its pairs come from
    #: :func:`tfdml.ops.label_masks`). For a loss that needs one class per sample (class
    #: vectors; pairs formed within each class), a string saying why.
    multi_label = True

    #: Mine over the global batch under a ``tf.distribute`` strategy: ``None``
    #: (default) whenever more than one replica is in sync, ``True`` the same,
    #: ``False`` never (each replica mines within its own slice). See
    #: :mod:`tfdml.losses.replicas` for what it costs.
    cross_replica = None

    def __init__(self, *, normalize=True, average="anchors", reduction="sum_over_batch_size",
                 name=None, dtype=None, block_size=None, **arguments):
        check_reduction(reduction)
        block_size = check_int("block_size", block_size, allow_none=True)
        check_loss_average(type(self), average)
        super().__init__(name=name, reduction=reduction, dtype=dtype)
        self.block_size = block_size
        self.normalize = bool(normalize)
        self.average = average
        self._config_dtype = dtype
        self._warned_inactive = False
        self.ownership = Ownership()
        self._state = None
        self._state_made = False
        self._argument_names = tuple(arguments)
        for key, value in arguments.items():
            setattr(self, key, value)
        self._state = self._new_state()
        self._state_made = True

    # -- what a loss implements -----------------------------------------------------------------

    def terms(self, inputs: Inputs) -> AnchorTerms:
        """The loss's terms per anchor, from the checked inputs (subclasses implement it).

        Args:
            inputs: the :class:`Inputs` of :meth:`prepare`: labels, embeddings (cast to
                the compute dtype and, with ``normalize``, L2-normalized) and the
                reference set.

        Returns:
            The :class:`AnchorTerms` of each anchor, in the compute dtype.
        """
        raise NotImplementedError(f"{type(self).__name__} implements no `terms` method.")

    def make_state(self):
        """The :class:`LossState` of this loss, or None (subclasses add their variables).

        Called once, at the end of ``MetricLoss.__init__`` (the loss's arguments are
        set). By default it holds the seed generators of the loss's random miners (a
        deterministic loss has no state).
        """
        generators = self._seed_generators()
        if not generators:
            return None
        return LossState(generators, name=f"{self.name}_state")

    # -- its arguments ------------------------------------------------------------------------

    @property
    def arguments(self) -> dict:
        """The loss's own arguments (beyond the shared ones), as its config holds them."""
        return {key: getattr(self, key) for key in self._argument_names}

    @property
    def wrapped_losses(self) -> tuple:
        """The tfdml losses this loss wraps: none (a wrapper's are its ``loss`` or ``losses``)."""
        return ()

    @property
    def miner(self):
        """The loss's :class:`tfdml.miners.Miner`, or None for a loss without one.

        A miner set after the loss was made becomes part of its state (its seed) while no
        model owns the loss (:class:`tfdml.models.MetricModel`).
        """
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
        if self._state_made and loss_owner(self) is None:
            self._state = self._new_state()  # the new miner's seed

    # -- the terms ------------------------------------------------------------------------------

    def prepare(self, labels, embeddings, ref_embeddings=None, ref_labels=None,
                ref_offset=None):
        """The checked :class:`Inputs` that :meth:`terms` takes (:func:`prepare_inputs`).

        Raises:
            ValueError: for a reference set given to a loss that takes none, or the
                errors of :func:`prepare_inputs`.
        """
        if not self.takes_reference_set and (ref_embeddings is not None
                                             or ref_labels is not None):
            raise ValueError(
                f"{type(self).__name__} computes over the batch alone; it takes no reference "
                "set (`ref_embeddings`).")
        return prepare_inputs(labels, embeddings, ref_embeddings, ref_labels, ref_offset,
                              self.normalize)

    def per_anchor(self, labels, embeddings, ref_embeddings=None, ref_labels=None,
                   ref_offset=None):
        """Returns the :class:`AnchorTerms` of each anchor, in the compute dtype."""
        return self.terms(self.prepare(labels, embeddings, ref_embeddings, ref_labels,
                                       ref_offset))

    def functional(self, y_true, y_pred, ref_embeddings=None, ref_labels=None,
                   ref_offset=None):
        """The value of the loss's functional form (:func:`tfdml.losses.functional_form`):
        the terms of the batch (against the reference set when one is given), averaged and
        reduced with the default reduction, in the dtype of ``y_pred``, without blocks,
        replicas or sample weights."""
        inputs = self.prepare(y_true, y_pred, ref_embeddings, ref_labels, ref_offset)
        self.check_label_form(inputs.labels)
        value = functional_value(self.terms(inputs), self.average, y_pred, ref_embeddings,
                                 self.normalize)
        return dml.nan_unless(value, multi_hot_ok(inputs.labels))

    def uses_blocks(self, embeddings) -> bool:
        """Whether a batch of ``embeddings`` is computed in blocks: ``block_size`` is set and
        the batch is larger (or of unknown size)."""
        rows = getattr(embeddings, "shape", (None,))[0]
        return self.block_size is not None and not (rows is not None
                                                    and rows <= self.block_size)

    def compute_terms(self, labels, embeddings, ref_embeddings=None, ref_labels=None,
                      ref_offset=None, training=True):
        """:meth:`per_anchor`, over blocks of ``block_size`` anchors when it is set.

        Wrapping losses (:class:`CrossBatchMemory`, :class:`TrimmedLoss`) call
        this on the loss they wrap, so the wrapped loss's ``block_size`` holds.
        A batch no larger than ``block_size`` is one block: :meth:`per_anchor`.
        ``training=False`` (evaluation) leaves buffers such as a memory bank
        unchanged; a loss without buffers ignores it.
        """
        self.check_label_form(labels)
        if not self.blockwise or not self.uses_blocks(embeddings):
            return self.per_anchor(labels, embeddings, ref_embeddings, ref_labels, ref_offset)
        return blocked_terms(self.per_anchor, labels, embeddings, self.block_size,
                             ref_embeddings, ref_labels, ref_offset, random_miners(self),
                             self.trainable_variables, split=self.split_terms)

    def check_label_form(self, labels):
        """Raises a ValueError for multi-hot ``[B, L]`` labels given to a loss that needs one
        class id per sample (:attr:`multi_label`)."""
        refuse_label_sets(type(self), labels)

    # -- state: learned variables, buffers and the random miners' seeds ------------------------

    def _new_state(self):
        """:meth:`make_state`, marked with the class of the loss that owns it."""
        state = self.make_state()
        if state is not None and state.loss_class_name is None:
            # Saved with the variables, which then load into this class only. A wrapper
            # that shares its wrapped loss's state (TrimmedLoss) keeps the wrapped class.
            state.loss_class_name = type(self).__name__
        return state

    def _seed_generators(self):
        """The ``keras.random.SeedGenerator`` of the miners this loss uses (wrapped losses too)."""
        return [miner.seed_generator for miner in random_miners(self)]

    @property
    def state(self):
        """The :class:`LossState` layer holding this loss's variables, or None without state.

        Made with the loss (:meth:`make_state`); its variables are created by
        :meth:`build_state`.
        """
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
        if self._warned_inactive or is_traced(terms.count):
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
        check_loss_state(self, y_pred)
        with keras.name_scope(self.name):
            labels = dml.cast_labels(y_true, "y_true")
            self.check_label_form(labels)
            sample_weight, weights_ok = check_sample_weight(sample_weight)
            value = call_over_replicas(
                functools.partial(self.loss_value, training=training), self.cross_replica,
                labels, y_pred, sample_weight, self.reduction)
            value = dml.nan_unless(ops.cast(value, self.dtype), multi_hot_ok(labels))
            return dml.nan_unless(value, weights_ok)

    def loss_value(self, labels, y_pred, sample_weight=None, training=True):
        """The reduced loss of a batch (the global batch under a strategy), not cast.

        Its terms (:meth:`compute_terms`) averaged and reduced; a loss whose value is
        not a reduction of terms per anchor (a sum over proxies) overrides it.
        """
        return self.reduced(self.compute_terms(labels, y_pred, training=training), y_pred,
                            sample_weight)

    def reduced(self, terms, y_pred, sample_weight=None):
        """The terms of ``y_pred``'s anchors averaged (``average``) and reduced."""
        self._warn_if_inactive(terms)
        return reduce_terms(terms, self.average, (y_pred,), self.normalize, sample_weight,
                            self.reduction)

    def call(self, y_true, y_pred):
        labels = dml.cast_labels(y_true, "y_true")
        terms = self.compute_terms(labels, y_pred, training=False)
        values, _ = average_terms(terms, self.average)
        values = dml.nan_unless(values, multi_hot_ok(labels))
        return dml.nan_unless_finite(values, y_pred, distances=not self.normalize)

    def get_config(self):
        """The config that rebuilds the loss: the shared arguments its ``__init__`` takes
        (``dtype`` and ``block_size`` when set), and its own arguments (miners, losses and
        initializers serialized)."""
        takes = _init_parameters(type(self))
        takes = (lambda key: True) if takes is None else takes.__contains__
        config = {key: value for key, value in super().get_config().items() if takes(key)}
        if takes("normalize"):
            config["normalize"] = self.normalize
        if takes("average"):
            config["average"] = self.average
        config.update(dtype_config(self._config_dtype))
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
