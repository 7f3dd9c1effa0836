"""Gradient caching under JAX: the chunks in ``lax.scan``s inside the compiled step, or in
Python loops over functions compiled once when the step runs eagerly."""

from __future__ import annotations

import weakref

import keras
from keras import ops

from tfdml.models.fit_checks import check_chunk_output
from tfdml.models.gradient_cache.common import GradientCacheBase, first_input, rows

__all__ = ["JaxGradientCache", "jax_compiled_call", "jax_compiled_loop"]


# The parts of a chunked step of a MetricModel stepping eagerly under JAX, each compiled once
# (see `jax_compiled_loop`): per model, by name.
_JAX_STEP_FUNCTIONS = weakref.WeakKeyDictionary()


def _jax_eager(*trees) -> bool:
    """The step runs outside ``jax.jit`` (``jit_compile=False``): no tracer among the arrays."""
    import jax

    return not any(isinstance(t, jax.core.Tracer) for t in jax.tree.leaves(trees))


def jax_compiled_call(model, name, fn, *args):
    """``fn(*args)``; outside ``jax.jit``, compiled once per model (and per shape)."""
    if not _jax_eager(*args):
        return fn(*args)
    import jax

    functions = _JAX_STEP_FUNCTIONS.setdefault(model, {})
    if name not in functions:
        functions[name] = jax.jit(fn)
    return functions[name](*args)


def jax_compiled_loop(model, name, fn, trainable, carry, xs):
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
        carry, out = jax_compiled_call(model, name, fn, trainable, carry,
                                     jax.tree.map(lambda t, i=i: t[i], xs))
        outputs.append(out)
    stacked = None if outputs[0] is None else jax.tree.map(
        lambda *parts: ops.stack(parts), *outputs)
    return carry, stacked


