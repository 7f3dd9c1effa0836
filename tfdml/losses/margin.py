"""The margin loss of Wu et al. with a learnable boundary ``beta`` (one, or one per class)."""

from __future__ import annotations

import numbers

import keras
import numpy as np
from keras import ops

from tfdml import ops as dml
from tfdml._argument_checks import check_number, is_number
from tfdml._labels import validate_class_ids
from tfdml._shims import dtype_name
from tfdml.losses.base import MetricLoss, functional_value
from tfdml.losses.inputs import prepare_inputs, resolve_miner
from tfdml.losses.state import LossState
from tfdml.losses.terms import check_average, pair_terms, triplet_terms
from tfdml.miners import Pairs, TripletMiner, gather_triplet_scores

__all__ = ["MarginLoss", "margin_loss"]


def _distance_weighted():
    return TripletMiner("random", "distance_weighted")


def _check_args(margin, distance, miner):
    return {"margin": check_number("margin", margin, low=0),
            "distance": dml.check_distance(distance),
            "miner": resolve_miner(miner, _distance_weighted)}


def _check_beta(beta, num_classes):
    """``beta`` as a float or a float64 array of shape ``[num_classes]``."""
    if num_classes is not None and (
        not isinstance(num_classes, numbers.Integral) or isinstance(num_classes, bool)
        or num_classes < 1
    ):
        raise ValueError(
            f"`num_classes` must be None or an int >= 1. Received: num_classes={num_classes!r}"
        )
    if is_number(beta):
        beta = float(beta)
        if not np.isfinite(beta):
            raise ValueError(f"`beta` must be finite. Received: beta={beta!r}")
        return beta if num_classes is None else np.full([int(num_classes)], beta)
    try:
        values = np.asarray(beta, dtype=np.float64)
    except (TypeError, ValueError):
        values = None
    if values is None or values.ndim != 1 or not np.all(np.isfinite(values)):
        raise ValueError(
            "`beta` must be a finite number, or one per class (a list of length "
            f"`num_classes`). Received: beta={beta!r}"
        )
    if num_classes is None or len(values) != num_classes:
        raise ValueError(
            "A per-class `beta` needs `num_classes` equal to its length. "
            f"Received: len(beta)={len(values)}, num_classes={num_classes!r}"
        )
    return values


def _check_class_ids(labels, num_classes, given=True):
    """Class ids must index the per-class ``beta``: ``(labels, valid)``, a ValueError
    eagerly; when traced, ``valid`` is false for an id out of range (and a ``tf.function``
    graph without XLA fails an assertion).

    ``given``: ``num_classes`` was passed (else it is the length of a functional ``beta``).
    """
    if given:
        message = (f"With `num_classes={num_classes}`, class ids (y_true) must be in "
                   f"[0, {num_classes}).")
    else:
        message = (f"With a per-class `beta` of length {num_classes}, class ids (y_true) must "
                   f"be in [0, {num_classes}).")
    return validate_class_ids(labels, num_classes, message)


