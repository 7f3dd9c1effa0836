"""The P x K batches as a ``tf.data`` pipeline: P classes per batch, K examples of each.

`PKSampler` (`tfdml.data.pk`) draws the indices; `pk_batches` turns them into a lazy
``tf.data`` pipeline that reads, decodes, augments and batches the images.
"""

from __future__ import annotations

import itertools
import logging

import numpy as np

from tfdml._argument_checks import check_int
from tfdml._docs import fill_doc
from tfdml._tensorflow import tf
from tfdml.data import augment
from tfdml.data.pk import PKSampler, check_initial_epoch
from tfdml.data.source import CATEGORIES_DOC, check_source, source_categories, takes_argument

__all__ = ["eval_batches", "pk_batches"]

logger = logging.getLogger("tfdml.data")

_ON_ERROR = ("raise", "skip")

def _convert_channels(images, channels):
    """In-memory image(s) with `channels` channels (checked by `check_in_memory_channels`)."""
    if channels is None or images.shape[-1] == channels:
        return images
    if channels == 3:
        return tf.image.grayscale_to_rgb(images)
    return tf.image.rgb_to_grayscale(images)


def _decode(kind, item, channels):
    """One image from a file path, encoded bytes, or the image itself (graph code)."""
    if kind == "paths":
        item = tf.io.read_file(item)
    if kind in ("paths", "encoded"):
        return tf.io.decode_image(item, channels=channels or 3, expand_animations=False)
    return _convert_channels(item, channels)


def _mapped(map_fn, image, **kwargs):
    """`map_fn(image, **kwargs)` as a tensor, or a ValueError naming `map_fn` (raised when
    the pipeline is built: ``tf.data`` traces its map functions then) if it returns None or
    something that is not a tensor."""
    out = map_fn(image, **kwargs)
    if out is not None:
        try:
            return tf.convert_to_tensor(out)
        except (TypeError, ValueError):
            pass
    what = "None" if out is None else f"a {type(out).__name__}"
    raise ValueError(
        f"`map_fn` must return the image as a tensor. Received: map_fn={map_fn!r} returned "
        f"{what} (a function without `return`?)"
    )


