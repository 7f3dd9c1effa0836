"""Keras `PyDataset`s for every backend, without TensorFlow.

* `PKDataset`: the P x K batches of `tfdml.data.pk_batches` (the same `PKSampler` indices
  for the same seed), read and augmented in NumPy (images decoded with Pillow).
* `EvalDataset`: every example once, in order, as `tfdml.data.eval_batches`.
"""

from __future__ import annotations

import io
import threading

import keras
import numpy as np

from tfdml._argument_checks import check_int
from tfdml._docs import fill_doc
from tfdml.data import numpy_augment
from tfdml.data.pk import PKSampler, check_initial_epoch
from tfdml.data.source import CATEGORIES_DOC, check_source, source_categories, takes_argument

__all__ = ["EvalDataset", "PKDataset"]

_RECENT = 1024  # batches of the stream kept for workers that ask out of order

_GRAY = np.array([0.2989, 0.5870, 0.1140], np.float32)  # tf.image.rgb_to_grayscale's weights


def _convert_channels(image, channels):
    """A NumPy `[H, W, C]` image with `channels` channels (1 <-> 3, as `pk_batches`)."""
    if channels is None or image.shape[-1] == channels:
        return image
    if channels == 3:
        return np.repeat(image, 3, axis=-1)
    gray = image.astype(np.float32) @ _GRAY
    if np.issubdtype(image.dtype, np.integer):
        info = np.iinfo(image.dtype)
        gray = np.clip(np.round(gray), info.min, info.max)
    return gray.astype(image.dtype)[..., None]


class _UnsupportedPixels(ValueError):
    """An image that decodes, to pixels tfdml cannot bring to [0, 255]."""


def _to_8bit(image, name):
    """A Pillow image whose `convert("L")` / `convert("RGB")` keeps its values: a 16-bit
    grayscale image is reduced to its high byte (`v >> 8`), what Pillow itself does for
    16-bit RGB(A) and gray-alpha PNGs and what ``tf.io.decode_image`` does for every 16-bit
    PNG (Pillow's own conversion of these modes clips at 255)."""
    from PIL import Image

    mode = image.mode
    if mode.startswith("I;16") or (mode == "I" and image.format == "PNG"):  # 16-bit gray
        array = np.asarray(image).astype(np.int64)
        return Image.fromarray((np.clip(array, 0, 65535) >> 8).astype(np.uint8))
    if mode in ("I", "F") or mode.startswith(("I;", "F;")):
        raise _UnsupportedPixels(
            f"PKDataset: image {name} holds 32-bit integer or float pixels (Pillow mode "
            f"{mode!r}), whose range is unknown; tfdml decodes 8- and 16-bit images. Convert "
            "it to an 8- or 16-bit PNG, or read it yourself and pass the images as arrays"
        )
    return image


def _decode(data, name, channels):
    """An encoded image (a path or bytes) as a uint8 `[H, W, C]` array, with Pillow; a
    16-bit image keeps its high byte, as ``tf.io.decode_image`` (see `_to_8bit`)."""
    try:
        from PIL import Image
    except ModuleNotFoundError as err:
        raise ImportError(
            "tfdml.data.PKDataset decodes image files with Pillow: `pip install pillow`."
        ) from err
    try:
        with Image.open(io.BytesIO(data) if isinstance(data, bytes) else data) as image:
            image.seek(0)  # the first frame of an animation, as tf.io.decode_image
            image = _to_8bit(image, name).convert("L" if channels == 1 else "RGB")
            array = np.asarray(image, np.uint8)
    except _UnsupportedPixels:
        raise
    except (OSError, ValueError, SyntaxError) as err:
        raise ValueError(f"PKDataset: could not read or decode image {name}: {err}") from err
    return array[..., None] if array.ndim == 2 else array


def _mapped(map_fn, image, name, **kwargs):
    """`map_fn(image, **kwargs)`, or a ValueError naming `map_fn` if it returns None or
    something that is not a numeric array."""
    out = map_fn(image, **kwargs)
    kind = None if out is None else np.asarray(out).dtype.kind
    if kind is None or kind not in "biuf":
        what = "None" if out is None else f"a {type(out).__name__}"
        raise ValueError(
            f"`map_fn` must return the image as a numeric array. Received: map_fn={map_fn!r} "
            f"returned {what} for {name} (a function without `return`?)"
        )
    return out


