"""The dynamic soft margin loss's terms and histogram update, without the ``[B, P, N]``
tensor: the searches and counts of :mod:`tfdml.losses.dynamic_soft_margin` (its module
docstring describes them), dense and over blocks of anchors."""

from __future__ import annotations

from typing import Any, NamedTuple

import keras
from keras import ops

from tfdml import ops as dml
from tfdml._shims import dtype_name, is_traced, map_indices
from tfdml.losses.inputs import Inputs
from tfdml.losses.row_blocks import RowBlocks, batch_rows, block_draws
from tfdml.losses.terms import AnchorTerms, triplet_terms
from tfdml.miners import Pairs, TripletMiner, as_triplets, gather_triplet_scores

__all__ = ["bin_positions", "dynamic_terms", "dynamic_terms_in_blocks"]


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
    dtype = dtype_name(x)
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
    dtype = dtype_name(counts)
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
        return dist, Pairs(*miner.label_masks(labels, ref_labels, ref_offset))
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
    traced = is_traced(ops.stop_gradient(dist))
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
    ordered = ops.where(valid, ordered, ops.zeros((), dtype_name(stopped)))
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
    dtype = dtype_name(d_an)
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
    ``_GROUP_ENTRIES`` entries (:class:`tfdml.losses.row_blocks.RowBlocks`), or None for one."""
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
        stacked = map_indices(one, chunks.count, [spec[1:] for spec in outputs])
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
    dtype = dtype_name(pairs.dist)

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
    dtype = dtype_name(s.dist)
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
    dtype = dtype_name(pairs.dist)
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
    dtype = dtype_name(s.dist)
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
    level = ops.cast(first, dtype_name(d_an))

    def below(d_ap):
        x = d_ap - d_an
        weighted = ops.logical_or(first == 0, _grid_position(x, min_val, delta) >= level)
        return ops.logical_not(ops.logical_and(x > 0, weighted))

    start = _prefix_count(below, s.ordered, s.num_positives, ops.shape(d_an)[1], s.steps,
                          s.traced)
    count = ops.where(ops.logical_and(s.negative, first < num_bins),
                      s.num_positives[:, None] - start, 0)
    return ops.sum(ops.cast(count, dtype_name(s.dist)), axis=1)


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


def dynamic_terms(inputs, histogram, ok, min_val, momentum, miner, num_bins):
    """``(terms, new_histogram)``: per anchor its triplets' ``w(x) x``, ``w`` the CDF of the
    updated histogram at the node below ``x`` (a constant of the gradient)."""
    dist, mined = _selection(inputs, miner)
    prepared = _prepared(dist, mined)
    counts, total = _batch_counts(prepared, None, min_val, num_bins)
    new = _mixed_histogram(histogram, counts, total, momentum, ok)
    cdf = ops.stop_gradient(dml.cumsum(new, axis=0))
    return _weighted_terms(prepared, cdf, min_val, num_bins), new


def dynamic_terms_in_blocks(inputs, histogram, ok, block_size, random_miners, min_val,
                             momentum, miner, num_bins):
    """:func:`dynamic_terms` over blocks of ``block_size`` anchors, in two passes.

    The first sums the blocks' histogram counts (without gradient), which gives the
    updated histogram and its CDF; the second computes each block's terms with it, each
    block recomputed in the backward pass (:class:`tfdml.losses.row_blocks.RowBlocks`).
    """
    labels = ops.reshape(inputs.labels, (-1,))
    ref_labels = ops.reshape(inputs.ref_labels, (-1,))
    x, ref, offset = inputs.x, inputs.ref, inputs.ref_offset
    dtype = dtype_name(x)
    blocks = RowBlocks(batch_rows(x), block_size)
    seeds = [m.seed_generator.next() for m in random_miners]  # once per step

    def block_of(i, x, ref):
        start = blocks.start(i)
        block = Inputs(blocks.rows(labels, i), blocks.rows(x, i), ref_labels, ref,
                       None if offset is None else offset + start)
        with block_draws(random_miners, seeds, i):
            return _prepared(*_selection(block, miner))

    stopped_x, stopped_ref = ops.stop_gradient(x), ops.stop_gradient(ref)

    def counts_of(i):  # pass 1: rows a shifted last block repeats are counted once
        return _batch_counts(block_of(i, stopped_x, stopped_ref), blocks.fresh(i), min_val,
                             num_bins)

    counts, totals = map_indices(counts_of, blocks.count, [((num_bins,), dtype), ((), dtype)])
    new = _mixed_histogram(histogram, ops.sum(counts, axis=0), ops.sum(totals), momentum, ok)
    cdf = ops.stop_gradient(dml.cumsum(new, axis=0))

    def terms_of(i, x, ref):  # pass 2
        terms = _weighted_terms(block_of(i, x, ref), cdf, min_val, num_bins)
        return tuple(ops.cast(t, dtype) for t in terms)

    def one(i):  # recomputed in the backward pass (RowBlocks.map, one block at a time)
        return keras.remat(lambda *args: terms_of(i, *args))(x, ref)

    size = blocks.size if isinstance(blocks.size, int) else None
    stacked = map_indices(one, blocks.count, [((size,), dtype)] * len(AnchorTerms._fields))
    return AnchorTerms(*(blocks.assemble(s) for s in stacked)), new
