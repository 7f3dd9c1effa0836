"""FAPPY and its baselines: contrastive, triplet, lifted structure and histogram losses.

The training of Tables 1 and 2 of "Deep Metric Learning with False Positive Probability"
(Zhong, Li and Li): Recall@K on CUB-200-2011 and Stanford Online Products (Table 1), the
top-1/top-5 match rates on VehicleID's small, medium and large test sets and the CMC of the
small one (Table 2, Fig. 6). ``--min-bin-width`` is FAPPY's only hyper-parameter (0.01,
0.001 and 0.0001 in the paper).

Defaults are the paper's settings where it states them, else those of the authors' released
Caffe files (``models/*/solver.prototxt``, ``train.prototxt``): SGD with momentum 0.9 and
weight decay 2e-4, images resized to 256 and randomly cropped to 224 and flipped, and

* CUB-200-2011 / SOP (Table 1): GoogLeNet in the paper, which Keras does not ship:
  ``inception_v3`` is the closest backbone in ``tfdml.models.BACKBONES`` (the Inception
  family); 512-d embedding, batches of 128 images, learning rate 1e-5 (CUB) or 1e-4 (SOP);
* VehicleID (Table 2): VGG_CNN_M_1024 in the paper, not in Keras: ``vgg16`` is the
  closest; 1024-d embedding, batches of 150 images, learning rate 5e-4.

Neither the paper nor the released files give the training length (the solvers run until
stopped by hand), so ``--epochs`` is our choice. Their step schedule (x0.7 every 32,000
iterations on CUB and VehicleID, 160,000 on SOP) is not used by default (``--lr-milestones``
and ``--lr-gamma 0.7`` give an epoch-based version); the 10x learning rate of the new
embedding layer is not available in ``examples/experiments/`` either.

    python examples/fappy/train.py --dataset cub200 --data-dir /data/cub200 --loss fappy
    python examples/fappy/train.py --dataset vehicleid --data-dir /data/vehicleid \\
        --loss fappy --min-bin-width 0.001
    python examples/fappy/train.py --smoke                       # seconds, synthetic data
    python examples/fappy/train.py --smoke --dataset vehicleid   # match rates + CMC

A killed run resumes when started again with the same command.
"""

from __future__ import annotations

import os
import sys

import numpy as np

import tfdml
from tfdml._files import save_figure  # whole or not at all

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import experiments  # noqa: E402  (examples/experiments/: the papers' training loop)

LOSSES = ("fappy", "contrastive", "triplet", "lifted", "histogram")

#: The paper's (or its released code's) settings per data set; other data sets use CUB's.
PAPER_SETTINGS = {
    "cub200": dict(backbone="inception_v3", embedding_dim=512, learning_rate=1e-5,
                   batch_size=128, samples_per_class=8),
    "sop": dict(backbone="inception_v3", embedding_dim=512, learning_rate=1e-4,
                batch_size=128, samples_per_class=2),
    "vehicleid": dict(backbone="vgg16", embedding_dim=1024, learning_rate=5e-4,
                      batch_size=150, samples_per_class=6),
    # Not in the paper: the offline stand-in (6 training digits, 8 images of each a batch).
    "digits": dict(backbone="inception_v3", embedding_dim=512, learning_rate=1e-5,
                   batch_size=48, samples_per_class=8),
}
CMC_TOP_K = 50
NUM_DRAWS = 10  # "repeat the query 10 times in test phase"


