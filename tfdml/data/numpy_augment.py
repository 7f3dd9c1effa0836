"""Image augmentation in NumPy, for `tfdml.data.PKDataset`: no TensorFlow needed.

The transforms of `tfdml.data.augment` (which are ``tf.data`` map functions), on NumPy
`[H, W, C]` images, for the Keras `PyDataset` that feeds `model.fit` under every backend.
They take the same arguments and give the same images up to float32 rounding (the resize
is the half-pixel bilinear interpolation of ``tf.image.resize``); randomness comes from a
``numpy.random.Generator`` instead of a stateless seed, so the random crops and flips differ
from the ``tf.data`` pipeline's.

Each transform is `fn(image, rng=None) -> float32 image`; `tfdml.data.PKDataset` passes
every image its own generator, derived from the sampler's seed, so the same seed gives
the same batches.
"""

from __future__ import annotations

import numpy as np

from tfdml._argument_checks import check_int
from tfdml._docs import fill_doc

__all__ = [
    "center_crop",
    "crop_to_bbox",
    "eval_transform",
    "get_preprocess",
    "pad_crop_transform",
    "random_crop",
    "random_flip",
    "resize",
    "to_pixels",
    "train_transform",
]


#: Docstring text of the transforms that this module and `tfdml.data.augment` share.
DOCS = {
    "RESIZE": """\
Args:
    image: `[H, W, C]` image, any numeric dtype.
    size: target size in pixels. With `keep_aspect_ratio=False` the output is
        `size x size`; otherwise the shorter side becomes `size`.
    keep_aspect_ratio: whether to keep the aspect ratio. Defaults to `False`.

Returns:
    float32 `[size, size, C]` (or `[h, w, C]` with the shorter side `size`).""",
    "CENTER_CROP": """\
Args:
    image: `[H, W, C]` image.
    size: side of the crop in pixels.

Returns:
    `[size, size, C]` image of the input dtype.""",
}


def check_crop_and_resize(crop_size, resize_size):
    """Both sizes positive integers, the crop at most the resize (a ValueError otherwise)."""
    check_int("crop_size", crop_size)
    check_int("resize_size", resize_size)
    if crop_size > resize_size:
        raise ValueError(
            "`crop_size` must be at most `resize_size`. "
            f"Received: crop_size={crop_size}, resize_size={resize_size}"
        )


def check_pad_crop(size, padding):
    """The size a positive integer and the padding a non-negative one (a ValueError otherwise)."""
    check_int("size", size)
    if isinstance(padding, bool) or not isinstance(padding, int) or padding < 0:
        raise ValueError(
            f"`padding` must be a non-negative integer. Received: padding={padding!r}"
        )


def unknown_preprocess(preprocess):
    """The ValueError of a `preprocess` that is neither None, a callable, a backbone nor a mode."""
    from tfdml.models import backbones as models

    return ValueError(
        "`preprocess` must be None, a callable, a backbone name from "
        "tfdml.models.BACKBONES or one of the modes "
        f"{models.PREPROCESS_MODES}. Received: preprocess={preprocess!r}"
    )


def _image(image):
    image = np.asarray(image)
    if image.ndim != 3:
        raise ValueError(f"`image` must have shape [H, W, C]. Received: shape {image.shape}")
    return image


#: A uint16 image holds 16-bit pixels: the transforms and normalizations scale them by this.
SCALE_16BIT = 255.0 / 65535.0


def to_pixels(image):
    """An image as float32 pixels in [0, 255]: a uint16 image is read as 16 bits and scaled
    by `255 / 65535`; other dtypes are taken to hold [0, 255] values already.

    Examples:

    >>> tfdml.data.numpy_augment.to_pixels(np.array([[[40000]]], np.uint16))
    array([[[155.64203]]], dtype=float32)
    """
    image = np.asarray(image)
    if image.dtype == np.uint16:
        return (image.astype(np.float32) * np.float32(SCALE_16BIT)).astype(np.float32)
    return image.astype(np.float32)


def _rng(rng):
    return rng if rng is not None else np.random.default_rng()


def _axis_weights(out_size, in_size):
    """Source rows (low, high) and weights of a half-pixel bilinear resize along one axis."""
    scale = np.float32(in_size) / np.float32(out_size)
    src = (np.arange(out_size, dtype=np.float32) + np.float32(0.5)) * scale - np.float32(0.5)
    low = np.floor(src)
    frac = (src - low).astype(np.float32)
    low = low.astype(np.int64)
    high = np.clip(low + 1, 0, in_size - 1)
    return np.clip(low, 0, in_size - 1), high, frac


