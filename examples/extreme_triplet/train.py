"""Extreme triplet learning: train with EPHN / EPSHN / HPHN / EPEN mining, 1st or 2nd order.

The Table 1 / Figure 4 / Figure 6 training of "Extreme triplet learning: effectively
optimizing easy positives and hard negatives". Defaults are the paper's Table 1 settings:
ResNet50 (ImageNet weights), 512-d embedding, SGD (momentum 0.9), learning rate 0.005
(0.0025 on CUB) divided by 10 after epochs 20 and 30, 40 epochs, batches of 128 images
with n images per class (the group size: 8 on CUB, 16 on Cars196, 2 on SOP and In-shop),
images resized to 256 x 256, padded by 10 px, randomly cropped back and flipped.

    python examples/extreme_triplet/train.py --dataset cars196 --data-dir /data/cars196
    python examples/extreme_triplet/train.py --dataset cub200 --order 1 --mining EPSHN
    python examples/extreme_triplet/train.py --smoke            # seconds, synthetic data

A batch holds P classes with K = n images each: ``--batch-size`` (default 128) and
``--group-size``/``-n`` (default: the paper's n for the data set) set them, or ``-P`` and
``-K`` (``-K`` is ``-n``); flags that do not agree are refused. ``--scatter`` records the
triplet scatter diagram of the test set after epochs 0, 5, 10, 15 and 40 (Figure 6). A
killed run resumes when started again with the same command.
"""

from __future__ import annotations

import os
import sys

import tfdml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import experiments  # noqa: E402  (examples/experiments/: the papers' training loop)

MINING = {"EPHN": ("easy", "hard"), "EPSHN": ("easy", "semihard"),
          "HPHN": ("hard", "hard"), "EPEN": ("easy", "easy")}
GROUP_SIZE = {"cub200": 8, "cars196": 16, "sop": 2, "inshop": 2, "omniglot": 2, "digits": 8,
              "vehicleid": 4}
FIGURE6_EPOCHS = (5, 10, 15, 40)


def make_parser():
    parser = experiments.make_parser(
        __doc__.split("\n", 1)[0], backbone="resnet50", embedding_dim=512, optimizer="sgd",
        learning_rate=0.005, momentum=0.9, lr_milestones=(20, 30), lr_gamma=0.1, epochs=40,
        image_size=256, resize_size=256, transform="pad_crop")
    g = parser.add_argument_group("extreme triplet")
    g.add_argument("--order", type=int, choices=(1, 2), default=2,
                   help="1st-order triplet NCA (eq. 1) or the 2nd-order fix (eq. 16); --loss nca")
    g.add_argument("--loss", choices=("nca", "margin"), default="nca",
                   help="the NCA triplet loss, or the vanilla margin triplet loss (appendix E)")
    g.add_argument("--margin", type=float, default=0.2, help="--loss margin")
    g.add_argument("--temperature", type=float, default=1.0,
                   help="NCA temperature (1.0: the paper's equations; the authors' code: 0.1)")
    g.add_argument("--mining", choices=tuple(MINING), default="EPHN")
    g.add_argument("--disjoint", action="store_true",
                   help="each sample in at most one triplet per batch (Section 6.1)")
    g.add_argument("--group-size", "-n", type=experiments.positive_int, default=None,
                   help="n images per class in a batch, the same as -K (default: the paper's "
                        "optimum per data set); P = batch size / n unless -P is given")
    g.add_argument("--batch-size", type=experiments.positive_int, default=128,
                   help="images per batch (with -P: must be P x n)")
    g.add_argument("--scatter", action="store_true",
                   help="record the test set's triplet scatter diagram after epochs "
                        "0, 5, 10, 15, 40 (Figure 6)")
    return parser


def make_loss(args):
    positive, negative = MINING[args.mining]
    miner = tfdml.miners.TripletMiner(positive, negative, disjoint=args.disjoint,
                                      seed=args.seed)
    if args.loss == "margin":
        return tfdml.losses.TripletMarginLoss(margin=args.margin, miner=miner)
    return tfdml.losses.TripletNCALoss(order=args.order, temperature=args.temperature,
                                       miner=miner)


def method_name(args):
    if args.loss == "margin":
        return f"margin triplet {args.mining}"
    return f"{'1st' if args.order == 1 else '2nd'} order {args.mining}"


def resolve_args(parser, argv=None):
    """The parsed flags with the paper's per-data-set defaults filled in, P x K resolved.

    Flags given on the command line are honoured (``-P``/``-K`` as well as
    ``--batch-size``/``--group-size``); flags that contradict each other, or that the chosen
    loss does not use, are refused with ``parser.error``.
    """
    args = parser.parse_args(argv)
    given = experiments.given_flags(parser, argv)
    if args.dataset == "cub200" and "learning_rate" not in given:
        args.learning_rate = 0.0025  # the paper's CUB setting
    args.classes_per_batch, args.samples_per_class = experiments.batch_shape(
        parser, args, given, samples_per_class=GROUP_SIZE[args.dataset],
        batch_size=parser.get_default("batch_size"))
    if args.loss == "margin":
        experiments.reject_flags(parser, given,
                                 {"order": "--order", "temperature": "--temperature"},
                                 "with --loss margin (they are the NCA loss's)")
    else:
        experiments.reject_flags(parser, given, {"margin": "--margin"},
                                 "with --loss nca (it is the margin loss's)")
    return args


def check_args(argv=None):
    """:func:`resolve_args` of a new parser: the flags' check, for a sweep."""
    return resolve_args(make_parser(), argv)


def main(argv=None):
    args = resolve_args(make_parser(), argv)
    positive, negative = MINING[args.mining]

    def callbacks(model, data, eval_fn, out):
        if not args.scatter:
            return []
        split = next(iter(data.evaluation.values()))
        ds = tfdml.data.eval_batches(split, args.eval_batch_size, map_fn=eval_fn)
        every = tuple(e for e in FIGURE6_EPOCHS if e <= args.epochs) or (args.epochs,)
        return [tfdml.callbacks.TripletScatter(ds, every=every, positive=positive,
                                               negative=negative, initial=True,
                                               output_dir=os.path.join(out, "figures"),
                                               name="scatter", files=("npz", "grid"))]

    def figures(model, data, eval_fn, out, history):
        grid = os.path.join(out, "figures", "scatter.png")
        return [grid] if args.scatter and os.path.exists(grid) else []

    results = experiments.run(args, lambda: make_loss(args), name=method_name(args),
                              callbacks=callbacks, figures=figures)
    results["group_size"] = args.samples_per_class  # after --smoke
    return results


if __name__ == "__main__":
    main()
