"""Miners: which positives and negatives each anchor is trained with.

A miner looks at a score matrix ``scores[a, r]`` (larger means more similar:
a cosine similarity, or a negated distance) between ``B`` anchors and ``R``
reference samples, and the class ids of both, and returns a fixed-shape
:class:`Triplets` description. Losses gather the scores of the chosen pairs
from it and apply their formula; mining itself is never differentiated.

Everything compiles under ``jit_compile=True``: selections are masked
arg-max/arg-min, sorts and searches of fixed shape. Only the
``positive="all", negative="all"`` strategy builds a ``[B, R, R]`` tensor.
"""

from __future__ import annotations

import numbers
from typing import NamedTuple

import keras
import tensorflow as tf

from tfdml import ops

__all__ = ["Miner", "TripletMiner", "Triplets", "gather_triplet_scores"]

POSITIVE_STRATEGIES = ("easy", "hard", "random", "all")
NEGATIVE_STRATEGIES = ("hard", "semihard", "easy", "random", "all")


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

    positive: tf.Tensor | None
    negative: tf.Tensor | None
    mask: tf.Tensor


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
        s_ap = tf.gather(scores, triplets.positive, batch_dims=1)
    if triplets.negative is None:
        s_an = scores[:, None, :]
    else:
        s_an = tf.gather(scores, triplets.negative, batch_dims=1)[:, :, None]
    return s_ap[:, :, None], s_an


class Miner:
    """Base class of tfdml miners: serializable objects passed to losses as ``miner=``."""

    def mine(self, scores, labels, ref_labels=None, ref_offset=0) -> Triplets:
        """Selects triplets.

        Args:
            scores: ``[B, R]`` float tensor, larger means more similar.
            labels: ``[B]`` class ids of the anchors.
            ref_labels: ``[R]`` class ids of the reference set. Defaults to
                ``labels`` (the reference set is the batch).
            ref_offset: anchor ``i`` is reference row ``i + ref_offset``
                (excluded from its positives); ``None`` when the anchors are
                not in the reference set. Defaults to `0`.
        """
        raise NotImplementedError

    def __call__(self, scores, labels, ref_labels=None, ref_offset=0) -> Triplets:
        return self.mine(scores, labels, ref_labels=ref_labels, ref_offset=ref_offset)

    def get_config(self) -> dict:
        return {}

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({args})"


def _row_scatter(target, columns, updates, scatter=tf.tensor_scatter_nd_update):
    """``target[b, columns[b, t]] = updates[b, t]`` (or combined by ``scatter``) for all b, t."""
    rows = tf.broadcast_to(tf.range(tf.shape(columns)[0])[:, None], tf.shape(columns))
    return scatter(target, tf.stack([rows, columns], axis=-1), updates)


def _compact(mask, values):
    """Per row, the ``values`` where ``mask`` is true, moved to the front in order: [B, R].

    Entries past the row's count are 0.
    """
    width = tf.shape(mask)[1]
    slot = tf.where(mask, tf.cumsum(tf.cast(mask, tf.int32), axis=1) - 1, width)
    target = tf.zeros([tf.shape(mask)[0], width + 1], values.dtype)  # column `width`: discard
    return _row_scatter(target, slot, values)[:, :width]


