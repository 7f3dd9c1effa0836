"""The multi-similarity loss of Wang et al. (CVPR 2019)."""

from __future__ import annotations

import numbers

import keras
from keras import ops

from tfdml import ops as dml
from tfdml.losses.base import (
    MetricLoss,
    anchor_terms,
    check_average,
    functional_value,
    prepare_inputs,
    resolve_miner,
)
from tfdml.miners import MultiSimilarityMiner, as_pairs

__all__ = ["MultiSimilarityLoss", "multi_similarity_loss"]


def _check_args(alpha, beta, base):
    for name, value in (("alpha", alpha), ("beta", beta)):
        if not isinstance(value, numbers.Real) or isinstance(value, bool) or not value > 0:
            raise ValueError(f"`{name}` must be a number > 0. Received: {name}={value!r}")
    if not isinstance(base, numbers.Real) or isinstance(base, bool):
        raise ValueError(f"`base` must be a number. Received: base={base!r}")


def _log1p_sum_exp(z, mask):
    """``log(1 + sum_{mask} exp(z))`` per row, stable; 0 (zero gradient) for an empty row."""
    z = ops.where(mask, z, ops.convert_to_tensor(-float("inf"), dml.dtype_name(z)))
    return ops.logsumexp(ops.concatenate([ops.zeros_like(z[:, :1]), z], axis=1), axis=1)


def _ms_per_anchor(labels, embeddings, alpha, beta, base, miner, normalize,
                   ref_embeddings, ref_labels, ref_offset):
    labels, x, ref_labels, ref, ref_offset = prepare_inputs(
        labels, embeddings, ref_embeddings, ref_labels, ref_offset, normalize
    )
    scores = dml.pairwise_similarity(x, ref)
    pairs = as_pairs(miner.mine(scores, labels, ref_labels, ref_offset, x, ref),
                     num_ref=ops.shape(scores)[1])
    shifted = scores - ops.convert_to_tensor(base, dml.dtype_name(scores))
    positive = _log1p_sum_exp(-alpha * shifted, pairs.positive) / alpha
    negative = _log1p_sum_exp(beta * shifted, pairs.negative) / beta
    active = ops.logical_or(ops.any(pairs.positive, axis=1),
                             ops.any(pairs.negative, axis=1))
    return anchor_terms(positive + negative, active)


def multi_similarity_loss(
    y_true,
    y_pred,
    alpha: float = 2.0,
    beta: float = 50.0,
    base: float = 0.5,
    miner="default",
    normalize: bool = True,
    ref_embeddings=None,
    ref_labels=None,
    ref_offset=None,
    average: str = "batch",
):
    """Functional form of :class:`MultiSimilarityLoss`: by default the sum over anchors / batch size.

    Arguments as in :class:`MultiSimilarityLoss`; ``ref_embeddings``,
    ``ref_labels`` and ``ref_offset`` as in :func:`tfdml.losses.triplet_nca_loss`.

    Returns:
        A scalar of the dtype of ``y_pred``; 0 when no anchor keeps a pair,
        NaN when an embedding is NaN or Inf.
    """
    _check_args(alpha, beta, base)
    check_average(average)
    miner = resolve_miner(miner, MultiSimilarityMiner)
    terms = _ms_per_anchor(y_true, y_pred, float(alpha), float(beta), float(base), miner,
                           normalize, ref_embeddings, ref_labels, ref_offset)
    return functional_value(terms, average, y_pred, ref_embeddings, normalize)


