"""Easy positive sampling (EPS): train a triplet, margin or MS loss with or without EPS.

The Tables 2/3, Figure 3 and trimmed-loss (appendix C, Figure 6) training of "Reducing
class collapse in metric learning with easy positive sampling". Defaults are the paper's
settings (Section 5.2, appendix C): ResNet50 (ImageNet weights) with frozen BatchNorm,
global average pooling and a linear 128-d embedding, Adam with learning rate 1e-5,
batches of 160 images (P = 20 classes x K = 8 images: the split of 160 into P x K is our
choice, the paper gives only the batch size), Omniglot trained with the *alphabet*
(language) labels, evaluated with both the alphabet and the letter labels (Table 3).

Losses (``--loss``), each with random-style positives (``--no-eps``, the baseline) or the
easy positive, the anchor's nearest same-class sample in the batch (``--eps``):

* ``triplet``: ``TripletMarginLoss`` (margin 0.2) + semi-hard negatives ("Trip. + SH");
* ``margin``: ``MarginLoss`` (alpha 0.2, beta 1.2 learned per class with its own
  learning rate 5e-4) + distance-weighted negatives ("Dist-Margin");
* ``ms``: ``MultiSimilarityLoss`` (alpha 2, beta 50, lambda 1) with the MS miner, whose
  positive hard mining EPS replaces ("MS").

``--trim f`` wraps the loss in ``TrimmedLoss`` (the worst fraction f of the anchors of each
batch is left out), the comparison of the paper's appendix C.

    python examples/class_collapse/train.py --dataset omniglot --data-dir /data/omniglot --loss margin --eps
    python examples/class_collapse/train.py --dataset cars196 --data-dir /data/cars196 --loss ms --no-eps
    python examples/class_collapse/train.py --smoke --loss margin      # seconds, synthetic data

Per data set defaults of the input (when ``--image-size``/``--resize-size``/``--transform``
are not given): 224 px random crops of 256 px images with flips for CUB and Cars196 (crop
224, as in the paper), 80 x 80 images without augmentation for Omniglot (the paper's input
size; characters are not flipped), 8 x 8 for digits. ``--steps-per-epoch`` defaults to one
pass over the training images (ceil(N / batch size) batches). A killed run resumes when
started again with the same command.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import numpy as np

import tfdml
from tfdml._files import save_figure, write_json, write_text  # whole or not at all

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import experiments  # noqa: E402  (examples/experiments/: the papers' training loop)

LOSSES = ("triplet", "margin", "ms")
#: The paper's names of the baselines (Tables 2 and 3).
NAMES = {"triplet": "Trip. + SH", "margin": "Dist-Margin", "ms": "MS"}
#: Input defaults per data set: (image size, resize size, transform).
INPUT = {"omniglot": (80, 80, "none"), "digits": (8, 8, "none")}
INPUT_DEFAULT = (224, 256, "crop")
#: NMI+ (Tables 2 and 3): k-means with this many clusters per evaluated class.
NMI_PLUS_FACTOR = {"omniglot": 30}
NMI_PLUS_DEFAULT = 10


def make_parser():
    parser = experiments.make_parser(
        __doc__.split("\n", 1)[0], dataset="omniglot", omniglot_label="alphabet",
        backbone="resnet50", weights="imagenet", freeze_batchnorm=True, embedding_dim=128,
        optimizer="adam", learning_rate=1e-5, epochs=60, classes_per_batch=20,
        samples_per_class=8, image_size=None, resize_size=None, transform=None)
    g = parser.add_argument_group("easy positive sampling")
    g.add_argument("--loss", choices=LOSSES, default="margin",
                   help="triplet + semi-hard, margin + distance-weighted, or multi-similarity")
    g.add_argument("--eps", action=argparse.BooleanOptionalAction, default=True,
                   help="easy positive sampling (the nearest same-class sample in the batch)")
    g.add_argument("--baseline-positive", choices=("random", "all", "hard"), default=None,
                   help="positives without EPS; default: random (triplet, margin), the MS "
                        "miner's hard positive mining (ms)")
    g.add_argument("--trim", type=float, default=0.0,
                   help="TrimmedLoss: fraction of the anchors of a batch with the highest "
                        "loss to leave out (0: off)")
    g.add_argument("--batch-size", type=experiments.positive_int, default=None,
                   help="images per batch; when given, P = batch size / K (with -P: must be "
                        "P x K)")
    g.add_argument("--margin", type=float, default=0.2,
                   help="triplet margin; margin loss alpha")
    g.add_argument("--triplet-distance", choices=("squared_l2", "l2"), default="squared_l2")
    g.add_argument("--beta", type=float, default=1.2, help="margin loss: initial beta")
    g.add_argument("--beta-lr", type=float, default=5e-4,
                   help="margin loss: learning rate of beta (Adam); beta_lr_multiplier = "
                        "beta-lr / learning-rate")
    g.add_argument("--shared-beta", action="store_true",
                   help="margin loss: one beta for all classes instead of one per class")
    g.add_argument("--num-classes", type=int, default=None,
                   help="margin loss: size of the per-class beta; default: the largest "
                        "training class id + 1, read from the data")
    g.add_argument("--ms-alpha", type=float, default=2.0)
    g.add_argument("--ms-beta", type=float, default=50.0)
    g.add_argument("--ms-lambda", type=float, default=1.0, help="MS threshold (base)")
    g.add_argument("--ms-epsilon", type=float, default=0.1, help="MS mining margin")
    return parser


def make_loss(args):
    """The loss of ``args``: the baseline or EPS, optionally trimmed."""
    positive = "easy" if args.eps else args.baseline_positive
    if args.loss == "triplet":
        miner = tfdml.miners.TripletMiner(positive or "random", "semihard", seed=args.seed)
        loss = tfdml.losses.TripletMarginLoss(margin=args.margin,
                                              distance=args.triplet_distance, miner=miner)
    elif args.loss == "margin":
        miner = tfdml.miners.TripletMiner(positive or "random", "distance_weighted",
                                          seed=args.seed)
        loss = tfdml.losses.MarginLoss(
            margin=args.margin, beta=args.beta, miner=miner,
            num_classes=None if args.shared_beta else args.num_classes,
            beta_lr_multiplier=args.beta_lr / args.learning_rate)
    else:
        miner = tfdml.miners.MultiSimilarityMiner(epsilon=args.ms_epsilon,
                                                  positive=positive or "hard")
        loss = tfdml.losses.MultiSimilarityLoss(alpha=args.ms_alpha, beta=args.ms_beta,
                                                base=args.ms_lambda, miner=miner)
    if args.trim > 0:
        loss = tfdml.losses.TrimmedLoss(loss, trim=args.trim)
    return loss


def method_name(args):
    name = ("EPS + " if args.eps else "") + NAMES[args.loss]
    if args.baseline_positive and not args.eps:
        name += f" ({args.baseline_positive} positives)"
    if args.trim > 0:
        name += f" + trimmed {args.trim:g}"
    return name


#: The flags each loss uses; given with another --loss they are refused.
LOSS_FLAGS = {"margin": ("--margin", ("triplet", "margin")),
              "triplet_distance": ("--triplet-distance", ("triplet",)),
              "beta": ("--beta", ("margin",)), "beta_lr": ("--beta-lr", ("margin",)),
              "shared_beta": ("--shared-beta", ("margin",)),
              "num_classes": ("--num-classes", ("margin",)),
              "ms_alpha": ("--ms-alpha", ("ms",)), "ms_beta": ("--ms-beta", ("ms",)),
              "ms_lambda": ("--ms-lambda", ("ms",)), "ms_epsilon": ("--ms-epsilon", ("ms",))}


def check_args(parser, argv=None):
    """The parsed flags with P x K resolved; flags that conflict or would be ignored are
    refused with ``parser.error`` (no data is loaded)."""
    args = parser.parse_args(argv)
    given = experiments.given_flags(parser, argv)
    args.classes_per_batch, args.samples_per_class = experiments.batch_shape(
        parser, args, given, samples_per_class=parser.get_default("samples_per_class"),
        classes_per_batch=parser.get_default("classes_per_batch"))
    if args.eps:
        experiments.reject_flags(parser, given, {"baseline_positive": "--baseline-positive"},
                                 "with --eps (the positives are the easy ones): add --no-eps")
    for dest, (flag, losses) in LOSS_FLAGS.items():
        if args.loss not in losses:
            experiments.reject_flags(parser, given, {dest: flag},
                                     f"with --loss {args.loss} (it is for --loss "
                                     f"{' / '.join(losses)})")
    if args.shared_beta:
        experiments.reject_flags(parser, given, {"num_classes": "--num-classes"},
                                 "with --shared-beta (one beta for all classes)")
    if not 0 <= args.trim < 1:
        parser.error(f"--trim must be in [0, 1), got {args.trim}")
    return args


def prepare_args(args):
    """Fills the defaults that depend on the data set and on the training split.

    Returns:
        ``(args, data)``: the data (``experiments.load_data``) is loaded here because the
        per-class beta needs the number of classes before the loss is built.
    """
    size, resize, transform = INPUT.get(args.dataset, INPUT_DEFAULT)
    args.image_size = args.image_size or size
    args.resize_size = args.resize_size or round(args.image_size * resize / size)
    args.transform = args.transform or transform
    if args.eps and args.samples_per_class <= 2 and not args.smoke:
        print("Warning: with K <= 2 images per class the easy positive is the only "
              "positive: EPS changes nothing (use K > 2).", flush=True)
    if args.smoke:
        experiments.apply_smoke(args)
    data = experiments.load_data(args)
    labels = data.train.labels
    if args.num_classes is None:
        args.num_classes = int(labels.max()) + 1
    if args.steps_per_epoch is None and not args.smoke:
        args.steps_per_epoch = max(1, math.ceil(
            len(labels) / (args.classes_per_batch * args.samples_per_class)))
    return args, data


def _embed(model, split, eval_fn, batch_size):
    ds = tfdml.data.eval_batches(split, batch_size, map_fn=eval_fn)
    return np.concatenate([model(x, training=False).numpy() for x, _ in ds]).astype(np.float32)


def _letters_split(args, test):
    """Omniglot's test split with the character (letter) labels, in the order of ``test``."""
    from tfdml import datasets

    letters = datasets.load("omniglot", "test", data_dir=args.data_dir, source=args.source,
                            label="character")
    for attr in ("paths", "encoded"):
        a, b = getattr(letters, attr), getattr(test, attr)
        if a is not None and (b is None or len(a) != len(b) or np.any(a != b)):
            raise RuntimeError("Omniglot's letter and alphabet test splits differ in order.")
    return letters


