"""The data of a run: the data sets and their evaluation splits, synthetic data for
``--smoke``, and the image transforms (augmentation and the backbone's preprocessing)."""

from __future__ import annotations

import dataclasses

import numpy as np

from tfdml._tensorflow import tf
from tfdml.data import DatasetSplit, augment

__all__ = ["DATASETS", "EVAL_SPLITS", "ExperimentData", "load_data", "synthetic_data",
           "transforms"]

#: What each data set is evaluated on.
EVAL_SPLITS = {
    "cub200": ("test",),
    "cars196": ("test",),
    "sop": ("test",),
    "omniglot": ("test",),
    "digits": ("test",),
    "inshop": ("query", "gallery"),
    "vehicleid": ("test_small", "test_medium", "test_large"),
}
DATASETS = tuple(EVAL_SPLITS)
#: ``--backbone`` of the small CNN (``--smoke``), which needs no download.
BACKBONE_TINY = "tiny"


@dataclasses.dataclass
class ExperimentData:
    """A training split and the evaluation splits of one data set.

    Attributes:
        name: the data set name.
        train: the training ``DatasetSplit``.
        evaluation: ``{split name: DatasetSplit}`` (``"test"``; ``"query"`` and
            ``"gallery"`` for In-shop; ``"test_small"`` ... for VehicleID).
    """

    name: str
    train: DatasetSplit
    evaluation: dict


def _upsample(images, size):
    """Bilinear upsampling of ``[N, h, w, C]`` to ``[N, size, size, C]`` in NumPy (no TF, so
    that ``--logical-cpus`` can still configure the devices afterwards)."""

    def axis(n):
        pos = np.linspace(0, n - 1, size)
        low = np.minimum(np.floor(pos).astype(int), n - 2)
        return low, (pos - low)[:, None]

    rows, fr = axis(images.shape[1])
    x = images[:, rows] * (1 - fr)[None, :, :, None] + images[:, rows + 1] * fr[None, :, :, None]
    cols, fc = axis(images.shape[2])
    return x[:, :, cols] * (1 - fc)[None, None] + x[:, :, cols + 1] * fc[None, None]


def synthetic_data(dataset="cub200", num_classes=None, per_class=6, image_size=32, seed=0):
    """Tiny generated image data with the evaluation splits of ``dataset`` (for ``--smoke``).

    Every class is a random smooth colour pattern (60 % of it shared by all
    classes); its images are the pattern shifted at random plus noise (uint8
    RGB). The first half of the classes is
    the training split, the other half is evaluated as ``dataset`` is: one
    ``"test"`` split, In-shop's ``"query"``/``"gallery"`` (half of each class's
    images each), or VehicleID's three test sizes (nested, as in VehicleID).
    ``num_classes`` defaults to 24 for VehicleID and 12 otherwise.
    """
    if num_classes is None:  # VehicleID's top-5 needs 5 identities in the small test set
        num_classes = 24 if dataset == "vehicleid" else 12
    rng = np.random.default_rng(seed)
    size = image_size
    # Classes share most of their pattern, so the task is not solved at initialization.
    shared = rng.uniform(0, 255, size=(1, 4, 4, 3))
    coarse = (0.6 * shared + 0.4 * rng.uniform(0, 255, size=(num_classes, 4, 4, 3)))
    coarse = coarse.astype(np.float32)
    patterns = _upsample(coarse, size + 8)
    images, labels = [], []
    for c in range(num_classes):
        for _ in range(per_class):
            dy, dx = rng.integers(0, 9, size=2)
            img = patterns[c, dy:dy + size, dx:dx + size] + rng.normal(0, 40, (size, size, 3))
            images.append(np.clip(img, 0, 255).astype(np.uint8))
            labels.append(c)
    images, labels = np.stack(images), np.asarray(labels, np.int64)
    half = num_classes // 2

    def split(mask, name):
        return DatasetSplit(name=f"synthetic-{dataset}", split=name, labels=labels[mask],
                            images=images[mask],
                            class_names={int(c): str(c) for c in np.unique(labels[mask])})

    train = split(labels < half, "train")
    test = labels >= half
    if dataset == "inshop":
        first = np.zeros(len(labels), bool)
        for c in range(half, num_classes):
            idx = np.flatnonzero(labels == c)
            first[idx[: len(idx) // 2]] = True
        evaluation = {"query": split(test & first, "query"),
                      "gallery": split(test & ~first, "gallery")}
    elif dataset == "vehicleid":
        evaluation = {name: split(test & (labels < half + k), name)
                      for name, k in zip(EVAL_SPLITS["vehicleid"],
                                         (half // 2 or 1, half - 1 or 1, half), strict=True)}
    else:
        evaluation = {"test": split(test, "test")}
    return ExperimentData(name=dataset, train=train, evaluation=evaluation)


def load_data(args) -> ExperimentData:
    """The training and evaluation splits for ``args`` (synthetic with ``--smoke``)."""
    if args.smoke:
        return synthetic_data(args.dataset, image_size=args.resize_size, seed=args.seed)
    from tfdml import datasets

    options = {}
    if args.dataset == "omniglot":
        options["label"] = args.omniglot_label
    if args.dataset == "digits":
        load = lambda split: datasets.load("digits", split)  # noqa: E731
    else:
        def load(split):
            return datasets.load(args.dataset, split, data_dir=args.data_dir, source=args.source,
                                 **options)
    return ExperimentData(name=args.dataset, train=load("train"),
                          evaluation={s: load(s) for s in EVAL_SPLITS[args.dataset]})


def backbone_preprocess(backbone):
    """The input normalization of ``backbone``: ``tfdml.models.get_preprocess``, or pixels
    scaled to ``[0, 1]`` for the small CNN of ``--backbone tiny``."""
    if backbone == BACKBONE_TINY:
        return lambda x: tf.cast(x, tf.float32) / 255.0
    from tfdml.models import get_preprocess

    return get_preprocess(backbone)


def _to_rgb(image):
    image = tf.convert_to_tensor(image)
    if image.shape[-1] == 1:
        image = tf.image.grayscale_to_rgb(image)
    return image


def transforms(args):
    """(train map_fn, eval map_fn): images in, preprocessed float32 RGB out.

    ``crop``: resize to ``resize_size``, random ``image_size`` crop, flip; evaluation
    resizes and center-crops. ``pad_crop``: resize to ``image_size``, pad 10 px, random
    crop, flip; evaluation resizes. ``none``: resize only, for training and evaluation.
    """
    pre = backbone_preprocess(args.backbone)
    size, resize = args.image_size, args.resize_size
    if args.transform == "crop":
        train = augment.train_transform(crop_size=size, resize_size=resize, preprocess=pre)
        test = augment.eval_transform(crop_size=size, resize_size=resize, preprocess=pre)
    else:
        test = augment.eval_transform(crop_size=size, resize_size=size, preprocess=pre)
        train = (augment.pad_crop_transform(size=size, padding=10, preprocess=pre)
                 if args.transform == "pad_crop" else None)

    def train_fn(image, seed=None):
        image = _to_rgb(image)
        return test(image) if train is None else train(image, seed=seed)

    def eval_fn(image):
        return test(_to_rgb(image))

    return train_fn, eval_fn
