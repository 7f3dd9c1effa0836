"""Two augmented views of each image, for self-supervised learning (SimCLR, Barlow Twins).

NumPy only (no TensorFlow), for every Keras backend; `tfdml.data.views` has the same
augmentations as ``tf.data`` map functions.

* The ops, on `[H, W, C]` float images in [0, 1], random ones with a
  ``numpy.random.Generator``: `random_resized_crop` (`random_crop_box`), `color_jitter`
  (`adjust_brightness`, `adjust_contrast`, `adjust_saturation`, `adjust_hue`),
  `to_grayscale`, `gaussian_blur`, `solarize`.
* `simclr_augmenter` and `barlow_augmenter`: one view, `fn(image, rng=None)`, from an image
  in [0, 255] (any dtype; uint16 is read as 16 bits) to float32 pixels in [0, 255], then
  `preprocess` (as `tfdml.data.numpy_augment.train_transform`).
* `TwoViews`, `simclr_views`, `barlow_views`: both views, `views(image, rng)`.

`tfdml.data.TwoViewDataset` (:mod:`tfdml.data.two_view_dataset`) makes batches of
`((view1, view2),)` with them, as a `keras.utils.PyDataset`, for `model.fit` under every
backend.
"""

from __future__ import annotations

import math

import numpy as np

from tfdml._argument_checks import check_int, check_number
from tfdml._docs import fill_doc
from tfdml.data import numpy_augment

__all__ = ["TwoViews", "adjust_brightness", "adjust_contrast", "adjust_hue",
           "adjust_saturation", "barlow_augmenter", "barlow_views", "color_jitter",
           "gaussian_blur", "random_crop_box", "random_resized_crop", "simclr_augmenter",
           "simclr_views", "solarize", "to_grayscale"]

#: ITU-R 601 luma weights of R, G and B (those of ``tf.image.rgb_to_grayscale``).
GRAY_WEIGHTS = (0.2989, 0.5870, 0.1140)

#: The range of the Gaussian blur's sigma that the augmenters draw from (SimCLR, BYOL).
BLUR_SIGMA = (0.1, 2.0)

#: Tries of `random_crop_box` before it falls back to the central crop (Inception's).
CROP_TRIES = 10

