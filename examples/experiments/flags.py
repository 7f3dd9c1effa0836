"""The command-line flags of the paper scripts: the shared parser, and the checks of flags
that overlap or that a script's settings would ignore."""

from __future__ import annotations

import argparse

from experiments.data import BACKBONE_TINY, DATASETS

__all__ = ["apply_smoke", "batch_shape", "given_flags", "make_parser", "positive_float", "positive_int",
           "reject_flags"]


def positive_int(text):
    """An ``argparse`` type: an integer >= 1.

    Args:
        text: the flag's value on the command line.

    Returns:
        The integer.

    Raises:
        argparse.ArgumentTypeError: not an integer >= 1 (``argparse`` reports it as a
            usage error naming the flag).

    Examples:

    >>> parser.add_argument("--batch-size", type=experiments.positive_int)
    """
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def positive_float(text):
    """An ``argparse`` type: a number > 0.

    Args:
        text: the flag's value on the command line.

    Returns:
        The float.

    Raises:
        argparse.ArgumentTypeError: not a number > 0 (``argparse`` reports it as a
            usage error naming the flag).

    Examples:

    >>> parser.add_argument("--margin", type=experiments.positive_float)
    """
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


def _add_data_flags(p, d):
    """The ``data`` flags of :func:`make_parser` (``d``: the defaults by destination)."""
    g = p.add_argument_group("data")
    g.add_argument("--dataset", choices=DATASETS, default=d["dataset"])
    g.add_argument("--data-dir", default=d["data_dir"],
                   help="the extracted data set (files) or TFDS's data directory (tfds); "
                        "default: $TFDML_DATA_DIR/<dataset>")
    g.add_argument("--source", choices=("files", "tfds"), default=d["source"])
    g.add_argument("--omniglot-label", choices=("character", "alphabet"),
                   default=d["omniglot_label"], help="Omniglot: what a class is")
    g.add_argument("--image-size", type=positive_int, default=d["image_size"],
                   help="network input size (square)")
    g.add_argument("--resize-size", type=positive_int, default=d["resize_size"],
                   help="images are resized to this before cropping")
    g.add_argument("--transform", choices=("crop", "pad_crop", "none"), default=d["transform"],
                   help="training augmentation: resize + random crop + flip (crop), resize + "
                        "10 px zero padding + random crop + flip (pad_crop), or resize only")
    g.add_argument("-P", "--classes-per-batch", type=positive_int, default=d["classes_per_batch"])
    g.add_argument("-K", "--samples-per-class", type=positive_int,
                   default=d["samples_per_class"])


def _add_model_flags(p, d):
    """The ``model`` flags of :func:`make_parser` (``d``: the defaults by destination)."""
    g = p.add_argument_group("model")
    g.add_argument("--backbone", default=d["backbone"],
                   help="a tfdml.models.BACKBONES name, or 'tiny' (a small CNN)")
    g.add_argument("--weights", default=d["weights"], help="'imagenet' or 'none'")
    g.add_argument("--embedding-dim", type=positive_int, default=d["embedding_dim"])
    g.add_argument("--freeze-batchnorm", action=argparse.BooleanOptionalAction,
                   default=d["freeze_batchnorm"])


def _add_training_flags(p, d):
    """The ``training`` flags of :func:`make_parser` (``d``: the defaults by destination)."""
    g = p.add_argument_group("training")
    g.add_argument("--epochs", type=positive_int, default=d["epochs"])
    g.add_argument("--steps-per-epoch", type=positive_int, default=d["steps_per_epoch"],
                   help="default: every training class once per epoch (ceil(C / P) batches)")
    g.add_argument("--optimizer", choices=("sgd", "adam", "rmsprop"), default=d["optimizer"])
    g.add_argument("--learning-rate", "--lr", type=positive_float, default=d["learning_rate"])
    g.add_argument("--momentum", type=float, default=d["momentum"], help="SGD and RMSprop")
    g.add_argument("--weight-decay", type=float, default=d["weight_decay"],
                   help="decoupled weight decay of the Keras optimizer")
    g.add_argument("--lr-milestones", type=positive_int, nargs="*", default=list(d["lr_milestones"]),
                   help="epochs after which the learning rate is multiplied by --lr-gamma")
    g.add_argument("--lr-gamma", type=positive_float, default=d["lr_gamma"])
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
    g.add_argument("--logical-cpus", type=positive_int, default=d["logical_cpus"],
                   help="split the CPU into this many logical devices (with --strategy "
                        "mirrored on a machine without GPUs: one replica each)")


def _add_output_flags(p, d):
    """The ``output`` flags of :func:`make_parser` (``d``: the defaults by destination)."""
    g = p.add_argument_group("output")
    g.add_argument("--output-dir", default=d["output_dir"],
                   help="default: runs/<script>-<dataset>-<method>; an unfinished run there "
                        "resumes")
    g.add_argument("--eval-every", type=positive_int, default=d["eval_every"])
    g.add_argument("--eval-batch-size", type=positive_int, default=d["eval_batch_size"])
    g.add_argument("--export", action=argparse.BooleanOptionalAction, default=d["export"],
                   help="write a SavedModel of the best weights")
    g.add_argument("--verbose", type=int, choices=(0, 1, 2), default=d["verbose"],
                   help="1: progress bar, 2: one line per epoch, 0: quiet")
    g.add_argument("--smoke", action="store_true", default=d["smoke"],
                   help="a few steps on tiny generated data, a small CNN, no downloads: checks "
                        "that the script works end to end")


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
    _add_data_flags(p, d)
    _add_model_flags(p, d)
    _add_training_flags(p, d)
    _add_output_flags(p, d)
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