class JaxGradientCache(GradientCacheBase):
    """:class:`tfdml.models.MetricModel`'s chunked training step under JAX."""

    def chunked_train_step(self, state, data):
        """One stateless step with the batch's rows embedded in chunks (``chunk_size``)."""
        import jax

        trainable, non_trainable, optimizer_variables, metrics_variables = state
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        batch = first_input(x).shape[0]
        size = self.chunk_size
        if batch <= size or not self.trainable_variables:
            return super().train_step(state, data)
        full, rest = divmod(batch, size)
        head_rows = full * size
        head_x = rows(x, lambda t: t[:head_rows].reshape((full, size) + tuple(t.shape[1:])))
        tail_x = rows(x, lambda t: t[head_rows:]) if rest else None

        # 1. Embed the chunks (a forward pass: nothing kept for a gradient).
        before = non_trainable
        non_trainable, embeddings = self._jax_embed_chunks(trainable, non_trainable,
                                                           head_x, tail_x)

        # 2. The loss and its gradient w.r.t. the variables and the embeddings.
        def loss_and_gradients(trainable, embeddings, non_trainable, metrics_variables,
                               optimizer_variables, y, sample_weight):
            def loss_fn(trainable, embeddings):
                loss, (_, new_non_trainable, new_metrics) = self.stateless_compute_loss(
                    trainable, non_trainable, metrics_variables, x=None, y=y,
                    y_pred=embeddings, sample_weight=sample_weight, training=True)
                unscaled = loss
                if self.optimizer is not None:
                    mapping = list(zip(self.optimizer.variables, optimizer_variables,
                                       strict=True))
                    with keras.StatelessScope(state_mapping=mapping):
                        loss = self.optimizer.scale_loss(loss)
                return loss, (unscaled, new_non_trainable, new_metrics)

            return jax.value_and_grad(loss_fn, argnums=(0, 1), has_aux=True)(trainable,
                                                                           embeddings)

        (_, (unscaled, non_trainable, metrics_variables)), (grads, grad_embeddings) = (
            jax_compiled_call(self, "loss", loss_and_gradients, trainable, embeddings,
                            non_trainable, metrics_variables, optimizer_variables, y,
                            sample_weight))

        # 3. The embedder's state back to `before`; each chunk's gradient separately.
        non_trainable = [old if owned else new for old, new, owned in zip(
            before, non_trainable, self._embedder_state_mask(), strict=True)]
        grads, non_trainable = self._jax_embedder_gradients(
            trainable, non_trainable, grads, head_x, tail_x, grad_embeddings)

        # 4. One update, then the loss tracker and the compiled metrics.
        trainable, optimizer_variables = self.optimizer.stateless_apply(
            optimizer_variables, grads, trainable)
        mapping = list(zip(self.metrics_variables, metrics_variables, strict=True))
        with keras.StatelessScope(state_mapping=mapping) as scope:
            tracker = self._loss_tracker_metric()
            if tracker is not None:
                tracker.update_state(unscaled, sample_weight=batch)
            logs = self.compute_metrics(x, y, embeddings, sample_weight)
        metrics_variables = [
            value if (new := scope.get_current_value(v)) is None else new
            for v, value in zip(self.metrics_variables, metrics_variables, strict=True)]
        return logs, (trainable, non_trainable, optimizer_variables, metrics_variables)

    def _jax_embed_chunks(self, trainable, non_trainable, head_x, tail_x):
        """``(non_trainable, embeddings)``: every row embedded, the ``[full, size, ...]``
        chunks of ``head_x`` in a scan, then ``tail_x`` (None: no rows left)."""
        def embed(trainable, non_trainable, inputs):
            out, non_trainable, losses = self.stateless_call(
                trainable, non_trainable, inputs, training=True, return_losses=True)
            check_chunk_output(out, first_input(inputs).shape[0], self.chunk_size)
            self._check_no_call_losses(losses, self)
            return non_trainable, out

        non_trainable, head = jax_compiled_loop(self, "embed", embed, trainable, non_trainable,
                                              head_x)
        embeddings = head.reshape((head.shape[0] * head.shape[1],) + tuple(head.shape[2:]))
        if tail_x is not None:
            non_trainable, tail = jax_compiled_call(self, "embed", embed, trainable,
                                                  non_trainable, tail_x)
            embeddings = ops.concatenate([embeddings, tail], axis=0)
        return non_trainable, embeddings

    def _jax_embedder_gradients(self, trainable, non_trainable, grads, head_x, tail_x,
                                grad_embeddings):
        """``(grads, non_trainable)``: ``grads`` plus the gradients of every chunk
        back-propagating its slice of ``grad_embeddings`` (chunks as in
        :meth:`_jax_embed_chunks`)."""
        import jax

        def chunk_grads(trainable, non_trainable, inputs, grad):
            def surrogate(trainable):
                out, new_non_trainable = self.stateless_call(
                    trainable, non_trainable, inputs, training=True)
                value = ops.sum(ops.cast(out, "float32")
                                 * jax.lax.stop_gradient(ops.cast(grad, "float32")))
                return value, new_non_trainable

            return jax.grad(surrogate, has_aux=True)(trainable)

        def backward_chunk(trainable, carry, chunk):
            sums, non_trainable = carry
            grads, non_trainable = chunk_grads(trainable, non_trainable, *chunk)
            return (jax.tree.map(ops.add, sums, grads), non_trainable), None

        full, size = first_input(head_x).shape[:2]
        head_rows = full * size
        head_grad = grad_embeddings[:head_rows].reshape(
            (full, size) + tuple(grad_embeddings.shape[1:]))
        grads, non_trainable = jax_compiled_loop(self, "backward", backward_chunk, trainable,
                                               (grads, non_trainable), (head_x, head_grad))[0]
        if tail_x is not None:
            tail_grads, non_trainable = jax_compiled_call(
                self, "grads", chunk_grads, trainable, non_trainable, tail_x,
                grad_embeddings[head_rows:])
            grads = jax.tree.map(ops.add, grads, tail_grads)
        return grads, non_trainable
