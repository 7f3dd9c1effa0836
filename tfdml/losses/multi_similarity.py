"""The multi-similarity loss of Wang et al. (CVPR 2019)."""

from __future__ import annotations

import keras
from keras import ops

from tfdml import ops as dml
from tfdml._argument_checks import check_number
from tfdml._docs import fill_doc
from tfdml._shims import dtype_name
from tfdml.losses._docstrings import REFERENCE_ARGS, shared_args
from tfdml.losses.base import MetricLoss, functional_loss
from tfdml.losses.inputs import mined_pairs, resolve_miner
from tfdml.losses.terms import anchor_terms
from tfdml.miners import MultiSimilarityMiner

__all__ = ["MultiSimilarityLoss", "ms_values", "multi_similarity_loss"]


def _check_args(alpha: float = 2.0, beta: float = 50.0, base: float = 0.5, miner="default"):
    return {"alpha": check_number("alpha", alpha, low=0, low_open=True),
            "beta": check_number("beta", beta, low=0, low_open=True),
            "base": check_number("base", base),
            "miner": resolve_miner(miner, MultiSimilarityMiner)}


def _log1p_sum_exp(z, mask):
    """``log(1 + sum_{mask} exp(z))`` per row, stable; 0 (zero gradient) for an empty row."""
    z = ops.where(mask, z, ops.convert_to_tensor(-float("inf"), dtype_name(z)))
    return ops.logsumexp(ops.concatenate([ops.zeros_like(z[:, :1]), z], axis=1), axis=1)


def ms_values(scores, pairs, alpha, beta, base, negative_scores=None):
    """Per anchor, ``1/alpha log(1 + sum_{p in P} exp(-alpha (S_p - base)))
    + 1/beta log(1 + sum_{n in N} exp(beta (S'_n - base)))``.

    ``P``, ``N``: the :class:`tfdml.miners.Pairs` ``pairs``; ``S'``: ``negative_scores``
    (the scores of the negatives when they are not ``scores``' columns, as LoOp's pairs).
    """
    base = ops.convert_to_tensor(base, dtype_name(scores))
    shifted = scores - base
    negative = shifted if negative_scores is None else negative_scores - base
    return (_log1p_sum_exp(-alpha * shifted, pairs.positive) / alpha
            + _log1p_sum_exp(beta * negative, pairs.negative) / beta)


def _ms_terms(inputs, alpha, beta, base, miner):
    x, ref = inputs.x, inputs.ref
    scores = dml.pairwise_similarity(x, ref)
    pairs = mined_pairs(inputs, scores, miner)
    active = ops.logical_or(ops.any(pairs.positive, axis=1),
                             ops.any(pairs.negative, axis=1))
    return anchor_terms(ms_values(scores, pairs, alpha, beta, base), active)


@keras.saving.register_keras_serializable(package="tfdml")
@fill_doc(SHARED_ARGS=shared_args("multi_similarity_loss", average="batch"))
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
        {SHARED_ARGS}

    Examples:

    >>> loss = tfdml.losses.MultiSimilarityLoss()  # MS mining
    >>> eps = tfdml.losses.MultiSimilarityLoss(
    ...     miner=tfdml.miners.MultiSimilarityMiner(positive="easy"))

    Reference:
        Wang, Han, Huang, Dong, Scott, "Multi-similarity loss with general
        pair weighting for deep metric learning", CVPR 2019; "Reducing class
        collapse in metric learning with easy positive sampling".
    """

    def __init__(self, alpha: float = 2.0, beta: float = 50.0, base: float = 0.5, miner="default",
                 normalize=True, average="batch", reduction="sum_over_batch_size",
                 name="multi_similarity_loss", dtype=None, block_size=None):
        super().__init__(normalize=normalize, average=average, reduction=reduction, name=name,
                         dtype=dtype, block_size=block_size,
                         **_check_args(alpha, beta, base, miner))

    def terms(self, inputs):
        return _ms_terms(inputs, **self.arguments)


@fill_doc(REFERENCE_ARGS=REFERENCE_ARGS)
def multi_similarity_loss(y_true, y_pred, alpha: float = 2.0, beta: float = 50.0, base: float = 0.5,
                          miner="default", normalize=True, ref_embeddings=None, ref_labels=None,
                          ref_offset=None, average="batch"):
    """Functional form of :class:`MultiSimilarityLoss`: by default the sum over anchors / batch size.

    Args:
        y_true: ``[B]`` or ``[B, 1]`` integer class ids.
        y_pred: ``[B, D]`` embeddings.
        alpha, beta, base, miner, normalize, average: as in
            :class:`MultiSimilarityLoss`.
        {REFERENCE_ARGS}

    Returns:
        A scalar of the dtype of ``y_pred``; 0 when no anchor has a pair, NaN when an
        embedding is NaN or Inf.
    """
    return functional_loss(MultiSimilarityLoss, _ms_terms, y_true, y_pred, ref_embeddings,
                           ref_labels, ref_offset, normalize, average,
                           **_check_args(alpha, beta, base, miner))
