"""Losses in row blocks: a block of anchors against the whole batch, rematerialized.

A tfdml loss computes per-anchor terms against a reference set
(``per_anchor(labels, x, ref_embeddings, ref_labels, ref_offset)``). The anchors
``[s, s + t)`` of a batch against the whole batch are exactly the call
``per_anchor(labels[s:s+t], x[s:s+t], x, labels, ref_offset=s)``, so a loss
with ``block_size=t`` loops over such calls and never holds more than a
``[t, B]`` slice of its pair matrices. Each block is wrapped in
``keras.remat``: the backward pass recomputes the block from its inputs
instead of keeping its intermediates, so peak memory is ``O(t B)`` (plus the
``[B, D]`` embeddings and their gradient) in the forward *and* the backward
pass.

The loop is a compiled loop on every backend (``tf.map_fn``, a while loop
under TensorFlow and XLA; ``lax.map``, a scan under JAX; a Python loop under
PyTorch), so the graph does not grow with the number of blocks. The last
block is shifted back to end at the last row (``start = min(i t, B - t)``),
so every block has the same shape; the rows it shares with the block before
are dropped when the blocks are put together, and get no gradient from it.

**Random miners** draw once per block: the step's seed is taken from the
miner's ``keras.random.SeedGenerator`` once (its state advances once per
step, as without blocks), and block ``i`` derives its own seeds from it. A
block draws from the same distribution as the dense loss, but not the same
numbers; the rematerialized backward pass replays the block's draws exactly.
"""

from __future__ import annotations

import contextlib

import keras
from keras import ops

from tfdml import ops as dml
from tfdml._embeddings import check_batch_sizes, check_embeddings, compute_dtype
from tfdml._shims import dtype_name, map_indices
from tfdml.losses.terms import AnchorTerms

__all__ = ["RowBlocks", "batch_rows", "block_draws", "blocked_terms"]

# Block i's seeds: the step's seed [s, c] moved to [s + _BLOCK_STRIDE (i + 1) + _DRAW_STRIDE k, c]
# for its k-th draw, away from the seeds [s, c'] of unblocked draws of the same generator.
_BLOCK_STRIDE = 1_000_003
_DRAW_STRIDE = 101


class _BlockSeed(keras.random.SeedGenerator):
    """The seeds of one block's draws, derived from a seed tensor, without a variable.

    ``keras.random`` draws from a ``SeedGenerator`` through its ``next()``;
    this one returns a fixed sequence computed from ``value`` (the step's seed)
    and the block index, so that recomputing the block (``keras.remat``) draws
    the same numbers. It owns no state, so it is not initialized as a
    ``SeedGenerator`` (that would create a variable).
    """

    def __init__(self, value, block):  # no super().__init__(): it would create a variable
        dtype = dtype_name(value)
        self._first = value[0] + ops.cast(block + 1, dtype) * ops.cast(_BLOCK_STRIDE, dtype)
        self._second = value[1]
        self._dtype = dtype
        self._draws = 0

    def next(self, ordered=True):
        first = self._first + ops.cast(_DRAW_STRIDE * self._draws, self._dtype)
        self._draws += 1
        return ops.stack([first, self._second])


@contextlib.contextmanager
def block_draws(miners, seeds, block):
    """Within it, the random ``miners`` draw block ``block``'s numbers from the step's ``seeds``.

    For a loss that runs its own passes over the blocks (the dynamic soft margin loss): the
    same numbers in every pass over a block and in its recomputed backward pass, as
    :func:`blocked_terms` draws them.

    Args:
        miners: the random miners (each with a ``seed_generator``).
        seeds: one seed per miner, taken once per step (``miner.seed_generator.next()``).
        block: the block's index.
    """
    with contextlib.ExitStack() as stack:
        for miner, seed in zip(miners, seeds, strict=True):
            stack.enter_context(miner.drawing_from(_BlockSeed(seed, block)))
        yield


