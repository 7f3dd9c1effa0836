"""The baselines of a reduced-scale digits run: the raw pixels and the untrained network.

The paper folders under `examples/` report trained numbers on scikit-learn's digits (train
on the digits 0-5, evaluate on the unseen digits 6-9). This script puts their baselines
next to them, on the same split and with the same evaluation as a run's best epoch
(`experiments.baselines`, which calls `experiments.evaluate`: Recall@K, MAP@R,
NMI and F1, cosine, each test image against all the others):

* raw pixels: the images the evaluation transform gives the network, flattened (no
  learning at all);
* the untrained network of each seed: the model a run builds for the same flags and
  `--seed`, before its first training step (the seed is set, then the data are loaded and
  the model is built, as `experiments.run` does).

The flags after `--` are those of the paper's `train.py` (or of its sweep) that shape the
data and the model, read by the shared parser, `experiments.make_parser`; its
defaults here are the digits recipe (`--dataset digits --backbone tiny --weights none
--image-size 8 --resize-size 8 --transform none`), but not the embedding size: give the
run's `--embedding-dim` (every paper's `train.py` has its own default). The paper-specific
flags (loss, miner, margin, ...) and the training flags (batches, optimizer, epochs) do not
change an untrained network and are not needed; the shared training flags (`-P`, `-K`,
`--lr`, ...) are accepted and ignored, so that a run's command can be pasted. For example,
the baselines of the extreme-triplet runs:

    python examples/digits_baselines.py --seeds 0 1 2 -- --dataset digits \\
        --backbone tiny --weights none --image-size 8 --resize-size 8 --transform none \\
        --embedding-dim 32

The table is in %, one row per seed, and the untrained network's mean ± std over the seeds
(the sample standard deviation, ddof = 1) when there are several seeds.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import experiments  # noqa: E402  (examples/experiments/: the papers' training loop)

#: The digits recipe of the example READMEs: the defaults of the flags after `--`.
DIGITS = dict(dataset="digits", backbone="tiny", weights="none", image_size=8, resize_size=8,
              transform="none")
#: The column of each metric of `experiments.evaluate`, in the order printed.
LABELS = {"val_recall@1": "R@1", "val_recall@2": "R@2", "val_recall@4": "R@4",
          "val_recall@8": "R@8", "val_map@r": "MAP@R", "val_nmi": "NMI", "val_f1": "F1"}


def parse(argv=None):
    """`(own flags, the run's flags)`: `--seeds` and `--decimals`, then the flags after `--`
    read by `experiments.make_parser`."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n", 1)[0],
        usage="%(prog)s [--seeds S [S ...]] [--decimals D] -- <the run's data and model flags>")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0],
                        help="the seeds of the untrained networks (the runs' --seed)")
    parser.add_argument("--decimals", type=int, default=2, choices=range(5),
                        help="decimals of the numbers in %%")
    parser.add_argument("run_flags", nargs="*", help="the run's flags, after --")
    own = parser.parse_args(argv)
    shared = experiments.make_parser("the run's data and model flags", **DIGITS)
    args, unknown = shared.parse_known_args(own.run_flags)
    if unknown:
        parser.error(f"not flags of the shared parser: {' '.join(unknown)} (a paper's own "
                     "flags, such as the loss's, do not change an untrained network: leave "
                     "them out)")
    if "--seed" in own.run_flags or any(f.startswith("--seed=") for f in own.run_flags):
        parser.error("give the seeds with --seeds, before --")
    if min(own.seeds) < 0 or len(set(own.seeds)) < len(own.seeds):
        parser.error(f"--seeds must be distinct integers >= 0, got {own.seeds}")
    return own, args


def table(rows, seeds, decimals=2):
    """The markdown table of `rows` (`experiments.baselines`), in %, with the mean ±
    sample std (ddof = 1) of the untrained rows when there are several seeds."""
    keys = [k for k in LABELS if k in rows["raw pixels"]]
    lines = ["| baseline | " + " | ".join(LABELS[k] for k in keys) + " |",
             "|---|" + "---:|" * len(keys)]
    for name, values in rows.items():
        lines.append(f"| {name} | " + " | ".join(f"{100 * values[k]:.{decimals}f}"
                                                 for k in keys) + " |")
    untrained = [values for name, values in rows.items() if name.startswith("untrained")]
    if len(untrained) > 1:
        cells = [100 * np.asarray([v[k] for v in untrained]) for k in keys]
        lines.append(f"| untrained (mean ± std over seeds {', '.join(map(str, seeds))}) | "
                     + " | ".join(f"{c.mean():.{decimals}f} ± {c.std(ddof=1):.{decimals}f}"
                                  for c in cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    own, args = parse(argv)
    rows = experiments.baselines(args, own.seeds)
    test = args.dataset if args.dataset != "digits" else "digits 6-9"
    print(f"Baselines on {test} ({args.backbone}, {args.embedding_dim}-d; cosine; in %; the "
          "std is the sample std over the seeds, ddof 1):\n")
    print(table(rows, own.seeds, own.decimals))
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
