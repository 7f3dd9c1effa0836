"""The pairs of the LoOp losses: disjoint same-class pairs formed from the labels, and the
distances of a batch's samples and pairs that the losses of :mod:`tfdml.losses.loop` read.

Pairs are formed from the labels, not from positions in the batch: the samples of each
class, in batch order, are paired as (1st, 2nd), (3rd, 4th), ... (:func:`label_pairs`).
Everything is computed from the ``B x B`` matrix of dot products (:class:`Geometry`), or
from rows of it for blocks of pairs (:class:`LabelPairs`, :class:`SlotBlock`): no
``[B, B, D]`` tensor, and it compiles under XLA.
"""

from __future__ import annotations

import functools

from keras import ops

from tfdml import geometry
from tfdml import ops as dml
from tfdml._shims import dtype_name
from tfdml.geometry._arc_solver import arc_solve
from tfdml.miners import TripletMiner

__all__ = ["Geometry", "LabelPairs", "SlotBlock", "by_sample", "gather", "head", "label_pairs",
           "ordered", "pair_layout"]


def label_pairs(labels):
    """Disjoint same-class pairs, formed from the class ids.

    The samples of each class, in batch order, are paired as (1st, 2nd),
    (3rd, 4th), ...; with an odd count the last one stays unpaired. The result
    has one slot per sample (fixed shape ``[B]``, XLA-friendly): slot ``t`` holds
    the pair ``(first[t], second[t])`` when ``valid[t]``.

    Args:
        labels: ``[B]`` int class ids.

    Returns:
        ``(first, second, valid)``: int32 sample indices ``[B]`` and bool ``[B]``.
        Every sample is the ``first`` of exactly one slot (valid or not).
    """
    labels = dml.cast_labels(labels)
    size = ops.shape(labels)[0]
    order = dml.stable_argsort(labels)
    ordered = ops.take(labels, order, axis=0)
    positions = ops.arange(size, dtype="int32")
    starts = ops.concatenate(
        [ops.ones_like(ordered[:1], dtype="bool"), ops.not_equal(ordered[1:], ordered[:-1])], 0)
    group = ops.cumsum(ops.cast(starts, "int32")) - 1
    # The first position of each group: the positions of the starts, in order (a stable
    # sort puts them first), taken at the group index.
    first_of_group = ops.take(positions, dml.stable_argsort(ops.logical_not(starts)), axis=0)
    group_start = ops.take(first_of_group, group, axis=0)
    rank = positions - group_start
    next_same = ops.concatenate(
        [ops.equal(ordered[1:], ordered[:-1]), ops.zeros_like(ordered[:1], dtype="bool")], 0)
    valid = ops.logical_and(ops.equal(rank % 2, 0), next_same)
    second = ops.concatenate([order[1:], order[:1]], 0)
    return order, second, valid


def gather(x, index, axis=0):
    return ops.take(x, index, axis=axis)


def pair_layout(labels):
    """A batch order with the label pairs in two blocks: ``(perm, valid)``.

    With ``S = B // 2`` (there are at most ``S`` pairs), ``labels[perm]`` has pair ``t`` of
    :func:`label_pairs` (in their order) at positions ``t`` and ``S + t`` where ``valid[t]``
    (``[S]``, the valid ones first); the unpaired samples fill the other positions. In that
    order the products of the pairs' samples are blocks of the batch's ``[B, B]`` matrices.
    """
    order, _, starts = label_pairs(labels)  # a pair (order[p], order[p + 1]) where starts[p]
    size = ops.shape(order)[0]
    num_slots = size // 2
    starts_i = ops.cast(starts, "int32")
    pair = ops.cumsum(starts_i) - 1
    seconds = ops.concatenate([ops.zeros_like(starts[:1]), starts[:-1]], 0)
    num_pairs = ops.sum(starts_i)
    alone = ops.cumsum(ops.cast(ops.logical_not(ops.logical_or(starts, seconds)), "int32")) - 1
    skip = ops.where(alone >= num_slots - num_pairs, num_pairs, 0)  # past the second block
    position = ops.where(starts, pair, ops.where(seconds, num_slots + pair,
                                                 num_pairs + alone + skip))
    perm = dml.scatter_rows(ops.zeros((1, size), "int32"), position[None, :], order[None, :])
    return perm[0], ops.arange(num_slots, dtype="int32") < num_pairs


def _permuted(x, perm):
    """``x[perm]`` for a permutation ``perm``, as a scatter: its gradient is a dense tensor
    (a gather's is TensorFlow's ``IndexedSlices``, which would reach the loss's caller)."""
    inverse = ops.scatter_update(ops.zeros_like(perm), perm[:, None],
                                 ops.arange(ops.shape(perm)[0], dtype="int32"))
    return ops.scatter_update(ops.zeros_like(x), inverse[:, None], x)