#: Docstring text shared by this module and `tfdml.data.views`.
DOCS = {
    "CROP": """\
Inception's crop: up to 10 tries draw an area share in `scale` and a log-uniform aspect
ratio (width / height) in `ratio`; the first box that fits in the image is taken,
at a uniform position. If none fits, the central crop whose aspect ratio is clamped to
`ratio` is taken. The crop is then resized (bilinear, half-pixel centres, as
`tfdml.data.numpy_augment.resize`) to `size x size`.""",
    "JITTER": """\
As torchvision's `ColorJitter`: the four adjustments in a random order, each factor drawn
uniformly: brightness, contrast and saturation in `[max(0, 1 - b), 1 + b]`, the hue shift
in `[-h, h]` (a fraction of the colour circle). On a 1-channel image saturation and hue
do nothing.""",
    "JITTER_ARGS": """\
brightness: `b` of the brightness factor (`x * f`). Defaults to `0.4`.
contrast: `b` of the contrast factor (blend with the mean gray). Defaults to `0.4`.
saturation: `b` of the saturation factor (blend with the grayscale image). Defaults to
    `0.4`.
hue: the largest hue shift, in [0, 0.5]. Defaults to `0.1`.""",
    "BLUR": """\
Separable, with reflected borders (torchvision's `GaussianBlur`). The kernel has
`2 * (kernel_size // 2) + 1` taps (at most the image's shorter side, so that its border
can be reflected).""",
    "BLUR_ARGS": """\
sigma: standard deviation of the Gaussian, in pixels (> 0).
kernel_size: the kernel's size, or `None` for 10% of the image's shorter side
    (SimCLR's). Defaults to `None`.""",
    "SIMCLR": """\
SimCLR's augmentation (Chen et al., 2020), in this order: a random resized crop to
`size x size` (`random_resized_crop`), a horizontal flip with probability 1/2, a colour
jitter (brightness, contrast and saturation `0.8 * s`, hue `0.2 * s`) with probability
`jitter_probability`, grayscale with probability `grayscale_probability`, a Gaussian blur
(sigma uniform in [0.1, 2.0], the kernel 10% of `size`) with probability
`blur_probability`, and a solarization with probability `solarize_probability`.""",
    "SIMCLR_ARGS": """\
size: side of the output view in pixels.
scale: the range of the crop's area share. Defaults to `(0.08, 1.0)`.
flip: whether to flip left-right with probability 1/2. Defaults to `True`.
jitter_strength: SimCLR's colour strength `s`, in [0, 2.5]. Defaults to `1.0`.
jitter_probability: probability of the colour jitter. Defaults to `0.8`.
grayscale_probability: probability of grayscale. Defaults to `0.2`.
blur_probability: probability of the blur. Defaults to `0.5` (SimCLR on ImageNet;
    its CIFAR-10 runs leave the blur out: `0.0`).
solarize_probability: probability of the solarization. Defaults to `0.0`.
preprocess: backbone normalization of the [0, 255] view, see `get_preprocess` of
    `tfdml.data.numpy_augment` (`tfdml.data.augment`). Defaults to `None` (float32).""",
    "BARLOW": """\
Barlow Twins' augmentations (Zbontar et al., 2021), asymmetric: a random resized crop, a
flip with probability 1/2, a colour jitter (brightness 0.4, contrast 0.4, saturation 0.2,
hue 0.1) with probability 0.8 and grayscale with probability 0.2; then view 1 is always
blurred and never solarized, view 2 blurred with probability 0.1 and solarized with
probability 0.2.""",
    "BARLOW_ARGS": """\
size: side of the output view in pixels.
view: `1` or `2`, the view whose blur and solarization probabilities to use.
    Defaults to `1`.
scale: the range of the crop's area share. Defaults to `(0.08, 1.0)`.
flip: whether to flip left-right with probability 1/2. Defaults to `True`.
preprocess: backbone normalization, as in `simclr_augmenter`. Defaults to `None`.""",
    "REFERENCE": """\
Reference:
    Chen et al., "A Simple Framework for Contrastive Learning of Visual Representations",
    ICML 2020 (SimCLR). Zbontar et al., "Barlow Twins: Self-Supervised Learning via
    Redundancy Reduction", ICML 2021.""",
}


# -- argument checks, shared with tfdml.data.views ------------------------------------------


def check_pair(name, value, low, high=None):
    """`value` as a `(lo, hi)` pair of floats with `low < lo <= hi` (and `hi <= high` when
    `high` is given); else a ValueError naming `name`."""
    try:
        lo, hi = (float(v) for v in value)
    except (TypeError, ValueError):
        lo = hi = math.nan
    if not (low < lo <= hi and math.isfinite(hi) and (high is None or hi <= high)):
        bound = f"in ({low:g}, {high:g}]" if high is not None else f"> {low:g}"
        raise ValueError(f"`{name}` must be two numbers (lo, hi) {bound} with lo <= hi. "
                         f"Received: {name}={value!r}")
    return lo, hi


def check_jitter(brightness, contrast, saturation, hue):
    """The colour jitter's strengths as floats: three in [0, inf) and the hue in [0, 0.5]."""
    values = [check_number(name, value, low=0, finite=True) for name, value in (
        ("brightness", brightness), ("contrast", contrast), ("saturation", saturation))]
    return (*values, check_number("hue", hue, low=0, high=0.5))


def view_settings(size, scale, flip, jitter, jitter_probability, grayscale_probability,
                  blur_probability, solarize_probability):
    """The settings of one view, checked (ValueErrors naming the argument), as a dict."""
    probabilities = {"jitter_probability": jitter_probability,
                     "grayscale_probability": grayscale_probability,
                     "blur_probability": blur_probability,
                     "solarize_probability": solarize_probability}
    return {"size": check_int("size", size), "scale": check_pair("scale", scale, 0, 1),
            "flip": bool(flip), "jitter": check_jitter(*jitter),
            **{name: check_number(name, p, 0, 1) for name, p in probabilities.items()}}


