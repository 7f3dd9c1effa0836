"""The augmentations of self-supervised learning (SimCLR, Barlow Twins), written once for
NumPy and ``tf.data``: steps as in :mod:`tfdml.data._augment_steps` (the backend first, a
``random`` argument where they draw), the public functions of ``tfdml.data.numpy_views``
and ``tfdml.data.views`` (`PUBLIC`, and `two_views_class`).
"""

from __future__ import annotations

import functools
import math

from tfdml._argument_checks import check_int, check_number
from tfdml._docs import fill_doc
from tfdml.data._augment_steps import as_image, document, get_preprocess, public, resize, to_pixels

#: The steps that are public functions of ``numpy_views`` and ``views``.
PUBLIC = ("adjust_brightness", "adjust_contrast", "adjust_hue", "adjust_saturation",
          "barlow_augmenter", "barlow_views", "color_jitter", "gaussian_blur", "random_crop_box",
          "random_resized_crop", "simclr_augmenter", "simclr_views", "solarize", "to_grayscale")

#: ITU-R 601 luma weights of R, G and B (those of ``tf.image.rgb_to_grayscale``).
GRAY_WEIGHTS = (0.2989, 0.5870, 0.1140)

#: The range of the Gaussian blur's sigma that the augmenters draw from (SimCLR, BYOL).
BLUR_SIGMA = (0.1, 2.0)

#: Tries of `random_crop_box` before it falls back to the central crop (Inception's).
CROP_TRIES = 10

DOCS = {
    "BOX_ARGS": """\
scale: the range of the crop's area share. Defaults to `(0.08, 1.0)`.
ratio: the range of the crop's aspect ratio (width / height). Defaults to `(3/4, 4/3)`.
{random}: {random_doc}""",
    "REFERENCE": """\
Reference:
    Chen et al., "A Simple Framework for Contrastive Learning of Visual Representations",
    ICML 2020 (SimCLR). Zbontar et al., "Barlow Twins: Self-Supervised Learning via
    Redundancy Reduction", ICML 2021.""",
}


# -- argument checks ----------------------------------------------------------------------------


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


def _float_image(ops, image):
    return ops.float32(as_image(ops, image))


def _channels(ops, image, what):
    channels = image.shape[-1]
    if channels not in (1, 3):
        raise ValueError(f"`{what}` needs images with 1 or 3 channels. Received: an image "
                         f"of shape {list(image.shape)}")
    return channels


# -- the ops ------------------------------------------------------------------------------------


