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

import keras
from keras import ops

from tfdml import geometry
from tfdml import ops as dml
from tfdml.losses.base import MetricLoss, anchor_terms, functional_value, prepare_inputs
from tfdml.losses.blocks import RowBlocks, batch_rows
from tfdml.losses.multi_similarity import _log1p_sum_exp

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


def _by_sample(first, slot_values, slot_valid):
    """Slot values moved to the index of the pair's first sample: ``[B]``."""
    # ``first`` is a permutation: a scatter without repeated indices.
    columns = first[None, :]
    values = dml.scatter_rows(ops.zeros_like(slot_values[None, :]), columns,
                              slot_values[None, :])
    valid = ops.cast(slot_valid, "int32")[None, :]
    valid = dml.scatter_rows(ops.zeros_like(valid), columns, valid)
    return values[0], valid[0] > 0






class _Geometry:
    """Distances of a batch, its label pairs and the LoOp distances between pairs."""

    def __init__(self, labels, x, normalized):
        gram = dml.pairwise_similarity(x, x)
        self.dist = dml.pairwise_distance(x, x)  # x is unit-norm when normalized
        self.sim = 1.0 - 0.5 * ops.square(self.dist)  # s = 1 - d^2 / 2 (Section 3.3)
        self.first, self.second, self.valid = label_pairs(labels)
        a, b = self.first, self.second
        pair_labels = _gather(labels, a)
        self.same_mask = ops.equal(labels[:, None], labels[None, :])  # self-pairs included
        self.positive_mask, self.negative_mask = dml.label_masks(labels, labels, 0)
        # d(a_t, b_t), from the flattened matrix
        self.pair_dist = _gather(ops.reshape(self.dist, [-1]), a * ops.shape(self.dist)[1] + b)
        rows_a, rows_b = _gather(gram, a), _gather(gram, b)
        aa, ab = _gather(rows_a, a, axis=1), _gather(rows_a, b, axis=1)
        ba, bb = _gather(rows_b, a, axis=1), _gather(rows_b, b, axis=1)
        x1x2 = ops.diagonal(ab)  # dots within each pair
        if normalized:
            s = geometry.arc_similarity_from_dots(
                x1x2[:, None], x1x2[None, :], aa, ab, ba, bb
            )
            self.loop_dist = dml.safe_sqrt(dml.maximum(2.0 - 2.0 * s, ops.zeros_like(s)))
        else:
            norms = ops.diagonal(gram)
            na, nb = _gather(norms, a), _gather(norms, b)
            squared = geometry.segment_squared_distance_from_dots(
                na[:, None], nb[:, None], x1x2[:, None], na[None, :], nb[None, :],
                x1x2[None, :], aa, ab, ba, bb,
            )
            self.loop_dist = dml.safe_sqrt(dml.maximum(squared, ops.zeros_like(squared)))
        self.loop_sim = 1.0 - 0.5 * ops.square(self.loop_dist)
        # Slot t against slot u: both real pairs, of different classes.
        self.loop_mask = ops.logical_and(
            ops.logical_and(self.valid[:, None], self.valid[None, :]),
            ops.not_equal(pair_labels[:, None], pair_labels[None, :]),
        )

    def by_sample(self, slot_values, slot_valid):
        """Slot values moved to the index of the pair's first sample: ``[B]``."""
        return _by_sample(self.first, slot_values, slot_valid)

    def hardest_positive(self, index):
        """``max_{c[k] = c[i]} d(i, k)`` for each ``i`` in ``index`` (0 if alone)."""
        same = _gather(self.same_mask, index)
        return dml.masked_max(_gather(self.dist, index), same)[0]

    def hardest_negative(self, index):
        """``(min_{c[k] != c[i]} d(i, k), found)`` for each ``i`` in ``index``."""
        return dml.masked_min(_gather(self.dist, index), _gather(self.negative_mask, index))