def simclr_settings(size, scale, flip, jitter_strength, jitter_probability,
                    grayscale_probability, blur_probability, solarize_probability):
    """`view_settings` of SimCLR's augmentation with colour strength `jitter_strength`."""
    s = check_number("jitter_strength", jitter_strength, 0, 2.5)
    return view_settings(size, scale, flip, (0.8 * s, 0.8 * s, 0.8 * s, 0.2 * s),
                         jitter_probability, grayscale_probability, blur_probability,
                         solarize_probability)


def barlow_settings(size, view, scale, flip):
    """`view_settings` of Barlow Twins' view `view` (1 or 2)."""
    if view not in (1, 2) or isinstance(view, bool):
        raise ValueError(f"`view` must be 1 or 2. Received: view={view!r}")
    blur, solarize_p = (1.0, 0.0) if view == 1 else (0.1, 0.2)
    return view_settings(size, scale, flip, (0.4, 0.4, 0.2, 0.1), 0.8, 0.2, blur, solarize_p)


def blur_radius(side, kernel_size):
    """The blur's radius (`kernel_size // 2`, `None`: a tenth of `side` halved), at most
    `side - 1` so that the border can be reflected."""
    size = side // 10 if kernel_size is None else check_int("kernel_size", kernel_size)
    return max(0, min(size // 2, side - 1))


# -- the ops --------------------------------------------------------------------------------


def _image(image, dtype=None):
    image = np.asarray(image, dtype)
    if image.ndim != 3:
        raise ValueError(f"`image` must have shape [H, W, C]. Received: shape {image.shape}")
    return image


def _float(image):
    return _image(image, np.float32)


def _rng(rng):
    return rng if rng is not None else np.random.default_rng()


def _channels(image, what):
    channels = image.shape[-1]
    if channels not in (1, 3):
        raise ValueError(f"`{what}` needs images with 1 or 3 channels. Received: an image "
                         f"of shape {list(image.shape)}")
    return channels


def random_crop_box(height, width, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), rng=None):
    """The box of `random_resized_crop` in a `height x width` image.

    Args:
        height: the image's height in pixels.
        width: the image's width in pixels.
        scale: the range of the box's area share. Defaults to `(0.08, 1.0)`.
        ratio: the range of the box's aspect ratio (width / height). Defaults to
            `(3/4, 4/3)`.
        rng: a `numpy.random.Generator`, or `None` for a fresh one. Defaults to `None`.

    Returns:
        `(top, left, box_height, box_width)`, ints.

    Examples:

    >>> tfdml.data.numpy_views.random_crop_box(32, 32, rng=np.random.default_rng(0))
    (1, 0, 28, 24)
    """
    height, width = check_int("height", height), check_int("width", width)
    (s_lo, s_hi), (r_lo, r_hi) = check_pair("scale", scale, 0, 1), check_pair("ratio", ratio, 0)
    rng = _rng(rng)
    area = height * width
    for _ in range(CROP_TRIES):
        target = area * rng.uniform(s_lo, s_hi)
        aspect = math.exp(rng.uniform(math.log(r_lo), math.log(r_hi)))
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            top, left = int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1))
            return top, left, h, w
    if width / height < r_lo:
        w, h = width, min(height, max(1, round(width / r_lo)))
    elif width / height > r_hi:
        w, h = min(width, max(1, round(height * r_hi))), height
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


@fill_doc(**DOCS)
def random_resized_crop(image, size, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), rng=None):
    """A random crop of a random area and aspect ratio, resized to `size x size`.

    {CROP}

    Args:
        image: `[H, W, C]` image, any numeric dtype.
        size: side of the output in pixels.
        scale: the range of the crop's area share. Defaults to `(0.08, 1.0)`.
        ratio: the range of the crop's aspect ratio (width / height). Defaults to
            `(3/4, 4/3)`.
        rng: a `numpy.random.Generator`, or `None` for a fresh one. Defaults to `None`.

    Returns:
        float32 `[size, size, C]`, in the image's value range.

    Examples:

    >>> image = np.zeros([40, 50, 3], np.uint8)
    >>> tfdml.data.numpy_views.random_resized_crop(image, 16).shape
    (16, 16, 3)
    """
    check_int("size", size)
    image = _image(image)
    top, left, h, w = random_crop_box(image.shape[0], image.shape[1], scale, ratio, rng)
    return numpy_augment.resize(image[top:top + h, left:left + w], size)


