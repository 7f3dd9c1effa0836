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

import numbers

import keras
from keras import ops as kops

from tfdml import ops

__all__ = ["blocked_terms", "check_block_size"]

# Block i's seeds: the step's seed [s, c] moved to [s + _BLOCK_STRIDE (i + 1) + _DRAW_STRIDE k, c]
# for its k-th draw, away from the seeds [s, c'] of unblocked draws of the same generator.
_BLOCK_STRIDE = 1_000_003
_DRAW_STRIDE = 101


def check_block_size(value, name="block_size"):
    """``None``, or ``value`` as a positive Python int; a ValueError naming ``name`` otherwise."""
    if value is None:
        return None
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
        raise ValueError(f"`{name}` must be a positive integer or None. Received: {name}={value!r}")
    return int(value)


class _BlockSeed(keras.random.SeedGenerator):
    """The seeds of one block's draws, derived from a seed tensor, without a variable.

    ``keras.random`` draws from a ``SeedGenerator`` through its ``next()``;
    this one returns a fixed sequence computed from ``value`` (the step's seed)
    and the block index, so that recomputing the block (``keras.remat``) draws
    the same numbers. It owns no state, so it is not initialized as a
    ``SeedGenerator`` (that would create a variable).
    """

    def __init__(self, value, block):  # noqa: super().__init__ would create a variable
        dtype = ops.dtype_name(value)
        self._first = value[0] + kops.cast(block + 1, dtype) * kops.cast(_BLOCK_STRIDE, dtype)
        self._second = value[1]
        self._dtype = dtype
        self._draws = 0

    def next(self, ordered=True):
        first = self._first + kops.cast(_DRAW_STRIDE * self._draws, self._dtype)
        self._draws += 1
        return kops.stack([first, self._second])


def _random_miners(loss):
    """The miners of ``loss`` (wrapped losses too) that draw with a seed generator."""
    found, seen = [], set()
    while loss is not None:
        miner = getattr(loss, "miner", None)
        if miner is not None and getattr(miner, "seed_generator", None) is not None:
            if id(miner) not in seen:
                seen.add(id(miner))
                found.append(miner)
        loss = getattr(loss, "loss", None)
    return found


def _map(fn, num_blocks, block, dtype, outputs):
    """``[fn(i) for i in range(num_blocks)]``, each a tuple of ``outputs`` ``[block]`` tensors,
    stacked along a new first axis, as a loop that the compiler keeps (differentiable)."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        length = block if isinstance(block, int) else None
        signature = tuple(tf.TensorSpec([length], dtype) for _ in range(outputs))
        return tf.map_fn(fn, tf.range(num_blocks), fn_output_signature=signature)
    if backend == "jax":
        import jax

        return jax.lax.map(fn, kops.arange(num_blocks, dtype="int32"))
    results = [fn(kops.convert_to_tensor(i, "int32")) for i in range(num_blocks)]
    return tuple(kops.stack(parts) for parts in zip(*results, strict=True))


def _assemble(stacked, n, block, num_blocks):
    """The ``[n]`` rows from ``[num_blocks, block]`` blocks whose last one ends at row ``n``."""
    flat = kops.reshape(stacked, (-1,))
    head = (num_blocks - 1) * block
    overlap = num_blocks * block - n  # rows the last block repeats
    if isinstance(overlap, int) and overlap == 0:
        return flat
    return kops.concatenate([flat[:head], flat[head + overlap:]], axis=0)


def blocked_terms(per_anchor, labels, embeddings, block_size, ref_embeddings=None,
                  ref_labels=None, ref_offset=None, miners=(), variables=()):
    """``per_anchor`` over blocks of ``block_size`` anchors, each against the whole reference set.

    Args:
        per_anchor: a loss's ``per_anchor(labels, x, ref_embeddings, ref_labels,
            ref_offset)`` returning :class:`tfdml.losses.base.AnchorTerms`.
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

    Returns:
        The :class:`tfdml.losses.base.AnchorTerms` of the ``B`` anchors, in
        the compute dtype, equal to ``per_anchor`` on the whole batch (up to
        the summation order of the matrix products, and the draws of random
        miners).
    """
    from tfdml.losses.base import AnchorTerms

    labels = ops.cast_labels(labels, "y_true")
    y = ops.check_embeddings(embeddings, "y_pred")
    ops.check_batch_sizes(labels, y, "y_true", "y_pred")
    static_n = y.shape[0]
    if static_n is not None and static_n <= block_size:
        return per_anchor(labels, y, ref_embeddings, ref_labels, ref_offset)
    labels = kops.reshape(labels, (-1,))
    if ref_embeddings is None:
        if ref_labels is not None:
            raise ValueError(
                "`ref_labels` was given without `ref_embeddings`. Pass both or neither.")
        ref, ref_lab, offset = y, labels, 0
    else:
        if ref_labels is None:
            raise ValueError(
                "`ref_embeddings` was given without `ref_labels`. Pass both or neither.")
        ref, ref_lab, offset = ref_embeddings, ops.cast_labels(ref_labels, "ref_labels"), ref_offset
        ref_lab = kops.reshape(ref_lab, (-1,))
    if static_n is not None:
        n, block = static_n, block_size
        num_blocks = -(-n // block)
    else:  # a TensorFlow graph with an unknown batch size
        n = kops.shape(y)[0]
        block = kops.minimum(block_size, n)
        num_blocks = (n + block - 1) // block
    dim = y.shape[1] if y.shape[1] is not None else kops.shape(y)[1]
    seeds = [miner.seed_generator.next() for miner in miners]  # once per step
    dtype = ops.compute_dtype(y.dtype)

    def one_block(i, y, ref, values):
        start = kops.cast(kops.minimum(i * block, n - block), "int32")
        x_block = kops.slice(y, [start, kops.zeros((), "int32")], [block, dim])
        labels_block = kops.slice(labels, [start], [block])
        block_offset = None if offset is None else offset + start
        saved = [miner._seed_generator for miner in miners]
        try:
            for miner, seed in zip(miners, seeds, strict=True):
                miner._seed_generator = _BlockSeed(seed, i)
            if variables:
                with keras.StatelessScope(list(zip(variables, values, strict=True))):
                    terms = per_anchor(labels_block, x_block, ref, ref_lab, block_offset)
            else:
                terms = per_anchor(labels_block, x_block, ref, ref_lab, block_offset)
        finally:
            for miner, generator in zip(miners, saved, strict=True):
                miner._seed_generator = generator
        return tuple(kops.cast(t, dtype) for t in terms)

    values = [v.value for v in variables]

    def run(i):
        # Only what the block is differentiated by (the embeddings and the learned
        # variables' values) are arguments of the rematerialized function; the block
        # index, labels and seeds are captured.
        return keras.remat(lambda y, ref, *values: one_block(i, y, ref, values))(
            y, ref, *values)

    stacked = _map(run, num_blocks, block, dtype, len(AnchorTerms._fields))
    return AnchorTerms(*(_assemble(s, n, block, num_blocks) for s in stacked))