def by_sample(samples, values, valid, size):
    """``values`` (and ``valid``) moved to the indices ``samples``: ``[size]``, 0 elsewhere."""
    columns = samples[None, :]  # distinct samples: a scatter without repeated indices
    values = dml.scatter_rows(ops.zeros((1, size), dtype_name(values)), columns,
                              values[None, :])
    valid = dml.scatter_rows(ops.zeros((1, size), "int32"), columns,
                             ops.cast(valid, "int32")[None, :])
    return values[0], valid[0] > 0


def _arc_similarity(x1x2, y1y2, x1y1, x1y2, x2y1, x2y2):
    """:func:`tfdml.geometry.arc_similarity_from_dots`, differentiated by the envelope theorem.

    At the optimum ``s = sum_ij a_i b_j (x_i . y_j)`` for the unit vectors
    ``p1 = a1 x1 + a2 x2`` and ``p2 = b1 y1 + b2 y2``, so
    ``ds = sum_ij a_i b_j d(x_i . y_j) - s (a1 a2 d(x1 . x2) + b1 b2 d(y1 . y2))``: the
    gradient of the solver's winning candidate, as a few products of the coefficients
    instead of a backward pass through all nine candidates. The value is the solver's.
    The arguments go to the solver unbroadcast (``x1x2`` is ``[t, 1]`` for rows of arcs),
    so that an arc's own terms are computed once per arc, not once per pair of arcs.
    """
    dots = (x1x2, y1y2, x1y1, x1y2, x2y1, x2y2)
    fixed = [ops.stop_gradient(d) for d in dots]
    s, a1, a2, b1, b2, _ = arc_solve(*fixed)
    g, h, c11, c12, c21, c22 = (d - f for d, f in zip(dots, fixed, strict=True))  # zeros
    first_order = a1 * (b1 * c11 + b2 * c12) + a2 * (b1 * c21 + b2 * c22)
    return s + (first_order - s * (a1 * a2 * g + b1 * b2 * h))


def _loop_squared_distance(normalized, own, dots):
    """``[t, S]`` squared LoOp distances between pairs ``(x1, x2)`` and ``(y1, y2)``.

    ``own``: ``(x1 . x2, |x1|^2, |x2|^2)`` of the ``t`` row pairs and of the ``S`` column
    pairs (``([t], [S])`` each); ``dots``: ``(x1 . y1, x1 . y2, x2 . y1, x2 . y2)``, ``[t, S]``.
    """
    rows = [r[:, None] for r, _ in own]
    columns = [c[None, :] for _, c in own]
    if normalized:
        s = _arc_similarity(rows[0], columns[0], *dots)
        return dml.maximum(2.0 - 2.0 * s, ops.zeros_like(s))
    squared = geometry.segment_squared_distance_from_dots(
        rows[1], rows[2], rows[0], columns[1], columns[2], columns[0], *dots)
    return dml.maximum(squared, ops.zeros_like(squared))


def _negative_pairs(valid_rows, labels_rows, valid, labels):
    """``[t, S]``: row pair and column pair both real, and of different classes."""
    both = ops.logical_and(valid_rows[:, None], valid[None, :])
    return ops.logical_and(both, ops.not_equal(labels_rows[:, None], labels[None, :]))


_HARD_MINER = TripletMiner("hard", "hard")


def _hardest(dist, row_labels, labels):
    """``(farthest positive, closest negative, has a negative)`` of rows of distances.

    ``TripletMiner("hard", "hard")`` on ``-dist``; ``ref_offset=None`` counts each sample
    among its own positives, as ``max_{c[k] = c[i]} d_ik`` does.
    """
    mined = _HARD_MINER.mine(-dist, row_labels, labels, ref_offset=None)
    far = dml.take_along_axis(dist, mined.positive, axis=1)[:, 0]
    near = dml.take_along_axis(dist, mined.negative, axis=1)[:, 0]
    return far, near, mined.mask[:, 0, 0]


def head(x, n, axes):
    """The first ``n`` rows (and columns, ``axes=2``) of ``x``; ``x`` itself when it has ``n``
    (an even batch: no slice, whose gradient would be a padded copy)."""
    if isinstance(n, int) and x.shape[0] == n:
        return x
    return x[:n, :n] if axes == 2 else x[:n]


def _rows(x, rows):
    """The rows ``rows`` of ``x``: a slice, or int indices."""
    return x[rows] if isinstance(rows, slice) else gather(x, rows)


def ordered(labels, x, layout):
    """``(labels, x, perm, valid, ends)`` of a batch and its :func:`_pair_layout`.

    ``layout``: the batch put in that order, the rows of the pairs' first samples and of their
    second ones two slices (``ends``); otherwise the batch as it is and ``ends`` their indices.
    """
    perm, valid = pair_layout(labels)
    num_slots = ops.shape(valid)[0]
    if layout:
        return (gather(labels, perm), _permuted(x, perm), perm, valid,
                (slice(0, num_slots), slice(num_slots, 2 * num_slots)))
    return labels, x, perm, valid, (perm[:num_slots], perm[num_slots:2 * num_slots])