def _pair_losses(geo: _Geometry, base, margin, loop):
    """Per-slot losses of the triplet, HPHN-triplet and lifted-structure forms."""
    m = ops.convert_to_tensor(margin, dtype=dml.dtype_name(geo.dist))
    if loop:
        if base == "triplet":
            hinge = ops.relu(geo.pair_dist[:, None] - geo.loop_dist + m)
            weights = ops.cast(geo.loop_mask, dml.dtype_name(hinge))
            values = ops.sum(hinge * weights, axis=1)
            found = ops.any(geo.loop_mask, axis=1)
        else:
            closest, found = dml.masked_min(geo.loop_dist, geo.loop_mask)
    else:
        na, found_a = geo.hardest_negative(geo.first)
        nb, found_b = geo.hardest_negative(geo.second)
        closest = dml.minimum(ops.where(found_a, na, nb), ops.where(found_b, nb, na))
        found = ops.logical_or(found_a, found_b)
    if base == "hphn_triplet":
        far = dml.maximum(geo.hardest_positive(geo.first), geo.hardest_positive(geo.second))
        values = ops.relu(far + m - closest)
    elif base == "lifted_structure":
        values = ops.relu(geo.pair_dist + m - closest)
    valid = ops.logical_and(geo.valid, found)
    values = ops.where(valid, values, ops.zeros_like(values))
    return geo.by_sample(values, valid)


def _slot_of(first, second, valid):
    """``(slot_of, paired)``: each sample's label-pair slot, and whether it is in a pair."""
    size = ops.shape(first)[0]
    slots = ops.arange(size, dtype="int32")
    # Scatter the slot index to both members of valid slots (column ``size`` collects the
    # invalid slots).
    target = ops.pad(ops.full_like(slots, -1), [[0, 1]], constant_values=-1)[None, :]
    for members in (first, second):
        target = dml.scatter_rows(target, ops.where(valid, members, size)[None, :],
                                  slots[None, :], mode="max")
    slot_of = target[0, :size]
    paired = slot_of >= 0
    return dml.maximum(slot_of, ops.zeros_like(slot_of)), paired


def _ms_rows(sim, positive_mask, negative_mask, loop_sim, loop_mask, paired, margin, alpha,
             beta, epsilon):
    """Per-sample losses of the LoOp multi-similarity loss, for rows of samples.

    ``sim``, ``positive_mask``, ``negative_mask``: ``[t, B]`` rows of the samples;
    ``loop_sim``, ``loop_mask``: ``[t, S]`` rows of their pair slots; ``paired``: ``[t]``.
    """
    eps = ops.convert_to_tensor(epsilon, dtype=dml.dtype_name(sim))
    least_positive, has_positive = dml.masked_min(sim, positive_mask)
    most_negative, has_negative = dml.masked_max(sim, negative_mask)
    positive = ops.logical_and(positive_mask, sim - eps < most_negative[:, None])
    positive = ops.logical_and(positive, has_negative[:, None])
    negative = ops.logical_and(loop_mask, paired[:, None])
    negative = ops.logical_and(negative, loop_sim > least_positive[:, None] - eps)
    negative = ops.logical_and(negative, has_positive[:, None])
    lam = ops.convert_to_tensor(margin, dtype=dml.dtype_name(sim))
    pos_term = _log1p_sum_exp(-alpha * (sim - lam), positive) / alpha
    neg_term = _log1p_sum_exp(beta * (loop_sim - lam), negative) / beta
    valid = ops.logical_and(ops.any(positive, axis=1), ops.any(negative, axis=1))
    valid = ops.logical_and(valid, paired)
    return ops.where(valid, pos_term + neg_term, ops.zeros_like(pos_term)), valid


