"""ResNet18 (He et al. 2016), which Keras Applications does not have."""

from __future__ import annotations

import numbers

import keras

from tfdml.models.weights import check_input_shape, check_weights

__all__ = ["resnet18"]


def _conv_bn(x, filters, kernel, stride, name, relu=True):
    pad = kernel // 2
    if pad:
        x = keras.layers.ZeroPadding2D(pad, name=f"{name}_pad")(x)
    x = keras.layers.Conv2D(filters, kernel, strides=stride, use_bias=False, name=name,
                            kernel_initializer="he_normal")(x)
    bn_name = name.replace("conv", "bn") if "conv" in name else f"{name}_bn"
    x = keras.layers.BatchNormalization(epsilon=1e-5, momentum=0.9, name=bn_name)(x)
    if relu:
        x = keras.layers.ReLU(name=f"{bn_name}_relu")(x)
    return x


def _basic_block(x, filters, stride, name):
    shortcut = x
    out = _conv_bn(x, filters, 3, stride, f"{name}_conv1")
    out = _conv_bn(out, filters, 3, 1, f"{name}_conv2", relu=False)
    if stride != 1 or x.shape[-1] != filters:
        shortcut = keras.layers.Conv2D(filters, 1, strides=stride, use_bias=False,
                                       name=f"{name}_downsample_0",
                                       kernel_initializer="he_normal")(x)
        shortcut = keras.layers.BatchNormalization(epsilon=1e-5, momentum=0.9,
                                                   name=f"{name}_downsample_1")(shortcut)
    out = keras.layers.Add(name=f"{name}_add")([out, shortcut])
    return keras.layers.ReLU(name=f"{name}_out")(out)


def resnet18(
    include_top: bool = False,
    weights=None,
    input_tensor=None,
    input_shape=None,
    pooling=None,
    classes: int = 1000,
    classifier_activation="softmax",
    name: str = "resnet18",
):
    """ResNet18 (He et al. 2016), laid out as torchvision's ``resnet18``.

    ``keras.applications`` has no ResNet18 and Keras publishes no ImageNet
    weights for it, so ``weights="imagenet"`` is refused: use ``weights=None``
    (random He initialization) or the path of a weights file you saved or
    converted yourself (``model.save_weights("resnet18.weights.h5")``).

    The layers follow torchvision (7x7/2 stem, 3x3/2 max-pool, four stages of
    two basic blocks with 64, 128, 256, 512 filters, explicit symmetric zero
    padding, BatchNormalization epsilon 1e-5) and are named after its
    parameters with ``.`` replaced by ``_`` (``layer2_0_conv1``,
    ``layer2_0_downsample_0``, ``bn1``, ...), which makes porting a torchvision
    checkpoint a renaming exercise (transpose conv kernels from OIHW to HWIO).
    Without the top it has 11,176,512 trainable parameters (plus 9,600
    BatchNormalization moving statistics). It expects ``"torch"``
    preprocessing (:func:`get_preprocess`).

    Args:
        include_top: add global average pooling and a ``classes``-way Dense
            classifier. Defaults to `False`.
        weights: `None` or the path of a weights file. Defaults to `None`.
        input_tensor: a Keras tensor to build the model on. Defaults to `None`.
        input_shape: ``(height, width, 3)``; heights and widths may be `None`.
            Defaults to `None` (``(224, 224, 3)`` with the top, else
            ``(None, None, 3)``).
        pooling: without the top: `None` (4D feature map), ``"avg"`` or
            ``"max"``. Defaults to `None`.
        classes: number of classes of the top. Defaults to `1000`.
        classifier_activation: activation of the top. Defaults to `"softmax"`.
        name: model name. Defaults to `"resnet18"`.

    Returns:
        A functional ``keras.Model``.

    Examples:

    >>> backbone = tfdml.models.resnet18(input_shape=(64, 64, 3))
    >>> backbone.output.shape
    (None, 2, 2, 512)
    """
    if weights == "imagenet":
        raise ValueError(
            "`weights` for ResNet18 must be None or the path of a weights file: Keras "
            "publishes no ImageNet weights for ResNet18. Received: weights='imagenet'"
        )
    weights = check_weights(weights, allow_imagenet=False)
    if pooling not in (None, "avg", "max"):
        raise ValueError(f"`pooling` must be None, 'avg' or 'max'. Received: pooling={pooling!r}")
    if not isinstance(classes, numbers.Integral) or isinstance(classes, bool) or classes < 1:
        raise ValueError(f"`classes` must be an integer >= 1. Received: classes={classes!r}")
    if input_shape is None:
        input_shape = (224, 224, 3) if include_top else (None, None, 3)
    check_input_shape(input_shape, min_size=32)
    if input_tensor is None:
        inputs = keras.Input(shape=tuple(input_shape), name="images")
    else:
        inputs = input_tensor
    x = _conv_bn(inputs, 64, 7, 2, "conv1")
    x = keras.layers.ZeroPadding2D(1, name="maxpool_pad")(x)
    x = keras.layers.MaxPooling2D(3, strides=2, name="maxpool")(x)
    for stage, filters in enumerate((64, 128, 256, 512), start=1):
        for block in range(2):
            stride = 2 if stage > 1 and block == 0 else 1
            x = _basic_block(x, filters, stride, f"layer{stage}_{block}")
    if include_top:
        x = keras.layers.GlobalAveragePooling2D(name="avgpool")(x)
        x = keras.layers.Dense(classes, activation=classifier_activation, name="fc")(x)
    elif pooling == "avg":
        x = keras.layers.GlobalAveragePooling2D(name="avgpool")(x)
    elif pooling == "max":
        x = keras.layers.GlobalMaxPooling2D(name="maxpool_global")(x)
    model = keras.Model(inputs, x, name=name)
    if weights is not None:
        model.load_weights(weights)
    return model


# -- the embedding model --------------------------------------------------------------------


