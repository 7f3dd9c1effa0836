"""LoOp: train a metric learning loss with or without optimal hard negatives.

The Table 2 / Table 3 / Figure 3 / Figure 4 training of "LoOp: Looking for Optimal Hard
Negative Embeddings for Deep Metric Learning" (Vasudeva et al., ICCV 2021). Defaults are
the paper's settings: Adam (beta1 0.9, beta2 0.999), learning rate 1e-4, 512-d embedding,
images resized to 256 x 256, randomly cropped to 227 x 227 and flipped, batches of 32
images (CUB-200-2011, Cars196) or 128 (SOP), alpha_m = 2 and beta_m = 50 for MS. The
paper's GoogLeNet is not in keras.applications; InceptionV3 (ImageNet weights) stands in.

    python examples/loop/train.py --dataset cars196 --data-dir /data/cars196 --loss hphn
    python examples/loop/train.py --dataset cub200 --loss triplet --no-loop   # rand-disjoint
    python examples/loop/train.py --dataset cub200 --no-loop --sampling semihard
    python examples/loop/train.py --dataset cars196 --loss triplet --no-normalize  # Fig. 4
    python examples/loop/train.py --smoke            # seconds, synthetic data

A batch holds P classes with K images each (K even: LoOp pairs the images of a class);
``--batch-size`` with ``-K`` (default 4) or ``-P`` sets the other. A killed run resumes
when started again with the same command.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import sys

import tfdml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import experiments  # noqa: E402  (examples/experiments/: the papers' training loop)

LOSSES = ("triplet", "hphn", "lifted", "ms")
LOOP_BASE = {"triplet": "triplet", "hphn": "hphn_triplet", "lifted": "lifted_structure",
             "ms": "multi_similarity"}
#: The paper's method names (Tables 2 and 3).
NAMES = {"triplet": "Triplet", "hphn": "HPHNtri", "lifted": "LS", "ms": "MS"}
SAMPLING = {"rand-disjoint": ("random", "random"), "semihard": ("all", "semihard"),
            "distance-weighted": ("all", "distance_weighted")}
SAMPLING_NAMES = {"rand-disjoint": "Rand-disjoint", "semihard": "Semi-hard",
                  "distance-weighted": "Dis-weighted"}
BATCH_SIZE = {"sop": 128, "inshop": 128}  # 32 for the others (CUB-200-2011, Cars196)
#: Training images per data set: an epoch is one pass over them (supplementary, Sec. 6).
TRAIN_IMAGES = {"cub200": 5864, "cars196": 8054, "sop": 59551}
DEFAULT_K = 4
MS_EPSILON = {True: -0.02, False: 0.1}  # LoOp (Fig. 3d), baseline (Wang et al.)


def make_parser():
    parser = experiments.make_parser(
        __doc__.split("\n", 1)[0], backbone="inception_v3", embedding_dim=512,
        optimizer="adam", learning_rate=1e-4, epochs=50, image_size=227, resize_size=256,
        transform="crop", classes_per_batch=None, samples_per_class=None)
    g = parser.add_argument_group("LoOp")
    g.add_argument("--loss", choices=LOSSES, default="triplet",
                   help="triplet (eq. 14/15), HPHN-triplet, lifted structure (eq. 16) or MS")
    g.add_argument("--loop", action=argparse.BooleanOptionalAction, default=True,
                   help="optimal hard negatives (LoOp) or the plain loss")
    g.add_argument("--sampling", choices=tuple(SAMPLING), default=None,
                   help="--loss triplet --no-loop: the triplets (Table 3); default rand-disjoint")
    g.add_argument("--margin", type=float, default=0.2,
                   help="m of the triplet, HPHN-triplet and lifted structure losses "
                        "(not stated in the paper; Fig. 3b)")
    g.add_argument("--epsilon", type=float, default=None,
                   help="MS mining margin (default: -0.02 with LoOp, as in Fig. 3d; 0.1 without, "
                        "Wang et al.; the plain MS miner needs >= 0)")
    g.add_argument("--lambda", dest="lam", type=float, default=0.5,
                   help="MS similarity margin lambda (Fig. 3c)")
    g.add_argument("--alpha", type=float, default=2.0, help="MS alpha_m")
    g.add_argument("--beta", type=float, default=50.0, help="MS beta_m")
    g.add_argument("--normalize", action=argparse.BooleanOptionalAction, default=True,
                   help="l2-normalize the embeddings (model output and loss); --no-normalize: "
                        "LoOp between line segments (Section 4.2, Fig. 4)")
    g.add_argument("--batch-size", type=experiments.positive_int, default=None,
                   help="images per batch (default 32; 128 on SOP); P = batch size / K")
    return parser


def batch_shape(args, parser=None):
    """(P, K) from --batch-size, -P and -K (K must be even); flags that do not agree are
    refused (``parser.error``, or SystemExit without a parser)."""

    def fail(message):
        if parser is not None:
            parser.error(message)
        raise SystemExit(message)

    p, k = args.classes_per_batch, args.samples_per_class
    batch = args.batch_size
    if p is not None and k is not None:
        if batch is not None and batch != p * k:
            fail(f"--batch-size {batch} != P x K = {p} x {k}: give two of -P, -K and "
                 "--batch-size, or values that agree")
    else:
        batch = batch or BATCH_SIZE.get(args.dataset, 32)
        if p is None:
            k = k or DEFAULT_K
            p = batch // k
        else:
            k = batch // p
        if p * k != batch or p < 2:
            fail(f"--batch-size {batch} does not split into P >= 2 classes of K = {k}")
    if k % 2:
        fail(f"LoOp pairs the images of each class: K = {k} must be even")
    return p, k


#: The flags of the MS loss; --margin is the other losses'.
MS_FLAGS = {"epsilon": "--epsilon", "lam": "--lambda", "alpha": "--alpha", "beta": "--beta"}


def check_args(parser, argv=None):
    """The parsed flags with the defaults filled in and P x K resolved; flags that conflict
    or that the chosen loss would ignore are refused with ``parser.error``."""
    args = parser.parse_args(argv)
    given = experiments.given_flags(parser, argv)
    if args.sampling is not None and (args.loop or args.loss != "triplet"):
        parser.error("--sampling is for the triplet baseline only (--loss triplet --no-loop)")
    if args.loss == "ms":
        experiments.reject_flags(parser, given, {"margin": "--margin"},
                                 "with --loss ms (its margin is --lambda)")
    else:
        experiments.reject_flags(parser, given, MS_FLAGS,
                                 f"with --loss {args.loss} (they are the MS loss's)")
    if args.loss == "triplet" and not args.loop:
        args.sampling = args.sampling or "rand-disjoint"
    if args.epsilon is None:
        args.epsilon = MS_EPSILON[args.loop]
    if args.loss == "ms" and not args.loop and args.epsilon < 0:
        parser.error("the plain MS loss's miner needs --epsilon >= 0")
    args.classes_per_batch, args.samples_per_class = batch_shape(args, parser)
    return args


def make_loss(args):
    normalize = args.normalize
    if args.loop:
        options = {}
        margin = args.margin
        if args.loss == "ms":
            options = dict(alpha=args.alpha, beta=args.beta, epsilon=args.epsilon)
            margin = args.lam
        return tfdml.losses.LoOpLoss(LOOP_BASE[args.loss], margin=margin, normalize=normalize,
                                     **options)
    if args.loss == "triplet":
        positive, negative = SAMPLING[args.sampling]
        miner = tfdml.miners.TripletMiner(positive, negative,
                                          disjoint=args.sampling == "rand-disjoint",
                                          seed=args.seed)
        return tfdml.losses.TripletMarginLoss(margin=args.margin, distance="l2", miner=miner,
                                              normalize=normalize)
    if args.loss == "hphn":
        return tfdml.losses.HPHNTripletLoss(margin=args.margin, normalize=normalize)
    if args.loss == "lifted":
        return tfdml.losses.LiftedStructureLoss(margin=args.margin, normalize=normalize)
    miner = tfdml.miners.MultiSimilarityMiner(epsilon=args.epsilon)
    return tfdml.losses.MultiSimilarityLoss(alpha=args.alpha, beta=args.beta, base=args.lam,
                                            miner=miner, normalize=normalize)


def method_name(args):
    """The paper's name of the method, e.g. ``LoOp (HPHNtri)`` or ``Triplet (Semi-hard)``."""
    if args.loop:
        name = f"LoOp ({NAMES[args.loss]})"
    elif args.loss == "triplet":
        name = f"Triplet ({SAMPLING_NAMES[args.sampling]})"
    else:
        name = NAMES[args.loss]
    return name if args.normalize else f"{name}, no l2"


def main(argv=None):
    args = check_args(make_parser(), argv)
    if args.steps_per_epoch is None and not args.smoke and args.dataset in TRAIN_IMAGES:
        batch = args.classes_per_batch * args.samples_per_class
        args.steps_per_epoch = math.ceil(TRAIN_IMAGES[args.dataset] / batch)
    name = method_name(args)
    loss = functools.partial(make_loss, args)  # built inside the --strategy scope
    # experiments.build_model reads args.normalize (no L2Normalization layer when false).
    return experiments.run(args, loss, name=name,
                           extra_results=lambda model, data, eval_fn: {  # after --smoke
                               "batch_size": args.classes_per_batch * args.samples_per_class,
                               "loop": args.loop, "normalize": args.normalize})


if __name__ == "__main__":
    main()