def _check_choice(name, value, allowed):
    if value not in allowed:
        raise ValueError(f"`{name}` must be one of {allowed}. Received: {name}={value!r}")


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
      ``"all"``: every other-class sample.

    The named combinations of the extreme-triplet paper: EPHN = ``("easy",
    "hard")``, EPSHN = ``("easy", "semihard")``, HPHN = ``("hard", "hard")``,
    EPEN = ``("easy", "easy")``.

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
        seed: seed of the random strategies; the same seed gives the same
            sequence of choices. Defaults to `None` (unseeded).

    Examples:

    >>> miner = tfdml.miners.TripletMiner("easy", "semihard")
    >>> loss = tfdml.losses.TripletNCALoss(order=2, miner=miner)

    Reference:
        Xuan, Stylianou, Pless, "Improved embeddings with easy positive
        triplet mining", WACV 2020; "Extreme triplet learning: effectively
        optimizing easy positives and hard negatives".
    """

    def __init__(
        self,
        positive: str = "easy",
        negative: str = "hard",
        disjoint: bool = False,
        seed: int | None = None,
    ):
        _check_choice("positive", positive, POSITIVE_STRATEGIES)
        _check_choice("negative", negative, NEGATIVE_STRATEGIES)
        if disjoint and (positive == "all" or negative == "all"):
            raise ValueError(
                "`disjoint=True` needs single-choice strategies, not 'all'. "
                f"Received: positive={positive!r}, negative={negative!r}"
            )
        if seed is not None and (not isinstance(seed, numbers.Integral) or isinstance(seed, bool)):
            raise ValueError(f"`seed` must be an int or None. Received: seed={seed!r}")
        seed = None if seed is None else int(seed)
        self.positive = positive
        self.negative = negative
        self.disjoint = bool(disjoint)
        self.seed = seed
        self._seed_generator = None
        if "random" in (positive, negative):
            self._seed_generator = keras.random.SeedGenerator(seed)

    def get_config(self):
        return {
            "positive": self.positive,
            "negative": self.negative,
            "disjoint": self.disjoint,
            "seed": self.seed,
        }

    # -- helpers -------------------------------------------------------------------------------

    def _noise(self, shape, dtype):
        return keras.random.uniform(shape, dtype=dtype, seed=self._seed_generator)

    def _pick(self, strategy, scores, mask, noise):
        """Single choice along the last axis: ``(index, found)``."""
        if strategy in ("easy_positive", "hard_negative"):
            return ops.masked_argmax(scores, mask)
        if strategy in ("hard_positive", "easy_negative"):
            return ops.masked_argmin(scores, mask)
        return ops.masked_argmax(noise, mask)  # random

    def _semihard_single(self, scores, negative_mask, s_ap):
        """Semi-hard negative for one positive per anchor. ``s_ap`` has shape [B, 1]."""
        candidates = tf.logical_and(negative_mask, scores <= s_ap)
        return ops.masked_argmax(scores, candidates)

    def _random_all(self, negative_mask):
        """A uniformly random negative for every (anchor, positive = reference j) pair: [B, R].

        Draws ``u ~ U[0, 1)`` per pair and takes the ``floor(u * count)``-th
        negative of the anchor in reference order: O(B R) memory, no sort.
        """
        count = tf.reduce_sum(tf.cast(negative_mask, tf.int32), axis=1, keepdims=True)
        columns = tf.broadcast_to(tf.range(tf.shape(negative_mask)[1]), tf.shape(negative_mask))
        negatives = _compact(negative_mask, columns)
        u = self._noise(tf.shape(negative_mask), tf.float32)
        k = tf.minimum(tf.cast(u * tf.cast(count, tf.float32), tf.int32), tf.maximum(count - 1, 0))
        index = tf.gather(negatives, k, batch_dims=1)
        found = tf.broadcast_to(count > 0, tf.shape(index))
        return tf.where(found, index, tf.zeros_like(index)), found

    @staticmethod
    def _semihard_all(scores, negative_mask):
        """Semi-hard negative for every (anchor, positive = reference j) pair: [B, R].

        One stable sort per row, then counts instead of searches (a batched
        binary search lowers to a [B, R, R] comparison under XLA):
        ``count[a, j]`` = number of negatives with score <= ``scores[a, j]``,
        ties included, and the semi-hard negative is the ``count``-th
        smallest negative. O(B R log R) time, O(B R) memory.
        """
        order = tf.argsort(scores, axis=1, stable=True)
        values = tf.gather(scores, order, batch_dims=1)
        is_negative = tf.gather(negative_mask, order, batch_dims=1)
        negatives_so_far = tf.cumsum(tf.cast(is_negative, tf.int32), axis=1)
        # Extend each position to the end of its group of equal scores.
        starts = tf.concat(
            [tf.ones_like(values[:, :1], tf.bool), tf.not_equal(values[:, 1:], values[:, :-1])],
            axis=1,
        )
        group = tf.cumsum(tf.cast(starts, tf.int32), axis=1) - 1
        positions = tf.broadcast_to(tf.range(tf.shape(order)[1]), tf.shape(order))
        group_end = _row_scatter(tf.zeros_like(order), group, positions, tf.tensor_scatter_nd_max)
        last = tf.gather(group_end, group, batch_dims=1)
        count_sorted = tf.gather(negatives_so_far, last, batch_dims=1)
        count = _row_scatter(tf.zeros_like(order), order, count_sorted)  # back to reference order
        negatives = _compact(is_negative, order)  # reference indices, ascending score
        found = count > 0
        index = tf.gather(negatives, tf.maximum(count - 1, 0), batch_dims=1)
        return tf.where(found, index, tf.zeros_like(index)), found

    # -- mining --------------------------------------------------------------------------------

    def mine(self, scores, labels, ref_labels=None, ref_offset=0) -> Triplets:
        scores = tf.stop_gradient(tf.convert_to_tensor(scores))
        positive_mask, negative_mask = ops.label_masks(labels, ref_labels, ref_offset)
        if self.disjoint:
            return self._mine_disjoint(scores, positive_mask, negative_mask, ref_offset)
        shape = tf.shape(scores)

        if self.positive == "all":
            positive = None
            s_ap = scores
            pair_found = positive_mask
        else:
            noise = self._noise(shape, scores.dtype) if self.positive == "random" else None
            index, pair_found = self._pick(self.positive + "_positive", scores, positive_mask, noise)
            positive = index[:, None]
            s_ap = tf.gather(scores, positive, batch_dims=1)
            pair_found = pair_found[:, None]

        if self.negative == "all":
            mask = tf.logical_and(pair_found[:, :, None], negative_mask[:, None, :])
            return Triplets(positive, None, mask)

        if self.negative == "semihard":
            if positive is None:
                negative, found = self._semihard_all(scores, negative_mask)
            else:
                negative, found = self._semihard_single(scores, negative_mask, s_ap)
                negative, found = negative[:, None], found[:, None]
        elif self.negative == "random" and positive is None:
            negative, found = self._random_all(negative_mask)
        else:
            noise = self._noise(shape, scores.dtype) if self.negative == "random" else None
            negative, found = self._pick(self.negative + "_negative", scores, negative_mask, noise)
            negative = tf.broadcast_to(negative[:, None], tf.shape(pair_found))
            found = tf.broadcast_to(found[:, None], tf.shape(pair_found))
        mask = tf.logical_and(pair_found, found)[:, :, None]
        return Triplets(positive, negative, mask)

    def _mine_disjoint(self, scores, positive_mask, negative_mask, ref_offset):
        batch = tf.shape(scores)[0]
        num_ref = tf.shape(scores)[1]
        noise_p = self._noise(tf.shape(scores), scores.dtype) if self.positive == "random" else None
        noise_n = self._noise(tf.shape(scores), scores.dtype) if self.negative == "random" else None
        ref_columns = tf.range(num_ref, dtype=tf.int32)
        batch_rows = tf.range(batch, dtype=tf.int32)
        offset = None if ref_offset is None else tf.cast(ref_offset, tf.int32)

        def body(i, used, positive, negative, valid):
            row = scores[i][None, :]
            free = tf.logical_not(used)[None, :]
            p_mask = tf.logical_and(positive_mask[i][None, :], free)
            p, p_found = self._pick(
                self.positive + "_positive", row, p_mask,
                None if noise_p is None else noise_p[i][None, :],
            )
            s_ap = tf.gather(row, p[:, None], batch_dims=1)
            n_mask = tf.logical_and(negative_mask[i][None, :], free)
            if self.negative == "semihard":
                n, n_found = self._semihard_single(row, n_mask, s_ap)
            else:
                n, n_found = self._pick(
                    self.negative + "_negative", row, n_mask,
                    None if noise_n is None else noise_n[i][None, :],
                )
            ok = tf.logical_and(p_found[0], n_found[0])
            taken = tf.logical_or(tf.equal(ref_columns, p[0]), tf.equal(ref_columns, n[0]))
            if offset is not None:
                anchor_free = tf.logical_not(used[i + offset])
                ok = tf.logical_and(ok, anchor_free)
                taken = tf.logical_or(taken, tf.equal(ref_columns, i + offset))
            used = tf.logical_or(used, tf.logical_and(ok, taken))
            here = tf.equal(batch_rows, i)
            positive = tf.where(here, p[0], positive)
            negative = tf.where(here, n[0], negative)
            valid = tf.logical_or(valid, tf.logical_and(here, ok))
            return i + 1, used, positive, negative, valid

        zeros = tf.zeros([batch], tf.int32)
        _, _, positive, negative, valid = tf.while_loop(
            lambda i, *_: i < batch,
            body,
            (tf.constant(0), tf.zeros([num_ref], tf.bool), zeros, zeros, tf.zeros([batch], tf.bool)),
        )
        positive = tf.where(valid, positive, 0)
        negative = tf.where(valid, negative, 0)
        return Triplets(positive[:, None], negative[:, None], valid[:, None, None])
