"""The dynamic soft margin loss (Zhang & Rusinkiewicz): triplets weighted by a running CDF.

Per triplet ``(a, p, n)`` the loss is ``w(x) x`` with ``x = d_ap - d_an`` and ``w`` the
cumulative distribution of ``x`` over the triplets seen so far, estimated by a histogram
that each batch updates with momentum. The histogram is the loss's state (a non-trainable
variable that :class:`tfdml.models.MetricModel` owns and saves); the weight ``w`` is a
constant of the gradient, as in the paper, so ``dL/dx = w(x)``.

**Without the [B, P, N] tensor.** ``w(x) = CDF[low(x)]`` depends on ``x`` only through
its node ``low(x) = floor(clip(v, 0, num_bins - 1))``, ``v = (x - min_val) / delta``, and
``v`` grows with ``d_ap``. When the mined triplets of an anchor are every pair of its
positives ``P_a`` and negatives ``N_a`` (a miner that returns pairs, such as the default
:class:`tfdml.miners.AllPairsMiner`), the anchor's positives are sorted by distance once,
and for each negative ``n`` and node ``k`` a binary search finds ``M_k(n)``, how many
positives give ``v >= k`` (a suffix of the sorted positives: usually the fewer, so the
search is short). With ``rise_k = CDF[k] - CDF[k-1]`` (``CDF[-1] = 0``) and ``rank(p)``
the place of ``p`` among the sorted positives (from 0)::

    sum over p of w(x_apn) = V_an = sum_k rise_k M_k(n)   (M_0(n) = |P_a|)
    sum over n of w(x_apn) = U_ap = sum_k rise_k C_k(p),  C_k(p) = #{n : M_k(n) >= |P_a| - rank(p)}

and the anchor's terms are ``sum_p d_ap U_ap - sum_n d_an V_an``, one sum of the
distances times weights that are constants of the gradient: the value and the gradient of
the sum over its triplets. The histogram's update needs, per node, the number of triplets
and the sum of their ``x``, which the same counts give (``M_k(n) - M_{k+1}(n)`` triplets of
``(a, n)`` at node ``k``). The searches compare ``v`` computed exactly as for a single
triplet, so every triplet lands at the node the dense computation gives it. Memory ``O(B
R)``: a few ``[B, R]`` arrays, the searches over chunks of anchors of at most 2^20 entries
and over the nodes one at a time (all at once for a small batch); time ``O(B R num_bins
log P)`` for ``P`` positives per anchor. Other miners return single-choice triplets (``[B,
P, 1]`` or ``[B, 1, N]``: ``O(B R)`` already) or, for
:class:`tfdml.miners.TripletMarginMiner` and :class:`tfdml.miners.AngularMiner`, their own
``[B, R, R]`` mask, which is computed triplet by triplet as before.
"""

from __future__ import annotations

import keras
from keras import ops

from tfdml import ops as dml
from tfdml._argument_checks import check_int, check_number
from tfdml._docs import fill_doc
from tfdml.losses._docstrings import shared_args
from tfdml.losses._soft_margin_counts import (  # bin_positions: this module's, as before
    bin_positions,  # noqa: F401
    dynamic_terms,
    dynamic_terms_in_blocks,
)
from tfdml.losses.base import MetricLoss, functional_value, random_miners
from tfdml.losses.inputs import prepare_inputs, resolve_miner
from tfdml.losses.state import LossState
from tfdml.losses.terms import check_average
from tfdml.miners import AllPairsMiner

__all__ = ["DynamicSoftMarginLoss", "dynamic_soft_margin_loss"]


def _check_dynamic(min_val, num_bins, momentum, miner):
    """The loss's own arguments, checked, by name (the class's and the functional form's)."""
    return {"min_val": check_number("min_val", min_val, high=0, high_open=True, finite=True),
            "num_bins": check_int("num_bins", num_bins),
            "momentum": check_number("momentum", momentum, low=0, high=1, low_open=True),
            "miner": resolve_miner(miner, AllPairsMiner)}


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
    terms, new = dynamic_terms(inputs, histogram, ok, **arguments)
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