@fill_doc(CATEGORIES=CATEGORIES_DOC)
def pk_batches(source, classes_per_batch, samples_per_class, *, small_classes="replace",
               min_class_size=2, steps_per_epoch=None, repeat=True, drop_remainder=False,
               seed=None, map_fn=None, crop_to_bbox=False, channels=None, on_error="raise",
               num_parallel_calls=tf.data.AUTOTUNE, prefetch=tf.data.AUTOTUNE,
               initial_epoch=0, categories=None, categories_per_batch=None):
    """A lazy ``tf.data`` pipeline of P x K batches for metric learning.

    Each batch is `(images, labels)`: `P * K` images, `K` of each of `P` distinct classes
    (grouped by class), and their int64 class ids. With `[N, L]` multi-hot labels the
    sampler draws P labels and K images carrying each, and the labels of a batch are the
    `[P*K, L]` int64 multi-hot rows of its images. Indices are drawn by a `PKSampler`
    (see it for what an epoch is and how small classes are handled); images are read,
    decoded, cropped to their bounding box, and passed to `map_fn` in parallel map steps,
    one batch at a time: never all images in memory.

    Use it in `model.fit(dataset, epochs=E, steps_per_epoch=S)`. The default dataset is
    endless (`repeat=True`); take S from `PKSampler(...).steps_per_epoch` for one visit of
    every class per epoch, or choose it. With `repeat=False` the dataset is one epoch of
    `steps_per_epoch` batches, and each new iteration over it (each Keras epoch) draws
    fresh batches, so `model.fit(dataset, epochs=E)` works without `steps_per_epoch`.

    Args:
        source: a `tfdml.data.DatasetSplit` (image paths, encoded bytes or in-memory
            images), a `(features, labels)` tuple of arrays (in-memory images or any
            numeric features), or a `(paths, labels)` tuple (a sequence of file paths;
            a sequence of `bytes` is read as encoded images).
        classes_per_batch: P.
        samples_per_class: K.
        small_classes: `"replace"` or `"skip"`, for classes with fewer than K examples.
            Defaults to `"replace"`.
        min_class_size: classes with fewer examples are left out (and counted in a log
            message). Defaults to `2` (single-example classes are skipped).
        steps_per_epoch: batches per epoch, or `None` for `ceil(C / P)` (every class once).
            Defaults to `None`.
        repeat: endless dataset (`True`) or one epoch per iteration (`False`).
            Defaults to `True`.
        drop_remainder: leave out the `C mod P` classes left over in an epoch instead of
            topping up the last batch with other classes. Defaults to `False`.
        seed: integer seed of the index sampling and of the per-element augmentation seeds;
            the same seed gives the same batches. `None` draws one. Defaults to `None`.
        map_fn: preprocessing / augmentation applied to each decoded image, e.g.
            `tfdml.data.augment.train_transform(...)`. Called as `map_fn(image, seed=s)`
            with a per-element shape `[2]` int64 seed if it has a `seed` parameter, else
            as `map_fn(image)`. Must be graph-compatible and return images of one shape
            (returning None raises a `ValueError` naming `map_fn` when the pipeline is
            built). Defaults to `None` (decoded uint8 images, which must then all have
            one shape; a 16-bit file keeps the high byte of each value, `v >> 8`).
        crop_to_bbox: crop each image to its `DatasetSplit.bboxes` box before `map_fn`.
            Defaults to `False`.
        channels: the number of channels of the images, or `None`. Image files and
            encoded images are decoded with this many channels (`None`: 3, so grayscale
            files come as RGB). In-memory images are converted: 1 to 3 channels by
            `tf.image.grayscale_to_rgb`, 3 to 1 by `tf.image.rgb_to_grayscale`; other
            conversions raise a `ValueError`, and `None` leaves them as they are.
            Defaults to `None`.
        on_error: what to do with an image that cannot be read or decoded (or on which
            `map_fn` fails): `"raise"` an `InvalidArgumentError` naming the file, or
            `"skip"` it with a warning naming the file (logger `"tfdml.data"`) and put
            another image of the same class in the batch in its slot, so the batch is still
            P x K. If every image of a class in a batch fails, an error is raised even with
            `"skip"`. Each batch is decoded on a fast path first; only a batch with a failure
            is decoded again image by image to find the files. Encoded images are named
            `"<name>/<split>: encoded image <index>"`. Defaults to `"raise"`.
        num_parallel_calls: parallelism of the decode / augment map. Defaults to
            `tf.data.AUTOTUNE`.
        prefetch: batches to prefetch, `tf.data.AUTOTUNE`, or `0`/`None` for none.
            Defaults to `tf.data.AUTOTUNE`.
        initial_epoch: the sampler epoch the first iteration starts with. With
            `repeat=False` each later iteration draws the following epoch, so a run
            resumed at Keras epoch `e` that passes `initial_epoch=e` (as to `model.fit`)
            gets the batches an uninterrupted run would have had. (With `repeat=True`
            the endless stream starts with epoch `e`'s batches, but its later batches
            differ from those of a stream started at 0.) Defaults to `0`.
        {CATEGORIES}

    Returns:
        A `tf.data.Dataset` of `(images [P*K, ...], labels [P*K] int64)` (labels
        `[P*K, L]` for multi-hot labels).

    Raises:
        ValueError: on a bad argument (see also `PKSampler`), an inverted bounding box
            (`ymax < ymin` or `xmax < xmin`), or a `map_fn` that returns None.

    Examples:

    >>> x = np.random.rand(60, 8, 8, 1).astype("float32")
    >>> y = np.repeat(np.arange(12), 5)
    >>> ds = tfdml.data.pk_batches((x, y), 4, 3, seed=0)
    >>> images, labels = next(iter(ds))
    >>> images.shape, labels.shape
    (TensorShape([12, 8, 8, 1]), TensorShape([12]))
    >>> rgb = tfdml.data.pk_batches((x, y), 4, 3, seed=0, channels=3)  # grayscale to RGB
    >>> next(iter(rgb))[0].shape
    TensorShape([12, 8, 8, 3])
    >>> kinds = np.arange(12) % 3  # the category of each class id 0 ... 11
    >>> hard = tfdml.data.pk_batches((x, y), 4, 3, seed=0, categories=kinds,
    ...                              categories_per_batch=2)  # two categories per batch
    """
    if on_error not in _ON_ERROR:
        raise ValueError(f"`on_error` must be one of {_ON_ERROR}. Received: on_error={on_error!r}")
    channels, kind, items, labels, bboxes, name = check_source(source, map_fn, channels,
                                                               crop_to_bbox)
    sampler = PKSampler(labels, classes_per_batch, samples_per_class, small_classes=small_classes,
                        min_class_size=min_class_size, steps_per_epoch=steps_per_epoch,
                        drop_remainder=drop_remainder, seed=seed,
                        categories=source_categories(source, categories),
                        categories_per_batch=categories_per_batch)
    initial_epoch = check_initial_epoch(initial_epoch)
    use_bbox = bool(crop_to_bbox)
    batch, steps = sampler.batch_size, sampler.steps_per_epoch
    ds = _sampled_batches(sampler, kind, items, name, bboxes if use_bbox else None,
                          repeat, initial_epoch)
    if kind == "images" and map_fn is None and not use_bbox:
        ds = ds.map(lambda x, y, *rest: (_convert_channels(x, channels), y))
    else:
        load_one, hint = _image_loader(kind, items, channels, map_fn, use_bbox)
        if kind == "images":
            ds = _flat_pipeline(ds, load_one, batch, num_parallel_calls)
        else:
            ds = ds.interleave(
                _decoding_batch_fn(batch, load_one, num_parallel_calls, on_error, hint,
                                   sampler.samples_per_class),
                cycle_length=2, block_length=1, num_parallel_calls=tf.data.AUTOTUNE,
                deterministic=True)
    # Tell Keras the length: one epoch of `steps` batches, or endless.
    ds = ds.apply(tf.data.experimental.assert_cardinality(
        steps if not repeat else tf.data.INFINITE_CARDINALITY))
    if prefetch:
        ds = ds.prefetch(prefetch)
    return ds


