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
  a non-zero loss (Wu et al.'s margin loss).

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

A loss class and its functional form both reduce through :func:`reduce_terms`
(the functional form with the default reduction and no sample weights).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from keras import ops

from tfdml import ops as dml

__all__ = [
    "AVERAGES",
    "REDUCTIONS",
    "AnchorTerms",
    "anchor_terms",
    "average_terms",
    "check_average",
    "check_reduction",
    "check_sample_weight",
    "pair_terms",
    "reduce_anchor_losses",
    "reduce_terms",
    "triplet_terms",
]

#: Keras' reduction names, as a loss takes them.
REDUCTIONS = ("sum_over_batch_size", "mean", "mean_with_sample_weight", "sum", "none", None)

#: What a loss can average over; see the module docstring.
AVERAGES = ("anchors", "batch", "terms", "nonzero")


class AnchorTerms(NamedTuple):
    """Per anchor: the loss terms it learns from, summed and counted.

    Attributes:
        total: ``[B]`` sum of the anchor's term losses.
        count: ``[B]`` number of terms (0: the anchor is inactive). May be
            fractional where a loss shares a term between two anchors.
        nonzero: ``[B]`` number of terms with a loss above 0.
    """

    total: object
    count: object
    nonzero: object

    @property
    def active(self):
        """``[B]`` bool: the anchor has at least one term."""
        return self.count > 0

    def plus(self, other: AnchorTerms) -> AnchorTerms:
        """Both sets of terms of each anchor (e.g. its positive and its negative pairs)."""
        return AnchorTerms(*(a + b for a, b in zip(self, other, strict=True)))


def _nonzero(values):
    return values > ops.zeros((), dml.dtype_name(values))


def triplet_terms(values, mask) -> AnchorTerms:
    """Per anchor, the terms ``values`` where ``mask`` is true (one per triplet or pair).

    Args:
        values: per-term losses, broadcastable to ``mask``, whose first axis
            is the anchor.
        mask: boolean, ``[B, ...]``.
    """
    values = ops.broadcast_to(values, ops.shape(mask))
    axes = tuple(range(1, len(mask.shape)))
    dtype = dml.dtype_name(values)
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


def anchor_terms(losses, active) -> AnchorTerms:
    """One term per active anchor, for losses defined per anchor (MS, histogram, LoOp pairs)."""
    dtype = dml.dtype_name(losses)
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


def average_terms(terms: AnchorTerms, average: str):
    """``(values, shares)``: per anchor ``v_a`` and ``c_a`` of the module docstring."""
    check_average(average)
    if average in ("anchors", "batch"):
        values = dml.divide_no_nan(terms.total, terms.count)
        if average == "anchors":
            return values, ops.cast(terms.active, dml.dtype_name(values))
        return values, ops.ones_like(values)
    return terms.total, terms.count if average == "terms" else terms.nonzero


def reduce_anchor_losses(values, shares, sample_weight=None, reduction="sum_over_batch_size"):
    """Reduces per-anchor values and denominator shares as described in the module docstring."""
    check_reduction(reduction)
    weights = ops.ones_like(values)
    if sample_weight is not None:
        sample_weight = ops.cast(sample_weight, dml.dtype_name(values))
        if len(sample_weight.shape) == 2 and sample_weight.shape[-1] == 1:
            sample_weight = ops.squeeze(sample_weight, axis=-1)
        weights = weights * sample_weight
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
    if dml.is_traced(sample_weight):
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
