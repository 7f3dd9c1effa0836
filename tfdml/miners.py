"""Miners: which positives and negatives each anchor is trained with.

A miner looks at a score matrix ``scores[a, r]`` (larger means more similar:
a cosine similarity, or a negated distance) between ``B`` anchors and ``R``
reference samples, the class ids of both and (for strategies that need them,
such as distance-weighted sampling) the embeddings, and returns a fixed-shape
description of what to train on:

* :class:`Triplets` (from :class:`TripletMiner`): (anchor, positive,
  negative) index triples and a mask;
* :class:`Pairs` (from :class:`MultiSimilarityMiner`): ``[B, R]`` masks of
  the positive and negative pairs each anchor keeps.

Every tfdml loss accepts either kind: :func:`as_pairs` turns triplets into
the pairs they contain, :func:`as_triplets` turns pairs into every
(positive pair, negative pair) combination of an anchor. Losses gather the
scores of the chosen pairs and apply their formula; mining itself is never
differentiated.

Everything is written with ``keras.ops`` and runs under every Keras backend
(TensorFlow, JAX, PyTorch), eagerly and compiled (``jit_compile=True``,
``jax.jit``): every single choice is a masked arg-max of a key (the scores,
their negation, or random noise), and the rest are sorts, scatters and
cumulative sums of fixed shape. Only the ``positive="all", negative="all"``
strategy (and :func:`as_triplets`) builds a ``[B, R, R]`` tensor.
"""

from __future__ import annotations

import numbers
from typing import Any, NamedTuple

import keras
from keras import ops

from tfdml import ops as dml
from tfdml._checks import check_choice

__all__ = [
    "AllPairsMiner",
    "AngularMiner",
    "BatchEasyHardMiner",
    "EmbeddingsAlreadyPackagedAsTriplets",
    "HDCMiner",
    "Miner",
    "MultiSimilarityMiner",
    "PairMarginMiner",
    "Pairs",
    "TripletMarginMiner",
    "TripletMiner",
    "Triplets",
    "UniformHistogramMiner",
    "as_pairs",
    "as_triplets",
    "distance_log_weights",
    "gather_triplet_scores",
    "negatives_at_or_below",
]

POSITIVE_STRATEGIES = ("easy", "hard", "random", "all")
NEGATIVE_STRATEGIES = ("hard", "semihard", "easy", "random", "distance_weighted", "all")
MS_POSITIVE_STRATEGIES = ("hard", "easy", "all")


class Triplets(NamedTuple):
    """Mined triplets, as indices into the reference set and a validity mask.

    Shapes use ``B`` anchors, ``R`` reference samples, ``P`` positives per
    anchor (1, or ``R`` for ``positive="all"``) and ``N`` negatives per
    (anchor, positive) pair (1, or ``R`` for ``negative="all"``).

    Attributes:
        positive: ``[B, P]`` int32 reference indices of the positives, or
            ``None`` when every reference sample is a candidate (``P = R``,
            positive ``j`` is reference row ``j``).
        negative: ``[B, P]`` int32 reference index of the negative chosen for
            each (anchor, positive) pair, or ``None`` when every reference
            sample is a candidate (``N = R``).
        mask: ``[B, P, N]`` bool, true for the triplets that exist. An anchor
            whose mask is all false has no triplet and is left out of the loss.
    """

    positive: Any | None
    negative: Any | None
    mask: Any


class Pairs(NamedTuple):
    """Mined pairs: which reference samples each anchor is paired with.

    Attributes:
        positive: ``[B, R]`` bool, true for the kept same-class pairs
            (never the anchor itself).
        negative: ``[B, R]`` bool, true for the kept different-class pairs.
    """

    positive: Any
    negative: Any


def _scatter_columns(indices, valid, width):
    """``[B, width]`` bool: true at ``indices[b, t]`` for every valid ``t`` (O(B T) memory)."""
    indices = ops.cast(indices, "int32")
    columns = ops.where(valid, indices, width)  # column `width` collects the invalid ones
    target = ops.zeros((ops.shape(indices)[0], width + 1), "int32")
    hits = dml.scatter_rows(target, columns, ops.ones_like(columns), mode="max")
    return ops.cast(hits[:, :width], "bool")


