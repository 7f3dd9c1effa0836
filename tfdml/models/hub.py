"""keras-hub vision backbones (ViT, DINOv2, DINOv3, CLIP, SigLIP, CNNs) for the embedding model.

:func:`tfdml.models.build_embedding_model` takes, besides the Keras Applications names of
:mod:`tfdml.models.backbones`, a name of :data:`HUB_BACKBONES` (e.g. ``"dinov2_small"``,
``"clip_vit_b16"``), any keras-hub preset (a built-in preset name, a ``kaggle://`` or
``hf://`` handle, the path of a preset directory) or a ``keras_hub.models.Backbone``
instance. This module turns one of those into the model's input, its normalization and
its pooled features:

* **pooling** by family: the class token for ViT, DINOv2, DINOv3 and CLIP, SigLIP's own
  attention-pooling head (``"map"``), generalized-mean pooling for CNNs; or the mean or
  max of the patch tokens (:class:`TokenPooling`);
* **normalization** in the model, as a ``keras.layers.Rescaling`` layer named
  ``"preprocessing"``: the model takes RGB pixels in 0..255, like the Keras Applications
  that normalize their input themselves (preprocessing mode ``"none"``). The scale and
  offset are those of the preset's image converter when it has one, else the family's
  mean and standard deviation.

keras-hub is an optional dependency (``pip install keras-hub``), imported only when one of
its backbones is asked for.
"""

from __future__ import annotations

import numbers
import os
from dataclasses import dataclass

import keras
from keras import ops

from tfdml.layers import GeneralizedMeanPooling2D
from tfdml.models.weights import WeightsUnavailableError, check_input_shape, check_weights

__all__ = ["HUB_BACKBONES", "TokenPooling"]

HUB_INSTALL = (
    "Install it with `pip install keras-hub` (or, in a clone of tfdml, `pip install \".[hub]\"`)."
)


def import_keras_hub():
    """``keras_hub``, or an ImportError that says what to install."""
    try:
        import keras_hub
    except ModuleNotFoundError as err:
        if err.name != "keras_hub":
            raise
        raise ImportError(
            "keras-hub backbones (ViT, DINOv2, CLIP, SigLIP, keras-hub presets) need the "
            "keras-hub package. " + HUB_INSTALL
        ) from err
    return keras_hub


# -- families -------------------------------------------------------------------------------

_IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
_HALF = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
_CLIP = ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711))


@dataclass(frozen=True)
class _Family:
    name: str
    pooling: str  # the default
    mean: tuple  # of pixels scaled to [0, 1]
    std: tuple
    resizable: bool = False  # position embeddings interpolated to any input size


#: By the class of the vision backbone (CLIP's and SigLIP's vision encoders).
_FAMILIES = {
    "ViTBackbone": _Family("vit", "cls", *_HALF),
    "DINOV2Backbone": _Family("dinov2", "cls", *_IMAGENET, resizable=True),
    "DINOV3Backbone": _Family("dinov3", "cls", *_IMAGENET, resizable=True),
    "CLIPVisionEncoder": _Family("clip", "cls", *_CLIP),
    "SigLIPVisionEncoder": _Family("siglip", "map", *_HALF),
}
_CNN = _Family("cnn", "gem", *_IMAGENET)
_TOKENS = _Family("tokens", "mean", *_IMAGENET)
_POOLED = _Family("pooled", "none", *_IMAGENET)


@dataclass(frozen=True)
class _HubName:
    preset: str  # keras-hub's built-in preset
    backbone_class: str  # the keras_hub.models class that lists it
    image_size: int  # the input size its weights were trained at