@fill_doc(**DOCS)
def resize(image, size, keep_aspect_ratio=False):
    """Resizes an image (bilinear, half-pixel centres) to float32 in its value range.

    {RESIZE}

    Examples:

    >>> tfdml.data.numpy_augment.resize(np.zeros([30, 60, 3]), 16, keep_aspect_ratio=True).shape
    (16, 32, 3)
    """
    check_int("size", size)
    image = _image(image).astype(np.float32, copy=False)  # not written to
    height, width = image.shape[:2]
    if keep_aspect_ratio:
        shape = np.array([height, width], np.float32)
        scale = np.float32(size) / shape.min()
        new_h, new_w = np.maximum(np.round(shape * scale).astype(np.int64), size)
    else:
        new_h = new_w = size
    y0, y1, fy = _axis_weights(int(new_h), height)
    x0, x1, fx = _axis_weights(int(new_w), width)
    fy, fx = fy[:, None, None], fx[None, :, None]
    top = image[y0][:, x0] * (1 - fx) + image[y0][:, x1] * fx
    bottom = image[y1][:, x0] * (1 - fx) + image[y1][:, x1] * fx
    return (top + (bottom - top) * fy).astype(np.float32)


@fill_doc(**DOCS)
def center_crop(image, size):
    """The central `size x size` window of an image (padded with zeros if smaller).

    {CENTER_CROP}
    """
    check_int("size", size)
    image = _image(image)
    out = np.zeros((size, size, image.shape[2]), image.dtype)
    height, width = image.shape[:2]
    sy, sx = max((height - size) // 2, 0), max((width - size) // 2, 0)
    dy, dx = max((size - height) // 2, 0), max((size - width) // 2, 0)
    h, w = min(size, height), min(size, width)
    out[dy:dy + h, dx:dx + w] = image[sy:sy + h, sx:sx + w]
    return out


def random_crop(image, size, rng=None):
    """A random `size x size` window of an image with `H, W >= size`.

    Args:
        image: `[H, W, C]` image.
        size: side of the crop in pixels.
        rng: a `numpy.random.Generator`, or `None` for a fresh one. Defaults to `None`.

    Returns:
        `[size, size, C]` image of the input dtype.
    """
    check_int("size", size)
    image = _image(image)
    height, width = image.shape[:2]
    if height < size or width < size:
        raise ValueError(
            f"`random_crop` needs an image of at least {size} x {size}. Received: an image "
            f"of shape {image.shape}"
        )
    rng = _rng(rng)
    top = int(rng.integers(0, height - size + 1))
    left = int(rng.integers(0, width - size + 1))
    return image[top:top + size, left:left + size]


def random_flip(image, rng=None):
    """Flips an image left-right with probability 1/2.

    Args:
        image: `[H, W, C]` image.
        rng: a `numpy.random.Generator`, or `None` for a fresh one. Defaults to `None`.
    """
    image = _image(image)
    return image[:, ::-1] if _rng(rng).random() < 0.5 else image


def check_bbox(bbox):
    """`bbox` as a float64 `[4]` array, or a ValueError naming `bbox`: four finite numbers
    `(ymin, xmin, ymax, xmax)` with `ymin <= ymax` and `xmin <= xmax` (an inverted box
    would be clipped to a 1 x 1 crop)."""
    box = np.asarray(bbox, dtype=np.float64)
    if box.shape != (4,) or not np.isfinite(box).all() or box[2] < box[0] or box[3] < box[1]:
        raise ValueError(
            "`bbox` must be four finite numbers (ymin, xmin, ymax, xmax) with ymin <= ymax "
            f"and xmin <= xmax. Received: bbox={box.tolist()}"
        )
    return box


def crop_to_bbox(image, bbox):
    """Crops an image to a box `(ymin, xmin, ymax, xmax)` in pixels, clipped to the image
    and at least one pixel wide and high (as `tfdml.data.augment.crop_to_bbox`).

    Raises:
        ValueError: if `bbox` is not four finite numbers, or is inverted (`ymax < ymin` or
            `xmax < xmin`).
    """
    bbox = check_bbox(bbox)
    image = _image(image)
    height, width = image.shape[:2]
    ymin = int(np.clip(np.floor(bbox[0]), 0, height - 1))
    xmin = int(np.clip(np.floor(bbox[1]), 0, width - 1))
    ymax = int(np.clip(np.ceil(bbox[2]), ymin + 1, height))
    xmax = int(np.clip(np.ceil(bbox[3]), xmin + 1, width))
    return image[ymin:ymax, xmin:xmax]


def get_preprocess(preprocess):
    """The normalization of a Keras Applications backbone, on NumPy images.

    As `tfdml.data.augment.get_preprocess`: a backbone name from
    `tfdml.models.BACKBONES` or a mode (`"caffe"`, `"tf"`, `"torch"`, `"none"`) gives
    Keras' own `preprocess_input` of that backbone (a 1-channel image is converted to RGB
    first, other channel counts than 1 and 3 raise a ValueError); a callable is used as
    is; `None` keeps [0, 255]. Except with a callable, a uint16 image is scaled from 16
    bits to [0, 255] first (`to_pixels`).

    Returns:
        A function mapping an `[H, W, C]` image in [0, 255] (or uint16) to float32.
    """
    if preprocess is None:
        return to_pixels
    if callable(preprocess):
        return preprocess
    from tfdml.models import backbones as models

    try:
        mode = models.resolve_preprocess_mode(preprocess)
    except ValueError:
        raise unknown_preprocess(preprocess) from None
    if mode == "none":
        return to_pixels
    keras_fn = models.keras_preprocess_input(mode)

    def normalize(image):
        # A new array (to_pixels copies): Keras normalizes NumPy arrays in place.
        image = to_pixels(image)
        channels = image.shape[-1]
        if channels == 1:
            image = np.repeat(image, 3, axis=-1)
        elif channels != 3:
            raise ValueError(
                f"`preprocess={preprocess!r}` normalizes RGB images: it needs images with 3 "
                f"channels (1-channel images are converted to RGB). Received: an image of "
                f"shape {list(image.shape)}"
            )
        return np.asarray(keras_fn(image), np.float32)

    normalize.mode = mode
    return normalize


def train_transform(crop_size=224, resize_size=256, flip=True, preprocess=None,
                    keep_aspect_ratio=False):
    """The papers' training augmentation: resize, random crop, random horizontal flip.

    The arguments of `tfdml.data.augment.train_transform`.

    Returns:
        A function `fn(image, rng=None)` returning a float32 `[crop_size, crop_size, C]`
        image (`C = 3` for a 1-channel image and a backbone's `preprocess`).

    Examples:

    >>> fn = tfdml.data.numpy_augment.train_transform(32, 40, preprocess="resnet50")
    >>> fn(np.zeros([50, 60, 3], np.uint8), rng=np.random.default_rng(0)).shape
    (32, 32, 3)
    """
    check_crop_and_resize(crop_size, resize_size)
    normalize = get_preprocess(preprocess)

    def fn(image, rng=None):
        rng = _rng(rng)
        image = resize(to_pixels(_image(image)), resize_size, keep_aspect_ratio)
        image = random_crop(image, crop_size, rng)
        if flip:
            image = random_flip(image, rng)
        return normalize(image)

    return fn


def eval_transform(crop_size=224, resize_size=256, preprocess=None, keep_aspect_ratio=False):
    """The papers' evaluation transform: resize, then center crop (deterministic).

    The arguments of `tfdml.data.augment.eval_transform`.

    Returns:
        A function `fn(image, rng=None)` (`rng` is not used) returning a float32
        `[crop_size, crop_size, C]` image.
    """
    check_crop_and_resize(crop_size, resize_size)
    normalize = get_preprocess(preprocess)

    def fn(image, rng=None):
        del rng
        image = resize(to_pixels(_image(image)), resize_size, keep_aspect_ratio)
        return normalize(center_crop(image, crop_size))

    return fn


def pad_crop_transform(size=256, padding=10, flip=True, preprocess=None):
    """The extreme-triplet paper's augmentation: resize, zero-pad, random crop back, flip.

    The arguments of `tfdml.data.augment.pad_crop_transform`.

    Returns:
        A function `fn(image, rng=None)` returning a float32 `[size, size, C]` image.
    """
    check_pad_crop(size, padding)
    normalize = get_preprocess(preprocess)

    def fn(image, rng=None):
        rng = _rng(rng)
        image = resize(to_pixels(_image(image)), size)
        image = np.pad(image, [(padding, padding), (padding, padding), (0, 0)])
        image = random_crop(image, size, rng)
        if flip:
            image = random_flip(image, rng)
        return normalize(image)

    return fn