def as_pairs(mined, num_ref=None) -> Pairs:
    """The pairs contained in mined triplets (or ``mined`` itself if it is :class:`Pairs`).

    A triplet ``(a, p, n)`` contributes the positive pair ``(a, p)`` and the
    negative pair ``(a, n)``; a pair used by several triplets appears once.

    Args:
        mined: :class:`Triplets` or :class:`Pairs`.
        num_ref: ``R``, the size of the reference set. Needed only when
            neither index tensor is ``None`` (it is read from the mask
            otherwise). Defaults to `None`.
    """
    if isinstance(mined, Pairs):
        return mined
    mask = mined.mask
    if num_ref is None:
        if mined.positive is None:
            num_ref = ops.shape(mask)[1]
        elif mined.negative is None:
            num_ref = ops.shape(mask)[2]
        else:
            raise ValueError("`num_ref` is needed to turn single-choice triplets into pairs.")
    pair_valid = ops.any(mask, axis=2)  # [B, P]
    if mined.positive is None:
        positive = pair_valid
    else:
        positive = _scatter_columns(mined.positive, pair_valid, num_ref)
    if mined.negative is None:
        negative = ops.any(mask, axis=1)
    else:
        negative = _scatter_columns(mined.negative, pair_valid, num_ref)
    return Pairs(positive, negative)


def as_triplets(mined) -> Triplets:
    """Triplets from mined pairs: every (positive pair, negative pair) of an anchor.

    :class:`Triplets` pass through unchanged. From :class:`Pairs` the result
    has ``P = N = R`` and a ``[B, R, R]`` mask.
    """
    if isinstance(mined, Triplets):
        return mined
    mask = ops.logical_and(mined.positive[:, :, None], mined.negative[:, None, :])
    return Triplets(None, None, mask)


def gather_triplet_scores(scores, triplets: Triplets):
    """Scores of the mined pairs, broadcastable against ``triplets.mask``.

    Args:
        scores: ``[B, R]`` score matrix the triplets were mined from (or any
            differentiable function of the same pairs, e.g. a distance).
        triplets: output of a miner.

    Returns:
        ``(s_ap, s_an)`` of shapes ``[B, P, 1]`` and ``[B, P, N]``; gradients
        flow into ``scores`` at the gathered entries only.
    """
    if triplets.positive is None:
        s_ap = scores
    else:
        s_ap = dml.take_along_axis(scores, triplets.positive, axis=1)
    if triplets.negative is None:
        s_an = scores[:, None, :]
    else:
        s_an = dml.take_along_axis(scores, triplets.negative, axis=1)[:, :, None]
    return s_ap[:, :, None], s_an


class Miner:
    """Base class of tfdml miners: serializable objects passed to losses as ``miner=``."""

    #: Each anchor's selection depends on its own row of ``scores`` and on the reference
    #: set only, so that a loss computed in row blocks (``block_size``) selects what it
    #: selects without blocks. Miners that rank, bin or visit the pairs of the whole batch
    #: (:class:`HDCMiner`, :class:`UniformHistogramMiner`, a disjoint
    #: :class:`TripletMiner`) are not, and a loss with ``block_size`` refuses them.
    blockwise = True

    def mine(self, scores, labels, ref_labels=None, ref_offset=0, embeddings=None,
             ref_embeddings=None):
        """Selects triplets or pairs.

        Args:
            scores: ``[B, R]`` float tensor, larger means more similar.
            labels: ``[B]`` class ids of the anchors.
            ref_labels: ``[R]`` class ids of the reference set. Defaults to
                ``labels`` (the reference set is the batch).
            ref_offset: anchor ``i`` is reference row ``i + ref_offset``
                (excluded from its positives); ``None`` when the anchors are
                not in the reference set. Defaults to `0`.
            embeddings: ``[B, D]`` anchor embeddings, for strategies that
                need more than the scores (distance-weighted sampling).
                tfdml losses always pass them. Defaults to `None`.
            ref_embeddings: ``[R, D]`` reference embeddings. Defaults to
                ``embeddings``.

        Returns:
            :class:`Triplets` or :class:`Pairs`.
        """
        raise NotImplementedError

    @property
    def seed_generator(self):
        """The ``keras.random.SeedGenerator`` of a random strategy, or None.

        Its state changes at every draw. A loss using this miner holds it in its state
        (``loss.state``), which :class:`tfdml.models.MetricModel` owns, so that ``fit``
        updates it under every backend: JAX training is stateless and only updates the
        model's own variables.
        """
        return getattr(self, "_seed_generator", None)

    def __call__(self, scores, labels, ref_labels=None, ref_offset=0, embeddings=None,
                 ref_embeddings=None):
        return self.mine(scores, labels, ref_labels=ref_labels, ref_offset=ref_offset,
                         embeddings=embeddings, ref_embeddings=ref_embeddings)

    def get_config(self) -> dict:
        return {}

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({args})"


