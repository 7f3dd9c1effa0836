"""Projection and prediction heads of the self-supervised models, and the network that
embeds two views of each sample for :class:`tfdml.models.ContrastiveModel`."""

from __future__ import annotations

import keras
from keras import ops

from tfdml._argument_checks import check_int

__all__ = ["IMAGES", "VIEW1", "VIEW2", "TwoViewNetwork", "build_predictor", "build_projector",
           "clone_layer"]

#: The keys of the inputs of :class:`TwoViewNetwork`: two views, or images that its
#: augmenter makes two views of.
VIEW1, VIEW2, IMAGES = "view1", "view2", "images"


def build_projector(dim=2048, hidden_dim=None, num_layers=3, name="projector"):
    """The projection head of SimSiam, SimCLR, Barlow Twins, BYOL and MoCo.

    ``num_layers - 1`` blocks ``Dense(hidden_dim, use_bias=False) -> BatchNormalization ->
    ReLU``, then ``Dense(dim, use_bias=False) -> BatchNormalization(center=False,
    scale=False)`` (SimSiam's and TensorFlow Similarity's head; ``num_layers=1`` is a linear
    projection with the batch norm). Its input size is set when the model is built.

    Args:
        dim: the output size. Defaults to `2048` (SimSiam's).
        hidden_dim: the hidden size. Defaults to `None` (``dim``).
        num_layers: the number of ``Dense`` layers, ``>= 1``. Defaults to `3`.
        name: name of the ``keras.Sequential``. Defaults to `"projector"`.

    Returns:
        An unbuilt ``keras.Sequential``.

    Examples:

    >>> projector = tfdml.models.build_projector(256, hidden_dim=1024, num_layers=2)

    Reference:
        Chen, He, "Exploring simple Siamese representation learning", CVPR 2021 (its
        projection MLP).
    """
    dim = check_int("dim", dim)
    hidden_dim = dim if hidden_dim is None else check_int("hidden_dim", hidden_dim)
    num_layers = check_int("num_layers", num_layers)
    layers = []
    for _ in range(num_layers - 1):
        layers += [keras.layers.Dense(hidden_dim, use_bias=False),
                   keras.layers.BatchNormalization(), keras.layers.ReLU()]
    layers += [keras.layers.Dense(dim, use_bias=False),
               keras.layers.BatchNormalization(center=False, scale=False)]
    return keras.Sequential(layers, name=name)


def build_predictor(dim=2048, hidden_dim=512, name="predictor"):
    """The prediction head of SimSiam and BYOL: ``Dense(hidden_dim, use_bias=False) ->
    BatchNormalization -> ReLU -> Dense(dim)``.

    ``dim`` must be the projector's output size (the prediction is compared with a
    projection). SimSiam takes ``hidden_dim = dim / 4`` (2048 and 512); BYOL 4096 and
    256.

    Args:
        dim: the output size, the projector's. Defaults to `2048`.
        hidden_dim: the bottleneck size. Defaults to `512`.
        name: name of the ``keras.Sequential``. Defaults to `"predictor"`.

    Returns:
        An unbuilt ``keras.Sequential``.

    Reference:
        Chen, He, "Exploring simple Siamese representation learning", CVPR 2021; Grill et
        al., "Bootstrap your own latent", NeurIPS 2020.
    """
    dim = check_int("dim", dim)
    hidden_dim = check_int("hidden_dim", hidden_dim)
    return keras.Sequential([keras.layers.Dense(hidden_dim, use_bias=False),
                             keras.layers.BatchNormalization(), keras.layers.ReLU(),
                             keras.layers.Dense(dim)], name=name)


def clone_layer(layer, name):
    """A copy of ``layer`` with fresh variables: ``keras.models.clone_model`` for functional
    and sequential models, ``from_config`` otherwise.

    Raises:
        ValueError: for a layer that cannot be rebuilt from its config.
    """
    try:
        if isinstance(layer, keras.Model):
            copy = keras.models.clone_model(layer)
        else:
            copy = type(layer).from_config(layer.get_config())
    except (NotImplementedError, TypeError, ValueError) as error:
        raise ValueError(
            f"Cannot copy {layer.name!r} for the momentum (EMA) target network: it cannot be "
            f"rebuilt from its config ({error}). Give it a `get_config` / `from_config`, or "
            "build it with the functional or sequential API.") from error
    copy.name = name
    return copy


