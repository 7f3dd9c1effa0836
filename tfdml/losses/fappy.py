"""FAPPY (false positive probability, fused over bin widths) and the histogram loss.

Both estimate distributions of cosine similarities with histograms on the nodes
``b_u = -1 + u * Delta`` (``u = 0 .. n-1``, ``n = 2 / Delta + 1``), where a
similarity ``s`` in ``[b_v, b_{v+1}]`` splits a unit weight between its two
neighbouring nodes: ``(b_{v+1} - s) / Delta`` on ``b_v`` and ``(s - b_v) / Delta`` on
``b_{v+1}`` (the triangular kernel, eq. 3 of the FAPPY paper). The node index is
not differentiated; the interpolation weights carry the gradient.

Cost: one ``[B, n]`` histogram per anchor and scale, and ``[B, B]`` gathers:
``O(B^2 + B n)`` memory, never ``B^2 n``.
"""

from __future__ import annotations

import math

import keras
from keras import ops

from tfdml import ops as dml
from tfdml._argument_checks import check_number
from tfdml._docs import fill_doc
from tfdml._shims import dtype_name
from tfdml.losses._docstrings import shared_args
from tfdml.losses.base import MetricLoss
from tfdml.losses.inputs import prepare_inputs
from tfdml.losses.row_blocks import RowBlocks, batch_rows
from tfdml.losses.terms import AnchorTerms, anchor_terms

__all__ = ["FAPPYLoss", "HistogramLoss", "false_positive_probability", "node_histograms"]


def _check_width(name, value, upper=2.0):
    return check_number(name, value, low=0, high=upper, low_open=True)


def _num_nodes(bin_width):
    """Nodes -1, -1 + Delta, ..., 1: ``ceil(2 / Delta) + 1`` (the last one at or past 1)."""
    return int(math.ceil(2.0 / bin_width - 1e-9)) + 1


def _interpolate(s, bin_width, num_nodes):
    """``(v, frac)``: node index below ``s`` (held constant) and the weight of node ``v + 1``.

    ``s`` is clipped to [-1, 1]; ``v <= num_nodes - 2``, so ``s = 1`` gives ``frac = 1``
    on the last node instead of falling past it. A NaN ``s`` gets node 0 and a NaN ``frac``.
    """
    s = dml.clip(s, -1.0, 1.0)
    position = (s + 1.0) / bin_width
    v = ops.clip(dml.floor(ops.stop_gradient(position)), 0.0, float(num_nodes - 2))
    v = ops.where(ops.isnan(v), ops.zeros_like(v), v)  # a NaN stays in `frac`, not the index
    return ops.cast(v, "int32"), position - v


def node_histograms(s, mask, bin_width, num_nodes, normalize=True):
    """Per row ``i``: the triangular-kernel histogram of ``s[i, k]`` over the ``k`` in ``mask``,
    normalized by the row's count: ``[B, n]`` (zeros for an empty row). With
    ``normalize=False``, the sums of the kernel weights."""
    rows = s.shape[0] if s.shape[0] is not None else ops.shape(s)[0]
    v, frac = _interpolate(s, bin_width, num_nodes)
    weights = ops.cast(mask, dtype_name(s))
    if normalize:
        count = ops.sum(weights, axis=1, keepdims=True)
        weights = dml.divide_no_nan(weights, count)
    base = ops.arange(rows, dtype="int32")[:, None] * num_nodes
    segments = ops.reshape(ops.concatenate([base + v, base + v + 1], axis=1), (-1,))
    data = ops.reshape(ops.concatenate([(1.0 - frac) * weights, frac * weights], axis=1),
                        (-1,))
    hist = dml.segment_sum(data, segments, rows * num_nodes)
    return ops.reshape(hist, (rows, num_nodes))


