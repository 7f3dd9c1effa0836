"""The NumPy backend of the augmentation steps: the primitives they are written against.

The steps (:mod:`tfdml.data._augment_steps`, :mod:`tfdml.data._view_steps`) are written once,
against the functions of a backend module: this one, or :mod:`tfdml.data._tf_backend` (the
same names, with TensorFlow ops for ``tf.data``).

Here randomness is a ``numpy.random.Generator`` (the steps' ``random`` argument, ``rng`` in
the public functions), drawn from in turn: `split` gives the same generator back, so the
draws follow the order in which the steps make them, and a step that is not taken draws
nothing more. A parameter (a factor, a sigma, a box side) stays a Python number, computed
in float64 as with ``math``; an image is a NumPy array.
"""

from __future__ import annotations

import math

import numpy as np

from tfdml._argument_checks import check_int

#: Whether the ops take images of any rank (TensorFlow's take batches); here `[H, W, C]`.
ANY_RANK = False
#: Whether a callable with a `mode` (a function of `tfdml.models.get_preprocess`) gets the
#: 16-bit scaling and the RGB conversion too; here it is used as it is.
WRAPS_MODE_FUNCTIONS = False
#: Whether a Keras Applications backbone of mode "none" converts grayscale to RGB; here no.
RGB_BACKBONES = False


def graph_function(fn):
    """`fn` as the public functions run it: as it is (TensorFlow: without AutoGraph)."""
    return fn


#: The words of the public functions' docstrings: the name of their random argument
#: (`random`), what it is, an example of it (`draw`), this backend's modules.
DOC = {"random": "rng", "draw": "rng=np.random.default_rng(0)",
       "random_doc": "a `numpy.random.Generator`, or `None` for a fresh one. Defaults to `None`.",
       "augment": "tfdml.data.numpy_augment", "views": "tfdml.data.numpy_views"}


# -- randomness ---------------------------------------------------------------------------------


def random(rng):
    """`rng`, or a fresh generator for `None`."""
    return rng if rng is not None else np.random.default_rng()


def split(rng, n):
    """`n` random sources from one: the same generator `n` times (TensorFlow: `n` seeds)."""
    return [random(rng)] * n


fold = split  # TensorFlow derives the seeds otherwise where the steps `fold`


def uniform(rng, low, high):
    return rng.uniform(low, high)


def integer(rng, low, high):
    return int(rng.integers(low, high))


def permutation(rng, n):
    return rng.permutation(n)


def maybe(probability, rng, op, image):
    """`op(image)` with probability `probability`, else `image`."""
    return op(image) if rng.random() < probability else image


def first_fit(randoms, tries, attempt):
    """Up to `tries` calls of `attempt(draw) -> (fits, *values)`, where `draw(k, low, high)`
    draws from `randoms[k]`, until one fits: `(found, values)` (the last try's if none)."""
    for _ in range(tries):
        fits, *values = attempt(lambda k, low, high: randoms[k].uniform(low, high))
        if fits:
            return True, values
    return False, values


def select(condition, if_true, if_false):
    """`if_true()` or `if_false()`: only the one taken is called (TensorFlow: both)."""
    return if_true() if condition else if_false()


def in_order(image, functions, order):
    """`image` through `functions` in the order `order` (indices into `functions`)."""
    for k in order:
        image = functions[k](image)
    return image


def random_crop(image, size, rng):
    """A uniform random `size x size` window of an `[H, W, C]` image with `H, W >= size`."""
    height, width = image.shape[:2]
    if height < size or width < size:
        raise ValueError(
            f"`random_crop` needs an image of at least {size} x {size}. Received: an image "
            f"of shape {image.shape}"
        )
    top = int(rng.integers(0, height - size + 1))
    left = int(rng.integers(0, width - size + 1))
    return image[top:top + size, left:left + size]


def random_flip(image, rng):
    """The image flipped left-right with probability 1/2."""
    return image[:, ::-1] if rng.random() < 0.5 else image


# -- numbers and arrays: Python numbers stay Python numbers -------------------------------------

tensor, where, total, minimum = np.asarray, np.where, np.sum, min


def height_width(image):
    return image.shape[0], image.shape[1]


def float32(x, copy=False):
    """`x` as float32: an array (a new one with `copy`: Keras normalizes NumPy arrays in
    place), or a scalar."""
    x = np.asarray(x)
    return x.astype(np.float32, copy=copy) if x.ndim else np.float32(x)


def number(x):
    """A parameter as the steps compute with it: a Python float."""
    return float(x)


def static(x):
    """`x`'s value if it is known now: always."""
    return x


def count(name, value):
    """`value` as a positive int, or a ValueError naming `name`."""
    return check_int(name, value)


def exp(x):
    return np.exp(x) if isinstance(x, np.ndarray) else math.exp(x)