def _margin_terms(inputs, margin, distance, miner, beta, num_classes=None):
    labels, x, ref_labels, ref, ref_offset = inputs
    dist = dml.distance_matrix(x, ref, distance)
    mined = miner.mine(-dist, labels, ref_labels, ref_offset, x, ref)
    dtype = dtype_name(dist)
    if isinstance(beta, (numbers.Real, np.ndarray, list, tuple)):
        # Rounded once from float64: full precision in float64.
        beta = ops.convert_to_tensor(np.asarray(beta, np.float64).astype(dtype))
    else:
        beta = ops.cast(beta, dtype)
    rank = len(beta.shape)
    if rank == 1:
        valid = True
        if num_classes is not None:
            labels, valid = _check_class_ids(labels, num_classes)
        elif beta.shape[0] is not None:
            labels, valid = _check_class_ids(labels, beta.shape[0], given=False)
        # Each anchor's own boundary, [B, 1]. Out-of-range ids (which cannot raise when
        # traced) read the nearest valid entry, as XLA's gather does, and make beta (hence
        # the loss) NaN.
        last = beta.shape[0] - 1 if beta.shape[0] is not None else ops.cast(
            ops.shape(beta)[0] - 1, dtype_name(labels))
        beta = dml.nan_unless(ops.take(beta, ops.clip(labels, 0, last), axis=0)[:, None],
                              valid)
    elif rank != 0:
        raise ValueError(f"`beta` must be a scalar or [num_classes]. Received shape {beta.shape}")
    m = ops.convert_to_tensor(margin, dtype)
    if isinstance(mined, Pairs):
        return pair_terms(ops.relu(dist - beta + m), ops.relu(beta - dist + m), mined)
    # A triplet (a, p, n) is two terms, its positive and its negative pair, as in
    # Wu et al.'s code (a negative drawn for several positives counts once per triplet).
    neg_d_ap, neg_d_an = gather_triplet_scores(-dist, mined)
    if len(beta.shape) == 2:
        beta = beta[:, :, None]
    return triplet_terms(ops.relu(-neg_d_ap - beta + m), mined.mask).plus(
        triplet_terms(ops.relu(beta + neg_d_an + m), mined.mask))


def margin_loss(
    y_true,
    y_pred,
    margin: float = 0.2,
    beta=1.2,
    distance: str = "l2",
    miner="default",
    normalize: bool = True,
    ref_embeddings=None,
    ref_labels=None,
    ref_offset=None,
    average: str = "nonzero",
):
    """Functional form of :class:`MarginLoss`: by default the sum over pairs / non-zero pairs.

    Args:
        y_true: ``[B]`` or ``[B, 1]`` integer class ids.
        y_pred: ``[B, D]`` embeddings.
        margin, distance, miner, normalize, average: as in :class:`MarginLoss`.
        beta: the boundary: a number, or a ``[num_classes]`` array/tensor/
            variable indexed by the anchor's class id (pass your own
            ``keras.Variable`` to learn it in a custom training loop; class
            ids must then be in ``[0, num_classes)``, checked eagerly).
            Defaults to `1.2`.
        ref_embeddings, ref_labels, ref_offset: a reference set to mine
            from, as in :func:`tfdml.losses.triplet_nca_loss`.

    Returns:
        A scalar of the dtype of ``y_pred``; 0 when no pair has a loss, NaN
        when an embedding is NaN or Inf.
    """
    arguments = _check_args(margin, distance, miner)
    check_average(average)
    if is_number(beta) or isinstance(beta, (list, tuple, np.ndarray)):
        beta = _check_beta(beta, None if is_number(beta) else len(beta))
    inputs = prepare_inputs(y_true, y_pred, ref_embeddings, ref_labels, ref_offset, normalize)
    return functional_value(_margin_terms(inputs, beta=beta, **arguments), average, y_pred,
                            ref_embeddings, normalize)


class _MarginBeta(LossState):
    """The state of a :class:`MarginLoss`: its learnable boundary (and its miner's seed)."""

    def __init__(self, initial, seed_generators=(), **kwargs):
        super().__init__(seed_generators, **kwargs)
        self.initial = np.asarray(initial, dtype=np.float32)
        self.build()  # beta's shape does not depend on the embeddings

    def make_variables(self, embedding_dim):
        self.beta = self.add_weight(
            shape=self.initial.shape,
            initializer=keras.initializers.Constant(self.initial),
            trainable=True,
            name="beta",
        )

