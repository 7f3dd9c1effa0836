"""The contrastive (pair) loss of Hadsell, Chopra and LeCun, in the form of the class-collapse paper."""

from __future__ import annotations

import numbers

import keras
from keras import ops

from tfdml import ops as dml
from tfdml.losses.base import (
    MetricLoss,
    check_average,
    functional_value,
    pair_terms,
    prepare_inputs,
    resolve_miner,
)
from tfdml.miners import AllPairsMiner, Miner, as_pairs

__all__ = ["ContrastiveLoss", "contrastive_loss"]


def _check_args(positive_margin, negative_margin, distance):
    for name, value in (("positive_margin", positive_margin), ("negative_margin", negative_margin)):
        if not isinstance(value, numbers.Real) or isinstance(value, bool) or not value >= 0:
            raise ValueError(f"`{name}` must be a number >= 0. Received: {name}={value!r}")
    dml.check_distance(distance)


def _contrastive_per_anchor(labels, embeddings, positive_margin, negative_margin, distance,
                            miner: Miner, normalize, ref_embeddings, ref_labels,
                            ref_offset):
    labels, x, ref_labels, ref, ref_offset = prepare_inputs(
        labels, embeddings, ref_embeddings, ref_labels, ref_offset, normalize
    )
    dist = dml.distance_matrix(x, ref, distance)
    pairs = as_pairs(miner.mine(-dist, labels, ref_labels, ref_offset, x, ref),
                     num_ref=ops.shape(dist)[1])
    positive = ops.relu(dist - ops.convert_to_tensor(positive_margin, dml.dtype_name(dist)))
    negative = ops.relu(ops.convert_to_tensor(negative_margin, dml.dtype_name(dist)) - dist)
    return pair_terms(positive, negative, pairs)


def contrastive_loss(
    y_true,
    y_pred,
    positive_margin: float = 0.0,
    negative_margin: float = 0.5,
    distance: str = "l2",
    miner="default",
    normalize: bool = True,
    ref_embeddings=None,
    ref_labels=None,
    ref_offset=None,
    average: str = "terms",
):
    """Functional form of :class:`ContrastiveLoss`: by default the mean over all pairs.

    Arguments as in :class:`ContrastiveLoss`; ``ref_embeddings``,
    ``ref_labels`` and ``ref_offset`` as in :func:`tfdml.losses.triplet_nca_loss`.

    Returns:
        A scalar of the dtype of ``y_pred``; 0 when no anchor has a pair,
        NaN when an embedding is NaN or Inf.
    """
    _check_args(positive_margin, negative_margin, distance)
    check_average(average)
    terms = _contrastive_per_anchor(
        y_true, y_pred, float(positive_margin), float(negative_margin), distance,
        resolve_miner(miner, AllPairsMiner), normalize, ref_embeddings, ref_labels, ref_offset,
    )
    return functional_value(terms, average, y_pred, ref_embeddings, normalize)


@keras.saving.register_keras_serializable(package="tfdml")
class ContrastiveLoss(MetricLoss):
    """Contrastive loss: pull positive pairs within a margin, push negatives beyond one.

    With ``d`` the distance of a pair::

        positive pair: L = max(d - positive_margin, 0)
        negative pair: L = max(negative_margin - d, 0)

    The pairs are all same-class and all other-class reference samples of
    each anchor, or those a miner keeps (mined triplets contribute their
    positive and negative pairs, each pair once).

    **Averaged over** the pairs (``average="terms"``): the sum over all
    pairs divided by their number, the class-collapse paper's objective
    ``O_con = 1/n^2 sum_{i,j} L_con(x_i, x_j)`` (with the self-pairs, which
    cost nothing, left out). Without a miner every anchor of a batch has the
    same number of pairs, so this equals the mean over anchors of their
    means. pytorch-metric-learning averages over the pairs with a non-zero
    loss (``average="nonzero"``).

    With ``distance="squared_l2"`` and ``positive_margin=0`` this is the
    form the class-collapse paper writes (Section 3):
    ``delta D + (1 - delta) max(alpha - D, 0)`` with ``D`` the squared
    distance. Hadsell et al.'s original squares the hinges of the Euclidean
    distance instead (``D^2 / 2`` and ``max(m - D, 0)^2 / 2``); the
    ``positive_margin`` generalization (no pull once a positive is closer
    than it) follows common practice. With ``positive_margin=0`` every
    minimizer of the loss over all pairs collapses each class to a point,
    the class-collapse paper's starting observation (Section 4.1).

    Args:
        positive_margin: ``>= 0``. Defaults to `0.0`.
        negative_margin: ``>= 0``. Defaults to `0.5`.
        distance: ``"l2"``, ``"squared_l2"`` or ``"cosine"``. Defaults to
            `"l2"`.
        miner: a :class:`tfdml.miners.Miner`; `None` or `"default"` for
            every pair (:class:`tfdml.miners.AllPairsMiner`). Defaults to
            `"default"`.
        normalize: L2-normalize the embeddings first. Defaults to `True`.
        average: ``"terms"``, ``"nonzero"``, ``"anchors"`` or ``"batch"``;
            see :mod:`tfdml.losses.base`. Defaults to `"terms"`.
        reduction: see :mod:`tfdml.losses.base`. Defaults to
            `"sum_over_batch_size"`.
        name: name of the loss. Defaults to `"contrastive_loss"`.
        dtype: dtype of the returned value. Defaults to `None` (floatx).
        block_size: compute the loss over blocks of this many anchors, each
            against the whole batch, recomputing each block in the backward
            pass: memory ``O(block_size x B)`` instead of ``O(B^2)``, the same
            values and gradients (docs/losses.md, "Large batches"). Defaults
            to `None` (the whole batch at once).

    Examples:

    >>> loss = tfdml.losses.ContrastiveLoss(negative_margin=0.5)
    >>> loss = tfdml.losses.ContrastiveLoss(
    ...     miner=tfdml.miners.MultiSimilarityMiner(positive="easy"))

    Reference:
        Hadsell, Chopra, LeCun, "Dimensionality reduction by learning an
        invariant mapping", CVPR 2006; "Reducing class collapse in metric
        learning with easy positive sampling" (Section 3).
    """

    def __init__(
        self,
        positive_margin: float = 0.0,
        negative_margin: float = 0.5,
        distance: str = "l2",
        miner="default",
        normalize: bool = True,
        average: str = "terms",
        reduction="sum_over_batch_size",
        name: str = "contrastive_loss",
        dtype=None,
        block_size=None,
    ):
        _check_args(positive_margin, negative_margin, distance)
        super().__init__(normalize=normalize, reduction=reduction, name=name, dtype=dtype,
                         average=average, block_size=block_size)
        self.positive_margin = float(positive_margin)
        self.negative_margin = float(negative_margin)
        self.distance = distance
        self.miner = resolve_miner(miner, AllPairsMiner)

    def per_anchor(self, labels, embeddings, ref_embeddings=None, ref_labels=None, ref_offset=None):
        return _contrastive_per_anchor(labels, embeddings, self.positive_margin,
                                       self.negative_margin, self.distance, self.miner,
                                       self.normalize, ref_embeddings, ref_labels, ref_offset)

    def get_config(self):
        config = super().get_config()
        config.update(
            positive_margin=self.positive_margin,
            negative_margin=self.negative_margin,
            distance=self.distance,
            miner=keras.saving.serialize_keras_object(self.miner),
        )
        return config