class _ImageReader:
    """The examples of a source as NumPy images: decoded, converted, cropped, mapped."""

    def __init__(self, source, map_fn, crop_to_bbox, channels):
        self.channels, kind, items, labels, bboxes, name = check_source(
            source, map_fn, channels, crop_to_bbox, channel_choices=(1, 3))
        self.map_fn = map_fn
        self.labels = labels
        self._pass_rng = map_fn is not None and takes_argument(map_fn, "rng")
        self._kind, self._items, self._name = kind, items, name
        self._bboxes = np.asarray(bboxes, np.float32) if crop_to_bbox else None

    def batch(self, idx, batch_seed=None):
        """The images `[len(idx), ...]` of examples `idx`."""
        if self._kind == "images" and self.map_fn is None and self._bboxes is None:
            images = self._items[idx]
            if self.channels is not None and images.shape[-1] != self.channels:
                images = np.stack([_convert_channels(image, self.channels) for image in images])
            return images
        images = [self._load(i, slot, batch_seed) for slot, i in enumerate(idx)]
        shapes = {image.shape for image in images}
        if len(shapes) > 1:
            raise ValueError(
                f"tfdml.data: the images of a batch have {len(shapes)} different shapes (e.g. "
                f"{sorted(shapes)[:3]}); pass a `map_fn` that gives them one, e.g. "
                "tfdml.data.numpy_augment.train_transform(...) or eval_transform(...)."
            )
        return np.stack(images)

    def _load(self, i, slot, batch_seed):
        if self._kind == "paths":
            name = self._items[i]
        else:
            name = f"{self._name}: {'encoded ' if self._kind == 'encoded' else ''}image {i}"
        if self._kind == "images":
            image = _convert_channels(np.asarray(self._items[i]), self.channels)
        else:
            image = _decode(self._items[i], name, self.channels)
        if self._bboxes is not None:
            image = numpy_augment.crop_to_bbox(image, self._bboxes[i])
        if self.map_fn is None:
            return image
        if self._pass_rng:
            seed = [] if batch_seed is None else batch_seed.tolist()
            return _mapped(self.map_fn, image, name, rng=np.random.default_rng([*seed, slot]))
        return _mapped(self.map_fn, image, name)