def _ms_losses(geo: _Geometry, margin, alpha, beta, epsilon):
    """Per-sample losses of the LoOp multi-similarity loss."""
    slot_of, paired = _slot_of(geo.first, geo.second, geo.valid)
    return _ms_rows(geo.sim, geo.positive_mask, geo.negative_mask,
                    _gather(geo.loop_sim, slot_of), _gather(geo.loop_mask, slot_of), paired,
                    margin, alpha, beta, epsilon)


class _LabelPairs:
    """The label pairs of a batch, and rows of its distances without any ``[B, B]`` matrix.

    The blocked form of :class:`_Geometry`: ``O(B D)`` here, ``O(t B)`` per block of rows.
    """

    def __init__(self, labels, x, normalized, pairs):
        self.labels, self.x, self.normalized = labels, x, normalized
        self.first, self.second, self.valid = pairs  # label_pairs(labels)
        self.pair_labels = _gather(labels, self.first)
        self.xa, self.xb = _gather(x, self.first), _gather(x, self.second)
        self.x1x2 = ops.sum(self.xa * self.xb, axis=1)
        self.na = ops.sum(ops.square(self.xa), axis=1)
        self.nb = ops.sum(ops.square(self.xb), axis=1)

    def distance_rows(self, samples):
        """``[t, B]`` distances of the samples ``samples`` to every sample."""
        return dml.pairwise_distance(_gather(self.x, samples), self.x)

    def loop_rows(self, slots):
        """``(loop_dist, loop_mask)``: ``[t, S]`` rows of the slots ``slots``."""
        xa, xb = _gather(self.xa, slots), _gather(self.xb, slots)
        aa, ab = dml.pairwise_similarity(xa, self.xa), dml.pairwise_similarity(xa, self.xb)
        ba, bb = dml.pairwise_similarity(xb, self.xa), dml.pairwise_similarity(xb, self.xb)
        x1x2 = _gather(self.x1x2, slots)
        if self.normalized:
            s = geometry.arc_similarity_from_dots(x1x2[:, None], self.x1x2[None, :], aa, ab,
                                                  ba, bb)
            dist = dml.safe_sqrt(dml.maximum(2.0 - 2.0 * s, ops.zeros_like(s)))
        else:
            squared = geometry.segment_squared_distance_from_dots(
                _gather(self.na, slots)[:, None], _gather(self.nb, slots)[:, None],
                x1x2[:, None], self.na[None, :], self.nb[None, :], self.x1x2[None, :],
                aa, ab, ba, bb,
            )
            dist = dml.safe_sqrt(dml.maximum(squared, ops.zeros_like(squared)))
        labels = _gather(self.pair_labels, slots)
        mask = ops.logical_and(
            ops.logical_and(_gather(self.valid, slots)[:, None], self.valid[None, :]),
            ops.not_equal(labels[:, None], self.pair_labels[None, :]),
        )
        return dist, mask


class _SlotBlock:
    """What :func:`_pair_losses` reads of a :class:`_Geometry`, for a block of slots."""

    def __init__(self, pairs: _LabelPairs, slots):
        self.pairs = pairs
        self.first, self.second = _gather(pairs.first, slots), _gather(pairs.second, slots)
        self.valid = _gather(pairs.valid, slots)
        self.pair_dist = self.dist = dml.paired_distance(
            _gather(pairs.xa, slots), _gather(pairs.xb, slots), "l2")
        self._slots = slots
        self._loop = None
        self._rows = {}

    @property
    def loop_dist(self):
        if self._loop is None:
            self._loop = self.pairs.loop_rows(self._slots)
        return self._loop[0]

    @property
    def loop_mask(self):
        self.loop_dist  # noqa: B018  (computes both)
        return self._loop[1]

    def _distance_rows(self, index):
        if id(index) not in self._rows:
            self._rows[id(index)] = self.pairs.distance_rows(index)
        return self._rows[id(index)]

    def hardest_positive(self, index):
        labels = self.pairs.labels
        same = ops.equal(_gather(labels, index)[:, None], labels[None, :])
        return dml.masked_max(self._distance_rows(index), same)[0]

    def hardest_negative(self, index):
        labels = self.pairs.labels
        other = ops.not_equal(_gather(labels, index)[:, None], labels[None, :])
        return dml.masked_min(self._distance_rows(index), other)

    def by_sample(self, slot_values, slot_valid):
        return slot_values, slot_valid  # moved to the samples once the blocks are together


