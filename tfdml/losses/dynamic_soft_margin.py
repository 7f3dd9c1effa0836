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

import contextlib
from typing import Any, NamedTuple

import keras
from keras import ops

from tfdml import ops as dml
from tfdml._checks import check_int, check_number
from tfdml.losses.base import (
    Inputs,
    LossState,
    MetricLoss,
    check_average,
    functional_value,
    prepare_inputs,
    resolve_miner,
    triplet_terms,
)
from tfdml.losses.blocks import RowBlocks, _BlockSeed, _random_miners, batch_rows
from tfdml.losses.spec import loss_class
from tfdml.losses.terms import AnchorTerms
from tfdml.miners import AllPairsMiner, Pairs, TripletMiner, as_triplets, gather_triplet_scores

__all__ = ["DynamicSoftMarginLoss", "dynamic_soft_margin_loss"]


def _check_dynamic(min_val: float = -2.0, num_bins: int = 10, momentum: float = 0.01,
                   miner="default"):
    return {"min_val": check_number("min_val", min_val, high=0, high_open=True, finite=True),
            "num_bins": check_int("num_bins", num_bins),
            "momentum": check_number("momentum", momentum, low=0, high=1, low_open=True),
            "miner": resolve_miner(miner, AllPairsMiner)}


def _node_spacing(min_val, num_bins):
    """``delta = 2 |min_val| / num_bins``, the distance between two nodes (a Python float)."""
    return 2.0 * abs(min_val) / num_bins


def _grid_position(x, min_val, delta):
    """``v = (x - min_val) / delta``: ``x`` in units of the node spacing from the first node."""
    return (x - min_val) / delta


def bin_positions(x, min_val, num_bins):
    """``(low, frac)``: the grid node at or below each value and the share past it.

    Node ``k`` is ``min_val + k * delta`` with ``delta = 2 |min_val| / num_bins``,
    ``k = 0 .. num_bins - 1``. Values outside ``[min_val, -min_val - delta]`` are clipped
    to the end nodes; non-finite values count as ``min_val`` (the histogram ignores a batch
    holding them).
    """
    v = _grid_position(x, min_val, _node_spacing(min_val, num_bins))
    v = ops.where(ops.isfinite(v), v, ops.zeros_like(v))
    v = ops.clip(v, 0.0, float(num_bins - 1))
    low = dml.floor(v)
    return ops.cast(low, "int32"), v - low


def _split_counts(x, mask, num_bins, min_val):
    """``(counts, total)``: each masked value's unit mass split linearly between the two
    nodes around it, summed per node (``[num_bins]``), and the number of masked values."""
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
    return counts, ops.sum(weight)


def _mixed_histogram(histogram, counts, total, momentum, ok):
    """``(1 - m) h + m counts / total``, renormalized; ``histogram`` itself when ``total`` is
    0 or ``ok`` is false. ``m`` is ``momentum``, or 1 while ``histogram`` is all zeros."""
    dtype = dml.dtype_name(counts)
    old = ops.cast(ops.stop_gradient(histogram), dtype)
    m = ops.where(ops.sum(old) > 0, ops.convert_to_tensor(momentum, dtype),
                  ops.ones((), dtype))
    mixed = (1.0 - m) * old + m * dml.divide_no_nan(counts, total)
    mixed = dml.divide_no_nan(mixed, ops.sum(mixed))
    use = ops.logical_and(total > 0, ok)
    return ops.where(use, mixed, old)


# -- the mined triplets: every (positive, negative) pair of an anchor, or a mask -----------------


def _every_combination(miner) -> bool:
    """The miner keeps every (positive, negative) combination of the label masks."""
    return (isinstance(miner, TripletMiner) and miner.positive == "all"
            and miner.negative == "all")


def _selection(inputs: Inputs, miner):
    """``(dist, mined)``: the ``[B, R]`` Euclidean distances and what ``miner`` keeps of them,
    :class:`tfdml.miners.Pairs` (every combination of an anchor's kept positives and kept
    negatives is a triplet) or :class:`tfdml.miners.Triplets`."""
    labels, x, ref_labels, ref, ref_offset = inputs
    dist = dml.distance_matrix(x, ref, "l2")
    if _every_combination(miner):  # its [B, R, R] mask is the product of the label masks
        return dist, Pairs(*dml.label_masks(labels, ref_labels, ref_offset))
    return dist, miner.mine(-dist, labels, ref_labels, ref_offset, x, ref)


