"""The selection routines every miner chooses with.

A single choice per anchor is :func:`pick`: the masked arg-max (ties to the
lowest index, :func:`tfdml.ops.masked_argmax`) of a key over the candidates,
the key being the scores, their negation or random noise, as the strategy's
entry of :data:`STRATEGIES` says:

``index[a] = argmax_{r in candidates[a]} key[a, r]``

Random strategies are Gumbel-max or uniform-key draws through the same
arg-max. With every positive of an anchor, :func:`pick_per_pair` chooses a
negative for each (anchor, positive) pair in ``O(B R)`` memory: semi-hard
from one sort per anchor (:func:`negatives_at_or_below`), random and
distance-weighted (:func:`distance_log_weights`) by inverse CDF.
:func:`multi_similarity_pairs` is the pair mining of the multi-similarity
loss, shared by :class:`tfdml.miners.MultiSimilarityMiner` and LoOp's loss.

Everything here is ``keras.ops`` of fixed shape: it runs under every Keras
backend, eagerly and compiled.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import keras
from keras import ops

from tfdml import ops as dml
from tfdml._embeddings import compute_dtype
from tfdml._shims import dtype_name
from tfdml.miners.base import Pairs, scatter_columns

__all__ = [
    "NEGATIVE_STRATEGIES",
    "POSITIVE_STRATEGIES",
    "STRATEGIES",
    "Strategy",
    "distance_log_weights",
    "multi_similarity_pairs",
    "negatives_at_or_below",
    "pick",
    "pick_per_pair",
]


def _compact(mask, values):
    """Per row, the ``values`` where ``mask`` is true, moved to the front in order: [B, R].

    Entries past the row's count are 0.
    """
    width = ops.shape(mask)[1]
    slot = ops.where(mask, ops.cumsum(ops.cast(mask, "int32"), axis=1) - 1, width)
    # Column `width` collects (and discards) the entries outside the mask, so columns repeat
    # there: "add" into zeros, which sets every other column to its one value.
    target = ops.zeros((ops.shape(mask)[0], width + 1), dtype_name(values))
    return dml.scatter_rows(target, slot, values, mode="add")[:, :width]


def negatives_at_or_below(values, negative_mask):
    """Per row: how many negatives are ``<=`` each entry, and the negatives in ascending order.

    One stable sort per row, then counts instead of searches (a batched binary
    search lowers to a ``[B, R, R]`` comparison under XLA).

    Args:
        values: ``[B, R]`` float tensor (scores or distances).
        negative_mask: ``[B, R]`` bool.

    Returns:
        ``(count, negatives)``, both ``[B, R]`` int32: ``count[a, j]`` is the
        number of negatives of row ``a`` with value ``<= values[a, j]`` (ties
        included), and ``negatives[a, :n_a]`` are the column indices of the
        row's ``n_a`` negatives by ascending value (0 after them).
    """
    values = ops.convert_to_tensor(values)
    order = dml.stable_argsort(values, axis=1)
    ordered = dml.take_along_axis(values, order, axis=1)
    is_negative = dml.take_along_axis(negative_mask, order, axis=1)
    negatives_so_far = ops.cumsum(ops.cast(is_negative, "int32"), axis=1)
    # Extend each position to the end of its group of equal values.
    starts = ops.concatenate(
        [ops.ones_like(ordered[:, :1], "bool"), ops.not_equal(ordered[:, 1:], ordered[:, :-1])],
        axis=1,
    )
    group = ops.cumsum(ops.cast(starts, "int32"), axis=1) - 1
    positions = ops.broadcast_to(ops.arange(ops.shape(order)[1], dtype="int32"),
                                  ops.shape(order))
    group_end = dml.scatter_rows(ops.zeros_like(order), group, positions, mode="max")
    last = dml.take_along_axis(group_end, group, axis=1)
    count_sorted = dml.take_along_axis(negatives_so_far, last, axis=1)
    count = dml.scatter_rows(ops.zeros_like(order), order, count_sorted)  # column order
    return count, _compact(is_negative, order)


# -- the strategies: one table, one arg-max ------------------------------------------------------

#: The strategies of :class:`tfdml.miners.TripletMiner`, by role (``"all"`` is no choice).
POSITIVE_STRATEGIES = ("easy", "hard", "random", "all")
NEGATIVE_STRATEGIES = ("hard", "semihard", "easy", "random", "distance_weighted", "all")


class Strategy(NamedTuple):
    """How a single-choice strategy of :class:`tfdml.miners.TripletMiner` chooses.

    A single choice is the masked arg-max of ``key`` over the candidates: ``"scores"``,
    ``"-scores"`` or ``"noise"``, which ``noise`` draws once per mining call (``[B, R]``).
    ``per_pair``: with ``positive="all"``, a negative is chosen for every (anchor, positive)
    pair (:func:`pick_per_pair`), not once per anchor.
    """

    key: str
    noise: Any = None
    per_pair: bool = False


def _uniform(shape, dtype, seed):
    return keras.random.uniform(shape, dtype=dtype, seed=seed)


def _gumbel(shape, dtype, seed):
    u = keras.random.uniform(shape, minval=1e-20, maxval=1.0, dtype=dtype, seed=seed)
    return -ops.log(-ops.log(u))


#: The single-choice strategies, by role (``"all"`` is no choice): every miner that picks
#: one sample per anchor looks its strategy up here.
STRATEGIES = {
    ("positive", "easy"): Strategy("scores"),
    ("positive", "hard"): Strategy("-scores"),
    ("positive", "random"): Strategy("noise", _uniform),
    ("negative", "hard"): Strategy("scores"),
    ("negative", "semihard"): Strategy("scores", per_pair=True),
    ("negative", "easy"): Strategy("-scores"),
    ("negative", "random"): Strategy("noise", _uniform, per_pair=True),
    ("negative", "distance_weighted"): Strategy("noise", _gumbel, per_pair=True),
}


def pick(role, strategy, scores, candidates, noise=None, s_ap=None, weights=None):
    """One choice per row of the scores by ``strategy``: the one selection routine.

    The masked arg-max (:func:`tfdml.ops.masked_argmax`, ties to the lowest index) of the
    strategy's key (:data:`STRATEGIES`) over the candidates,
    ``index[a] = argmax_{r in candidates[a]} key[a, r]``. ``"semihard"`` keeps the
    candidates at most as similar as the positive (``s_ap``, ``[B, 1]``);
    ``"distance_weighted"`` keeps those within reach and adds their log-weights
    (``weights = (log_w, within)``) to its Gumbel noise (Gumbel-max sampling).

    Args:
        role: ``"positive"`` or ``"negative"``.
        strategy: a single-choice strategy of ``role`` (a key of :data:`STRATEGIES`).
        scores: ``[B, R]`` scores, larger means more similar.
        candidates: ``[B, R]`` bool, the samples to choose from.
        noise: ``[B, R]`` draws of the strategy's ``noise`` (random strategies only).
            Defaults to `None`.
        s_ap: ``[B, 1]`` score of the chosen positive (``"semihard"`` only). Defaults
            to `None`.
        weights: ``(log_w, within)`` of :func:`distance_log_weights`
            (``"distance_weighted"`` only). Defaults to `None`.

    Returns:
        ``(index, found)``: ``[B]`` int32 column of the choice (0 without one) and
        ``[B]`` bool, whether the row had a candidate.
    """
    if strategy == "semihard":
        candidates = ops.logical_and(candidates, scores <= s_ap)
    elif strategy == "distance_weighted":
        log_w, candidates = _distance_candidates(*weights, candidates)
        noise = log_w + noise
    key = STRATEGIES[role, strategy].key
    if key != "noise":
        noise = scores if key == "scores" else -scores
    return dml.masked_argmax(noise, candidates)


def pick_per_pair(strategy, scores, candidates, seed, weights=None):
    """The negative of every (anchor, positive ``j``) pair by a ``per_pair`` strategy.

    Semi-hard from one sort per anchor (:func:`negatives_at_or_below`), random and
    distance-weighted by inverse CDF: ``O(B R log R)`` time, ``O(B R)`` memory, no
    ``[B, R, R]`` tensor.

    Args:
        strategy: ``"semihard"``, ``"random"`` or ``"distance_weighted"``.
        scores: ``[B, R]`` scores, larger means more similar.
        candidates: ``[B, R]`` bool, the negatives.
        seed: the ``keras.random.SeedGenerator`` of the random strategies.
        weights: ``(log_w, within)`` of :func:`distance_log_weights`
            (``"distance_weighted"`` only). Defaults to `None`.

    Returns:
        ``(index, found)``, ``[B, R]`` each: the negative of pair ``(a, j)`` and whether
        there is one.
    """
    if strategy == "semihard":
        return _semihard_all(scores, candidates)
    if strategy == "distance_weighted":
        log_w, candidates = _distance_candidates(*weights, candidates)
    else:  # random: uniform weights
        log_w = ops.zeros_like(scores)
    return _draw_per_pair(log_w, candidates, seed)


def distance_log_weights(embeddings, ref_embeddings, lower_cutoff, upper_cutoff):
    """The log-weights of distance-weighted sampling (Wu et al. 2017).

    ``log w = (2 - n) log d - (n - 3)/2 log(1 - d^2/4)``, the log of ``1 / q(d)`` with
    ``q`` the density of pairwise distances on the unit sphere in ``n`` dimensions, ``d``
    clipped below at ``lower_cutoff`` and ``1 - d^2/4`` at 1e-6.

    Args:
        embeddings: ``[B, D]`` anchor embeddings.
        ref_embeddings: ``[R, D]`` reference embeddings, or None for ``embeddings``.
        lower_cutoff: distances are clipped below at this value.
        upper_cutoff: only negatives closer than this are drawn; None for all.

    Returns:
        ``(log_w, within)``: ``[B, R]`` float log-weights and ``[B, R]`` bool,
        ``d < upper_cutoff`` (all true for None).

    Raises:
        ValueError: without ``embeddings``.
    """
    if embeddings is None:
        raise ValueError(
            "negative='distance_weighted' needs the embeddings: call "
            "`mine(scores, labels, ..., embeddings=x, ref_embeddings=ref)` "
            "(tfdml losses pass them)."
        )
    x = ops.stop_gradient(ops.convert_to_tensor(embeddings))
    ref = x if ref_embeddings is None else ops.stop_gradient(
        ops.convert_to_tensor(ref_embeddings))
    x = ops.cast(x, compute_dtype(x.dtype))
    ref = ops.cast(ref, dtype_name(x))
    dist = dml.pairwise_distance(x, ref)
    dtype = dtype_name(dist)
    dim = x.shape[-1] if x.shape[-1] is not None else ops.shape(x)[-1]
    dim = ops.cast(dim, dtype)
    d = dml.maximum(dist, lower_cutoff)
    one_minus = dml.maximum(1.0 - 0.25 * ops.square(d), 1e-6)
    log_w = (2.0 - dim) * ops.log(d) - 0.5 * (dim - 3.0) * ops.log(one_minus)
    if upper_cutoff is None:
        within = ops.ones_like(dist, "bool")
    else:
        within = dist < ops.convert_to_tensor(upper_cutoff, dtype)
    return log_w, within


# -- draws per (anchor, positive) pair -----------------------------------------------------------


def _distance_candidates(log_w, within, negative_mask):
    """Negatives to draw from and their log-weights (uniform when none is within reach)."""
    candidates = ops.logical_and(negative_mask, within)
    any_within = ops.any(candidates, axis=-1, keepdims=True)
    candidates = ops.where(any_within, candidates, negative_mask)
    log_w = ops.where(any_within, log_w, ops.zeros_like(log_w))
    return log_w, candidates


def _draw_per_pair(log_w, candidates, seed):
    """One draw per (anchor, reference j) from each anchor's distribution: ``[B, R]``.

    Candidate ``k`` of anchor ``a`` is drawn with probability proportional
    to ``exp(log_w[a, k])`` (``log_w = 0``: uniformly), independently for
    every ``j``. Inverse CDF without a ``[B, R, R]`` comparison: the ``R``
    cumulative weights and the ``R`` uniform draws of a row are sorted
    together (the weights first on ties), and a draw's index is the
    number of cumulative weights sorted before it (``<= u``).
    """
    dtype = dtype_name(log_w)
    logits = ops.where(candidates, log_w, ops.convert_to_tensor(-float("inf"), dtype))
    top = ops.max(logits, axis=1, keepdims=True)
    top = ops.where(ops.isfinite(top), top, ops.zeros_like(top))
    weights = ops.where(candidates, ops.exp(logits - top), ops.zeros_like(logits))
    cdf = dml.cumsum(weights, axis=1)
    width = ops.shape(cdf)[1]
    u = _uniform(ops.shape(cdf), dtype, seed) * cdf[:, -1:]
    merged = ops.concatenate([cdf, u], axis=1)
    is_cdf = ops.concatenate([ops.ones_like(cdf, "int32"), ops.zeros_like(u, "int32")],
                              axis=1)
    order = dml.stable_argsort(merged, axis=1)
    before = ops.cumsum(dml.take_along_axis(is_cdf, order, axis=1), axis=1)
    count = dml.scatter_rows(ops.zeros_like(order), order, before)[:, width:]
    found = ops.any(candidates, axis=1, keepdims=True)
    columns = ops.cast(ops.arange(width, dtype="int32"), dtype)
    last, _ = dml.masked_argmax(ops.broadcast_to(columns, ops.shape(candidates)), candidates)
    index = ops.where(count >= width, last[:, None], count)
    found = ops.broadcast_to(found, ops.shape(index))
    return ops.where(found, index, ops.zeros_like(index)), found


def _semihard_all(scores, negative_mask):
    """Semi-hard negative for every (anchor, positive = reference j) pair: [B, R].

    The semi-hard negative is the ``count``-th smallest negative, with
    ``count`` from :func:`negatives_at_or_below`. O(B R log R) time,
    O(B R) memory; the sort's temporaries are bounded by row blocks
    (:func:`tfdml.ops.map_row_blocks`).
    """
    def semihard(scores, negative_mask):
        count, negatives = negatives_at_or_below(scores, negative_mask)
        found = count > 0
        index = dml.take_along_axis(negatives, ops.maximum(count - 1, 0), axis=1)
        return ops.where(found, index, ops.zeros_like(index)), found

    return dml.map_row_blocks(semihard, (scores, negative_mask), ("int32", "bool"))


# -- the multi-similarity pairs ------------------------------------------------------------------


def multi_similarity_pairs(scores, positive_mask, negative_mask, epsilon, positive="hard",
                           negatives=None) -> Pairs:
    """The pair mining of :class:`tfdml.miners.MultiSimilarityMiner` on label masks.

    A negative pair is kept if ``S_an + epsilon > min_p S_ap``; a positive pair, with
    ``positive="hard"``, if ``S_ap - epsilon < max_n S_an``, with ``"easy"`` if it is the
    most similar one, with ``"all"`` always. An anchor without a positive keeps no
    negative, one without a negative keeps no positive.

    Args:
        scores: ``[B, R]`` scores, larger means more similar.
        positive_mask: ``[B, R]`` bool, the positive pairs.
        negative_mask: ``[B, R]`` bool, the negative pairs.
        epsilon: the mining margin, in the units of the scores (any sign).
        positive: ``"hard"``, ``"easy"`` or ``"all"``. Defaults to `"hard"`.
        negatives: ``(scores, candidates)``, ``[B, N]`` each: other negatives, kept
            against the same threshold (the least similar positive of ``scores``), as
            LoOp's negative pairs of samples. Defaults to `None` (the negatives of
            ``scores``).

    Returns:
        :class:`tfdml.miners.Pairs` (``[B, N]`` negatives with ``negatives``).
    """
    epsilon = ops.convert_to_tensor(epsilon, dtype_name(scores))
    least_positive, has_positive = dml.masked_min(scores, positive_mask)
    negative_scores, candidates = (scores, negative_mask) if negatives is None else negatives
    negative = ops.logical_and(candidates, negative_scores + epsilon > least_positive[:, None])
    negative = ops.logical_and(negative, has_positive[:, None])
    if positive == "hard":
        most_negative, _ = dml.masked_max(scores, negative_mask)
        positive = ops.logical_and(positive_mask, scores - epsilon < most_negative[:, None])
    elif positive == "easy":
        index, found = dml.masked_argmax(scores, positive_mask)
        positive = scatter_columns(index[:, None], found[:, None], ops.shape(scores)[1])
    else:
        positive = positive_mask
    has_negative = ops.any(negative_mask, axis=1, keepdims=True)
    return Pairs(ops.logical_and(positive, has_negative), negative)