class TwoViewNetwork(keras.layers.Layer):
    """The network of a :class:`tfdml.models.ContrastiveModel`: two views of each sample
    through the backbone, the projector, the predictor and the target network, one
    output row per sample.

    Its input is ``{VIEW1: v1, VIEW2: v2}`` (``[N, ...]`` each), or ``{IMAGES: x}`` that
    its ``augmenter`` (a random Keras layer) makes two views of. Its output is
    ``[N, 2, W]``: for each sample and view the projection ``z`` (``P`` columns), the
    prediction ``p`` (``Q``, with a predictor) and the target network's projection ``t``
    (``P``, with a target network; a constant in the gradient), concatenated. Each row
    depends on its own sample only (but for batch normalization's statistics), so that
    the gradient cache can run it in chunks of samples, both views together.
    """

    def __init__(self, backbone, projector, predictor=None, targets=False, augmenter=None,
                 **kwargs):
        super().__init__(**kwargs)
        self.backbone = backbone
        self.projector = projector
        self.predictor = predictor
        self.augmenter = augmenter
        self.has_targets = bool(targets)
        self.target_backbone = self.target_projector = None
        self.widths = None  # (P, Q): the projection's and the prediction's sizes

    def build_heads(self, input_shape):
        """Builds the heads on the backbone's output and the target copies; the sizes."""
        spec = self.backbone.compute_output_spec(keras.KerasTensor(input_shape))
        if not hasattr(spec, "shape"):
            raise ValueError("The backbone of a ContrastiveModel must give one [N, D] output. "
                             f"Received: {spec}")
        features = tuple(spec.shape)
        if not self.projector.built:
            self.projector.build(features)
        projection = self.projector.compute_output_shape(features)
        predicted = None
        if self.predictor is not None:
            if not self.predictor.built:
                self.predictor.build(projection)
            predicted = self.predictor.compute_output_shape(projection)[-1]
        self.widths = (projection[-1], predicted)
        if self.has_targets and self.target_backbone is None:
            self.target_backbone = clone_layer(self.backbone, f"target_{self.backbone.name}")
            self.target_projector = clone_layer(self.projector,
                                                f"target_{self.projector.name}")
            self.target_backbone.build(input_shape)
            self.target_projector.build(features)
            for online, target in ((self.backbone, self.target_backbone),
                                   (self.projector, self.target_projector)):
                target.set_weights(online.get_weights())
                target.trainable = False

    def build(self, input_shape):
        shape = input_shape[VIEW1] if VIEW1 in input_shape else input_shape[IMAGES]
        if not self.backbone.built:
            self.backbone.build(shape)
        self.build_heads(tuple(shape))
        self.built = True

    def ema_pairs(self):
        """``(online, target)`` variables that the momentum update moves: the online
        network's trainable weights and their copies."""
        pairs = []
        if not self.has_targets:
            return pairs
        for online, target in ((self.backbone, self.target_backbone),
                               (self.projector, self.target_projector)):
            trainable = {id(v) for v in online.trainable_weights}
            pairs += [(o, t) for o, t in zip(online.weights, target.weights, strict=True)
                      if id(o) in trainable]
        return pairs

    def _view(self, x, training):
        z = self.projector(self.backbone(x, training=training), training=training)
        parts = [z]
        if self.predictor is not None:
            parts.append(self.predictor(z, training=training))
        if self.has_targets:
            t = self.target_projector(self.target_backbone(x, training=training),
                                      training=training)
            parts.append(ops.stop_gradient(ops.cast(t, z.dtype)))
        return ops.concatenate([ops.cast(p, z.dtype) for p in parts], axis=-1)

    def call(self, inputs, training=None):
        if IMAGES in inputs:
            first = self.augmenter(inputs[IMAGES], training=True)
            second = self.augmenter(inputs[IMAGES], training=True)
        else:
            first, second = inputs[VIEW1], inputs[VIEW2]
        return ops.stack([self._view(first, training), self._view(second, training)], axis=1)

    def split(self, outputs):
        """``{"z", "p", "t"}``: each ``[2N, width]`` over ``[view1; view2]`` (``p``, ``t``
        absent without a predictor, a target network)."""
        rows = ops.concatenate([outputs[:, 0], outputs[:, 1]], axis=0)
        projection, predicted = self.widths
        parts = {"z": rows[:, :projection]}
        start = projection
        if predicted is not None:
            parts["p"] = rows[:, start:start + predicted]
            start += predicted
        if self.has_targets:
            parts["t"] = rows[:, start:start + projection]
        return parts
