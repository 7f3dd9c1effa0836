"""The model that learns an embedding without labels from two views of each sample."""

from __future__ import annotations

import keras
from keras import ops

from tfdml._argument_checks import check_int, check_number
from tfdml.losses.base import MetricLoss
from tfdml.losses.moco import MoCoLoss
from tfdml.losses.ownership import claim_loss
from tfdml.losses.self_supervised import BarlowTwinsLoss, BYOLLoss, SimSiamLoss, VICRegLoss
from tfdml.losses.supervised_contrastive import NTXentLoss
from tfdml.losses.two_views import SelfSupervisedLoss
from tfdml.models.gradient_cache import GradientCache
from tfdml.models.heads import IMAGES, VIEW1, VIEW2, TwoViewNetwork
from tfdml.models.metric_model import plus_model_losses
from tfdml.models.monitors import OutputStd
from tfdml.models.saving import StateSaving

__all__ = ["ALGORITHMS", "ContrastiveModel", "two_view_inputs"]

#: The algorithms, and how each compares the two views: the projections stacked
#: (``"views"``), predictions against targets (``"targets"``), queries against the momentum
#: encoder's keys (``"keys"``).
ALGORITHMS = {"simclr": "views", "barlow": "views", "vicreg": "views", "simsiam": "targets",
              "byol": "targets", "moco": "keys"}
#: The default momentum of the algorithms with a momentum (EMA) target network.
MOMENTUM = {"byol": 0.996, "moco": 0.999}
_NEEDS_PREDICTOR = ("simsiam", "byol")


def default_loss(algorithm):
    """The loss of ``algorithm`` with its paper's settings."""
    return {"simclr": lambda: SelfSupervisedLoss(NTXentLoss(temperature=0.1)),
            "barlow": BarlowTwinsLoss, "vicreg": VICRegLoss, "simsiam": SimSiamLoss,
            "byol": BYOLLoss, "moco": MoCoLoss}[algorithm]()


def _check_algorithm(algorithm, predictor, momentum):
    if algorithm not in ALGORITHMS:
        raise ValueError(f"`algorithm` must be one of {sorted(ALGORITHMS)}. "
                         f"Received: algorithm={algorithm!r}")
    if algorithm in _NEEDS_PREDICTOR and predictor is None:
        raise ValueError(f"algorithm={algorithm!r} needs a `predictor` (without one the "
                         "embedding collapses): e.g. tfdml.models.build_predictor(dim).")
    if momentum is None:
        return MOMENTUM.get(algorithm)
    if algorithm not in MOMENTUM:
        raise ValueError(f"`momentum` is for the algorithms with a momentum target network "
                         f"({sorted(MOMENTUM)}); algorithm={algorithm!r} has none. "
                         f"Received: momentum={momentum!r}")
    return check_number("momentum", momentum, low=0, high=1)


def _same_rows(a, b):
    rows = [keras.tree.flatten(t)[0].shape[0] for t in (a, b)]
    if None not in rows and rows[0] != rows[1]:
        raise ValueError(f"The two views must have the same number of rows (one of each per "
                         f"sample). Received: {rows[0]} and {rows[1]} rows.")


def two_view_inputs(data, augmenter=None):
    """``(inputs, y, sample_weight)`` of a batch for :class:`ContrastiveModel`: ``inputs``
    the dict of two views (or of images for the augmenter) the network takes.

    A batch is ``((view1, view2),)`` or ``((view1, view2), y)`` (``fit(x=(v1, v2))``),
    ``(view1, view2)`` with views of the same shape (TensorFlow Similarity's datasets), a
    dict ``{"view1": ..., "view2": ...}``, or, with an ``augmenter``, one batch of images.

    Raises:
        ValueError: for anything else, or views with different numbers of rows.
    """
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    if isinstance(x, dict) and set(x) in ({VIEW1, VIEW2}, {IMAGES}):
        return x, y, sample_weight
    if isinstance(x, (list, tuple)) and len(x) == 2:
        _same_rows(x[0], x[1])
        return {VIEW1: x[0], VIEW2: x[1]}, y, sample_weight
    shape = getattr(x, "shape", None)
    if y is not None and shape is not None and len(shape) >= 2 and tuple(
            getattr(y, "shape", ())) == tuple(shape) and sample_weight is None:
        return {VIEW1: x, VIEW2: y}, None, None
    if augmenter is not None and shape is not None:
        return {IMAGES: x}, y, sample_weight
    raise ValueError(
        "ContrastiveModel trains on two views of each sample: batches `((view1, view2),)` "
        "(e.g. `fit(x=(view1, view2))`, tfdml.data.TwoViewDataset) or `(view1, view2)`, or "
        "one batch of images with an `augmenter=` that makes the views. Received a batch "
        f"whose inputs are {type(x).__name__}"
        f"{'' if shape is None else ' of shape ' + str(tuple(shape))}.")