def extra_results(args, get_loss):
    """``fn(model, data, eval_fn) -> dict``: NMI+, Table 3's letter metrics, the learned beta."""

    def fn(model, data, eval_fn):
        loss = get_loss()
        out = {"metrics_extra": {}}
        if loss.trainable_variables:
            beta = np.asarray(loss.loss.beta if isinstance(loss, tfdml.losses.TrimmedLoss)
                              else loss.beta, np.float64).reshape(-1)
            out["beta"] = {"initial": args.beta, "mean": float(beta.mean()),
                           "min": float(beta.min()), "max": float(beta.max()),
                           "values": beta.tolist()}
        if "test" not in data.evaluation:  # In-shop, VehicleID: the loop's metrics only
            return out
        test = data.evaluation["test"]
        emb = _embed(model, test, eval_fn, args.eval_batch_size)
        factor = NMI_PLUS_FACTOR.get(args.dataset, NMI_PLUS_DEFAULT)
        k = min(len(emb) - 1, factor * len(np.unique(test.labels)))
        out["metrics_extra"] = {"val_nmi_plus": tfdml.metrics.nmi(emb, test.labels,
                                                                  num_clusters=k)}
        out["nmi_plus_clusters"] = k
        if args.dataset == "omniglot" and args.omniglot_label == "alphabet" and not args.smoke:
            letters = _letters_split(args, test).labels
            ks = experiments.RECALL_KS["omniglot"]
            recall = tfdml.metrics.recall_at_k(emb, letters, ks)
            out["letters"] = {**{f"recall@{k}": v for k, v in recall.items()},
                              "nmi": tfdml.metrics.nmi(emb, letters)}
        return out

    return fn


