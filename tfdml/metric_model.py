"""The model that trains an embedding model with a tfdml loss and owns the loss's state.

Exported as :class:`tfdml.models.MetricModel`.
"""

from __future__ import annotations

import functools
import inspect
import numbers
import warnings
import weakref

import keras
import numpy as np
from keras import ops

from tfdml import ops as dml
from tfdml._chunks import (
    _first_input,
    _jax_compiled_call,
    _jax_compiled_loop,
    _rows,
    _TFChunks,
)
from tfdml._files import save_atomically
from tfdml.losses.base import MetricLoss, resolve_loss

__all__ = ["MetricModel", "check_loss_state", "claim_loss", "loss_owner", "plus_model_losses"]


def _output_dim(model):
    """The embedding size of a built model, or None."""
    try:
        shape = model.output_shape
    except (AttributeError, ValueError):
        return None
    if isinstance(shape, (list, tuple)) and shape and isinstance(shape[0], (list, tuple)):
        return None  # several outputs
    return None if not shape else shape[-1]


def _check_chunk_size(chunk_size):
    if chunk_size is None:
        return None
    if (isinstance(chunk_size, bool) or not isinstance(chunk_size, numbers.Integral)
            or chunk_size < 1):
        raise ValueError("`chunk_size` must be an integer >= 1 or None. "
                         f"Received: chunk_size={chunk_size!r}")
    return int(chunk_size)


def _check_one_output(y_pred):
    """The embedder's output must be one ``[B, D]`` tensor, what every tfdml loss takes."""
    if isinstance(y_pred, (list, tuple, dict)):
        raise ValueError(
            "MetricModel's embedder must return one tensor of embeddings [B, D], which its "
            f"loss takes as y_pred; it returns {len(y_pred)} outputs. Several views of a "
            "sample go in one tensor, stacked along the batch axis (docs/losses.md, \"Two "
            "views\"). Received: an embedder output of type "
            f"{type(y_pred).__name__} with {len(y_pred)} entries")


def _check_chunk_output(out, rows, chunk_size):
    """A chunk of ``rows`` input rows must give ``rows`` embedding rows: the chunks' outputs
    are put together in input order, so an embedder that makes several rows of a sample
    (two views stacked) would mix the views of different chunks."""
    _check_one_output(out)
    got = out.shape[0]
    if got is not None and rows is not None and got != rows:
        raise ValueError(
            f"MetricModel with `chunk_size` needs an embedder that gives one embedding row "
            f"per input row; it gives {got} rows for a chunk of {rows} (several views of a "
            "sample stacked in its output?). Its chunks' outputs would be put together in "
            "the wrong order, and the loss would pair the views of different samples. Train "
            f"it without chunks, or embed each view as its own input row. Received: "
            f"chunk_size={chunk_size!r}")


def _check_array_labels(y, name):
    """Labels given as arrays (NumPy, lists, pandas), checked before Keras converts them.

    Keras turns string labels into a dtype error of its own, and under JAX without 64-bit
    mode holds int64 ids in 32 bits (merging distinct ids); tensors and datasets pass.
    """
    if y is None or keras.ops.is_tensor(y):
        return
    if hasattr(y, "to_numpy") and hasattr(y, "dtype"):  # pandas
        y = y.to_numpy()
    if not isinstance(y, (np.ndarray, list, tuple)):
        return
    try:
        array = np.asarray(y)
    except ValueError:  # ragged: Keras says what is wrong
        return
    dml.check_label_array(array, name)


def plus_model_losses(value, losses, scale=1.0):
    """``value + scale * (sum(losses[0]) + sum(losses[1]) + ...)``: a loss value plus a
    model's own losses (``model.losses``: regularizers, ``add_loss``), each cast to the
    dtype of ``value``. The one place training code adds them (``MetricModel``, the
    experiments' distributed step, the scatter diagram's gradients)."""
    if not losses:
        return value
    dtype = dml.dtype_name(value)
    total = ops.cast(ops.sum(losses[0]), dtype)
    for extra in losses[1:]:
        total = total + ops.cast(ops.sum(extra), dtype)
    return value + (total if scale == 1.0 else total * scale)