def _hub_table():
    t = {}

    def add(name, preset, cls, size=224):
        t[name] = _HubName(preset, cls, size)

    for name, size in (("base_patch16_224", 224), ("base_patch16_384", 384),
                       ("large_patch16_224", 224), ("large_patch16_384", 384)):
        add(f"vit_{name}", f"vit_{name}_imagenet", "ViTBackbone", size)
    for name in ("base_patch16_224", "base_patch32_224", "large_patch16_224",
                 "huge_patch14_224"):
        add(f"vit_{name}_in21k", f"vit_{name}_imagenet21k", "ViTBackbone")
    for size in ("small", "base", "large", "giant"):
        add(f"dinov2_{size}", f"dinov2_{size}", "DINOV2Backbone")
        add(f"dinov2_with_registers_{size}", f"dinov2_with_registers_{size}", "DINOV2Backbone")
    for size in ("small", "base", "large"):
        add(f"dinov3_vit_{size}", f"dinov3_vit_{size}_lvd1689m", "DINOV3Backbone")
    for name, preset, size in (("b16", "base_patch16", 224), ("b32", "base_patch32", 224),
                               ("l14", "large_patch14", 224),
                               ("l14_336", "large_patch14_336", 336)):
        add(f"clip_vit_{name}", f"clip_vit_{preset}", "CLIPBackbone", size)
    for name in ("siglip_base_patch16_224", "siglip_base_patch16_256", "siglip_base_patch16_384",
                 "siglip_large_patch16_256", "siglip_so400m_patch14_224",
                 "siglip_so400m_patch14_384", "siglip2_base_patch16_224",
                 "siglip2_base_patch16_256", "siglip2_so400m_patch14_224"):
        add(name, name, "SigLIPBackbone", int(name.rsplit("_", 1)[1]))
    add("resnet_50_imagenet", "resnet_50_imagenet", "ResNetBackbone")
    add("efficientnet_b0_ra_imagenet", "efficientnet_b0_ra_imagenet", "EfficientNetBackbone")
    return t


_HUB = _hub_table()
HUB_BACKBONES = tuple(_HUB)
"""The keras-hub backbone names :func:`tfdml.models.build_embedding_model` accepts (each
the short name of a keras-hub preset). Any other keras-hub preset, a preset directory or a
``keras_hub.models.Backbone`` instance works too."""


def hub_preset(name: str) -> str:
    """The keras-hub preset of a name of :data:`HUB_BACKBONES`."""
    return _HUB[name.lower()].preset


def _is_hub_instance(obj):
    return isinstance(obj, keras.layers.Layer) and any(
        cls.__module__.split(".")[0] == "keras_hub" for cls in type(obj).__mro__
    )


def is_hub_backbone(backbone, exclude=()) -> bool:
    """Whether ``backbone`` names a keras-hub backbone: an instance, a name of
    :data:`HUB_BACKBONES`, a preset handle (``kaggle://``, ``hf://``, ...) or directory, or a
    keras-hub built-in preset name (when keras-hub is installed). Names in ``exclude`` (the
    Keras Applications ones) are not."""
    if _is_hub_instance(backbone):
        return True
    if not isinstance(backbone, str) or backbone.lower() in exclude:
        return False
    if backbone.lower() in _HUB or "://" in backbone or os.path.isdir(backbone):
        return True
    try:
        keras_hub = import_keras_hub()
    except ImportError:
        return False
    return backbone in keras_hub.models.Backbone.presets


# -- pooling --------------------------------------------------------------------------------