@keras.saving.register_keras_serializable(package="tfdml")
class MarginLoss(MetricLoss):
    """Margin loss of "Sampling matters in deep embedding learning", with a learnable boundary.

    With ``d`` the distance between two embeddings, ``beta_a`` the boundary
    of the anchor (one shared value, or its class's value when
    ``num_classes`` is given) and ``alpha`` the margin:

    * positive pair: ``L = max(d(a, p) - beta_a + alpha, 0)``;
    * negative pair: ``L = max(beta_a - d(a, n) + alpha, 0)``.

    Pairs come from the miner: a mined triplet ``(a, p, n)`` contributes its
    positive and its negative pair, so a negative drawn for several positives
    counts once per triplet; a pair miner such as :class:`tfdml.miners.MultiSimilarityMiner` or
    :class:`tfdml.miners.AllPairsMiner` (``miner=None``) gives each pair once.

    **Averaged over** the pairs with a non-zero loss (``average="nonzero"``):
    the sum of all pair losses divided by the number of pair terms above 0,
    as Wu et al.'s code and pytorch-metric-learning do (0 when no pair has a
    loss). ``average="anchors"`` takes per anchor the mean over its pairs and
    then the mean over anchors (tfdml's earlier default), ``"terms"`` the
    mean over all mined pairs. Wu et al.'s optional ``nu * beta``
    regularizer is not applied.

    **Learning beta.** With ``learn_beta=True`` (default) ``beta`` is a
    trainable float32 variable of the loss's state (``loss.state``,
    ``loss.trainable_variables``). Keras only trains the variables of the
    model, so train with :class:`tfdml.models.MetricModel`, which owns the
    loss's state::

        loss = tfdml.losses.MarginLoss(num_classes=100)
        model = tfdml.models.MetricModel(embedding_model, loss)
        model.compile(optimizer="adam")   # model.trainable_variables include beta
        model.fit(...)

    In a custom training loop, differentiate with respect to
    ``model.trainable_variables + loss.trainable_variables``. Compiled into
    a plain model's ``fit`` the loss warns once, since beta would not move
    there. Frameworks that follow Wu et al. give beta its own, larger
    learning rate (e.g. 5e-4 for beta against 1e-5 for the network):
    ``beta_lr_multiplier=m`` stores ``beta / m`` and multiplies it back, so
    adaptive optimizers such as Adam move beta about ``m`` times faster than
    the weights (plain SGD ``m^2`` times).

    A ``MetricModel`` saves beta with its weights (``.keras`` and
    ``.weights.h5`` files, with the optimizer's state for it), so training
    resumes where it stopped. ``get_config`` also stores the current value
    of beta, as the initial value of a loss rebuilt from the config.

    With ``num_classes`` class ids must be in ``[0, num_classes)``: eagerly
    a ValueError, inside ``tf.function`` an assertion; under XLA and
    ``jax.jit``, where nothing can raise, a NaN loss.

    Defaults follow Wu et al. and the class-collapse paper: ``alpha = 0.2``,
    ``beta`` initialised to 1.2, Euclidean distance between L2-normalized
    embeddings, and the class-collapse paper's "Dist-Margin" sampling: per
    anchor one random positive and a distance-weighted negative (clipped at
    0.5, drawn below 1.4), as in the framework the paper used (Roth et al.).
    Wu et al.'s own sampler pairs each anchor with *every* positive, each
    with its own distance-weighted negative:
    ``miner=TripletMiner("all", "distance_weighted")`` (3-15x the cost at
    B = 512-2048, see the README's benchmarks). Easy positive sampling
    (EPS + Dist-Margin) is ``miner=TripletMiner("easy", "distance_weighted")``.

    Args:
        margin: ``alpha >= 0``. Defaults to `0.2`.
        beta: initial boundary: a number, or one per class (a list of
            length ``num_classes``). Defaults to `1.2`.
        learn_beta: make beta a trainable variable. Defaults to `True`.
        num_classes: one beta per class when given; class ids must then be
            in ``[0, num_classes)``. Defaults to `None` (one shared beta).
        miner: a :class:`tfdml.miners.Miner`; `"default"` for
            `TripletMiner("random", "distance_weighted")`; `None` for every
            pair (:class:`tfdml.miners.AllPairsMiner`). Defaults to
            `"default"`.
        distance: ``"l2"``, ``"squared_l2"`` or ``"cosine"``. Defaults to
            `"l2"`.
        beta_lr_multiplier: ``m > 0``, see above. Defaults to `1.0`.
        normalize: L2-normalize the embeddings first. Defaults to `True`.
        average: ``"nonzero"``, ``"terms"``, ``"anchors"`` or ``"batch"``;
            see :mod:`tfdml.losses.base`. Defaults to `"nonzero"`.
        reduction: see :mod:`tfdml.losses.base`. Defaults to
            `"sum_over_batch_size"`.
        name: name of the loss. Defaults to `"margin_loss"`.
        dtype: dtype of the returned value. Defaults to `None` (floatx).
        block_size: compute the loss over blocks of this many anchors, each
            against the whole batch, recomputing each block in the backward
            pass: memory ``O(block_size x B)`` instead of ``O(B^2)``, the same
            values and gradients (docs/losses.md, "Large batches"). Defaults
            to `None` (the whole batch at once).

    Examples:

    >>> loss = tfdml.losses.MarginLoss(
    ...     num_classes=100, miner=tfdml.miners.TripletMiner("easy", "distance_weighted"))
    >>> model = tfdml.models.MetricModel(embedding_model, loss)
    >>> model.compile(optimizer="adam")
    >>> model.fit(pk_dataset, epochs=10)

    Reference:
        Wu, Manmatha, Smola, Krahenbuhl, "Sampling matters in deep embedding
        learning", ICCV 2017; "Reducing class collapse in metric learning
        with easy positive sampling" (Section 3 and 5.2).
    """

    def __init__(
        self,
        margin: float = 0.2,
        beta=1.2,
        learn_beta: bool = True,
        num_classes: int | None = None,
        miner="default",
        distance: str = "l2",
        beta_lr_multiplier: float = 1.0,
        *,
        normalize: bool = True,
        average: str = "nonzero",
        reduction="sum_over_batch_size",
        name: str = "margin_loss",
        dtype=None,
        block_size=None,
    ):
        beta = _check_beta(beta, num_classes)
        if not is_number(beta_lr_multiplier) or not beta_lr_multiplier > 0:
            raise ValueError(
                "`beta_lr_multiplier` must be a number > 0. "
                f"Received: beta_lr_multiplier={beta_lr_multiplier!r}"
            )
        self._fixed_beta = beta  # the initial value of the learned beta (make_state)
        super().__init__(**_check_args(margin, distance, miner), learn_beta=bool(learn_beta),
                         num_classes=None if num_classes is None else int(num_classes),
                         beta_lr_multiplier=float(beta_lr_multiplier), normalize=normalize,
                         average=average, reduction=reduction, name=name, dtype=dtype,
                         block_size=block_size)

    def make_state(self):
        if not self.learn_beta:
            return super().make_state()
        return _MarginBeta(np.asarray(self._fixed_beta, np.float64) / self.beta_lr_multiplier,
                           seed_generators=self._seed_generators(), name=f"{self.name}_state")

    @property
    def beta(self):
        """The current boundary: a float32 tensor, scalar or ``[num_classes]``."""
        if not self.learn_beta:
            return ops.convert_to_tensor(np.asarray(self._fixed_beta, np.float32))
        return self.state.beta * self.beta_lr_multiplier

    def terms(self, inputs):
        beta = self.beta if self.learn_beta else self._fixed_beta
        return _margin_terms(inputs, self.margin, self.distance, self.miner, beta,
                             self.num_classes)

    def get_config(self):
        """The config, with the current value of beta as the initial one."""
        config = super().get_config()
        beta = np.asarray(keras.ops.convert_to_numpy(self.beta), np.float64)
        config["beta"] = float(beta) if beta.ndim == 0 else beta.tolist()
        return config
