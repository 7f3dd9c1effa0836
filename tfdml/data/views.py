"""Two augmented views of each image for self-supervised learning, as ``tf.data`` map functions.

The augmentations of `tfdml.data.numpy_views` (SimCLR's and Barlow Twins'), made from the
same steps (:mod:`tfdml.data._view_steps`) over the TensorFlow backend, with stateless
random ops: `seed` is a shape `[2]` integer tensor, the same seed gives the same output
(the draws differ from the NumPy module's). Every function is graph-compatible (usable in
``tf.data.Dataset.map`` and ``tf.function``).

* The ops, on `[H, W, C]` float images in [0, 1] (`C` 1 or 3, known when traced):
  `random_resized_crop`, `random_crop_box`, `color_jitter`, `adjust_brightness`,
  `adjust_contrast`, `adjust_saturation`, `adjust_hue`, `to_grayscale`, `gaussian_blur`,
  `solarize`.
* `simclr_augmenter`, `barlow_augmenter`: one view, `fn(image, seed=None)`, from an image
  in [0, 255] (any dtype; uint16 is read as 16 bits) to float32 [0, 255] pixels, then
  `preprocess`.
* `simclr_views`, `barlow_views`: both views, `fn(image, seed=None) -> (view1, view2)`,
  each view with its own seed split from `seed`.
* `two_view_batches`: a seeded ``tf.data`` pipeline of `((view1, view2),)` batches.
"""

from __future__ import annotations

from tfdml._tensorflow import tf
from tfdml.data import _augment_steps, _tf_backend, _view_steps
from tfdml.data.two_view_dataset import check_dataset

__all__ = [*_view_steps.PUBLIC, "two_view_batches"]
globals().update(_augment_steps.bind(_tf_backend, __name__, _view_steps))


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
