"""Two augmented views of each image for self-supervised learning, as ``tf.data`` map functions.

The augmentations of `tfdml.data.numpy_views` (SimCLR's and Barlow Twins'), with
stateless random ops: `seed` is a shape `[2]` integer tensor, the same seed gives the same
output (the draws differ from the NumPy module's). Every function is graph-compatible
(usable in ``tf.data.Dataset.map`` and ``tf.function``).

* The ops, on `[H, W, C]` float images in [0, 1] (`C` 1 or 3, known when traced):
  `random_resized_crop`, `random_crop_box`, `color_jitter`, `adjust_brightness`,
  `adjust_contrast`, `adjust_saturation`, `adjust_hue`, `to_grayscale`, `gaussian_blur`,
  `solarize`.
* `simclr_augmenter`, `barlow_augmenter`: one view, `fn(image, seed=None)`, from an image
  in [0, 255] (any dtype; uint16 is read as 16 bits) to float32 [0, 255] pixels, then
  `preprocess`.
* `simclr_views`, `barlow_views`: both views, `fn(image, seed=None) -> (view1, view2)`.
* `two_view_batches`: a seeded ``tf.data`` pipeline of `((view1, view2),)` batches.
"""

from __future__ import annotations

import math

from tfdml._argument_checks import check_int, check_number
from tfdml._docs import fill_doc
from tfdml._tensorflow import tf
from tfdml.data import augment
from tfdml.data import numpy_views as _numpy_views
from tfdml.data.two_view_dataset import check_dataset

__all__ = ["adjust_brightness", "adjust_contrast", "adjust_hue", "adjust_saturation",
           "barlow_augmenter", "barlow_views", "color_jitter", "gaussian_blur", "random_crop_box",
           "random_resized_crop", "simclr_augmenter", "simclr_views", "solarize", "to_grayscale",
           "two_view_batches"]

DOCS = _numpy_views.DOCS


_seed = augment.seed_or_random


def _split(seed, n):
    return tf.unstack(tf.random.experimental.stateless_split(_seed(seed), n))


def _float(image):
    image = tf.convert_to_tensor(image)
    if image.shape.rank != 3:
        raise ValueError(f"`image` must have shape [H, W, C]. Received: shape {image.shape}")
    return tf.cast(image, tf.float32) if image.dtype != tf.float32 else image


def _channels(image, what):
    channels = image.shape[-1]
    if channels not in (1, 3):
        raise ValueError(f"`{what}` needs images with 1 or 3 channels (known when traced). "
                         f"Received: an image of shape {image.shape}")
    return channels