@fill_doc(CATEGORIES=CATEGORIES_DOC)
class PKDataset(keras.utils.PyDataset):
    """P x K batches for `model.fit` under every Keras backend, without TensorFlow.

    A `keras.utils.PyDataset` over in-memory arrays or image files: each batch holds
    `classes_per_batch` (P) classes and `samples_per_class` (K) examples of each, grouped
    by class, as `(images [P*K, ...], labels [P*K] int64)` NumPy arrays (with `[N, L]`
    multi-hot labels: P labels, K examples carrying each, and the `[P*K, L]` int64
    multi-hot rows of the examples as labels). It takes the
    arguments of `tfdml.data.pk_batches` and gives its batches: the indices come from the
    same `PKSampler`, so for the same seed the examples and labels are those of
    `pk_batches`, in the same order (see `PKSampler` for what an epoch is and how small
    classes are handled). In-memory images without `map_fn` are the same arrays; files
    are decoded with Pillow, and augmentation runs in NumPy
    (`tfdml.data.numpy_augment`), with its own random draws.

    * `repeat=True` (default): an endless stream, as `pk_batches`: pass `steps_per_epoch`
      to `model.fit` (without it Keras never ends the first epoch; `MetricModel.fit` and
      `tfdml.data.check_steps` refuse that) and `shuffle=False` (Keras ignores `shuffle`
      here, and warns at every `fit` when it is True, the default; see
      `tfdml.data.fit_shuffle`). Each `model.fit` call starts the stream at
      `initial_epoch`.
    * `repeat=False`: one epoch of `len(dataset)` batches; each Keras epoch that gave all of
      them moves on to the next sampler epoch (`epoch`, from `initial_epoch`), so each
      Keras epoch draws new batches and `model.fit(dataset, epochs=E)` needs no
      `steps_per_epoch`.

    Pass `shuffle=False` to `model.fit` to keep the sampler's batch order (Keras otherwise
    shuffles the order of a finite `PyDataset`'s batches within the epoch).

    Args:
        source: a `tfdml.data.DatasetSplit`, a `(features, labels)` tuple of arrays, or a
            `(paths, labels)` tuple (a sequence of `bytes` is read as encoded images); as
            `tfdml.data.pk_batches`.
        classes_per_batch: P.
        samples_per_class: K, at least 2.
        small_classes: `"replace"` or `"skip"`, for classes with fewer than K examples.
            Defaults to `"replace"`.
        min_class_size: classes with fewer examples are left out. Defaults to `2`.
        steps_per_epoch: batches per sampler epoch, or `None` for `ceil(C / P)` (every
            class once). Defaults to `None`.
        repeat: an endless stream (`True`) or one epoch per Keras epoch (`False`).
            Defaults to `True`.
        drop_remainder: leave out the `C mod P` classes left over in an epoch. Defaults to
            `False`.
        seed: integer seed of the indices and of the augmentation; `None` draws one.
            Defaults to `None`.
        map_fn: a NumPy function applied to each image, e.g.
            `tfdml.data.numpy_augment.train_transform(224, 256, preprocess="resnet50")`.
            Called as `map_fn(image, rng=g)` with a per-image `numpy.random.Generator`
            (derived from the batch's seed and the image's slot) if it has an `rng`
            parameter, else `map_fn(image)`. Must return numeric images of one shape
            (returning None raises a `ValueError` naming `map_fn`). Defaults to `None`
            (images as they are: files must then all have one size).
        crop_to_bbox: crop each image to its `DatasetSplit.bboxes` box before `map_fn`.
            Defaults to `False`.
        channels: `None`, `1` or `3`: files are decoded with this many channels (`None`:
            3) and in-memory images converted 1 <-> 3, as `tfdml.data.pk_batches`. Files
            decode to uint8; a 16-bit file keeps the high byte of each value (`v >> 8`),
            as `tf.io.decode_image` does. Defaults to `None`.
        initial_epoch: the sampler epoch the first Keras epoch draws (`repeat=False`) or
            the stream starts with (`repeat=True`); with `repeat=False`, pass the
            `initial_epoch` of a resumed `model.fit` to get the batches an uninterrupted run
            would have had. Defaults to `0`.
        {CATEGORIES}
        **kwargs: `workers`, `use_multiprocessing` and `max_queue_size` of
            `keras.utils.PyDataset` (e.g. `workers=4` decodes four batches at a time in
            threads).

    Raises:
        ValueError: on a bad argument (see also `PKSampler`), an empty or ragged source,
            an inverted bounding box, or (when a batch is read) a file that cannot be
            decoded, a file of 32-bit or float pixels, a `map_fn` that returns None, or
            images of several shapes without a `map_fn` that makes them one.

    Examples:

    >>> x = np.random.rand(60, 8, 8, 1).astype("float32")
    >>> y = np.repeat(np.arange(12), 5)
    >>> batches = tfdml.data.PKDataset((x, y), 4, 3, seed=0, repeat=False)
    >>> len(batches), batches[0][0].shape, batches[0][1].shape
    (3, (12, 8, 8, 1), (12,))
    >>> model.fit(batches, epochs=10, shuffle=False)  # any backend
    >>> stream = tfdml.data.PKDataset((x, y), 4, 3, seed=0)  # endless, as pk_batches
    >>> model.fit(stream, epochs=10, steps_per_epoch=20)
    >>> kinds = np.arange(12) % 3  # the category of each class id 0 ... 11
    >>> hard = tfdml.data.PKDataset((x, y), 4, 3, seed=0, categories=kinds,
    ...                             categories_per_batch=2)  # two categories per batch
    """

    def __init__(self, source, classes_per_batch, samples_per_class, *, small_classes="replace",
                 min_class_size=2, steps_per_epoch=None, repeat=True, drop_remainder=False,
                 seed=None, map_fn=None, crop_to_bbox=False, channels=None, initial_epoch=0,
                 categories=None, categories_per_batch=None, **kwargs):
        super().__init__(**kwargs)
        self._reader = _ImageReader(source, map_fn, crop_to_bbox, channels)
        initial_epoch = check_initial_epoch(initial_epoch)
        self.sampler = PKSampler(self._reader.labels, classes_per_batch, samples_per_class,
                                 small_classes=small_classes, min_class_size=min_class_size,
                                 steps_per_epoch=steps_per_epoch, drop_remainder=drop_remainder,
                                 seed=seed, categories=source_categories(source, categories),
                                 categories_per_batch=categories_per_batch)
        self._labels = np.asarray(self.sampler.labels, np.int64)
        self.repeat = bool(repeat)
        self.initial_epoch = self.epoch = initial_epoch
        self._served = set()  # repeat=False: the batches of `epoch` given so far
        self._in_epoch = False
        self._lock = threading.Lock()
        self._drawn = None  # repeat=False: (epoch, its [(indices, seed)] batches)
        self._stream = self.sampler.iter_batches(self.initial_epoch)  # repeat=True
        self._position, self._recent = 0, {}

    def __getstate__(self):
        # For `use_multiprocessing=True` where workers are spawned: the lock and the stream's
        # generator do not pickle; a copy restarts the stream (the same batches).
        state = dict(self.__dict__, _lock=None, _stream=None, _position=0, _recent={})
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._stream = self.sampler.iter_batches(self.initial_epoch)

    @property
    def num_batches(self):
        """Batches per epoch, or `None` for the endless stream (`repeat=True`)."""
        return None if self.repeat else self.sampler.steps_per_epoch

    def __len__(self):
        if self.repeat:
            raise TypeError("PKDataset(repeat=True) is endless: it has no len(); pass "
                            "`steps_per_epoch` to model.fit, or use repeat=False.")
        return self.sampler.steps_per_epoch

    def _draw(self, index):
        """`(indices [P*K], seed [2])` of batch `index`: of the current epoch, or of the
        stream that starts at `initial_epoch`."""
        with self._lock:
            if not self.repeat:
                self._served.add(index)
                if self._drawn is None or self._drawn[0] != self.epoch:
                    gen = self.sampler.iter_batches(self.epoch)
                    self._drawn = (self.epoch, [next(gen) for _ in range(len(self))])
                return self._drawn[1][index]
            if index in self._recent:
                return self._recent[index]
            if index < self._position:  # asked for again from the start: replay the stream
                self._stream = self.sampler.iter_batches(self.initial_epoch)
                self._position, self._recent = 0, {}
            while self._position <= index:
                self._recent[self._position] = next(self._stream)
                self._recent.pop(self._position - _RECENT, None)
                self._position += 1
            return self._recent[index]

    def __getitem__(self, index):
        if isinstance(index, (bool, np.bool_)) or not isinstance(index, (int, np.integer)) \
                or index < 0 or (not self.repeat and index >= len(self)):
            bound = "an index >= 0" if self.repeat else f"an index in [0, {len(self)})"
            raise IndexError(f"PKDataset needs {bound}. Received: index={index!r}")
        idx, batch_seed = self._draw(int(index))
        return self._reader.batch(idx, batch_seed), self._labels[idx]

    def on_epoch_begin(self):
        self._in_epoch = True

    def on_epoch_end(self):
        """With `repeat=False`, the next sampler epoch once every batch of this one was given.

        Keras also calls it when it resets its iterator before training, after reading a
        batch or two to build the model (with or without `on_epoch_begin`): an end without
        a begin, or a begin and end that did not give every batch, does not advance.
        """
        with self._lock:
            if not self._in_epoch:
                self._served = set()
            elif len(self._served) >= self.sampler.steps_per_epoch:
                self.epoch += 1
                self._served = set()
            self._in_epoch = False

    def __repr__(self):
        return (f"PKDataset(classes_per_batch={self.sampler.classes_per_batch}, "
                f"samples_per_class={self.sampler.samples_per_class}, classes="
                f"{self.sampler.num_classes}, steps_per_epoch={self.sampler.steps_per_epoch}, "
                f"repeat={self.repeat}, "
                f"seed={self.sampler.seed}, epoch={self.epoch})")