@keras.saving.register_keras_serializable(package="tfdml")
class MultiSimilarityLoss(MetricLoss):
    """Multi-similarity loss: soft weighting of the mined positive and negative pairs.

    With ``S`` the cosine similarities, ``P_a`` and ``N_a`` the positive and
    negative pairs the miner keeps for anchor ``a`` and ``lambda = base``::

        L_a = 1/alpha * log(1 + sum_{p in P_a} exp(-alpha (S_ap - lambda)))
            + 1/beta  * log(1 + sum_{n in N_a} exp( beta  (S_an - lambda)))

    (an empty sum contributes ``log 1 = 0``).

    **Averaged over** the batch (``average="batch"``): the sum over the
    anchors divided by the batch size ``B``, an anchor that keeps no pair
    counting as 0, as in Wang et al.'s eq. 12 (``1/m sum_i``) and their
    released code, and as pytorch-metric-learning does. ``average="anchors"``
    divides by the number of anchors that keep a pair instead (tfdml's
    earlier default): it does not shrink as training leaves fewer
    anchors with mined pairs.

    The default miner is Wang et al.'s pair mining,
    :class:`tfdml.miners.MultiSimilarityMiner` with ``epsilon=0.1`` (with it
    an anchor keeps a positive pair exactly when it keeps a negative one);
    with ``MultiSimilarityMiner(positive="easy")`` it is the EPS + MS
    combination of the class-collapse paper; ``miner=None`` uses every pair
    (:class:`tfdml.miners.AllPairsMiner`, pytorch-metric-learning's
    ``MultiSimilarityLoss`` without a miner). Any other miner works too:
    mined triplets contribute their positive and negative pairs.

    Defaults: ``alpha = 2`` and ``beta = 50`` are the values of Wang et al.,
    also used by the class-collapse paper. ``base = 0.5`` is the threshold
    of the authors' released code; the class-collapse paper states
    ``lambda = 1`` (pass ``base=1.0``).

    Args:
        alpha: scale of the positive term, ``> 0``. Defaults to `2.0`.
        beta: scale of the negative term, ``> 0``. Defaults to `50.0`.
        base: the similarity offset ``lambda``. Defaults to `0.5`.
        miner: a :class:`tfdml.miners.Miner`; `"default"` for
            `MultiSimilarityMiner(epsilon=0.1)`; `None` for every pair.
            Defaults to `"default"`.
        normalize: L2-normalize the embeddings first. Defaults to `True`.
        average: ``"batch"``, ``"anchors"``, ``"terms"`` or ``"nonzero"``
            (one term per anchor: the last two equal ``"anchors"``); see
            :mod:`tfdml.losses.base`. Defaults to `"batch"`.
        reduction: see :mod:`tfdml.losses.base`. Defaults to
            `"sum_over_batch_size"`.
        name: name of the loss. Defaults to `"multi_similarity_loss"`.
        dtype: dtype of the returned value. Defaults to `None` (floatx).
        block_size: compute the loss over blocks of this many anchors, each
            against the whole batch, recomputing each block in the backward
            pass: memory ``O(block_size x B)`` instead of ``O(B^2)``, the same
            values and gradients (docs/losses.md, "Large batches"). Defaults
            to `None` (the whole batch at once).

    Examples:

    >>> loss = tfdml.losses.MultiSimilarityLoss()  # MS mining
    >>> eps = tfdml.losses.MultiSimilarityLoss(
    ...     miner=tfdml.miners.MultiSimilarityMiner(positive="easy"))

    Reference:
        Wang, Han, Huang, Dong, Scott, "Multi-similarity loss with general
        pair weighting for deep metric learning", CVPR 2019; "Reducing class
        collapse in metric learning with easy positive sampling".
    """

    def __init__(
        self,
        alpha: float = 2.0,
        beta: float = 50.0,
        base: float = 0.5,
        miner="default",
        normalize: bool = True,
        average: str = "batch",
        reduction="sum_over_batch_size",
        name: str = "multi_similarity_loss",
        dtype=None,
        block_size=None,
    ):
        _check_args(alpha, beta, base)
        super().__init__(normalize=normalize, reduction=reduction, name=name, dtype=dtype,
                         average=average, block_size=block_size)
        self.alpha = float(alpha)
        self.beta = float(beta)
        self.base = float(base)
        self.miner = resolve_miner(miner, MultiSimilarityMiner)

    def per_anchor(self, labels, embeddings, ref_embeddings=None, ref_labels=None, ref_offset=None):
        return _ms_per_anchor(labels, embeddings, self.alpha, self.beta, self.base, self.miner,
                              self.normalize, ref_embeddings, ref_labels, ref_offset)

    def get_config(self):
        config = super().get_config()
        config.update(
            alpha=self.alpha,
            beta=self.beta,
            base=self.base,
            miner=keras.saving.serialize_keras_object(self.miner),
        )
        return config