def to_grayscale(image):
    """The luma of an image (ITU-R 601 weights), in as many channels as the image had.

    Args:
        image: `[H, W, C]` image, `C` 1 (returned as float32) or 3.

    Returns:
        float32 `[H, W, C]`: the three channels of an RGB image all hold its luma
        `0.2989 R + 0.587 G + 0.114 B`.
    """
    image = _float(image)
    if _channels(image, "to_grayscale") == 1:
        return image
    gray = image @ np.asarray(GRAY_WEIGHTS, np.float32)
    return np.repeat(gray[..., None], 3, axis=-1)


def solarize(image, threshold=0.5):
    """Inverts the pixels at or above `threshold`: `x -> 1 - x` (an image in [0, 1]).

    Args:
        image: `[H, W, C]` image in [0, 1].
        threshold: the pixels `>= threshold` are inverted. Defaults to `0.5` (PIL's 128).

    Returns:
        float32 `[H, W, C]`.
    """
    image = _float(image)
    return np.where(image >= np.float32(threshold), 1 - image, image).astype(np.float32)


@fill_doc(**DOCS)
def gaussian_blur(image, sigma, kernel_size=None):
    """Blurs an image with a Gaussian.

    {BLUR}

    Args:
        image: `[H, W, C]` image.
        {BLUR_ARGS}

    Returns:
        float32 `[H, W, C]`.

    Examples:

    >>> tfdml.data.numpy_views.gaussian_blur(np.ones([32, 32, 3]), 1.0)[0, 0]
    array([1., 1., 1.], dtype=float32)
    """
    image = _float(image)
    sigma = check_number("sigma", sigma, low=0, low_open=True, finite=True)
    radius = blur_radius(min(image.shape[:2]), kernel_size)
    if radius == 0:
        return image.copy()
    x = np.arange(-radius, radius + 1, dtype=np.float32)
    kernel = np.exp(-(x * x) / np.float32(2 * sigma * sigma))
    kernel = (kernel / kernel.sum()).astype(np.float32)
    padded = np.pad(image, [(radius, radius), (radius, radius), (0, 0)], mode="reflect")
    windows = np.lib.stride_tricks.sliding_window_view(padded, 2 * radius + 1, axis=0)
    rows = windows @ kernel  # [H, W + 2r, C]
    windows = np.lib.stride_tricks.sliding_window_view(rows, 2 * radius + 1, axis=1)
    return (windows @ kernel).astype(np.float32)


def adjust_brightness(image, factor):
    """`x * factor`, clipped to [0, 1] (an image in [0, 1], float32 out)."""
    return np.clip(_float(image) * np.float32(factor), 0, 1).astype(np.float32)


def _blend(image, other, factor):
    factor = np.float32(factor)
    return np.clip(factor * image + (1 - factor) * other, 0, 1).astype(np.float32)


def adjust_contrast(image, factor):
    """Blends an image in [0, 1] with its mean gray: `f * x + (1 - f) * mean(gray)`,
    clipped to [0, 1] (float32 out)."""
    image = _float(image)
    _channels(image, "adjust_contrast")
    return _blend(image, to_grayscale(image).mean(dtype=np.float32), factor)


def adjust_saturation(image, factor):
    """Blends an RGB image in [0, 1] with its grayscale: `f * x + (1 - f) * gray`, clipped
    to [0, 1]; a 1-channel image is returned as it is (float32 out)."""
    image = _float(image)
    if _channels(image, "adjust_saturation") == 1:
        return image
    return _blend(image, to_grayscale(image), factor)


