"""The model that trains an embedding model with a tfdml loss and owns the loss's state."""

from __future__ import annotations

import inspect

import keras
from keras import ops

from tfdml._argument_checks import check_int
from tfdml._endless import check_steps, fit_shuffle
from tfdml._shims import dtype_name
from tfdml.losses.base import MetricLoss, resolve_loss
from tfdml.losses.ownership import claim_loss
from tfdml.models.fit_checks import (
    check_labels,
    check_one_output,
    output_dim,
    warn_batches_without_positives,
)
from tfdml.models.gradient_cache import GradientCache
from tfdml.models.saving import StateSaving

__all__ = ["MetricModel", "is_stateful_loss", "plus_model_losses", "unwrap"]


@keras.saving.register_keras_serializable(package="tfdml")
class MetricModel(GradientCache, StateSaving, keras.Model):
    """An embedding model trained with a tfdml loss, owning the loss's state.

    Some losses have state: the proxies and class weights of the proxy and
    classification losses (:class:`tfdml.losses.ProxyAnchorLoss`,
    :class:`tfdml.losses.ArcFaceLoss`...), :class:`tfdml.losses.MarginLoss`'s
    learned beta, the bank of :class:`tfdml.losses.CrossBatchMemory` and the
    seed of a random miner. Keras trains, saves and (under JAX's stateless
    training) updates the variables of the model only; a loss is not part of
    the model. ``MetricModel`` is: it wraps the embedding model and tracks the
    loss's :class:`tfdml.losses.LossState` layer, so that

    * ``model.trainable_variables`` include the learned variables, and the
      optimizer trains them with the network;
    * the buffers and seeds advance at every step, under TensorFlow, JAX and
      PyTorch alike;
    * ``model.save`` (``.keras``), ``save_weights`` and
      ``keras.callbacks.BackupAndRestore`` / ``ModelCheckpoint`` keep them,
      with the optimizer's slots for the learned ones, so that training
      resumes where it stopped.

    Calling the model gives the embeddings of the wrapped model, so
    ``predict``, retrieval metrics and callbacks see the embedding model.
    ``compile`` takes no ``loss``: the model computes its loss with the one
    it wraps (``training=False`` in ``evaluate``, where a memory bank is left
    unchanged), plus the wrapped model's regularization losses. Compile
    metrics work as usual. The wrapped model is ``model.embedder``; export or
    reuse that one (it has no loss state), and load weights saved from a
    plain embedding model with ``model.embedder.load_weights``.

    Losses without state train the same way (nothing is added); a loss with
    state belongs to one ``MetricModel``.

    ``fit`` and ``evaluate`` check labels given as arrays (``y``, and those of
    ``validation_data``) before Keras converts them: string labels, float
    labels that are not whole numbers and, under JAX without 64-bit mode, ids
    beyond int32 (which Keras would hold in 32 bits, merging distinct ids)
    raise a ValueError naming the labels. Labels inside a dataset reach the
    loss, which checks what it can see.

    Args:
        embedder: the embedding model (``[inputs] -> [B, D]`` embeddings), a
            functional, sequential or subclassed ``keras.Model`` (or layer).
        loss: a tfdml loss (:class:`tfdml.losses.MetricLoss`) or its
            serialized config.
        embedding_dim: the size ``D`` of the embeddings, when it cannot be
            read from ``embedder.output_shape`` (an unbuilt subclassed model)
            and the loss's variables need it. Defaults to `None`.
        chunk_size: train with *gradient caching* (Gao et al., "Scaling Deep
            Contrastive Learning Batch Size under Memory Limited Setup",
            2021): each step embeds the batch ``chunk_size`` rows at a time
            without keeping activations, computes the loss and its gradient
            ``g = dL/de`` on the whole ``[B, D]`` batch, then runs each chunk
            ``c`` again and back-propagates its slice of ``g``: ``dL/dtheta =
            sum_c d(sum(e_c * g_c))/dtheta``, the unchunked step's gradient for
            an embedder that treats rows independently, with the activations
            of one chunk in memory and one optimizer update. Random layers
            draw the same values in both passes and the loss runs once;
            ``BatchNormalization`` computes its statistics per chunk; losses
            added during the embedder's call (activity regularizers,
            ``add_loss``) raise a ``ValueError``. Its cost, and
            ``jit_compile=False`` on the CPU: docs/losses.md, "The network in
            chunks". `None` trains the whole batch at once. Defaults to
            `None`.
        **kwargs: ``name``, ``trainable``... for ``keras.Model``.

    Examples:

    >>> embedder = tfdml.models.build_embedding_model("resnet50", embedding_dim=512)
    >>> loss = tfdml.losses.ProxyAnchorLoss(num_classes=100)
    >>> model = tfdml.models.MetricModel(embedder, loss)
    >>> model.compile(optimizer="adam")          # no loss= here
    >>> model.fit(train_ds, epochs=10)           # trains the network and the proxies
    >>> embeddings = model.predict(images)       # = embedder.predict(images)
    >>> model.save("run.keras")                  # proxies and optimizer slots included

    A batch of 4096 images whose activations only fit 256 at a time:

    >>> loss = tfdml.losses.SupConLoss()
    >>> model = tfdml.models.MetricModel(embedder, loss, chunk_size=256)
    >>> model.compile(optimizer="adam")
    >>> model.fit(train_ds.batch(4096), epochs=10)  # the loss sees all 4096 rows
    """

    def __init__(self, embedder, loss, embedding_dim=None, chunk_size=None, **kwargs):
        chunk_size = check_int("chunk_size", chunk_size, allow_none=True)
        super().__init__(**kwargs)
        if not isinstance(embedder, keras.layers.Layer):
            raise ValueError(
                f"`embedder` must be a keras.Model or layer. Received: embedder={embedder!r}")
        if embedding_dim is not None and (not isinstance(embedding_dim, int)
                                          or isinstance(embedding_dim, bool)
                                          or embedding_dim < 1):
            raise ValueError("`embedding_dim` must be an integer >= 1 or None. "
                             f"Received: embedding_dim={embedding_dim!r}")
        self.embedder = embedder
        self.metric_loss = resolve_loss(loss)
        self.embedding_dim = embedding_dim
        self.chunk_size = chunk_size
        claim_loss(self.metric_loss, self)
        state = self.metric_loss.state
        if state is not None:
            dim = embedding_dim if embedding_dim is not None else output_dim(embedder)
            if dim is not None or not state.needs_embedding_dim:
                self.metric_loss.build_state(dim)
        self.loss_state = state  # tracked: its variables are the model's
        if getattr(embedder, "built", False) and (state is None or state.built):
            self.built = True

    def build(self, input_shape):
        dim = self.embedding_dim
        if not self.embedder.built:  # a symbolic call builds a subclassed model's layers
            output = self.embedder(keras.KerasTensor(input_shape))
            dim = output.shape[-1] if dim is None else dim
        state = self.loss_state
        if state is not None and not state.built:
            if dim is None:
                dim = self.embedder.compute_output_shape(input_shape)[-1]
            self.metric_loss.build_state(dim)
        self.built = True

    def call(self, inputs, training=None):
        return self.embedder(inputs, training=training)

    def compute_output_shape(self, input_shape):
        return self.embedder.compute_output_shape(input_shape)

    def fit(self, x=None, y=None, *args, **kwargs):
        """``keras.Model.fit``, with the inputs checked first (class docstring).

        Raises:
            ValueError: for string labels, float labels that are not whole
                numbers, class ids outside ``[0, num_classes)`` of a loss with
                class vectors, (JAX without 64-bit mode) ids beyond int32, or
                an endless dataset (``x`` or ``validation_data``) without
                ``steps_per_epoch`` (``validation_steps``), which Keras would
                iterate forever.

        Warns:
            UserWarning: once per ``fit``, when labels given as arrays make
                batches with no two samples of a class (all of them with
                ``shuffle=False``, half or more of one shuffle otherwise) for a
                loss that mines pairs or triplets: the loss is 0 on such a batch.
                A loss run eagerly also warns on the first such batch it sees;
                for a compiled step on a dataset, add
                :class:`tfdml.metrics.ActiveAnchors` and
                :class:`tfdml.callbacks.ActiveAnchorsWarning`.
        """
        bound = inspect.signature(keras.Model.fit).bind(self, x, y, *args, **kwargs)
        given = bound.arguments
        check_labels(self.metric_loss, y, "y")
        warn_batches_without_positives(self, y, given.get("batch_size"),
                                             given.get("shuffle", True))
        validation = given.get("validation_data")
        if isinstance(validation, (list, tuple)) and len(validation) >= 2:
            check_labels(self.metric_loss, validation[1], "validation_data[1]")
        check_steps(x, given.get("steps_per_epoch"))
        check_steps(validation, given.get("validation_steps"), "validation_steps")
        # Keras warns at every fit on an endless PyDataset that it cannot shuffle it.
        given["shuffle"] = fit_shuffle(x, given.get("shuffle", True))
        return super().fit(*bound.args[1:], **bound.kwargs)

    def evaluate(self, x=None, y=None, *args, **kwargs):
        """``keras.Model.evaluate``, with the inputs checked first (see :meth:`fit`)."""
        bound = inspect.signature(keras.Model.evaluate).bind(self, x, y, *args, **kwargs)
        check_labels(self.metric_loss, y, "y")
        check_steps(x, bound.arguments.get("steps"), "steps")
        return super().evaluate(*bound.args[1:], **bound.kwargs)

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        """The wrapped loss on ``(y, y_pred)``, plus the model's regularization losses."""
        if self.loss is not None:
            raise ValueError(
                f"MetricModel {self.name!r} trains with the loss it wraps "
                f"({self.metric_loss.name!r}); compile it without `loss=`. "
                f"Received: loss={self.loss!r}"
            )
        if y is None:
            raise ValueError("MetricModel needs labels: fit it on (inputs, labels) batches.")
        check_one_output(y_pred)
        return plus_model_losses(self.metric_loss(y, y_pred, sample_weight, training=training),
                                 self.losses)

    def train_step(self, *args):
        """The stock training step, or gradient caching with ``chunk_size`` (class docstring).

        Under JAX the arguments are ``(state, data)``, elsewhere ``(data)``; the chunked
        step is the backend's own (:mod:`tfdml.models.gradient_cache`).
        """
        if self.chunk_size is None:
            return super().train_step(*args)
        return self.chunked_train_step(*args)

    def get_config(self):
        config = super().get_config()
        config.update(
            embedder=keras.saving.serialize_keras_object(self.embedder),
            loss=keras.saving.serialize_keras_object(self.metric_loss),
            embedding_dim=self.embedding_dim,
            chunk_size=self.chunk_size,
        )
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        embedder = keras.saving.deserialize_keras_object(config.pop("embedder"))
        loss = keras.saving.deserialize_keras_object(config.pop("loss"))
        return cls(embedder, loss, **config)


def plus_model_losses(value, losses, scale=1.0):
    """``value + scale * (sum(losses[0]) + sum(losses[1]) + ...)``: a loss value plus a
    model's own losses (``model.losses``: regularizers, ``add_loss``), each cast to the
    dtype of ``value``. The one place training code adds them (``MetricModel``, the
    examples' training loop's distributed step, the scatter diagram's gradients)."""
    if not losses:
        return value
    dtype = dtype_name(value)
    total = ops.cast(ops.sum(losses[0]), dtype)
    for extra in losses[1:]:
        total = total + ops.cast(ops.sum(extra), dtype)
    return value + (total if scale == 1.0 else total * scale)


def unwrap(model):
    """The embedding model of a :class:`MetricModel`; any other model unchanged."""
    return model.embedder if isinstance(model, MetricModel) else model


def is_stateful_loss(loss) -> bool:
    """The loss has state that a :class:`MetricModel` must own."""
    return isinstance(loss, MetricLoss) and loss.state is not None
