"""The dynamic soft margin loss (Zhang & Rusinkiewicz): triplets weighted by a running CDF.

Per triplet ``(a, p, n)`` the loss is ``w(x) x`` with ``x = d_ap - d_an`` and ``w`` the
cumulative distribution of ``x`` over the triplets seen so far, estimated by a histogram
that each batch updates with momentum. The histogram is the loss's state (a non-trainable
variable that :class:`tfdml.models.MetricModel` owns and saves); the weight ``w`` is a
constant of the gradient, as in the paper, so ``dL/dx = w(x)``.
"""

from __future__ import annotations

from keras import ops

from tfdml import ops as dml
from tfdml._checks import check_int, check_number
from tfdml.losses.base import (
    LossState,
    MetricLoss,
    check_average,
    functional_value,
    mined_triplets,
    prepare_inputs,
    resolve_miner,
    triplet_terms,
)
from tfdml.losses.spec import loss_class
from tfdml.miners import AllPairsMiner, gather_triplet_scores

__all__ = ["DynamicSoftMarginLoss", "dynamic_soft_margin_loss"]


def _check_dynamic(min_val: float = -2.0, num_bins: int = 10, momentum: float = 0.01,
                   miner="default"):
    return {"min_val": check_number("min_val", min_val, high=0, high_open=True, finite=True),
            "num_bins": check_int("num_bins", num_bins),
            "momentum": check_number("momentum", momentum, low=0, high=1, low_open=True),
            "miner": resolve_miner(miner, AllPairsMiner)}


def _gaps(inputs, miner):
    """``(x, mask)``: ``d_ap - d_an`` of every mined triplet (Euclidean distances) and the
    triplets' mask, both ``[B, P, N]``."""
    dist = dml.distance_matrix(inputs.x, inputs.ref, "l2")
    triplets = mined_triplets(inputs, -dist, miner)
    d_ap, d_an = gather_triplet_scores(dist, triplets)
    return ops.broadcast_to(d_ap - d_an, ops.shape(triplets.mask)), triplets.mask


def bin_positions(x, min_val, num_bins):
    """``(low, frac)``: the grid node at or below each value and the share past it.

    Node ``k`` is ``min_val + k * delta`` with ``delta = 2 |min_val| / num_bins``,
    ``k = 0 .. num_bins - 1``. Values outside ``[min_val, -min_val - delta]`` are clipped
    to the end nodes; non-finite values count as ``min_val`` (the histogram ignores a batch
    holding them).
    """
    delta = 2.0 * abs(min_val) / num_bins
    v = (x - min_val) / delta
    v = ops.where(ops.isfinite(v), v, ops.zeros_like(v))
    v = ops.clip(v, 0.0, float(num_bins - 1))
    low = ops.floor(v)
    return ops.cast(low, "int32"), v - low


def updated_histogram(histogram, x, mask, min_val, momentum, ok=True):
    """The running histogram after a batch: ``(1 - m) h + m h_batch``, renormalized.

    ``h_batch`` splits each triplet's unit mass linearly between the two nodes around its
    ``x`` and divides by the number of triplets (the batch's own distribution); ``m`` is
    ``momentum``, or 1 while ``histogram`` is all zeros (the first batch sets it). A batch
    without triplets, or with ``ok`` false (non-finite inputs), leaves it unchanged. No
    gradient.

    Returns:
        ``(histogram, low)``: the new histogram (the dtype of ``x``) and the node of each
        value (:func:`bin_positions`).
    """
    num_bins = histogram.shape[0]
    x = ops.stop_gradient(x)
    dtype = dml.dtype_name(x)
    low, frac = bin_positions(x, min_val, num_bins)
    weight = ops.cast(mask, dtype)
    high = ops.minimum(low + 1, num_bins - 1)

    def flat(t):
        return ops.reshape(t, (1, -1))

    # One row scattered into: in the dtype of x (Keras' torch segment_sum is float32).
    nodes = ops.concatenate([flat(low), flat(high)], axis=1)
    shares = ops.concatenate([flat((1.0 - frac) * weight), flat(frac * weight)], axis=1)
    counts = dml.scatter_rows(ops.zeros((1, num_bins), dtype), nodes, shares, mode="add")[0]
    total = ops.sum(weight)
    old = ops.cast(ops.stop_gradient(histogram), dtype)
    m = ops.where(ops.sum(old) > 0, ops.convert_to_tensor(momentum, dtype),
                  ops.ones((), dtype))
    mixed = (1.0 - m) * old + m * dml.divide_no_nan(counts, total)
    mixed = dml.divide_no_nan(mixed, ops.sum(mixed))
    use = ops.logical_and(total > 0, ok)
    return ops.where(use, mixed, old), low


