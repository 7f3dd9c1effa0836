"""The network in chunks (gradient caching): the per-backend pieces of
:class:`tfdml.models.MetricModel`'s chunked training step."""

from __future__ import annotations

import weakref

import keras
from keras import ops


def _first_input(x):
    """The first array of the (possibly nested) inputs: its rows are the batch."""
    return next(t for t in keras.tree.flatten(x) if t is not None)


def _rows(x, fn):
    """``fn`` applied to every array of the (possibly nested) inputs."""
    return keras.tree.map_structure(lambda t: None if t is None else fn(t), x)


# The parts of a chunked step of a MetricModel stepping eagerly under JAX, each compiled once
# (see `_jax_compiled_loop`): per model, by name.
_JAX_STEP_FUNCTIONS = weakref.WeakKeyDictionary()


def _jax_eager(*trees) -> bool:
    """The step runs outside ``jax.jit`` (``jit_compile=False``): no tracer among the arrays."""
    import jax

    return not any(isinstance(t, jax.core.Tracer) for t in jax.tree.leaves(trees))


def _jax_compiled_call(model, name, fn, *args):
    """``fn(*args)``; outside ``jax.jit``, compiled once per model (and per shape)."""
    if not _jax_eager(*args):
        return fn(*args)
    import jax

    functions = _JAX_STEP_FUNCTIONS.setdefault(model, {})
    if name not in functions:
        functions[name] = jax.jit(fn)
    return functions[name](*args)


def _jax_compiled_loop(model, name, fn, trainable, carry, xs):
    """``carry`` through ``fn(trainable, carry, x)`` for each chunk ``x`` of ``xs`` (a
    leading chunk axis), stacking what it returns beside the carry: ``(carry, stacked)``.

    Inside the compiled step, a ``lax.scan``: memory for one chunk's activations. Called
    eagerly (``jit_compile=False``), a Python loop over ``fn`` compiled once: XLA on the
    CPU runs the convolutions of a loop body many times slower than the same convolutions
    outside one, and each compiled call still frees its chunk's activations when it returns.
    """
    import jax

    if not _jax_eager(trainable, carry, xs):
        return jax.lax.scan(lambda c, x: fn(trainable, c, x), carry, xs)
    count = jax.tree.leaves(xs)[0].shape[0]
    outputs = []
    for i in range(count):
        carry, out = _jax_compiled_call(model, name, fn, trainable, carry,
                                     jax.tree.map(lambda t, i=i: t[i], xs))
        outputs.append(out)
    stacked = None if outputs[0] is None else jax.tree.map(
        lambda *parts: ops.stack(parts), *outputs)
    return carry, stacked


class _TFChunks:
    """The rows of a batch (TensorFlow) in chunks: ``full`` chunks of ``size`` rows (the
    head, ``head_rows`` rows), then the rest (the tail, maybe empty)."""

    def __init__(self, x, size):
        import tensorflow as tf

        self.x, self.size = x, size
        self.batch = tf.shape(_first_input(x))[0]
        self.full = self.batch // size
        self.head_rows = self.full * size
        self.tail_x = _rows(x, lambda t: t[self.head_rows:])

    def rows(self, t, i):
        """The ``size`` rows of chunk ``i`` of ``t``."""
        import tensorflow as tf

        # A gather of `size` rows: a static shape, which XLA needs (even when the loop
        # never runs because the batch is smaller than a chunk).
        return tf.gather(t, i * self.size + tf.range(self.size))

    def inputs(self, i):
        """Chunk ``i`` of the (possibly nested) inputs."""
        return _rows(self.x, lambda t: self.rows(t, i))

    def has_tail(self):
        return self.head_rows < self.batch