@keras.saving.register_keras_serializable(package="tfdml")
class TokenPooling(keras.layers.Layer):
    """Pools a transformer's token sequence ``[B, T, D]`` into one vector per image ``[B, D]``.

    ``mode="cls"`` takes the first token (the class token of ViT, DINOv2, CLIP);
    ``"mean"`` and ``"max"`` pool the patch tokens, the tokens after the first
    ``num_prefix_tokens`` (the class token and DINOv2's register tokens).

    Args:
        mode: ``"cls"``, ``"mean"`` or ``"max"``. Defaults to `"cls"`.
        num_prefix_tokens: how many tokens come before the patch tokens: ``1`` for a
            class token, ``1 + num_register_tokens`` for DINOv2 with registers, ``0``
            for SigLIP. ``"cls"`` needs at least ``1``. Defaults to `1`.
        **kwargs: base layer arguments (``name``, ``dtype``, ...).

    Examples:

    >>> TokenPooling("mean", num_prefix_tokens=1)(np.ones((2, 197, 768))).shape
    (2, 768)
    """

    def __init__(self, mode: str = "cls", num_prefix_tokens: int = 1, **kwargs):
        super().__init__(**kwargs)
        if mode not in ("cls", "mean", "max"):
            raise ValueError(f"`mode` must be 'cls', 'mean' or 'max'. Received: mode={mode!r}")
        if (not isinstance(num_prefix_tokens, numbers.Integral)
                or isinstance(num_prefix_tokens, bool) or num_prefix_tokens < 0
                or (mode == "cls" and num_prefix_tokens < 1)):
            raise ValueError(
                "`num_prefix_tokens` must be an integer >= 0 (>= 1 for mode 'cls'). "
                f"Received: num_prefix_tokens={num_prefix_tokens!r}"
            )
        self.mode = mode
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.input_spec = keras.layers.InputSpec(ndim=3)

    def call(self, inputs):
        if self.mode == "cls":
            return inputs[:, 0, :]
        patches = inputs[:, self.num_prefix_tokens:, :]
        if self.mode == "mean":
            return ops.mean(patches, axis=1)
        return ops.max(patches, axis=1)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[2])

    def get_config(self):
        config = super().get_config()
        config.update(mode=self.mode, num_prefix_tokens=self.num_prefix_tokens)
        return config


def _family(base):
    for cls in type(base).__mro__:
        if cls.__name__ in _FAMILIES:
            return _FAMILIES[cls.__name__]
    rank = len(keras.tree.flatten(base.output)[0].shape)
    return {4: _CNN, 3: _TOKENS}.get(rank, _POOLED)


def _num_prefix_tokens(base, family):
    if family.name == "vit":
        return 1 if base.use_class_token else 0
    if family.name in ("dinov2", "dinov3"):
        return 1 + int(base.num_register_tokens)
    return 1 if family.name == "clip" else 0


def _pooling_names(family, base):
    if family.name == "cnn":
        return ("avg", "max", "gem")
    if family.name == "pooled":
        return ("none",)
    names = ["mean", "avg", "max"]
    if _num_prefix_tokens(base, family) and family.name != "tokens":
        names.insert(0, "cls")
    if family.name == "siglip":
        names.insert(0, "map")
    return tuple(names)


def _pooling(base, family, pooling):
    """``(features, pooling layer or None)``: what the pooling reads (the backbone, or for
    SigLIP's token pooling a model of its tokens before the attention-pooling head)."""
    if isinstance(pooling, keras.layers.Layer):
        return base, pooling
    accepted = _pooling_names(family, base)
    default = family.pooling if family.pooling in accepted else "mean"  # ViT without class token
    pooling = default if pooling is None else pooling
    if pooling not in accepted:
        raise ValueError(
            f"`pooling` for a {type(base).__name__} backbone must be one of "
            f"{', '.join(map(repr, accepted))}, None (its default, {default!r}) or a "
            f"Keras pooling layer instance. Received: pooling={pooling!r}"
        )
    if family.name == "cnn":
        return base, {
            "avg": lambda: keras.layers.GlobalAveragePooling2D(name="avg_pool"),
            "max": lambda: keras.layers.GlobalMaxPooling2D(name="max_pool"),
            "gem": lambda: GeneralizedMeanPooling2D(p=3.0, learnable=True, name="gem_pool"),
        }[pooling]()
    if pooling in ("map", "none"):
        return base, None
    features = base
    if family.name == "siglip":
        features = keras.Model(base.input, base.post_layer_norm.output,
                               name=f"{base.name}_tokens")
    mode = "mean" if pooling == "avg" else pooling
    prefix = _num_prefix_tokens(base, family)
    return features, TokenPooling(mode, num_prefix_tokens=prefix, name=f"{mode}_pool")


