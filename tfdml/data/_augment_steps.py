"""The image transforms, written once for NumPy and ``tf.data``.

Each step takes the backend first (``ops``: the module :mod:`tfdml.data._numpy_backend` or
:mod:`tfdml.data._tf_backend`) and a ``random`` argument where it draws; its checks, sizes,
order and clipping are here, the backend brings the primitives (a resize, a random crop, a
draw). `bind` makes the public functions of a backend's module from the steps:
``tfdml.data.numpy_augment`` and ``tfdml.data.augment`` (this module's `PUBLIC`),
``tfdml.data.numpy_views`` and ``tfdml.data.views`` (:mod:`tfdml.data._view_steps`). There
the random argument takes the backend's name (``rng``, ``seed``) and the docstrings its
words (``{random}``, ``{random_doc}``, ``{draw}``, ``{augment}``, ``{views}``).
"""

from __future__ import annotations

import functools
import inspect

import numpy as np

from tfdml._argument_checks import check_int as _check_size

#: The steps that are public functions of ``numpy_augment`` and ``augment``.
PUBLIC = ("center_crop", "crop_to_bbox", "eval_transform", "get_preprocess",
          "pad_crop_transform", "random_crop", "random_flip", "resize", "to_pixels",
          "train_transform")

#: A uint16 image holds 16-bit pixels: the transforms and normalizations scale them by this.
SCALE_16BIT = 255.0 / 65535.0

#: Preprocessing modes defined on RGB images: Keras Applications' "caffe" (RGB to BGR,
#: ImageNet means), "torch" (ImageNet means and standard deviations) and "tf" ([-1, 1]).
RGB_MODES = ("caffe", "torch", "tf")


# -- the public functions of a backend --------------------------------------------------------


def public(ops, fn):
    """`fn` as the backend's public functions are: its argument ``random`` named as the
    backend names it (``rng``, ``seed``), and run as the backend runs them."""
    signature = inspect.signature(fn)
    name = ops.DOC["random"]

    def call(*args, **kwargs):
        if "random" in kwargs:
            raise TypeError(f"got an unexpected keyword argument 'random' (it is {name!r})")
        if name in kwargs and "random" in signature.parameters:
            kwargs["random"] = kwargs.pop(name)
        return fn(*args, **kwargs)

    call = ops.graph_function(call)
    call.__signature__ = signature.replace(parameters=[
        p.replace(name=name) if p.name == "random" else p for p in signature.parameters.values()])
    return call


def document(ops, doc):
    """A docstring in the words of the backend (its ``{random}``, ``{augment}``, ...)."""
    for key, words in ops.DOC.items():
        doc = doc.replace("{" + key + "}", words)
    return doc


def bind(ops, module, steps):
    """The public functions of the module named `module`, a dict: the steps `steps.PUBLIC`
    of the module `steps` (this one or :mod:`tfdml.data._view_steps`) on the backend `ops`."""
    functions = {}
    for name in steps.PUBLIC:
        step = getattr(steps, name)
        function = public(ops, functools.partial(step, ops))
        function.__name__ = function.__qualname__ = name
        function.__module__ = module
        function.__doc__ = document(ops, step.__doc__)
        functions[name] = function
    return functions


# -- argument checks ----------------------------------------------------------------------------


def check_crop_and_resize(crop_size, resize_size):
    """Both sizes positive integers, the crop at most the resize (a ValueError otherwise)."""
    _check_size("crop_size", crop_size)
    _check_size("resize_size", resize_size)
    if crop_size > resize_size:
        raise ValueError(
            "`crop_size` must be at most `resize_size`. "
            f"Received: crop_size={crop_size}, resize_size={resize_size}"
        )


def as_image(ops, image, any_rank=False):
    """`image` as the backend's array, `[H, W, C]` (a ValueError otherwise) unless `any_rank`
    and the backend's ops take any rank (TensorFlow's take batches too)."""
    image = ops.tensor(image)
    if not (any_rank and ops.ANY_RANK) and image.ndim != 3:
        raise ValueError(f"`image` must have shape [H, W, C]. Received: shape {image.shape}")
    return image


# -- the steps ----------------------------------------------------------------------------------


def to_pixels(ops, image):
    """An image as float32 pixels in [0, 255]: a uint16 image is read as 16 bits and scaled
    by `255 / 65535`; other dtypes are taken to hold [0, 255] values already.

    Examples:

    >>> np.asarray({augment}.to_pixels(np.array([[[40000]]], np.uint16)))
    array([[[155.64203]]], dtype=float32)
    """
    image = ops.tensor(image)
    if image.dtype.name == "uint16":
        return ops.float32(image) * ops.float32(SCALE_16BIT)
    return ops.float32(image, copy=True)