def run_name(args):
    """A folder name for the method: ``<dataset>-<loss>[-eps][-trim<f>]``."""
    name = f"{args.dataset}-{args.loss}{'-eps' if args.eps else ''}"
    return name + (f"-trim{args.trim:g}" if args.trim > 0 else "")


def main(argv=None):
    args = check_args(make_parser(), argv)
    args.output_dir = args.output_dir or os.path.join(
        "runs", "class_collapse-" + run_name(args) + ("-smoke" if args.smoke else ""))
    args, data = prepare_args(args)
    built = {}

    def loss_factory():  # called by experiments.run inside the --strategy scope
        built["loss"] = make_loss(args)
        return built["loss"]

    results = experiments.run(args, loss_factory, name=method_name(args), data=data,
                              extra_results=extra_results(args, lambda: built["loss"]))
    # The extra metrics go into ``metrics`` too, so that experiments.sweep tabulates them.
    extra = results.pop("metrics_extra")
    extra.update({f"val_letters_{k}": v for k, v in results.get("letters", {}).items()})
    results["metrics"].update(extra)
    _rewrite_results(args.output_dir, results, extra)
    return results


def _rewrite_results(out, results, extra):
    """``run`` wrote results.json and results.md before the extra metrics were merged."""
    path = os.path.join(out, "results.json")
    write_json(path, results, default=float)
    markdown = os.path.join(out, "results.md")
    with open(markdown) as f:
        text = f.read()
    text += ("\nMore metrics (NMI+: k-means with more clusters than classes; letters: "
             "Omniglot's character labels):\n\n")
    text += experiments.markdown_table([{"metric": k, "value": v} for k, v in extra.items()])
    if "beta" in results:
        b = results["beta"]
        text += (f"\nLearned beta: mean {b['mean']:.4f}, min {b['min']:.4f}, "
                 f"max {b['max']:.4f} (initial {b['initial']}).\n")
    write_text(markdown, text)