def _sampled_batches(sampler, kind, items, name, bboxes, repeat, initial_epoch):
    """The sampler's batches as a ``tf.data`` dataset of undecoded items.

    Each element is ``(items [B, ...], labels [B] (or [B, L] multi-hot) int64, batch seed
    [2] int64, names [B] string, boxes [B, 4] float32)``: the items as the source holds
    them (in-memory images, file paths or encoded bytes), the names that error messages
    give for them, and the bounding boxes (zeros when ``bboxes`` is None).
    """
    batch = sampler.batch_size
    steps = sampler.steps_per_epoch
    labels = np.asarray(sampler.labels, dtype=np.int64)
    use_bbox = bboxes is not None
    boxes = np.asarray(bboxes, dtype=np.float32) if use_bbox else np.zeros((1, 4), np.float32)
    iteration = itertools.count(int(initial_epoch))
    if kind == "paths":
        names = items
    else:
        names = np.asarray([f"{name}: encoded image {i}" for i in range(len(labels))], dtype=object)

    def generate():
        # Every new iteration of the dataset (e.g. every Keras epoch with repeat=False) starts
        # from the next epoch number, so it draws fresh batches; a new pipeline starts at
        # `initial_epoch`.
        epoch = next(iteration)
        gen = sampler.iter_batches(epoch)
        if not repeat:
            gen = itertools.islice(gen, steps)
        for idx, batch_seed in gen:
            yield (items[idx], labels[idx], batch_seed, names[idx],
                   boxes[idx] if use_bbox else np.zeros((batch, 4), np.float32))

    if kind == "images":
        item_spec = tf.TensorSpec([batch, *items.shape[1:]], tf.as_dtype(items.dtype))
    else:
        item_spec = tf.TensorSpec([batch], tf.string)
    spec = (item_spec, tf.TensorSpec([batch, *labels.shape[1:]], tf.int64),
            tf.TensorSpec([2], tf.int64),
            tf.TensorSpec([batch], tf.string), tf.TensorSpec([batch, 4], tf.float32))
    return tf.data.Dataset.from_generator(generate, output_signature=spec)