# -- who owns a loss's state: the model that trains it --------------------------------------------


class _Ownership:
    """What this module knows of a loss: its owner and the warnings given."""

    def __init__(self):
        self.owner = None  # a weak reference: the model refers to the loss already
        self.built_in_call = False  # the state was built by a call, not by a model
        self.warned = False


_OWNERSHIP = weakref.WeakKeyDictionary()


def _ownership(loss) -> _Ownership:
    record = _OWNERSHIP.get(loss)
    if record is None:
        record = _OWNERSHIP[loss] = _Ownership()
    return record


def loss_owner(loss):
    """The :class:`MetricModel` that owns ``loss``'s state, or None."""
    record = _OWNERSHIP.get(loss)
    return None if record is None or record.owner is None else record.owner()


def claim_loss(loss, model):
    """Makes ``model`` the owner of ``loss``'s state (and of the losses it wraps).

    Raises:
        ValueError: when another model owns it already.
    """
    losses = _losses_within(loss)
    for inner in losses:
        owner = loss_owner(inner)
        if owner is not None and owner is not model:
            raise ValueError(
                f"Loss {inner.name!r} already belongs to the model {owner.name!r}: a "
                "loss with state (learned variables, a memory bank or a random miner's seed) "
                "can train one model at a time. Create another loss for another model."
            )
    for inner in losses:
        _ownership(inner).owner = weakref.ref(model)


def _losses_within(loss):
    """``loss`` and the losses it wraps, at any depth (``loss``, ``wrapped_losses``)."""
    found = [loss]
    for inner in (getattr(loss, "loss", None), *getattr(loss, "wrapped_losses", ())):
        if isinstance(inner, MetricLoss):
            found.extend(_losses_within(inner))
    return found


def _differentiated(y_pred) -> bool:
    """``y_pred`` is a PyTorch tensor in an autograd graph (a training step runs eagerly)."""
    if keras.backend.backend() != "torch":
        return False
    import torch

    return isinstance(y_pred, torch.Tensor) and y_pred.requires_grad and torch.is_grad_enabled()


def _unowned_state_error(loss, what):
    return ValueError(
        f"Loss {loss.name!r} {what}. Train with `tfdml.models.MetricModel(model, loss)`, "
        "which owns them, or call `loss.build_state(embedding_dim)` before the first step "
        "(and train `loss.trainable_variables` yourself)."
    )


def check_loss_state(loss, y_pred):
    """Before each call of a loss: builds its state on first use, eagerly; checks its owner.

    Raises:
        ValueError: for learned variables that would be created inside a
            compiled step, or, on PyTorch, created by a differentiated call
            outside any model (no optimizer would train them).
    """
    state = loss.state
    if state is None:
        return
    record = _ownership(loss)
    if not state.built:
        if dml.is_traced(y_pred) and state.needs_embedding_dim:
            raise _unowned_state_error(loss, (
                "has variables (e.g. proxies or a memory bank) that do not exist yet, and "
                "they cannot be created inside a compiled step"))
        loss.build_state(y_pred.shape[-1])
        record.built_in_call = True
    owner = loss_owner(loss)
    if (record.built_in_call and state.needs_embedding_dim and owner is None
            and _differentiated(y_pred) and state.trainable_variables):
        # PyTorch trains eagerly (Keras builds the loss in a first call without gradients):
        # variables the loss created itself are in no model's optimizer.
        raise _unowned_state_error(loss, (
            "created its learned variables (e.g. proxies) on its first call, outside any "
            "model, and is trained by a model that does not own them: they would never "
            "change"))
    if owner is not None or record.warned or not dml.is_traced(y_pred):
        return
    _warn_unowned(loss, state, record)


