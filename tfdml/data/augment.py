"""Image augmentation for metric learning, as ``tf.data`` map functions.

The papers tfdml reproduces train on images resized to 256 and randomly cropped to 224
(or 227) with random horizontal flips, and evaluate on a resize and a center crop. The
extreme-triplet paper instead resizes to 256 x 256, pads 10 pixels on each side and crops
256 x 256 back at random. All three are here, plus the normalization of a Keras
Applications backbone and the bounding-box crop of CUB-200-2011 and Cars196.

Every function is graph-compatible (usable in ``tf.data.Dataset.map`` and ``tf.function``).
Randomness comes from stateless random ops: the same ``seed`` (a shape ``[2]`` integer
tensor) gives the same output. ``tfdml.data.pk_batches`` passes each element its own seed,
derived from the pipeline seed.
"""

from __future__ import annotations

from tfdml._argument_checks import check_int
from tfdml._docs import fill_doc
from tfdml._tensorflow import tf
from tfdml.data import numpy_augment as _numpy_augment

# The transforms of tfdml.data.numpy_augment, as tf.data map functions.
__all__ = list(_numpy_augment.__all__)

def _as_float(image):
    image = tf.convert_to_tensor(image)
    if image.dtype != tf.float32:
        image = tf.cast(image, tf.float32)
    return image


def to_pixels(image):
    """An image as float32 pixels in [0, 255]: a uint16 image is read as 16 bits and scaled
    by `255 / 65535`; other dtypes are taken to hold [0, 255] values already (as
    `tfdml.data.numpy_augment.to_pixels`; graph-compatible: the dtype is static).

    Examples:

    >>> tfdml.data.augment.to_pixels(tf.constant([[[40000]]], tf.uint16)).numpy()
    array([[[155.64203]]], dtype=float32)
    """
    image = tf.convert_to_tensor(image)
    if image.dtype == tf.uint16:
        return tf.cast(image, tf.float32) * tf.constant(_numpy_augment.SCALE_16BIT, tf.float32)
    return _as_float(image)


def seed_or_random(seed):
    """``seed`` as a stateless ``tf.random`` seed (int32 or int64), or a random one for
    ``None``."""
    if seed is None:
        return tf.random.uniform([2], 0, 2**31 - 1, dtype=tf.int32)
    seed = tf.convert_to_tensor(seed)
    if seed.dtype not in (tf.int32, tf.int64):
        seed = tf.cast(seed, tf.int64)
    return seed


#: Preprocessing modes defined on RGB images: Keras Applications' "caffe" (RGB to BGR,
#: ImageNet means), "torch" (ImageNet means and standard deviations) and "tf" ([-1, 1]).
_RGB_MODES = ("caffe", "torch", "tf")


def _needs_rgb(preprocess):
    """Whether `preprocess` is a known normalization of RGB images (see `get_preprocess`)."""
    from tfdml import models

    if isinstance(preprocess, str):
        name = preprocess.lower()
        return name in models.BACKBONES or name in _RGB_MODES
    # The functions of `tfdml.models.get_preprocess` carry their mode.
    return getattr(preprocess, "mode", None) in _RGB_MODES


def _to_rgb(image, preprocess):
    """Converts a one-channel image to RGB; raises on other channel counts than 1 and 3."""
    image = tf.convert_to_tensor(image)
    channels = image.shape[-1] if image.shape.rank else None
    if channels == 1:
        return tf.image.grayscale_to_rgb(image)
    if channels == 3:
        return image
    if channels is not None:
        raise ValueError(
            f"`preprocess={preprocess!r}` normalizes RGB images: it needs images with 3 "
            "channels (1-channel images are converted to RGB). Received: an image of shape "
            f"{image.shape.as_list()}"
        )
    # Channels unknown until run time: convert one-channel images.
    return tf.cond(tf.equal(tf.shape(image)[-1], 1),
                   lambda: tf.image.grayscale_to_rgb(image), lambda: image)


