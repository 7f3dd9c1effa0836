"""`TwoViewDataset`: batches of two augmented views of each image as a Keras `PyDataset`
(views made by `tfdml.data.numpy_views`), for `model.fit` under every backend."""

from __future__ import annotations

import keras
import numpy as np

from tfdml._argument_checks import check_int

__all__ = ["TwoViewDataset", "check_dataset"]


def check_dataset(images, views, batch_size, seed, labels):
    """The arguments of `TwoViewDataset` and `tfdml.data.views.two_view_batches`, checked
    (a ValueError naming the argument): `(images [N, H, W, C], batch_size, seed, labels)`,
    a channel added to `[N, H, W]` images and a random seed drawn for `None`."""
    images = np.asarray(images)
    images = images[..., None] if images.ndim == 3 else images
    if images.ndim != 4 or len(images) == 0 or images.dtype.kind not in "biuf":
        raise ValueError("`images` must be a numeric array of shape [N, H, W, C] or [N, H, W] "
                         f"with N >= 1. Received: {images.dtype} array of shape {images.shape}")
    if not callable(views):
        raise ValueError(f"`views` must be callable. Received: views={views!r}")
    count = len(images)
    if check_int("batch_size", batch_size) > count:
        raise ValueError(f"`batch_size` must be at most the number of images ({count}). "
                         f"Received: batch_size={batch_size}")
    if labels is not None:
        labels = np.asarray(labels)
        if labels.ndim == 0 or len(labels) != count:
            raise ValueError(f"`labels` must have one row per image ({count}). Received: "
                             f"labels of shape {labels.shape}")
    seed = (int(np.random.default_rng().integers(2**31 - 1)) if seed is None
            else check_int("seed", seed, minimum=0))
    return images, int(batch_size), seed, labels


class TwoViewDataset(keras.utils.PyDataset):
    """Batches of two augmented views of each image, for `model.fit` under every backend.

    A `keras.utils.PyDataset` over an in-memory array of images. Batch `k` of an epoch
    is `((view1 [B, ...], view2 [B, ...]),)`, or `((view1, view2), labels [B])` with
    `labels`: row `i` of both views comes from the same image (the batches
    `tfdml.models.ContrastiveModel` trains on). An epoch gives `steps_per_epoch` batches;
    each pass over the images leaves out the `N mod B` left over and, with `shuffle`, has
    its own order. Each image's draws come from its own `numpy.random.Generator`, seeded
    by `(seed, epoch, k, slot)`: the same seed gives the same batches. `on_epoch_end`
    (called by Keras after each epoch) moves to the next epoch: new orders, new views.

    Args:
        images: `[N, H, W, C]` array (`[N, H, W]`: grayscale, a channel is added), pixels
            in [0, 255] as the augmenters take them.
        views: `views(image, rng) -> (view1, view2)`, e.g. `simclr_views(32)`; each view
            of a batch must have one shape.
        batch_size: images per batch, at most `N`.
        seed: integer seed of the order and of the views; `None` draws one. Defaults to
            `None`.
        labels: an array of `N` rows given with the views, or `None`. Defaults to `None`.
        shuffle: a new order of the images in each pass (else their order). Defaults to
            `True`.
        steps_per_epoch: batches per epoch, or `None` for `N // batch_size` (one pass).
            Defaults to `None`.
        **kwargs: `workers`, `use_multiprocessing` and `max_queue_size` of
            `keras.utils.PyDataset`.

    Raises:
        ValueError: on a bad argument, naming it; when a batch is read, if `views` does
            not return two arrays.

    Examples:

    >>> x = np.random.randint(0, 256, (100, 32, 32, 3), np.uint8)
    >>> data = tfdml.data.TwoViewDataset(x, tfdml.data.numpy_views.simclr_views(24), 16,
    ...                                  seed=0)
    >>> len(data), data[0][0][0].shape
    (6, (16, 24, 24, 3))
    >>> model.fit(data, epochs=10)  # a model with two inputs, one per view
    """

    def __init__(self, images, views, batch_size, seed=None, labels=None, shuffle=True,
                 steps_per_epoch=None, **kwargs):
        super().__init__(**kwargs)
        self.images, self.batch_size, self.seed, self.labels = check_dataset(
            images, views, batch_size, seed, labels)
        self.views = views
        self.shuffle = bool(shuffle)
        self.batches_per_pass = len(self.images) // self.batch_size
        self.steps_per_epoch = (self.batches_per_pass if steps_per_epoch is None
                                else check_int("steps_per_epoch", steps_per_epoch))
        self.epoch = 0

    def __len__(self):
        return self.steps_per_epoch

    def batch_indices(self, index, epoch=None):
        """The image indices of batch `index` of `epoch` (`None`: the current one)."""
        epoch = self.epoch if epoch is None else epoch
        count = len(self.images)
        passed, slot = divmod(index, self.batches_per_pass)
        order = (np.random.default_rng([self.seed, epoch, 0, passed]).permutation(count)
                 if self.shuffle else np.arange(count))
        return order[slot * self.batch_size:(slot + 1) * self.batch_size]

    def _pair(self, image, rng):
        out = self.views(image, rng)
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise ValueError("`views` must return two views (view1, view2). Received: "
                             f"views={self.views!r} returned {type(out).__name__}")
        return out

    def __getitem__(self, index):
        if isinstance(index, (bool, np.bool_)) or not isinstance(index, (int, np.integer)) \
                or not 0 <= index < len(self):
            raise IndexError(f"TwoViewDataset needs an index in [0, {len(self)}). "
                             f"Received: index={index!r}")
        epoch, index = self.epoch, int(index)
        idx = self.batch_indices(index, epoch)
        pairs = [self._pair(self.images[i], np.random.default_rng([self.seed, epoch, 1, index,
                                                                   slot]))
                 for slot, i in enumerate(idx)]
        try:
            views = tuple(np.stack([np.asarray(p[k]) for p in pairs]) for k in (0, 1))
        except ValueError as err:
            raise ValueError(f"`views` must return views of one shape for every image. "
                             f"Received: views={self.views!r}: {err}") from err
        return (views,) if self.labels is None else (views, self.labels[idx])

    def on_epoch_end(self):
        """The next epoch: a new order (with `shuffle`) and new views."""
        self.epoch += 1

    def __repr__(self):
        return (f"TwoViewDataset(images={len(self.images)}, batch_size={self.batch_size}, "
                f"steps_per_epoch={self.steps_per_epoch}, shuffle={self.shuffle}, "
                f"seed={self.seed}, epoch={self.epoch})")