def _blocked_per_anchor(labels, embeddings, base, margin, normalized, loop, options, block_size):
    """:func:`_per_anchor` in row blocks: blocks of pair slots (of samples for the MS form)."""
    labels, x, _, _, _ = prepare_inputs(labels, embeddings, normalize=normalized)
    blocks = RowBlocks(batch_rows(x), block_size)
    dtype = dml.dtype_name(x)
    first, second, valid = label_pairs(labels)  # from the labels alone: once per step
    slot_of, paired = _slot_of(first, second, valid)

    def block(i, x):
        pairs = _LabelPairs(labels, x, normalized, (first, second, valid))
        rows = blocks.start(i) + ops.arange(blocks.size, dtype="int32")
        if base != "multi_similarity":  # rows are pair slots
            values, found = _pair_losses(_SlotBlock(pairs, rows), base, margin, loop)
            return values, ops.cast(found, dtype)
        dist = pairs.distance_rows(rows)  # the MS form: rows are samples
        positive, negative = dml.label_masks(_gather(labels, rows), labels, blocks.start(i))
        loop_dist, loop_mask = pairs.loop_rows(_gather(slot_of, rows))
        losses, found = _ms_rows(1.0 - 0.5 * ops.square(dist), positive, negative,
                                 1.0 - 0.5 * ops.square(loop_dist), loop_mask,
                                 _gather(paired, rows), margin, options["alpha"],
                                 options["beta"], options["epsilon"])
        return losses, ops.cast(found, dtype)

    values, found = (blocks.assemble(t) for t in
                     blocks.map(block, (x,), [((None,), dtype)] * 2))
    found = found > 0
    if base != "multi_similarity":  # each slot's value at its pair's first sample
        values, found = _by_sample(first, values, found)
    return anchor_terms(values, found)


def _per_anchor(labels, embeddings, base, margin, normalized, loop, options):
    labels, x, _, _, _ = prepare_inputs(labels, embeddings, normalize=normalized)
    geo = _Geometry(labels, x, normalized)
    if base == "multi_similarity":
        losses, valid = _ms_losses(geo, margin, options["alpha"], options["beta"],
                                   options["epsilon"])
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


def hphn_triplet_loss(y_true, y_pred, margin=0.2, normalize=True):
    """Functional form of :class:`HPHNTripletLoss`."""
    margin, _ = _check_base("hphn_triplet", margin, {})
    terms = _per_anchor(y_true, y_pred, "hphn_triplet", margin, bool(normalize), False, {})
    return functional_value(terms, "anchors", y_pred, normalized=bool(normalize))


def lifted_structure_loss(y_true, y_pred, margin=0.2, normalize=True):
    """Functional form of :class:`LiftedStructureLoss`."""
    margin, _ = _check_base("lifted_structure", margin, {})
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
        block_size: compute the loss over blocks of this many rows, each
            against the whole batch, recomputing each block in the backward
            pass: memory ``O(block_size x B)`` instead of ``O(B^2)``, the same
            values and gradients (docs/losses.md, "Large batches"). Defaults
            to `None` (the whole batch at once).

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


class _PairBaseline(MetricLoss):
    _base = None

    def __init__(self, margin=0.2, normalize=True, reduction="sum_over_batch_size", name=None,
                 dtype=None, average="anchors", block_size=None):
        margin, _ = _check_base(self._base, margin, {})
        super().__init__(normalize=normalize, reduction=reduction, name=name, dtype=dtype,
                         average=average, block_size=block_size)
        self.margin = margin

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

    def get_config(self):
        config = super().get_config()
        config["margin"] = self.margin
        return config