def _dynamic_terms(inputs, histogram, ok, min_val, momentum, miner, num_bins=None):
    """``(terms, new_histogram)``: per anchor its triplets' ``w(x) x``, ``w`` the CDF of the
    updated histogram at the node below ``x`` (a constant of the gradient)."""
    x, mask = _gaps(inputs, miner)
    new, low = updated_histogram(histogram, x, mask, min_val, momentum, ok)
    cdf = ops.stop_gradient(dml.cumsum(new, axis=0))
    weight = ops.take(cdf, low)
    return triplet_terms(weight * x, mask), new


def dynamic_soft_margin_loss(
    y_true,
    y_pred,
    histogram,
    min_val: float = -2.0,
    momentum: float = 0.01,
    miner="default",
    ref_embeddings=None,
    ref_labels=None,
    ref_offset=None,
    average: str = "terms",
):
    """Functional form of :class:`DynamicSoftMarginLoss`: the histogram in, the updated one out.

    Args:
        y_true: ``[B]`` or ``[B, 1]`` integer class ids.
        y_pred: ``[B, D]`` embeddings.
        histogram: ``[num_bins]`` the running histogram before this batch (all zeros:
            none yet, the batch sets it).
        min_val, momentum, miner, average: as in :class:`DynamicSoftMarginLoss`.
        ref_embeddings, ref_labels, ref_offset: a reference set to take the positives and
            negatives from, as in :func:`tfdml.losses.triplet_nca_loss`.

    Returns:
        ``(value, new_histogram)``: the loss, a scalar of the dtype of ``y_pred`` (0 without
        a triplet, NaN when an embedding is NaN or Inf), and the histogram after this batch
        (in the compute dtype; ``histogram`` itself when the batch has no triplet or a
        non-finite embedding).
    """
    histogram = ops.convert_to_tensor(histogram)
    if len(histogram.shape) != 1 or histogram.shape[0] is None:
        raise ValueError("`histogram` must be a vector of `num_bins` entries. Received shape "
                         f"{tuple(histogram.shape)}")
    arguments = _check_dynamic(min_val, histogram.shape[0], momentum, miner)
    check_average(average)
    inputs = prepare_inputs(y_true, y_pred, ref_embeddings, ref_labels, ref_offset, True)
    ok = dml.all_finite(y_pred, ref_embeddings)
    terms, new = _dynamic_terms(inputs, histogram, ok, **arguments)
    return functional_value(terms, average, y_pred, ref_embeddings), new


class _Histogram(LossState):
    """The state of a :class:`DynamicSoftMarginLoss`: its running histogram (float32,
    ``[num_bins]``, zeros until the first training batch) and its miner's seed."""

    def __init__(self, num_bins, seed_generators=(), **kwargs):
        super().__init__(seed_generators, **kwargs)
        self.num_bins = int(num_bins)
        self.build()  # the histogram's shape does not depend on the embeddings

    def make_variables(self, embedding_dim):
        self.histogram = self.add_weight(shape=(self.num_bins,), initializer="zeros",
                                         dtype="float32", trainable=False, name="histogram",
                                         aggregation="only_first_replica")


@loss_class("dynamic_soft_margin_loss", average="terms", normalize=None,
            common=("average", "reduction", "name", "dtype"))