# -- loading --------------------------------------------------------------------------------


def _converter_preprocessing(converter):
    """``(scale, offset, image_size)`` of a keras-hub image converter."""
    def plain(value):
        if value is None or isinstance(value, numbers.Real):
            return value
        return [float(v) for v in value]

    size = converter.image_size
    return plain(converter.scale), plain(converter.offset), tuple(size) if size else None


def _family_preprocessing(family):
    scale = [1.0 / (255.0 * s) for s in family.std]
    offset = [-m / s for m, s in zip(family.mean, family.std, strict=True)]
    return scale, offset, None


def _unavailable(preset, err):
    return WeightsUnavailableError(
        f"The keras-hub preset {preset!r} is not in the local cache and could not be "
        f"downloaded ({type(err).__name__}: {err}). keras-hub downloads its presets from "
        "Kaggle (or Hugging Face for 'hf://' handles) into the kagglehub cache "
        "($KAGGLEHUB_CACHE, by default ~/.cache/kagglehub). On a machine with network "
        f"access, save it as a directory: `backbone = keras_hub.models.Backbone.from_preset("
        f"{preset!r}); backbone.save_to_preset('dir')` and "
        f"`keras_hub.layers.ImageConverter.from_preset({preset!r}).save_to_preset('dir')`, "
        "copy the directory here and pass its path as `backbone`."
    )


def _load_converter(keras_hub, preset):
    """The preset's image converter settings, or None when the preset has none."""
    try:
        converter = keras_hub.layers.ImageConverter.from_preset(preset)
    except FileNotFoundError:
        return None
    except ValueError:  # no image converter class for this backbone class
        return None
    except OSError as err:
        raise _unavailable(preset, err) from err
    return _converter_preprocessing(converter)


def _check_size(name, spec, input_shape):
    if input_shape is not None and tuple(input_shape[:2]) != (spec.image_size,) * 2:
        raise ValueError(
            f"`input_shape` for backbone {name!r} must be ({spec.image_size}, "
            f"{spec.image_size}, 3) (or None): its position embeddings are for that size. "
            f"Received: input_shape={input_shape!r}"
        )


_RESIZABLE = ("DINOV2Backbone", "DINOV3Backbone")
_ANY_SIZE = ("ResNetBackbone", "EfficientNetBackbone")


def _load_preset(keras_hub, name, input_shape, weights):
    """``(backbone, preprocessing or None)`` for a name of the table or a preset."""
    spec = _HUB.get(name.lower())
    if spec is not None and spec.backbone_class not in _RESIZABLE + _ANY_SIZE:
        _check_size(name, spec, input_shape)
    preset = spec.preset if spec else name
    preprocessing = _load_converter(keras_hub, preset)
    kwargs = {"load_weights": weights in ("imagenet", "pretrained")}
    if spec is not None and spec.backbone_class in _RESIZABLE:
        size = preprocessing[2] if preprocessing and preprocessing[2] else (spec.image_size,) * 2
        kwargs["image_shape"] = tuple(input_shape or (*size, 3))
    try:
        base = keras_hub.models.Backbone.from_preset(preset, **kwargs)
    except OSError as err:
        if isinstance(err, FileNotFoundError) or os.path.isdir(preset):
            raise
        raise _unavailable(preset, err) from err
    return base, preprocessing


def _vision(base):
    """The vision encoder of a two-tower model (CLIP, SigLIP), else ``base``."""
    encoder = getattr(base, "vision_encoder", None)
    return encoder if isinstance(encoder, keras.layers.Layer) else base


