"""Extreme triplet learning, Section 6.1: where do HPHN / EPEN triplets move after a step?

Trains with hard-positive/hard-negative (HPHN, Problem 1) or easy-positive/easy-negative
(EPEN, Problem 2) triplets, one triplet per sample (disjoint), n = 16 images per class, at
a very low learning rate, and after every optimizer step measures the same triplets again
(`tfdml.analysis.triplet_movement`): the shares of triplets that moved up-right, up-left,
down-left and down-right in the (S_ap, S_an) plane (Figure 3). The paper trains 2 epochs
on Cars196 at the initial phase (ImageNet weights) and at a later phase (a trained model:
pass its weights with --init-weights, e.g. the best.weights.h5 of train.py).

    python examples/extreme_triplet/movement.py --dataset cars196 --data-dir /data/cars196 \\
        --mining HPHN --order 1
    python examples/extreme_triplet/movement.py --smoke

Writes movement.json (per epoch and total shares), movement.md and figures/movement.png.
The learning rate is 1e-5 (one copy of the paper says 1e-6).
"""

from __future__ import annotations

import os
import sys
import time

import keras

import tfdml
from tfdml._files import save_figure, write_json, write_text  # whole or not at all

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import experiments  # noqa: E402  (examples/experiments/: the papers' training loop)

DIRECTIONS = ("up_right", "up_left", "down_left", "down_right", "still")


def make_parser():
    parser = experiments.make_parser(
        __doc__.split("\n", 1)[0], dataset="cars196", backbone="resnet50", embedding_dim=512,
        optimizer="sgd", learning_rate=1e-5, momentum=0.9, epochs=2, image_size=256,
        resize_size=256, transform="pad_crop", export=False)
    g = parser.add_argument_group("movement")
    g.add_argument("--order", type=int, choices=(1, 2), default=1)
    g.add_argument("--mining", choices=("HPHN", "EPEN"), default="HPHN")
    g.add_argument("--group-size", "-n", type=experiments.positive_int, default=16,
                   help="n images per class in a batch, the same as -K")
    g.add_argument("--batch-size", type=experiments.positive_int, default=128,
                   help="images per batch; P = batch size / n unless -P is given")
    g.add_argument("--temperature", type=float, default=1.0)
    g.add_argument("--init-weights", default=None,
                   help="weights (.weights.h5) of a trained model: the later phase")
    return parser


def plot(totals, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.5, 3))
    ax.bar(range(len(DIRECTIONS)), [totals[d] for d in DIRECTIONS], color="tab:blue")
    ax.set_xticks(range(len(DIRECTIONS)), [d.replace("_", "-") for d in DIRECTIONS])
    ax.set_ylabel("share of triplets")
    ax.set_ylim(0, 1)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)


#: Flags of experiments.make_parser that this script does not use (a plain SGD loop, no
#: evaluation, no export).
UNUSED_FLAGS = {"optimizer": "--optimizer", "weight_decay": "--weight-decay",
                "lr_milestones": "--lr-milestones", "lr_gamma": "--lr-gamma",
                "jit_compile": "--jit-compile", "deterministic": "--deterministic",
                "mixed_precision": "--mixed-precision", "strategy": "--strategy",
                "logical_cpus": "--logical-cpus", "eval_every": "--eval-every",
                "eval_batch_size": "--eval-batch-size", "export": "--export"}


def main(argv=None):
    parser = make_parser()
    args = parser.parse_args(argv)
    given = experiments.given_flags(parser, argv)
    experiments.reject_flags(parser, given, UNUSED_FLAGS,
                             "in movement.py (SGD steps measured one by one, no evaluation)")
    args.classes_per_batch, args.samples_per_class = experiments.batch_shape(
        parser, args, given, samples_per_class=parser.get_default("group_size"),
        batch_size=parser.get_default("batch_size"))
    if args.smoke:
        experiments.apply_smoke(args)  # P and K at most 4
    out = args.output_dir or os.path.join("runs", f"movement-{args.dataset}")
    os.makedirs(os.path.join(out, "figures"), exist_ok=True)
    keras.utils.set_random_seed(args.seed)
    start = time.perf_counter()

    positive, negative = {"HPHN": ("hard", "hard"), "EPEN": ("easy", "easy")}[args.mining]
    miner = tfdml.miners.TripletMiner(positive, negative, disjoint=True)
    loss = tfdml.losses.TripletNCALoss(order=args.order, temperature=args.temperature,
                                       miner=miner)
    data = experiments.load_data(args)
    train_fn, _ = experiments.transforms(args)
    model = experiments.build_model(args)
    if args.init_weights:
        model.load_weights(args.init_weights)
    optimizer = keras.optimizers.SGD(args.learning_rate, momentum=args.momentum)
    batches = tfdml.data.pk_batches(
        data.train, args.classes_per_batch, args.samples_per_class, repeat=False,
        steps_per_epoch=args.steps_per_epoch, seed=args.seed, map_fn=train_fn)

    per_epoch = []
    for epoch in range(args.epochs):
        counts = dict.fromkeys(DIRECTIONS, 0.0)
        total = 0
        bar = keras.utils.Progbar(None if args.steps_per_epoch is None else args.steps_per_epoch,
                                  verbose=args.verbose)
        for step, (x, y) in enumerate(batches):
            stats = tfdml.analysis.triplet_movement(model, x, y, loss, optimizer)
            if stats.count:
                for d in DIRECTIONS:
                    counts[d] += getattr(stats, d) * stats.count
                total += stats.count
            bar.update(step + 1, [("triplets", stats.count)])
        shares = {d: counts[d] / total if total else float("nan") for d in DIRECTIONS}
        per_epoch.append({"epoch": epoch + 1, "triplets": total, **shares})
        print(f"epoch {epoch + 1}: " + ", ".join(f"{d} {shares[d]:.3f}" for d in DIRECTIONS),
              flush=True)

    triplets = sum(e["triplets"] for e in per_epoch)
    totals = {d: sum(e[d] * e["triplets"] for e in per_epoch) / triplets if triplets
              else float("nan") for d in DIRECTIONS}
    name = f"{'1st' if args.order == 1 else '2nd'} order {args.mining}"
    phase = "later phase" if args.init_weights else "initial phase"
    plot(totals, os.path.join(out, "figures", "movement.png"), f"{name}, {phase}")
    results = {"name": name, "phase": phase, "dataset": data.name, "smoke": args.smoke,
               "config": {k: v for k, v in vars(args).items() if k != "output_dir"},
               "epochs": per_epoch, "total": totals, "triplets": triplets,
               "seconds": round(time.perf_counter() - start, 1)}
    write_json(os.path.join(out, "movement.json"), results, default=str)
    rows = [{"epoch": e["epoch"], "triplets": e["triplets"], **{d: e[d] for d in DIRECTIONS}}
            for e in per_epoch]
    rows.append({"epoch": "all", "triplets": triplets, **totals})
    table = experiments.markdown_table(rows, digits=3)
    write_text(os.path.join(out, "movement.md"),
               f"# Triplet movement: {name}, {phase}, {data.name}\n\n{table}")
    print(table)
    return results


if __name__ == "__main__":
    main()