def _compact(mask, values):
    """Per row, the ``values`` where ``mask`` is true, moved to the front in order: [B, R].

    Entries past the row's count are 0.
    """
    width = ops.shape(mask)[1]
    slot = ops.where(mask, ops.cumsum(ops.cast(mask, "int32"), axis=1) - 1, width)
    # Column `width` collects (and discards) the entries outside the mask, so columns repeat
    # there: "add" into zeros, which sets every other column to its one value.
    target = ops.zeros((ops.shape(mask)[0], width + 1), dml.dtype_name(values))
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


# -- selection and sampling: what TripletMiner is built from -------------------------------------


class _Strategy(NamedTuple):
    """How a :class:`TripletMiner` strategy chooses.

    A single choice is the masked arg-max of ``key`` over the candidates: ``"scores"``,
    ``"-scores"`` or ``"noise"``, which ``noise`` draws once per mining call (``[B, R]``).
    ``per_pair``: with ``positive="all"``, a negative is chosen for every (anchor, positive)
    pair (:func:`_pick_per_pair`), not once per anchor.
    """

    key: str
    noise: Any = None
    per_pair: bool = False


def _uniform(shape, dtype, seed):
    return keras.random.uniform(shape, dtype=dtype, seed=seed)


def _gumbel(shape, dtype, seed):
    u = keras.random.uniform(shape, minval=1e-20, maxval=1.0, dtype=dtype, seed=seed)
    return -ops.log(-ops.log(u))


#: The single-choice strategies of :class:`TripletMiner`, by role (``"all"`` is no choice).
_STRATEGIES = {
    ("positive", "easy"): _Strategy("scores"),
    ("positive", "hard"): _Strategy("-scores"),
    ("positive", "random"): _Strategy("noise", _uniform),
    ("negative", "hard"): _Strategy("scores"),
    ("negative", "semihard"): _Strategy("scores", per_pair=True),
    ("negative", "easy"): _Strategy("-scores"),
    ("negative", "random"): _Strategy("noise", _uniform, per_pair=True),
    ("negative", "distance_weighted"): _Strategy("noise", _gumbel, per_pair=True),
}


def _pick(role, strategy, scores, candidates, noise=None, s_ap=None, weights=None):
    """One choice per row of the scores by ``strategy``: ``(index, found)``.

    The masked arg-max (:func:`tfdml.ops.masked_argmax`, ties to the lowest index) of the
    strategy's key (:data:`_STRATEGIES`) over the candidates. ``"semihard"`` keeps the
    candidates at most as similar as the positive (``s_ap``, ``[B, 1]``);
    ``"distance_weighted"`` keeps those within reach and adds their log-weights
    (``weights = (log_w, within)``) to its Gumbel noise (Gumbel-max sampling).
    """
    if strategy == "semihard":
        candidates = ops.logical_and(candidates, scores <= s_ap)
    elif strategy == "distance_weighted":
        log_w, candidates = _distance_candidates(*weights, candidates)
        noise = log_w + noise
    key = _STRATEGIES[role, strategy].key
    if key != "noise":
        noise = scores if key == "scores" else -scores
    return dml.masked_argmax(noise, candidates)


def _pick_per_pair(strategy, scores, candidates, seed, weights=None):
    """The negative of every (anchor, positive ``j``) pair by a ``per_pair`` strategy:
    ``(index, found)``, ``[B, R]`` (semi-hard from one sort per anchor, random and
    distance-weighted by inverse CDF)."""
    if strategy == "semihard":
        return _semihard_all(scores, candidates)
    if strategy == "distance_weighted":
        log_w, candidates = _distance_candidates(*weights, candidates)
    else:  # random: uniform weights
        log_w = ops.zeros_like(scores)
    return _draw_per_pair(log_w, candidates, seed)