class RowBlocks:
    """The row blocks of a batch of ``n`` rows, ``size`` rows each.

    Block ``i`` covers rows ``[start(i), start(i) + size)`` with ``start(i) =
    min(i size, n - size)``: the last block is shifted back to end at row
    ``n``, so that every block has the same shape. ``fresh(i)`` marks the rows
    no earlier block covered (all but the shared rows of the last block); sums
    over rows count only those, and :meth:`assemble` drops the others.

    Args:
        n: the number of rows, a Python int or (a TensorFlow graph with an
            unknown batch size) a scalar tensor.
        block_size: the number of rows per block; ``min(block_size, n)`` is used.
    """

    def __init__(self, n, block_size):
        self.n = n
        if isinstance(n, int):
            self.size = min(block_size, n)
            self.count = -(-n // self.size)
        else:  # an empty batch: no block (and blocks of no rows, for XLA's shapes)
            self.size = ops.minimum(block_size, n)
            rows = ops.maximum(self.size, 1)
            self.count = (n + rows - 1) // rows

    def start(self, i):
        """The first row of block ``i`` (int32)."""
        return ops.cast(ops.minimum(i * self.size, self.n - self.size), "int32")

    def fresh(self, i):
        """``[size]`` bool: the rows of block ``i`` that no earlier block covered."""
        rows = self.start(i) + ops.arange(self.size, dtype="int32")
        return rows >= ops.cast(i * self.size, "int32")

    def rows(self, x, i):
        """The rows of block ``i`` of ``x`` (``[n, ...]``)."""
        start = self.start(i)
        zero = ops.zeros((), "int32")
        shape = [self.size, *(d if d is not None else ops.shape(x)[k + 1]
                              for k, d in enumerate(x.shape[1:]))]
        return ops.slice(x, [start, *([zero] * (len(x.shape) - 1))], shape)

    def map(self, fn, args, signature):
        """``fn(i, *args)`` for every block, rematerialized, stacked along a new first axis.

        The loop is one the compiler keeps (``tf.map_fn``, ``lax.map``; a
        Python loop under PyTorch), and each block is wrapped in
        ``keras.remat``, so the backward pass recomputes it instead of keeping
        its intermediates. ``args`` are the tensors ``fn`` is differentiated
        by (everything else it may capture); ``signature`` lists the shape and
        dtype of each output, ``None`` standing for the block size.
        """

        def one(i):
            return keras.remat(lambda *a: tuple(fn(i, *a)))(*args)

        size = self.size if isinstance(self.size, int) else None
        return map_indices(one, self.count, [
            (tuple(size if d is None else d for d in shape), dtype) for shape, dtype in signature])

    def assemble(self, stacked):
        """The ``[n, ...]`` rows of ``[count, size, ...]`` per-block rows (shared rows once)."""
        tail = tuple(d if d is not None else ops.shape(stacked)[k + 2]
                     for k, d in enumerate(stacked.shape[2:]))
        flat = ops.reshape(stacked, (-1, *tail))
        head = (self.count - 1) * self.size
        overlap = self.count * self.size - self.n  # rows the last block repeats
        if isinstance(overlap, int) and overlap == 0:
            return flat
        return ops.concatenate([flat[:head], flat[head + overlap:]], axis=0)


def batch_rows(embeddings):
    """The number of rows of ``embeddings``: a Python int, or a tensor when unknown."""
    n = embeddings.shape[0]
    return n if n is not None else ops.shape(embeddings)[0]


def blocked_terms(per_anchor, labels, embeddings, block_size, ref_embeddings=None,
                  ref_labels=None, ref_offset=None, miners=(), variables=(), split=False):
    """``per_anchor`` over blocks of ``block_size`` anchors, each against the whole reference set.

    Args:
        per_anchor: a loss's ``per_anchor(labels, x, ref_embeddings, ref_labels,
            ref_offset)`` returning :class:`tfdml.losses.terms.AnchorTerms`.
        labels: ``[B]`` or ``[B, 1]`` class ids.
        embeddings: ``[B, D]``.
        block_size: anchors per block, a positive int. A batch of at most
            ``block_size`` is one block: the plain ``per_anchor`` call.
        ref_embeddings, ref_labels, ref_offset: the reference set, as for
            ``per_anchor``; `None` for the batch itself.
        miners: the random miners ``per_anchor`` uses (their seeds are
            derived per block; see the module docstring).
        variables: the trainable ``keras.Variable`` s that ``per_anchor``
            reads (a learned margin). They are read once, and their values
            are arguments of the rematerialized block (a
            ``keras.StatelessScope`` maps them), so that their gradient
            flows on every backend.
        split: ``per_anchor`` returns ``[B, 2]`` terms (positive and
            negative pairs apart, :func:`tfdml.losses.terms.split_pair_terms`).

    Returns:
        The :class:`tfdml.losses.terms.AnchorTerms` of the ``B`` anchors, in
        the compute dtype, equal to ``per_anchor`` on the whole batch (up to
        the summation order of the matrix products, and the draws of random
        miners).
    """
    labels = dml.cast_labels(labels, "y_true")
    y = check_embeddings(embeddings, "y_pred")
    check_batch_sizes(labels, y, "y_true", "y_pred")
    if y.shape[0] is not None and y.shape[0] <= block_size:
        return per_anchor(labels, y, ref_embeddings, ref_labels, ref_offset)
    labels = ops.reshape(labels, (-1,) if len(labels.shape) == 1 else (-1, labels.shape[-1]))
    if ref_embeddings is None:
        if ref_labels is not None:
            raise ValueError(
                "`ref_labels` was given without `ref_embeddings`. Pass both or neither.")
        ref, ref_lab, offset = y, labels, 0
    else:
        if ref_labels is None:
            raise ValueError(
                "`ref_embeddings` was given without `ref_labels`. Pass both or neither.")
        ref, ref_lab, offset = ref_embeddings, dml.cast_labels(ref_labels, "ref_labels"), ref_offset
        ref_lab = ops.reshape(ref_lab, (-1,))
    blocks = RowBlocks(batch_rows(y), block_size)
    seeds = [miner.seed_generator.next() for miner in miners]  # once per step
    dtype = compute_dtype(y.dtype)

    def one_block(i, y, ref, *values):
        start = blocks.start(i)
        block_offset = None if offset is None else offset + start
        scope = (keras.StatelessScope(list(zip(variables, values, strict=True))) if variables
                 else contextlib.nullcontext())
        with block_draws(miners, seeds, i), scope:
            terms = per_anchor(blocks.rows(labels, i), blocks.rows(y, i), ref, ref_lab,
                               block_offset)
        return tuple(ops.cast(t, dtype) for t in terms)

    # What a block is differentiated by (the embeddings, the learned variables' values)
    # are its arguments; the block index, labels and seeds are captured.
    args = (y, ref, *[v.value for v in variables])
    shape = (None, 2) if split else (None,)
    stacked = blocks.map(one_block, args, [(shape, dtype)] * len(AnchorTerms._fields))
    return AnchorTerms(*(blocks.assemble(s) for s in stacked))