class _AllPairs(NamedTuple):
    """Mined triplets that are every (positive, negative) pair of an anchor (``[t, R]``).

    ``dist`` carries the gradient; ``positive`` and ``negative`` mark the kept pairs.
    ``steps``: the iterations of a binary search over an anchor's positives (a Python int,
    or a tensor in a compiled function); ``traced``: the values are symbolic, so loops are
    compiled loops (Python loops eagerly).
    """

    dist: Any
    positive: Any
    negative: Any
    num_positives: Any
    num_negatives: Any
    steps: Any
    traced: bool


class _Sorted(NamedTuple):
    """:class:`_AllPairs` of some anchors with their positives sorted by distance.

    ``ordered[a, j]`` is the ``j``-th smallest distance of anchor ``a`` to a positive (0
    past its ``num_positives[a]`` positives), ``order`` the reference index of each,
    ``valid`` the slots holding a positive; ``dist`` carries no gradient.
    """

    pairs: _AllPairs
    order: Any
    ordered: Any
    valid: Any

    def __getattr__(self, name):  # the fields of `pairs`
        return getattr(self.pairs, name)


class _Dense(NamedTuple):
    """Mined triplets given by a ``[t, P, N]`` mask, and their ``x = d_ap - d_an``."""

    x: Any
    mask: Any


def _prepared(dist, mined):
    """What the histogram's counts and the terms are computed from: :class:`_AllPairs` for
    pairs, :class:`_Dense` for triplets."""
    if not isinstance(mined, Pairs):
        triplets = as_triplets(mined)
        d_ap, d_an = gather_triplet_scores(dist, triplets)
        return _Dense(ops.broadcast_to(d_ap - d_an, ops.shape(triplets.mask)), triplets.mask)
    num_positives = ops.cast(ops.sum(ops.cast(mined.positive, "int32"), axis=1), "int32")
    num_negatives = ops.cast(ops.sum(ops.cast(mined.negative, "int32"), axis=1), "int32")
    traced = dml.is_traced(ops.stop_gradient(dist))
    return _AllPairs(dist, mined.positive, mined.negative, num_positives, num_negatives,
                     _search_steps(num_positives, ops.shape(dist)[1], traced), traced)


def _sorted(pairs: _AllPairs) -> _Sorted:
    """The positives of ``pairs`` (its ``dist`` without gradient) sorted by distance."""
    stopped = ops.stop_gradient(pairs.dist)
    key = ops.where(pairs.positive, stopped, ops.full_like(stopped, float("inf")))
    order = dml.stable_argsort(key, axis=1)
    slots = ops.arange(ops.shape(stopped)[1], dtype="int32")[None, :]
    valid = slots < pairs.num_positives[:, None]
    ordered = dml.take_along_axis(stopped, order, axis=1)
    ordered = ops.where(valid, ordered, ops.zeros((), dml.dtype_name(stopped)))
    return _Sorted(pairs._replace(dist=stopped), order, ordered, valid)


# -- the sorted path: counts by binary search -------------------------------------------------

#: Nodes searched at once: as many as keep a ``[t, R, nodes]`` array within this many entries.
_GROUP_ENTRIES = 1 << 20
#: Anchors per chunk when the reference set's size is known only at run time.
_DYNAMIC_ROWS = 1024


