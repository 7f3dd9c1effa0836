"""Per-anchor terms, what a loss averages over, and the one reduction path of every loss.

A tfdml loss computes per anchor the *terms* it learns from (one per mined
triplet, per mined pair, or one per anchor for losses such as the
multi-similarity loss that are defined per anchor) as an :class:`AnchorTerms`:
the sum of the anchor's term losses, the number of terms and the number of
non-zero terms. An anchor without terms (no positive, no negative, nothing
mined) is *inactive*.

**What a loss averages over** (``average=``; each loss's default follows its
paper and the authors' code, see docs/losses.md):

* ``"anchors"``: per anchor the mean over its terms, then the mean over the
  active anchors;
* ``"batch"``: per anchor the mean over its terms, then the sum divided by
  the batch size (inactive anchors count as 0; Wang et al.'s MS loss);
* ``"terms"``: the sum over all terms divided by their number (the mean over
  all mined triplets or pairs);
* ``"nonzero"``: the sum over all terms divided by the number of terms with
  a non-zero loss (Wu et al.'s margin loss);
* ``"halves"``: for pair losses whose terms split into positive and negative
  pairs (:func:`split_pair_terms`): the positive-pair terms and the
  negative-pair terms are each averaged over their own non-zero terms (over
  the whole batch) and the two means are added (a half without a non-zero
  term adds 0). The threshold-consistent margin paper's objective, and
  pytorch-metric-learning's ``AvgNonZeroReducer`` on its contrastive pair
  losses. Other losses raise a ValueError for it;
* ``"halves_terms"``: the same over all the terms of each half (zeros
  included): the mean positive-pair term plus the mean negative-pair term
  (pytorch-metric-learning's ``MeanReducer`` on a pair loss with two
  sub-losses, such as its intra-pair variance loss).

A pair loss that splits reports fields of shape ``[B, 2]`` (column 0: the
anchor's positive pairs, column 1: its negative pairs); every other average
first adds the two columns, so it sees the same ``[B]`` terms as
:func:`pair_terms` would give.

**Reductions** (``reduction=``, Keras' names). With ``v_a`` the anchor's
value (its mean for ``"anchors"``/``"batch"``, its sum for
``"terms"``/``"nonzero"``), ``c_a`` its share of the denominator and ``w_a``
the sample weight (1 without one):

* ``"sum_over_batch_size"`` / ``"mean"`` (default):
  ``sum_a w_a v_a / sum_a c_a``;
* ``"mean_with_sample_weight"``: ``sum_a w_a v_a / sum_a w_a c_a``;
* ``"sum"``: ``sum_a w_a v_a``;
* ``"none"`` / ``None``: the ``[B]`` values ``w_a v_a`` (0 for inactive
  anchors).

For ``"halves"``, with ``P_a``/``N_a`` the sums of the anchor's positive /
negative pair terms and ``p_a``/``n_a`` their numbers of non-zero terms (their
numbers of terms for ``"halves_terms"``), the
anchor's value is its share of the loss, ``v_a = P_a / sum_b p_b + N_a /
sum_b n_b`` (``c_a = 1 / B``), so that:

* ``"sum_over_batch_size"`` / ``"mean"`` and ``"sum"``: ``sum_a w_a v_a``
  (the halves' non-zero counts are not weighted; without weights, the two
  means added);
* ``"mean_with_sample_weight"``: each half is a weighted mean,
  ``sum_a w_a P_a / sum_a w_a p_a + sum_a w_a N_a / sum_a w_a n_a``;
* ``"none"`` / ``None``: the ``[B]`` values ``w_a v_a``, which add up to the
  ``"sum"``.

A loss class and its functional form both reduce through :func:`reduce_terms`
(the functional form with the default reduction and no sample weights).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from keras import ops

from tfdml import ops as dml
from tfdml._shims import dtype_name, is_traced

__all__ = [
    "AVERAGES",
    "REDUCTIONS",
    "HALVES",
    "AnchorTerms",
    "anchor_terms",
    "average_terms",
    "check_average",
    "check_reduction",
    "check_sample_weight",
    "pair_terms",
    "reduce_anchor_losses",
    "reduce_terms",
    "split_pair_terms",
    "triplet_terms",
]

#: Keras' reduction names, as a loss takes them.
REDUCTIONS = ("sum_over_batch_size", "mean", "mean_with_sample_weight", "sum", "none", None)

#: What a loss can average over; see the module docstring.
AVERAGES = ("anchors", "batch", "terms", "nonzero", "halves", "halves_terms")

#: The averages that take the positive and the negative pairs apart (split terms only).
HALVES = ("halves", "halves_terms")


class AnchorTerms(NamedTuple):
    """Per anchor: the loss terms it learns from, summed and counted.

    Attributes:
        total: ``[B]`` sum of the anchor's term losses.
        count: ``[B]`` number of terms (0: the anchor is inactive). May be
            fractional where a loss shares a term between two anchors.
        nonzero: ``[B]`` number of terms with a loss above 0.

    A pair loss whose terms split (:func:`split_pair_terms`) has ``[B, 2]``
    fields: column 0 its positive pairs, column 1 its negative pairs.
    """

    total: object
    count: object
    nonzero: object

    @property
    def split(self) -> bool:
        """The fields are ``[B, 2]``: positive and negative pairs apart."""
        return len(self.total.shape) == 2

    def merged(self) -> AnchorTerms:
        """The ``[B]`` terms of each anchor, its two halves added when they are split."""
        if not self.split:
            return self
        return AnchorTerms(*(ops.sum(t, axis=-1) for t in self))

    @property
    def active(self):
        """``[B]`` bool: the anchor has at least one term."""
        return self.merged().count > 0

    def plus(self, other: AnchorTerms) -> AnchorTerms:
        """Both sets of terms of each anchor (e.g. its positive and its negative pairs)."""
        return AnchorTerms(*(a + b for a, b in zip(self, other, strict=True)))


def _nonzero(values):
    return values > ops.zeros((), dtype_name(values))


def triplet_terms(values, mask) -> AnchorTerms:
    """Per anchor, the terms ``values`` where ``mask`` is true (one per triplet or pair).

    Args:
        values: per-term losses, broadcastable to ``mask``, whose first axis
            is the anchor.
        mask: boolean, ``[B, ...]``.
    """
    values = ops.broadcast_to(values, ops.shape(mask))
    axes = tuple(range(1, len(mask.shape)))
    dtype = dtype_name(values)
    weights = ops.cast(mask, dtype)
    total = ops.sum(ops.where(mask, values, ops.zeros((), dtype)), axis=axes)
    nonzero = ops.sum(ops.cast(ops.logical_and(mask, _nonzero(values)), dtype), axis=axes)
    return AnchorTerms(total, ops.sum(weights, axis=axes), nonzero)


def pair_terms(positive_values, negative_values, pairs) -> AnchorTerms:
    """Per anchor, one term per mined positive pair and per mined negative pair.

    Args:
        positive_values: ``[B, R]`` loss of each pair if it were a positive pair.
        negative_values: ``[B, R]`` loss of each pair if it were a negative pair.
        pairs: the mined :class:`tfdml.miners.Pairs`.
    """
    return triplet_terms(positive_values, pairs.positive).plus(
        triplet_terms(negative_values, pairs.negative))


def split_pair_terms(positive_values, negative_values, pairs) -> AnchorTerms:
    """:func:`pair_terms` with the positive and the negative pairs apart: ``[B, 2]`` fields.

    Column 0 holds the anchor's positive pairs, column 1 its negative pairs;
    ``average="halves"`` averages each over its own non-zero terms, every
    other average adds the columns first (the terms of :func:`pair_terms`).
    """
    halves = (triplet_terms(positive_values, pairs.positive),
              triplet_terms(negative_values, pairs.negative))
    return AnchorTerms(*(ops.stack([p, n], axis=-1) for p, n in zip(*halves, strict=True)))


def anchor_terms(losses, active) -> AnchorTerms:
    """One term per active anchor, for losses defined per anchor (MS, histogram, LoOp pairs)."""
    dtype = dtype_name(losses)
    count = ops.cast(active, dtype)
    total = ops.where(active, losses, ops.zeros((), dtype))
    return AnchorTerms(total, count, ops.cast(ops.logical_and(active, _nonzero(losses)), dtype))


def check_average(average):
    if average not in AVERAGES:
        raise ValueError(f"`average` must be one of {AVERAGES}. Received: average={average!r}")
    return average


def check_reduction(reduction):
    if reduction not in REDUCTIONS:
        raise ValueError(f"`reduction` must be one of {REDUCTIONS}. Received: reduction={reduction!r}")
    return reduction


def _check_halves(terms: AnchorTerms, average):
    if not terms.split:
        raise ValueError(
            f"`average={average!r}` averages the positive and the negative pairs apart; it "
            "needs a pair loss whose terms split into the two (ContrastiveLoss, "
            "SNRContrastiveLoss, ...). Use another average for this loss. Received: "
            f"average={average!r}")


def _half_counts(terms: AnchorTerms, average):
    """``[B, 2]``: what each half is averaged over (``p_a``, ``n_a``)."""
    return terms.nonzero if average == "halves" else terms.count


def _anchor_halves(terms: AnchorTerms, average):
    """``[B, 2]``: ``P_a / sum_b p_b`` and ``N_a / sum_b n_b`` (0 for a half with nothing to
    average)."""
    return dml.divide_no_nan(terms.total,
                             ops.sum(_half_counts(terms, average), axis=0, keepdims=True))


def average_terms(terms: AnchorTerms, average: str):
    """``(values, shares)``: per anchor ``v_a`` and ``c_a`` of the module docstring."""
    check_average(average)
    if average in HALVES:
        _check_halves(terms, average)
        values = ops.sum(_anchor_halves(terms, average), axis=-1)
        batch = ops.cast(ops.shape(values)[0], dtype_name(values))
        return values, dml.divide_no_nan(ops.ones_like(values), batch)
    terms = terms.merged()
    if average in ("anchors", "batch"):
        values = dml.divide_no_nan(terms.total, terms.count)
        if average == "anchors":
            return values, ops.cast(terms.active, dtype_name(values))
        return values, ops.ones_like(values)
    return terms.total, terms.count if average == "terms" else terms.nonzero


def _weights(values, sample_weight):
    """``[B]`` sample weights (ones without them), in the dtype of ``values``."""
    weights = ops.ones_like(values)
    if sample_weight is not None:
        sample_weight = ops.cast(sample_weight, dtype_name(values))
        if len(sample_weight.shape) == 2 and sample_weight.shape[-1] == 1:
            sample_weight = ops.squeeze(sample_weight, axis=-1)
        weights = weights * sample_weight
    return weights


def _reduce_halves(terms: AnchorTerms, average, sample_weight, reduction):
    """``average="halves"`` / ``"halves_terms"`` reduced as the module docstring says."""
    values, shares = average_terms(terms, average)
    if reduction != "mean_with_sample_weight":  # the shares add up to 1: a sum
        reduction = "sum" if reduction in ("sum_over_batch_size", "mean") else reduction
        return reduce_anchor_losses(values, shares, sample_weight, reduction)
    weights = ops.expand_dims(_weights(values, sample_weight), -1)
    halves = dml.divide_no_nan(ops.sum(terms.total * weights, axis=0),
                               ops.sum(_half_counts(terms, average) * weights, axis=0))
    return ops.sum(halves)


def reduce_anchor_losses(values, shares, sample_weight=None, reduction="sum_over_batch_size"):
    """Reduces per-anchor values and denominator shares as described in the module docstring."""
    check_reduction(reduction)
    weights = _weights(values, sample_weight)
    weighted = values * weights
    if reduction in ("none", None):
        return weighted
    total = ops.sum(weighted)
    if reduction == "sum":
        return total
    if reduction == "mean_with_sample_weight":
        denominator = ops.sum(shares * weights)
    else:
        denominator = ops.sum(shares)
    return dml.divide_no_nan(total, denominator)


def reduce_terms(terms: AnchorTerms, average, inputs, normalized=True, sample_weight=None,
                 reduction="sum_over_batch_size"):
    """The loss value of per-anchor terms: averaged, reduced, NaN for non-finite inputs.

    The one path from terms to a loss value, for the loss classes and their
    functional forms. NaN when an entry of ``inputs`` (the embeddings, the
    reference set) holds a NaN or Inf, and, for a loss that did not
    L2-normalize them (``normalized=False``), when their distances or dot
    products could overflow (:func:`tfdml.ops.nan_unless_finite` with
    ``distances=True``). 0 with zero gradients when no anchor is active.

    Args:
        terms: the :class:`AnchorTerms` of the batch.
        average: what to average over (:data:`AVERAGES`).
        inputs: the tensors whose entries must be finite (None entries skipped).
        normalized: whether the loss L2-normalized ``inputs``.
        sample_weight: ``[B]`` / ``[B, 1]`` / scalar weights, or None.
        reduction: one of :data:`REDUCTIONS`.
    """
    if average in HALVES:
        value = _reduce_halves(terms, average, sample_weight, check_reduction(reduction))
    else:
        values, shares = average_terms(terms, average)
        value = reduce_anchor_losses(values, shares, sample_weight, reduction)
    return dml.nan_unless_finite(value, *inputs, distances=not normalized)


def check_sample_weight(sample_weight):
    """``(sample_weight, valid)``: sample weights must be finite and ``>= 0``.

    A weight scales a sample's share of the loss (0 leaves it out); a negative
    one would turn the loss around. Eagerly a negative weight raises a
    ValueError; when traced (a compiled step cannot raise) ``valid`` is a
    scalar bool tensor, false for a negative weight, that the loss value
    passes through :func:`tfdml.ops.nan_unless`: a NaN loss, which
    ``keras.callbacks.TerminateOnNaN`` stops. A NaN or Inf weight gives a NaN
    loss in both cases. ``valid`` is ``True`` for no weights or weights
    checked eagerly.

    Raises:
        ValueError: eagerly, for a negative weight.
    """
    if sample_weight is None:
        return None, True
    sample_weight = ops.convert_to_tensor(sample_weight)
    if is_traced(sample_weight):
        return sample_weight, ops.logical_and(ops.all(sample_weight >= 0),
                                              dml.all_finite(sample_weight))
    values = ops.convert_to_numpy(sample_weight)
    if np.any(values < 0):
        raise ValueError(
            "`sample_weight` must be >= 0: a weight scales a sample's share of the loss "
            "(0 leaves it out). Received: sample_weight="
            f"{np.array2string(np.asarray(values), threshold=8)}"
        )
    return sample_weight, True if np.all(np.isfinite(values)) else dml.all_finite(sample_weight)