def resize(ops, image, size, keep_aspect_ratio=False):
    """Resizes an image (bilinear, half-pixel centres: ``tf.image.resize``'s) to float32 in
    its value range.

    Args:
        image: `[H, W, C]` image, any numeric dtype.
        size: target size in pixels. With `keep_aspect_ratio=False` the output is
            `size x size`; otherwise the shorter side becomes `size`.
        keep_aspect_ratio: whether to keep the aspect ratio. Defaults to `False`.

    Returns:
        float32 `[size, size, C]` (or `[h, w, C]` with the shorter side `size`).

    Examples:

    >>> tuple({augment}.resize(np.zeros([30, 60, 3]), 16, keep_aspect_ratio=True).shape)
    (16, 32, 3)
    """
    _check_size("size", size)
    image = ops.float32(as_image(ops, image, any_rank=True))
    if keep_aspect_ratio:
        shape = ops.float32(ops.height_width(image))
        scale = ops.float32(size) / ops.minimum(shape[0], shape[1])
        size = ops.maximum(ops.round_int(shape * scale), size)
    return ops.resize(image, size)


def center_crop(ops, image, size):
    """The central `size x size` window of an image (padded with zeros if smaller).

    Args:
        image: `[H, W, C]` image.
        size: side of the crop in pixels.

    Returns:
        `[size, size, C]` image of the input dtype.

    Examples:

    >>> tuple({augment}.center_crop(np.zeros([256, 300, 3]), 224).shape)
    (224, 224, 3)
    """
    _check_size("size", size)
    return ops.center_crop(as_image(ops, image, any_rank=True), size)


def random_crop(ops, image, size, random=None):
    """A random `size x size` window of an image with `H, W >= size`.

    Args:
        image: `[H, W, C]` image.
        size: side of the crop in pixels.
        {random}: {random_doc}

    Returns:
        `[size, size, C]` image of the input dtype.

    Examples:

    >>> tuple({augment}.random_crop(np.zeros([8, 8, 3]), 4, {draw}).shape)
    (4, 4, 3)
    """
    _check_size("size", size)
    return ops.random_crop(as_image(ops, image, any_rank=True), size, ops.random(random))


def random_flip(ops, image, random=None):
    """Flips an image left-right with probability 1/2.

    Args:
        image: `[H, W, C]` image.
        {random}: {random_doc}

    Returns:
        The image, flipped or not.
    """
    return ops.random_flip(as_image(ops, image, any_rank=True), ops.random(random))


def crop_to_bbox(ops, image, bbox):
    """Crops an image to a bounding box `(ymin, xmin, ymax, xmax)` given in pixels.

    The box is clipped to the image and is at least one pixel wide and high, so a box
    slightly outside the image (common in annotations) never fails.

    Args:
        image: `[H, W, C]` image.
        bbox: `[4]` box `(ymin, xmin, ymax, xmax)` in pixels of this image, as in
            `DatasetSplit.bboxes`.

    Returns:
        The `[ymax - ymin, xmax - xmin, C]` crop.

    Raises:
        ValueError: if `bbox` is not four finite numbers or is inverted (`ymax < ymin` or
            `xmax < xmin`). In a ``tf.data`` map, a box known only at run time fails an
            assertion (`InvalidArgumentError`) with the same message.

    Examples:

    >>> tuple({augment}.crop_to_bbox(np.zeros([100, 80, 3]), [10.0, 20.0, 60.0, 50.0]).shape)
    (50, 30, 3)
    """
    static = ops.static(bbox)
    box = None if static is None else np.asarray(static, dtype=np.float64)
    if box is not None and (box.shape != (4,) or not np.isfinite(box).all() or box[2] < box[0]
                            or box[3] < box[1]):  # an inverted box would crop 1 x 1
        raise ValueError(
            "`bbox` must be four finite numbers (ymin, xmin, ymax, xmax) with ymin <= ymax "
            f"and xmin <= xmax. Received: bbox={box.tolist()}")
    bbox = ops.bbox(bbox, checked=static is not None)
    image = as_image(ops, image, any_rank=True)
    height, width = ops.height_width(image)
    ymin = ops.clip(ops.floor_int(bbox[0]), 0, height - 1)
    xmin = ops.clip(ops.floor_int(bbox[1]), 0, width - 1)
    ymax = ops.clip(ops.ceil_int(bbox[2]), ymin + 1, height)
    xmax = ops.clip(ops.ceil_int(bbox[3]), xmin + 1, width)
    return image[ymin:ymax, xmin:xmax]