def distance_log_weights(embeddings, ref_embeddings, lower_cutoff, upper_cutoff):
    """``(log_w, within)``: ``[B, R]`` log of ``1 / q(d)`` (Wu et al.'s distance-weighted
    sampling) and ``d < upper_cutoff`` (all True for None)."""
    if embeddings is None:
        raise ValueError(
            "negative='distance_weighted' needs the embeddings: call "
            "`mine(scores, labels, ..., embeddings=x, ref_embeddings=ref)` "
            "(tfdml losses pass them)."
        )
    x = ops.stop_gradient(ops.convert_to_tensor(embeddings))
    ref = x if ref_embeddings is None else ops.stop_gradient(
        ops.convert_to_tensor(ref_embeddings))
    x = ops.cast(x, dml.compute_dtype(x.dtype))
    ref = ops.cast(ref, dml.dtype_name(x))
    dist = dml.pairwise_distance(x, ref)
    dtype = dml.dtype_name(dist)
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
    dtype = dml.dtype_name(log_w)
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


@keras.saving.register_keras_serializable(package="tfdml")
class TripletMiner(Miner):
    """Selects one triplet (or all triplets) per anchor by positive and negative strategy.

    For anchor ``a`` with score ``s`` (cosine similarity, or negated
    distance) to every reference sample:

    * ``positive="easy"``: the most similar same-class sample;
      ``"hard"``: the least similar; ``"random"``: a uniformly random one;
      ``"all"``: every same-class sample (one triplet per positive).
    * ``negative="hard"``: the most similar other-class sample;
      ``"easy"``: the least similar; ``"random"``: a uniformly random one
      (drawn per (anchor, positive) pair when ``positive="all"``);
      ``"semihard"``: the most similar negative that is not more similar than
      the chosen positive (``s_an <= s_ap``); with ``positive="all"`` it is
      found per (anchor, positive) from one sort of each anchor's scores
      (``O(B R log R)`` time, ``O(B R)`` memory, also under XLA);
      ``"distance_weighted"``: a random negative drawn with probability
      proportional to ``1 / q(d)`` (Wu et al. 2017), where ``d`` is the
      Euclidean distance between the embeddings and
      ``q(d) ~ d^(n-2) (1 - d^2/4)^((n-3)/2)`` is the density of pairwise
      distances of points spread uniformly on the unit sphere in ``n``
      dimensions (see below);
      ``"all"``: every other-class sample.

    Distance-weighted sampling computes the weights in log space,
    ``log w = (2 - n) log d - (n - 3)/2 log(1 - d^2/4)``, with ``d`` clipped
    below at ``lower_cutoff`` (so that near-duplicates do not dominate) and
    ``1 - d^2/4`` clipped below at 1e-6 (antipodal points, or embeddings that
    are not unit vectors). Only negatives closer than ``upper_cutoff`` are
    drawn (farther ones have zero loss under the margin loss with its
    defaults, ``beta + margin = 1.4``); an anchor with no negative that close
    draws uniformly from all its negatives. One negative is drawn per
    (anchor, positive) pair, independently; with ``positive="all"`` the
    draws use one sort per anchor (inverse CDF), ``O(B R log R)``.
    The weights need the embeddings: tfdml losses pass them to the miner
    (``mine(..., embeddings=, ref_embeddings=)``), and mining without them
    raises a ValueError.

    The named combinations of the extreme-triplet paper: EPHN = ``("easy",
    "hard")``, EPSHN = ``("easy", "semihard")``, HPHN = ``("hard", "hard")``,
    EPEN = ``("easy", "easy")``. Easy positive sampling (EPS) of the
    class-collapse paper is ``positive="easy"`` with any negative strategy
    (``"random"``, ``"distance_weighted"``, ``"semihard"``); it needs more
    than two samples per class in a batch: with two, every anchor has a
    single positive and ``"easy"``, ``"hard"`` and ``"random"`` all pick it.

    An anchor without a positive, without a negative, or (semi-hard) without
    a negative at most as similar as its positive has no triplet and is left
    out of the loss. A sample is never its own positive.

    Args:
        positive: positive strategy. Defaults to `"easy"`.
        negative: negative strategy. Defaults to `"hard"`.
        disjoint: let every sample appear in at most one triplet, as in
            Section 6.1 of the extreme-triplet paper. Anchors are visited in
            batch order; each picks its positive and then its negative among
            the samples no earlier triplet used, and is skipped if it was
            itself used. Needs single-choice strategies (not ``"all"``).
            Defaults to `False`.
        seed: seed of the random strategies (``"random"``,
            ``"distance_weighted"``); the same seed gives the same sequence
            of choices. Defaults to `None` (unseeded).
        lower_cutoff: distance-weighted sampling: distances are clipped
            below at this value. Defaults to `0.5` (Wu et al.).
        upper_cutoff: distance-weighted sampling: only negatives closer than
            this are drawn; `None` draws from all. Defaults to `1.4` (Wu et
            al.'s code: ``beta + margin`` of the margin loss).

    Examples:

    >>> miner = tfdml.miners.TripletMiner("easy", "semihard")
    >>> loss = tfdml.losses.TripletNCALoss(order=2, miner=miner)
    >>> eps = tfdml.miners.TripletMiner("easy", "distance_weighted", seed=0)
    >>> loss = tfdml.losses.MarginLoss(miner=eps)

    Reference:
        Xuan, Stylianou, Pless, "Improved embeddings with easy positive
        triplet mining", WACV 2020; "Extreme triplet learning: effectively
        optimizing easy positives and hard negatives"; Wu, Manmatha, Smola,
        Krahenbuhl, "Sampling matters in deep embedding learning", ICCV 2017;
        "Reducing class collapse in metric learning with easy positive
        sampling".
    """

    def __init__(
        self,
        positive: str = "easy",
        negative: str = "hard",
        disjoint: bool = False,
        seed: int | None = None,
        lower_cutoff: float = 0.5,
        upper_cutoff: float | None = 1.4,
    ):
        check_choice("positive", positive, POSITIVE_STRATEGIES)
        check_choice("negative", negative, NEGATIVE_STRATEGIES)
        if disjoint and (positive == "all" or negative == "all"):
            raise ValueError(
                "`disjoint=True` needs single-choice strategies, not 'all'. "
                f"Received: positive={positive!r}, negative={negative!r}"
            )
        if seed is not None and (not isinstance(seed, numbers.Integral) or isinstance(seed, bool)):
            raise ValueError(f"`seed` must be an int or None. Received: seed={seed!r}")
        seed = None if seed is None else int(seed)
        if not dml.is_number(lower_cutoff) or not 0 <= lower_cutoff < 2:
            raise ValueError(
                f"`lower_cutoff` must be a number in [0, 2). Received: lower_cutoff={lower_cutoff!r}"
            )
        if upper_cutoff is not None and (not dml.is_number(upper_cutoff)
                                         or not upper_cutoff > lower_cutoff):
            raise ValueError(
                "`upper_cutoff` must be None or a number > lower_cutoff. "
                f"Received: upper_cutoff={upper_cutoff!r}, lower_cutoff={lower_cutoff!r}"
            )
        self.positive = positive
        self.negative = negative
        self.disjoint = bool(disjoint)
        self.seed = seed
        self.lower_cutoff = float(lower_cutoff)
        self.upper_cutoff = None if upper_cutoff is None else float(upper_cutoff)
        self._seed_generator = None
        if any(_STRATEGIES.get((role, name), _Strategy("")).noise is not None
               for role, name in (("positive", positive), ("negative", negative))):
            self._seed_generator = keras.random.SeedGenerator(seed)

    @property
    def blockwise(self):
        """Not with ``disjoint=True``: its anchors take their samples in batch order."""
        return not self.disjoint

    def get_config(self):
        return {
            "positive": self.positive,
            "negative": self.negative,
            "disjoint": self.disjoint,
            "seed": self.seed,
            "lower_cutoff": self.lower_cutoff,
            "upper_cutoff": self.upper_cutoff,
        }

    # -- mining --------------------------------------------------------------------------------

    def mine(self, scores, labels, ref_labels=None, ref_offset=0, embeddings=None,
             ref_embeddings=None) -> Triplets:
        scores = ops.stop_gradient(ops.convert_to_tensor(scores))
        dtype = dml.dtype_name(scores)
        positive_mask, negative_mask = dml.label_masks(labels, ref_labels, ref_offset)
        weights = None
        if self.negative == "distance_weighted":
            log_w, within = distance_log_weights(embeddings, ref_embeddings, self.lower_cutoff,
                                                 self.upper_cutoff)
            weights = (ops.cast(log_w, dtype), within)
        if self.disjoint:
            return self._mine_disjoint(scores, positive_mask, negative_mask, ref_offset, weights)
        shape = ops.shape(scores)

        if self.positive == "all":
            positive, s_ap, pair_found = None, scores, positive_mask
        else:
            index, found = _pick("positive", self.positive, scores, positive_mask,
                                 self._draw("positive", shape, dtype))
            positive = index[:, None]
            s_ap = dml.take_along_axis(scores, positive, axis=1)
            pair_found = found[:, None]

        if self.negative == "all":
            mask = ops.logical_and(pair_found[:, :, None], negative_mask[:, None, :])
            return Triplets(positive, None, mask)
        if positive is None and _STRATEGIES["negative", self.negative].per_pair:
            negative, found = _pick_per_pair(self.negative, scores, negative_mask,
                                             self._seed_generator, weights)
        else:  # one negative per anchor
            negative, found = _pick("negative", self.negative, scores, negative_mask,
                                    self._draw("negative", shape, dtype), s_ap, weights)
            negative = ops.broadcast_to(negative[:, None], ops.shape(pair_found))
            found = ops.broadcast_to(found[:, None], ops.shape(pair_found))
        mask = ops.logical_and(pair_found, found)[:, :, None]
        return Triplets(positive, negative, mask)

    def _draw(self, role, shape, dtype):
        """The noise of the ``role`` strategy (:data:`_STRATEGIES`), or None."""
        noise = _STRATEGIES[role, getattr(self, role)].noise
        return None if noise is None else noise(shape, dtype, self._seed_generator)

    def _mine_disjoint(self, scores, positive_mask, negative_mask, ref_offset, weights):
        shape = ops.shape(scores)
        batch, num_ref = shape[0], shape[1]
        dtype = dml.dtype_name(scores)
        noise_p = self._draw("positive", shape, dtype)
        noise_n = self._draw("negative", shape, dtype)
        ref_columns = ops.arange(num_ref, dtype="int32")
        batch_rows = ops.arange(batch, dtype="int32")
        offset = None if ref_offset is None else ops.cast(ref_offset, "int32")

        def body(i, state):
            used, positive, negative, valid = state

            def row(x):  # row i of a [B, R] tensor, as [1, R]
                return None if x is None else x[i][None, :]

            scores_i = row(scores)
            free = ops.logical_not(used)[None, :]
            p, p_found = _pick("positive", self.positive, scores_i,
                               ops.logical_and(row(positive_mask), free), row(noise_p))
            s_ap = dml.take_along_axis(scores_i, p[:, None], axis=1)
            n, n_found = _pick("negative", self.negative, scores_i,
                               ops.logical_and(row(negative_mask), free), row(noise_n), s_ap,
                               None if weights is None else tuple(row(w) for w in weights))
            ok = ops.logical_and(p_found[0], n_found[0])
            taken = ops.logical_or(ops.equal(ref_columns, p[0]), ops.equal(ref_columns, n[0]))
            if offset is not None:
                anchor = ops.equal(ref_columns, i + offset)
                anchor_free = ops.logical_not(ops.any(ops.logical_and(used, anchor)))
                ok = ops.logical_and(ok, anchor_free)
                taken = ops.logical_or(taken, anchor)
            used = ops.logical_or(used, ops.logical_and(ok, taken))
            here = ops.equal(batch_rows, i)
            positive = ops.where(here, p[0], positive)
            negative = ops.where(here, n[0], negative)
            valid = ops.logical_or(valid, ops.logical_and(here, ok))
            return used, positive, negative, valid

        zeros = ops.zeros((batch,), "int32")
        init = (ops.zeros((num_ref,), "bool"), zeros, zeros, ops.zeros((batch,), "bool"))
        _, positive, negative, valid = ops.fori_loop(0, batch, body, init)
        positive = ops.where(valid, positive, ops.zeros_like(positive))
        negative = ops.where(valid, negative, ops.zeros_like(negative))
        return Triplets(positive[:, None], negative[:, None], valid[:, None, None])