def _check_hub_weights(weights):
    if weights in ("imagenet", "pretrained", None):
        return weights
    try:
        return check_weights(weights, allow_imagenet=False)
    except ValueError:
        raise ValueError(
            "`weights` for a keras-hub backbone must be 'imagenet' or 'pretrained' (the "
            "preset's weights; an instance keeps its own), None (random initialization for "
            "a preset) or the path of an existing weights file. "
            f"Received: weights={weights!r}"
        ) from None


def _image_shape(base, input_shape):
    """The model's input shape: the backbone's, which ``input_shape`` must agree with."""
    own = tuple(keras.tree.flatten(base.input)[0].shape[1:])
    if input_shape is None:
        return own
    if len(own) != 3 or any(o is not None and o != i
                            for o, i in zip(own, input_shape, strict=True)):
        raise ValueError(
            f"`input_shape` must agree with the input shape of the keras-hub backbone "
            f"{base.name!r}, {own}: build the backbone at the size you want (e.g. "
            "keras_hub.models.DINOV2Backbone.from_preset(preset, image_shape=(224, 224, 3))) "
            f"or pass input_shape=None. Received: input_shape={input_shape!r}"
        )
    return tuple(input_shape)


def _as_input_of(model, x):
    """``x`` in the structure of ``model``'s input (``{"images": x}`` for most keras-hub
    backbones)."""
    structure = model.input
    return {key: x for key in structure} if isinstance(structure, dict) else x


def build_hub_features(backbone, input_shape=None, pooling=None, weights="imagenet"):
    """The keras-hub half of :func:`tfdml.models.build_embedding_model`.

    Args:
        backbone: a ``keras_hub.models.Backbone`` instance (CLIP's and SigLIP's two-tower
            backbones give their vision encoder), a name of :data:`HUB_BACKBONES`, or a
            keras-hub preset (built-in name, handle or directory).
        input_shape: ``(height, width, 3)`` or `None` (the backbone's; for the DINOv2 and
            DINOv3 names, the preset's image converter size, else 224).
        pooling: a name (see :func:`tfdml.models.build_embedding_model`), a pooling layer,
            or `None` for the family's default.
        weights: ``"imagenet"`` or ``"pretrained"`` (the preset's weights; an instance
            keeps its own), `None` (random initialization of a preset) or a weights file
            for the (vision) backbone.

    Returns:
        ``(inputs, features, base, label)``: the model's input (RGB pixels in 0..255), its
        pooled features, the backbone layer (to freeze) and the name to report.
    """
    keras_hub = import_keras_hub()
    weights = _check_hub_weights(weights)
    if input_shape is not None:
        input_shape = check_input_shape(input_shape)
    preprocessing, label = None, None
    if isinstance(backbone, str):
        base, preprocessing = _load_preset(keras_hub, backbone, input_shape, weights)
        label = backbone.lower() if backbone.lower() in _HUB else backbone
    elif _is_hub_instance(backbone):
        base = backbone
    else:
        raise ValueError(
            "`backbone` must be a keras_hub.models.Backbone instance, a keras-hub backbone "
            f"name or a keras-hub preset. Received: backbone={backbone!r}"
        )
    base = _vision(base)
    if isinstance(base.output, (dict, list, tuple)):
        raise ValueError(
            f"The keras-hub backbone {base.name!r} has several outputs "
            f"({type(base.output).__name__}); build it with a single output."
        )
    if weights not in ("imagenet", "pretrained", None):
        base.load_weights(weights)
    family = _family(base)
    image_shape = _image_shape(base, input_shape)
    scale, offset, _ = preprocessing or _family_preprocessing(family)
    features, pool = _pooling(base, family, pooling)
    inputs = keras.Input(shape=image_shape, name="images")
    x = inputs
    if scale is not None or offset is not None:
        x = keras.layers.Rescaling(1.0 if scale is None else scale,
                                   0.0 if offset is None else offset, name="preprocessing")(x)
    x = features(_as_input_of(features, x))
    if pool is not None:
        x = pool(x)
    return inputs, x, base, label or base.name