def random_crop_box(height, width, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), seed=None):
    """The box of `random_resized_crop` in a `height x width` image (stateless).

    As `tfdml.data.numpy_views.random_crop_box`: up to 10 tries, then the central crop.

    Args:
        height: the image's height in pixels (an int or a scalar tensor).
        width: the image's width in pixels.
        scale: the range of the box's area share. Defaults to `(0.08, 1.0)`.
        ratio: the range of the box's aspect ratio (width / height). Defaults to
            `(3/4, 4/3)`.
        seed: shape `[2]` integer seed, or `None` for a random one. Defaults to `None`.

    Returns:
        int32 `[4]`: `(top, left, box_height, box_width)`.

    Examples:

    >>> tfdml.data.views.random_crop_box(32, 32, seed=(1, 2)).shape
    TensorShape([4])
    """
    (s_lo, s_hi) = _numpy_views.check_pair("scale", scale, 0, 1)
    (r_lo, r_hi) = _numpy_views.check_pair("ratio", ratio, 0)
    seeds = _split(seed, 4)
    height, width = tf.cast(height, tf.int32), tf.cast(width, tf.int32)
    hf, wf = tf.cast(height, tf.float32), tf.cast(width, tf.float32)
    tries = _numpy_views.CROP_TRIES
    target = hf * wf * tf.random.stateless_uniform([tries], seeds[0], s_lo, s_hi)
    aspect = tf.exp(tf.random.stateless_uniform([tries], seeds[1], math.log(r_lo),
                                                math.log(r_hi)))
    w = tf.cast(tf.round(tf.sqrt(target * aspect)), tf.int32)
    h = tf.cast(tf.round(tf.sqrt(target / aspect)), tf.int32)
    fits = (w > 0) & (w <= width) & (h > 0) & (h <= height)
    first = tf.reduce_min(tf.where(fits, tf.range(tries), tries))
    found, pick = first < tries, tf.minimum(first, tries - 1)
    shape_ratio = wf / hf
    narrow, wide = shape_ratio < r_lo, shape_ratio > r_hi

    def clamp(value, high):
        return tf.clip_by_value(tf.cast(tf.round(value), tf.int32), 1, high)

    fall_h = tf.where(narrow, clamp(wf / r_lo, height), height)
    fall_w = tf.where(wide, clamp(hf * r_hi, width), width)
    h, w = tf.where(found, h[pick], fall_h), tf.where(found, w[pick], fall_w)
    top = tf.random.stateless_uniform([], seeds[2], 0, height - h + 1, dtype=tf.int32)
    left = tf.random.stateless_uniform([], seeds[3], 0, width - w + 1, dtype=tf.int32)
    top = tf.where(found, top, (height - h) // 2)
    left = tf.where(found, left, (width - w) // 2)
    return tf.stack([top, left, h, w])


@fill_doc(**DOCS)
def random_resized_crop(image, size, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), seed=None):
    """A random crop of a random area and aspect ratio, resized to `size x size` (stateless).

    {CROP}

    Args:
        image: `[H, W, C]` image, any numeric dtype.
        size: side of the output in pixels.
        scale: the range of the crop's area share. Defaults to `(0.08, 1.0)`.
        ratio: the range of the crop's aspect ratio (width / height). Defaults to
            `(3/4, 4/3)`.
        seed: shape `[2]` integer seed, or `None` for a random one. Defaults to `None`.

    Returns:
        float32 `[size, size, C]`, in the image's value range.

    Examples:

    >>> tfdml.data.views.random_resized_crop(tf.zeros([40, 50, 3]), 16, seed=(0, 1)).shape
    TensorShape([16, 16, 3])
    """
    check_int("size", size)
    image = _float(image)
    shape = tf.shape(image)
    box = random_crop_box(shape[0], shape[1], scale, ratio, seed)
    return augment.resize(image[box[0]:box[0] + box[2], box[1]:box[1] + box[3]], size)


def to_grayscale(image):
    """The luma of an image (ITU-R 601 weights), in as many channels as it had (float32).

    As `tfdml.data.numpy_views.to_grayscale` (the weights of ``tf.image.rgb_to_grayscale``,
    repeated over three channels); a 1-channel image is returned as float32.

    Examples:

    >>> tfdml.data.views.to_grayscale(tf.ones([4, 4, 3])).shape
    TensorShape([4, 4, 3])
    """
    image = _float(image)
    if _channels(image, "to_grayscale") == 1:
        return image
    weights = tf.constant(_numpy_views.GRAY_WEIGHTS, tf.float32)
    return tf.repeat(tf.reduce_sum(image * weights, axis=-1, keepdims=True), 3, axis=-1)


def solarize(image, threshold=0.5):
    """Inverts the pixels at or above `threshold`: `x -> 1 - x` (an image in [0, 1]).

    Args:
        image: `[H, W, C]` image in [0, 1].
        threshold: the pixels `>= threshold` are inverted. Defaults to `0.5`.

    Returns:
        float32 `[H, W, C]`.
    """
    image = _float(image)
    return tf.where(image >= threshold, 1 - image, image)


@fill_doc(**DOCS)
def gaussian_blur(image, sigma, kernel_size=None):
    """Blurs an image with a Gaussian (as `tfdml.data.numpy_views.gaussian_blur`).

    {BLUR}

    Args:
        image: `[H, W, C]` image.
        {BLUR_ARGS}

    Returns:
        float32 `[H, W, C]`.

    Examples:

    >>> tfdml.data.views.gaussian_blur(tf.ones([32, 32, 3]), 1.0).shape
    TensorShape([32, 32, 3])
    """
    image = _float(image)
    if tf.get_static_value(sigma) is not None:
        check_number("sigma", float(tf.get_static_value(sigma)), low=0, low_open=True,
                     finite=True)
    side = tf.reduce_min(tf.shape(image)[:2])
    size = side // 10 if kernel_size is None else check_int("kernel_size", kernel_size)
    radius = tf.maximum(0, tf.minimum(size // 2, side - 1))
    x = tf.cast(tf.range(-radius, radius + 1), tf.float32)
    sigma = tf.cast(sigma, tf.float32)
    kernel = tf.exp(-(x * x) / (2 * sigma * sigma))
    kernel = kernel / tf.reduce_sum(kernel)
    shape = tf.shape(image)
    rows = tf.einsum("ij,jwc->iwc", _blur_matrix(shape[0], kernel, radius), image)
    out = tf.einsum("kw,iwc->ikc", _blur_matrix(shape[1], kernel, radius), rows)
    return tf.ensure_shape(out, image.shape)


def _blur_matrix(n, kernel, radius):
    """`[n, n]`: the blur along an axis of `n` pixels, its reflected borders folded in (a
    matrix product is much faster on the CPU than ``tf.nn.conv2d`` with one channel)."""
    index = tf.abs(tf.range(n)[:, None] + tf.range(-radius, radius + 1)[None, :])
    index = tf.where(index > n - 1, 2 * (n - 1) - index, index)
    rows = tf.broadcast_to(tf.range(n)[:, None], tf.shape(index))
    pairs = tf.reshape(tf.stack([rows, index], axis=-1), [-1, 2])
    weights = tf.reshape(tf.broadcast_to(kernel[None, :], tf.shape(index)), [-1])
    return tf.scatter_nd(pairs, weights, [n, n])  # repeated (reflected) pixels add up


def adjust_brightness(image, factor):
    """`x * factor`, clipped to [0, 1] (as `tfdml.data.numpy_views.adjust_brightness`)."""
    return tf.clip_by_value(_float(image) * tf.cast(factor, tf.float32), 0, 1)


def _blend(image, other, factor):
    factor = tf.cast(factor, tf.float32)
    return tf.clip_by_value(factor * image + (1 - factor) * other, 0, 1)


def adjust_contrast(image, factor):
    """Blends an image in [0, 1] with its mean gray, clipped to [0, 1] (as
    `tfdml.data.numpy_views.adjust_contrast`; not ``tf.image.adjust_contrast``, whose mean
    is per channel)."""
    image = _float(image)
    _channels(image, "adjust_contrast")
    return _blend(image, tf.reduce_mean(to_grayscale(image)), factor)


def adjust_saturation(image, factor):
    """Blends an RGB image in [0, 1] with its grayscale, clipped to [0, 1]; a 1-channel
    image is returned as it is (as `tfdml.data.numpy_views.adjust_saturation`)."""
    image = _float(image)
    if _channels(image, "adjust_saturation") == 1:
        return image
    return _blend(image, to_grayscale(image), factor)


def adjust_hue(image, delta):
    """Shifts the hue of an RGB image in [0, 1] by `delta` (``tf.image.adjust_hue``); a
    1-channel image is returned as it is."""
    image = _float(image)
    if _channels(image, "adjust_hue") == 1:
        return image
    return tf.clip_by_value(tf.image.adjust_hue(image, tf.cast(delta, tf.float32)), 0, 1)


@fill_doc(**DOCS)
def color_jitter(image, brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1, seed=None):
    """Random brightness, contrast, saturation and hue, in a random order (stateless).

    {JITTER}

    Args:
        image: `[H, W, C]` image in [0, 1], `C` 1 or 3.
        {JITTER_ARGS}
        seed: shape `[2]` integer seed, or `None` for a random one. Defaults to `None`.

    Returns:
        float32 `[H, W, C]` in [0, 1].

    Examples:

    >>> tfdml.data.views.color_jitter(tf.fill([8, 8, 3], 0.5), seed=(0, 1)).shape
    TensorShape([8, 8, 3])
    """
    strengths = _numpy_views.check_jitter(brightness, contrast, saturation, hue)
    image = _float(image)
    _channels(image, "color_jitter")
    seeds = _split(seed, 5)
    order = tf.argsort(tf.random.stateless_uniform([4], seeds[0]))
    ranges = [(max(0.0, 1 - x), 1 + x) for x in strengths[:3]] + [(-strengths[3],
                                                                    strengths[3])]
    factors = [tf.random.stateless_uniform([], s, lo, hi) for s, (lo, hi) in
               zip(seeds[1:], ranges, strict=True)]
    ops = (adjust_brightness, adjust_contrast, adjust_saturation, adjust_hue)
    for position in range(4):  # all four, then one picked: no control flow, fast in tf.data
        candidates = tf.stack([op(image, f) for op, f in zip(ops, factors, strict=True)])
        image = tf.gather(candidates, order[position])
    return image


# -- the augmenters -------------------------------------------------------------------------


def _maybe(probability, seed, op, image):
    if probability <= 0:
        return image
    if probability >= 1:
        return op(image)
    # Computed either way and selected (no control flow: fast in tf.data, and traced once).
    return tf.where(tf.random.stateless_uniform([], seed) < probability, op(image), image)


def _augmenter(settings, preprocess):
    normalize = augment.get_preprocess(preprocess)
    s = settings

    @tf.autograph.experimental.do_not_convert  # no Python control flow on tensors
    def fn(image, seed=None):
        seeds = _split(seed, 9)
        image = tf.convert_to_tensor(image)
        if image.shape.rank != 3:
            raise ValueError(f"`image` must have shape [H, W, C]. Received: shape {image.shape}")
        image = augment.to_pixels(image) / 255
        image = random_resized_crop(image, s["size"], s["scale"], seed=seeds[0])
        if s["flip"]:
            image = tf.image.stateless_random_flip_left_right(image, seeds[1])
        image = _maybe(s["jitter_probability"], seeds[2],
                       lambda x: color_jitter(x, *s["jitter"], seed=seeds[3]), image)
        image = _maybe(s["grayscale_probability"], seeds[4], to_grayscale, image)
        sigma = tf.random.stateless_uniform([], seeds[6], *_numpy_views.BLUR_SIGMA)
        image = _maybe(s["blur_probability"], seeds[5],
                       lambda x: gaussian_blur(x, sigma), image)
        image = _maybe(s["solarize_probability"], seeds[7], solarize, image)
        return normalize(tf.clip_by_value(image, 0, 1) * 255)

    fn.settings = settings
    return fn


@fill_doc(**DOCS)
def simclr_augmenter(size, *, scale=(0.08, 1.0), flip=True, jitter_strength=1.0,
                     jitter_probability=0.8, grayscale_probability=0.2, blur_probability=0.5,
                     solarize_probability=0.0, preprocess=None):
    """One random view of an image, as SimCLR augments it (stateless).

    {SIMCLR}

    Args:
        {SIMCLR_ARGS}

    Returns:
        A function `fn(image, seed=None)` from an `[H, W, C]` image in [0, 255] to a
        float32 `[size, size, C]` view in [0, 255], then `preprocess` (see
        `tfdml.data.augment.get_preprocess`); the same seed gives the same view.

    Raises:
        ValueError: on a bad argument, naming it.

    Examples:

    >>> fn = tfdml.data.views.simclr_augmenter(24)
    >>> fn(tf.zeros([32, 32, 3], tf.uint8), seed=(0, 1)).shape
    TensorShape([24, 24, 3])

    {REFERENCE}
    """
    settings = _numpy_views.simclr_settings(
        size, scale, flip, jitter_strength, jitter_probability, grayscale_probability,
        blur_probability, solarize_probability)
    return _augmenter(settings, preprocess)


@fill_doc(**DOCS)
def barlow_augmenter(size, *, view=1, scale=(0.08, 1.0), flip=True, preprocess=None):
    """One random view of an image, as Barlow Twins augments view 1 or view 2 (stateless).

    {BARLOW}

    Args:
        {BARLOW_ARGS}

    Returns:
        A function `fn(image, seed=None)`, as `simclr_augmenter`'s.

    Examples:

    >>> fn = tfdml.data.views.barlow_augmenter(24, view=2)
    >>> fn(tf.zeros([32, 32, 3], tf.uint8), seed=(0, 1)).shape
    TensorShape([24, 24, 3])

    {REFERENCE}
    """
    return _augmenter(_numpy_views.barlow_settings(size, view, scale, flip), preprocess)


def _two_views(first, second):
    @tf.autograph.experimental.do_not_convert
    def views(image, seed=None):
        first_seed, second_seed = _split(seed, 2)
        return first(image, first_seed), second(image, second_seed)

    views.first, views.second = first, second
    return views


@fill_doc(**DOCS)
def simclr_views(size, **kwargs):
    """SimCLR's two views: `fn(image, seed=None) -> (view1, view2)`, each a
    `simclr_augmenter(size, **kwargs)` view with its own seed (folded in from `seed`).

    Examples:

    >>> v1, v2 = tfdml.data.views.simclr_views(16)(tf.zeros([32, 32, 3]), seed=(0, 1))
    >>> v1.shape
    TensorShape([16, 16, 3])

    {REFERENCE}
    """
    fn = simclr_augmenter(size, **kwargs)
    return _two_views(fn, fn)


@fill_doc(**DOCS)
def barlow_views(size, **kwargs):
    """Barlow Twins' two views: `fn(image, seed=None) -> (view1, view2)`, view 1 and view 2
    of `barlow_augmenter(size, **kwargs)` (which takes no `view` here).

    {REFERENCE}
    """
    if "view" in kwargs:
        raise ValueError("`barlow_views` makes both views: it takes no `view`. "
                         f"Received: view={kwargs['view']!r}")
    return _two_views(barlow_augmenter(size, view=1, **kwargs),
                      barlow_augmenter(size, view=2, **kwargs))


def two_view_batches(images, views, batch_size, seed=None, labels=None, shuffle=True):
    """A seeded ``tf.data`` pipeline of batches of two views of each image.

    The ``tf.data`` twin of `tfdml.data.TwoViewDataset`: each element is
    `((view1 [B, ...], view2 [B, ...]),)`, or `((view1, view2), labels [B])` with
    `labels`; row `i` of both views comes from the same image. The dataset is one pass over
    the images (`N // batch_size` batches, the `N mod B` left over left out); each new
    iteration (each Keras epoch) has a new order (with `shuffle`) and new views. Each
    image's views take their own seed from a seeded random stream: the same `seed` gives
    the same batches, iteration after iteration.

    Args:
        images: `[N, H, W, C]` array (`[N, H, W]`: a channel is added), pixels in [0, 255].
        views: `views(image, seed) -> (view1, view2)`, e.g. `simclr_views(32)`, traced by
            ``tf.data``.
        batch_size: images per batch, at most `N`.
        seed: integer seed of the order and of the views; `None` draws one. Defaults to
            `None`.
        labels: an array of `N` rows given with the views, or `None`. Defaults to `None`.
        shuffle: a new order of the images in each iteration. Defaults to `True`.

    Returns:
        A `tf.data.Dataset`.

    Raises:
        ValueError: on a bad argument, naming it, or (when the pipeline is built) if
            `views` does not return two views.

    Examples:

    >>> x = np.random.randint(0, 256, (100, 32, 32, 3), np.uint8)
    >>> data = tfdml.data.views.two_view_batches(x, tfdml.data.views.simclr_views(24), 16,
    ...                                          seed=0)
    >>> (v1, v2), = next(iter(data))
    >>> v1.shape
    TensorShape([16, 24, 24, 3])
    """
    images, batch_size, seed, labels = check_dataset(images, views, batch_size,
                                                                   seed, labels)
    count = len(images)
    pixels = tf.convert_to_tensor(images)
    targets = None if labels is None else tf.convert_to_tensor(labels)
    order = tf.data.Dataset.range(count)
    if shuffle:
        order = order.shuffle(count, seed=seed, reshuffle_each_iteration=True)
    seeds = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True).batch(2)

    def pair(index, element_seed):
        out = views(tf.gather(pixels, index), element_seed)
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise ValueError("`views` must return two views (view1, view2). Received: "
                             f"views={views!r} returned {type(out).__name__}")
        out = tuple(out)
        return (out,) if targets is None else (out, tf.gather(targets, index))

    data = tf.data.Dataset.zip((order, seeds)).map(pair, num_parallel_calls=tf.data.AUTOTUNE,
                                                    deterministic=True)
    return data.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
