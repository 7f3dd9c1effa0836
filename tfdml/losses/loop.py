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
an odd number of samples leaves its last one unpaired (see
:func:`tfdml.losses.loop_pairs.label_pairs`).
Everything is computed from the ``B x B`` matrix of dot products: no ``[B, B, D]``
tensor, and it compiles under XLA.
"""

from __future__ import annotations

import keras
from keras import ops

from tfdml import ops as dml
from tfdml._argument_checks import is_number
from tfdml._docs import fill_doc
from tfdml._shims import dtype_name
from tfdml.losses._docstrings import shared_args
from tfdml.losses.base import MetricLoss
from tfdml.losses.loop_pairs import (
    Geometry,
    LabelPairs,
    SlotBlock,
    by_sample,
    gather,
    head,
    ordered,
)
from tfdml.losses.multi_similarity import ms_values
from tfdml.losses.row_blocks import RowBlocks, batch_rows
from tfdml.losses.terms import anchor_terms
from tfdml.miners.selection import multi_similarity_pairs

__all__ = [
    "HPHNTripletLoss",
    "LoOpLoss",
    "PairBaseline",
    "hphn_triplet_loss",
    "loop_loss",
]

BASES = ("triplet", "hphn_triplet", "lifted_structure", "multi_similarity")
_MS_OPTIONS = {"alpha": 2.0, "beta": 50.0, "epsilon": 0.1}
_DEFAULT_MARGIN = {"triplet": 0.2, "hphn_triplet": 0.2, "lifted_structure": 0.2,
                   "multi_similarity": 0.5}


def _pair_losses(geo, base, margin, loop):
    """Per-pair losses of the triplet, HPHN-triplet and lifted-structure forms."""
    m = ops.convert_to_tensor(margin, dtype=dtype_name(geo.pair_dist))
    if loop:
        loop_squared, loop_mask = geo.loop_rows()
        loop_dist = dml.safe_sqrt(loop_squared)
        if base == "triplet":
            hinge = ops.relu(geo.pair_dist[:, None] - loop_dist + m)
            values = ops.sum(hinge * ops.cast(loop_mask, dtype_name(hinge)), axis=1)
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
    pairs = multi_similarity_pairs(
        sim, positive_mask, negative_mask, options["epsilon"],
        negatives=(loop_sim, ops.logical_and(loop_mask, paired[:, None])))
    values = ms_values(sim, pairs, options["alpha"], options["beta"], margin,
                        negative_scores=loop_sim)
    valid = ops.logical_and(ops.any(pairs.positive, axis=1), ops.any(pairs.negative, axis=1))
    valid = ops.logical_and(valid, paired)
    return ops.where(valid, values, ops.zeros_like(values)), valid


def _paired(positions, valid):
    """Whether the samples at ``positions`` (of :func:`_pair_layout`'s order) are in a pair."""
    num_slots, num_pairs = ops.shape(valid)[0], ops.sum(ops.cast(valid, "int32"))
    slot = ops.where(positions < num_slots, positions, positions - num_slots)
    return ops.logical_and(slot < num_pairs, positions < 2 * num_slots)


def _ms_losses(geo: Geometry, margin, options):
    """Per-sample losses of the LoOp multi-similarity loss (0 for the unpaired samples)."""
    loop_squared, loop_mask = geo.loop_rows()
    loop_sim = 1.0 - 0.5 * loop_squared
    halves = []  # the pairs' first samples, then their second ones: both rows of their pair
    rows = ops.split(head(geo.sim, geo.ends[1].stop, 1), 2, axis=0)
    for sim, end, start in zip(rows, geo.ends, (0, ops.shape(geo.valid)[0]), strict=True):
        positive, negative = dml.label_masks(geo.labels[end], geo.labels, start)
        halves.append(_ms_rows(sim, positive, negative, loop_sim, loop_mask, geo.valid,
                               margin, options))
    losses, valid = (ops.concatenate(parts, axis=0) for parts in zip(*halves, strict=True))
    return by_sample(geo.perm[:ops.shape(losses)[0]], losses, valid, geo.size)


def _blocked_per_anchor(inputs, base, margin, normalized, loop, options, block_size):
    """:func:`_per_anchor` in row blocks: blocks of pairs (of samples for the MS form)."""
    labels, x = inputs.labels, inputs.x
    size = batch_rows(x)
    labels, x, perm, valid, ends = ordered(labels, x, loop)  # once per step
    num_slots = size // 2
    ends = tuple(ops.arange(e.start, e.stop, dtype="int32") if isinstance(e, slice) else e
                 for e in ends)
    ms = base == "multi_similarity"
    blocks = RowBlocks(size if ms else num_slots, block_size)
    dtype = dtype_name(x)

    def block(i, x):
        batch_pairs = LabelPairs(labels, x, normalized, valid, ends)
        rows = blocks.start(i) + ops.arange(blocks.size, dtype="int32")
        if not ms:  # rows are pairs
            values, found = _pair_losses(SlotBlock(batch_pairs, rows), base, margin, loop)
            return values, ops.cast(found, dtype)
        sim = batch_pairs.similarity_rows(rows)  # the MS form: rows are samples
        positive, negative = dml.label_masks(gather(labels, rows), labels, blocks.start(i))
        slots = ops.where(rows < num_slots, rows, ops.minimum(rows - num_slots, num_slots - 1))
        loop_squared, loop_mask = batch_pairs.loop_rows(slots)
        losses, found = _ms_rows(sim, positive, negative,
                                 1.0 - 0.5 * loop_squared, loop_mask,
                                 _paired(rows, valid), margin, options)
        return losses, ops.cast(found, dtype)

    values, found = (blocks.assemble(t) for t in
                     blocks.map(block, (x,), [((None,), dtype)] * 2))
    # Back to the batch order; each pair's value at its first sample.
    values, found = by_sample(perm if ms else perm[:num_slots], values, found > 0, size)
    return anchor_terms(values, found)


def _per_anchor(inputs, base, margin, normalized, loop, options):
    """The terms of a LoOp loss (``loop``) or of a pair baseline, one per pair (per paired
    sample for the MS form), from the checked inputs."""
    geo = Geometry(inputs.labels, inputs.x, normalized, layout=loop)
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
        if name in full and (not is_number(full[name]) or not full[name] > 0):
            raise ValueError(f"`{name}` must be a number > 0. Received: {name}={full[name]!r}")
    if "epsilon" in full and not is_number(full["epsilon"]):
        raise ValueError(f"`epsilon` must be a number. Received: epsilon={full['epsilon']!r}")
    if margin is None:
        margin = _DEFAULT_MARGIN[base]
    if not is_number(margin) or (base != "multi_similarity" and not margin >= 0):
        raise ValueError(f"`margin` must be a number >= 0. Received: margin={margin!r}")
    return float(margin), {k: float(v) for k, v in full.items()}


def loop_loss(y_true, y_pred, base="triplet", margin=None, *, normalize=True, **base_options):
    """Functional form of :class:`LoOpLoss`: the mean over pairs (or anchors) with a loss.

    Args:
        y_true: ``[B]`` or ``[B, 1]`` integer class ids.
        y_pred: ``[B, D]`` embeddings.
        base, margin, normalize, **base_options: as in :class:`LoOpLoss`.

    Returns:
        A scalar of the dtype of ``y_pred``; 0 without a positive pair, NaN when an
        embedding is NaN or Inf.
    """
    return LoOpLoss(base, margin, normalize=normalize, **base_options).functional(y_true, y_pred)


def _check_pair_margin(margin):
    """The margin of the pair baselines (HPHN, lifted structure): a number >= 0."""
    return _check_base("hphn_triplet", margin, {})[0]


def hphn_triplet_loss(y_true, y_pred, margin=0.2, *, normalize=True):
    """Functional form of :class:`HPHNTripletLoss`.

    Args:
        y_true: ``[B]`` or ``[B, 1]`` integer class ids.
        y_pred: ``[B, D]`` embeddings.
        margin, normalize: as in :class:`HPHNTripletLoss`.

    Returns:
        A scalar of the dtype of ``y_pred``.
    """
    return HPHNTripletLoss(margin, normalize=normalize).functional(y_true, y_pred)


@keras.saving.register_keras_serializable(package="tfdml")
class LoOpLoss(MetricLoss):
    """The LoOp losses: optimal hard negatives between pairs (Section 3.3 of the LoOp paper).

    Positive pairs ``(i, j)`` are the disjoint same-class pairs of
    :func:`tfdml.losses.loop_pairs.label_pairs`; ``d_ij`` is their Euclidean distance and ``d_ijkl`` the
    LoOp distance to a pair ``(k, l)`` of another class: the minimum distance
    between the arcs ``X[i] -> X[j]`` and ``X[k] -> X[l]`` on the unit sphere
    (or between the segments, ``normalize=False``). With ``m`` the margin:

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
        normalize: L2-normalize the embeddings and use arcs; `False` uses
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

    #: Pairs of samples are formed within each class (first and second, third and fourth...).
    multi_label = "it forms its pairs within each class"


    blockwise = False  # pairs of the batch: blocks of pairs, in terms
    takes_reference_set = False

    def __init__(self, base="triplet", margin=None, *, normalize=True, average="anchors",
                 reduction="sum_over_batch_size", name="loop_loss", dtype=None, block_size=None,
                 **base_options):
        margin, options = _check_base(base, margin, dict(base_options))
        super().__init__(base=base, margin=margin, **options, normalize=normalize,
                         average=average, reduction=reduction, name=name, dtype=dtype,
                         block_size=block_size)

    @property
    def options(self) -> dict:
        """The options of the multi-similarity form (``alpha``, ``beta``, ``epsilon``)."""
        return {key: getattr(self, key) for key in self.arguments if key in _MS_OPTIONS}

    def terms(self, inputs):
        if self.uses_blocks(inputs.x):
            return _blocked_per_anchor(inputs, self.base, self.margin, self.normalize, True,
                                       self.options, self.block_size)
        return _per_anchor(inputs, self.base, self.margin, self.normalize, True, self.options)


class PairBaseline(MetricLoss):
    """A loss over the disjoint same-class pairs of the batch, hardest positive and negative
    per pair (the HPHN triplet and the lifted structure losses); ``pair_form`` names its form
    in :func:`_per_anchor`."""

    #: Pairs of samples are formed within each class, as LoOp's.
    multi_label = "it forms its pairs within each class"


    pair_form = None
    blockwise = False  # pairs of the batch: blocks of pairs, in terms
    takes_reference_set = False

    def __init__(self, margin=0.2, *, normalize=True, reduction="sum_over_batch_size", name=None,
                 dtype=None, average="anchors", block_size=None):
        super().__init__(normalize=normalize, reduction=reduction, name=name, dtype=dtype,
                         average=average, block_size=block_size,
                         margin=_check_pair_margin(margin))

    def terms(self, inputs):
        if self.uses_blocks(inputs.x):
            return _blocked_per_anchor(inputs, self.pair_form, self.margin, self.normalize, False,
                                       {}, self.block_size)
        return _per_anchor(inputs, self.pair_form, self.margin, self.normalize, False, {})


@keras.saving.register_keras_serializable(package="tfdml")
@fill_doc(SHARED_ARGS=shared_args("hphn_triplet_loss"))
class HPHNTripletLoss(PairBaseline):
    """Hard-positive hard-negative triplet loss over label pairs (LoOp paper, Section 3.3.2).

    For each disjoint same-class pair ``(i, j)`` (see
    :func:`tfdml.losses.loop_pairs.label_pairs`)::

        L_ij = max(max(max_{c[k]=c[i]} d_ik, max_{c[l]=c[j]} d_jl) + m
                   - min(min_{c[k]!=c[i]} d_ik, min_{c[l]!=c[j]} d_jl), 0)

    averaged over the pairs that have a negative. With two samples per class
    it equals :class:`LiftedStructureLoss`. ``LoOpLoss("hphn_triplet")`` is
    its LoOp form. It pairs the samples of the batch and takes no reference
    set.

    Args:
        margin: ``m >= 0``, the gap between the hardest positive and the
            closest negative. Defaults to `0.2`.
        {SHARED_ARGS}

    Reference:
        Xuan, Stylianou, Pless, "Improved embeddings with easy positive
        triplet mining" (HPHN), WACV 2020; the LoOp paper (ICCV 2021).
    """

    pair_form = "hphn_triplet"

    def __init__(self, margin=0.2, *, normalize=True, average="anchors",
                 reduction="sum_over_batch_size", name="hphn_triplet_loss", dtype=None,
                 block_size=None):
        super().__init__(margin, normalize=normalize, average=average, reduction=reduction,
                         name=name, dtype=dtype, block_size=block_size)