# -- the sweep scripts' shared part -------------------------------------------------------------


def sweep_parser(description, **defaults):
    """The flags of a sweep script; every other flag goes to ``train.py``."""
    p = argparse.ArgumentParser(description=description,
                                epilog="Other flags are passed to train.py (see its --help).")
    p.add_argument("--seeds", type=int, default=defaults.pop("seeds", 1),
                   help="runs per setting with seeds 0..n-1 (the paper: means of 8 runs)")
    p.add_argument("--output-dir", default=None,
                   help="the sweep's folder; default: runs/class_collapse-<sweep>-<dataset>")
    p.add_argument("--metric", default=None,
                   help="the metric plotted; default: the letters' R@1 for Omniglot trained "
                        "with alphabet labels, else val_recall@1")
    for flag, (kwargs) in defaults.items():
        p.add_argument(flag, **kwargs)
    return p


def train_args(argv):
    """``train.py``'s flags as parsed (to read the data set of a sweep)."""
    return make_parser().parse_args(argv)


def default_metric(argv):
    a = train_args(argv)
    if a.dataset == "omniglot" and a.omniglot_label == "alphabet" and not a.smoke:
        return "val_letters_recall@1"
    return "val_recall@1"


def run_grid(argv, runs, seeds, output_dir, title):
    """``experiments.sweep`` over ``runs`` x seeds, then the mean and std over the seeds.

    Returns:
        ``[{"run": name, "method": ..., "seeds": n, metric: mean, metric + "_std": std}]``,
        also written to ``summary.json`` and ``summary.md`` in ``output_dir``.
    """
    grid = {f"{name}-s{seed}": [*extra, "--seed", str(seed)]
            for name, extra in runs.items() for seed in range(seeds)}
    rows = experiments.sweep(main, argv, grid, output_dir, title=title,
                             check=lambda flags: check_args(make_parser(), flags))
    summary = []
    for name in runs:
        mine = [r for r in rows if r["run"].rsplit("-s", 1)[0] == name]
        row = {"run": name, "method": mine[0]["method"], "seeds": len(mine)}
        for key in mine[0]:
            if key.startswith("val_"):
                values = np.array([r[key] for r in mine], np.float64)
                row[key] = float(values.mean())
                if len(mine) > 1:
                    row[key + "_std"] = float(values.std())
        summary.append(row)
    write_json(os.path.join(output_dir, "summary.json"), summary)
    write_text(os.path.join(output_dir, "summary.md"),
               f"# {title}\n\nMean over seeds 0-{seeds - 1} (std: NumPy's population std)."
               f"\n\n{experiments.markdown_table(summary)}")
    print(experiments.markdown_table(summary), flush=True)
    return summary


def sweep_dir(args, rest, sweep):
    return args.output_dir or os.path.join(
        "runs", f"class_collapse-{sweep}-{train_args(rest).dataset}")


def plot_lines(path, series, x_label, y_label, title, references=(), log_x=False):
    """A line plot: ``series`` = ``{label: ([x], [y])}``; ``references`` = ``[(label, y)]``
    drawn as dashed horizontal lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.8, 3.4))
    for label, (xs, ys) in series.items():
        ax.plot(xs, ys, marker="o", label=label)
    for i, (label, y) in enumerate(references):
        ax.axhline(y, linestyle="--", color=f"C{len(series) + i}", label=label)
    if log_x:
        ax.set_xscale("log", base=2)
    ax.set_xlabel(x_label)
    ax.set_ylabel(y_label)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    main()
