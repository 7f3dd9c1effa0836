"""The model that trains an embedding model with a tfdml loss and owns the loss's state.

Exported as :class:`tfdml.models.MetricModel`.
"""

from __future__ import annotations

import keras
from keras import ops as kops

from tfdml.losses.base import MetricLoss, resolve_loss

__all__ = ["MetricModel"]


def _output_dim(model):
    """The embedding size of a built model, or None."""
    try:
        shape = model.output_shape
    except (AttributeError, ValueError):
        return None
    if isinstance(shape, (list, tuple)) and shape and isinstance(shape[0], (list, tuple)):
        return None  # several outputs
    return None if not shape else shape[-1]


@keras.saving.register_keras_serializable(package="tfdml")
class MetricModel(keras.Model):
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

    Args:
        embedder: the embedding model (``[inputs] -> [B, D]`` embeddings), a
            functional, sequential or subclassed ``keras.Model`` (or layer).
        loss: a tfdml loss (:class:`tfdml.losses.MetricLoss`) or its
            serialized config.
        embedding_dim: the size ``D`` of the embeddings, when it cannot be
            read from ``embedder.output_shape`` (an unbuilt subclassed model)
            and the loss's variables need it. Defaults to `None`.
        **kwargs: ``name``, ``trainable``... for ``keras.Model``.

    Examples:

    >>> embedder = tfdml.models.build_embedding_model("resnet50", embedding_dim=512)
    >>> loss = tfdml.losses.ProxyAnchorLoss(num_classes=100)
    >>> model = tfdml.models.MetricModel(embedder, loss)
    >>> model.compile(optimizer="adam")          # no loss= here
    >>> model.fit(train_ds, epochs=10)           # trains the network and the proxies
    >>> embeddings = model.predict(images)       # = embedder.predict(images)
    >>> model.save("run.keras")                  # proxies and optimizer slots included
    """

    def __init__(self, embedder, loss, embedding_dim=None, **kwargs):
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
        self.metric_loss._set_owner(self)
        state = self.metric_loss.state
        if state is not None:
            dim = embedding_dim if embedding_dim is not None else _output_dim(embedder)
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
        value = self.metric_loss(y, y_pred, sample_weight, training=training)
        for extra in self.losses:
            value = value + kops.cast(kops.sum(extra), value.dtype)
        return value

    def get_config(self):
        config = super().get_config()
        config.update(
            embedder=keras.saving.serialize_keras_object(self.embedder),
            loss=keras.saving.serialize_keras_object(self.metric_loss),
            embedding_dim=self.embedding_dim,
        )
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        embedder = keras.saving.deserialize_keras_object(config.pop("embedder"))
        loss = keras.saving.deserialize_keras_object(config.pop("loss"))
        return cls(embedder, loss, **config)


def unwrap(model):
    """The embedding model of a :class:`MetricModel`; any other model unchanged."""
    return model.embedder if isinstance(model, MetricModel) else model


def is_stateful_loss(loss) -> bool:
    """The loss has state that a :class:`MetricModel` must own."""
    return isinstance(loss, MetricLoss) and loss.state is not None