def rgb_to_hsv(image):
    """`[..., 3]` RGB in [0, 1] to HSV, each in [0, 1] (hue a fraction of the circle)."""
    r, g, b = np.moveaxis(image, -1, 0)
    value = image.max(axis=-1)
    delta = value - image.min(axis=-1)
    saturation = np.where(value > 0, delta / np.where(value > 0, value, 1), 0)
    safe = np.where(delta > 0, delta, 1)
    hue = np.where(value == r, (g - b) / safe,
                   np.where(value == g, 2 + (b - r) / safe, 4 + (r - g) / safe))
    hue = np.where(delta > 0, (hue / 6) % 1, 0)
    return np.stack([hue, saturation, value], axis=-1).astype(np.float32)


def hsv_to_rgb(image):
    """`[..., 3]` HSV (each in [0, 1]) to RGB in [0, 1]."""
    h, s, v = np.moveaxis(image, -1, 0)
    sector = h * 6
    i = np.floor(sector).astype(np.int64) % 6
    f = sector - np.floor(sector)
    p, q, t = v * (1 - s), v * (1 - s * f), v * (1 - s * (1 - f))
    choices = [(v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q)]
    channels = [np.choose(i, [c[k] for c in choices]) for k in range(3)]
    return np.stack(channels, axis=-1).astype(np.float32)


def adjust_hue(image, delta):
    """Shifts the hue of an RGB image in [0, 1] by `delta` (a fraction of the colour
    circle, in [-0.5, 0.5]) through HSV; a 1-channel image is returned as it is."""
    image = _float(image)
    if _channels(image, "adjust_hue") == 1:
        return image
    hsv = rgb_to_hsv(image)
    hsv[..., 0] = (hsv[..., 0] + np.float32(delta)) % 1
    return np.clip(hsv_to_rgb(hsv), 0, 1)


@fill_doc(**DOCS)
def color_jitter(image, brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1, rng=None):
    """Random brightness, contrast, saturation and hue, in a random order.

    {JITTER}

    Args:
        image: `[H, W, C]` image in [0, 1], `C` 1 or 3.
        {JITTER_ARGS}
        rng: a `numpy.random.Generator`, or `None` for a fresh one. Defaults to `None`.

    Returns:
        float32 `[H, W, C]` in [0, 1].

    Examples:

    >>> image = np.full([8, 8, 3], 0.5, np.float32)
    >>> tfdml.data.numpy_views.color_jitter(image, rng=np.random.default_rng(0)).shape
    (8, 8, 3)
    """
    b, c, s, h = check_jitter(brightness, contrast, saturation, hue)
    image = _float(image)
    _channels(image, "color_jitter")
    rng = _rng(rng)
    order = rng.permutation(4)
    factors = [rng.uniform(max(0.0, 1 - x), 1 + x) for x in (b, c, s)] + [rng.uniform(-h, h)]
    ops = (adjust_brightness, adjust_contrast, adjust_saturation, adjust_hue)
    for k in order:
        image = ops[k](image, factors[k])
    return image


# -- the augmenters -------------------------------------------------------------------------


def _augmenter(settings, preprocess):
    normalize = numpy_augment.get_preprocess(preprocess)
    s = settings

    def fn(image, rng=None):
        rng = _rng(rng)
        image = numpy_augment.to_pixels(_image(image)) / np.float32(255)
        image = random_resized_crop(image, s["size"], s["scale"], rng=rng)
        if s["flip"] and rng.random() < 0.5:
            image = image[:, ::-1]
        if rng.random() < s["jitter_probability"]:
            image = color_jitter(image, *s["jitter"], rng=rng)
        if rng.random() < s["grayscale_probability"]:
            image = to_grayscale(image)
        if rng.random() < s["blur_probability"]:
            image = gaussian_blur(image, rng.uniform(*BLUR_SIGMA))
        if rng.random() < s["solarize_probability"]:
            image = solarize(image)
        return normalize(np.clip(image, 0, 1) * np.float32(255))

    fn.settings = settings
    return fn