def get_preprocess(preprocess):
    """Returns the normalization function of a Keras Applications backbone.

    **Grayscale images.** A backbone name and the modes `"caffe"`, `"torch"` and `"tf"`
    (and the functions `tfdml.models.get_preprocess` returns for them) normalize RGB
    images, and Keras Applications backbones take RGB input: the returned function first
    converts a 1-channel image (e.g. the digits data set, `[8, 8, 1]`) to RGB with
    `tf.image.grayscale_to_rgb`, and raises a `ValueError` on other channel counts than 1
    and 3. `"none"`, `None` and other callables leave the channels as they are.

    **16-bit images.** Except with a callable of your own, a uint16 image is read as 16
    bits: it is scaled by `255 / 65535` to [0, 255] first (`to_pixels`), so a 16-bit PNG
    decoded with `dtype=tf.uint16` is normalized as its 8-bit version would be.

    Args:
        preprocess: a backbone name from `tfdml.models.BACKBONES` (e.g. `"resnet50"`:
            `keras.applications.resnet50.preprocess_input`, RGB to BGR with the ImageNet
            means subtracted; `"inception_v3"`: scaled to [-1, 1]; `"resnet18"`: the torch
            normalization), a preprocessing mode (`"caffe"`, `"tf"`, `"torch"`, `"none"`),
            a callable (returned as is, unless it is a function of
            `tfdml.models.get_preprocess`), or `None` (float32 pixels in [0, 255]). Names
            resolve through `tfdml.models.get_preprocess`, so training and export normalize
            alike.

    Returns:
        A function mapping images with values in [0, 255] (or uint16) to the backbone's
        input, as float32.

    Raises:
        ValueError: if `preprocess` is not one of the above. The returned function raises
            a `ValueError` on images with neither 1 nor 3 channels if it needs RGB.

    Examples:

    >>> fn = tfdml.data.augment.get_preprocess("resnet50")
    >>> fn(tf.zeros([2, 2, 3])).shape
    TensorShape([2, 2, 3])
    >>> fn(tf.zeros([2, 2, 1])).shape  # grayscale: converted to RGB first
    TensorShape([2, 2, 3])
    """
    if preprocess is None:
        return to_pixels
    ours = not callable(preprocess) or hasattr(preprocess, "mode")
    if callable(preprocess):
        normalize = preprocess
    else:
        from tfdml import models

        try:
            normalize = models.get_preprocess(preprocess)
        except ValueError:
            raise _numpy_augment.unknown_preprocess(preprocess) from None
    if not ours:
        return normalize
    rgb = _needs_rgb(preprocess)

    def normalize_pixels(image):
        image = to_pixels(image)
        return normalize(_to_rgb(image, preprocess) if rgb else image)

    normalize_pixels.mode = getattr(normalize, "mode", None)
    normalize_pixels.__name__ = getattr(normalize, "__name__", "preprocess")
    normalize_pixels.__doc__ = normalize.__doc__
    return normalize_pixels


@fill_doc(**_numpy_augment.DOCS)
def resize(image, size, keep_aspect_ratio=False):
    """Resizes an image (bilinear) and returns it as float32 in its original value range.

    {RESIZE}

    Examples:

    >>> tfdml.data.augment.resize(tf.zeros([30, 60, 3]), 16, keep_aspect_ratio=True).shape
    TensorShape([16, 32, 3])
    """
    check_int("size", size)
    image = _as_float(image)
    if not keep_aspect_ratio:
        return tf.image.resize(image, (size, size))
    shape = tf.cast(tf.shape(image)[:2], tf.float32)
    scale = float(size) / tf.reduce_min(shape)
    new = tf.maximum(tf.cast(tf.round(shape * scale), tf.int32), size)
    return tf.image.resize(image, new)


