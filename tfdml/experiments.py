"""The training loop behind the paper example scripts: flags, data, model, resumable runs.

Every script under ``examples/<paper>/`` is a thin layer over this module: it
adds its own flags (loss, miner, ...) to :func:`make_parser`, builds its loss
and calls :func:`run`. What :func:`run` does:

* loads the data set (``tfdml.datasets.load``) or, with ``--smoke``, makes a
  tiny synthetic one with the same evaluation protocol (:func:`synthetic_data`);
* builds the embedding model (``tfdml.models.build_embedding_model``, or a small
  CNN with ``--backbone tiny``), the optimizer and the learning-rate schedule;
* trains on P x K batches (``tfdml.data.pk_batches``) with a progress bar,
  evaluating on the test split every ``--eval-every`` epochs (Recall@K; the
  In-shop query/gallery protocol; VehicleID's match rate);
* saves the model and optimizer state after every epoch in
  ``<output-dir>/backup``: a run that is killed resumes from the last finished
  epoch when started again with the same command, with the batches an
  uninterrupted run would have drawn (:class:`ResumeState`);
* keeps the best epoch's weights (``best.weights.h5``, by the monitored metric),
  and writes ``history.csv``, ``results.json``, ``results.md``, figures and a
  SavedModel export (``tfdml.export``) to the output directory;
* writes every one of these files whole or not at all: to a temporary file in
  the same directory, flushed to disk and renamed over the old one, so that a
  kill during a save leaves the old file or the new one, never a truncated one.

Example (a script)::

    from tfdml import experiments, losses

    def main(argv=None):
        parser = experiments.make_parser("Triplet loss on CUB", dataset="cub200")
        parser.add_argument("--margin", type=float, default=0.2)
        args = parser.parse_args(argv)
        loss = losses.TripletMarginLoss(margin=args.margin)
        return experiments.run(args, loss, name="triplet")
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import re
import shutil
import signal
import sys
import time
import warnings

import keras
import numpy as np

from tfdml import metrics as _metrics
from tfdml._files import atomic_path, remove_temporaries
from tfdml._tensorflow import tf
from tfdml.data import DatasetSplit, augment, eval_batches, pk_batches
from tfdml.layers import L2Normalization
from tfdml.metric_model import MetricModel, is_stateful_loss, plus_model_losses, unwrap

__all__ = [
    "Evaluation",
    "ExperimentData",
    "ResumeState",
    "apply_smoke",
    "batch_shape",
    "best_epoch",
    "build_model",
    "evaluate",
    "fit_multi_worker",
    "given_flags",
    "learning_rate_schedule",
    "load_data",
    "make_parser",
    "make_strategy",
    "markdown_table",
    "reject_flags",
    "run",
    "saved_arrays",
    "sweep",
    "synthetic_data",
    "transforms",
]

#: Recall@K values reported per data set (the papers' columns).
RECALL_KS = {
    "cub200": (1, 2, 4, 8, 16, 32),
    "cars196": (1, 2, 4, 8, 16, 32),
    "sop": (1, 10, 100, 1000),
    "inshop": (1, 10, 20, 30, 40, 50),
    "omniglot": (1, 2, 4, 8),
    "digits": (1, 2, 4, 8),
}
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
BACKBONE_TINY = "tiny"


def _positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _positive_float(text):
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


_FLAG_DEFAULTS = dict(
    dataset="cub200",
    data_dir=None,
    source="files",
    omniglot_label="character",
    backbone="resnet50",
    weights="imagenet",
    embedding_dim=512,
    image_size=224,
    resize_size=256,
    transform="crop",
    freeze_batchnorm=False,
    classes_per_batch=32,
    samples_per_class=4,
    epochs=40,
    steps_per_epoch=None,
    optimizer="sgd",
    learning_rate=0.005,
    momentum=0.9,
    weight_decay=0.0,
    lr_milestones=(),
    lr_gamma=0.1,
    seed=0,
    output_dir=None,
    eval_every=1,
    eval_batch_size=128,
    jit_compile=False,
    mixed_precision="off",
    verbose=1,
    smoke=False,
    export=True,
    strategy="default",
    logical_cpus=1,
)


def make_parser(description: str, **defaults) -> argparse.ArgumentParser:
    """The command-line flags every example script shares, with a script's defaults.

    Args:
        description: the ``--help`` text.
        **defaults: flag defaults by destination name (``dataset=``,
            ``backbone=``, ``learning_rate=``, ``lr_milestones=``, ...), for a
            paper's settings; the others keep the module's defaults.

    Returns:
        An ``argparse.ArgumentParser``; add script flags to it, then
        ``parse_args`` and pass the result to :func:`run`.
    """
    unknown = set(defaults) - set(_FLAG_DEFAULTS)
    if unknown:
        raise ValueError(f"Unknown flag defaults: {sorted(unknown)}. Known: {sorted(_FLAG_DEFAULTS)}")
    d = {**_FLAG_DEFAULTS, **defaults}
    p = argparse.ArgumentParser(description=description,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = p.add_argument_group("data")
    g.add_argument("--dataset", choices=DATASETS, default=d["dataset"])
    g.add_argument("--data-dir", default=d["data_dir"],
                   help="the extracted data set (files) or TFDS's data directory (tfds); "
                        "default: $TFDML_DATA_DIR/<dataset>")
    g.add_argument("--source", choices=("files", "tfds"), default=d["source"])
    g.add_argument("--omniglot-label", choices=("character", "alphabet"),
                   default=d["omniglot_label"], help="Omniglot: what a class is")
    g.add_argument("--image-size", type=_positive_int, default=d["image_size"],
                   help="network input size (square)")
    g.add_argument("--resize-size", type=_positive_int, default=d["resize_size"],
                   help="images are resized to this before cropping")
    g.add_argument("--transform", choices=("crop", "pad_crop", "none"), default=d["transform"],
                   help="training augmentation: resize + random crop + flip (crop), resize + "
                        "10 px zero padding + random crop + flip (pad_crop), or resize only")
    g.add_argument("-P", "--classes-per-batch", type=_positive_int, default=d["classes_per_batch"])
    g.add_argument("-K", "--samples-per-class", type=_positive_int,
                   default=d["samples_per_class"])
    g = p.add_argument_group("model")
    g.add_argument("--backbone", default=d["backbone"],
                   help="a tfdml.models.BACKBONES name, or 'tiny' (a small CNN)")
    g.add_argument("--weights", default=d["weights"], help="'imagenet' or 'none'")
    g.add_argument("--embedding-dim", type=_positive_int, default=d["embedding_dim"])
    g.add_argument("--freeze-batchnorm", action=argparse.BooleanOptionalAction,
                   default=d["freeze_batchnorm"])
    g = p.add_argument_group("training")
    g.add_argument("--epochs", type=_positive_int, default=d["epochs"])
    g.add_argument("--steps-per-epoch", type=_positive_int, default=d["steps_per_epoch"],
                   help="default: every training class once per epoch (ceil(C / P) batches)")
    g.add_argument("--optimizer", choices=("sgd", "adam", "rmsprop"), default=d["optimizer"])
    g.add_argument("--learning-rate", "--lr", type=_positive_float, default=d["learning_rate"])
    g.add_argument("--momentum", type=float, default=d["momentum"], help="SGD and RMSprop")
    g.add_argument("--weight-decay", type=float, default=d["weight_decay"],
                   help="decoupled weight decay of the Keras optimizer")
    g.add_argument("--lr-milestones", type=_positive_int, nargs="*", default=list(d["lr_milestones"]),
                   help="epochs after which the learning rate is multiplied by --lr-gamma")
    g.add_argument("--lr-gamma", type=_positive_float, default=d["lr_gamma"])
    g.add_argument("--seed", type=int, default=d["seed"])
    g.add_argument("--jit-compile", action=argparse.BooleanOptionalAction, default=d["jit_compile"])
    g.add_argument("--deterministic", action="store_true",
                   help="deterministic TensorFlow ops (slower): a resumed run then ends with "
                        "the weights of an uninterrupted one")
    g.add_argument("--mixed-precision", choices=("off", "float16", "bfloat16"),
                   default=d["mixed_precision"])
    g.add_argument("--strategy", choices=("default", "mirrored", "multiworker"),
                   default=d["strategy"],
                   help="tf.distribute: one device, MirroredStrategy (all GPUs of this "
                        "machine), or MultiWorkerMirroredStrategy (configured by TF_CONFIG)")
    g.add_argument("--logical-cpus", type=_positive_int, default=d["logical_cpus"],
                   help="split the CPU into this many logical devices (with --strategy "
                        "mirrored on a machine without GPUs: one replica each)")
    g = p.add_argument_group("output")
    g.add_argument("--output-dir", default=d["output_dir"],
                   help="default: runs/<script>-<dataset>-<method>; an unfinished run there "
                        "resumes")
    g.add_argument("--eval-every", type=_positive_int, default=d["eval_every"])
    g.add_argument("--eval-batch-size", type=_positive_int, default=d["eval_batch_size"])
    g.add_argument("--export", action=argparse.BooleanOptionalAction, default=d["export"],
                   help="write a SavedModel of the best weights")
    g.add_argument("--verbose", type=int, choices=(0, 1, 2), default=d["verbose"],
                   help="1: progress bar, 2: one line per epoch, 0: quiet")
    g.add_argument("--smoke", action="store_true", default=d["smoke"],
                   help="a few steps on tiny generated data, a small CNN, no downloads: checks "
                        "that the script works end to end")
    return p


def given_flags(parser, argv=None) -> set:
    """The destinations (``"classes_per_batch"``, ...) of the flags given on the command line.

    ``parser.parse_args(argv)`` fills in defaults, so a script cannot tell ``-K 8`` from no
    ``-K`` at all; scripts whose flags overlap (``-P``/``-K`` and ``--batch-size``) use this
    to honour the flags given and to refuse the ones that conflict or would be ignored.

    Args:
        parser: the script's ``argparse.ArgumentParser``.
        argv: the arguments, as for ``parse_args`` (`None`: ``sys.argv[1:]``).
    """
    unset = object()
    dests = vars(parser.parse_args(argv))
    args = parser.parse_args(argv, namespace=argparse.Namespace(**dict.fromkeys(dests, unset)))
    return {dest for dest, value in vars(args).items() if value is not unset}


def reject_flags(parser, given, flags, reason):
    """``parser.error`` when one of ``flags`` was given: with the other settings it would be
    ignored.

    Args:
        parser: the script's parser.
        given: the given destinations (:func:`given_flags`).
        flags: ``{destination: flag}``, e.g. ``{"margin": "--margin"}``.
        reason: the end of the message, e.g. ``"with --loss nca"``.
    """
    used = [flag for dest, flag in flags.items() if dest in given]
    if used:
        parser.error(f"{', '.join(used)} {'has' if len(used) == 1 else 'have'} no effect "
                     f"{reason}: leave {'it' if len(used) == 1 else 'them'} out")


def batch_shape(parser, args, given, samples_per_class, batch_size=None,
                classes_per_batch=None):
    """``(P, K)`` of the P x K batches from ``-P``, ``-K`` and a script's ``--batch-size``.

    The flags given on the command line are honoured and flags that do not agree are refused
    (``parser.error``): ``K`` is ``-K`` (or a script's ``--group-size``, its synonym), else
    ``samples_per_class``; ``P`` is ``-P`` (``-P`` with ``--batch-size`` must give
    ``P * K = batch size``), else ``--batch-size / K`` (``batch_size`` when not given; a
    multiple of ``K``), else ``classes_per_batch``.

    Args:
        parser: the script's parser (for the error).
        args: the parsed flags (``classes_per_batch``, ``samples_per_class``, and
            ``batch_size``, ``group_size`` when the script has these flags).
        given: the given destinations (:func:`given_flags`).
        samples_per_class: ``K`` when neither ``-K`` nor ``--group-size`` is given.
        batch_size: the images per batch when neither ``-P`` nor ``--batch-size`` is given,
            or `None`.
        classes_per_batch: ``P`` when neither ``-P``, ``--batch-size`` nor ``batch_size``
            is given.
    """
    k = args.samples_per_class if "samples_per_class" in given else samples_per_class
    if "group_size" in given:
        if "samples_per_class" in given and args.samples_per_class != args.group_size:
            parser.error(f"-K {args.samples_per_class} and --group-size {args.group_size} both "
                         "set the images per class: give one of them")
        k = args.group_size
    if "classes_per_batch" in given:
        p = args.classes_per_batch
        if "batch_size" in given and p * k != args.batch_size:
            parser.error(f"-P {p} classes x K = {k} images is {p * k} images, not --batch-size "
                         f"{args.batch_size}: give two of -P, -K and --batch-size, or values "
                         "that agree")
        return p, k
    batch = args.batch_size if "batch_size" in given else batch_size
    if batch is None:
        return classes_per_batch, k
    if batch < k or batch % k:
        which = "--batch-size" if "batch_size" in given else "the default --batch-size"
        parser.error(f"{which} {batch} is not a multiple of K = {k} images per class: give "
                     "--batch-size or -P")
    return batch // k, k


def apply_smoke(args):
    """``--smoke`` settings: a tiny CNN on 32 px synthetic images, at most 3 epochs of 2
    steps (or ``--steps-per-epoch``)."""
    args.backbone = BACKBONE_TINY
    args.weights = "none"
    args.embedding_dim = min(args.embedding_dim, 16)
    args.image_size, args.resize_size = 28, 32
    args.classes_per_batch = min(args.classes_per_batch, 4)
    args.samples_per_class = min(args.samples_per_class, 4)
    args.epochs = min(args.epochs, 3)
    args.steps_per_epoch = args.steps_per_epoch or 2
    args.lr_milestones = [m for m in args.lr_milestones if m < args.epochs] or [2]
    args.eval_batch_size = 32
    args.mixed_precision = "off"
    return args


# -- data --------------------------------------------------------------------------------------


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


def _preprocess(backbone):
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
    pre = _preprocess(args.backbone)
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


# -- model and optimizer -----------------------------------------------------------------------


def _tiny_model(embedding_dim, input_shape, normalize=True):
    inputs = keras.Input(input_shape)
    x = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(inputs)
    x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(embedding_dim, dtype="float32")(x)
    if normalize:
        outputs = L2Normalization(dtype="float32")(outputs)
    model = keras.Model(inputs, outputs, name="tiny_embedding")
    model.preprocess = "tiny"
    return model


def build_model(args) -> keras.Model:
    """The embedding model for ``args``: a Keras Applications backbone with an embedding head.

    The embeddings are L2-normalized unless ``args.normalize`` is false (a flag
    scripts may add, e.g. for LoOp's comparison without normalization).
    """
    shape = (args.image_size, args.image_size, 3)
    normalize = bool(getattr(args, "normalize", True))
    if args.backbone == BACKBONE_TINY:
        return _tiny_model(args.embedding_dim, shape, normalize)
    from tfdml.models import build_embedding_model

    weights = None if args.weights in (None, "none") else args.weights
    return build_embedding_model(args.backbone, args.embedding_dim, input_shape=shape,
                                 weights=weights, freeze_batchnorm=args.freeze_batchnorm,
                                 normalize=normalize)


def learning_rate_schedule(base, milestones=(), gamma=0.1):
    """``epoch -> learning rate``: ``base * gamma ** (number of milestones <= epoch)``.

    ``epoch`` counts from 0, so milestones ``(20, 30)`` divide the rate by 10
    after 20 and after 30 finished epochs (the extreme-triplet paper's schedule).
    """
    milestones = sorted(int(m) for m in milestones)

    def schedule(epoch, lr=None):
        return float(base * gamma ** sum(epoch >= m for m in milestones))

    return schedule


def _optimizer(args):
    lr = args.learning_rate
    wd = args.weight_decay or None
    if args.optimizer == "sgd":
        return keras.optimizers.SGD(lr, momentum=args.momentum, weight_decay=wd)
    if args.optimizer == "rmsprop":
        return keras.optimizers.RMSprop(lr, momentum=args.momentum, weight_decay=wd)
    return keras.optimizers.Adam(lr, weight_decay=wd)


def make_strategy(args):
    """The ``tf.distribute`` strategy for ``--strategy`` (call before any other TF work).

    ``"mirrored"`` replicates over all GPUs, or over ``--logical-cpus`` logical CPU
    devices when there is no GPU; ``"multiworker"`` is
    ``MultiWorkerMirroredStrategy``, whose cluster comes from the ``TF_CONFIG``
    environment variable; ``"default"`` is the no-op default strategy.
    """
    if args.logical_cpus > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        try:
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration()] * args.logical_cpus)
        except RuntimeError as e:  # devices already initialized in this process
            raise RuntimeError("--logical-cpus must be set before TensorFlow initializes its "
                               "devices (start a new process).") from e
    if args.strategy == "mirrored":
        devices = None
        if not tf.config.list_logical_devices("GPU"):
            devices = [d.name for d in tf.config.list_logical_devices("CPU")]
        return tf.distribute.MirroredStrategy(devices)
    if args.strategy == "multiworker":
        return tf.distribute.MultiWorkerMirroredStrategy()
    return tf.distribute.get_strategy()


# -- evaluation --------------------------------------------------------------------------------


@dataclasses.dataclass
class Evaluation:
    """Metrics of one evaluation: ``values`` (``{"val_recall@1": ..., ...}``) and the
    monitored key (``monitor``, maximized)."""

    values: dict
    monitor: str


def _embed(model, split, eval_fn, batch_size):
    ds = eval_batches(split, batch_size, map_fn=eval_fn)
    chunks = [model(x, training=False) for x, _ in ds]
    return tf.concat(chunks, axis=0).numpy().astype(np.float32), split.labels


def _clamp_ks(ks, gallery_size):
    kept = tuple(k for k in ks if k <= gallery_size)
    return kept or (1,)


def evaluate(model, data: ExperimentData, eval_fn, batch_size=128, final=False) -> Evaluation:
    """Embeds the evaluation splits and computes the data set's metrics.

    Recall@K (self-retrieval on ``"test"``, query against gallery for
    In-shop), plus MAP@R and, at the end of training (``final=True``), NMI and
    the clustering F1 (k-means with k = the number of test classes);
    VehicleID: the top-1 and top-5 match rates of each test size (10 draws of
    the gallery; top-5 only for a test set of at least 5 identities). Retrieval
    uses cosine similarity.
    """
    values = {}
    if data.name == "vehicleid":
        for name, split in data.evaluation.items():
            emb, labels = _embed(model, split, eval_fn, batch_size)
            ks = _clamp_ks((1, 5), len(np.unique(labels)))  # top-k needs k identities
            rates = _nan_unless_finite((emb,), dict.fromkeys(ks),
                                       _metrics.vehicleid_match_rate, emb, labels, ks=ks)
            size = name.replace("test_", "")
            values.update({f"val_{size}_top{k}": rates[k] for k in ks})
        return Evaluation(values, "val_small_top1")
    if data.name == "inshop":
        q, ql = _embed(model, data.evaluation["query"], eval_fn, batch_size)
        g, gl = _embed(model, data.evaluation["gallery"], eval_fn, batch_size)
        ks = _clamp_ks(RECALL_KS["inshop"], len(gl))
        recall = _nan_unless_finite((q, g), dict.fromkeys(ks), _metrics.recall_at_k, q, ql, ks,
                                    gallery_embeddings=g, gallery_labels=gl)
        values.update({f"val_recall@{k}": v for k, v in recall.items()})
        values["val_map@r"] = _nan_unless_finite((q, g), None, _metrics.map_at_r, q, ql,
                                                 gallery_embeddings=g, gallery_labels=gl)
        return Evaluation(values, "val_recall@1")
    emb, labels = _embed(model, data.evaluation["test"], eval_fn, batch_size)
    ks = _clamp_ks(RECALL_KS.get(data.name, (1, 2, 4, 8)), len(labels) - 1)
    recall = _nan_unless_finite((emb,), dict.fromkeys(ks), _metrics.recall_at_k, emb, labels, ks)
    values.update({f"val_recall@{k}": v for k, v in recall.items()})
    values["val_map@r"] = _nan_unless_finite((emb,), None, _metrics.map_at_r, emb, labels)
    if final:
        values["val_nmi"] = _nan_unless_finite((emb,), None, _metrics.nmi, emb, labels)
        values["val_f1"] = _nan_unless_finite((emb,), None, _metrics.f1_clustering, emb, labels)
    return Evaluation(values, "val_recall@1")


def _nan_unless_finite(embeddings, keys, fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, or NaN (a dict of NaN over ``keys``) for non-finite embeddings.

    A diverged model's evaluation is logged as NaN, never picked as the best epoch, and
    does not stop the run (the metrics themselves raise on non-finite embeddings).
    """
    if all(np.isfinite(e).all() for e in embeddings):
        return fn(*args, **kwargs)
    print("Evaluation: the model gives non-finite embeddings (NaN or Inf); metrics are NaN.")
    return float("nan") if keys is None else {k: float("nan") for k in keys}


class _Evaluate(keras.callbacks.Callback):
    """Puts the evaluation metrics into the epoch logs (before the callbacks that read them)."""

    def __init__(self, fn, every):
        super().__init__()
        self.fn = fn
        self.every = every

    def on_epoch_end(self, epoch, logs=None):
        if (epoch + 1) % self.every and epoch > 0:
            return
        start = time.perf_counter()
        result = self.fn()
        if logs is not None:  # Keras prints them with the epoch's line
            logs.update(result.values)
            logs["eval_seconds"] = time.perf_counter() - start


def best_epoch(history, monitor):
    """The epoch with the largest ``monitor`` value in ``history``, NaN values ignored.

    A NaN compares false with every number, so ``max(history, key=...)`` may
    return a NaN entry or not depending on where it is; here entries whose
    value is missing, ``None`` or NaN are left out. Among equal values the
    earliest epoch wins, the one ``ModelCheckpoint(save_best_only=True)``
    keeps (it saves on a strict improvement only).

    Args:
        history: a sequence of per-epoch dicts with an ``"epoch"`` key, as
            ``ResumeState.history``.
        monitor: the key to maximize, e.g. ``"val_recall@1"``.

    Returns:
        The ``"epoch"`` value of the best entry, or ``None`` when no entry has
        a value that is not NaN.

    Examples:

    >>> history = [{"epoch": 1, "val_recall@1": float("nan")}, {"epoch": 2, "val_recall@1": 0.4}]
    >>> tfdml.experiments.best_epoch(history, "val_recall@1")
    2
    """
    best = None
    for entry in history:
        value = entry.get(monitor)
        if value is None or np.isnan(value):
            continue
        if best is None or value > best[monitor]:
            best = entry
    return None if best is None else best["epoch"]


def _save_weights(model, path):
    """``model.save_weights(path)``, written whole or not at all (a temporary file beside
    ``path``, flushed and renamed over it): a kill during the save leaves the old file."""
    with atomic_path(path) as tmp:
        model.save_weights(tmp)


class _BestWeights(keras.callbacks.Callback):
    """The weights of the epoch with the largest ``monitor`` so far, never a NaN epoch.

    What ``ModelCheckpoint(filepath, monitor, mode="max", save_best_only=True,
    save_weights_only=True, initial_value_threshold=float("-inf"))`` keeps, but
    written whole or not at all: a kill during a save leaves the previous best
    file (``ModelCheckpoint`` writes in place, and a kill then leaves a truncated
    file that fails to load). It saves on a strict improvement only, so among
    equal values the earliest epoch is kept; starting from ``-inf`` a NaN is
    never an improvement (Keras' default start, ``None``, would take a first NaN
    as the best, which nothing then exceeds).

    Attributes:
        filepath: the ``.weights.h5`` file.
        monitor: the log name maximized.
        best: the best value so far (``-inf`` before the first save).
    """

    def __init__(self, filepath, monitor):
        super().__init__()
        self.filepath = os.fspath(filepath)
        self.monitor = monitor
        self.best = float("-inf")

    def on_epoch_end(self, epoch, logs=None):
        current = (logs or {}).get(self.monitor)
        if current is None:
            warnings.warn(f"The best weights are saved by {self.monitor!r}, which the logs of "
                          f"epoch {epoch + 1} do not hold; skipping.", stacklevel=2)
            return
        current = float(np.asarray(current))
        if current > self.best:  # False for NaN
            _save_weights(self.model, self.filepath)
            self.best = current  # once saved: after a failed save the file holds the old best


def _best_checkpoint(path, monitor):
    """The callback keeping the best weights by ``monitor`` (maximized), never a NaN epoch,
    written whole or not at all (:class:`_BestWeights`)."""
    return _BestWeights(path, monitor)


# -- resuming ----------------------------------------------------------------------------------


def _atomic_write_json(path, obj):
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        json.dump(obj, f, indent=1, default=_json_default)


def _atomic_write_text(path, text):
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        f.write(text)


def _json_default(x):
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"not JSON serializable: {type(x).__name__}")


class ResumeState(keras.callbacks.Callback):
    """Saves everything needed to continue training after every epoch; restores it.

    After each finished epoch it writes a checkpoint folder ``ckpt-<epoch>`` in
    ``directory`` with the model weights (``model.weights.h5``, which Keras
    writes with the optimizer's variables, step count and momenta, and the
    state of the loss a :class:`tfdml.models.MetricModel` owns, such as a learned
    margin β or a random miner's seed), then
    commits it by replacing ``state.json`` (finished epochs, the logs of each
    epoch, the best monitored value so far) atomically, then deletes the older
    folder. A kill at any moment leaves a consistent last finished epoch.
    ``history_csv`` (if given) is rewritten from the same record, so it never
    holds an epoch twice.

    :meth:`restore` (before ``fit``) loads them and returns the epoch to pass
    as ``initial_epoch`` to ``fit`` and to the P x K sampler, so the resumed
    run draws the batches the uninterrupted run would have drawn. An epoch
    that was interrupted part-way is run again from its start; no finished
    epoch is lost or repeated. The seed of a random miner is restored with the
    weights when a ``MetricModel`` owns it (as :func:`run` arranges); the random
    state of dropout is not.

    Args:
        directory: where to keep the state.
        config: a JSON-able dict of the run's settings; resuming with other
            settings raises a ValueError.
        checkpoint: a ``keras.callbacks.ModelCheckpoint`` whose ``best``
            value is saved and restored.
        history_csv: path of a CSV file of the epoch logs.
    """

    def __init__(self, directory, config=None, checkpoint=None, history_csv=None):
        super().__init__()
        self.directory = directory
        self.config = config
        self.checkpoint = checkpoint
        self.history_csv = history_csv
        self.history = []
        os.makedirs(directory, exist_ok=True)

    @property
    def _state_path(self):
        return os.path.join(self.directory, "state.json")

    def load_state(self):
        """``state.json`` as a dict, or None when there is no saved epoch."""
        if not os.path.exists(self._state_path):
            return None
        with open(self._state_path) as f:
            return json.load(f)

    def restore(self, model) -> int:
        """Loads the saved state into ``model`` (compiled); returns the finished epochs."""
        state = self.load_state()
        if state is None:
            return 0
        if self.config is not None and state.get("config") not in (None, self.config):
            changed = sorted(k for k in set(self.config) | set(state["config"])
                             if self.config.get(k) != state["config"].get(k))
            raise ValueError(
                f"{self.directory} holds a run with other settings ({', '.join(changed)}). "
                "Use another --output-dir, or delete it to start again."
            )
        folder = os.path.join(self.directory, state["checkpoint"])
        opt = model.optimizer
        if not opt.built:  # so that the weights file's optimizer part has somewhere to go
            opt.build(model.trainable_variables)
        model.load_weights(os.path.join(folder, "model.weights.h5"))  # optimizer included
        self.history = list(state["history"])
        if self.checkpoint is not None and state.get("best") is not None:
            self.checkpoint.best = state["best"]
        return int(state["epoch"])

    def on_epoch_end(self, epoch, logs=None):
        logs = {k: float(v) for k, v in (logs or {}).items()
                if isinstance(v, (int, float, np.floating, np.integer))
                or (hasattr(v, "shape") and not v.shape)}
        self.history.append({"epoch": epoch + 1, **logs})
        name = f"ckpt-{epoch + 1}"
        folder = os.path.join(self.directory, name)
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
        _save_weights(self.model, os.path.join(folder, "model.weights.h5"))
        best = None if self.checkpoint is None else self.checkpoint.best
        if best is not None and not np.isfinite(best):
            best = None
        _atomic_write_json(self._state_path, {"epoch": epoch + 1, "checkpoint": name,
                                              "history": self.history, "best": best,
                                              "config": self.config})
        for other in os.listdir(self.directory):
            if other.startswith("ckpt-") and other != name:
                shutil.rmtree(os.path.join(self.directory, other), ignore_errors=True)
        if self.history_csv:
            _write_csv(self.history_csv, self.history)


def _write_csv(path, rows):
    columns = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        f.write(",".join(columns) + "\n")
        for row in rows:
            f.write(",".join("" if row.get(c) is None else repr(row[c]) for c in columns) + "\n")


def saved_arrays(path) -> dict:
    """Every array in a Keras ``.weights.h5`` file (model and optimizer), by its path in the
    file: for comparing the weights that two runs saved. The class names that loss states are
    saved with (``tfdml.losses.LossState``) are not weights and are left out."""
    import h5py

    from tfdml.losses.base import LossState

    marker = "/" + LossState.LOSS_CLASS_KEY
    arrays = {}
    with h5py.File(path) as f:
        f.visititems(lambda name, obj: arrays.__setitem__(name, obj[()])
                     if isinstance(obj, h5py.Dataset) and not name.endswith(marker) else None)
    return arrays


# -- reporting ---------------------------------------------------------------------------------


def markdown_table(rows, columns=None, digits=4):
    """A Markdown table of dicts (one row each); numbers rounded to ``digits`` decimals."""
    rows = list(rows)
    if columns is None:
        columns = []
        for row in rows:
            columns += [k for k in row if k not in columns]

    def fmt(v):
        if isinstance(v, float):
            return f"{v:.{digits}f}"
        return "" if v is None else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _machine():
    return (f"{os.cpu_count()} CPUs, {len(tf.config.list_physical_devices('GPU'))} GPUs; "
            f"TensorFlow {tf.__version__}, Keras {keras.__version__}, "
            f"Python {platform.python_version()}")


def _plot_history(history, keys, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    for key in keys:
        points = [(h["epoch"], h[key]) for h in history if key in h]
        if points:
            ax.plot(*zip(*points, strict=True), marker="o", label=key)
    ax.set_xlabel("epoch")
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)


# -- the run -----------------------------------------------------------------------------------


def _config(args, name):
    # Not part of what a run computes: a run may resume with other values of these.
    skip = {"verbose", "output_dir", "export", "epochs", "eval_batch_size", "strategy",
            "logical_cpus"}
    config = {k: v for k, v in vars(args).items() if k not in skip and not k.startswith("_")}
    config["name"] = name
    return json.loads(json.dumps(config, default=str))


def _handle_sigterm():
    """SIGTERM ends the run like Ctrl-C (the last finished epoch is saved already)."""
    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    try:
        signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        pass


def fit_multi_worker(model, strategy, dataset, epochs, initial_epoch=0, callbacks=(),
                     verbose=1):
    """``model.fit`` for ``MultiWorkerMirroredStrategy``: a plain loop driving the callbacks.

    Keras 3's ``fit`` fails under ``MultiWorkerMirroredStrategy`` when it reduces
    its scalar logs across workers ("Invalid reduction dimension 0 for input with
    0 dimensions", tensorflow/tensorflow#72388). This loop runs the same step (the
    compiled loss, ``model.losses``, ``optimizer.apply_gradients`` in each
    replica, which sums the gradients over replicas), reports the global loss
    (the replicas' values summed: each is the global loss divided by the number
    of replicas) and calls the callbacks as ``fit`` does. Each pass over
    ``dataset`` is one epoch.
    """
    dist = strategy.experimental_distribute_dataset(dataset)
    loss_fn = model.metric_loss if isinstance(model, MetricModel) else model.loss
    optimizer = model.optimizer
    replicas = strategy.num_replicas_in_sync
    with strategy.scope():
        if not optimizer.built:
            optimizer.build(model.trainable_variables)

    @tf.function
    def train_step(batch):
        def replica_step(x, y):
            with tf.GradientTape() as tape:
                value = plus_model_losses(loss_fn(y, model(x, training=True)), model.losses,
                                          scale=1.0 / replicas)
            grads = tape.gradient(value, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return value

        return strategy.reduce("SUM", strategy.run(replica_step, args=batch), axis=None)

    steps = dataset.cardinality().numpy()
    steps = int(steps) if steps > 0 else None
    cb = keras.callbacks.CallbackList(list(callbacks), model=model, add_history=False,
                                      add_progbar=verbose != 0, verbose=verbose, epochs=epochs,
                                      steps=steps)
    model.stop_training = False
    cb.on_train_begin()
    for epoch in range(initial_epoch, epochs):
        cb.on_epoch_begin(epoch)
        total, count = 0.0, 0
        for step, batch in enumerate(dist):
            cb.on_train_batch_begin(step)
            total += float(train_step(batch))
            count += 1
            cb.on_train_batch_end(step, {"loss": total / count})
        logs = {"loss": total / max(count, 1)}
        cb.on_epoch_end(epoch, logs)
        if model.stop_training:
            break
    cb.on_train_end()


def _is_factory(loss):
    """A function of no arguments that returns the loss (built inside the strategy scope)."""
    if isinstance(loss, keras.losses.Loss) or not callable(loss):
        return False
    import inspect

    try:
        params = inspect.signature(loss).parameters.values()
    except (TypeError, ValueError):
        return False
    return not any(p.default is inspect.Parameter.empty and p.kind in (
        p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


def run(args, loss, *, name, callbacks=(), own_state=None, figures=None, extra_results=None,
        data=None):
    """Trains, evaluates and reports one experiment; resumes an unfinished one.

    Args:
        args: the parsed flags of :func:`make_parser` (``--smoke`` applied here).
        loss: a Keras loss object (a tfdml loss), or a function of no arguments that
            returns one: it is then built inside the ``--strategy`` scope, which a loss
            with variables (``MarginLoss``'s β) or a random miner needs.
        name: a short name of the method, written into the results.
        callbacks: further Keras callbacks (after the evaluation, so they see
            its metrics), or a callable ``(model, data, eval_fn, out_dir) -> list``.
        own_state: train ``tfdml.models.MetricModel(model, loss)``, which owns the
            loss's state (``MarginLoss``'s β, proxies, a random miner's seed), so
            that it is trained, updated, checkpointed and restored with the model.
            Defaults to `None`: when the loss has state. The exported SavedModel
            is the embedding model either way.
        figures: ``fn(model, data, eval_fn, out_dir, history) -> list of paths``
            for the paper's figures, called at the end.
        extra_results: ``fn(model, data, eval_fn) -> dict`` added to the
            results (e.g. a CMC curve) and listed in ``results.md``, called at the end;
            a ``"metrics"`` entry (a dict of numbers) is merged into the metrics.
        data: the :class:`ExperimentData`, if the script needed it before building
            the loss (e.g. for the number of classes); loaded with
            :func:`load_data` otherwise. With ``--smoke``, call :func:`apply_smoke`
            before :func:`load_data`.

    Returns:
        The results dict (also written to ``<output-dir>/results.json``).
    """
    if args.smoke:
        apply_smoke(args)
    script = os.path.splitext(os.path.basename(sys.argv[0] or "run"))[0]
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    out = args.output_dir or os.path.join("runs", f"{script}-{args.dataset}-{slug}")
    os.makedirs(out, exist_ok=True)
    _handle_sigterm()
    strategy = make_strategy(args)
    replicas = strategy.num_replicas_in_sync
    if (args.classes_per_batch * args.samples_per_class) % replicas:
        raise ValueError(f"The batch of P x K = {args.classes_per_batch} x "
                         f"{args.samples_per_class} images cannot be split over {replicas} "
                         "replicas: make P * K a multiple of the number of replicas.")
    keras.utils.set_random_seed(args.seed)
    if args.deterministic:
        tf.config.experimental.enable_op_determinism()
    if args.mixed_precision != "off":
        keras.mixed_precision.set_global_policy(f"mixed_{args.mixed_precision}")
    start_time = time.perf_counter()
    config = _config(args, name)
    _atomic_write_json(os.path.join(out, "config.json"), config)

    if data is None:
        data = load_data(args)
    train_fn, eval_fn = transforms(args)
    with strategy.scope():  # model, loss and optimizer variables belong to the strategy
        model = build_model(args)
        if _is_factory(loss):
            loss = loss()
        if own_state or (own_state is None and is_stateful_loss(loss)):
            model = MetricModel(model, loss)
            model.compile(optimizer=_optimizer(args), jit_compile=args.jit_compile)
        else:
            model.compile(optimizer=_optimizer(args), loss=loss, jit_compile=args.jit_compile)

    best_path = os.path.join(out, "best.weights.h5")
    monitor = "val_small_top1" if data.name == "vehicleid" else "val_recall@1"
    checkpoint = _best_checkpoint(best_path, monitor)
    resume = ResumeState(os.path.join(out, "backup"), config=config, checkpoint=checkpoint,
                         history_csv=os.path.join(out, "history.csv"))
    # The temporary files that a run killed during a save left behind (never read).
    for folder in (out, resume.directory, os.path.join(out, "figures")):
        remove_temporaries(folder)
    with strategy.scope():  # a restored optimizer is built inside the scope
        initial_epoch = resume.restore(model)
    if initial_epoch:
        print(f"Resuming {out} after epoch {initial_epoch} of {args.epochs}.", flush=True)

    train = pk_batches(data.train, args.classes_per_batch, args.samples_per_class,
                       steps_per_epoch=args.steps_per_epoch, repeat=False, seed=args.seed,
                       map_fn=train_fn, initial_epoch=initial_epoch)
    if replicas > 1:
        # Every worker draws the same global P x K batches (same seed); each replica takes
        # its contiguous slice of each batch (sharding by data, not by file).
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = (
            tf.data.experimental.AutoShardPolicy.DATA)
        train = train.with_options(options)
    extra_callbacks = list(callbacks(model, data, eval_fn, out) if callable(callbacks)
                           else callbacks)
    cbs = [
        _Evaluate(lambda: evaluate(model, data, eval_fn, args.eval_batch_size), args.eval_every),
        keras.callbacks.LearningRateScheduler(
            learning_rate_schedule(args.learning_rate, args.lr_milestones, args.lr_gamma)),
        *extra_callbacks,
        checkpoint,
        resume,
    ]
    if initial_epoch < args.epochs:
        if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
            fit_multi_worker(model, strategy, train, args.epochs, initial_epoch, cbs,
                             args.verbose)
        else:
            model.fit(train, epochs=args.epochs, initial_epoch=initial_epoch, callbacks=cbs,
                      verbose=args.verbose, shuffle=False)
    history = resume.history

    # The best epoch's weights, evaluated once more with the final metrics.
    if os.path.exists(best_path):
        model.load_weights(best_path)
    final = evaluate(model, data, eval_fn, args.eval_batch_size, final=True)
    best = best_epoch(history, monitor)
    results = {
        "name": name,
        "dataset": data.name,
        "smoke": bool(args.smoke),
        "config": config,
        "best_epoch": best,
        "metrics": final.values,
        "history": history,
        "epochs_run": [h["epoch"] for h in history],
        "machine": _machine(),
        "strategy": f"{args.strategy} ({replicas} replica{'s' if replicas > 1 else ''})",
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "seconds_this_process": round(time.perf_counter() - start_time, 1),
    }
    extra = {} if extra_results is None else dict(extra_results(model, data, eval_fn))
    results["metrics"].update(extra.pop("metrics", {}))
    results.update(extra)
    fig_dir = os.path.join(out, "figures")
    os.makedirs(fig_dir, exist_ok=True)
    keys = [k for k in final.values if k.startswith("val_") and "nmi" not in k][:4]
    _plot_history(history, keys, os.path.join(fig_dir, "metrics.png"), f"{name} on {data.name}")
    paths = ["figures/metrics.png"]
    if figures is not None:
        paths += [os.path.relpath(p, out) for p in figures(model, data, eval_fn, out, history)]
    results["figures"] = paths
    if args.export:
        from tfdml.export import export_embedding_model

        with atomic_path(os.path.join(out, "saved_model"), directory=True) as export_dir:
            export_embedding_model(unwrap(model), export_dir,
                                   preprocess=_preprocess(args.backbone), image_size=None,
                                   normalize=bool(getattr(args, "normalize", True)))
        results["saved_model"] = "saved_model"
    _atomic_write_json(os.path.join(out, "results.json"), results)
    rows = [{"metric": k, "value": v} for k, v in results["metrics"].items()]
    text = f"# {name} on {data.name}{' (smoke run, synthetic data)' if args.smoke else ''}\n\n"
    text += f"Best epoch {best} of {args.epochs} (by {monitor}).\n\n"
    text += markdown_table(rows)
    for key, value in extra.items():
        text += f"\n{key}: `{json.dumps(value, default=_json_default)}`\n"
    text += f"\nCommand: `{results['command']}`\n\nMachine: {results['machine']}\n"
    _atomic_write_text(os.path.join(out, "results.md"), text)
    print(markdown_table(rows), flush=True)
    print(f"Results in {out}", flush=True)
    return results


def sweep(main, argv, runs, output_dir, metric="val_recall@1", title="sweep", x_label=None,
          log_x=False, check=None):
    """Runs a script's ``main`` once per setting and tabulates the results.

    Each run writes to ``<output_dir>/<run name>`` and is resumable on its own;
    a run whose ``results.json`` exists is not run again. The runs happen one
    after the other in this process (``keras.backend.clear_session()`` between).

    Args:
        main: the script's ``main(argv) -> results dict``.
        argv: flags common to every run (e.g. ``["--dataset", "cub200"]``).
        runs: ``{run name: [extra flags]}``, e.g.
            ``{"n2": ["--group-size", "2"], "n4": ["--group-size", "4"]}``.
        output_dir: the folder of the sweep.
        metric: the metric tabulated and plotted. Defaults to `"val_recall@1"`.
        title: title of the table and plot.
        x_label: for a plot of ``metric`` against a number: ``{run name: x}``
            is taken from ``runs`` by this flag's value (e.g. ``"--group-size"``).
        log_x: a log2 x axis (group sizes, batch sizes).
        check: ``fn(flags)`` called with every run's flags (``argv`` and the run's) before
            the first run, e.g. the script's flag check (``parser.error`` on flags that
            conflict or that a run would ignore), so that a bad flag stops the sweep before
            any training. Defaults to `None` (no check).

    Returns:
        ``[{"run": name, **metrics}]``; also written to ``sweep.json`` and
        ``sweep.md`` (and ``sweep.png`` with ``x_label``) in ``output_dir``.
    """
    if check is not None:
        for run_name, extra in runs.items():
            try:
                check([*argv, *extra])
            except SystemExit:
                print(f"{title}: run {run_name!r} refuses its flags {[*argv, *extra]}",
                      file=sys.stderr, flush=True)
                raise
    os.makedirs(output_dir, exist_ok=True)
    rows = []
    for run_name, extra in runs.items():
        out = os.path.join(output_dir, run_name)
        path = os.path.join(out, "results.json")
        if os.path.exists(path):
            with open(path) as f:
                results = json.load(f)
            print(f"{run_name}: done already ({path})", flush=True)
        else:
            print(f"== {title}: {run_name} ==", flush=True)
            keras.backend.clear_session()
            results = main([*argv, *extra, "--output-dir", out])
        row = {"run": run_name, "method": results.get("name"), "best_epoch": results.get("best_epoch")}
        row.update(results["metrics"])
        rows.append(row)
    _atomic_write_json(os.path.join(output_dir, "sweep.json"), rows)
    _atomic_write_text(os.path.join(output_dir, "sweep.md"), f"# {title}\n\n" + markdown_table(rows))
    if x_label is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        xs = [float(extra[extra.index(x_label) + 1]) for extra in runs.values()]
        fig, ax = plt.subplots(figsize=(4.5, 3.2))
        ax.plot(xs, [r.get(metric) for r in rows], marker="o")
        if log_x:
            ax.set_xscale("log", base=2)
        ax.set_xlabel(x_label.lstrip("-"))
        ax.set_ylabel(metric)
        ax.set_title(title, fontsize=9)
        fig.tight_layout()
        with atomic_path(os.path.join(output_dir, "sweep.png")) as tmp:
            fig.savefig(tmp, dpi=110)
        plt.close(fig)
    print(markdown_table(rows), flush=True)
    return rows