@fill_doc(**DOCS)
def random_crop_box(ops, height, width, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), random=None):
    """The box of `random_resized_crop` in a `height x width` image.

    Args:
        height, width: the image's size in pixels.
        {BOX_ARGS}

    Returns:
        `(top, left, box_height, box_width)`: ints in NumPy, an int32 `[4]` tensor in
        ``tf.data``.
    """
    height, width = ops.count("height", height), ops.count("width", width)
    (s_lo, s_hi), (r_lo, r_hi) = check_pair("scale", scale, 0, 1), check_pair("ratio", ratio, 0)
    randoms = ops.split(random, 4)
    hf, wf = ops.number(height), ops.number(width)

    def attempt(draw):  # an area share, a log-uniform aspect ratio: a box that may fit
        target = hf * wf * draw(0, s_lo, s_hi)
        aspect = ops.exp(draw(1, math.log(r_lo), math.log(r_hi)))
        w = ops.round_int(ops.sqrt(target * aspect))
        h = ops.round_int(ops.sqrt(target / aspect))
        return (w > 0) & (w <= width) & (h > 0) & (h <= height), h, w

    found, (h_try, w_try) = ops.first_fit(randoms, CROP_TRIES, attempt)
    # None fits: the central crop, its aspect ratio clamped to `ratio`.
    fall_h = ops.select(wf / hf < r_lo, lambda: ops.clip(ops.round_int(wf / r_lo), 1, height),
                        lambda: height)
    fall_w = ops.select(wf / hf > r_hi, lambda: ops.clip(ops.round_int(hf * r_hi), 1, width),
                        lambda: width)
    h = ops.select(found, lambda: h_try, lambda: fall_h)
    w = ops.select(found, lambda: w_try, lambda: fall_w)
    top = ops.select(found, lambda: ops.integer(randoms[2], 0, height - h + 1),
                     lambda: (height - h) // 2)
    left = ops.select(found, lambda: ops.integer(randoms[3], 0, width - w + 1),
                      lambda: (width - w) // 2)
    return ops.pack([top, left, h, w])


@fill_doc(**DOCS)
def random_resized_crop(ops, image, size, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3),
                        random=None):
    """A random crop of a random area and aspect ratio, resized to `size x size`.

    Inception's crop: up to 10 tries draw an area share in `scale` and a log-uniform aspect
    ratio (width / height) in `ratio`; the first box that fits in the image is taken,
    at a uniform position. If none fits, the central crop whose aspect ratio is clamped to
    `ratio` is taken. The crop is then resized (bilinear, half-pixel centres, as
    `{augment}.resize`) to `size x size`.

    Args:
        image: `[H, W, C]` image, any numeric dtype.
        size: side of the output in pixels.
        {BOX_ARGS}

    Returns:
        float32 `[size, size, C]`, in the image's value range.

    Examples:

    >>> tuple({views}.random_resized_crop(np.zeros([40, 50, 3], np.uint8), 16, {draw}).shape)
    (16, 16, 3)
    """
    check_int("size", size)
    image = as_image(ops, image)
    height, width = ops.height_width(image)
    box = random_crop_box(ops, height, width, scale, ratio, random)  # top, left, h, w
    return resize(ops, image[box[0]:box[0] + box[2], box[1]:box[1] + box[3]], size)


def to_grayscale(ops, image):
    """The luma of an image (ITU-R 601 weights), in as many channels as the image had.

    Args:
        image: `[H, W, C]` image, `C` 1 (returned as float32) or 3.

    Returns:
        float32 `[H, W, C]`: the three channels of an RGB image all hold its luma
        `0.2989 R + 0.587 G + 0.114 B` (the weights of ``tf.image.rgb_to_grayscale``).
    """
    image = _float_image(ops, image)
    if _channels(ops, image, "to_grayscale") == 1:
        return image
    return ops.to_rgb(ops.luma(image, GRAY_WEIGHTS))


def solarize(ops, image, threshold=0.5):
    """Inverts the pixels at or above `threshold`: `x -> 1 - x` (an image in [0, 1]).

    Args:
        image: `[H, W, C]` image in [0, 1].
        threshold: the pixels `>= threshold` are inverted. Defaults to `0.5` (PIL's 128).

    Returns:
        float32 `[H, W, C]`.
    """
    image = _float_image(ops, image)
    return ops.where(image >= ops.float32(threshold), 1 - image, image)


def gaussian_blur(ops, image, sigma, kernel_size=None):
    """Blurs an image with a Gaussian.

    Separable, with reflected borders (torchvision's `GaussianBlur`). The kernel has
    `2 * (kernel_size // 2) + 1` taps (at most the image's shorter side, so that its border
    can be reflected).

    Args:
        image: `[H, W, C]` image.
        sigma: standard deviation of the Gaussian, in pixels (> 0).
        kernel_size: the kernel's size, or `None` for 10% of the image's shorter side
            (SimCLR's). Defaults to `None`.

    Returns:
        float32 `[H, W, C]`.

    Examples:

    >>> np.asarray({views}.gaussian_blur(np.ones([32, 32, 3]), 1.0))[0, 0]
    array([1., 1., 1.], dtype=float32)
    """
    image = _float_image(ops, image)
    static = ops.static(sigma)
    if static is not None:
        check_number("sigma", static, low=0, low_open=True, finite=True)
    side = ops.minimum(*ops.height_width(image))
    size = side // 10 if kernel_size is None else check_int("kernel_size", kernel_size)
    radius = ops.maximum(0, ops.minimum(size // 2, side - 1))
    sigma = ops.number(sigma)
    x = ops.arange(-radius, radius + 1)
    kernel = ops.exp(-(x * x) / ops.float32(2 * sigma * sigma))
    return ops.blur(image, kernel / ops.total(kernel), radius)


def adjust_brightness(ops, image, factor):
    """`x * factor`, clipped to [0, 1] (an image in [0, 1], float32 out)."""
    return ops.clip(_float_image(ops, image) * ops.float32(factor), 0, 1)


def _blend(ops, image, other, factor):
    factor = ops.float32(factor)
    return ops.clip(factor * image + (1 - factor) * other, 0, 1)


def adjust_contrast(ops, image, factor):
    """Blends an image in [0, 1] with its mean gray: `f * x + (1 - f) * mean(gray)`,
    clipped to [0, 1] (float32 out; not ``tf.image.adjust_contrast``, whose mean is per
    channel)."""
    image = _float_image(ops, image)
    _channels(ops, image, "adjust_contrast")
    return _blend(ops, image, ops.mean(to_grayscale(ops, image)), factor)


def adjust_saturation(ops, image, factor):
    """Blends an RGB image in [0, 1] with its grayscale: `f * x + (1 - f) * gray`, clipped
    to [0, 1]; a 1-channel image is returned as it is (float32 out)."""
    image = _float_image(ops, image)
    if _channels(ops, image, "adjust_saturation") == 1:
        return image
    return _blend(ops, image, to_grayscale(ops, image), factor)


def adjust_hue(ops, image, delta):
    """Shifts the hue of an RGB image in [0, 1] by `delta` (a fraction of the colour
    circle, in [-0.5, 0.5]) through HSV, clipped to [0, 1]; a 1-channel image is returned
    as it is (float32 out)."""
    image = _float_image(ops, image)
    if _channels(ops, image, "adjust_hue") == 1:
        return image
    return ops.clip(ops.shift_hue(image, ops.float32(delta)), 0, 1)


def color_jitter(ops, image, brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1,
                 random=None):
    """Random brightness, contrast, saturation and hue, in a random order.

    As torchvision's `ColorJitter`: the four adjustments in a random order, each factor
    drawn uniformly: brightness, contrast and saturation in `[max(0, 1 - b), 1 + b]`, the
    hue shift in `[-h, h]` (a fraction of the colour circle). On a 1-channel image
    saturation and hue do nothing.

    Args:
        image: `[H, W, C]` image in [0, 1], `C` 1 or 3.
        brightness: `b` of the brightness factor (`x * f`). Defaults to `0.4`.
        contrast: `b` of the contrast factor (blend with the mean gray). Defaults to `0.4`.
        saturation: `b` of the saturation factor (blend with the grayscale image). Defaults
            to `0.4`.
        hue: the largest hue shift, in [0, 0.5]. Defaults to `0.1`.
        {random}: {random_doc}

    Returns:
        float32 `[H, W, C]` in [0, 1].

    Examples:

    >>> tuple({views}.color_jitter(np.full([8, 8, 3], 0.5, np.float32), {draw}).shape)
    (8, 8, 3)
    """
    b, c, s, h = check_jitter(brightness, contrast, saturation, hue)
    image = _float_image(ops, image)
    _channels(ops, image, "color_jitter")
    randoms = ops.split(random, 5)
    order = ops.permutation(randoms[0], 4)
    ranges = [(max(0.0, 1 - x), 1 + x) for x in (b, c, s)] + [(-h, h)]
    factors = [ops.uniform(r, low, high) for r, (low, high) in zip(randoms[1:], ranges,
                                                                     strict=True)]
    adjust = (adjust_brightness, adjust_contrast, adjust_saturation, adjust_hue)
    return ops.in_order(image, [functools.partial(_adjusted, ops, op, f) for op, f in zip(
        adjust, factors, strict=True)], order)


def _adjusted(ops, op, factor, image):
    return op(ops, image, factor)


# -- the augmenters -----------------------------------------------------------------------------


def _augmenter(ops, settings, preprocess):
    normalize = get_preprocess(ops, preprocess)
    s = settings

    def fn(image, random=None):
        randoms = ops.split(random, 9)
        image = to_pixels(ops, as_image(ops, image)) / 255
        image = random_resized_crop(ops, image, s["size"], s["scale"], random=randoms[0])
        if s["flip"]:
            image = ops.random_flip(image, randoms[1])
        image = ops.maybe(s["jitter_probability"], randoms[2], lambda x: color_jitter(
            ops, x, *s["jitter"], random=randoms[3]), image)
        image = ops.maybe(s["grayscale_probability"], randoms[4],
                          functools.partial(to_grayscale, ops), image)
        image = ops.maybe(s["blur_probability"], randoms[5], lambda x: gaussian_blur(
            ops, x, ops.uniform(randoms[6], *BLUR_SIGMA)), image)
        image = ops.maybe(s["solarize_probability"], randoms[7],
                          functools.partial(solarize, ops), image)
        return normalize(ops.clip(image, 0, 1) * 255)

    fn = public(ops, fn)
    fn.settings = settings
    return fn


@fill_doc(**DOCS)
def simclr_augmenter(ops, size, *, scale=(0.08, 1.0), flip=True, jitter_strength=1.0,
                     jitter_probability=0.8, grayscale_probability=0.2, blur_probability=0.5,
                     solarize_probability=0.0, preprocess=None):
    """One random view of an image, as SimCLR augments it.

    SimCLR's augmentation (Chen et al., 2020), in this order: a random resized crop to
    `size x size` (`random_resized_crop`), a horizontal flip with probability 1/2, a colour
    jitter (brightness, contrast and saturation `0.8 * s`, hue `0.2 * s`) with probability
    `jitter_probability`, grayscale with probability `grayscale_probability`, a Gaussian
    blur (sigma uniform in [0.1, 2.0], the kernel 10% of `size`) with probability
    `blur_probability`, and a solarization with probability `solarize_probability`.

    Args:
        size: side of the output view in pixels.
        scale: the range of the crop's area share. Defaults to `(0.08, 1.0)`.
        flip: whether to flip left-right with probability 1/2. Defaults to `True`.
        jitter_strength: SimCLR's colour strength `s`, in [0, 2.5]. Defaults to `1.0`.
        jitter_probability: probability of the colour jitter. Defaults to `0.8`.
        grayscale_probability: probability of grayscale. Defaults to `0.2`.
        blur_probability: probability of the blur. Defaults to `0.5` (SimCLR on ImageNet;
            its CIFAR-10 runs leave the blur out: `0.0`).
        solarize_probability: probability of the solarization. Defaults to `0.0`.
        preprocess: backbone normalization of the [0, 255] view, see
            `{augment}.get_preprocess`. Defaults to `None` (float32).

    Returns:
        A function `fn(image, {random}=None)` from an `[H, W, C]` image in [0, 255] (any
        dtype; uint16 is read as 16 bits) to a float32 `[size, size, C]` view in [0, 255],
        then `preprocess` (`C = 3` for a 1-channel image and a backbone's `preprocess`);
        the same `{random}` gives the same view.

    Raises:
        ValueError: on a bad argument, naming it.

    Examples:

    >>> fn = {views}.simclr_augmenter(24)
    >>> tuple(fn(np.zeros([32, 32, 3], np.uint8), {draw}).shape)
    (24, 24, 3)

    {REFERENCE}
    """
    s = check_number("jitter_strength", jitter_strength, 0, 2.5)
    settings = view_settings(size, scale, flip, (0.8 * s, 0.8 * s, 0.8 * s, 0.2 * s),
                             jitter_probability, grayscale_probability, blur_probability,
                             solarize_probability)
    return _augmenter(ops, settings, preprocess)


@fill_doc(**DOCS)
def barlow_augmenter(ops, size, *, view=1, scale=(0.08, 1.0), flip=True, preprocess=None):
    """One random view of an image, as Barlow Twins augments view 1 or view 2.

    Barlow Twins' augmentations (Zbontar et al., 2021), asymmetric: a random resized crop,
    a flip with probability 1/2, a colour jitter (brightness 0.4, contrast 0.4, saturation
    0.2, hue 0.1) with probability 0.8 and grayscale with probability 0.2; then view 1 is
    always blurred and never solarized, view 2 blurred with probability 0.1 and solarized
    with probability 0.2.

    Args:
        size: side of the output view in pixels.
        view: `1` or `2`, the view whose blur and solarization probabilities to use.
            Defaults to `1`.
        scale: the range of the crop's area share. Defaults to `(0.08, 1.0)`.
        flip: whether to flip left-right with probability 1/2. Defaults to `True`.
        preprocess: backbone normalization, as in `simclr_augmenter`. Defaults to `None`.

    Returns:
        A function `fn(image, {random}=None)`, as `simclr_augmenter`'s.

    Examples:

    >>> fn = {views}.barlow_augmenter(24, view=2)
    >>> tuple(fn(np.zeros([32, 32, 3], np.uint8), {draw}).shape)
    (24, 24, 3)

    {REFERENCE}
    """
    if view not in (1, 2) or isinstance(view, bool):
        raise ValueError(f"`view` must be 1 or 2. Received: view={view!r}")
    blur, solarize_p = (1.0, 0.0) if view == 1 else (0.1, 0.2)
    settings = view_settings(size, scale, flip, (0.4, 0.4, 0.2, 0.1), 0.8, 0.2, blur,
                             solarize_p)
    return _augmenter(ops, settings, preprocess)


@functools.cache
def two_views_class(ops):
    """The class `TwoViews` of the backend `ops` (the public one of ``numpy_views``)."""

    class TwoViews:
        """Two views of an image: `views(image, {random}) -> (first(image), second(image))`.

        Each view has its own random draws, so the two views of an image differ even when
        `first` and `second` are the same augmenter.

        Args:
            first: the augmenter of the first view, `fn(image, {random}=None)`.
            second: the augmenter of the second view, or `None` for `first` again.
                Defaults to `None`.

        Examples:

        >>> views = {views}.simclr_views(16)
        >>> v1, v2 = views(np.zeros([32, 32, 3], np.uint8), {draw})
        >>> tuple(v1.shape), tuple(v2.shape)
        ((16, 16, 3), (16, 16, 3))
        """

        def __init__(self, first, second=None):
            if not callable(first):
                raise ValueError(f"`first` must be callable. Received: first={first!r}")
            if second is not None and not callable(second):
                raise ValueError(
                    f"`second` must be callable or None. Received: second={second!r}")
            self.first = first
            self.second = first if second is None else second

        def __call__(self, image, random=None):
            first, second = ops.split(random, 2)
            return self.first(image, first), self.second(image, second)

    TwoViews.__call__ = public(ops, TwoViews.__call__)
    TwoViews.__module__, TwoViews.__qualname__ = ops.DOC["views"], "TwoViews"
    TwoViews.__doc__ = document(ops, TwoViews.__doc__)
    return TwoViews


@fill_doc(**DOCS)
def simclr_views(ops, size, **kwargs):
    """SimCLR's two views: `TwoViews(simclr_augmenter(size, **kwargs))`, a function
    `views(image, {random}=None) -> (view1, view2)` whose views each have their own draws.

    Args:
        size: side of the views in pixels.
        **kwargs: the other arguments of `simclr_augmenter`.

    Returns:
        A `TwoViews`.

    {REFERENCE}
    """
    return two_views_class(ops)(simclr_augmenter(ops, size, **kwargs))


@fill_doc(**DOCS)
def barlow_views(ops, size, **kwargs):
    """Barlow Twins' two views: view 1 and view 2 of `barlow_augmenter`, as a function
    `views(image, {random}=None) -> (view1, view2)`.

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
    return two_views_class(ops)(barlow_augmenter(ops, size, view=1, **kwargs),
                                barlow_augmenter(ops, size, view=2, **kwargs))