@fill_doc(**_numpy_augment.DOCS)
def center_crop(image, size):
    """Crops the central `size x size` window of an image (padding with zeros if smaller).

    {CENTER_CROP}

    Examples:

    >>> tfdml.data.augment.center_crop(tf.zeros([256, 300, 3]), 224).shape
    TensorShape([224, 224, 3])
    """
    check_int("size", size)
    return tf.image.resize_with_crop_or_pad(image, size, size)


def random_crop(image, size, seed=None):
    """Crops a random `size x size` window (stateless; the same seed gives the same window).

    Args:
        image: `[H, W, C]` image with `H, W >= size`.
        size: side of the crop in pixels.
        seed: shape `[2]` integer seed, or `None` for a random one. Defaults to `None`.

    Returns:
        `[size, size, C]` image of the input dtype.

    Examples:

    >>> out = tfdml.data.augment.random_crop(tf.zeros([8, 8, 3]), 4, seed=(1, 2))
    >>> out.shape
    TensorShape([4, 4, 3])
    """
    check_int("size", size)
    image = tf.convert_to_tensor(image)
    channels = image.shape[-1] if image.shape[-1] is not None else tf.shape(image)[-1]
    return tf.image.stateless_random_crop(image, [size, size, channels], seed_or_random(seed))


def random_flip(image, seed=None):
    """Flips an image left-right with probability 1/2 (stateless).

    Args:
        image: `[H, W, C]` image.
        seed: shape `[2]` integer seed, or `None` for a random one. Defaults to `None`.

    Returns:
        The image, flipped or not.

    Examples:

    >>> tfdml.data.augment.random_flip(tf.zeros([4, 4, 3]), seed=(0, 1)).shape
    TensorShape([4, 4, 3])
    """
    return tf.image.stateless_random_flip_left_right(image, seed_or_random(seed))


def crop_to_bbox(image, bbox):
    """Crops an image to a bounding box given in pixels.

    The box is clipped to the image and is at least one pixel wide and high, so a box
    slightly outside the image (common in annotations) never fails.

    Args:
        image: `[H, W, C]` image.
        bbox: `[4]` box `(ymin, xmin, ymax, xmax)` in pixels of this image, as in
            `DatasetSplit.bboxes`.

    Returns:
        The `[ymax - ymin, xmax - xmin, C]` crop.

    Raises:
        ValueError: if a `bbox` known when the function is called is not four finite
            numbers or is inverted (`ymax < ymin` or `xmax < xmin`); a box known only at
            run time (in a ``tf.data`` map) fails an assertion (`InvalidArgumentError`)
            with the same message.

    Examples:

    >>> img = tf.zeros([100, 80, 3])
    >>> tfdml.data.augment.crop_to_bbox(img, [10.0, 20.0, 60.0, 50.0]).shape
    TensorShape([50, 30, 3])
    """
    image = tf.convert_to_tensor(image)
    static = tf.get_static_value(bbox)
    if static is not None:
        _numpy_augment.check_bbox(static)
    bbox = tf.cast(tf.convert_to_tensor(bbox), tf.float32)
    if static is None:  # known at run time only: an assertion in the graph
        valid = tf.reduce_all(tf.math.is_finite(bbox)) & (bbox[2] >= bbox[0]) & (
            bbox[3] >= bbox[1])
        check = tf.debugging.Assert(
            valid, ["crop_to_bbox: `bbox` must be four finite numbers (ymin, xmin, ymax, "
                    "xmax) with ymin <= ymax and xmin <= xmax. Received: bbox=", bbox])
        with tf.control_dependencies([check]):
            bbox = tf.identity(bbox)
    shape = tf.shape(image)
    height, width = shape[0], shape[1]
    ymin = tf.clip_by_value(tf.cast(tf.floor(bbox[0]), tf.int32), 0, height - 1)
    xmin = tf.clip_by_value(tf.cast(tf.floor(bbox[1]), tf.int32), 0, width - 1)
    ymax = tf.clip_by_value(tf.cast(tf.math.ceil(bbox[2]), tf.int32), ymin + 1, height)
    xmax = tf.clip_by_value(tf.cast(tf.math.ceil(bbox[3]), tf.int32), xmin + 1, width)
    return image[ymin:ymax, xmin:xmax]