def _tails(hist):
    """``tail[i, u] = sum_{u' >= u} h_i^{u'}``, with a zero column past the last node."""
    reverse_cumsum = ops.flip(dml.cumsum(ops.flip(hist, axis=1), axis=1), axis=1)
    return ops.concatenate([reverse_cumsum, ops.zeros_like(hist[:, :1])], axis=1)


def _fpp(sim, positive, negative, bin_width):
    """``P_ij^Delta`` (eq. 7) for every pair, ``[B, B]``; 0 where ``positive`` is false."""
    n = _num_nodes(bin_width)
    tail = _tails(node_histograms(sim, negative, bin_width, n))
    t, h_right = _interpolate(sim, bin_width, n)
    h_left = 1.0 - h_right

    # side[i, j]: the term of pair (i, j) that uses the negatives of i (row i of the table).
    side = (h_left * dml.take_along_axis(tail, t, axis=1)
            + h_right * dml.take_along_axis(tail, t + 1, axis=1))
    # The negatives of j are read from row j: side[j, i], as sim (hence t, h) is symmetric.
    p = side + ops.transpose(side)
    return ops.where(positive, p, ops.zeros_like(p))


def false_positive_probability(labels, embeddings, bin_width):
    """``P_ij^Delta`` of eq. 7 of the FAPPY paper, for every positive pair of the batch.

    For a positive pair ``(i, j)`` with ``s_ij`` in ``[b_t, b_{t+1}]``,
    ``h_left = (b_{t+1} - s_ij) / Delta`` and ``h_right = (s_ij - b_t) / Delta``,
    and ``h_i^u`` the triangular-kernel histogram of the similarities of ``i``
    to its negatives (all samples of other classes), normalized by their count::

        P_ij = h_left sum_{u >= t} h_i^u + h_right sum_{u >= t+1} h_i^u
             + h_left sum_{u >= t} h_j^u + h_right sum_{u >= t+1} h_j^u

    an estimate of ``P(s_ik >= s_ij) + P(s_jl >= s_ij)``.

    Args:
        labels: ``[B]`` integer class ids.
        embeddings: ``[B, D]``; L2-normalized here (cosine similarities).
        bin_width: ``Delta`` in ``(0, 2]``.

    Returns:
        ``[B, B]`` tensor in the compute dtype (float32, float64 for float64
        input): ``P_ij`` where ``i != j`` share a label, 0 elsewhere (also when
        there is no negative).
    """
    bin_width = _check_width("bin_width", bin_width)
    labels, x, _, _, _ = prepare_inputs(labels, embeddings)
    sim = _symmetric_similarity(x)
    positive, negative = dml.label_masks(labels, labels, 0)
    return _fpp(sim, positive, negative, bin_width)


def _symmetric_similarity(x):
    """Cosine similarities, exactly symmetric (``_fpp`` reads pair (i, j) from both rows)."""
    sim = dml.pairwise_similarity(x, x)
    return 0.5 * (sim + ops.transpose(sim))


def _scales(min_bin_width):
    """Algorithm 1's bin widths: 2.0, 1.0, 0.5, ... while >= min_bin_width."""
    widths, width = [], 2.0
    while width >= min_bin_width:
        widths.append(width)
        width /= 2.0
    return widths


def _fappy_terms(inputs, min_bin_width):
    labels, x = inputs.labels, inputs.x
    sim = _symmetric_similarity(x)
    positive, negative = dml.label_masks(labels, labels, 0)
    pair_weights = ops.zeros_like(sim)
    for width in _scales(min_bin_width):
        counted = ops.logical_and(positive, 1.0 - sim >= width)
        # L <- (L + L_Delta / count) / 2: every earlier scale is halved once more.
        pair_weights = 0.5 * (pair_weights + _fpp(sim, counted, negative, width))
    # Each unordered pair appears twice in the [B, B] table: half of it per anchor, so
    # that the sum over anchors divided by the summed counts is the mean over pairs.
    dtype = dtype_name(sim)
    total = 0.5 * ops.sum(pair_weights, axis=1)
    count = 0.5 * ops.sum(ops.cast(positive, dtype), axis=1)
    nonzero = 0.5 * ops.sum(
        ops.cast(ops.logical_and(positive, pair_weights > 0), dtype), axis=1)
    return AnchorTerms(total, count, nonzero)