@keras.saving.register_keras_serializable(package="tfdml")
class AllPairsMiner(Miner):
    """No mining: every positive pair and every negative pair of each anchor.

    Returns :class:`Pairs` with the label masks: positives are the reference
    samples of the anchor's class (never the anchor itself), negatives all
    samples of other classes. Pair losses (contrastive, margin,
    multi-similarity) use each pair once; triplet losses use every
    (positive, negative) combination of an anchor (:func:`as_triplets`, a
    ``[B, R, R]`` mask). ``O(B R)`` memory for pair losses, ``O(B R^2)`` for
    triplet losses.

    It is what ``miner=None`` means for every tfdml loss (pytorch-metric-
    learning's reading of no miner); ``miner="default"`` is the loss's own
    miner.

    Examples:

    >>> loss = tfdml.losses.MultiSimilarityLoss(miner=tfdml.miners.AllPairsMiner())
    >>> loss = tfdml.losses.MultiSimilarityLoss(miner=None)  # the same
    """

    def mine(self, scores, labels, ref_labels=None, ref_offset=0, embeddings=None,
             ref_embeddings=None) -> Pairs:
        return Pairs(*dml.label_masks(labels, ref_labels, ref_offset))


@keras.saving.register_keras_serializable(package="tfdml")
class EmbeddingsAlreadyPackagedAsTriplets(Miner):
    """The triplets the batch comes in: rows ``(3i, 3i + 1, 3i + 2)`` are (anchor, positive,
    negative).

    For data that is already grouped in triplets (a triplet dataset, or a
    model that embeds each triplet's three inputs in a row). The groups are
    counted in the rows of the reference set (the batch itself, or the batch
    first in it, as :class:`tfdml.losses.CrossBatchMemory` puts it): anchor
    ``a`` is reference row ``r = a + ref_offset``, and if ``r`` is a multiple
    of 3 its one triplet is reference rows ``r + 1`` (positive) and ``r + 2``
    (negative). A loss running in blocks passes each block's offset, so the
    groups stay those of the whole batch. With ``ref_offset=None`` (the
    anchors are not in the reference set) anchor ``a`` is read as row ``a``,
    as pytorch-metric-learning indexes the reference set. The labels are not
    read: the packaging alone says which row is the positive and which the
    negative. Every other row is no anchor.
    Returns :class:`Triplets`, one per anchor (``[B, 1]`` indices and a
    ``[B, 1, 1]`` mask); every tfdml loss takes them.

    A batch whose size is not a multiple of 3 ends in an incomplete group:
    its last ``B mod 3`` rows form no triplet and are left out, eagerly and
    compiled alike (pytorch-metric-learning fails an assertion there: its
    index tensors have different lengths). A triplet whose rows fall
    outside the reference set is left out too; a reference set that goes on
    past the batch (a memory bank) would complete the batch's last group
    with its first rows, so keep such batches a multiple of 3.

    Examples:

    >>> miner = tfdml.miners.EmbeddingsAlreadyPackagedAsTriplets()
    >>> loss = tfdml.losses.TripletMarginLoss(miner=miner)
    >>> # y_pred: [3k, D], rows (anchor, positive, negative, anchor, ...)
    """

    def mine(self, scores, labels, ref_labels=None, ref_offset=0, embeddings=None,
             ref_embeddings=None) -> Triplets:
        shape = ops.shape(scores)
        batch, num_ref = shape[0], shape[1]
        rows = ops.arange(batch, dtype="int32")
        # The anchors' rows in the reference set (the whole batch when a loss runs in blocks).
        index = rows if ref_offset is None else rows + ops.cast(ref_offset, "int32")
        positive, negative = index + 1, index + 2
        valid = ops.logical_and(ops.equal(index % 3, 0),
                                ops.logical_and(index >= 0, negative < num_ref))
        if ref_offset is None:  # the group must be complete in the batch too
            valid = ops.logical_and(valid, rows + 2 < batch)
        zero = ops.zeros_like(rows)
        positive = ops.where(valid, positive, zero)
        negative = ops.where(valid, negative, zero)
        return Triplets(positive[:, None], negative[:, None], valid[:, None, None])


