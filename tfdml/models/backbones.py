"""Embedding models: a Keras Applications backbone (or ResNet18), global pooling, Dense, L2 norm.

The papers tfdml reproduces train ``backbone -> global pooling -> Linear -> L2
normalize`` networks: ResNet50 / ResNet18 (extreme triplet learning, easy
positive sampling), GoogLeNet / Inception-BN (FAPPY, LoOp), often with frozen
BatchNormalization. :func:`build_embedding_model` builds that network from a
backbone name; :func:`get_preprocess` says how the backbone expects its input
pixels to be normalized. keras-hub backbones (ViT, DINOv2, CLIP, SigLIP, ...) go
through :mod:`tfdml.models.hub`.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from dataclasses import dataclass

import keras

from tfdml.layers import GeneralizedMeanPooling2D, L2Normalization
from tfdml.models.fine_tuning import freeze_batchnorm_layers, freeze_transformer_blocks
from tfdml.models.hub import HUB_BACKBONES, build_hub_features, is_hub_backbone
from tfdml.models.resnet import resnet18
from tfdml.models.weights import check_input_shape, check_weights, explain_missing_weights

__all__ = [
    "BACKBONES",
    "build_embedding_model",
    "get_preprocess",
    "keras_preprocess_input",
    "preprocess_mode",
    "resolve_preprocess_mode",
]


# -- backbones ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Backbone:
    constructor: str  # attribute of keras.applications, or "resnet18"
    preprocess: str  # "caffe", "tf", "torch" or "none"
    module: str | None  # keras.applications submodule with the matching preprocess_input


def _table():
    t = {}

    def add(name, ctor, mode, module):
        t[name] = _Backbone(ctor, mode, module)

    add("resnet18", "resnet18", "torch", None)
    for depth in (50, 101, 152):
        add(f"resnet{depth}", f"ResNet{depth}", "caffe", "resnet")
        add(f"resnet{depth}_v2", f"ResNet{depth}V2", "tf", "resnet_v2")
    add("vgg16", "VGG16", "caffe", "vgg16")
    add("vgg19", "VGG19", "caffe", "vgg19")
    add("inception_v3", "InceptionV3", "tf", "inception_v3")
    add("inception_resnet_v2", "InceptionResNetV2", "tf", "inception_resnet_v2")
    add("xception", "Xception", "tf", "xception")
    add("mobilenet", "MobileNet", "tf", "mobilenet")
    add("mobilenet_v2", "MobileNetV2", "tf", "mobilenet_v2")
    add("mobilenet_v3_small", "MobileNetV3Small", "none", "mobilenet_v3")
    add("mobilenet_v3_large", "MobileNetV3Large", "none", "mobilenet_v3")
    for depth in (121, 169, 201):
        add(f"densenet{depth}", f"DenseNet{depth}", "torch", "densenet")
    add("nasnet_mobile", "NASNetMobile", "tf", "nasnet")
    add("nasnet_large", "NASNetLarge", "tf", "nasnet")
    for i in range(8):
        add(f"efficientnet_b{i}", f"EfficientNetB{i}", "none", "efficientnet")
    for v in ("b0", "b1", "b2", "b3", "s", "m", "l"):
        add(f"efficientnet_v2_{v}", f"EfficientNetV2{v.upper()}", "none", "efficientnet_v2")
    for size, cls in (("tiny", "Tiny"), ("small", "Small"), ("base", "Base"), ("large", "Large"),
                      ("xlarge", "XLarge")):
        add(f"convnext_{size}", f"ConvNeXt{cls}", "none", "convnext")
    return t


_BACKBONES = _table()
BACKBONES = tuple(_BACKBONES)
"""The backbone names :func:`build_embedding_model` accepts."""

PREPROCESS_MODES = ("caffe", "tf", "torch", "none")

POOLINGS = ("avg", "max", "gem")


def _unknown_backbone(backbone, also=""):
    return ValueError(
        f"`backbone` must be a Keras Applications name ({', '.join(BACKBONES)}), a keras-hub "
        f"name ({', '.join(HUB_BACKBONES)}){also}, or, with keras-hub installed, a keras-hub "
        "preset (a built-in preset name, a 'kaggle://' or 'hf://' handle, or the path of a "
        "preset directory) or a keras_hub.models.Backbone instance, e.g. build_embedding_model("
        "keras_hub.models.Backbone.from_preset('dinov2_small')). Received: "
        f"backbone={backbone!r}"
    )


def _check_backbone(backbone):
    if not isinstance(backbone, str) or backbone.lower() not in _BACKBONES:
        raise _unknown_backbone(backbone)
    return backbone.lower()


def preprocess_mode(backbone: str) -> str:
    """The input normalization a backbone expects, by name.

    Args:
        backbone: a name from :data:`BACKBONES` or :data:`HUB_BACKBONES`.

    Returns:
        ``"caffe"`` (RGB -> BGR, minus the ImageNet channel means, 0..255
        scale: ResNet v1, VGG), ``"tf"`` (scaled to [-1, 1]: Inception,
        MobileNet v1/v2, ResNet v2, Xception, NASNet), ``"torch"`` (scaled to
        [0, 1], minus the ImageNet means, over their standard deviations:
        DenseNet, ResNet18) or ``"none"`` (the model takes 0..255 pixels and
        normalizes them itself: EfficientNet, EfficientNetV2, ConvNeXt,
        MobileNetV3, and every keras-hub backbone, whose model starts with a
        ``Rescaling`` layer).

    Raises:
        ValueError: for an unknown backbone.
    """
    if isinstance(backbone, str) and backbone.lower() in HUB_BACKBONES:
        return "none"
    return _BACKBONES[_check_backbone(backbone)].preprocess


def resolve_preprocess_mode(backbone: str) -> str:
    """The preprocessing mode of a backbone name or of a mode name (``"caffe"``, ``"tf"``,
    ``"torch"``, ``"none"``); a ValueError naming `backbone` otherwise."""
    if isinstance(backbone, str) and backbone.lower() in PREPROCESS_MODES:
        return backbone.lower()
    if isinstance(backbone, str) and backbone.lower() in _BACKBONES:
        return _BACKBONES[backbone.lower()].preprocess
    if isinstance(backbone, str) and backbone.lower() in HUB_BACKBONES:
        return "none"
    raise _unknown_backbone(backbone, f" or a preprocessing mode {PREPROCESS_MODES}")


def keras_preprocess_input(mode: str) -> Callable:
    """Keras Applications' ``preprocess_input`` of a mode (``"caffe"``, ``"tf"``,
    ``"torch"``); it takes NumPy arrays without TensorFlow, and modifies a float array in
    place."""
    return {
        "caffe": keras.applications.resnet.preprocess_input,
        "tf": keras.applications.mobilenet_v2.preprocess_input,
        "torch": keras.applications.densenet.preprocess_input,
    }[mode]


def _identity(x):
    from tfdml._tensorflow import tf

    return tf.cast(x, tf.float32)


def get_preprocess(backbone: str) -> Callable:
    """The ``preprocess_input`` function for a backbone (or a preprocessing mode).

    The returned function takes RGB pixels in 0..255 (any numeric dtype,
    NumPy or tensor, channels last) and returns a float32 tensor normalized as
    the backbone expects. It is Keras' own ``preprocess_input`` of that
    backbone's ``keras.applications`` module, called on a tensor (so a NumPy
    input is never modified in place); for ResNet18 it is the torch
    normalization (ImageNet means and standard deviations), as torchvision's
    ResNet18 and the extreme-triplet paper use. Use the same function in the
    training pipeline and in :func:`tfdml.export.export_embedding_model`.

    Args:
        backbone: a name from :data:`BACKBONES` or :data:`HUB_BACKBONES`
            (``"none"``: keras-hub models normalize their 0..255 input
            themselves), or a mode: ``"caffe"``, ``"tf"``, ``"torch"`` or
            ``"none"`` (cast to float32 only).

    Returns:
        A function ``images -> float32 tensor``, with its mode in the attribute
        ``mode``.

    Examples:

    >>> preprocess = tfdml.models.get_preprocess("resnet50")
    >>> dataset = dataset.map(lambda x, y: (preprocess(x), y))

    Raises:
        ValueError: for an unknown backbone or mode.
        ImportError: without TensorFlow (the one tfdml's TensorFlow modules
            raise, naming what to install).
    """
    from tfdml._tensorflow import tf  # the ImportError that says what to install

    mode = resolve_preprocess_mode(backbone)
    if mode == "none":
        fn = _identity
    else:
        keras_fn = keras_preprocess_input(mode)

        def fn(x):
            return keras_fn(tf.cast(x, tf.float32))

    def preprocess(images):
        return fn(images)

    preprocess.mode = mode
    preprocess.__name__ = f"preprocess_{mode}"
    preprocess.__doc__ = f"Preprocessing of mode {mode!r} (RGB 0..255 in, float32 out)."
    return preprocess


# -- the model ------------------------------------------------------------------------------


def _pooling_layer(pooling):
    if isinstance(pooling, keras.layers.Layer):
        return pooling
    if pooling == "avg":
        return keras.layers.GlobalAveragePooling2D(name="avg_pool")
    if pooling == "max":
        return keras.layers.GlobalMaxPooling2D(name="max_pool")
    if pooling == "gem":
        return GeneralizedMeanPooling2D(p=3.0, learnable=True, name="gem_pool")
    raise ValueError(
        "`pooling` must be 'avg', 'max', 'gem' or a Keras pooling layer instance "
        f"(e.g. tfdml.layers.GeneralizedMeanPooling2D(p=3, learnable=False)). "
        f"Received: pooling={pooling!r}"
    )


def _make_backbone(backbone, input_shape, weights):
    spec = _BACKBONES[backbone]
    if spec.constructor == "resnet18":
        return resnet18(include_top=False, weights=weights, input_shape=input_shape)
    constructor = getattr(keras.applications, spec.constructor)
    if weights == "imagenet":
        with explain_missing_weights(backbone):
            return constructor(include_top=False, weights="imagenet", input_shape=input_shape)
    model = constructor(include_top=False, weights=None, input_shape=input_shape)
    if weights is not None:
        model.load_weights(weights)
    return model


def _check_flag(name, value):
    if not isinstance(value, bool):
        raise ValueError(f"`{name}` must be True or False. Received: {name}={value!r}")


def _check_head(embedding_dim, normalize, freeze_batchnorm, trainable_backbone, freeze_blocks):
    if embedding_dim is not None and (
        not isinstance(embedding_dim, numbers.Integral)
        or isinstance(embedding_dim, bool)
        or embedding_dim < 1
    ):
        raise ValueError(
            f"`embedding_dim` must be an integer >= 1 or None. Received: "
            f"embedding_dim={embedding_dim!r}"
        )
    _check_flag("normalize", normalize)
    _check_flag("freeze_batchnorm", freeze_batchnorm)
    _check_flag("trainable_backbone", trainable_backbone)
    if not isinstance(freeze_blocks, numbers.Integral) or isinstance(freeze_blocks, bool) or (
            freeze_blocks < 0):
        raise ValueError(
            f"`freeze_blocks` must be an integer >= 0. Received: freeze_blocks={freeze_blocks!r}"
        )


def _applications_features(backbone, input_shape, pooling, weights):
    """``(inputs, pooled features, backbone layer, name)`` for a Keras Applications name."""
    backbone = _check_backbone(backbone)
    input_shape = check_input_shape((224, 224, 3) if input_shape is None else input_shape)
    pool = _pooling_layer("avg" if pooling is None else pooling)
    if backbone == "resnet18":
        if weights == "imagenet":
            raise ValueError(
                "`weights` for backbone 'resnet18' must be None or the path of a weights file: "
                "Keras publishes no ImageNet weights for ResNet18. Received: weights='imagenet'"
            )
        weights = check_weights(weights, allow_imagenet=False)
    else:
        weights = check_weights(weights)
    base = _make_backbone(backbone, input_shape, weights)
    inputs = keras.Input(shape=input_shape, name="images")
    return inputs, pool(base(inputs)), base, backbone


def build_embedding_model(
    backbone="resnet50",
    embedding_dim: int | None = 512,
    input_shape=None,
    pooling=None,
    weights="imagenet",
    normalize: bool = True,
    freeze_batchnorm: bool = False,
    name: str | None = None,
    trainable_backbone: bool = True,
    freeze_blocks: int = 0,
) -> keras.Model:
    """Builds ``backbone -> global pooling -> Dense(embedding_dim) -> L2 normalization``.

    **Keras Applications.** For a name of :data:`BACKBONES` the backbone is a
    ``keras.applications`` model built with ``include_top=False`` (or
    :func:`resnet18`) and nested as one layer named after it. Its input is
    expected already preprocessed: apply :func:`get_preprocess` ``(backbone)``
    to 0..255 RGB images, in the data pipeline and at export
    (:func:`tfdml.export.export_embedding_model` does it for you).

    **keras-hub backbones** (ViT, DINOv2, DINOv3, CLIP, SigLIP, keras-hub's CNNs):
    a name of :data:`HUB_BACKBONES` (e.g. ``"dinov2_small"``,
    ``"clip_vit_b16"``), any keras-hub preset (a built-in preset name, a
    ``kaggle://`` or ``hf://`` handle, the path of a directory written by
    ``backbone.save_to_preset``) or a ``keras_hub.models.Backbone`` instance
    (``keras_hub.models.Backbone.from_preset("dinov2_small")``; CLIP's and
    SigLIP's two-tower backbones give their vision encoder). keras-hub
    downloads presets from Kaggle or Hugging Face. The model takes 0..255 RGB
    pixels and normalizes them itself, in a ``Rescaling`` layer named
    ``"preprocessing"`` (the scale and offset of the preset's image converter,
    else the family's mean and standard deviation), so its preprocessing mode
    is ``"none"``. See :mod:`tfdml.models.hub`.

    The returned model carries ``model.preprocess`` (the mode name, e.g.
    ``"caffe"``) and ``model.backbone_name``; these Python attributes do not
    survive ``.keras`` save/load. The embedding head (Dense and normalization)
    computes in float32, so the embeddings are float32 under a mixed-precision
    policy.

    **Offline weights.** ``weights="imagenet"`` uses Keras' cache: if the file
    is not there and cannot be downloaded, a :class:`WeightsUnavailableError`
    names the exact file name Keras expects (e.g.
    ``resnet50_weights_tf_dim_ordering_tf_kernels_notop.h5``), the directory
    to put it in (``$KERAS_HOME/models``, by default ``~/.keras/models``) and
    the address to fetch it from. A keras-hub preset that cannot be
    downloaded raises it too, saying how to save the preset as a directory.

    Args:
        backbone: a name from :data:`BACKBONES` (``"resnet50"``, ``"resnet18"``,
            ``"inception_v3"``, ...) or :data:`HUB_BACKBONES`, a keras-hub preset
            or a ``keras_hub.models.Backbone``. Defaults to `"resnet50"`.
        embedding_dim: size of the embedding (units of the Dense layer), or
            `None` for no Dense layer (the pooled features are the embedding).
            Defaults to `512`.
        input_shape: ``(height, width, 3)``, or `None`: ``(224, 224, 3)`` for
            Keras Applications; for keras-hub, the backbone's own (ViT, CLIP and
            SigLIP are built for one size; the DINOv2 and DINOv3 names take any
            multiple of the patch size, by default the preset's image converter
            size, else 224). Defaults to `None`.
        pooling: Keras Applications and keras-hub CNNs: ``"avg"``, ``"max"``,
            ``"gem"`` (a :class:`tfdml.layers.GeneralizedMeanPooling2D` with a
            learnable ``p`` starting at 3). Transformers: ``"cls"`` (the class
            token: ViT, DINOv2, DINOv3, CLIP), ``"mean"`` (or ``"avg"``) and
            ``"max"`` of the patch tokens, and SigLIP's attention-pooling head
            ``"map"``. Or a pooling layer instance such as
            ``GeneralizedMeanPooling2D(p=3, learnable=False)``. Defaults to
            `None`: ``"avg"`` for Keras Applications, ``"gem"`` for keras-hub
            CNNs, ``"cls"`` for ViT, DINOv2, DINOv3 and CLIP, ``"map"`` for
            SigLIP.
        weights: ``"imagenet"``, `None` (random initialization) or the path of
            a weights file for the backbone: a file Keras publishes (the
            ``..._notop.h5`` ones) or one written by ``backbone.save_weights``.
            ResNet18 has no ImageNet weights in Keras. For keras-hub,
            ``"imagenet"`` (or ``"pretrained"``) loads the preset's weights,
            whatever data they were trained on, and an instance keeps its own.
            Defaults to `"imagenet"`.
        normalize: end with :class:`tfdml.layers.L2Normalization`. Defaults to
            `True`.
        freeze_batchnorm: freeze the backbone's BatchNormalization layers
            (``trainable=False``, hence inference mode), as the Roth et al.
            framework and the LoOp paper's ResNet-50 runs do. Defaults to
            `False`.
        name: model name. Defaults to `None` (``"<backbone>_embedding"``).
        trainable_backbone: `False` freezes the whole backbone (a linear probe:
            only the pooling and the head train). Defaults to `True`.
        freeze_blocks: freeze the patch embedding and the first
            ``freeze_blocks`` transformer blocks of a keras-hub vision
            transformer (:func:`freeze_transformer_blocks`). Defaults to `0`.

    Returns:
        A functional ``keras.Model`` from images ``[B, H, W, 3]`` to
        embeddings ``[B, embedding_dim]``.

    Raises:
        ValueError: for an unknown backbone (the message lists the names and
            says how to pass a keras-hub backbone) or pooling, a bad embedding
            size, input shape, weights or freezing argument.
        WeightsUnavailableError: ImageNet weights (or a keras-hub preset) not
            cached and not downloadable.
        ImportError: a keras-hub backbone without keras-hub installed.

    Examples:

    >>> model = tfdml.models.build_embedding_model(
    ...     "resnet50", embedding_dim=128, freeze_batchnorm=True)
    >>> model.compile(optimizer="adam", loss=tfdml.losses.TripletNCALoss(order=2))
    >>> preprocess = tfdml.models.get_preprocess("resnet50")
    >>> vit = tfdml.models.build_embedding_model("dinov2_small", 128, freeze_blocks=6)
    """
    _check_head(embedding_dim, normalize, freeze_batchnorm, trainable_backbone, freeze_blocks)
    if is_hub_backbone(backbone, exclude=_BACKBONES):
        inputs, x, base, label = build_hub_features(backbone, input_shape, pooling, weights)
        mode = "none"
        default_name = f"{label if label in HUB_BACKBONES else base.name}_embedding"
    else:
        inputs, x, base, label = _applications_features(backbone, input_shape, pooling, weights)
        mode = _BACKBONES[label].preprocess
        default_name = f"{label}_embedding"
    if freeze_batchnorm:
        freeze_batchnorm_layers(base)
    freeze_transformer_blocks(base, freeze_blocks)
    if not trainable_backbone:
        base.trainable = False
    if embedding_dim is not None:
        x = keras.layers.Dense(embedding_dim, dtype="float32", name="embedding")(x)
    if normalize:
        x = L2Normalization(dtype="float32", name="l2_normalization")(x)
    model = keras.Model(inputs, x, name=name or default_name)
    model.preprocess = mode
    model.backbone_name = label
    return model