def _split(seed, n):
    seed = seed_or_random(seed)
    return [tf.random.experimental.stateless_fold_in(seed, i) for i in range(n)]


def train_transform(crop_size=224, resize_size=256, flip=True, preprocess=None,
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
        A function `fn(image, seed=None)` returning a float32 `[crop_size, crop_size, C]`
        image (`C = 3` for a 1-channel image and a backbone's `preprocess`); the same
        seed gives the same crop and flip.

    Raises:
        ValueError: if a size is not a positive integer or `crop_size > resize_size`.

    Examples:

    >>> fn = tfdml.data.augment.train_transform(32, 40, preprocess="resnet50")
    >>> fn(tf.zeros([50, 60, 3], tf.uint8), seed=(0, 1)).shape
    TensorShape([32, 32, 3])
    >>> fn(tf.zeros([8, 8, 1]), seed=(0, 1)).shape  # grayscale digits: RGB for ResNet50
    TensorShape([32, 32, 3])
    """
    _numpy_augment.check_crop_and_resize(crop_size, resize_size)
    normalize = get_preprocess(preprocess)

    def fn(image, seed=None):
        crop_seed, flip_seed = _split(seed, 2)
        image = resize(to_pixels(image), resize_size, keep_aspect_ratio)
        image = random_crop(image, crop_size, crop_seed)
        if flip:
            image = random_flip(image, flip_seed)
        return normalize(image)

    return fn


def eval_transform(crop_size=224, resize_size=256, preprocess=None, keep_aspect_ratio=False):
    """The papers' evaluation transform: resize, then center crop (deterministic).

    Args:
        crop_size: side of the center crop. Defaults to `224`.
        resize_size: size the image is first resized to. Defaults to `256`.
        preprocess: backbone normalization, see `get_preprocess` (a backbone name converts
            1-channel images to RGB). Defaults to `None`.
        keep_aspect_ratio: `False` resizes to `resize_size x resize_size`; `True` resizes
            the shorter side to `resize_size`. Defaults to `False`.

    Returns:
        A function `fn(image, seed=None)` (the seed is ignored) returning a float32
        `[crop_size, crop_size, C]` image.

    Raises:
        ValueError: if a size is not a positive integer or `crop_size > resize_size`.

    Examples:

    >>> fn = tfdml.data.augment.eval_transform(224, 256)
    >>> fn(tf.zeros([300, 400, 3], tf.uint8)).shape
    TensorShape([224, 224, 3])
    """
    _numpy_augment.check_crop_and_resize(crop_size, resize_size)
    normalize = get_preprocess(preprocess)

    def fn(image, seed=None):
        del seed
        image = resize(to_pixels(image), resize_size, keep_aspect_ratio)
        return normalize(center_crop(image, crop_size))

    return fn


def pad_crop_transform(size=256, padding=10, flip=True, preprocess=None):
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
        A function `fn(image, seed=None)` returning a float32 `[size, size, C]` image.

    Raises:
        ValueError: if `size` is not a positive integer or `padding` is negative.

    Examples:

    >>> fn = tfdml.data.augment.pad_crop_transform(64, 4)
    >>> fn(tf.zeros([80, 90, 3], tf.uint8), seed=(3, 4)).shape
    TensorShape([64, 64, 3])
    """
    _numpy_augment.check_pad_crop(size, padding)
    normalize = get_preprocess(preprocess)

    def fn(image, seed=None):
        crop_seed, flip_seed = _split(seed, 2)
        image = resize(to_pixels(image), size)
        image = tf.pad(image, [[padding, padding], [padding, padding], [0, 0]])
        image = random_crop(image, size, crop_seed)
        if flip:
            image = random_flip(image, flip_seed)
        return normalize(image)

    return fn