def sqrt(x):
    return np.sqrt(x) if isinstance(x, np.ndarray) else math.sqrt(x)


def round_int(x):
    """`x` rounded half to even, as ints."""
    return np.round(x).astype(np.int64) if isinstance(x, np.ndarray) else round(x)


def floor_int(x):
    return math.floor(x)


def ceil_int(x):
    return math.ceil(x)


def clip(x, low, high):
    return np.clip(x, low, high) if isinstance(x, np.ndarray) else min(max(x, low), high)


def maximum(x, y):
    return np.maximum(x, y) if isinstance(x, np.ndarray) else max(x, y)


def mean(x):
    return x.mean(dtype=np.float32)


def arange(low, high):
    return np.arange(low, high, dtype=np.float32)


def pack(values):
    """A crop box `(top, left, height, width)`, as a tuple of ints."""
    return tuple(int(v) for v in values)


# -- image ops ----------------------------------------------------------------------------------


def _axis_weights(out_size, in_size):
    """Source rows (low, high) and weights of a half-pixel bilinear resize along one axis."""
    scale = np.float32(in_size) / np.float32(out_size)
    src = (np.arange(out_size, dtype=np.float32) + np.float32(0.5)) * scale - np.float32(0.5)
    low = np.floor(src)
    frac = (src - low).astype(np.float32)
    low = low.astype(np.int64)
    high = np.clip(low + 1, 0, in_size - 1)
    return np.clip(low, 0, in_size - 1), high, frac


def resize(image, size):
    """Bilinear resize with half-pixel centres (``tf.image.resize``'s) of a float32 image to
    `size x size` (an int) or `size = (h, w)`."""
    new_h, new_w = (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))
    y0, y1, fy = _axis_weights(new_h, image.shape[0])
    x0, x1, fx = _axis_weights(new_w, image.shape[1])
    fy, fx = fy[:, None, None], fx[None, :, None]
    top = image[y0][:, x0] * (1 - fx) + image[y0][:, x1] * fx
    bottom = image[y1][:, x0] * (1 - fx) + image[y1][:, x1] * fx
    return (top + (bottom - top) * fy).astype(np.float32)


def center_crop(image, size):
    """The central `size x size` window, padded with zeros where the image is smaller."""
    out = np.zeros((size, size, image.shape[2]), image.dtype)
    height, width = image.shape[:2]
    sy, sx = max((height - size) // 2, 0), max((width - size) // 2, 0)
    dy, dx = max((size - height) // 2, 0), max((size - width) // 2, 0)
    h, w = min(size, height), min(size, width)
    out[dy:dy + h, dx:dx + w] = image[sy:sy + h, sx:sx + w]
    return out


def pad(image, padding):
    return np.pad(image, [(padding, padding), (padding, padding), (0, 0)])


def bbox(box, checked):
    """A box (checked: always here) as float64 numbers."""
    return np.asarray(box, dtype=np.float64)


def luma(image, weights):
    """`[..., 1]`: the channels of `image` weighted by `weights`."""
    return (image @ np.asarray(weights, np.float32))[..., None]


def to_rgb(image):
    """A 1-channel image repeated over three channels."""
    return np.repeat(image, 3, axis=-1)


def to_rgb_if_gray(image):
    """`to_rgb` if the image has one channel (the steps know it here, and do not call it)."""
    return to_rgb(image) if image.shape[-1] == 1 else image


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
    rgb = [np.choose(i, [c[k] for c in choices]) for k in range(3)]
    return np.stack(rgb, axis=-1).astype(np.float32)


def shift_hue(image, delta):
    """An RGB image with its hue shifted by `delta` (a fraction of the circle), through HSV."""
    hsv = rgb_to_hsv(image)
    hsv[..., 0] = (hsv[..., 0] + delta) % 1
    return hsv_to_rgb(hsv)


def blur(image, kernel, radius):
    """The image convolved with `kernel` (`2 * radius + 1` taps) along both axes, with
    reflected borders."""
    if radius == 0:
        return image.copy()
    padded = np.pad(image, [(radius, radius), (radius, radius), (0, 0)], mode="reflect")
    windows = np.lib.stride_tricks.sliding_window_view(padded, 2 * radius + 1, axis=0)
    rows = windows @ kernel  # [H, W + 2r, C]
    windows = np.lib.stride_tricks.sliding_window_view(rows, 2 * radius + 1, axis=1)
    return (windows @ kernel).astype(np.float32)


def keras_normalization(mode):
    """Keras Applications' normalization of a mode on a float32 array (which it modifies in
    place: the steps pass a new one), or `None` for "none"."""
    if mode == "none":
        return None
    from tfdml.models import backbones

    keras_fn = backbones.keras_preprocess_input(mode)
    return lambda image: np.asarray(keras_fn(image), np.float32)