def _image_loader(kind, items, channels, map_fn, use_bbox):
    """``(load_one, hint)``: ``load_one(item, bbox, seed)`` decodes one item, crops it to its
    box and applies ``map_fn`` (graph code); ``hint`` is what a decoding error adds.

    Without ``map_fn``, files are batched as decoded: one of another shape than the first
    image fails like a file that cannot be decoded, and the error (with ``hint``) names it.
    """
    pass_seed = map_fn is not None and takes_argument(map_fn, "seed")
    first_shape = None
    if kind != "images" and map_fn is None and not use_bbox:
        try:
            first_shape = tf.shape(_decode(kind, items[0], channels))
        except (tf.errors.OpError, ValueError):
            first_shape = None  # the first file itself is bad: reported when it is drawn
    hint = "" if first_shape is None else (
        "; without map_fn, an image of another shape than the first image's "
        f"{first_shape.numpy().tolist()} fails too: pass a map_fn that resizes, e.g. "
        "augment.train_transform")

    def load_one(item, bbox, elem_seed):
        image = _decode(kind, item, channels)
        if use_bbox:
            image = augment.crop_to_bbox(image, bbox)
        if map_fn is not None:
            image = _mapped(map_fn, image, **({"seed": elem_seed} if pass_seed else {}))
        if first_shape is not None:
            same = tf.reduce_all(tf.equal(tf.shape(image), first_shape))
            with tf.control_dependencies([tf.debugging.Assert(same, ["shape differs"])]):
                image = tf.identity(image)
        return image

    return load_one, hint


def _flat_pipeline(ds, load_one, batch, num_parallel_calls):
    """In-memory images (nothing can fail to decode): unbatch, one parallel map, batch."""

    def explode(items, y, batch_seed, names, bbox):
        return items, y, tf.tile(batch_seed[None], [batch, 1]), tf.range(batch), bbox

    def load(item, y, seed, slot, bbox):
        return load_one(item, bbox, tf.random.experimental.stateless_fold_in(seed, slot)), y

    ds = ds.map(explode).unbatch()
    ds = ds.map(load, num_parallel_calls=num_parallel_calls, deterministic=True)
    return ds.batch(batch)


def _decoding_batch_fn(batch, load_one, num_parallel_calls, on_error, hint="",
                       samples_per_class=1):
    """Returns the interleave function that reads and decodes one batch of files.

    Each batch first takes the fast path: a parallel map and a batch, with errors ignored
    at the batch level (cheap). Only if that batch failed does it take the slow path, which
    decodes the batch again element by element with errors ignored per element, finds the
    files that failed, and raises an error naming them or (`on_error="skip"`) puts another
    image of the same class (of the same group of `samples_per_class` slots) in their slots
    (`_fill`). Per-element `ignore_errors` on every batch would cost about a third of the
    throughput.
    """

    def one_batch(items, y, batch_seed, names, bbox):
        def element(slot, item, box):
            elem_seed = tf.random.experimental.stateless_fold_in(batch_seed, slot)
            return load_one(item, box, elem_seed), slot

        elements = tf.data.Dataset.from_tensor_slices((tf.range(batch), items, bbox))
        fast = elements.map(element, num_parallel_calls=num_parallel_calls, deterministic=True)
        fast = fast.batch(batch).map(lambda imgs, slots: (imgs, y)).ignore_errors()

        slow = elements.map(element, num_parallel_calls=num_parallel_calls,
                            deterministic=True).ignore_errors().batch(batch)
        # If every image of the batch failed, `slow` is empty: fail loudly instead of
        # silently yielding one batch less.
        image_spec = slow.element_spec[0]

        def all_failed(_):
            check = tf.debugging.Assert(
                False, ["pk_batches: no image of this batch could be read or decoded:", names],
                summarize=batch)
            with tf.control_dependencies([check]):
                shape = [0 if d is None else d for d in image_spec.shape]
                shape[0] = 0
                return tf.zeros(shape, image_spec.dtype), tf.zeros([0], tf.int32)

        slow = slow.concatenate(tf.data.Dataset.from_tensors(0).map(all_failed)).take(1)
        slow = slow.map(lambda imgs, got: _fill(imgs, got, names, y, batch, on_error, hint,
                                                samples_per_class))
        return fast.concatenate(slow).take(1)

    return one_batch


def _log_skipped(names):
    names = [n.decode() if isinstance(n, bytes) else str(n) for n in names.numpy()]
    for n in names:
        logger.warning("pk_batches: could not read or decode image %s; skipped, replaced by "
                       "another image of the same class in the batch.", n)
    return np.int32(len(names))