def _warn_unowned(loss, state, record):
    learned = bool(state.trainable_variables)
    seeds = loss._seed_generators()
    if learned or (keras.backend.backend() == "jax" and (
            state.needs_embedding_dim or seeds or state.non_trainable_variables)):
        record.warned = True
        what = ("learned variables that no model trains" if learned else
                "a memory bank that a compiled JAX step does not update" if
                state.needs_embedding_dim else
                "a random miner, whose seed state a compiled JAX step does not update: "
                "the same samples would be drawn at every step" if seeds else
                "a running state (e.g. a histogram) that a compiled JAX step does not update")
        warnings.warn(
            f"Loss {loss.name!r} has {what}. Train with "
            "`tfdml.models.MetricModel(model, loss)`, which owns the loss's state.",
            stacklevel=5,
        )


def _tf_unscale_for_distribution(value):
    """The loss of the global batch from a replica's share (``tf.distribute``)."""
    import tensorflow as tf

    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    if replicas > 1:
        value = value * ops.cast(replicas, value.dtype)
    return value


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
            2021): ``fit`` runs the embedder over the batch in chunks of
            ``chunk_size`` rows (the last one may be smaller), so that a
            batch of ``B`` rows needs the activations of one chunk only,
            while the loss still sees the whole batch. Each step (1) embeds
            the chunks without keeping their activations, (2) computes the
            loss on the ``[B, D]`` embeddings ``e`` and its gradient ``g =
            dL/de`` (and the gradient of the loss's own variables), (3) runs
            every chunk ``c`` through the embedder again and back-propagates
            its slice of ``g``: ``dL/dtheta = sum_c d(sum(e_c * g_c))/dtheta``,
            the gradient of the unchunked step when the embedder treats rows
            independently, and (4) applies one optimizer update. Memory: the
            activations of one chunk plus the ``[B, D]`` embeddings and their
            gradient. The network runs forward twice: on a GPU a step took
            1.4 to 1.55 times as long as without chunks in
            ``benchmarks/large_batch.py --fit``. On the CPU XLA runs the
            convolutions of a compiled loop slowly: compile the model with
            ``jit_compile=False`` there (under JAX the step then compiles each
            chunk's passes and the loss as functions of their own, and took
            0.9x the unchunked XLA step at B = 2048; docs/losses.md). Random
            layers (``Dropout``...) draw the same values in both passes (the
            embedder's non-trainable variables, seed states included, are
            restored before the second pass), and the loss runs once, so a
            memory bank or a random miner advances once per step.
            ``BatchNormalization`` computes its batch statistics per chunk
            (as with a batch of ``chunk_size``), and its moving statistics
            are updated once per chunk, as by one pass over the chunks. The
            embedder may use weight regularizers, but not losses added
            during its call (activity regularizers, ``add_loss``), which
            raise a ``ValueError``. ``evaluate`` and ``predict`` run as
            usual. `None` trains the whole batch at once. Defaults to
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
        chunk_size = _check_chunk_size(chunk_size)
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
        from tfdml.data.py_dataset import check_steps, fit_shuffle

        bound = inspect.signature(keras.Model.fit).bind(self, x, y, *args, **kwargs)
        given = bound.arguments
        self._check_labels(y, "y")
        self._warn_batches_without_positives(y, given.get("batch_size"),
                                             given.get("shuffle", True))
        validation = given.get("validation_data")
        if isinstance(validation, (list, tuple)) and len(validation) >= 2:
            self._check_labels(validation[1], "validation_data[1]")
        check_steps(x, given.get("steps_per_epoch"))
        check_steps(validation, given.get("validation_steps"), "validation_steps")
        # Keras warns at every fit on an endless PyDataset that it cannot shuffle it.
        given["shuffle"] = fit_shuffle(x, given.get("shuffle", True))
        return super().fit(*bound.args[1:], **bound.kwargs)

    def evaluate(self, x=None, y=None, *args, **kwargs):
        """``keras.Model.evaluate``, with the inputs checked first (see :meth:`fit`)."""
        from tfdml.data.py_dataset import check_steps

        bound = inspect.signature(keras.Model.evaluate).bind(self, x, y, *args, **kwargs)
        self._check_labels(y, "y")
        check_steps(x, bound.arguments.get("steps"), "steps")
        return super().evaluate(*bound.args[1:], **bound.kwargs)

    def _warn_batches_without_positives(self, y, batch_size, shuffle):
        """Labels given as arrays: warns (once per fit) when the batches ``fit`` will cut from
        them have no two samples of a class, where a mining loss has nothing to learn.

        A compiled step cannot warn from the loss (its values are not known while it is
        traced), so the batches are looked at here, from the labels alone: exactly with
        ``shuffle=False``, and for ``shuffle=True`` over one shuffle drawn here with a fixed
        seed of its own (the model's random state is not touched).
        """
        from tfdml.losses.class_weights import ClassWeightLoss
        from tfdml.losses.xbm import CrossBatchMemory

        inner = _losses_within(self.metric_loss)
        if (y is None or keras.ops.is_tensor(y) or not isinstance(y, (np.ndarray, list, tuple))
                or any(isinstance(loss, (ClassWeightLoss, CrossBatchMemory)) for loss in inner)):
            return
        ids = np.asarray(y)
        if ids.ndim == 0 or ids.size == 0 or ids.dtype.kind not in "iub":
            return
        ids = ids.reshape(len(ids), -1)[:, 0]
        size = 32 if batch_size is None else batch_size
        if not isinstance(size, numbers.Integral) or size < 1:
            return  # Keras refuses it
        order = (np.random.default_rng(0).permutation(len(ids))
                 if shuffle is True else np.arange(len(ids)))
        batches = [ids[order[i:i + size]] for i in range(0, len(ids), size)]
        lacking = sum(len(np.unique(b)) == len(b) for b in batches)
        if lacking and (shuffle is not True or 2 * lacking >= len(batches)):
            warnings.warn(
                f"MetricModel {self.name!r}: {lacking} of the {len(batches)} batches of "
                f"{size} that fit cuts from `y`{' (one shuffle)' if shuffle is True else ''} "
                f"have no two samples of a class, so the loss {self.metric_loss.name!r} is 0 "
                "on them and nothing is learned. Use batches with several samples of each "
                "class, e.g. tfdml.data.PKDataset or tfdml.data.pk_batches.",
                stacklevel=3,
            )

    def _check_labels(self, y, name):
        """Labels given as arrays: :func:`_check_array_labels`, and the class ids against the
        class count of every loss with class vectors (a traced step would give NaN)."""
        _check_array_labels(y, name)
        if y is None or keras.ops.is_tensor(y) or not isinstance(y, (np.ndarray, list, tuple)):
            return
        counts = [n for n in (getattr(inner, "num_classes", None)
                              for inner in _losses_within(self.metric_loss))
                  if isinstance(n, numbers.Integral)]
        ids = np.asarray(y)
        if counts and ids.size and (ids.min() < 0 or ids.max() >= min(counts)):
            raise ValueError(
                f"`{name}` holds class ids from {ids.min()} to {ids.max()}, and the loss "
                f"{self.metric_loss.name!r} has class vectors for [0, {min(counts)}) "
                f"(num_classes={min(counts)}): give it num_classes > {ids.max()}, or map the "
                f"labels to 0..num_classes-1. Received: {name} with ids up to {ids.max()}")

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
        _check_one_output(y_pred)
        return plus_model_losses(self.metric_loss(y, y_pred, sample_weight, training=training),
                                 self.losses)

    # -- gradient caching (chunk_size) -------------------------------------------------------

    def train_step(self, *args):
        """The stock training step, or gradient caching with ``chunk_size`` (class docstring).

        Under JAX the arguments are ``(state, data)``, elsewhere ``(data)``.
        """
        if self.chunk_size is None:
            return super().train_step(*args)
        backend = keras.backend.backend()
        if backend == "tensorflow":
            return self._tf_chunked_step(*args)
        if backend == "jax":
            return self._jax_chunked_step(*args)
        if backend == "torch":
            return self._torch_chunked_step(*args)
        return super().train_step(*args)

    def _loss_tracker_metric(self):
        """The ``Mean`` named ``loss`` of ``self.metrics`` (the compiled loss tracker), or None."""
        for metric in self.metrics:
            if metric.name == "loss" and isinstance(metric, keras.metrics.Mean):
                return metric
        return None

    def _check_no_call_losses(self, losses, layer):
        """Refuses losses added during the embedder's call (activity regularizers, ``add_loss``).

        With chunks, ``compute_loss`` would see those of the last chunk only, as constants.
        ``losses`` (``layer.losses`` after a call) holds them and one regularization loss per
        regularized trainable weight, which ``compute_loss`` differentiates itself.
        """
        regularized = sum(1 for v in layer.trainable_weights if v.regularizer is not None)
        if len(losses) > regularized:
            raise ValueError(
                f"MetricModel {self.name!r} with `chunk_size` cannot train an embedder that "
                "adds losses during its call (activity regularizers, `add_loss`); weight "
                "regularizers are fine. Remove them or train without chunks. "
                f"Received: chunk_size={self.chunk_size!r}")

    def _embedder_state_mask(self):
        """For each of ``self.non_trainable_variables``: whether the embedder owns it."""
        owned = {id(v) for v in self.embedder.non_trainable_variables}
        return [id(v) in owned for v in self.non_trainable_variables]

    def _tf_chunked_step(self, data):
        import tensorflow as tf

        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        first = _first_input(x)
        size = self.chunk_size
        if not self.trainable_weights or (first.shape[0] is not None
                                          and first.shape[0] <= size):
            return super().train_step(data)
        chunks = _TFChunks(x, size)
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
                tracker.update_state(_tf_unscale_for_distribution(loss),
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
            _check_chunk_output(embeddings, _first_input(inputs).shape[0], self.chunk_size)
            self._check_no_call_losses(embedder.losses, embedder)
            return embeddings

        size = chunks.size
        spec = embedder.compute_output_spec(
            _rows(chunks.x, lambda t: keras.KerasTensor(
                (size,) + tuple(t.shape[1:]), dtype=keras.backend.standardize_dtype(t.dtype))))
        _check_chunk_output(spec, size, self.chunk_size)
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

    def _jax_chunked_step(self, state, data):
        import jax

        trainable, non_trainable, optimizer_variables, metrics_variables = state
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        batch = _first_input(x).shape[0]
        size = self.chunk_size
        if batch <= size or not self.trainable_variables:
            return super().train_step(state, data)
        full, rest = divmod(batch, size)
        head_rows = full * size
        head_x = _rows(x, lambda t: t[:head_rows].reshape((full, size) + tuple(t.shape[1:])))
        tail_x = _rows(x, lambda t: t[head_rows:]) if rest else None

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
            _jax_compiled_call(self, "loss", loss_and_gradients, trainable, embeddings,
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
            _check_chunk_output(out, _first_input(inputs).shape[0], self.chunk_size)
            self._check_no_call_losses(losses, self)
            return non_trainable, out

        non_trainable, head = _jax_compiled_loop(self, "embed", embed, trainable, non_trainable,
                                              head_x)
        embeddings = head.reshape((head.shape[0] * head.shape[1],) + tuple(head.shape[2:]))
        if tail_x is not None:
            non_trainable, tail = _jax_compiled_call(self, "embed", embed, trainable,
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

        full, size = _first_input(head_x).shape[:2]
        head_rows = full * size
        head_grad = grad_embeddings[:head_rows].reshape(
            (full, size) + tuple(grad_embeddings.shape[1:]))
        grads, non_trainable = _jax_compiled_loop(self, "backward", backward_chunk, trainable,
                                               (grads, non_trainable), (head_x, head_grad))[0]
        if tail_x is not None:
            tail_grads, non_trainable = _jax_compiled_call(
                self, "grads", chunk_grads, trainable, non_trainable, tail_x,
                grad_embeddings[head_rows:])
            grads = jax.tree.map(ops.add, grads, tail_grads)
        return grads, non_trainable

    def _torch_chunked_step(self, data):
        import torch

        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        batch = _first_input(x).shape[0]
        size = self.chunk_size
        if batch <= size or not self.trainable_weights:
            return super().train_step(data)
        embedder = self.embedder
        starts = range(0, batch, size)
        chunks = [_rows(x, lambda t, s=s: t[s:s + size]) for s in starts]
        state = embedder.non_trainable_variables

        # 1. Embed the chunks without autograd.
        with torch.no_grad():
            snapshot = [ops.copy(v) for v in state]
            parts = []
            for inputs in chunks:
                parts.append(embedder(inputs, training=True))
                _check_chunk_output(parts[-1], _first_input(inputs).shape[0], self.chunk_size)
                self._check_no_call_losses(embedder.losses, embedder)
            embeddings = torch.cat(parts, dim=0)

        # 2. The loss; its backward fills the gradients of the loss's variables (and of
        # regularized weights) and of the embeddings.
        self.zero_grad()
        embeddings = embeddings.detach().requires_grad_(True)
        loss = self.compute_loss(x=x, y=y, y_pred=embeddings, sample_weight=sample_weight,
                                 training=True)
        tracker = self._loss_tracker_metric()
        if tracker is not None:
            tracker.update_state(loss, sample_weight=batch)
        if self.optimizer is not None:
            loss = self.optimizer.scale_loss(loss)
        if loss.requires_grad:
            loss.backward()
        grad = embeddings.grad
        embeddings = embeddings.detach()
        if grad is None:
            grad = torch.zeros_like(embeddings)

        # 3. Again from the same state, chunk by chunk; backward adds to the gradients.
        with torch.no_grad():
            for v, value in zip(state, snapshot, strict=True):
                v.assign(value)
        for inputs, start in zip(chunks, starts, strict=True):
            out = embedder(inputs, training=True)
            if out.requires_grad:
                torch.sum(out.float() * grad[start:start + size].float()).backward()

        # 4. One update.
        variables = self.trainable_weights[:]
        gradients = [v.value.grad for v in variables]
        with torch.no_grad():
            self.optimizer.apply(gradients, variables)
        return self.compute_metrics(x, y, embeddings, sample_weight=sample_weight)

    # -- saving: the random generators' states, and files written whole ----------------------

    #: The entry of the model's own saved variables that holds the states of its random
    #: generators (``[n, 2]``: each ``keras.random.SeedGenerator``'s seed and counter).
    SEED_STATES_KEY = "seed_states"

    def _seed_states(self):
        """The state variables of every ``keras.random.SeedGenerator`` of the model.

        Those of the embedder (``Dropout``, random augmentation layers) and of the
        loss's random miners, in the order of ``non_trainable_variables`` (the same
        for every model built from the same config). Keras saves a layer's own
        variables but not its generators' states, so that a loaded model would draw
        from the initial seed again (or, for ``seed=None``, from a new random one).
        """
        seen, states = set(), []
        for v in self.non_trainable_variables:
            # The name Keras gives the variable of every SeedGenerator.
            if v.name == "seed_generator_state" and id(v) not in seen:
                seen.add(id(v))
                states.append(v)
        return states

    def save_own_variables(self, store):
        """Keras' own variables, and the states of the random generators (class docstring)."""
        super().save_own_variables(store)
        states = self._seed_states()
        if states:
            store[self.SEED_STATES_KEY] = np.stack([np.asarray(keras.ops.convert_to_numpy(v))
                                                    for v in states])

    def load_own_variables(self, store):
        """Loads Keras' own variables and the random generators' states.

        Raises:
            ValueError: when the file holds another number of generator states
                than this model has (another embedder or miner).
        """
        keys = list(store.keys())
        own = {k: store[k] for k in keys if k != self.SEED_STATES_KEY}
        super().load_own_variables(own)
        states = self._seed_states()
        if self.SEED_STATES_KEY not in keys:
            if states:
                warnings.warn(
                    f"The file loaded into MetricModel {self.name!r} holds no random generator "
                    "states (it was written before tfdml saved them): its random layers and "
                    "miners draw from their initial seeds again, so training does not resume "
                    "exactly.", stacklevel=2)
            return
        saved = np.asarray(store[self.SEED_STATES_KEY])
        if saved.shape != (len(states), 2):
            raise ValueError(
                f"The file holds {saved.shape[0] if saved.ndim else 0} random generator "
                f"state(s) and MetricModel {self.name!r} has {len(states)} (random layers of "
                "the embedder and random miners of the loss): it was saved from another model.")
        for variable, value in zip(states, saved, strict=True):
            variable.assign(value.astype(variable.dtype))

    def save(self, filepath, overwrite=True, zipped=None, **kwargs):
        """``keras.Model.save``, written whole or not at all (:func:`tfdml.models.save_model`).

        The random generators' states are saved with the variables (see
        :meth:`save_own_variables`), so that training resumes exactly.
        """
        save_atomically(functools.partial(keras.Model.save, self), filepath,
                        overwrite=overwrite, zipped=zipped, **kwargs)

    def save_weights(self, filepath, overwrite=True, **kwargs):
        """``keras.Model.save_weights``, written whole or not at all.

        The weights go to a temporary file beside ``filepath``, which is
        flushed to disk and renamed over it once complete: a full disk, an
        error or a kill part-way leaves the previous file as it was (and
        loadable), and the process goes on after a failed save.
        """
        save_atomically(functools.partial(keras.Model.save_weights, self), filepath,
                        overwrite=overwrite, weights_only=True, **kwargs)

    def load_weights(self, filepath, skip_mismatch=False, **kwargs):
        """``keras.Model.load_weights``, with errors that name the file and what does not fit.

        The loss's state is saved with the class name of its loss and loads
        into the state of the same class only, with the same shapes.

        Raises:
            ValueError: naming ``filepath``, when the file holds the state of
                another loss class (e.g. ``ProxyAnchorLoss`` weights loaded
                into an ``ArcFaceLoss`` model), or variables of other shapes
                (another ``num_classes`` or embedding size), or when Keras
                refuses it for another reason.
            tfdml._files.CorruptFileError: (a ``ValueError`` and an
                ``OSError``) for a file that is truncated or corrupt, naming it.
        """
        from tfdml._files import raise_if_incomplete

        states = []
        pending = [] if self.loss_state is None else [self.loss_state]
        while pending:
            state = pending.pop()
            states.append(state)
            state.load_problem = None
            pending.extend(getattr(state, "wrapped_states", ()))
        try:
            return super().load_weights(filepath, skip_mismatch=skip_mismatch, **kwargs)
        except Exception as error:
            raise_if_incomplete(filepath, error)
            problems = [s.load_problem for s in states if s.load_problem]
            if problems:
                raise ValueError(
                    f"{filepath} does not fit MetricModel {self.name!r}, whose loss is "
                    f"{type(self.metric_loss).__name__}: {'; '.join(problems)}. Received: "
                    f"filepath={str(filepath)!r}") from error
            if isinstance(error, ValueError):
                raise ValueError(f"Cannot load {filepath} into MetricModel {self.name!r}: "
                                 f"{error}") from error
            raise

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


def unwrap(model):
    """The embedding model of a :class:`MetricModel`; any other model unchanged."""
    return model.embedder if isinstance(model, MetricModel) else model


def is_stateful_loss(loss) -> bool:
    """The loss has state that a :class:`MetricModel` must own."""
    return isinstance(loss, MetricLoss) and loss.state is not None
