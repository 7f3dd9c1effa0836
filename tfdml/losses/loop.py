"""LoOp: optimal hard negatives (minimum distance between arcs), its four losses and baselines.

"LoOp: Looking for Optimal Hard Negative Embeddings for Deep Metric Learning"
(Vasudeva et al., ICCV 2021). For a positive pair ``(x1, x2)`` and a negative pair
``(y1, y2)`` of another class, the LoOp distance ``d_ijkl`` is the minimum
distance between the great-circle arc ``x1 -> x2`` and the arc ``y1 -> y2``
(:func:`tfdml.geometry.arc_distance`), or between the straight segments when the
embeddings are not normalized (:func:`tfdml.geometry.segment_distance`). It
replaces the anchor-negative distance of four losses (Section 3.3).

Pairs are formed from the labels, not from positions in the batch: the samples of
each class, in batch order, are paired as (1st, 2nd), (3rd, 4th), ... A class with
an odd number of samples leaves its last one unpaired (see :func:`label_pairs`).
Everything is computed from the ``B x B`` matrix of dot products: no ``[B, B, D]``
tensor, and it compiles under XLA.
"""

from __future__ import annotations

import functools

import keras
from keras import ops

from tfdml import geometry
from tfdml import ops as dml
from tfdml.losses.base import MetricLoss, anchor_terms, functional_value, prepare_inputs
from tfdml.losses.blocks import RowBlocks, batch_rows
from tfdml.losses.multi_similarity import _ms_values
from tfdml.losses.spec import loss_class
from tfdml.miners import TripletMiner, _multi_similarity_pairs

__all__ = [
    "HPHNTripletLoss",
    "LiftedStructureLoss",
    "LoOpLoss",
    "hphn_triplet_loss",
    "label_pairs",
    "lifted_structure_loss",
    "loop_loss",
]

BASES = ("triplet", "hphn_triplet", "lifted_structure", "multi_similarity")
_MS_OPTIONS = {"alpha": 2.0, "beta": 50.0, "epsilon": 0.1}
_DEFAULT_MARGIN = {"triplet": 0.2, "hphn_triplet": 0.2, "lifted_structure": 0.2,
                   "multi_similarity": 0.5}



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


def _gather(x, index, axis=0):
    return ops.take(x, index, axis=axis)


def _pair_layout(labels):
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