class EvalDataset(keras.utils.PyDataset):
    """Every example of a source once, in order, in batches: for embedding a test split.

    The `keras.utils.PyDataset` twin of `tfdml.data.eval_batches`, for every backend and
    without TensorFlow: `(images, labels int64)` batches, the last one possibly smaller;
    the labels of the batches concatenated are the source's labels. Use it in
    `model.predict(EvalDataset(test, 256, map_fn=...))`.

    Args:
        source: as `PKDataset`.
        batch_size: examples per batch. Defaults to `256`.
        map_fn: a NumPy function `fn(image)` applied to each image, e.g.
            `tfdml.data.numpy_augment.eval_transform(224, 256, preprocess="resnet50")`.
            Defaults to `None`.
        crop_to_bbox: crop each image to its `DatasetSplit.bboxes` box first. Defaults to
            `False`.
        channels: as `PKDataset`. Defaults to `None`.
        **kwargs: `workers`, `use_multiprocessing` and `max_queue_size` of
            `keras.utils.PyDataset`.

    Examples:

    >>> test = tfdml.datasets.load("digits", "test")
    >>> embeddings = model.predict(tfdml.data.EvalDataset(test, 128))
    """

    def __init__(self, source, batch_size=256, *, map_fn=None, crop_to_bbox=False,
                 channels=None, **kwargs):
        super().__init__(**kwargs)
        self.batch_size = check_int("batch_size", batch_size)
        self._reader = _ImageReader(source, map_fn, crop_to_bbox, channels)
        self.labels = np.asarray(self._reader.labels, np.int64)

    def __len__(self):
        return -(-len(self.labels) // self.batch_size)

    def __getitem__(self, index):
        if isinstance(index, (bool, np.bool_)) or not isinstance(index, (int, np.integer)) \
                or not 0 <= index < len(self):
            raise IndexError(f"EvalDataset needs an index in [0, {len(self)}). "
                             f"Received: index={index!r}")
        idx = np.arange(index * self.batch_size, min((index + 1) * self.batch_size,
                                                     len(self.labels)))
        return self._reader.batch(idx), self.labels[idx]
