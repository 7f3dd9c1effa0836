"""Class collapse on even/odd digits: triplet loss with random vs easy positives.

The MNIST even/odd experiment (Section 5.1, Table 1 and Figure 2) of "Easy
positive sampling against class collapse", run on scikit-learn's bundled 8x8
digits (1,797 images, no download). A small CNN maps each image to a 2-D
embedding and is trained on the digits 0-5 with only two labels, even and odd,
by `tfdml.losses.TripletMarginLoss` with semi-hard negatives and either

* a random positive of the same class (the plain triplet loss), or
* the easy positive: the nearest same-class sample in the batch (EPS).

Class collapse squeezes the three digits of each parity class into one blob;
EPS only pulls each anchor towards its nearest same-class neighbour, so the
digits may keep separate clusters. Recall@K on the *digit* labels measures
how much of the digit structure survives: on held-out images of the training
digits 0-5 and on the unseen digits 6-9.

The held-out split is the same for every seed; a seed sets the initial
weights (the same for both methods), the batches and the random positives.
Runs offline in under two minutes on 2 CPU cores (2 methods x 5 seeds):

    python examples/class_collapse/digits_even_odd.py
    python examples/class_collapse/digits_even_odd.py --seeds 3 --epochs 10 --out /tmp/figs
    python examples/class_collapse/digits_even_odd.py --quick      # a few seconds
"""

from __future__ import annotations

import argparse
import pathlib
import time

import keras
import numpy as np

import tfdml
from tfdml._files import save_figure  # whole or not at all

HERE = pathlib.Path(__file__).resolve().parent
METHODS = {"Triplet": "random", "EPS + Triplet": "easy"}
KS = (1, 5, 10)

# XLA under TensorFlow and JAX; on PyTorch, jit_compile=True runs torch.compile, whose
# compilation costs more than this small model's training: run eagerly there.
JIT_COMPILE = keras.backend.backend() != "torch"


def build_model(padding="same"):
    """The paper's MNIST network (appendix C) for 8x8 inputs, with a 2-D output."""
    return keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(32, 3, padding=padding),
        keras.layers.ReLU(),
        keras.layers.BatchNormalization(),
        keras.layers.Conv2D(64, 3, padding=padding),
        keras.layers.ReLU(),
        keras.layers.BatchNormalization(),
        keras.layers.MaxPooling2D(2),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(2),
    ], name="even_odd_embedding")


def load_splits(holdout, seed):
    """Digits 0-5 split into training and held-out images (stratified by digit), digits 6-9."""
    from sklearn.model_selection import train_test_split

    seen = tfdml.datasets.load("digits", "train", dtype="float32")  # digits 0-5
    unseen = tfdml.datasets.load("digits", "test", dtype="float32")  # digits 6-9
    x_fit, x_held, y_fit, y_held = train_test_split(
        seen.images, seen.labels, test_size=holdout, stratify=seen.labels, random_state=seed)
    return (x_fit, y_fit), (x_held, y_held), (unseen.images, unseen.labels)


def train_one(positive, seed, fit_data, args):
    """Trains one embedding with the given positive strategy; returns the model."""
    keras.utils.set_random_seed(seed)  # both methods start from the same weights
    model = build_model(args.padding)
    miner = tfdml.miners.TripletMiner(positive, "semihard", seed=seed)
    loss = tfdml.losses.TripletMarginLoss(margin=args.margin, distance=args.distance,
                                          miner=miner, normalize=args.normalize)
    model.compile(optimizer=keras.optimizers.Adam(args.learning_rate), loss=loss,
                  jit_compile=JIT_COMPILE)
    x, digits = fit_data
    dataset = tfdml.data.PKDataset((x, digits % 2), 2, args.samples_per_class, seed=seed)
    model.fit(dataset, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch,
              shuffle=False, verbose=0)
    return model


def evaluate(model, x, digits, metric):
    """Recall@K on the digit labels and Recall@1 on the parity labels, in %; embeddings."""
    emb = keras.ops.convert_to_numpy(model(x, training=False))
    recall = tfdml.metrics.recall_at_k(emb, digits, ks=KS, metric=metric)
    parity = tfdml.metrics.recall_at_k(emb, digits % 2, ks=(1,), metric=metric)
    return {f"R@{k}": 100.0 * v for k, v in recall.items()} | {"parity R@1": 100.0 * parity[1]}, emb


def summarize(values):
    values = np.asarray(values, dtype=float)
    return float(values.mean()), float(values.std())


def print_table(summary):
    cols = [f"R@{k}" for k in KS]
    width = 14 * len(cols)
    print(f"\n{'':16}{'Train digits 0-5 (held out)':^{width}}{'Test digits 6-9':^{width}}")
    print(f"{'model':16}" + "".join(f"{c:>14}" for c in cols) * 2)
    for method, sets in summary.items():
        cells = [f"{m:6.2f} ± {s:5.2f}" for split in ("train", "test")
                 for m, s in (sets[split][c] for c in cols)]
        print(f"{method:16}" + "".join(f"{c:>14}" for c in cells))
    print("\nEven/odd (training label) Recall@1:")
    for method, sets in summary.items():
        (tm, ts), (um, us) = sets["train"]["parity R@1"], sets["test"]["parity R@1"]
        print(f"{method:16}  train digits {tm:6.2f} ± {ts:5.2f}   test digits {um:6.2f} ± {us:5.2f}")


def _matplotlib():
    """Imports matplotlib lazily: it is only needed for the figures."""
    try:
        import matplotlib
        from matplotlib.figure import Figure
    except ImportError as err:
        raise ImportError("The figures need matplotlib: `pip install matplotlib` (or, in a "
                          "clone of tfdml, `pip install \".[plot]\"`), or pass --no-plots."
                          ) from err
    return matplotlib, Figure