def get_preprocess(ops, preprocess):
    """The normalization of a Keras Applications backbone, as a function of an image.

    **Grayscale images.** A backbone name and the modes `"caffe"`, `"torch"` and `"tf"`
    normalize RGB images, and Keras Applications backbones take RGB input: the returned
    function first converts a 1-channel image (e.g. the digits data set, `[8, 8, 1]`) to
    RGB, and raises a `ValueError` on other channel counts than 1 and 3. `"none"`, `None`
    and callables leave the channels as they are. The ``tf.data`` functions
    (`tfdml.data.augment`) also convert for a backbone whose mode is `"none"`
    (EfficientNet, ConvNeXt, MobileNetV3), and treat the functions of
    `tfdml.models.get_preprocess` as their names; the NumPy ones use any callable as it is.

    **16-bit images.** Except with a callable of your own, a uint16 image is read as 16
    bits: it is scaled by `255 / 65535` to [0, 255] first (`to_pixels`), so a 16-bit PNG
    is normalized as its 8-bit version would be.

    Args:
        preprocess: a backbone name from `tfdml.models.BACKBONES` (e.g. `"resnet50"`:
            `keras.applications.resnet50.preprocess_input`, RGB to BGR with the ImageNet
            means subtracted; `"inception_v3"`: scaled to [-1, 1]; `"resnet18"`: the torch
            normalization), a preprocessing mode (`"caffe"`, `"tf"`, `"torch"`, `"none"`),
            a callable, or `None` (float32 pixels in [0, 255]). Names resolve as in
            `tfdml.models.get_preprocess`, so training and export normalize alike.

    Returns:
        A function mapping images with values in [0, 255] (or uint16) to the backbone's
        input, as float32.

    Raises:
        ValueError: if `preprocess` is not one of the above. The returned function raises
            a `ValueError` on images with neither 1 nor 3 channels if it needs RGB.

    Examples:

    >>> fn = {augment}.get_preprocess("resnet50")
    >>> tuple(fn(np.zeros([2, 2, 1])).shape)  # grayscale: converted to RGB first
    (2, 2, 3)
    """
    mode, normalize, rgb = None, None, False
    if callable(preprocess):
        mode = getattr(preprocess, "mode", None) if ops.WRAPS_MODE_FUNCTIONS else None
        if mode is None:
            return preprocess
        normalize, rgb = preprocess, mode in RGB_MODES
    elif preprocess is not None:
        from tfdml.models import backbones as models

        try:
            mode = models.resolve_preprocess_mode(preprocess)
        except ValueError:
            raise ValueError(
                "`preprocess` must be None, a callable, a backbone name from "
                "tfdml.models.BACKBONES or one of the modes "
                f"{models.PREPROCESS_MODES}. Received: preprocess={preprocess!r}") from None
        normalize = ops.keras_normalization(mode)
        rgb = mode in RGB_MODES or (ops.RGB_BACKBONES and preprocess.lower() in models.BACKBONES)

    def normalize_pixels(image):
        image = to_pixels(ops, image)
        if rgb:
            image = _rgb(ops, image, preprocess)
        return image if normalize is None else normalize(image)

    normalize_pixels.mode = mode
    return normalize_pixels


def _rgb(ops, image, preprocess):
    """A 1-channel image converted to RGB; an error for other channel counts than 1 and 3."""
    channels = image.shape[-1] if image.ndim else None  # None: known only when run
    if channels == 1:
        return ops.to_rgb(image)
    if channels == 3:
        return image
    if channels is not None:
        raise ValueError(
            f"`preprocess={preprocess!r}` normalizes RGB images: it needs images with 3 "
            "channels (1-channel images are converted to RGB). Received: an image of shape "
            f"{list(image.shape)}"
        )
    return ops.to_rgb_if_gray(image)


def _resized_pixels(ops, image, size, keep_aspect_ratio=False):
    return resize(ops, to_pixels(ops, as_image(ops, image, any_rank=True)), size,
                  keep_aspect_ratio)


def _crop_and_flip(ops, image, size, flip, random):
    """A random `size x size` crop, flipped with probability 1/2 if `flip`."""
    crop_random, flip_random = ops.fold(random, 2)
    image = random_crop(ops, image, size, crop_random)
    return random_flip(ops, image, flip_random) if flip else image