class DynamicSoftMarginLoss(MetricLoss):
    """Dynamic soft margin loss: every triplet weighted by the running CDF of ``d_ap - d_an``.

    With ``d`` the Euclidean distance between L2-normalized embeddings and
    ``x = d_ap - d_an`` for each triplet ``(a, p, n)``::

        L = mean over triplets of  CDF(x) * x

    where ``CDF`` is the cumulative sum of a histogram of ``x`` kept across batches
    (Zhang & Rusinkiewicz's dynamic soft margin): ``num_bins`` nodes ``min_val + k
    delta`` (``delta = 2 |min_val| / num_bins``), each triplet's mass split linearly
    between the two nodes around its ``x``, the batch's histogram (divided by its
    number of triplets) mixed in with ``momentum`` (the first batch sets it), and
    the result renormalized to sum 1. ``CDF(x)`` is read at the node at or below
    ``x``, after this batch's update. The weight is a constant of the gradient:
    ``dL/dx = CDF(x)``, so triplets whose ``x`` is large for the current
    distribution (hard ones) pull hardest, with no margin to tune. Values outside
    ``[min_val, -min_val - delta]`` count at the end nodes.

    The histogram is the loss's state (``loss.histogram``, a non-trainable
    float32 variable): train with :class:`tfdml.models.MetricModel`, which owns,
    updates (also under JAX's stateless training) and saves it. Training calls
    update it; ``training=False`` (``evaluate``) computes with this batch's update
    and leaves it unchanged. A batch without triplets or with a NaN or Inf
    embedding leaves it unchanged too. The functional form
    :func:`dynamic_soft_margin_loss` takes and returns the histogram explicitly.

    **Averaged over** the triplets (``average="terms"``), as
    pytorch-metric-learning. Differences from its ``DynamicSoftMarginLoss``
    (docs/losses.md): the batch histogram is normalized before the momentum mix
    (pytorch-metric-learning mixes raw counts, so a batch of ``T`` triplets weighs
    ``m T / (1 - m + m T)``); no gradient flows through the histogram
    (pytorch-metric-learning's carries one, from the split shares, across steps
    too); out-of-range values are clipped (pytorch-metric-learning raises an
    IndexError).

    Args:
        min_val: the lowest node, ``< 0``; the nodes span ``[min_val, -min_val)``.
            Defaults to `-2.0` (distances of unit vectors are at most 2).
        num_bins: the number of nodes, ``>= 1``. Defaults to `10`.
        momentum: the weight of the batch's histogram, in ``(0, 1]``. Defaults
            to `0.01`.
        miner: a :class:`tfdml.miners.Miner` selecting the triplets; `None` or
            `"default"` for every triplet of the batch. Defaults to `"default"`.

    Examples:

    >>> loss = tfdml.losses.DynamicSoftMarginLoss(num_bins=20)
    >>> model = tfdml.models.MetricModel(embedder, loss)
    >>> model.compile(optimizer="adam")

    Reference:
        Zhang, Rusinkiewicz, "Learning local descriptors with a CDF-based dynamic
        soft margin", ICCV 2019.
    """

    terms = None
    check_arguments = staticmethod(_check_dynamic)

    def _make_state(self):
        return _Histogram(self.num_bins, self._seed_generators(), name=f"{self.name}_state")

    @property
    def histogram(self):
        """The running histogram, a ``[num_bins]`` non-trainable variable."""
        return self.state.histogram

    @classmethod
    def functional(cls, *args, **kwargs):
        raise NotImplementedError("Use tfdml.losses.dynamic_soft_margin_loss (it takes the "
                                  "histogram).")

    def compute_terms(self, labels, embeddings, ref_embeddings=None, ref_labels=None,
                      ref_offset=None, training=True):
        """The triplets' terms with this batch's update of the histogram; ``training``
        stores the update."""
        state = self.state
        inputs = prepare_inputs(labels, embeddings, ref_embeddings, ref_labels, ref_offset,
                                True)
        ok = dml.all_finite(embeddings, ref_embeddings)
        terms, new = _dynamic_terms(inputs, state.histogram, ok, **self.arguments)
        if training:
            state.histogram.assign(ops.cast(new, "float32"))
        return terms

    def per_anchor(self, labels, embeddings, ref_embeddings=None, ref_labels=None, ref_offset=None):
        return self.compute_terms(labels, embeddings, ref_embeddings, ref_labels, ref_offset,
                                  training=False)

    def get_config(self):
        config = super().get_config()
        config.pop("normalize", None)
        return config