def plot_embeddings(embeddings, out_dir, split_title, file_name):
    """One panel per method: the 2-D embeddings of the evaluation images coloured by digit."""
    matplotlib, Figure = _matplotlib()

    fig = Figure(figsize=(5.0 * len(embeddings), 4.6), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(embeddings)))
    cmap = matplotlib.colormaps["tab10"]
    for ax, (method, (emb, digits)) in zip(axes, embeddings.items(), strict=True):
        for d in np.unique(digits):
            pts = emb[digits == d]
            parity = "even" if d % 2 == 0 else "odd"
            ax.scatter(pts[:, 0], pts[:, 1], s=9, alpha=0.75, color=cmap(int(d)),
                       marker="o" if d % 2 == 0 else "^", label=f"{d} ({parity})")
        ax.set_title(method)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.legend(loc="best", fontsize=8, markerscale=1.5, framealpha=0.7)
    fig.suptitle(f"2-D embeddings of {split_title}, trained on even/odd labels of digits 0-5")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / file_name
    save_figure(fig, path, dpi=110)
    return path


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5, help="number of seeds (0, 1, ...)")
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--steps-per-epoch", type=int, default=20)
    parser.add_argument("--samples-per-class", type=int, default=32,
                        help="K of the P x K batches (P = 2: even and odd)")
    parser.add_argument("--margin", type=float, default=0.2)
    parser.add_argument("--distance", choices=("squared_l2", "l2", "cosine"), default="l2")
    parser.add_argument("--normalize", action=argparse.BooleanOptionalAction, default=False,
                        help="L2-normalize the embeddings in the loss (and rank by cosine "
                        "similarity in the evaluation)")
    parser.add_argument("--padding", choices=("same", "valid"), default="same")
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--holdout", type=float, default=0.3,
                        help="share of the digits 0-5 held out for evaluation")
    parser.add_argument("--out", default=str(HERE / "figures"), help="figure folder")
    parser.add_argument("--no-plots", action="store_true")
    parser.add_argument("--quick", action="store_true",
                        help="a tiny run (1 seed, 2 epochs x 5 steps) to check that it works")
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.epochs, args.steps_per_epoch = 1, 2, 5
    if min(args.seeds, args.epochs, args.steps_per_epoch, args.samples_per_class - 1) < 1:
        parser.error("--seeds, --epochs and --steps-per-epoch must be >= 1 and "
                     "--samples-per-class >= 2")

    if not args.no_plots:
        _matplotlib()  # fail before training, not after
    start = time.perf_counter()
    fit_data, held, unseen = load_splits(args.holdout, seed=0)
    eval_sets = {"train": held, "test": unseen}
    metric = "cosine" if args.normalize or args.distance == "cosine" else "l2"
    print(f"tfdml {tfdml.__version__}: {len(fit_data[1])} training images of digits 0-5 "
          f"(even/odd labels), {len(held[1])} held out; {len(unseen[1])} images of digits 6-9")
    print(f"TripletMarginLoss(margin={args.margin}, distance={args.distance!r}, "
          f"normalize={args.normalize}), semi-hard negatives; batches of 2 classes x "
          f"{args.samples_per_class}; {args.epochs} epochs x {args.steps_per_epoch} steps, "
          f"Adam {args.learning_rate:g}; {args.seeds} seed(s); recall by {metric} distance")

    runs = {method: [] for method in METHODS}
    figure_data = {"train": {}, "test": {}}
    for seed in range(args.seeds):
        for method, positive in METHODS.items():
            t0 = time.perf_counter()
            model = train_one(positive, seed, fit_data, args)
            result = {}
            for split, (x, digits) in eval_sets.items():
                result[split], emb = evaluate(model, x, digits, metric)
                if seed == 0:
                    figure_data[split][method] = (emb, digits)
            runs[method].append(result)
            print(f"{method:14} seed {seed}: train digits R@1 {result['train']['R@1']:5.1f}, "
                  f"test digits R@1 {result['test']['R@1']:5.1f}, even/odd R@1 "
                  f"{result['train']['parity R@1']:5.1f} ({time.perf_counter() - t0:.1f} s)",
                  flush=True)

    summary = {
        method: {split: {key: summarize([r[split][key] for r in results])
                         for key in results[0][split]}
                 for split in eval_sets}
        for method, results in runs.items()
    }
    print_table(summary)
    # Both methods start from the same weights and see the same batches for a given seed,
    # so the seeds pair up: count the seeds where EPS gives the higher digit Recall@1.
    wins = {split: sum(eps[split]["R@1"] > base[split]["R@1"]
                       for base, eps in zip(*runs.values(), strict=True))
            for split in eval_sets}
    print(f"\nEPS + Triplet beats Triplet on digit Recall@1 in {wins['train']} of {args.seeds} "
          f"seeds on the train digits and in {wins['test']} of {args.seeds} on the test digits")

    figures = []
    if not args.no_plots:
        out_dir = pathlib.Path(args.out)
        figures.append(plot_embeddings(figure_data["test"], out_dir,
                                       "the unseen digits 6-9 (seed 0)", "test_digits.png"))
        figures.append(plot_embeddings(figure_data["train"], out_dir,
                                       "held-out images of digits 0-5 (seed 0)",
                                       "train_digits.png"))
        print("\nFigures: " + ", ".join(str(p) for p in figures))
    print(f"Total {time.perf_counter() - start:.0f} s")
    return {"runs": runs, "summary": summary, "eps_wins": wins,
            "figures": [str(p) for p in figures],
            "config": vars(args)}


if __name__ == "__main__":
    main()