def _group_size(num_bins, cells):
    """How many nodes to search at once for ``cells = t R`` (anchors x reference): the largest
    divisor of ``num_bins`` that keeps ``[t, R, nodes]`` arrays within ``_GROUP_ENTRIES``
    (1 when the shape is known only at run time)."""
    if not isinstance(cells, int):
        return 1
    most = max(1, _GROUP_ENTRIES // max(cells, 1))
    return max(d for d in range(1, num_bins + 1) if num_bins % d == 0 and d <= most)


def _search_steps(counts, width, traced):
    """Iterations of a binary search over at most ``max(counts)`` slots: its bit length.

    Eagerly a Python int. Traced, a tensor (one step more, for the rounding of the log),
    except under PyTorch, whose compiled loops need a Python int: the bound from ``width``.
    """
    if not traced:
        return int(ops.convert_to_numpy(ops.max(counts))).bit_length() if counts.shape[0] else 0
    if keras.backend.backend() == "torch":
        return int(width).bit_length()
    most = ops.cast(ops.max(ops.concatenate([counts, ops.zeros((1,), "int32")])), "float32")
    return ops.cast(ops.ceil(ops.log2(most + 1.0)), "int32") + 1


def _repeat(start, stop, body, state, traced):
    """``state = body(i, state)`` for ``i`` in ``[start, stop)``: a compiled loop
    (``keras.ops.fori_loop``, a while loop under TensorFlow and XLA) when ``traced``, so
    that one iteration's arrays are live at a time, and a Python loop eagerly."""
    if not traced:
        for i in range(start, stop):
            state = body(i, state)
        return state
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        # One iteration at a time: a graph runs up to 10 at once by default (10x the memory).
        return tf.while_loop(lambda i, _: i < stop, lambda i, state: (i + 1, body(i, state)),
                             (tf.constant(start), state), parallel_iterations=1)[1]
    return ops.fori_loop(start, stop, body, state)


def _prefix_count(holds, ordered, count, columns, steps, traced):
    """Per entry of a ``[t, columns]`` grid: the length of the prefix of
    ``ordered[a, :count[a]]`` on which ``holds`` is true (it must be true on a prefix of the
    sorted values and false after it).

    A binary search of ``steps`` iterations; ``holds(values)`` gets the ``[t, columns]``
    values of ``ordered`` under test, for every entry at once.
    """
    last = ops.shape(ordered)[1] - 1
    high = ops.broadcast_to(count[:, None], (ops.shape(ordered)[0], columns))
    low = ops.zeros_like(high)

    def step(_, bounds):
        low, high = bounds
        middle = (low + high) // 2
        value = dml.take_along_axis(ordered, ops.minimum(middle, last), axis=1)
        right = ops.logical_and(low < high, holds(value))
        return ops.where(right, middle + 1, low), ops.where(right, high, middle)

    return _repeat(0, steps, step, (low, high), traced)[0]


def _group_counts(s: _Sorted, nodes, min_val, delta):
    """For the nodes ``nodes`` (``[g]`` int32): ``M[a, n, i]``, how many positives ``p`` of
    anchor ``a`` give ``v >= nodes[i]`` with negative ``n`` (0 for the other columns),
    ``[t, R, g]``, and ``C[a, i, j]``, how many negatives do so with its ``j``-th positive
    (sorted; 0 past its positives), ``[t, g, R]`` (int32).

    ``v`` grows with ``d_ap``: those positives are a suffix of the sorted ones, found by
    binary search; ``C`` follows from where each suffix starts (a scatter and a
    cumulative sum).
    """
    t, width = ops.shape(s.dist)[0], ops.shape(s.dist)[1]
    g = nodes.shape[0]
    d_an = ops.stop_gradient(s.dist)
    dtype = dml.dtype_name(d_an)
    columns = width * g  # (negative, node) pairs, node minor
    d_an = ops.reshape(ops.broadcast_to(d_an[:, :, None], (t, width, g)), (t, columns))
    level = ops.cast(ops.tile(nodes, (width,)), dtype)[None, :]

    def below(d_ap):  # v < node, with v exactly the dense one of x = d_ap - d_an
        return _grid_position(d_ap - d_an, min_val, delta) < level

    start = _prefix_count(below, s.ordered, s.num_positives, columns, s.steps, s.traced)
    negative = ops.reshape(ops.broadcast_to(s.negative[:, :, None], (t, width, g)),
                           (t, columns))
    per_negative = ops.cast(ops.where(negative, s.num_positives[:, None] - start, 0), "int32")
    # C[j] = #{n : start_n <= j}: each start (of a suffix that is not empty) scattered into
    # its node's segment of R slots, then summed.
    segment = ops.tile(ops.arange(g, dtype="int32") * width, (width,))[None, :]
    counted = ops.logical_and(negative, start < s.num_positives[:, None])
    hits = dml.scatter_rows(ops.zeros((t, g * width), "int32"),
                            segment + ops.minimum(start, width - 1), ops.cast(counted, "int32"),
                            mode="add")
    per_positive = ops.cast(dml.cumsum(ops.reshape(hits, (t, g, width)), axis=2), "int32")
    per_positive = ops.cast(ops.where(s.valid[:, None, :], per_positive, 0), "int32")
    return ops.reshape(per_negative, (t, width, g)), per_positive


def _node_loop(num_bins, group, body, state, traced):
    """``body(nodes, state)`` over the nodes in groups of ``group``, from the last node down
    (``nodes``: ``[group]`` int32, descending), as a loop the compiler keeps."""
    offsets = ops.arange(group, dtype="int32")

    def one(j, state):
        return body((num_bins - 1) - (j * group + offsets), state)

    return _repeat(0, num_bins // group, one, state, traced)


def _row_chunks(pairs: _AllPairs):
    """The anchors of ``pairs`` in chunks whose ``[rows, R]`` search arrays hold at most
    ``_GROUP_ENTRIES`` entries (:class:`tfdml.losses.blocks.RowBlocks`), or None for one."""
    t, width = ops.shape(pairs.dist)[0], ops.shape(pairs.dist)[1]
    rows = max(1, _GROUP_ENTRIES // max(width, 1)) if isinstance(width, int) else _DYNAMIC_ROWS
    if isinstance(t, int) and t <= rows:
        return None
    return RowBlocks(t, rows)


def _map_rows(pairs: _AllPairs, fn, outputs, *rows):
    """``fn(chunk, fresh, *rows)`` (a tuple) over the row chunks of ``pairs``, each
    :func:`_sorted`, and of the ``[t, ...]`` tensors ``rows`` (``fresh``: the chunk's rows
    that no earlier chunk had; None for one chunk), each output summed over the chunks
    (``("sum", shape, dtype)``) or put together row by row (``("rows", shape, dtype)``, the
    rows a shifted last chunk repeats once). A compiled loop when traced, a Python loop
    eagerly; no gradient (a tape records nothing here)."""
    chunks = _row_chunks(pairs)
    if chunks is None:
        return fn(_sorted(pairs), None, *rows)
    fields = (ops.stop_gradient(pairs.dist), *pairs[1:-2])  # nothing for a tape to record

    def one(i):
        chunk = _AllPairs(*(chunks.rows(f, i) for f in fields), pairs.steps, pairs.traced)
        return tuple(fn(_sorted(chunk), chunks.fresh(i), *(chunks.rows(r, i) for r in rows)))

    if pairs.traced:
        stacked = dml.map_indices(one, chunks.count, [spec[1:] for spec in outputs])
        return tuple(ops.sum(o, axis=0) if spec[0] == "sum" else chunks.assemble(o)
                     for o, spec in zip(stacked, outputs, strict=True))
    parts = list(zip(*map(one, range(chunks.count)), strict=True))
    overlap = chunks.count * chunks.size - chunks.n  # rows the last chunk repeats
    return tuple(
        sum(p[1:], p[0]) if spec[0] == "sum"
        else ops.concatenate([*p[:-1], p[-1][overlap:]], axis=0)
        for p, spec in zip(parts, outputs, strict=True))


def _sorted_counts(pairs: _AllPairs, keep, min_val, num_bins):
    """:func:`_split_counts` of every triplet of the anchors ``keep`` marks, without them
    (:func:`_chunk_counts` over chunks of anchors, summed)."""
    dtype = dml.dtype_name(pairs.dist)

    def fn(chunk, fresh, keep):
        keep = keep if fresh is None else ops.logical_and(keep, fresh)
        return _chunk_counts(chunk, keep, min_val, num_bins)

    return _map_rows(pairs, fn, [("sum", (num_bins,), dtype), ("sum", (), dtype)], keep)


def _chunk_counts(s: _Sorted, keep, min_val, num_bins):
    """:func:`_split_counts` of every triplet of the anchors ``keep`` marks, without them.

    Node ``k`` (``k <= num_bins - 2``) gets from the triplets with ``k <= v < k + 1`` their
    count minus the summed ``v - k`` and node ``k + 1`` that sum; ``v >= num_bins - 1``
    counts at the last node and ``v < 0`` at the first one.
    """
    dtype = dml.dtype_name(s.dist)
    delta = _node_spacing(min_val, num_bins)
    t, width = ops.shape(s.dist)[0], ops.shape(s.dist)[1]
    group = _group_size(num_bins, t * width if isinstance(t, int) else None)
    d_an = ops.stop_gradient(s.dist)
    kept = ops.cast(keep, dtype)
    every = ops.arange(num_bins, dtype="int32")
    zero = ops.zeros((), dtype)

    def nodes_of(nodes, state):  # the counts of node k + 1 (above the group) are carried
        above_m, above_c, counts = state
        at_least_m, at_least_c = _group_counts(s, nodes, min_val, delta)
        above_m = ops.concatenate([above_m[:, :, None], at_least_m[:, :, :-1]], axis=2)
        above_c = ops.concatenate([above_c[:, None, :], at_least_c[:, :-1, :]], axis=1)
        # the node's triplets, per (anchor, negative) and per (anchor, sorted positive)
        in_m = ops.cast(at_least_m - above_m, dtype) * kept[:, None, None]
        in_c = ops.cast(at_least_c - above_c, dtype) * kept[:, None, None]
        count = ops.sum(ops.sum(in_m, axis=1), axis=0)  # per anchor first: exact, accurate
        low = min_val + ops.cast(nodes, dtype) * delta
        # the summed x - node over the node's triplets, in units of delta: node k + 1's share
        excess = (ops.sum(ops.sum((s.ordered[:, None, :] - low[:, None]) * in_c, axis=2), axis=0)
                  - ops.sum(ops.sum(d_an[:, :, None] * in_m, axis=1), axis=0))
        share = ops.clip(excess / delta, zero, count)
        share = ops.where(nodes < num_bins - 1, share, zero)  # the last node keeps its own
        to_node = ops.cast(ops.equal(nodes[:, None], every[None, :]), dtype)
        to_next = ops.cast(ops.equal(nodes[:, None] + 1, every[None, :]), dtype)
        counts = (counts + ops.sum((count - share)[:, None] * to_node, axis=0)
                  + ops.sum(share[:, None] * to_next, axis=0))
        return at_least_m[:, :, -1], at_least_c[:, -1, :], counts

    empty = ops.zeros_like(s.order)
    first, _, counts = _node_loop(num_bins, group, nodes_of,
                                  (empty, empty, ops.zeros((num_bins,), dtype)), s.traced)
    below = ops.cast(s.num_positives[:, None] - first, dtype)  # v < 0: the first node
    below = ops.sum(ops.sum(ops.where(s.negative, below, zero), axis=1) * kept)
    counts = counts + ops.where(ops.equal(every, 0), below, zero)
    per_anchor = ops.cast(s.num_positives * s.num_negatives, dtype)
    return counts, ops.sum(per_anchor * kept)


def _sorted_terms(pairs: _AllPairs, cdf, min_val, num_bins) -> AnchorTerms:
    """Per anchor: ``sum_p d_ap U_ap - sum_n d_an V_an`` (module docstring), one sum of
    ``d`` times constant weights, its number of triplets and of triplets whose term is
    above 0."""
    dtype = dml.dtype_name(pairs.dist)
    cdf = ops.cast(ops.stop_gradient(cdf), dtype)
    width = ops.shape(pairs.dist)[1]
    width = width if isinstance(width, int) else None
    weight, nonzero = _map_rows(
        pairs, lambda chunk, fresh: _chunk_weights(chunk, cdf, min_val, num_bins),
        [("rows", (None, width), dtype), ("rows", (None,), dtype)])
    # The weights of an anchor sum to 0 (each triplet's +w and -w): measured from a centre,
    # the two sums that cancel are smaller, and so is their rounding error.
    magnitude = ops.abs(weight)
    center = dml.divide_no_nan(
        ops.sum(magnitude * ops.stop_gradient(pairs.dist), axis=1, keepdims=True),
        ops.sum(magnitude, axis=1, keepdims=True))
    total = ops.sum((pairs.dist - center) * ops.stop_gradient(weight), axis=1)
    count = ops.cast(pairs.num_positives * pairs.num_negatives, dtype)
    return AnchorTerms(total, count, nonzero)


def _chunk_weights(s: _Sorted, cdf, min_val, num_bins):
    """``(weight, nonzero)``: ``weight[a, r]`` is ``U[a, r]``, the summed weights of the
    triplets of anchor ``a`` and its positive ``r``, or ``-V[a, r]``, minus those of its
    negative ``r`` (``[t, R]``); ``nonzero``, per anchor, its triplets whose term is above
    0."""
    dtype = dml.dtype_name(s.dist)
    delta = _node_spacing(min_val, num_bins)
    t, width = ops.shape(s.dist)[0], ops.shape(s.dist)[1]
    group = _group_size(num_bins, t * width if isinstance(t, int) else None)
    rise = cdf - ops.concatenate([ops.zeros((1,), dtype), cdf[:-1]], axis=0)
    # Node 0 holds every triplet: each negative counts all positives, and the reverse.
    all_m = ops.where(s.negative, s.num_positives[:, None], 0)[:, :, None]
    all_c = ops.where(s.valid, s.num_negatives[:, None], 0)[:, None, :]

    def nodes_of(nodes, state):
        per_positive, per_negative = state
        at_least_m, at_least_c = _group_counts(s, nodes, min_val, delta)
        first = ops.equal(nodes, 0)
        at_least_m = ops.where(first[None, None, :], all_m, at_least_m)
        at_least_c = ops.where(first[None, :, None], all_c, at_least_c)
        step = ops.take(rise, nodes)
        return (per_positive + ops.sum(ops.cast(at_least_c, dtype) * step[:, None], axis=1),
                per_negative + ops.sum(ops.cast(at_least_m, dtype) * step, axis=2))

    start = ops.zeros_like(s.dist)
    per_positive, per_negative = _node_loop(num_bins, group, nodes_of, (start, start),
                                            s.traced)
    # The j-th positive of anchor a is reference row order[a, j]: U back in reference order.
    weight = dml.scatter_rows(ops.zeros_like(per_positive), s.order, per_positive) - per_negative
    return weight, _sorted_nonzero(s, cdf, min_val, delta)


def _sorted_nonzero(s: _Sorted, cdf, min_val, delta):
    """Per anchor, the triplets with ``CDF[low(x)] x > 0``: ``x > 0`` and a node at or above
    the first one where the CDF is above 0 (both suffixes of the sorted positives)."""
    num_bins = cdf.shape[0]
    first = ops.cast(ops.sum(ops.cast(cdf <= 0, "int32")), "int32")  # the CDF only grows
    d_an = ops.stop_gradient(s.dist)
    level = ops.cast(first, dml.dtype_name(d_an))

    def below(d_ap):
        x = d_ap - d_an
        weighted = ops.logical_or(first == 0, _grid_position(x, min_val, delta) >= level)
        return ops.logical_not(ops.logical_and(x > 0, weighted))

    start = _prefix_count(below, s.ordered, s.num_positives, ops.shape(d_an)[1], s.steps,
                          s.traced)
    count = ops.where(ops.logical_and(s.negative, first < num_bins),
                      s.num_positives[:, None] - start, 0)
    return ops.sum(ops.cast(count, dml.dtype_name(s.dist)), axis=1)


# -- both paths ------------------------------------------------------------------------------


def _batch_counts(prepared, keep, min_val, num_bins):
    """``(counts, total)`` of the batch histogram (no gradient), over the anchors ``keep``
    marks (all of them for None)."""
    if isinstance(prepared, _AllPairs):
        if keep is None:
            keep = ops.ones((ops.shape(prepared.dist)[0],), "bool")
        return _sorted_counts(prepared, keep, min_val, num_bins)
    mask = prepared.mask
    if keep is not None:
        mask = ops.logical_and(mask, keep[:, None, None])
    return _split_counts(prepared.x, mask, num_bins, min_val)


def _weighted_terms(prepared, cdf, min_val, num_bins) -> AnchorTerms:
    """Per anchor its triplets' ``CDF[low(x)] x`` (the CDF a constant of the gradient)."""
    if isinstance(prepared, _AllPairs):
        return _sorted_terms(prepared, cdf, min_val, num_bins)
    low, _ = bin_positions(ops.stop_gradient(prepared.x), min_val, num_bins)
    weight = ops.take(ops.stop_gradient(cdf), low)
    return triplet_terms(weight * prepared.x, prepared.mask)


def _dynamic_terms(inputs, histogram, ok, min_val, momentum, miner, num_bins):
    """``(terms, new_histogram)``: per anchor its triplets' ``w(x) x``, ``w`` the CDF of the
    updated histogram at the node below ``x`` (a constant of the gradient)."""
    dist, mined = _selection(inputs, miner)
    prepared = _prepared(dist, mined)
    counts, total = _batch_counts(prepared, None, min_val, num_bins)
    new = _mixed_histogram(histogram, counts, total, momentum, ok)
    cdf = ops.stop_gradient(dml.cumsum(new, axis=0))
    return _weighted_terms(prepared, cdf, min_val, num_bins), new


@contextlib.contextmanager
def _block_draws(miners, seeds, block):
    """Within it, the random ``miners`` draw block ``block``'s numbers from the step's
    ``seeds`` (the same in both passes over the blocks and in the recomputed backward)."""
    saved = [miner._seed_generator for miner in miners]
    try:
        for miner, seed in zip(miners, seeds, strict=True):
            miner._seed_generator = _BlockSeed(seed, block)
        yield
    finally:
        for miner, generator in zip(miners, saved, strict=True):
            miner._seed_generator = generator


def _dynamic_terms_in_blocks(inputs, histogram, ok, block_size, random_miners, min_val,
                             momentum, miner, num_bins):
    """:func:`_dynamic_terms` over blocks of ``block_size`` anchors, in two passes.

    The first sums the blocks' histogram counts (without gradient), which gives the
    updated histogram and its CDF; the second computes each block's terms with it, each
    block recomputed in the backward pass (:class:`tfdml.losses.blocks.RowBlocks`).
    """
    labels = ops.reshape(inputs.labels, (-1,))
    ref_labels = ops.reshape(inputs.ref_labels, (-1,))
    x, ref, offset = inputs.x, inputs.ref, inputs.ref_offset
    dtype = dml.dtype_name(x)
    blocks = RowBlocks(batch_rows(x), block_size)
    seeds = [m.seed_generator.next() for m in random_miners]  # once per step

    def block_of(i, x, ref):
        start = blocks.start(i)
        block = Inputs(blocks.rows(labels, i), blocks.rows(x, i), ref_labels, ref,
                       None if offset is None else offset + start)
        with _block_draws(random_miners, seeds, i):
            return _prepared(*_selection(block, miner))

    stopped_x, stopped_ref = ops.stop_gradient(x), ops.stop_gradient(ref)

    def counts_of(i):  # pass 1: rows a shifted last block repeats are counted once
        return _batch_counts(block_of(i, stopped_x, stopped_ref), blocks.fresh(i), min_val,
                             num_bins)

    counts, totals = dml.map_indices(counts_of, blocks.count, [((num_bins,), dtype), ((), dtype)])
    new = _mixed_histogram(histogram, ops.sum(counts, axis=0), ops.sum(totals), momentum, ok)
    cdf = ops.stop_gradient(dml.cumsum(new, axis=0))

    def terms_of(i, x, ref):  # pass 2
        terms = _weighted_terms(block_of(i, x, ref), cdf, min_val, num_bins)
        return tuple(ops.cast(t, dtype) for t in terms)

    def one(i):  # recomputed in the backward pass (RowBlocks.map, one block at a time)
        return keras.remat(lambda *args: terms_of(i, *args))(x, ref)

    size = blocks.size if isinstance(blocks.size, int) else None
    stacked = dml.map_indices(one, blocks.count, [((size,), dtype)] * len(AnchorTerms._fields))
    return AnchorTerms(*(blocks.assemble(s) for s in stacked)), new


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
            common=("average", "reduction", "name", "dtype", "block_size"))
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
        rows = inputs.x.shape[0]
        if self.block_size is None or (rows is not None and rows <= self.block_size):
            terms, new = _dynamic_terms(inputs, state.histogram, ok, **self.arguments)
        else:
            terms, new = _dynamic_terms_in_blocks(inputs, state.histogram, ok, self.block_size,
                                                  _random_miners(self), **self.arguments)
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

