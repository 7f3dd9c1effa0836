"""The TensorFlow backend of the augmentation steps: the names of
:mod:`tfdml.data._numpy_backend`, with TensorFlow ops, for ``tf.data``.

Randomness is a stateless seed (a shape ``[2]`` integer tensor, the public functions'
``seed``): `split` and `fold` derive one seed per draw, so the same seed gives the same
output. Everything is a tensor, parameters float32 or int32; nothing branches on a tensor in
Python, so the steps trace in ``tf.data`` maps and ``tf.function`` (without AutoGraph:
`graph_function`). Where the NumPy backend calls only the branch taken, both are computed
and one is selected.
"""

from __future__ import annotations

import numpy as np

from tfdml._tensorflow import tf

ANY_RANK = True
WRAPS_MODE_FUNCTIONS = True
RGB_BACKBONES = True
graph_function = tf.autograph.experimental.do_not_convert
DOC = {"random": "seed", "draw": "seed=(0, 1)",
       "random_doc": "shape `[2]` integer seed, or `None` for a random one. Defaults to `None`.",
       "augment": "tfdml.data.augment", "views": "tfdml.data.views"}


# -- randomness ---------------------------------------------------------------------------------


def random(seed):
    """``seed`` as a stateless ``tf.random`` seed (int32 or int64), or a random one for
    ``None``."""
    if seed is None:
        return tf.random.uniform([2], 0, 2**31 - 1, dtype=tf.int32)
    seed = tf.convert_to_tensor(seed)
    if seed.dtype not in (tf.int32, tf.int64):
        seed = tf.cast(seed, tf.int64)
    return seed


def split(seed, n):
    return tf.unstack(tf.random.experimental.stateless_split(random(seed), n))


def fold(seed, n):
    seed = random(seed)
    return [tf.random.experimental.stateless_fold_in(seed, i) for i in range(n)]


def uniform(seed, low, high):
    return tf.random.stateless_uniform([], seed, low, high)


def integer(seed, low, high):
    return tf.random.stateless_uniform([], seed, low, high, dtype=tf.int32)


def permutation(seed, n):
    return tf.argsort(tf.random.stateless_uniform([n], seed))


def maybe(probability, seed, op, image):
    if probability <= 0:
        return image
    if probability >= 1:
        return op(image)
    # Computed either way and selected (no control flow: fast in tf.data, and traced once).
    return tf.where(tf.random.stateless_uniform([], seed) < probability, op(image), image)


def first_fit(seeds, tries, attempt):
    """All tries at once (draw `k` from `seeds[k]`, `[tries]` values), the first that fits."""
    fits, *values = attempt(lambda k, low, high: tf.random.stateless_uniform(
        [tries], seeds[k], low, high))
    first = tf.reduce_min(tf.where(fits, tf.range(tries), tries))
    pick = tf.minimum(first, tries - 1)
    return first < tries, [value[pick] for value in values]


def select(condition, if_true, if_false):
    return tf.where(condition, if_true(), if_false())


def in_order(image, functions, order):
    for position in range(len(functions)):  # all of them, then one picked: no control flow
        candidates = tf.stack([fn(image) for fn in functions])
        image = tf.gather(candidates, order[position])
    return image


def random_crop(image, size, seed):
    channels = image.shape[-1] if image.shape[-1] is not None else tf.shape(image)[-1]
    return tf.image.stateless_random_crop(image, [size, size, channels], seed)


def random_flip(image, seed):
    return tf.image.stateless_random_flip_left_right(image, seed)


# -- numbers and tensors ------------------------------------------------------------------------


tensor = tf.convert_to_tensor
exp, sqrt, clip, maximum, minimum, where = (tf.exp, tf.sqrt, tf.clip_by_value, tf.maximum,
                                            tf.minimum, tf.where)
mean, total, pack = tf.reduce_mean, tf.reduce_sum, tf.stack


def height_width(image):
    shape = tf.shape(image)
    return shape[0], shape[1]


def float32(x, copy=False):
    del copy  # tensors are not modified in place
    x = tf.convert_to_tensor(x)
    return x if x.dtype == tf.float32 else tf.cast(x, tf.float32)


number = float32


def static(x):
    """`x`'s value if it is known when traced (a Python number for a scalar), else `None`."""
    value = tf.get_static_value(x)
    return value.item() if isinstance(value, (np.generic, np.ndarray)) and not np.ndim(
        value) else value


def count(name, value):
    del name
    return tf.cast(value, tf.int32)


def round_int(x):
    return tf.cast(tf.round(x), tf.int32)


def floor_int(x):
    return tf.cast(tf.floor(x), tf.int32)


def ceil_int(x):
    return tf.cast(tf.math.ceil(x), tf.int32)


def arange(low, high):
    return tf.cast(tf.range(low, high), tf.float32)


# -- image ops ----------------------------------------------------------------------------------


def resize(image, size):
    return tf.image.resize(image, (size, size) if isinstance(size, int) else size)


def center_crop(image, size):
    return tf.image.resize_with_crop_or_pad(image, size, size)


def pad(image, padding):
    return tf.pad(image, [[padding, padding], [padding, padding], [0, 0]])


def bbox(box, checked):
    """The box as float32; one known only when run is checked by an assertion in the graph."""
    box = tf.cast(tf.convert_to_tensor(box), tf.float32)
    if checked:
        return box
    valid = tf.reduce_all(tf.math.is_finite(box)) & (box[2] >= box[0]) & (box[3] >= box[1])
    check = tf.debugging.Assert(
        valid, ["crop_to_bbox: `bbox` must be four finite numbers (ymin, xmin, ymax, "
                "xmax) with ymin <= ymax and xmin <= xmax. Received: bbox=", box])
    with tf.control_dependencies([check]):
        return tf.identity(box)


def luma(image, weights):
    return tf.reduce_sum(image * tf.constant(weights, tf.float32), axis=-1, keepdims=True)


to_rgb = tf.image.grayscale_to_rgb


def to_rgb_if_gray(image):
    """`to_rgb` when the image turns out to have one channel when run."""
    return tf.cond(tf.equal(tf.shape(image)[-1], 1), lambda: to_rgb(image), lambda: image)


shift_hue = tf.image.adjust_hue


def blur(image, kernel, radius):
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


def keras_normalization(mode):
    """`tfdml.models.get_preprocess` of a mode (Keras' ``preprocess_input`` on a tensor)."""
    from tfdml import models

    return models.get_preprocess(mode)
