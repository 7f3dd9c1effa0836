"""The baselines of `digits_even_odd.py`: raw pixels and its untrained 2-D network.

The README's even/odd tables report the digit Recall@1/5/10 of `digits_even_odd.py` on the
held-out images of the digits 0-5 and on the unseen digits 6-9, and the even/odd Recall@1,
by the L2 distance (cosine with `--normalize`). This script puts their baselines next to
them, on that script's own split and with its own evaluation:

* raw pixels: the 8 x 8 images flattened (64 values), with the same distance;
* the untrained network of each seed: that script's 2-D CNN for the seed, built as
  `train_one` builds it (the seed set, then the model), before any training step.

The mean ± std over the seeds uses NumPy's population std, as `digits_even_odd.py` does.

    python examples/class_collapse/even_odd_baselines.py --seeds 0 1 2 3 4
    python examples/class_collapse/even_odd_baselines.py --seeds 0 1 2 --padding valid

The baselines of the runs of `train.py`, `tables.py`, `positives.py` and `trimmed.py` (the
tiny CNN of `examples/experiments/`) come from `examples/digits_baselines.py`.
"""

from __future__ import annotations

import argparse
import os
import sys

import keras
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import digits_even_odd  # noqa: E402

import tfdml  # noqa: E402


def _table(rows, scale=100.0):
    """Prints `{row: {column: value or (mean, std)}}` as a markdown table (in %)."""
    keys = list(next(iter(rows.values())))
    print("| baseline | " + " | ".join(keys) + " |")
    print("|---|" + "---|" * len(keys))
    for name, values in rows.items():
        cells = [f"{scale * v[0]:.2f} ± {scale * v[1]:.2f}" if isinstance(v, tuple)
                 else f"{scale * v:.2f}" for v in (values[k] for k in keys)]
        print(f"| {name} | " + " | ".join(cells) + " |")


def _with_mean(rows, seeds):
    """`rows` plus the mean ± NumPy's population std of the untrained rows."""
    runs = [rows[f"untrained, seed {s}"] for s in seeds]
    rows["untrained, mean ± std"] = {
        k: (float(np.mean([r[k] for r in runs])), float(np.std([r[k] for r in runs])))
        for k in runs[0]}
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--padding", choices=("same", "valid"), default="same")
    parser.add_argument("--normalize", action="store_true",
                        help="rank by cosine similarity (digits_even_odd.py --normalize)")
    parser.add_argument("--holdout", type=float, default=0.3)
    args = parser.parse_args(argv)
    if min(args.seeds) < 0 or len(set(args.seeds)) < len(args.seeds):
        parser.error(f"--seeds must be distinct integers >= 0, got {args.seeds}")
    metric = "cosine" if args.normalize else "l2"
    _, held, unseen = digits_even_odd.load_splits(args.holdout, seed=0)
    sets = {"train digits": held, "test digits": unseen}

    def measure(embed):
        row = {}
        for name, (x, digits) in sets.items():
            emb = embed(x)
            recall = tfdml.metrics.recall_at_k(emb, digits, ks=digits_even_odd.KS, metric=metric)
            parity = tfdml.metrics.recall_at_k(emb, digits % 2, ks=(1,), metric=metric)
            row.update({f"{name} R@{k}": v for k, v in recall.items()})
            row[f"{name} even/odd R@1"] = parity[1]
        return row

    rows = {"raw pixels": measure(lambda x: x.reshape(len(x), -1))}
    for seed in args.seeds:
        keras.utils.set_random_seed(seed)
        model = digits_even_odd.build_model(args.padding)
        rows[f"untrained, seed {seed}"] = measure(
            lambda x, model=model: keras.ops.convert_to_numpy(model(x, training=False)))
    print(f"digits_even_odd.py baselines ({metric}, padding {args.padding}); in %\n")
    _table(_with_mean(rows, args.seeds))
    return rows


if __name__ == "__main__":
    main()