@keras.saving.register_keras_serializable(package="tfdml")
class MultiSimilarityMiner(Miner):
    """Pair mining of the multi-similarity loss, with an easy-positive option.

    For anchor ``a`` with scores ``S`` (cosine similarities for
    :class:`tfdml.losses.MultiSimilarityLoss`):

    * a negative pair ``(a, n)`` is kept if ``S_an > min_p S_ap - epsilon``,
      i.e. it is more similar than the anchor's least similar positive minus
      ``epsilon``;
    * ``positive="hard"``: a positive pair ``(a, p)`` is kept if
      ``S_ap < max_n S_an + epsilon``, less similar than the anchor's most
      similar negative plus ``epsilon`` (Wang et al. 2019);
      ``positive="easy"``: only the most similar positive is kept (easy
      positive sampling, EPS, of the class-collapse paper, which replaces the
      positive mining and keeps the same negative mining);
      ``positive="all"``: every positive pair is kept.

    The comparisons are strict, as in the authors' code. An anchor keeps
    pairs only if it has at least one positive and one negative in the
    reference set (the mining compares the two). ``epsilon`` is in the units
    of the scores. The authors' code also drops positive pairs with similarity
    above ``1 - 1e-5`` (to skip the anchor itself); tfdml excludes the anchor
    by index instead and keeps exact duplicates.

    EPS needs more than two samples per class in a batch: with two, the one
    positive is the easy one too.

    Args:
        epsilon: the mining margin, ``>= 0``. Defaults to `0.1` (Wang et al.).
        positive: ``"hard"``, ``"easy"`` or ``"all"``. Defaults to `"hard"`.

    Returns (from :meth:`mine`):
        :class:`Pairs`.

    Examples:

    >>> miner = tfdml.miners.MultiSimilarityMiner(epsilon=0.05, positive="easy")
    >>> loss = tfdml.losses.ContrastiveLoss(miner=miner)  # any pair loss

    Reference:
        The pair mining of Wang et al.'s multi-similarity loss (CVPR 2019) and
        the easy positives of the class-collapse paper; see
        :class:`tfdml.losses.MultiSimilarityLoss`.
    """

    def __init__(self, epsilon: float = 0.1, positive: str = "hard"):
        if not dml.is_number(epsilon) or not epsilon >= 0:
            raise ValueError(f"`epsilon` must be a number >= 0. Received: epsilon={epsilon!r}")
        check_choice("positive", positive, MS_POSITIVE_STRATEGIES)
        self.epsilon = float(epsilon)
        self.positive = positive

    def get_config(self):
        return {"epsilon": self.epsilon, "positive": self.positive}

    def mine(self, scores, labels, ref_labels=None, ref_offset=0, embeddings=None,
             ref_embeddings=None) -> Pairs:
        scores = ops.stop_gradient(ops.convert_to_tensor(scores))
        positive_mask, negative_mask = dml.label_masks(labels, ref_labels, ref_offset)
        return _multi_similarity_pairs(scores, positive_mask, negative_mask, self.epsilon,
                                       self.positive)