def _by_sample(samples, values, valid, size):
    """``values`` (and ``valid``) moved to the indices ``samples``: ``[size]``, 0 elsewhere."""
    columns = samples[None, :]  # distinct samples: a scatter without repeated indices
    values = dml.scatter_rows(ops.zeros((1, size), dml.dtype_name(values)), columns,
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
    s, a1, a2, b1, b2, _ = geometry._arc_solve(*fixed)
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


def _head(x, n, axes):
    """The first ``n`` rows (and columns, ``axes=2``) of ``x``; ``x`` itself when it has ``n``
    (an even batch: no slice, whose gradient would be a padded copy)."""
    if isinstance(n, int) and x.shape[0] == n:
        return x
    return x[:n, :n] if axes == 2 else x[:n]


def _rows(x, rows):
    """The rows ``rows`` of ``x``: a slice, or int indices."""
    return x[rows] if isinstance(rows, slice) else _gather(x, rows)


def _ordered(labels, x, layout):
    """``(labels, x, perm, valid, ends)`` of a batch and its :func:`_pair_layout`.

    ``layout``: the batch put in that order, the rows of the pairs' first samples and of their
    second ones two slices (``ends``); otherwise the batch as it is and ``ends`` their indices.
    """
    perm, valid = _pair_layout(labels)
    num_slots = ops.shape(valid)[0]
    if layout:
        return (_gather(labels, perm), _permuted(x, perm), perm, valid,
                (slice(0, num_slots), slice(num_slots, 2 * num_slots)))
    return labels, x, perm, valid, (perm[:num_slots], perm[num_slots:2 * num_slots])


class _Geometry:
    """A whole batch: its ``[B, B]`` distances and the ``[S, S]`` LoOp distances between its
    pairs (``S = B // 2``), from one matrix product. ``layout``: in the order of
    :func:`_pair_layout` (for the LoOp distances); otherwise in the batch's order."""

    def __init__(self, labels, x, normalized, layout=True):
        self.labels, self.x, self.perm, self.valid, self.ends = _ordered(labels, x, layout)
        self.normalized, self.layout, self.size = normalized, layout, ops.shape(labels)[0]

    @functools.cached_property
    def gram(self):
        return dml.pairwise_similarity(self.x, self.x)

    @functools.cached_property
    def squared(self):
        if not self.layout:  # no LoOp distances, no dot products
            return dml.pairwise_distance(self.x, self.x, squared=True)
        # -2 x @ x^T is exactly -2 times the dot products: one product for both.
        return dml._pairwise_distance_from_products(self.x, self.x, -2.0 * self.gram,
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
        return _gather(ops.reshape(self.dist, [-1]), first * self.size + second)

    def loop_rows(self):
        """``(squared loop distances, negative pairs)``, ``[S, S]``."""
        a, b = self.ends
        # The four [S, S] blocks of the pairs' samples, by splits (whose gradients are
        # concatenations, not four [B, B] paddings).
        dots = tuple(block for half in ops.split(_head(self.gram, b.stop, 2), 2, axis=0)
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
        return _by_sample(self.perm[: ops.shape(self.valid)[0]], slot_values, slot_valid,
                          self.size)


class _LabelPairs:
    """A batch, its pairs (``ends``: the indices of their samples) and rows of distances.

    ``O(B D)`` here; :meth:`loop_rows` is ``O(t S)`` for ``t`` rows, no ``[B, B]`` matrix.
    """

    def __init__(self, labels, x, normalized, valid, ends):
        self.labels, self.x, self.normalized, self.valid = labels, x, normalized, valid
        self.first, self.second = ends
        self.pair_labels = _gather(labels, self.first)
        self.xa, self.xb = _gather(x, self.first), _gather(x, self.second)

    def distance_rows(self, samples):
        """``[t, B]`` distances of the samples ``samples`` to every sample."""
        return dml.pairwise_distance(_gather(self.x, samples), self.x)

    def similarity_rows(self, samples):
        """``[t, B]`` similarities ``s = 1 - d^2 / 2`` (:attr:`_Geometry.sim`)."""
        return 1.0 - 0.5 * dml.pairwise_distance(_gather(self.x, samples), self.x, squared=True)

    def loop_rows(self, slots):
        """``(squared loop distances, negative pairs)`` of the pairs ``slots``: ``[t, S]``."""
        xa, xb = _gather(self.xa, slots), _gather(self.xb, slots)
        dots = tuple(dml.pairwise_similarity(u, v) for u in (xa, xb) for v in (self.xa, self.xb))
        own = [(_gather(c, slots), c) for c in (
            ops.sum(self.xa * self.xb, axis=1), ops.sum(ops.square(self.xa), axis=1),
            ops.sum(ops.square(self.xb), axis=1))]
        mask = _negative_pairs(_gather(self.valid, slots), _gather(self.pair_labels, slots),
                               self.valid, self.pair_labels)
        return _loop_squared_distance(self.normalized, own, dots), mask


class _SlotBlock:
    """What :func:`_pair_losses` reads, for a block of the pairs of a :class:`_LabelPairs`."""

    def __init__(self, pairs: _LabelPairs, slots):
        self.pairs, self._slots = pairs, slots
        self.ends = (_gather(pairs.first, slots), _gather(pairs.second, slots))
        self.valid = _gather(pairs.valid, slots)
        self.pair_dist = dml.paired_distance(
            _gather(pairs.xa, slots), _gather(pairs.xb, slots), "l2")

    def loop_rows(self):
        return self.pairs.loop_rows(self._slots)

    def hardest(self, end):
        labels, rows = self.pairs.labels, self.ends[end]
        return _hardest(self.pairs.distance_rows(rows), _gather(labels, rows), labels)

    def by_sample(self, slot_values, slot_valid):
        return slot_values, slot_valid  # moved to the samples once the blocks are together


def _pair_losses(geo, base, margin, loop):
    """Per-pair losses of the triplet, HPHN-triplet and lifted-structure forms."""
    m = ops.convert_to_tensor(margin, dtype=dml.dtype_name(geo.pair_dist))
    if loop:
        loop_squared, loop_mask = geo.loop_rows()
        loop_dist = dml.safe_sqrt(loop_squared)
        if base == "triplet":
            hinge = ops.relu(geo.pair_dist[:, None] - loop_dist + m)
            values = ops.sum(hinge * ops.cast(loop_mask, dml.dtype_name(hinge)), axis=1)
            found = ops.any(loop_mask, axis=1)
        else:
            closest, found = dml.masked_min(loop_dist, loop_mask)
    if base == "hphn_triplet" or not loop:
        far_a, near_a, found_a = geo.hardest(0)
        far_b, near_b, found_b = geo.hardest(1)
    if not loop:
        closest = dml.minimum(ops.where(found_a, near_a, near_b),
                              ops.where(found_b, near_b, near_a))
        found = ops.logical_or(found_a, found_b)
    if base == "hphn_triplet":
        values = ops.relu(dml.maximum(far_a, far_b) + m - closest)
    elif base == "lifted_structure":
        values = ops.relu(geo.pair_dist + m - closest)
    valid = ops.logical_and(geo.valid, found)
    values = ops.where(valid, values, ops.zeros_like(values))
    return geo.by_sample(values, valid)


def _ms_rows(sim, positive_mask, negative_mask, loop_sim, loop_mask, paired, margin, options):
    """Per-sample losses of the LoOp multi-similarity loss, for rows of samples.

    ``sim``, ``positive_mask``, ``negative_mask``: ``[t, B]`` rows of the samples;
    ``loop_sim``, ``loop_mask``: ``[t, S]`` rows of their pairs; ``paired``: ``[t]``.
    The multi-similarity miner's thresholds, from the samples, select the negative pairs.
    """
    pairs = _multi_similarity_pairs(
        sim, positive_mask, negative_mask, options["epsilon"],
        negatives=(loop_sim, ops.logical_and(loop_mask, paired[:, None])))
    values = _ms_values(sim, pairs, options["alpha"], options["beta"], margin,
                        negative_scores=loop_sim)
    valid = ops.logical_and(ops.any(pairs.positive, axis=1), ops.any(pairs.negative, axis=1))
    valid = ops.logical_and(valid, paired)
    return ops.where(valid, values, ops.zeros_like(values)), valid


def _paired(positions, valid):
    """Whether the samples at ``positions`` (of :func:`_pair_layout`'s order) are in a pair."""
    num_slots, num_pairs = ops.shape(valid)[0], ops.sum(ops.cast(valid, "int32"))
    slot = ops.where(positions < num_slots, positions, positions - num_slots)
    return ops.logical_and(slot < num_pairs, positions < 2 * num_slots)


def _ms_losses(geo: _Geometry, margin, options):
    """Per-sample losses of the LoOp multi-similarity loss (0 for the unpaired samples)."""
    loop_squared, loop_mask = geo.loop_rows()
    loop_sim = 1.0 - 0.5 * loop_squared
    halves = []  # the pairs' first samples, then their second ones: both rows of their pair
    rows = ops.split(_head(geo.sim, geo.ends[1].stop, 1), 2, axis=0)
    for sim, end, start in zip(rows, geo.ends, (0, ops.shape(geo.valid)[0]), strict=True):
        positive, negative = dml.label_masks(geo.labels[end], geo.labels, start)
        halves.append(_ms_rows(sim, positive, negative, loop_sim, loop_mask, geo.valid,
                               margin, options))
    losses, valid = (ops.concatenate(parts, axis=0) for parts in zip(*halves, strict=True))
    return _by_sample(geo.perm[:ops.shape(losses)[0]], losses, valid, geo.size)


def _blocked_per_anchor(labels, embeddings, base, margin, normalized, loop, options, block_size):
    """:func:`_per_anchor` in row blocks: blocks of pairs (of samples for the MS form)."""
    labels, x, _, _, _ = prepare_inputs(labels, embeddings, normalize=normalized)
    size = batch_rows(x)
    labels, x, perm, valid, ends = _ordered(labels, x, loop)  # once per step
    num_slots = size // 2
    ends = tuple(ops.arange(e.start, e.stop, dtype="int32") if isinstance(e, slice) else e
                 for e in ends)
    ms = base == "multi_similarity"
    blocks = RowBlocks(size if ms else num_slots, block_size)
    dtype = dml.dtype_name(x)

    def block(i, x):
        batch_pairs = _LabelPairs(labels, x, normalized, valid, ends)
        rows = blocks.start(i) + ops.arange(blocks.size, dtype="int32")
        if not ms:  # rows are pairs
            values, found = _pair_losses(_SlotBlock(batch_pairs, rows), base, margin, loop)
            return values, ops.cast(found, dtype)
        sim = batch_pairs.similarity_rows(rows)  # the MS form: rows are samples
        positive, negative = dml.label_masks(_gather(labels, rows), labels, blocks.start(i))
        slots = ops.where(rows < num_slots, rows, ops.minimum(rows - num_slots, num_slots - 1))
        loop_squared, loop_mask = batch_pairs.loop_rows(slots)
        losses, found = _ms_rows(sim, positive, negative,
                                 1.0 - 0.5 * loop_squared, loop_mask,
                                 _paired(rows, valid), margin, options)
        return losses, ops.cast(found, dtype)

    values, found = (blocks.assemble(t) for t in
                     blocks.map(block, (x,), [((None,), dtype)] * 2))
    # Back to the batch order; each pair's value at its first sample.
    values, found = _by_sample(perm if ms else perm[:num_slots], values, found > 0, size)
    return anchor_terms(values, found)


def _per_anchor(labels, embeddings, base, margin, normalized, loop, options):
    labels, x, _, _, _ = prepare_inputs(labels, embeddings, normalize=normalized)
    geo = _Geometry(labels, x, normalized, layout=loop)
    if base == "multi_similarity":
        losses, valid = _ms_losses(geo, margin, options)
    else:
        losses, valid = _pair_losses(geo, base, margin, loop)
    return anchor_terms(losses, valid)


def _check_base(base, margin, options):
    if base not in BASES:
        raise ValueError(f"`base` must be one of {BASES}. Received: base={base!r}")
    allowed = _MS_OPTIONS if base == "multi_similarity" else {}
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(
            f"LoOp base {base!r} takes no option(s) {unknown}; "
            f"its options are {sorted(allowed) or 'none besides margin'}."
        )
    full = {**allowed, **options}
    for name in ("alpha", "beta"):
        if name in full and (not dml.is_number(full[name]) or not full[name] > 0):
            raise ValueError(f"`{name}` must be a number > 0. Received: {name}={full[name]!r}")
    if "epsilon" in full and not dml.is_number(full["epsilon"]):
        raise ValueError(f"`epsilon` must be a number. Received: epsilon={full['epsilon']!r}")
    if margin is None:
        margin = _DEFAULT_MARGIN[base]
    if not dml.is_number(margin) or (base != "multi_similarity" and not margin >= 0):
        raise ValueError(f"`margin` must be a number >= 0. Received: margin={margin!r}")
    return float(margin), {k: float(v) for k, v in full.items()}


def loop_loss(y_true, y_pred, base="triplet", margin=None, normalized=True, **base_options):
    """Functional form of :class:`LoOpLoss`: the mean over pairs (or anchors) with a loss."""
    margin, options = _check_base(base, margin, base_options)
    terms = _per_anchor(y_true, y_pred, base, margin, bool(normalized), True, options)
    return functional_value(terms, "anchors", y_pred, normalized=bool(normalized))


def _check_pair_margin(margin):
    """The margin of the pair baselines (HPHN, lifted structure): a number >= 0."""
    return _check_base("hphn_triplet", margin, {})[0]


def hphn_triplet_loss(y_true, y_pred, margin=0.2, normalize=True):
    """Functional form of :class:`HPHNTripletLoss`."""
    margin = _check_pair_margin(margin)
    terms = _per_anchor(y_true, y_pred, "hphn_triplet", margin, bool(normalize), False, {})
    return functional_value(terms, "anchors", y_pred, normalized=bool(normalize))


def lifted_structure_loss(y_true, y_pred, margin=0.2, normalize=True):
    """Functional form of :class:`LiftedStructureLoss`."""
    margin = _check_pair_margin(margin)
    terms = _per_anchor(y_true, y_pred, "lifted_structure", margin, bool(normalize), False, {})
    return functional_value(terms, "anchors", y_pred, normalized=bool(normalize))


@keras.saving.register_keras_serializable(package="tfdml")
class LoOpLoss(MetricLoss):
    """The LoOp losses: optimal hard negatives between pairs (Section 3.3 of the LoOp paper).

    Positive pairs ``(i, j)`` are the disjoint same-class pairs of
    :func:`label_pairs`; ``d_ij`` is their Euclidean distance and ``d_ijkl`` the
    LoOp distance to a pair ``(k, l)`` of another class: the minimum distance
    between the arcs ``X[i] -> X[j]`` and ``X[k] -> X[l]`` on the unit sphere
    (or between the segments, ``normalized=False``). With ``m`` the margin:

    * ``base="triplet"`` (eq. 15): per pair,
      ``sum_{(k,l)} max(d_ij - d_ijkl + m, 0)`` over all negative pairs;
    * ``"hphn_triplet"``: ``max(max(dp_i, dp_j) + m - min_{(k,l)} d_ijkl, 0)``
      with ``dp_i = max_{c[k]=c[i]} d_ik`` the hardest positive distance;
    * ``"lifted_structure"`` (eq. 16, LoOp form): ``max(d_ij + m - min_{(k,l)} d_ijkl, 0)``;
    * ``"multi_similarity"``: the MS loss per anchor ``i`` in a pair, with
      ``s = 1 - d^2 / 2``, ``lambda = margin``: positives kept if
      ``s_ij < max_{neg} s_ik + epsilon`` (unchanged), and the negatives are the
      pairs ``(k, l)``, kept if ``s_ijkl > min_{pos} s_ik - epsilon``, weighted
      ``1/beta log(1 + sum exp(beta (s_ijkl - lambda)))``.

    **Averaged over** the positive pairs (the MS form: the paired anchors)
    that have a negative pair of another class (``average="anchors"``, one
    term per pair; the paper's eqs. 15-16 average over the positive pairs). A batch without any
    positive pair, or with a single class, gives 0 with zero gradients. The
    last sample of a class with an odd count is left out of the pairs (it
    still counts as a positive or negative for ``dp`` and the MS positive
    term); use an even number of samples per class (P x K sampling with even
    K), as the paper does. With ``reduction="none"`` a pair's value is reported
    at the index of its first sample.

    The authors pair consecutive batch elements ``(X[0::2], X[1::2])``, which
    needs each class's samples to be consecutive and even in number; tfdml
    pairs by label, so any batch order works.

    Defaults: ``margin`` 0.2 for the triplet forms (the paper does not state
    its value; Fig. 3b varies it), 0.5 for MS (``lambda``, Fig. 3c);
    ``alpha=2``, ``beta=50`` (the paper's settings), ``epsilon=0.1`` (the paper
    finds small and even negative values better with LoOp, e.g. -0.02).

    Args:
        base: ``"triplet"``, ``"hphn_triplet"``, ``"lifted_structure"`` or
            ``"multi_similarity"``. Defaults to `"triplet"`.
        margin: ``m`` (``lambda`` for MS). Defaults to `None` (see above).
        normalized: L2-normalize the embeddings and use arcs; `False` uses
            the raw embeddings and straight segments (Section 4.2).
            Defaults to `True`.
        **base_options: for ``"multi_similarity"``: ``alpha`` (2.0),
            ``beta`` (50.0) and ``epsilon`` (0.1, may be negative).
        reduction: see :mod:`tfdml.losses.base`. Defaults to
            `"sum_over_batch_size"` (mean over pairs with a loss).
        name: name of the loss. Defaults to `"loop_loss"`.
        average: see :mod:`tfdml.losses.base`. Defaults to `"anchors"`.
        dtype: dtype of the returned value. Defaults to `None` (floatx).
        block_size: compute the loss over blocks of this many pairs (of
            samples for ``"multi_similarity"``), each against every pair of
            the batch, recomputing each block in the backward pass: memory
            ``O(block_size x B)`` instead of ``O(B^2)``, the same values and
            gradients up to rounding (docs/losses.md, "Large batches").
            Defaults to `None` (the whole batch at once).

    Examples:

    >>> loss = tfdml.losses.LoOpLoss("multi_similarity", epsilon=-0.02)
    >>> model.compile(optimizer="adam", loss=loss, jit_compile=True)
    >>> model.fit(pk_batches_with_even_k, epochs=10)

    Reference:
        Vasudeva, Deora, Bhattacharya, Pandey, "LoOp: Looking for Optimal Hard
        Negative Embeddings for Deep Metric Learning", ICCV 2021.
    """

    def __init__(self, base="triplet", margin=None, normalized=True,
                 reduction="sum_over_batch_size", name="loop_loss", dtype=None,
                 average="anchors", block_size=None, **base_options):
        margin, options = _check_base(base, margin, base_options)
        super().__init__(normalize=normalized, reduction=reduction, name=name, dtype=dtype,
                         average=average, block_size=block_size)
        self.base = base
        self.margin = margin
        self.options = options

    @property
    def normalized(self):
        return self.normalize

    def per_anchor(self, labels, embeddings, ref_embeddings=None, ref_labels=None, ref_offset=None):
        if ref_embeddings is not None:
            raise ValueError("LoOpLoss pairs the samples of the batch; it takes no reference set.")
        return _per_anchor(labels, embeddings, self.base, self.margin, self.normalize, True,
                           self.options)

    def per_anchor_in_blocks(self, labels, embeddings, ref_embeddings=None, ref_labels=None,
                             ref_offset=None):
        if ref_embeddings is not None:  # not taken: per_anchor says so
            return self.per_anchor(labels, embeddings, ref_embeddings, ref_labels, ref_offset)
        return _blocked_per_anchor(labels, embeddings, self.base, self.margin, self.normalize,
                                   True, self.options, self.block_size)

    def get_config(self):
        config = super().get_config()
        config.pop("normalize", None)
        config.update(base=self.base, margin=self.margin, normalized=self.normalize,
                      **self.options)
        return config


#: The shared arguments of the pair baselines, in the order of their signatures.
_PAIR_COMMON = ("normalize", "reduction", "name", "dtype", "average", "block_size")


class _PairBaseline(MetricLoss):
    """A loss over the disjoint same-class pairs of the batch, hardest positive and negative
    per pair (spec: ``check_arguments``; ``_base`` names its form in :func:`_per_anchor`)."""

    _base = None

    @staticmethod
    def check_arguments(margin=0.2):
        return {"margin": _check_pair_margin(margin)}

    def per_anchor(self, labels, embeddings, ref_embeddings=None, ref_labels=None, ref_offset=None):
        if ref_embeddings is not None:
            raise ValueError(f"{type(self).__name__} pairs the samples of the batch; "
                             "it takes no reference set.")
        return _per_anchor(labels, embeddings, self._base, self.margin, self.normalize, False, {})

    def per_anchor_in_blocks(self, labels, embeddings, ref_embeddings=None, ref_labels=None,
                             ref_offset=None):
        if ref_embeddings is not None:  # not taken: per_anchor says so
            return self.per_anchor(labels, embeddings, ref_embeddings, ref_labels, ref_offset)
        return _blocked_per_anchor(labels, embeddings, self._base, self.margin, self.normalize,
                                   False, {}, self.block_size)


@loss_class("hphn_triplet_loss", common=_PAIR_COMMON)
class HPHNTripletLoss(_PairBaseline):
    """Hard-positive hard-negative triplet loss over label pairs (LoOp paper, Section 3.3.2).

    For each disjoint same-class pair ``(i, j)`` (see
    :func:`tfdml.losses.loop.label_pairs`)::

        L_ij = max(max(max_{c[k]=c[i]} d_ik, max_{c[l]=c[j]} d_jl) + m
                   - min(min_{c[k]!=c[i]} d_ik, min_{c[l]!=c[j]} d_jl), 0)

    averaged over the pairs that have a negative. With two samples per class
    it equals :class:`LiftedStructureLoss`. ``LoOpLoss("hphn_triplet")`` is
    its LoOp form. It pairs the samples of the batch and takes no reference
    set.

    Args:
        margin: ``m >= 0``, the gap between the hardest positive and the
            closest negative. Defaults to `0.2`.

    Reference:
        Xuan, Stylianou, Pless, "Improved embeddings with easy positive
        triplet mining" (HPHN), WACV 2020; the LoOp paper (ICCV 2021).
    """

    _base = "hphn_triplet"


@loss_class("lifted_structure_loss", common=_PAIR_COMMON)
class LiftedStructureLoss(_PairBaseline):
    """The lifted structure loss in the hinge form of the LoOp paper's eq. 16.

    For each disjoint same-class pair ``(i, j)``::

        L_ij = max(d_ij + m - min(min_{c[k]!=c[i]} d_ik, min_{c[l]!=c[j]} d_jl), 0)

    averaged over the pairs that have a negative. (Song et al.'s original,
    and the LoOp authors' released code, use a log-sum-exp over the negatives
    instead of the hard minimum.) ``LoOpLoss("lifted_structure")`` is its
    LoOp form. It pairs the samples of the batch and takes no reference set.

    Args:
        margin: ``m >= 0``, the gap between ``d_ij`` and the closest
            negative. Defaults to `0.2`.

    Reference:
        Oh Song, Xiang, Jegelka, Savarese, "Deep metric learning via lifted
        structured feature embedding", CVPR 2016; the LoOp paper, eq. 16.
    """

    _base = "lifted_structure"