def _blocked_fappy(inputs, min_bin_width, block_size):
    """:func:`_fappy_terms` in row blocks (two passes; see ``FAPPYLoss``)."""
    labels, x = inputs.labels, inputs.x
    blocks = RowBlocks(batch_rows(x), block_size)
    widths = _scales(min_bin_width)
    nodes = [_num_nodes(w) for w in widths]
    dtype = dtype_name(x)

    def block_pairs(i, x):
        start = blocks.start(i)
        sim = dml.pairwise_similarity(blocks.rows(x, i), x)
        positive, negative = dml.label_masks(blocks.rows(labels, i), labels, start)
        return sim, positive, negative

    def histograms(i, x):  # pass 1: each row's histogram of its negatives, per scale
        sim, _, negative = block_pairs(i, x)
        return tuple(node_histograms(sim, negative, w, n) for w, n in zip(widths, nodes, strict=True))

    stacked = blocks.map(histograms, (x,), [((None, n), dtype) for n in nodes])
    tails = [_tails(blocks.assemble(h)) for h in stacked]

    def pair_terms(i, x, *tails):  # pass 2: the fused P_ij of the block's pairs
        sim, positive, _ = block_pairs(i, x)
        columns = ops.arange(ops.shape(sim)[1], dtype="int32")[None, :]
        pair_weights = ops.zeros_like(sim)
        for width, n, tail in zip(widths, nodes, tails, strict=True):
            counted = ops.logical_and(positive, 1.0 - sim >= width)
            t, h_right = _interpolate(sim, width, n)
            h_left = 1.0 - h_right
            own = blocks.rows(tail, i)  # the negatives of i: its row of the table
            flat = ops.reshape(tail, (-1,))  # the negatives of j: row j
            at = columns * (n + 1) + t
            p = (h_left * dml.take_along_axis(own, t, axis=1)
                 + h_right * dml.take_along_axis(own, t + 1, axis=1)
                 + h_left * ops.take(flat, at) + h_right * ops.take(flat, at + 1))
            pair_weights = 0.5 * (pair_weights + ops.where(counted, p, ops.zeros_like(p)))
        total = 0.5 * ops.sum(pair_weights, axis=1)
        count = 0.5 * ops.sum(ops.cast(positive, dtype), axis=1)
        nonzero = 0.5 * ops.sum(
            ops.cast(ops.logical_and(positive, pair_weights > 0), dtype), axis=1)
        return total, count, nonzero

    stacked = blocks.map(pair_terms, (x, *tails), [((None,), dtype)] * 3)
    return AnchorTerms(*(blocks.assemble(s) for s in stacked))