@fill_doc(**DOCS)
def simclr_augmenter(size, *, scale=(0.08, 1.0), flip=True, jitter_strength=1.0,
                     jitter_probability=0.8, grayscale_probability=0.2, blur_probability=0.5,
                     solarize_probability=0.0, preprocess=None):
    """One random view of an image, as SimCLR augments it.

    {SIMCLR}

    Args:
        {SIMCLR_ARGS}

    Returns:
        A function `fn(image, rng=None)` from an `[H, W, C]` image in [0, 255] (any dtype;
        uint16 is read as 16 bits) to a float32 `[size, size, C]` view in [0, 255], then
        `preprocess` (`C = 3` for a 1-channel image and a backbone's `preprocess`).

    Raises:
        ValueError: on a bad argument, naming it.

    Examples:

    >>> fn = tfdml.data.numpy_views.simclr_augmenter(24)
    >>> fn(np.zeros([32, 32, 3], np.uint8), rng=np.random.default_rng(0)).shape
    (24, 24, 3)

    {REFERENCE}
    """
    settings = simclr_settings(size, scale, flip, jitter_strength, jitter_probability,
                               grayscale_probability, blur_probability, solarize_probability)
    return _augmenter(settings, preprocess)


@fill_doc(**DOCS)
def barlow_augmenter(size, *, view=1, scale=(0.08, 1.0), flip=True, preprocess=None):
    """One random view of an image, as Barlow Twins augments view 1 or view 2.

    {BARLOW}

    Args:
        {BARLOW_ARGS}

    Returns:
        A function `fn(image, rng=None)`, as `simclr_augmenter`'s.

    Examples:

    >>> fn = tfdml.data.numpy_views.barlow_augmenter(24, view=2)
    >>> fn(np.zeros([32, 32, 3], np.uint8)).shape
    (24, 24, 3)

    {REFERENCE}
    """
    return _augmenter(barlow_settings(size, view, scale, flip), preprocess)


class TwoViews:
    """Two views of an image: `views(image, rng) -> (first(image), second(image))`.

    Each view has its own random draws (from `rng` in turn), so the two views of an
    image differ even when `first` and `second` are the same augmenter.

    Args:
        first: the augmenter of the first view, `fn(image, rng=None)`.
        second: the augmenter of the second view, or `None` for `first` again. Defaults
            to `None`.

    Examples:

    >>> views = tfdml.data.numpy_views.TwoViews(tfdml.data.numpy_views.simclr_augmenter(16))
    >>> v1, v2 = views(np.zeros([32, 32, 3], np.uint8), np.random.default_rng(0))
    >>> v1.shape, v2.shape
    ((16, 16, 3), (16, 16, 3))
    """

    def __init__(self, first, second=None):
        if not callable(first):
            raise ValueError(f"`first` must be callable. Received: first={first!r}")
        if second is not None and not callable(second):
            raise ValueError(f"`second` must be callable or None. Received: second={second!r}")
        self.first = first
        self.second = first if second is None else second

    def __call__(self, image, rng=None):
        """`(view1, view2)` of `image`, the draws from `rng` (`None`: a fresh generator)."""
        rng = _rng(rng)
        return self.first(image, rng=rng), self.second(image, rng=rng)


@fill_doc(**DOCS)
def simclr_views(size, **kwargs):
    """SimCLR's two views: `TwoViews(simclr_augmenter(size, **kwargs))`.

    Args:
        size: side of the views in pixels.
        **kwargs: the other arguments of `simclr_augmenter`.

    Returns:
        A `TwoViews`.

    {REFERENCE}
    """
    return TwoViews(simclr_augmenter(size, **kwargs))


@fill_doc(**DOCS)
def barlow_views(size, **kwargs):
    """Barlow Twins' two views: view 1 and view 2 of `barlow_augmenter`.

    Args:
        size: side of the views in pixels.
        **kwargs: the other arguments of `barlow_augmenter` (but `view`).

    Returns:
        A `TwoViews`.

    {REFERENCE}
    """
    if "view" in kwargs:
        raise ValueError("`barlow_views` makes both views: it takes no `view`. "
                         f"Received: view={kwargs['view']!r}")
    return TwoViews(barlow_augmenter(size, view=1, **kwargs),
                    barlow_augmenter(size, view=2, **kwargs))