def _multi_similarity_pairs(scores, positive_mask, negative_mask, epsilon, positive="hard",
                            negatives=None) -> Pairs:
    """The pair mining of :class:`MultiSimilarityMiner` on ``[B, R]`` scores and label masks.

    Args:
        epsilon: the mining margin, in the units of the scores (any sign).
        positive: ``"hard"``, ``"easy"`` or ``"all"``.
        negatives: ``(scores, candidates)``, ``[B, N]`` each: other negatives, kept
            against the same threshold (the least similar positive of ``scores``), as
            LoOp's negative pairs of samples. Defaults to `None` (the negatives of
            ``scores``).
    """
    epsilon = ops.convert_to_tensor(epsilon, dml.dtype_name(scores))
    least_positive, has_positive = dml.masked_min(scores, positive_mask)
    negative_scores, candidates = (scores, negative_mask) if negatives is None else negatives
    negative = ops.logical_and(candidates, negative_scores + epsilon > least_positive[:, None])
    negative = ops.logical_and(negative, has_positive[:, None])
    if positive == "hard":
        most_negative, _ = dml.masked_max(scores, negative_mask)
        positive = ops.logical_and(positive_mask, scores - epsilon < most_negative[:, None])
    elif positive == "easy":
        index, found = dml.masked_argmax(scores, positive_mask)
        positive = _scatter_columns(index[:, None], found[:, None], ops.shape(scores)[1])
    else:
        positive = positive_mask
    has_negative = ops.any(negative_mask, axis=1, keepdims=True)
    return Pairs(ops.logical_and(positive, has_negative), negative)


# The distance miners live in their own module, which builds on this one.
from tfdml.distance_miners import (  # noqa: E402
    AngularMiner,
    BatchEasyHardMiner,
    HDCMiner,
    PairMarginMiner,
    TripletMarginMiner,
    UniformHistogramMiner,
)