def _blocked_histogram_loss(inputs, bin_width, block_size):
    """:func:`_histogram_terms` in row blocks: the two histograms summed over blocks."""
    labels, x = inputs.labels, inputs.x
    blocks = RowBlocks(batch_rows(x), block_size)
    n = _num_nodes(bin_width)
    dtype = dtype_name(x)

    def sums(i, x):
        start = blocks.start(i)
        sim = dml.pairwise_similarity(blocks.rows(x, i), x)
        positive, negative = dml.label_masks(blocks.rows(labels, i), labels, start)
        rows = start + ops.arange(ops.shape(sim)[0], dtype="int32")
        columns = ops.arange(ops.shape(sim)[1], dtype="int32")
        # Each unordered pair once (i < j), and each row in one block only.
        keep = ops.logical_and(columns[None, :] > rows[:, None], blocks.fresh(i)[:, None])
        out = []
        for mask in (ops.logical_and(positive, keep), ops.logical_and(negative, keep)):
            flat_mask = ops.reshape(mask, (1, -1))
            out.append(node_histograms(ops.reshape(sim, (1, -1)), flat_mask, bin_width, n,
                                        normalize=False)[0])
            out.append(ops.sum(ops.cast(flat_mask, dtype)))
        out.append(ops.cast(ops.any(positive, axis=1), dtype))
        return tuple(out)

    signature = [((n,), dtype), ((), dtype), ((n,), dtype), ((), dtype), ((None,), dtype)]
    pos_sum, pos_count, neg_sum, neg_count, has_positive = blocks.map(sums, (x,), signature)
    pos_count, neg_count = ops.sum(pos_count), ops.sum(neg_count)
    h_pos = dml.divide_no_nan(ops.sum(pos_sum, axis=0), pos_count)
    h_neg = dml.divide_no_nan(ops.sum(neg_sum, axis=0), neg_count)
    value = ops.sum(h_neg * dml.cumsum(h_pos))
    has_pairs = ops.logical_and(pos_count > 0, neg_count > 0)
    value = ops.where(has_pairs, value, ops.zeros_like(value))
    valid = ops.logical_and(blocks.assemble(has_positive) > 0, has_pairs)
    return anchor_terms(ops.broadcast_to(value, ops.shape(valid)), valid)


#: The shared arguments of these losses, in the order of their signatures.
_BATCH_PAIRS_ARGUMENTS = ("average", "reduction", "name", "dtype", "block_size")


@keras.saving.register_keras_serializable(package="tfdml")
@fill_doc(SHARED_ARGS=shared_args("fappy_loss", average="terms", arguments=_BATCH_PAIRS_ARGUMENTS))
class FAPPYLoss(MetricLoss):
    """FAPPY: the false positive probability, fused over bin widths (Algorithm 1).

    For each positive pair ``(i, j)`` and bin width ``Delta``, ``P_ij^Delta``
    (:func:`false_positive_probability`, eq. 7) estimates the probability that
    a negative of ``i`` or ``j`` is more similar than ``s_ij``. Algorithm 1
    fuses the scales ``Delta = 2, 1, 1/2, ...`` down to ``min_bin_width``::

        L = 0
        for Delta in 2, 1, 1/2, ... (while Delta >= min_bin_width):
            L_Delta = sum over positive pairs with 1 - s_ij >= Delta of P_ij^Delta
            L = (L + L_Delta / count) / 2

    with ``count`` the number of positive pairs (unordered, ``i != j``), so the
    finest scale weighs 1/2, the next 1/4, and so on. The loss is ``L``, the
    average over the batch's positive pairs. This follows the paper; the
    authors' released Caffe code divides each scale by its own count of
    counted pairs instead, which over-weights the finest scale.

    **Averaged over** the positive pairs (``average="terms"``), as in the
    paper. Each unordered pair is two half terms, one at each of its anchors:
    with ``reduction="none"`` anchor ``i`` gets half of the fused values of
    its pairs. ``average="anchors"`` takes per anchor the mean over its pairs
    and then the mean over anchors. A batch without positive pairs gives 0.
    Gradients reach a negative similarity only near ``s_ij``: in ``s_ij``'s
    bin (``h_right / (Delta |N|)``) and in the bin just below it
    (``h_left / (Delta |N|)``: the triangular kernel puts part of a negative
    from the lower bin on ``s_ij``'s lower node). The paper's Lemma 1 names
    only the first bin; its proof drops the second term (docs/losses.md).

    Cost: ``O(B^2 + B n)`` memory per scale for ``n = 2 / Delta + 1`` nodes
    (about ``B * 4 / min_bin_width`` numbers over all scales), all scales in
    one graph (``log2(2 / min_bin_width) + 1`` of them).

    Args:
        min_bin_width: the smallest ``Delta``, in ``(0, 2]``. Defaults to
            `0.01`; the paper reports the same results for 0.01, 0.001 and
            0.0001.
        {SHARED_ARGS}

    Examples:

    >>> loss = tfdml.losses.FAPPYLoss(min_bin_width=0.001)
    >>> model.compile(optimizer="adam", loss=loss, jit_compile=True)

    Reference:
        "Deep metric learning with false positive probability" (FAPPY),
        Section 3 and Algorithm 1.
    """

    blockwise = False  # the negatives' histograms of the whole batch: two passes, in terms
    takes_reference_set = False

    def __init__(self, min_bin_width=0.01, *, average="terms", reduction="sum_over_batch_size",
                 name="fappy_loss", dtype=None, block_size=None):
        super().__init__(min_bin_width=_check_width("min_bin_width", min_bin_width),
                         average=average, reduction=reduction, name=name, dtype=dtype,
                         block_size=block_size)

    def terms(self, inputs):
        if self.uses_blocks(inputs.x):
            return _blocked_fappy(inputs, self.min_bin_width, self.block_size)
        return _fappy_terms(inputs, self.min_bin_width)