@keras.saving.register_keras_serializable(package="tfdml")
class HPHNTripletLoss(_PairBaseline):
    """Hard-positive hard-negative triplet loss over label pairs (LoOp paper, Section 3.3.2).

    For each disjoint same-class pair ``(i, j)`` (see
    :func:`tfdml.losses.loop.label_pairs`)::

        L_ij = max(max(max_{c[k]=c[i]} d_ik, max_{c[l]=c[j]} d_jl) + m
                   - min(min_{c[k]!=c[i]} d_ik, min_{c[l]!=c[j]} d_jl), 0)

    averaged over the pairs that have a negative. With two samples per class
    it equals :class:`LiftedStructureLoss`. ``LoOpLoss("hphn_triplet")`` is
    its LoOp form.

    Args:
        margin: ``m >= 0``. Defaults to `0.2`.
        normalize: L2-normalize the embeddings first. Defaults to `True`.
        reduction: see :mod:`tfdml.losses.base`. Defaults to
            `"sum_over_batch_size"`.
        name: name of the loss. Defaults to `"hphn_triplet_loss"`.
        dtype: dtype of the returned value. Defaults to `None` (floatx).
        block_size: compute the loss over blocks of this many rows, each
            against the whole batch, recomputing each block in the backward
            pass: memory ``O(block_size x B)`` instead of ``O(B^2)``, the same
            values and gradients (docs/losses.md, "Large batches"). Defaults
            to `None` (the whole batch at once).

    Reference:
        Xuan, Stylianou, Pless, "Improved embeddings with easy positive
        triplet mining" (HPHN), WACV 2020; the LoOp paper (ICCV 2021).
    """

    _base = "hphn_triplet"

    def __init__(self, margin=0.2, normalize=True, reduction="sum_over_batch_size",
                 name="hphn_triplet_loss", dtype=None, average="anchors",
                 block_size=None):
        super().__init__(margin, normalize, reduction, name, dtype, average, block_size)


@keras.saving.register_keras_serializable(package="tfdml")
class LiftedStructureLoss(_PairBaseline):
    """The lifted structure loss in the hinge form of the LoOp paper's eq. 16.

    For each disjoint same-class pair ``(i, j)``::

        L_ij = max(d_ij + m - min(min_{c[k]!=c[i]} d_ik, min_{c[l]!=c[j]} d_jl), 0)

    averaged over the pairs that have a negative. (Song et al.'s original,
    and the LoOp authors' released code, use a log-sum-exp over the negatives
    instead of the hard minimum.) ``LoOpLoss("lifted_structure")`` is its
    LoOp form.

    Args:
        margin: ``m >= 0``. Defaults to `0.2`.
        normalize: L2-normalize the embeddings first. Defaults to `True`.
        reduction: see :mod:`tfdml.losses.base`. Defaults to
            `"sum_over_batch_size"`.
        name: name of the loss. Defaults to `"lifted_structure_loss"`.
        dtype: dtype of the returned value. Defaults to `None` (floatx).
        block_size: compute the loss over blocks of this many rows, each
            against the whole batch, recomputing each block in the backward
            pass: memory ``O(block_size x B)`` instead of ``O(B^2)``, the same
            values and gradients (docs/losses.md, "Large batches"). Defaults
            to `None` (the whole batch at once).

    Reference:
        Oh Song, Xiang, Jegelka, Savarese, "Deep metric learning via lifted
        structured feature embedding", CVPR 2016; the LoOp paper, eq. 16.
    """

    _base = "lifted_structure"

    def __init__(self, margin=0.2, normalize=True, reduction="sum_over_batch_size",
                 name="lifted_structure_loss", dtype=None, average="anchors",
                 block_size=None):
        super().__init__(margin, normalize, reduction, name, dtype, average, block_size)