@keras.saving.register_keras_serializable(package="tfdml")
@fill_doc(SHARED_ARGS=shared_args("dynamic_soft_margin_loss", average="terms",
                                  arguments=("average", "reduction", "name", "dtype",
                                             "block_size")))
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

    **Memory.** With a miner that returns pairs (the default: every triplet of
    the batch), the loss never forms its ``[B, R, R]`` triplets: it sorts each
    anchor's positives by distance once and, per histogram node, counts by
    binary search how many of them put each (anchor, negative) pair's
    triplets at or above the node. That gives the terms, their gradient and
    the histogram's update of the sum over triplets (module docstring), in
    ``O(B R)`` memory and ``O(B R num_bins log P)`` time for ``P`` positives
    per anchor. ``block_size`` computes it over blocks of anchors in two
    passes, the blocks' histogram counts and then their terms with the
    updated CDF (each block recomputed in the backward pass):
    ``O(block_size x R)`` memory, the same values, gradients and histogram,
    which moves once per step. :class:`tfdml.miners.TripletMarginMiner` and
    :class:`tfdml.miners.AngularMiner` build their own ``[B, R, R]`` mask;
    with them the loss computes triplet by triplet (``O(B R^2)``). Measured
    by ``benchmarks/dsm_memory.py``: at B = 4096, D = 128 a training step's
    tensors peak at 360-860 MiB (compiled to eager; the distance matrix and
    its gradient alone take 260-730 MiB), 130-190 MiB in blocks of 512.

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
        {SHARED_ARGS}

    Examples:

    >>> loss = tfdml.losses.DynamicSoftMarginLoss(num_bins=20)
    >>> model = tfdml.models.MetricModel(embedder, loss)
    >>> model.compile(optimizer="adam")

    Reference:
        Zhang, Rusinkiewicz, "Learning local descriptors with a CDF-based dynamic
        soft margin", ICCV 2019.
    """

    blockwise = False  # the histogram's update needs the whole batch: two passes, in terms

    def __init__(self, min_val: float = -2.0, num_bins: int = 10, momentum: float = 0.01,
                 miner="default", *, average="terms", reduction="sum_over_batch_size",
                 name="dynamic_soft_margin_loss", dtype=None, block_size=None):
        super().__init__(**_check_dynamic(min_val, num_bins, momentum, miner), average=average,
                         reduction=reduction, name=name, dtype=dtype, block_size=block_size)

    def make_state(self):
        return _Histogram(self.num_bins, self._seed_generators(), name=f"{self.name}_state")

    @property
    def histogram(self):
        """The running histogram, a ``[num_bins]`` non-trainable variable."""
        return self.state.histogram

    def _terms_and_histogram(self, inputs):
        """``(terms, new_histogram)``: the batch's terms with its update of the histogram."""
        ok = dml.all_finite(inputs.x, None if inputs.batch_is_reference else inputs.ref)
        histogram = self.state.histogram
        if not self.uses_blocks(inputs.x):
            return dynamic_terms(inputs, histogram, ok, **self.arguments)
        return dynamic_terms_in_blocks(inputs, histogram, ok, self.block_size,
                                       random_miners(self), **self.arguments)

    def terms(self, inputs):
        """The terms with this batch's update of the histogram, which is not stored."""
        return self._terms_and_histogram(inputs)[0]

    def compute_terms(self, labels, embeddings, ref_embeddings=None, ref_labels=None,
                      ref_offset=None, training=True):
        """The triplets' terms with this batch's update of the histogram; ``training``
        stores the update."""
        inputs = self.prepare(labels, embeddings, ref_embeddings, ref_labels, ref_offset)
        terms, new = self._terms_and_histogram(inputs)
        if training:
            self.state.histogram.assign(ops.cast(new, "float32"))
        return terms
