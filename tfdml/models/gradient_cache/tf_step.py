"""Gradient caching under TensorFlow: the chunks in ``tf.while_loop``s, under one tape each."""

from __future__ import annotations

import keras
from keras import ops

from tfdml.models.fit_checks import check_chunk_output
from tfdml.models.gradient_cache.common import GradientCacheBase, first_input, rows

__all__ = ["TFChunks", "TensorFlowGradientCache", "unscale_for_distribution"]


def unscale_for_distribution(value):
    """The loss of the global batch from a replica's share (``tf.distribute``)."""
    import tensorflow as tf

    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    if replicas > 1:
        value = value * ops.cast(replicas, value.dtype)
    return value


class TFChunks:
    """The rows of a batch (TensorFlow) in chunks: ``full`` chunks of ``size`` rows (the
    head, ``head_rows`` rows), then the rest (the tail, maybe empty)."""

    def __init__(self, x, size):
        import tensorflow as tf

        self.x, self.size = x, size
        self.batch = tf.shape(first_input(x))[0]
        self.full = self.batch // size
        self.head_rows = self.full * size
        self.tail_x = rows(x, lambda t: t[self.head_rows:])

    def rows(self, t, i):
        """The ``size`` rows of chunk ``i`` of ``t``."""
        import tensorflow as tf

        # A gather of `size` rows: a static shape, which XLA needs (even when the loop
        # never runs because the batch is smaller than a chunk).
        return tf.gather(t, i * self.size + tf.range(self.size))

    def inputs(self, i):
        """Chunk ``i`` of the (possibly nested) inputs."""
        return rows(self.x, lambda t: self.rows(t, i))

    def has_tail(self):
        return self.head_rows < self.batch


class TensorFlowGradientCache(GradientCacheBase):
    """:class:`tfdml.models.MetricModel`'s chunked training step under TensorFlow."""

    def chunked_train_step(self, data):
        """One step with the batch's rows embedded in chunks (``MetricModel(chunk_size=)``)."""
        import tensorflow as tf

        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        first = first_input(x)
        size = self.chunk_size
        if not self.trainable_weights or (first.shape[0] is not None
                                          and first.shape[0] <= size):
            return super().train_step(data)
        chunks = TFChunks(x, size)
        state = self.embedder.non_trainable_variables  # seeds, moving statistics
        snapshot = [tf.identity(v) for v in state]

        # 1. Embed the chunks without a tape.
        embeddings = self._tf_embed_chunks(chunks)

        # 2. The loss, its gradient w.r.t. the embeddings and the model's variables (the
        # loss's own, and the embedder's through weight regularization).
        variables = list(self.trainable_weights)
        with tf.GradientTape() as tape:
            tape.watch(embeddings)
            loss = self.compute_loss(x=x, y=y, y_pred=embeddings, sample_weight=sample_weight,
                                     training=True)
            tracker = self._loss_tracker_metric()
            if tracker is not None:
                tracker.update_state(unscale_for_distribution(loss),
                                     sample_weight=chunks.batch)
            if self.optimizer is not None:
                loss = self.optimizer.scale_loss(loss)
        grad_embeddings, *grads = tape.gradient(loss, [embeddings] + variables)
        if grad_embeddings is None:
            grad_embeddings = tf.zeros_like(embeddings)
        grad_embeddings = tf.convert_to_tensor(grad_embeddings)

        # 3. Again, chunk by chunk from the same state, back-propagating the chunk's slice.
        network = list(self.embedder.trainable_weights)
        if network:
            for v, value in zip(state, snapshot, strict=True):
                v.assign(value)
            sums = self._tf_embedder_gradients(chunks, grad_embeddings, network)
            position = {id(v): k for k, v in enumerate(network)}
            for k, v in enumerate(variables):
                if id(v) in position:
                    extra = sums[position[id(v)]]
                    grads[k] = extra if grads[k] is None else tf.convert_to_tensor(grads[k]) + extra

        # 4. One update, then the compiled metrics on the embeddings.
        self.optimizer.apply_gradients(zip(grads, variables, strict=True))
        return self.compute_metrics(x, y, embeddings, sample_weight=sample_weight)

    def _tf_embed_chunks(self, chunks):
        """The embeddings of every row, chunk by chunk, without a gradient."""
        import tensorflow as tf

        embedder = self.embedder

        def embed(inputs):
            embeddings = embedder(inputs, training=True)
            check_chunk_output(embeddings, first_input(inputs).shape[0], self.chunk_size)
            self._check_no_call_losses(embedder.losses, embedder)
            return embeddings

        size = chunks.size
        spec = embedder.compute_output_spec(
            rows(chunks.x, lambda t: keras.KerasTensor(
                (size,) + tuple(t.shape[1:]), dtype=keras.backend.standardize_dtype(t.dtype))))
        check_chunk_output(spec, size, self.chunk_size)
        parts = tf.TensorArray(spec.dtype, size=chunks.full,
                               element_shape=tf.TensorShape(spec.shape))

        def embed_chunk(i, parts):
            return i + 1, parts.write(i, embed(chunks.inputs(i)))

        _, parts = tf.while_loop(lambda i, _: i < chunks.full, embed_chunk,
                                 (tf.constant(0), parts), parallel_iterations=1)
        head = parts.concat()
        tail = tf.cond(chunks.has_tail(), lambda: embed(chunks.tail_x), lambda: head[:0])
        embeddings = tf.concat([head, tail], axis=0)
        # The batch's own row count: under XLA the loops' outputs have a dynamic first
        # dimension, which a loss in row blocks cannot count its blocks by.
        shape = [d if d is not None else tf.shape(embeddings)[k]
                 for k, d in enumerate(embeddings.shape)]
        return tf.stop_gradient(tf.reshape(embeddings, [chunks.batch, *shape[1:]]))

    def _tf_embedder_gradients(self, chunks, grad_embeddings, network):
        """The gradients of ``network`` (the embedder's trainable weights) summed over the
        chunks, each chunk back-propagating its slice of ``grad_embeddings``."""
        import tensorflow as tf

        embedder = self.embedder

        def backward(inputs, grad):
            with tf.GradientTape() as chunk_tape:
                out = embedder(inputs, training=True)
                surrogate = tf.reduce_sum(tf.cast(out, "float32") * tf.cast(grad, "float32"))
            chunk_grads = chunk_tape.gradient(
                surrogate, network, unconnected_gradients=tf.UnconnectedGradients.ZERO)
            return [tf.convert_to_tensor(g) for g in chunk_grads]

        def backward_chunk(i, sums):
            chunk_grads = backward(chunks.inputs(i), chunks.rows(grad_embeddings, i))
            return i + 1, [a + g for a, g in zip(sums, chunk_grads, strict=True)]

        sums = [tf.zeros(v.shape, v.dtype) for v in network]
        _, sums = tf.while_loop(lambda i, _: i < chunks.full, backward_chunk,
                                (tf.constant(0), sums), parallel_iterations=1)
        return tf.cond(
            chunks.has_tail(),
            lambda: [a + g for a, g in zip(
                sums, backward(chunks.tail_x, grad_embeddings[chunks.head_rows:]), strict=True)],
            lambda: [tf.identity(a) for a in sums])