class Geometry:
    """A whole batch: its ``[B, B]`` distances and the ``[S, S]`` LoOp distances between its
    pairs (``S = B // 2``), from one matrix product. ``layout``: in the order of
    :func:`_pair_layout` (for the LoOp distances); otherwise in the batch's order."""

    def __init__(self, labels, x, normalized, layout=True):
        self.labels, self.x, self.perm, self.valid, self.ends = ordered(labels, x, layout)
        self.normalized, self.layout, self.size = normalized, layout, ops.shape(labels)[0]

    @functools.cached_property
    def gram(self):
        return dml.pairwise_similarity(self.x, self.x)

    @functools.cached_property
    def squared(self):
        if not self.layout:  # no LoOp distances, no dot products
            return dml.pairwise_distance(self.x, self.x, squared=True)
        # -2 x @ x^T is exactly -2 times the dot products: one product for both.
        return dml.pairwise_distance_from_products(self.x, self.x, -2.0 * self.gram,
                                                    squared=True)

    @functools.cached_property
    def dist(self):
        return dml.safe_sqrt(self.squared)

    @functools.cached_property
    def sim(self):
        """``s = 1 - d^2 / 2`` (the dot products of unit vectors)."""
        return 1.0 - 0.5 * self.squared

    @functools.cached_property
    def pair_dist(self):
        """The distances within the pairs, read off the flattened matrix."""
        first, second = (ops.arange(end.start, end.stop, dtype="int32")
                         if isinstance(end, slice) else end for end in self.ends)
        return gather(ops.reshape(self.dist, [-1]), first * self.size + second)

    def loop_rows(self):
        """``(squared loop distances, negative pairs)``, ``[S, S]``."""
        a, b = self.ends
        # The four [S, S] blocks of the pairs' samples, by splits (whose gradients are
        # concatenations, not four [B, B] paddings).
        dots = tuple(block for half in ops.split(head(self.gram, b.stop, 2), 2, axis=0)
                     for block in ops.split(half, 2, axis=1))
        own = [(d, d) for d in (ops.diagonal(dots[1]), ops.diagonal(dots[0]),
                                ops.diagonal(dots[3]))]
        labels = self.labels[a]
        return (_loop_squared_distance(self.normalized, own, dots),
                _negative_pairs(self.valid, labels, self.valid, labels))

    def hardest(self, end):
        rows = self.ends[end]
        return _hardest(_rows(self.dist, rows), _rows(self.labels, rows), self.labels)

    def by_sample(self, slot_values, slot_valid):
        return by_sample(self.perm[: ops.shape(self.valid)[0]], slot_values, slot_valid,
                          self.size)


class LabelPairs:
    """A batch, its pairs (``ends``: the indices of their samples) and rows of distances.

    ``O(B D)`` here; :meth:`loop_rows` is ``O(t S)`` for ``t`` rows, no ``[B, B]`` matrix.
    """

    def __init__(self, labels, x, normalized, valid, ends):
        self.labels, self.x, self.normalized, self.valid = labels, x, normalized, valid
        self.first, self.second = ends
        self.pair_labels = gather(labels, self.first)
        self.xa, self.xb = gather(x, self.first), gather(x, self.second)

    def distance_rows(self, samples):
        """``[t, B]`` distances of the samples ``samples`` to every sample."""
        return dml.pairwise_distance(gather(self.x, samples), self.x)

    def similarity_rows(self, samples):
        """``[t, B]`` similarities ``s = 1 - d^2 / 2`` (:attr:`Geometry.sim`)."""
        return 1.0 - 0.5 * dml.pairwise_distance(gather(self.x, samples), self.x, squared=True)

    def loop_rows(self, slots):
        """``(squared loop distances, negative pairs)`` of the pairs ``slots``: ``[t, S]``."""
        xa, xb = gather(self.xa, slots), gather(self.xb, slots)
        dots = tuple(dml.pairwise_similarity(u, v) for u in (xa, xb) for v in (self.xa, self.xb))
        own = [(gather(c, slots), c) for c in (
            ops.sum(self.xa * self.xb, axis=1), ops.sum(ops.square(self.xa), axis=1),
            ops.sum(ops.square(self.xb), axis=1))]
        mask = _negative_pairs(gather(self.valid, slots), gather(self.pair_labels, slots),
                               self.valid, self.pair_labels)
        return _loop_squared_distance(self.normalized, own, dots), mask


class SlotBlock:
    """What :func:`_pair_losses` reads, for a block of the pairs of a :class:`LabelPairs`."""

    def __init__(self, pairs: LabelPairs, slots):
        self.pairs, self._slots = pairs, slots
        self.ends = (gather(pairs.first, slots), gather(pairs.second, slots))
        self.valid = gather(pairs.valid, slots)
        self.pair_dist = dml.paired_distance(
            gather(pairs.xa, slots), gather(pairs.xb, slots), "l2")

    def loop_rows(self):
        return self.pairs.loop_rows(self._slots)

    def hardest(self, end):
        labels, rows = self.pairs.labels, self.ends[end]
        return _hardest(self.pairs.distance_rows(rows), gather(labels, rows), labels)

    def by_sample(self, slot_values, slot_valid):
        return slot_values, slot_valid  # moved to the samples once the blocks are together
