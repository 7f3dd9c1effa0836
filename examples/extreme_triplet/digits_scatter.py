"""Triplet scatter diagrams of the digits during training (Figure 6 of "Extreme triplet learning").

Trains the digits demo's embedding (tfdml.datasets "digits", digits 0-5, P x K
batches from tfdml.data.pk_batches, TripletNCALoss with easy-positive /
hard-negative mining) once with the 1st-order and once with the 2nd-order loss,
from the same initialization. The tfdml.callbacks.TripletScatter callback
records, for every training image, the (S_ap, S_an) of its EPHN triplet over
the whole training set at epoch 0 (the initialization) and after chosen
epochs, and logs how the triplets moved since the previous record.

Defaults mimic the paper's Problem 1 setting (n = 2 images per class in a
batch; the demo's small CNN, learning rate 1e-2). Writes

* examples/extreme_triplet/figures/digits_scatter.png: one row per order;
* examples/extreme_triplet/figures/digits_scatter_order1.png, ..._order2.png:
  the callback's own grid of each run.

Runs offline in well under a minute on 2 CPU cores:

    python examples/extreme_triplet/digits_scatter.py
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import keras
import numpy as np

import tfdml
from tfdml._files import save_figure  # whole or not at all

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from digits_demo import build_model  # noqa: E402

DIRECTIONS = ("up_right", "up_left", "down_left", "down_right", "still")


def train(args, order, train_split, output_dir):
    """One run; returns the callback (its ``scatters``) and the Keras history."""
    keras.utils.set_random_seed(args.seed)  # the same initialization for both orders
    model = build_model(args.model, args.embedding_dim)
    loss = tfdml.losses.TripletNCALoss(order=order,
                                       miner=tfdml.miners.TripletMiner("easy", "hard"))
    model.compile(optimizer=keras.optimizers.Adam(args.learning_rate), loss=loss,
                  jit_compile=True)
    dataset = tfdml.data.pk_batches(train_split, args.classes_per_batch,
                                    args.samples_per_class, seed=args.seed)
    scatter = tfdml.callbacks.TripletScatter(
        (train_split.images, train_split.labels), every=args.record,
        output_dir=str(output_dir), positive="easy", negative="hard", movement=True,
        files=("grid",), name=f"{args.name}_order{order}", region=args.region)
    history = model.fit(dataset, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch,
                        callbacks=[scatter], shuffle=False, verbose=0)
    return scatter, history.history


def report(order, scatter, history):
    print(f"\nTripletNCALoss(order={order}), EPHN triplets of the whole training set")
    print("epoch  correct  mean S_ap  mean S_an   moved since the previous record: "
          "up-right up-left down-left down-right")
    for i, (epoch, points) in enumerate(sorted(scatter.scatters.items())):
        line = (f"{epoch:5d}  {100 * points.correct.mean():6.1f}%  {points.s_ap.mean():9.3f}  "
                f"{points.s_an.mean():9.3f}")
        if epoch > 0:
            cells = [history[f"triplet_move_{d}"][i - 1] for d in DIRECTIONS[:4]]
            line += "   " + " ".join(f"{100 * c:8.1f}%" for c in cells)
        print(line)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("linear", "cnn"), default="cnn")
    parser.add_argument("--orders", type=int, nargs="+", default=[1, 2], choices=(1, 2))
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--record", type=int, nargs="+", default=[1, 2, 4, 8],
                        help="epochs to record besides epoch 0")
    parser.add_argument("--steps-per-epoch", type=int, default=20)
    parser.add_argument("--classes-per-batch", type=int, default=6)
    parser.add_argument("--samples-per-class", type=int, default=2)
    parser.add_argument("--embedding-dim", type=int, default=16)
    parser.add_argument("--learning-rate", type=float, default=1e-2)
    parser.add_argument("--region", choices=("full", "positive"), default="positive")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", default=str(HERE / "figures"))
    parser.add_argument("--name", default="digits_scatter", help="file name stem")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    train_split = tfdml.datasets.load("digits", "train", dtype="float32")  # digits 0-5
    output_dir = pathlib.Path(args.output_dir)
    print(f"{len(train_split)} training digits 0-5; {args.model} {args.embedding_dim}-d "
          f"embedding, batches of {args.classes_per_batch} classes x {args.samples_per_class} "
          f"images, Adam {args.learning_rate:g}, {args.epochs} epochs x "
          f"{args.steps_per_epoch} steps, temperature 1.0")
    runs = {}
    for order in args.orders:
        runs[order] = train(args, order, train_split, output_dir)
        report(order, *runs[order])

    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    epochs = sorted(runs[args.orders[0]][0].scatters)
    fig = Figure(figsize=(3.0 * len(epochs), 3.25 * len(runs)), layout="constrained")
    axes = np.asarray(fig.subplots(len(runs), len(epochs), squeeze=False))
    for row, (order, (scatter, _)) in zip(axes, runs.items(), strict=True):
        for ax, epoch in zip(row, epochs, strict=True):
            points = scatter.scatters[epoch]
            tfdml.analysis.scatter.plot_triplet_scatter(
                points.s_ap, points.s_an, ax=ax, region=args.region,
                title=f"{'1st' if order == 1 else '2nd'} order, epoch {epoch}")
    fig.suptitle(f"Digits 0-5: easy-positive / hard-negative triplets of the whole training "
                 f"set, n = {args.samples_per_class} per class in a batch")
    path = output_dir / f"{args.name}.png"
    save_figure(fig, path, dpi=110)
    print(f"\nWrote {path} ({time.perf_counter() - start:.0f} s)")
    return runs


if __name__ == "__main__":
    main()