def make_parser():
    parser = experiments.make_parser(
        __doc__.split("\n", 1)[0], dataset="cub200", backbone=None, embedding_dim=None,
        learning_rate=None, classes_per_batch=None, samples_per_class=None, optimizer="sgd",
        momentum=0.9, weight_decay=2e-4, epochs=60, image_size=224, resize_size=256,
        transform="crop")
    g = parser.add_argument_group("FAPPY paper")
    g.add_argument("--loss", choices=LOSSES, default="fappy")
    g.add_argument("--min-bin-width", type=float, default=0.01,
                   help="FAPPY: the smallest bin width Delta_min (0.01, 0.001, 0.0001 in the "
                        "paper)")
    g.add_argument("--bin-width", type=float, default=0.01,
                   help="histogram loss: the bin width")
    g.add_argument("--margin", type=float, default=None,
                   help="triplet and lifted structure margin (default 0.2); contrastive: the "
                        "negative margin (default 0.5)")
    g.add_argument("--positive-margin", type=float, default=0.0,
                   help="contrastive: no pull once a positive pair is closer than this")
    g.add_argument("--batch-size", type=experiments.positive_int, default=None,
                   help="images per batch (default: the paper's, 128 or 150 on VehicleID); "
                        "P = batch size / K unless -P is given (then it must be P x K)")
    g.add_argument("--cmc-top-k", type=experiments.positive_int, default=CMC_TOP_K,
                   help="VehicleID: length of the CMC curve of the small test set")
    return parser


#: The flags each loss uses; the others are refused (they would be ignored).
LOSS_FLAGS = {"min_bin_width": ("--min-bin-width", ("fappy",)),
              "bin_width": ("--bin-width", ("histogram",)),
              "margin": ("--margin", ("contrastive", "triplet", "lifted")),
              "positive_margin": ("--positive-margin", ("contrastive",))}


def resolve_defaults(args, parser=None, given=None):
    """Fills the per-data-set defaults (backbone, embedding, lr, P x K) left unset.

    ``-P``, ``-K`` and ``--batch-size`` given together must agree; a loss's flag given with
    another ``--loss`` is refused, and so is ``--cmc-top-k`` for a data set other than
    VehicleID (``parser.error``). ``given``: the flags given (``experiments.given_flags``);
    defaults to those not `None`.
    """
    parser = parser or make_parser()
    if given is None:
        given = {k for k, v in vars(args).items()
                 if v is not None and v != parser.get_default(k)}
    paper = PAPER_SETTINGS.get(args.dataset, PAPER_SETTINGS["cub200"])
    for key in ("backbone", "embedding_dim", "learning_rate"):
        if getattr(args, key) is None:
            setattr(args, key, paper[key])
    args.classes_per_batch, args.samples_per_class = experiments.batch_shape(
        parser, args, given, samples_per_class=paper["samples_per_class"],
        batch_size=paper["batch_size"])
    args.batch_size = args.classes_per_batch * args.samples_per_class
    for dest, (flag, losses) in LOSS_FLAGS.items():
        if args.loss not in losses:
            experiments.reject_flags(parser, given, {dest: flag},
                                     f"with --loss {args.loss} (it is for --loss "
                                     f"{' / '.join(losses)})")
    if args.dataset != "vehicleid":
        experiments.reject_flags(parser, given, {"cmc_top_k": "--cmc-top-k"},
                                 "except on VehicleID")
    return args


def check_args(argv=None):
    """The parsed flags with the defaults filled in (:func:`resolve_defaults`); flags that
    conflict or would be ignored are refused with ``parser.error``."""
    parser = make_parser()
    return resolve_defaults(parser.parse_args(argv), parser,
                            experiments.given_flags(parser, argv))


def make_loss(args):
    if args.loss == "fappy":
        return tfdml.losses.FAPPYLoss(min_bin_width=args.min_bin_width)
    if args.loss == "histogram":
        return tfdml.losses.HistogramLoss(bin_width=args.bin_width)
    if args.loss == "contrastive":
        return tfdml.losses.ContrastiveLoss(
            positive_margin=args.positive_margin,
            negative_margin=0.5 if args.margin is None else args.margin)
    margin = 0.2 if args.margin is None else args.margin
    if args.loss == "triplet":  # FaceNet: every positive with its semi-hard negative
        return tfdml.losses.TripletMarginLoss(
            margin=margin, miner=tfdml.miners.TripletMiner("all", "semihard", seed=args.seed))
    return tfdml.losses.LiftedStructureLoss(margin=margin)


def method_name(args):
    if args.loss == "fappy":
        return f"FAPPY {args.min_bin_width:g}"
    return {"contrastive": "Contrastive", "triplet": "Triplet", "lifted": "LiftStruct",
            "histogram": "Histogram"}[args.loss]


# -- VehicleID: the CMC of the small test set (Fig. 6) ------------------------------------------


