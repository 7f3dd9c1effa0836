"""Triplet miners: one triplet (or every triplet) per anchor by strategy, or the triplets
the batch comes packaged in.

:class:`TripletMiner` chooses each anchor's positive and negative by strategy (easy, hard,
semi-hard, random, distance-weighted, or all of them) through
:func:`tfdml.miners.selection.pick`; :class:`EmbeddingsAlreadyPackagedAsTriplets` reads
the triplets from the order of the batch's rows. Both return
:class:`tfdml.miners.Triplets`.
"""

from __future__ import annotations

import keras
from keras import ops

from tfdml import ops as dml
from tfdml._argument_checks import check_choice, is_number
from tfdml._docs import fill_doc
from tfdml._labels import check_min_jaccard
from tfdml._shims import dtype_name
from tfdml.miners.base import MIN_JACCARD_DOC, Miner, Triplets, check_seed
from tfdml.miners.selection import (
    NEGATIVE_STRATEGIES,
    POSITIVE_STRATEGIES,
    STRATEGIES,
    Strategy,
    distance_log_weights,
    pick,
    pick_per_pair,
)

__all__ = ["EmbeddingsAlreadyPackagedAsTriplets", "TripletMiner"]


@keras.saving.register_keras_serializable(package="tfdml")
@fill_doc(MIN_JACCARD=MIN_JACCARD_DOC)
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
        {MIN_JACCARD}

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
        min_jaccard: float | None = None,
    ):
        self.min_jaccard = check_min_jaccard(min_jaccard)
        check_choice("positive", positive, POSITIVE_STRATEGIES)
        check_choice("negative", negative, NEGATIVE_STRATEGIES)
        if disjoint and (positive == "all" or negative == "all"):
            raise ValueError(
                "`disjoint=True` needs single-choice strategies, not 'all'. "
                f"Received: positive={positive!r}, negative={negative!r}"
            )
        seed = check_seed(seed)
        if not is_number(lower_cutoff) or not 0 <= lower_cutoff < 2:
            raise ValueError(
                f"`lower_cutoff` must be a number in [0, 2). Received: lower_cutoff={lower_cutoff!r}"
            )
        if upper_cutoff is not None and (not is_number(upper_cutoff)
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
        if any(STRATEGIES.get((role, name), Strategy("")).noise is not None
               for role, name in (("positive", positive), ("negative", negative))):
            self._seed_generator = keras.random.SeedGenerator(seed)

    @property
    def blockwise(self):
        """Not with ``disjoint=True``: its anchors take their samples in batch order."""
        return not self.disjoint

    def get_config(self):
        return self.with_min_jaccard({
            "positive": self.positive,
            "negative": self.negative,
            "disjoint": self.disjoint,
            "seed": self.seed,
            "lower_cutoff": self.lower_cutoff,
            "upper_cutoff": self.upper_cutoff,
        })

    # -- mining --------------------------------------------------------------------------------

    def mine(self, scores, labels, ref_labels=None, ref_offset=0, embeddings=None,
             ref_embeddings=None) -> Triplets:
        scores = ops.stop_gradient(ops.convert_to_tensor(scores))
        dtype = dtype_name(scores)
        positive_mask, negative_mask = self.label_masks(labels, ref_labels, ref_offset)
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
            index, found = pick("positive", self.positive, scores, positive_mask,
                                self._draw("positive", shape, dtype))
            positive = index[:, None]
            s_ap = dml.take_along_axis(scores, positive, axis=1)
            pair_found = found[:, None]

        if self.negative == "all":
            mask = ops.logical_and(pair_found[:, :, None], negative_mask[:, None, :])
            return Triplets(positive, None, mask)
        if positive is None and STRATEGIES["negative", self.negative].per_pair:
            negative, found = pick_per_pair(self.negative, scores, negative_mask,
                                            self._seed_generator, weights)
        else:  # one negative per anchor
            negative, found = pick("negative", self.negative, scores, negative_mask,
                                   self._draw("negative", shape, dtype), s_ap, weights)
            negative = ops.broadcast_to(negative[:, None], ops.shape(pair_found))
            found = ops.broadcast_to(found[:, None], ops.shape(pair_found))
        mask = ops.logical_and(pair_found, found)[:, :, None]
        return Triplets(positive, negative, mask)

    def _draw(self, role, shape, dtype):
        """The noise of the ``role`` strategy (:data:`tfdml.miners.selection.STRATEGIES`), or
        None."""
        noise = STRATEGIES[role, getattr(self, role)].noise
        return None if noise is None else noise(shape, dtype, self._seed_generator)

    def _mine_disjoint(self, scores, positive_mask, negative_mask, ref_offset, weights):
        shape = ops.shape(scores)
        batch, num_ref = shape[0], shape[1]
        dtype = dtype_name(scores)
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
            p, p_found = pick("positive", self.positive, scores_i,
                              ops.logical_and(row(positive_mask), free), row(noise_p))
            s_ap = dml.take_along_axis(scores_i, p[:, None], axis=1)
            n, n_found = pick("negative", self.negative, scores_i,
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
    Returns :class:`tfdml.miners.Triplets`, one per anchor (``[B, 1]`` indices and a
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