def _fill(images, got, names, labels, batch, on_error, hint="", samples_per_class=1):
    """Puts the decoded images back in slot order. With `on_error="raise"` a failed slot
    raises an error naming its file; with `"skip"` it takes the first decoded image of its
    class in the batch (of its group of `samples_per_class` slots, the K images drawn for
    one class or label), and its labels (an error if there is none)."""
    present = tf.scatter_nd(got[:, None], tf.ones_like(got, tf.bool), [batch])
    position = tf.scatter_nd(got[:, None], tf.range(tf.shape(got)[0]), [batch])
    missing_names = tf.boolean_mask(names, tf.logical_not(present))
    if on_error == "raise":
        check = tf.debugging.Assert(
            tf.reduce_all(present),
            ["pk_batches: could not read or decode image(s) (or map_fn failed on them"
             f"{hint}):",
             missing_names, "; on_error='skip' skips such files."],
            summarize=batch,
        )
        with tf.control_dependencies([check]):
            return tf.gather(images, position), tf.identity(labels)
    group = tf.range(batch) // samples_per_class
    same = tf.equal(group[:, None], group[None, :]) & present[None, :]
    has_substitute = tf.reduce_any(same, axis=1)
    check = tf.debugging.Assert(
        tf.reduce_all(has_substitute),
        ["pk_batches: every image of a class in this batch failed to read or decode:",
         tf.boolean_mask(names, tf.logical_not(has_substitute))],
        summarize=batch,
    )
    source_slot = tf.where(present, tf.range(batch),
                           tf.argmax(tf.cast(same, tf.int32), axis=1, output_type=tf.int32))
    logged = tf.cond(
        tf.reduce_any(tf.logical_not(present)),
        lambda: tf.py_function(_log_skipped, [missing_names], tf.int32),
        lambda: tf.constant(0, tf.int32),
    )
    with tf.control_dependencies([check, logged]):
        return tf.gather(images, tf.gather(position, source_slot)), tf.gather(labels, source_slot)


def eval_batches(source, batch_size=256, *, map_fn=None, crop_to_bbox=False, channels=None,
                 num_parallel_calls=tf.data.AUTOTUNE, prefetch=tf.data.AUTOTUNE):
    """Every example of ``source`` once, in order, in batches: for embedding a test split.

    Images are read, decoded, cropped to their box and passed to ``map_fn`` lazily, as
    in :func:`pk_batches` (a file that cannot be read raises). Without shuffling, the
    labels of the batches concatenated are ``source``'s labels.

    Args:
        source: as in :func:`pk_batches`.
        batch_size: images per batch (the last batch may be smaller). Defaults to `256`.
        map_fn: ``fn(image) -> image`` evaluation transform, e.g.
            ``tfdml.data.augment.eval_transform(...)``. Defaults to `None`.
        crop_to_bbox: crop each image to its ``DatasetSplit.bboxes`` box first.
            Defaults to `False`.
        channels: channels of the images, as in :func:`pk_batches` (files are decoded
            with this many channels, `None`: 3; in-memory images are converted 1 -> 3 or
            3 -> 1, `None`: as they are). Defaults to `None`.
        num_parallel_calls: parallelism of the decode map. Defaults to `tf.data.AUTOTUNE`.
        prefetch: batches to prefetch, or `0`/`None` for none. Defaults to `tf.data.AUTOTUNE`.

    Returns:
        A `tf.data.Dataset` of ``(images, labels int64)``.

    Raises:
        ValueError: on a bad argument, an inverted bounding box, or a ``map_fn`` that
            returns None (when the pipeline is built).

    Example:

    >>> test = tfdml.datasets.load("digits", "test")
    >>> ds = tfdml.data.eval_batches(test, 128)
    >>> sum(int(y.shape[0]) for _, y in ds) == len(test)
    True
    """
    batch_size = check_int("batch_size", batch_size)
    channels, kind, items, labels, bboxes, _ = check_source(source, map_fn, channels,
                                                            crop_to_bbox)
    labels = np.asarray(labels, dtype=np.int64)
    if kind != "images":
        items = np.asarray(items, dtype=object).astype(bytes)
    boxes = (np.asarray(bboxes, np.float32) if crop_to_bbox
             else np.zeros((len(labels), 4), np.float32))
    ds = tf.data.Dataset.from_tensor_slices((items, labels, boxes))

    def load(item, label, box):
        image = _decode(kind, item, channels)
        if crop_to_bbox:
            image = augment.crop_to_bbox(image, box)
        if map_fn is not None:
            image = _mapped(map_fn, image)
        return image, label

    ds = ds.map(load, num_parallel_calls=num_parallel_calls, deterministic=True)
    ds = ds.batch(batch_size)
    if prefetch:
        ds = ds.prefetch(prefetch)
    return ds