def train_transform(ops, crop_size=224, resize_size=256, flip=True, preprocess=None,
                    keep_aspect_ratio=False):
    """The papers' training augmentation: resize, random crop, random horizontal flip.

    Args:
        crop_size: side of the random crop (224, or 227 for GoogLeNet). Defaults to `224`.
        resize_size: size the image is first resized to (see `keep_aspect_ratio`).
            Defaults to `256`.
        flip: whether to flip left-right with probability 1/2. Defaults to `True`.
        preprocess: backbone normalization, see `get_preprocess` (a backbone name converts
            1-channel images to RGB). Defaults to `None` (float32 values in [0, 255]).
        keep_aspect_ratio: `False` resizes to `resize_size x resize_size`; `True` resizes
            the shorter side to `resize_size`. Defaults to `False`.

    Returns:
        A function `fn(image, {random}=None)` returning a float32
        `[crop_size, crop_size, C]` image (`C = 3` for a 1-channel image and a backbone's
        `preprocess`); the same `{random}` gives the same crop and flip.

    Raises:
        ValueError: if a size is not a positive integer or `crop_size > resize_size`.

    Examples:

    >>> fn = {augment}.train_transform(32, 40, preprocess="resnet50")
    >>> tuple(fn(np.zeros([50, 60, 3], np.uint8), {draw}).shape)
    (32, 32, 3)
    """
    check_crop_and_resize(crop_size, resize_size)
    normalize = get_preprocess(ops, preprocess)

    def fn(image, random=None):
        image = _resized_pixels(ops, image, resize_size, keep_aspect_ratio)
        return normalize(_crop_and_flip(ops, image, crop_size, flip, random))

    return public(ops, fn)


def eval_transform(ops, crop_size=224, resize_size=256, preprocess=None,
                   keep_aspect_ratio=False):
    """The papers' evaluation transform: resize, then center crop (deterministic).

    Args:
        crop_size: side of the center crop. Defaults to `224`.
        resize_size: size the image is first resized to. Defaults to `256`.
        preprocess: backbone normalization, see `get_preprocess` (a backbone name converts
            1-channel images to RGB). Defaults to `None`.
        keep_aspect_ratio: `False` resizes to `resize_size x resize_size`; `True` resizes
            the shorter side to `resize_size`. Defaults to `False`.

    Returns:
        A function `fn(image, {random}=None)` (`{random}` is not used) returning a float32
        `[crop_size, crop_size, C]` image.

    Raises:
        ValueError: if a size is not a positive integer or `crop_size > resize_size`.

    Examples:

    >>> fn = {augment}.eval_transform(224, 256)
    >>> tuple(fn(np.zeros([300, 400, 3], np.uint8)).shape)
    (224, 224, 3)
    """
    check_crop_and_resize(crop_size, resize_size)
    normalize = get_preprocess(ops, preprocess)

    def fn(image, random=None):
        del random
        image = _resized_pixels(ops, image, resize_size, keep_aspect_ratio)
        return normalize(center_crop(ops, image, crop_size))

    return public(ops, fn)


def pad_crop_transform(ops, size=256, padding=10, flip=True, preprocess=None):
    """The extreme-triplet paper's augmentation: resize, zero-pad, random crop back, flip.

    Images are resized to `size x size`, padded with `padding` zero pixels on each side and
    a random `size x size` window is cropped (a random shift of up to `padding` pixels).

    Args:
        size: output side in pixels. Defaults to `256`.
        padding: zero padding on each side, in pixels. Defaults to `10`.
        flip: whether to flip left-right with probability 1/2. Defaults to `True`.
        preprocess: backbone normalization, see `get_preprocess` (a backbone name converts
            1-channel images to RGB). Defaults to `None`.

    Returns:
        A function `fn(image, {random}=None)` returning a float32 `[size, size, C]` image.

    Raises:
        ValueError: if `size` is not a positive integer or `padding` is negative.

    Examples:

    >>> fn = {augment}.pad_crop_transform(64, 4)
    >>> tuple(fn(np.zeros([80, 90, 3], np.uint8), {draw}).shape)
    (64, 64, 3)
    """
    _check_size("size", size)
    if isinstance(padding, bool) or not isinstance(padding, int) or padding < 0:
        raise ValueError(f"`padding` must be a non-negative integer. Received: padding={padding!r}")
    normalize = get_preprocess(ops, preprocess)

    def fn(image, random=None):
        image = ops.pad(_resized_pixels(ops, image, size), padding)
        return normalize(_crop_and_flip(ops, image, size, flip, random))

    return public(ops, fn)