def _histogram_terms(inputs, bin_width):
    labels, x = inputs.labels, inputs.x
    sim = dml.pairwise_similarity(x, x)
    positive, negative = dml.label_masks(labels, labels, 0)
    upper = ops.cast(ops.triu(ops.ones_like(sim), k=1), "bool")  # i < j
    n = _num_nodes(bin_width)
    flat_sim = ops.reshape(sim, (1, -1))

    def histogram(mask):
        return node_histograms(flat_sim, ops.reshape(ops.logical_and(mask, upper), (1, -1)),
                                bin_width, n)[0]

    h_pos, h_neg = histogram(positive), histogram(negative)
    value = ops.sum(h_neg * dml.cumsum(h_pos))
    has_pairs = ops.logical_and(ops.any(positive), ops.any(negative))
    value = ops.where(has_pairs, value, ops.zeros_like(value))
    valid = ops.logical_and(ops.any(positive, axis=1), has_pairs)
    return anchor_terms(ops.broadcast_to(value, ops.shape(valid)), valid)


@keras.saving.register_keras_serializable(package="tfdml")
@fill_doc(SHARED_ARGS=shared_args("histogram_loss", arguments=_BATCH_PAIRS_ARGUMENTS))
class HistogramLoss(MetricLoss):
    """The histogram loss of Ustinova and Lempitsky (2016), the baseline of FAPPY.

    The cosine similarities of all positive pairs and of all negative pairs of
    the batch (unordered, ``i < j``) give two triangular-kernel histograms on
    nodes spaced ``bin_width`` over [-1, 1], each normalized by its pair count
    (``h+`` and ``h-``). The loss estimates the probability that a random
    negative pair is more similar than a random positive pair::

        L = sum_r h-_r * sum_{q <= r} h+_q

    It is a batch-level value: every anchor with a positive pair reports ``L``
    as its one term, so the default mean over those anchors
    (``average="anchors"``) is ``L``. A batch without positive or without
    negative pairs gives 0. Memory ``O(B^2 + n)``.

    Args:
        bin_width: node spacing ``Delta`` in ``(0, 2]``. Defaults to `0.01`
            (201 nodes, Ustinova and Lempitsky's setting).
        {SHARED_ARGS}

    Reference:
        Ustinova, Lempitsky, "Learning deep embeddings with histogram loss",
        NIPS 2016.
    """

    blockwise = False  # the two histograms of the whole batch: summed over blocks, in terms
    takes_reference_set = False

    def __init__(self, bin_width=0.01, *, average="anchors", reduction="sum_over_batch_size",
                 name="histogram_loss", dtype=None, block_size=None):
        super().__init__(bin_width=_check_width("bin_width", bin_width), average=average,
                         reduction=reduction, name=name, dtype=dtype, block_size=block_size)

    def terms(self, inputs):
        if self.uses_blocks(inputs.x):
            return _blocked_histogram_loss(inputs, self.bin_width, self.block_size)
        return _histogram_terms(inputs, self.bin_width)