@keras.saving.register_keras_serializable(package="tfdml")
class ContrastiveModel(GradientCache, StateSaving, keras.Model):
    """A backbone trained without labels on two views of each sample (TensorFlow
    Similarity's name and arguments, on every Keras backend).

    Each view goes through the ``backbone``, the ``projector`` (``z``) and, for SimSiam,
    BYOL and (optionally) MoCo, the ``predictor`` (``p``); BYOL and MoCo also through a
    momentum (EMA) copy of the backbone and projector, the target network (``t``). The
    loss of each ``algorithm`` (``loss=`` replaces its default):

    ============  ===========================================  ================================
    algorithm     loss                                         default
    ============  ===========================================  ================================
    ``simclr``    ``loss(None, [z1; z2])``                     NT-Xent, ``T = 0.1``, through
                                                               :class:`SelfSupervisedLoss`
    ``barlow``    ``loss(None, [z1; z2])``                     :class:`BarlowTwinsLoss`
    ``vicreg``    ``loss(None, [z1; z2])``                     :class:`VICRegLoss`
    ``simsiam``   ``loss([z2; z1], [p1; p2])``                 :class:`SimSiamLoss`
    ``byol``      ``2 loss([t2; t1], [p1; p2])``               :class:`BYOLLoss`
    ``moco``      ``loss([t1; t2], [q1; q2])``, ``q = p`` or   :class:`MoCoLoss`
                  ``z`` without a predictor
    ============  ===========================================  ================================

    (tfdml's losses are in :mod:`tfdml.losses`.) SimSiam's stop-gradient is in its loss;
    BYOL's doubled mean is the paper's sum of its two directions. **Against TensorFlow
    Similarity's** ``ContrastiveModel``: its SimCLR loss is twice this one (a sum over the
    two directions, ``T = 0.05`` by default), its SimSiam loss adds ``0.002``, and its
    VICReg loss uses the biased variance and differentiates the sum over the batch
    (``tests/losses/test_tfsim_ssl_parity.py`` checks each against recorded values).

    **The momentum update.** At the start of every training step the target weights move
    towards the online ones, ``xi <- m xi + (1 - m) theta`` (the online network's
    trainable weights; the target's batch-norm statistics follow its own forward
    passes). Since the targets start equal to the online weights, this is the papers'
    update after each optimizer step, one step later, and the same sequence of targets.
    The target weights are non-trainable variables of the model: saved, restored, and
    updated under every backend (JAX's stateless step included). ``momentum`` is constant
    (BYOL raises it to 1 over training with a cosine schedule; not done here).

    **Data.** ``fit`` takes batches of two views: ``fit(x=(view1, view2))``, a dataset or
    ``PyDataset`` yielding ``((view1, view2),)`` (:class:`tfdml.data.TwoViewDataset`,
    ``tfdml.data.views.two_view_batches``) or ``(view1, view2)``; or batches of images
    and an ``augmenter`` (a random Keras layer, e.g. ``keras.Sequential([RandomCrop,
    RandomFlip, ...])``) that makes the two views in the training step. Labels in the data
    are ignored. ``predict`` and calling the model give the **backbone's** embedding of
    one batch of inputs, for retrieval and k-NN evaluation; ``evaluate`` gives the loss on
    two-view batches.

    **Monitors.** The model reports ``output_std`` (:class:`tfdml.metrics.OutputStd` of the
    projections): about ``1 / sqrt(P)`` while healthy, towards 0 as the embedding
    collapses. ``monitors=`` adds other metrics of the projections ``[2N, P]`` (their
    ``y_true`` is None), e.g. :class:`tfdml.metrics.PCF`; ``compile`` takes no
    ``metrics``, since there are no labels (:class:`tfdml.callbacks.KNNAccuracy`
    evaluates the embedding on labelled data).

    **Large batches.** ``chunk_size`` embeds ``chunk_size`` samples (both of their views)
    at a time with gradient caching (:class:`tfdml.models.MetricModel`'s docstring): the
    loss still sees every sample's views, so SimCLR and MoCo v3 get all the batch's
    negatives, with the activations of one chunk in memory. The step equals the
    whole-batch step for networks without batch normalization, which computes its
    statistics per chunk. Under ``tf.distribute`` the SimCLR loss gathers every replica's
    views (:class:`tfdml.losses.SelfSupervisedLoss`) and BYOL's step equals one device's
    (``tests/test_distribute.py``); :class:`tfdml.losses.MoCoLoss` refuses it (train MoCo
    under ``keras.distribution``, where the loss sees the global batch).

    Args:
        backbone: the network to pretrain, ``[inputs] -> [N, D]``: a functional or
            sequential ``keras.Model`` built on one ``keras.Input`` (wrap another network
            in ``keras.Sequential([keras.Input(shape), network])``).
        projector: ``[N, D] -> [N, P]`` (:func:`tfdml.models.build_projector`).
        predictor: ``[N, P] -> [N, P]`` (:func:`tfdml.models.build_predictor`); needed by
            SimSiam and BYOL. Defaults to `None`.
        algorithm: one of ``"simclr"``, ``"simsiam"``, ``"barlow"``, ``"vicreg"``,
            ``"byol"``, ``"moco"``. Defaults to `"simsiam"`.
        loss: the loss, or `None` for the algorithm's (table above). Defaults to `None`.
        momentum: ``m`` in ``[0, 1]`` for BYOL and MoCo. Defaults to `None` (0.996 for
            BYOL, 0.999 for MoCo).
        augmenter: a random Keras layer making a view of a batch of images. Defaults to
            `None`.
        chunk_size: samples per chunk of the gradient cache, or `None`. Defaults to `None`.
        monitors: Keras metrics of the projections, reported with the loss. Defaults to
            `None`.
        **kwargs: ``name``... for ``keras.Model``.

    Examples:

    >>> backbone = tfdml.models.build_embedding_model("resnet50", embedding_dim=None)
    >>> model = tfdml.models.ContrastiveModel(
    ...     backbone, tfdml.models.build_projector(2048),
    ...     tfdml.models.build_predictor(2048, 512), algorithm="simsiam")
    >>> model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9))
    >>> model.fit(tfdml.data.TwoViewDataset(images, tfdml.data.numpy_views.simclr_views(224),
    ...                                     batch_size=256), epochs=100)
    >>> features = model.predict(images)          # the backbone's embedding

    Reference:
        TensorFlow Similarity's ``ContrastiveModel``; the papers of each loss.
    """

    def __init__(self, backbone, projector, predictor=None, algorithm="simsiam", loss=None,
                 momentum=None, augmenter=None, chunk_size=None, monitors=None, **kwargs):
        self.momentum = _check_algorithm(algorithm, predictor, momentum)
        chunk_size = check_int("chunk_size", chunk_size, allow_none=True)
        super().__init__(**kwargs)
        for name, layer in (("backbone", backbone), ("projector", projector),
                            ("predictor", predictor), ("augmenter", augmenter)):
            if layer is not None and not isinstance(layer, keras.layers.Layer):
                raise ValueError(f"`{name}` must be a keras.Model or layer. "
                                 f"Received: {name}={layer!r}")
        self.algorithm = algorithm
        self.chunk_size = chunk_size
        self.contrastive_loss = default_loss(algorithm) if loss is None else (
            keras.losses.get(loss) if isinstance(loss, (str, dict)) else loss)
        self.embedder = TwoViewNetwork(backbone, projector, predictor,
                                       targets=self.momentum is not None,
                                       augmenter=augmenter, name="two_view_network")
        self.backbone, self.projector, self.predictor = backbone, projector, predictor
        self.augmenter = augmenter
        self.output_std = OutputStd()
        self.monitors = _check_monitors(monitors)
        if getattr(self.contrastive_loss, "ownership", None) is not None:
            claim_loss(self.contrastive_loss, self)
        self.loss_state = getattr(self.contrastive_loss, "state", None)
        self._ema = None
        inputs = getattr(backbone, "inputs", None) if getattr(backbone, "built", False) else None
        if not inputs or len(inputs) != 1:
            raise ValueError(
                "ContrastiveModel needs a backbone with one known input: a functional or "
                "sequential model built on a `keras.Input` (as Keras Applications and "
                "keras-hub backbones are). Wrap another one: `keras.Sequential([keras.Input("
                f"shape), backbone])`. Received: backbone={backbone.name!r}")
        self.build({VIEW1: tuple(inputs[0].shape)})

    def build(self, input_shape):
        """Builds the heads and the target network on the backbone's input ``input_shape``
        (``{"view1": shape}``), and the loss's state (done by ``__init__``)."""
        if not self.embedder.built:
            self.embedder.build(input_shape)
        self._check_heads()
        state = self.loss_state
        if state is not None and not state.built:
            self.contrastive_loss.build_state(self.embedder.widths[0])
        # The monitors' variables, made now (a metric that makes them at its first update
        # could not inside a compiled step).
        rows = ops.zeros((2, self.embedder.widths[0]))
        for monitor in self.monitors:
            monitor.update_state(None, rows)
            monitor.reset_state()
        self.built = True

    def _check_heads(self):
        projection, predicted = self.embedder.widths
        if predicted is not None and predicted != projection:
            raise ValueError(
                f"The predictor's output size ({predicted}) must be the projector's "
                f"({projection}): the prediction of one view is compared with the projection "
                f"of the other. Received: predictor={self.predictor.name!r}")

    def call(self, inputs, training=None):
        """The backbone's embedding of ``inputs``; the network's ``[N, 2, W]`` outputs for
        two views (``(view1, view2)`` or the dict the training step makes). A backbone
        that takes two inputs is not supported."""
        if isinstance(inputs, dict) and set(inputs) in ({VIEW1, VIEW2}, {IMAGES}):
            return self.embedder(inputs, training=training)
        if isinstance(inputs, (list, tuple)) and len(inputs) == 2:  # (view1, view2)
            return self.embedder({VIEW1: inputs[0], VIEW2: inputs[1]}, training=training)
        return self.backbone(inputs, training=training)

    def compute_output_shape(self, input_shape):
        return self.backbone.compute_output_shape(input_shape)

    def compile(self, optimizer="rmsprop", loss=None, **kwargs):
        """``keras.Model.compile`` without ``loss`` and ``metrics``: the model trains with
        its algorithm's loss and has no labels to compare with (``monitors=`` watches the
        projections).

        Raises:
            ValueError: for a ``loss``, ``metrics`` or ``weighted_metrics``.
        """
        if loss is not None:
            raise ValueError(f"ContrastiveModel {self.name!r} trains with its algorithm's loss; "
                             f"compile it without `loss=` (pass `loss=` to the model). "
                             f"Received: loss={loss!r}")
        for key in ("metrics", "weighted_metrics"):
            if kwargs.get(key):
                raise ValueError(
                    f"ContrastiveModel {self.name!r} has no labels for compiled metrics; "
                    "watch its projections with `monitors=` (e.g. [tfdml.metrics.PCF()]) "
                    f"and its embedding with tfdml.callbacks.KNNAccuracy. Received: "
                    f"{key}={kwargs[key]!r}")
        super().compile(optimizer=optimizer, **kwargs)

    def compile_from_config(self, config):
        """Compiles a loaded model as it was saved (Keras skips a custom ``compile``)."""
        self.compile(**keras.saving.deserialize_keras_object(config))
        if self.built and getattr(self, "optimizer", None) is not None:
            self.optimizer.build(self.trainable_variables)

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        """The algorithm's loss of the network's outputs ``y_pred`` (class docstring), plus
        the model's regularization losses; ``y`` is ignored."""
        parts = self.embedder.split(y_pred)
        loss, kind = self.contrastive_loss, ALGORITHMS[self.algorithm]
        if kind == "views":
            value = _call(loss, None, parts["z"], training)
        elif kind == "targets":
            half = ops.shape(parts["z"])[0] // 2
            targets = parts["t"] if self.algorithm == "byol" else parts["z"]
            swapped = ops.concatenate([targets[half:], targets[:half]], axis=0)
            value = _call(loss, swapped, parts["p"], training)
            value = 2.0 * value if self.algorithm == "byol" else value
        else:
            value = _call(loss, parts["t"], parts.get("p", parts["z"]), training)
        return plus_model_losses(value, self.losses)

    def compute_metrics(self, x, y, y_pred, sample_weight=None):
        """Updates ``output_std`` and the ``monitors`` with the projections ``[2N, P]``, and
        returns the metrics' results."""
        if y_pred is not None and len(y_pred.shape) == 3:
            projections = self.embedder.split(y_pred)["z"]
            for monitor in (self.output_std, *self.monitors):
                monitor.update_state(None, projections)
        return self.get_metrics_result()

    # -- the training step: the momentum update, then the stock or the chunked step --------

    def train_step(self, *args):
        """One step on a two-view batch (:func:`two_view_inputs`): the momentum update of
        the target network, then the stock step, or gradient caching with ``chunk_size``.

        Under JAX the arguments are ``(state, data)``, elsewhere ``(data)``.
        """
        if len(args) == 2:  # JAX's stateless step
            state, data = args
            args = (self._momentum_update_state(state), two_view_inputs(data, self.augmenter))
        else:
            args = (two_view_inputs(args[0], self.augmenter),)
            self._momentum_update()
        if self.chunk_size is None:
            return super().train_step(*args)
        return self.chunked_train_step(*args)

    def test_step(self, *args):
        """The loss and metrics of a two-view batch (``evaluate``)."""
        if len(args) == 2:
            return super().test_step(args[0], two_view_inputs(args[1], self.augmenter))
        return super().test_step(two_view_inputs(args[0], self.augmenter))

    def _momentum_update(self):
        """``xi <- m xi + (1 - m) theta`` on the target variables (TensorFlow, PyTorch)."""
        m = self.momentum
        for online, target in self.embedder.ema_pairs():
            value = ops.stop_gradient(ops.cast(ops.convert_to_tensor(online), target.dtype))
            target.assign(m * ops.convert_to_tensor(target) + (1.0 - m) * value)

    def _momentum_update_state(self, state):
        """The momentum update on JAX's state tuple: new non-trainable values."""
        if self._ema is None:
            trainable = {id(v): i for i, v in enumerate(self.trainable_variables)}
            fixed = {id(v): j for j, v in enumerate(self.non_trainable_variables)}
            self._ema = [(trainable[id(o)], fixed[id(t)]) for o, t in self.embedder.ema_pairs()]
        if not self._ema:
            return state
        trainable, non_trainable, *rest = state
        non_trainable = list(non_trainable)
        m = self.momentum
        for i, j in self._ema:
            value = ops.stop_gradient(ops.cast(trainable[i], non_trainable[j].dtype))
            non_trainable[j] = m * non_trainable[j] + (1.0 - m) * value
        return (trainable, non_trainable, *rest)

    # -- saving ----------------------------------------------------------------------------

    def get_config(self):
        config = super().get_config()
        serialize = keras.saving.serialize_keras_object
        config.update(
            backbone=serialize(self.backbone), projector=serialize(self.projector),
            predictor=None if self.predictor is None else serialize(self.predictor),
            algorithm=self.algorithm, loss=serialize(self.contrastive_loss),
            momentum=self.momentum,
            augmenter=None if self.augmenter is None else serialize(self.augmenter),
            chunk_size=self.chunk_size,
            monitors=[serialize(m) for m in self.monitors] or None)
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        for key in ("backbone", "projector", "predictor", "loss", "augmenter"):
            if config.get(key) is not None:
                config[key] = keras.saving.deserialize_keras_object(config[key])
        if config.get("monitors"):
            config["monitors"] = [keras.saving.deserialize_keras_object(m)
                                  for m in config["monitors"]]
        return cls(**config)


def _check_monitors(monitors):
    """``monitors`` as a list of Keras metrics (a ValueError naming it otherwise)."""
    monitors = list(monitors or ())
    for monitor in monitors:
        if not isinstance(monitor, keras.metrics.Metric):
            raise ValueError("`monitors` must be Keras metrics of the projections (e.g. "
                             f"tfdml.metrics.PCF()). Received: {monitor!r}")
    return monitors


def _call(loss, y_true, y_pred, training):
    """``loss(y_true, y_pred)``, with ``training`` for the losses with buffers."""
    if isinstance(loss, (MetricLoss, MoCoLoss)):
        return loss(y_true, y_pred, training=training)
    return loss(y_true, y_pred)