def embed(model, split, eval_fn, batch_size):
    """The embeddings of a split, in its order (evaluation transform, inference mode)."""
    ds = tfdml.data.eval_batches(split, batch_size, map_fn=eval_fn)
    chunks = [np.asarray(model(x, training=False)) for x, _ in ds]
    return np.concatenate(chunks).astype(np.float32), np.asarray(split.labels)


def vehicleid_cmc(embeddings, labels, top_k=CMC_TOP_K, num_draws=NUM_DRAWS, seed=0):
    """The CMC under the VehicleID protocol, averaged over ``num_draws`` random galleries.

    Each draw puts one random image of every vehicle in the gallery and queries with all the
    others (``tfdml.datasets.vehicleid_query_gallery`` needs path-based splits, so the split
    is drawn here). The draws are those of ``tfdml.metrics.vehicleid_match_rate`` with the
    same seed, so ``cmc[0]`` and ``cmc[4]`` are its top-1 and top-5 match rates.
    """
    labels = np.asarray(labels, np.int64)
    classes, inverse = np.unique(labels, return_inverse=True)
    top_k = max(1, min(top_k, len(classes)))
    order = np.argsort(inverse, kind="stable")
    starts = np.searchsorted(inverse[order], np.arange(len(classes)))
    counts = np.bincount(inverse)
    rng = np.random.default_rng(seed)
    total = np.zeros(top_k)
    for _ in range(num_draws):
        gallery = order[starts + rng.integers(0, counts)]
        query = np.ones(len(labels), bool)
        query[gallery] = False
        total += tfdml.metrics.cmc(embeddings[query], labels[query], embeddings[gallery],
                                   labels[gallery], top_k=top_k)
    return total / num_draws


def plot_cmc(curve, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = np.arange(1, len(curve) + 1)
    fig, ax = plt.subplots(figsize=(4.5, 3.2))
    ax.plot(ranks, 100 * np.asarray(curve), marker="o", markersize=3)
    ax.set_xlabel("rank")
    ax.set_ylabel("match rate (%)")
    ax.set_ylim(0, 100)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)


def main(argv=None):
    args = check_args(argv)
    name = method_name(args)
    cache = {}

    def small_cmc(model, data, eval_fn):
        if "cmc" not in cache:
            emb, labels = embed(model, data.evaluation["test_small"], eval_fn,
                                args.eval_batch_size)
            cache["cmc"] = vehicleid_cmc(emb, labels, top_k=args.cmc_top_k, seed=0)
        return cache["cmc"]

    def extra_results(model, data, eval_fn):
        extra = {"loss": args.loss, "batch_size": args.batch_size}
        if args.loss == "fappy":
            extra["min_bin_width"] = args.min_bin_width
        if data.name == "vehicleid":
            curve = small_cmc(model, data, eval_fn)
            extra["cmc_small"] = [float(v) for v in curve]
            extra["cmc_small_draws"] = NUM_DRAWS
        return extra

    def figures(model, data, eval_fn, out, history):
        if data.name != "vehicleid":
            return []
        path = os.path.join(out, "figures", "cmc_small.png")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        plot_cmc(small_cmc(model, data, eval_fn), path,
                 f"CMC, VehicleID small test set: {name}"
                 f"{' (smoke)' if args.smoke else ''}")
        return [path]

    results = experiments.run(args, lambda: make_loss(args), name=name, figures=figures,
                              extra_results=extra_results)
    if "cmc_small" in results:
        script = os.path.splitext(os.path.basename(sys.argv[0] or "run"))[0]
        out = args.output_dir or os.path.join("runs", f"{script}-{args.dataset}")  # as run()
        curve = results["cmc_small"]
        ranks = [k for k in (1, 5, 10, 20, 30, 40, 50) if k <= len(curve)]
        with open(os.path.join(out, "results.md"), "a") as f:
            f.write(f"\nCMC of the small test set (mean of {NUM_DRAWS} gallery draws):\n\n")
            f.write(experiments.markdown_table(
                [{"rank": k, "match rate": curve[k - 1]} for k in ranks]))
    return results


if __name__ == "__main__":
    main()
